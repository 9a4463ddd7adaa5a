/* cpitrace: a Valgrind tool that writes the exact taken-branch stream of a run.
 *
 * It is cpi-bpf's trace oracle (DESIGN.md, "Validation without hardware"); the reader
 * is cpi-user/src/sim/trace.rs, which documents the record format. Built by
 * `cargo xtask setup` (xtask/src/tracer.rs) against Debian's valgrind headers/libs.
 *
 * How it counts, cheaply:
 *  - every guest instruction stores one 64-bit constant into `last_word`: its address,
 *    its length and its 1-based index in the superblock (no helper call);
 *  - every superblock entry calls one helper with the superblock's address. The helper
 *    adds the previous superblock's executed instructions (the index in `last_word`) to
 *    the pending count and, when control did not simply fall through, emits a record
 *    {from = that instruction, to = new address, n}. Control was transferred when the
 *    new address is not the end of the last executed instruction, or when that
 *    instruction is an unconditional transfer (jmp, call, ret, jmp/call via a register
 *    or memory) ending its superblock: hardware retires those as taken branches even
 *    when the target is the next instruction (`call 1f; 1: pop`, a jump table whose
 *    first case follows the `jmp *`), so the trace must show them. The word stored for
 *    such an instruction carries a flag bit (decoded once, at instrumentation).
 *    A conditional branch whose target is its own fall-through is not seen as taken.
 *  With --vex-guest-chase=no and no loop unrolling (both forced in post_clo_init) a
 *  superblock is straight-line code left only through its exits, so this sees every
 *  non-sequential transfer; an instruction that does not follow its predecessor inside
 *  a superblock gets the helper call too, in case VEX still joined code.
 *  - `rep` string instructions: VEX runs each iteration as a superblock that jumps back
 *    to the same address. Hardware retires the instruction once, so re-entering a rep
 *    instruction right after itself is not counted and not recorded.
 *  - threads (Valgrind serialises them): state is saved per thread; a THREAD record
 *    marks which thread the following records belong to.
 *  - signals: an INTERRUPT record ends the interrupted thread's range; the handler's
 *    first superblock then starts a fresh range (a record with from = 0).
 *  - mappings: the client's executable segments, as /proc/PID/maps text, in a MAPS
 *    record at start, after every new executable mapping, and at exit.
 *  - execve: the caller's range ends and the buffer is written (fini will not run).
 *    Valgrind runs with --trace-children=yes, so a successful exec starts this tool
 *    again in the same process: it appends a new header and IMAGE record to the same
 *    output (opened O_APPEND; cpi-bpf creates it), and the trace goes on in the new
 *    program, as `perf record` follows exec.
 *  - fork: a FORK record names the child, which is not traced: it writes nothing and
 *    runs its own exec natively (the trace is one process's stream).
 */

#include "pub_tool_basics.h"
#include "pub_tool_xarray.h"
#include "pub_tool_clientstate.h"
#include "pub_tool_tooliface.h"
#include "pub_tool_libcassert.h"
#include "pub_tool_libcbase.h"
#include "pub_tool_libcfile.h"
#include "pub_tool_libcprint.h"
#include "pub_tool_libcproc.h"
#include "pub_tool_machine.h"
#include "pub_tool_mallocfree.h"
#include "pub_tool_options.h"
#include "pub_tool_aspacemgr.h"
#include "pub_tool_threadstate.h"
#include "pub_tool_vki.h"
#include "pub_tool_vkiscnums.h"

/* Record kinds; keep in sync with cpi-user/src/sim/trace.rs. */
#define K_BRANCH 1    /* from, to, n: n instructions ran, the last at `from`; then `to` */
#define K_THREAD 2    /* to = os thread id; following records belong to it          */
#define K_INTERRUPT 3 /* from = last executed, to = resume address, n, aux = signo     */
#define K_END 4       /* from = last executed, n: the thread's last range              */
#define K_MAPS 5      /* n = byte length of maps text that follows, padded to 8        */
#define K_IMAGE 6     /* n = byte length of the program's path that follows, padded    */
#define K_FORK 7      /* to = pid of a child process (not traced)                      */

#define MAGIC "CPITRC01"
#define VERSION 3

/* The word stored per instruction: address, length (x86: at most 15), whether it is an
   unconditional transfer ending its superblock, 1-based index in the superblock. */
#define ADDR_MASK ((1ULL << 48) - 1)
#define LEN_SHIFT 48
#define LEN_MASK 15ULL
#define XFER_BIT (1ULL << 52)
#define IDX_SHIFT 53

typedef struct {
   ULong from;
   ULong to;
   UInt n;
   UShort kind;
   UShort aux;
} Rec;

typedef struct {
   ULong last_word;
   ULong pending;
   Int lwp;
   Bool live;
} ThreadTrace;

static const HChar *clo_out = NULL;
static Int out_fd = -1;
static Bool disabled = False;

#define BUF_SIZE (1 << 20)
static UChar *buf;
static UInt buf_used;

/* Written by generated code (one store per guest instruction). */
static ULong last_word;
static ULong pending;

static ThreadTrace *threads; /* VG_N_THREADS entries, indexed by ThreadId */
static ThreadId cur_tid = VG_INVALID_THREADID;
static Bool maps_dirty = True;

/* The core's --trace-children (not in the tool headers; the tool links the core
 * statically): a forked child clears it so that its exec runs natively. */
extern Bool VG_(clo_trace_children);

static void flush(void)
{
   UInt off = 0;
   if (disabled || out_fd < 0)
      return;
   while (off < buf_used) {
      Int w = VG_(write)(out_fd, buf + off, buf_used - off);
      if (w <= 0) {
         VG_(umsg)("cpitrace: write to %s failed; trace truncated\n", clo_out);
         disabled = True;
         break;
      }
      off += (UInt)w;
   }
   buf_used = 0;
}

static void put(const void *p, UInt len)
{
   if (disabled)
      return;
   if (buf_used + len > BUF_SIZE)
      flush();
   VG_(memcpy)(buf + buf_used, p, len);
   buf_used += len;
}

static void emit_maps(void);

/* A record of `kind` followed by `len` bytes of text, zero-padded to 8. */
static void put_text(UShort kind, const HChar *text, Int len)
{
   Rec r = {0, 0, (UInt)len, kind, 0};
   put(&r, sizeof r);
   put(text, len);
   if (len % 8) {
      static const UChar zero[8];
      put(zero, 8 - len % 8);
   }
}

static void emit(ULong from, ULong to, ULong n, UShort kind, UShort aux)
{
   Rec r;
   if (maps_dirty && kind != K_MAPS)
      emit_maps();
   r.from = from;
   r.to = to;
   r.n = n > 0xffffffffULL ? 0xffffffffU : (UInt)n;
   r.kind = kind;
   r.aux = aux;
   put(&r, sizeof r);
}

static void emit_maps(void)
{
   Addr *starts;
   HChar *text;
   SizeT cap;
   Int nseg, i, len = 0;
   UInt kinds = SkFileC | SkAnonC | SkShmC;
   maps_dirty = False;
   Addr one[1];
   /* Called with too little room, it returns minus the number of segments. */
   nseg = VG_(am_get_segment_starts)(kinds, one, 1);
   nseg = nseg < 0 ? -nseg : nseg;
   starts = VG_(malloc)("cpitrace.starts", (nseg + 64) * sizeof(Addr));
   nseg = VG_(am_get_segment_starts)(kinds, starts, nseg + 64);
   if (nseg < 0)
      VG_(tool_panic)("cpitrace: client segments changed while listing them");
   /* A line is at most ~60 bytes plus a path of at most 4096. */
   cap = 128;
   for (i = 0; i < nseg; i++) {
      NSegment const *s = VG_(am_find_nsegment)(starts[i]);
      const HChar *name = s && s->kind == SkFileC ? VG_(am_get_filename)(s) : NULL;
      cap += 80 + (name ? VG_(strlen)(name) : 0);
   }
   text = VG_(malloc)("cpitrace.maps", cap);
   for (i = 0; i < nseg; i++) {
      NSegment const *s = VG_(am_find_nsegment)(starts[i]);
      const HChar *name;
      if (!s || !s->hasX)
         continue;
      name = s->kind == SkFileC ? VG_(am_get_filename)(s) : NULL;
      /* The device as /proc/PID/maps prints it (glibc's major()/minor() of st_dev), so
         the analysis can check that the file it opens is the one mapped. */
      ULong major = ((s->dev >> 8) & 0xfff) | ((s->dev >> 32) & ~0xfffULL);
      ULong minor = (s->dev & 0xff) | ((s->dev >> 12) & ~0xffULL);
      len += VG_(snprintf)(text + len, cap - len, "%lx-%lx %c%c%cp %08llx %02llx:%02llx %llu %s\n",
                           s->start, s->end + 1, s->hasR ? 'r' : '-', s->hasW ? 'w' : '-',
                           'x', (ULong)s->offset, major, minor, s->ino, name ? name : "");
   }
   put_text(K_MAPS, text, len);
   VG_(free)(text);
   VG_(free)(starts);
}

/* The previous superblock's executed instructions join the pending range; a jump to
 * anywhere but the end of the last executed instruction, or any unconditional
 * transfer, is a taken transfer. */
static inline void enter(Addr a)
{
   ULong w = last_word;
   Addr prev = w & ADDR_MASK;
   ULong len = (w >> LEN_SHIFT) & LEN_MASK;
   pending += w >> IDX_SHIFT;
   /* Index and transfer flag consumed: entering again (a signal right after) must not
      count them twice. */
   last_word = w & (ADDR_MASK | (LEN_MASK << LEN_SHIFT));
   if (a != prev + len || (w & XFER_BIT)) {
      emit(prev, a, pending, K_BRANCH, 0);
      pending = 0;
   }
}

static VG_REGPARM(1) void on_sb(Addr a)
{
   enter(a);
}

/* A superblock holding only a rep string instruction (VEX ends superblocks after
 * them): re-entry right after itself is another iteration, not another execution. */
static VG_REGPARM(2) void on_rep_sb(Addr a, ULong len)
{
   ULong w = last_word;
   if ((w & ADDR_MASK) == a && (w >> IDX_SHIFT) == 0) {
      return; /* iteration; already counted */
   }
   if ((w & ADDR_MASK) == a) {
      /* Ran as the last instruction of the previous superblock; now iterating. */
      pending += w >> IDX_SHIFT;
      last_word = w & ((1ULL << IDX_SHIFT) - 1);
      return;
   }
   enter(a);
   last_word = a | (len << LEN_SHIFT) | (1ULL << IDX_SHIFT);
}

static Bool is_rep_string(Addr a)
{
   const UChar *p = (const UChar *)a;
   Bool rep = False;
   Int i;
   for (i = 0; i < 14; i++) {
      UChar b = p[i];
      if (b == 0xF2 || b == 0xF3)
         rep = True;
      else if (b == 0x66 || b == 0x67 || b == 0x26 || b == 0x2E || b == 0x36 ||
               b == 0x3E || b == 0x64 || b == 0x65 || (b >= 0x40 && b <= 0x4F))
         continue;
      else
         return rep && ((b >= 0xA4 && b <= 0xA7) || (b >= 0xAA && b <= 0xAF) ||
                        (b >= 0x6C && b <= 0x6F));
   }
   return False;
}

/* The instruction at `a` (`len` bytes) always transfers control when it runs: a near or
 * far jmp/call (relative, or via a register or memory) or a ret, after any prefixes.
 * Conditional branches, loops and system calls are not. */
static Bool is_transfer(Addr a, ULong len)
{
   const UChar *p = (const UChar *)a;
   ULong i = 0;
   while (i < len && (p[i] == 0x66 || p[i] == 0x67 || p[i] == 0xF2 || p[i] == 0xF3 ||
                      p[i] == 0x26 || p[i] == 0x2E || p[i] == 0x36 || p[i] == 0x3E ||
                      p[i] == 0x64 || p[i] == 0x65))
      i++;
   if (i < len && p[i] >= 0x40 && p[i] <= 0x4F)
      i++; /* REX */
   if (i >= len)
      return False;
   switch (p[i]) {
   case 0xE8: /* call rel32 */
   case 0xE9: /* jmp rel32 */
   case 0xEB: /* jmp rel8 */
   case 0xC2: /* ret imm16 */
   case 0xC3: /* ret */
   case 0xCA: /* far ret */
   case 0xCB:
      return True;
   case 0xFF: { /* /2 call, /3 far call, /4 jmp, /5 far jmp */
      UInt reg;
      if (i + 1 >= len)
         return False;
      reg = (p[i + 1] >> 3) & 7;
      return reg >= 2 && reg <= 5;
   }
   default:
      return False;
   }
}

static IRSB *ct_instrument(VgCallbackClosure *closure, IRSB *sbIn,
                           const VexGuestLayout *layout, const VexGuestExtents *vge,
                           const VexArchInfo *archinfo_host, IRType gWordTy,
                           IRType hWordTy)
{
   IRSB *sbOut = deepCopyIRSBExceptStmts(sbIn);
   Int i = 0, idx = 0, last_mark = -1;
   Bool first = True, rep_sb = False;
   Addr next = 0;

   for (i = 0; i < sbIn->stmts_used; i++)
      if (sbIn->stmts[i] && sbIn->stmts[i]->tag == Ist_IMark)
         last_mark = i;
   i = 0;

   while (i < sbIn->stmts_used && sbIn->stmts[i]->tag != Ist_IMark) {
      addStmtToIRSB(sbOut, sbIn->stmts[i]);
      i++;
   }
   for (; i < sbIn->stmts_used; i++) {
      IRStmt *st = sbIn->stmts[i];
      if (!st || st->tag == Ist_NoOp)
         continue;
      if (st->tag == Ist_IMark) {
         Addr a = (Addr)st->Ist.IMark.addr;
         ULong len = st->Ist.IMark.len;
         if (first) {
            IRDirty *di;
            first = False;
            rep_sb = is_rep_string(a);
            if (rep_sb)
               di = unsafeIRDirty_0_N(2, "cpitrace_rep_sb",
                                      VG_(fnptr_to_fnentry)(&on_rep_sb),
                                      mkIRExprVec_2(mkIRExpr_HWord(a), mkIRExpr_HWord(len)));
            else
               di = unsafeIRDirty_0_N(1, "cpitrace_sb", VG_(fnptr_to_fnentry)(&on_sb),
                                      mkIRExprVec_1(mkIRExpr_HWord(a)));
            addStmtToIRSB(sbOut, IRStmt_Dirty(di));
         } else if (a != next) {
            /* Non-sequential flow inside a superblock (an unrolled loop, a chased
             * jump): reaching this point means the transfer happened. */
            IRDirty *di = unsafeIRDirty_0_N(1, "cpitrace_sb", VG_(fnptr_to_fnentry)(&on_sb),
                                            mkIRExprVec_1(mkIRExpr_HWord(a)));
            addStmtToIRSB(sbOut, IRStmt_Dirty(di));
            idx = 0; /* the helper consumed the index */
         }
         next = a + len;
         addStmtToIRSB(sbOut, st);
         idx++;
         if (!rep_sb) {
            ULong word = (ULong)a | ((len & LEN_MASK) << LEN_SHIFT) | ((ULong)idx << IDX_SHIFT);
            /* Only the superblock's last instruction can be a transfer that ran: an
               unconditional one always ends its superblock. */
            if (i == last_mark && is_transfer(a, len))
               word |= XFER_BIT;
            addStmtToIRSB(sbOut,
                          IRStmt_Store(Iend_LE, mkIRExpr_HWord((HWord)&last_word),
                                       IRExpr_Const(IRConst_U64(word))));
         }
         continue;
      }
      addStmtToIRSB(sbOut, st);
   }
   return sbOut;
}

static void switch_to(ThreadId tid)
{
   if (tid == cur_tid)
      return;
   if (cur_tid != VG_INVALID_THREADID) {
      threads[cur_tid].last_word = last_word;
      threads[cur_tid].pending = pending;
   }
   cur_tid = tid;
   last_word = threads[tid].last_word;
   pending = threads[tid].pending;
   emit(0, (ULong)threads[tid].lwp, 0, K_THREAD, 0);
}

static void on_start_client_code(ThreadId tid, ULong blocks)
{
   if (!threads[tid].live) {
      threads[tid].live = True;
      threads[tid].lwp = VG_(gettid)();
      threads[tid].last_word = 0;
      threads[tid].pending = 0;
   }
   switch_to(tid);
}

/* The current superblock's instructions up to the last executed one close the range;
 * the thread continues elsewhere. */
static void end_range(UShort kind, ULong to, UShort aux)
{
   ULong w = last_word;
   pending += w >> IDX_SHIFT;
   emit(w & ADDR_MASK, to, pending, kind, aux);
   pending = 0;
   last_word = 0;
}

static void on_deliver_signal(ThreadId tid, Int sig, Bool alt)
{
   Addr resume;
   if (!threads[tid].live)
      return;
   switch_to(tid);
   resume = VG_(get_IP)(tid);
   /* A taken transfer to `resume` that has not run yet is still a taken transfer. */
   enter(resume);
   end_range(K_INTERRUPT, resume, (UShort)sig);
}

static void on_thread_exit(ThreadId tid)
{
   if (!threads[tid].live)
      return;
   switch_to(tid);
   end_range(K_END, 0, 0);
   threads[tid].live = False;
}

static void on_mmap(Addr a, SizeT len, Bool rr, Bool ww, Bool xx, ULong di)
{
   if (xx)
      maps_dirty = True;
}

static void on_mprotect(Addr a, SizeT len, Bool rr, Bool ww, Bool xx)
{
   if (xx)
      maps_dirty = True;
}

/* execve replaces the process (children are not traced): end the caller's range at
 * the system call and write everything out now, as fini will not run. Should the call
 * fail, the thread simply starts a fresh range after it. */
static void pre_syscall(ThreadId tid, UInt sysno, UWord *args, UInt nargs)
{
   if (sysno != __NR_execve && sysno != __NR_execveat)
      return;
   if (!threads[tid].live)
      return;
   switch_to(tid);
   enter(VG_(get_IP)(tid));
   end_range(K_END, 0, 0);
   maps_dirty = True;
   emit_maps();
   flush();
}

/* A new process (fork, vfork, or clone without CLONE_THREAD), seen in the parent. */
static void post_syscall(ThreadId tid, UInt sysno, UWord *args, UInt nargs, SysRes res)
{
   Bool process = sysno == __NR_fork || sysno == __NR_vfork ||
                  (sysno == __NR_clone && !(args[0] & VKI_CLONE_THREAD));
   if (!process || disabled || sr_isError(res) || sr_Res(res) == 0)
      return;
   emit(0, (ULong)sr_Res(res), 0, K_FORK, 0);
}

static void child_after_fork(ThreadId tid)
{
   /* The child inherits our buffer and fd: it must write neither, and its exec must
      not start a tracer that would write into this process's stream. */
   disabled = True;
   VG_(clo_trace_children) = False;
}

static Bool ct_process_cmd_line_option(const HChar *arg)
{
   if VG_STR_CLO (arg, "--cpi-out", clo_out) {
   } else
      return False;
   return True;
}

static void ct_print_usage(void)
{
   VG_(printf)("    --cpi-out=<file>          write the branch trace to <file>\n");
}

static void ct_print_debug_usage(void)
{
}

static void ct_post_clo_init(void)
{
   SysRes r;
   struct {
      char magic[8];
      UInt version;
      UInt pid;
   } hdr;
   /* Chasing lets VEX speculate across conditional branches and breaks the
    * straight-line-superblock assumption above. */
   VG_(clo_vex_control).guest_chase = False;
   /* Unrolled loops repeat instructions inside one superblock; handled above, but
    * simpler code is also faster to instrument. */
   VG_(clo_vex_control).iropt_unroll_thresh = 0;
   if (!clo_out)
      VG_(fmsg_bad_option)("--cpi-out", "cpitrace needs --cpi-out=<file>\n");
   /* Appending: after an exec this is the same process's second tool instance. */
   /* Close-on-exec (O_CLOEXEC, missing from the tool headers): an untraced child's
      program must not hold the FIFO open. */
   r = VG_(open)(clo_out, VKI_O_WRONLY | VKI_O_CREAT | VKI_O_APPEND | 02000000, 0644);
   if (sr_isError(r))
      VG_(fmsg_bad_option)("--cpi-out", "cannot open %s for writing\n", clo_out);
   out_fd = sr_Res(r);
   buf = VG_(malloc)("cpitrace.buf", BUF_SIZE);
   threads = VG_(calloc)("cpitrace.threads", VG_N_THREADS, sizeof *threads);
   VG_(memcpy)(hdr.magic, MAGIC, 8);
   hdr.version = VERSION;
   hdr.pid = VG_(getpid)();
   put(&hdr, sizeof hdr);
   put_text(K_IMAGE, VG_(args_the_exename), VG_(strlen)(VG_(args_the_exename)));
}

static void ct_fini(Int exitcode)
{
   ThreadId t;
   if (cur_tid != VG_INVALID_THREADID && threads[cur_tid].live)
      on_thread_exit(cur_tid);
   for (t = 1; t < VG_N_THREADS; t++)
      if (threads[t].live)
         on_thread_exit(t);
   maps_dirty = True;
   emit_maps();
   flush();
   if (out_fd >= 0 && !disabled)
      VG_(close)(out_fd);
}

static void ct_pre_clo_init(void)
{
   VG_(details_name)("cpitrace");
   VG_(details_version)(NULL);
   VG_(details_description)("cpi-bpf exact taken-branch tracer");
   VG_(details_copyright_author)("cpi-bpf developers");
   VG_(details_bug_reports_to)("the cpi-bpf repository");
   VG_(basic_tool_funcs)(ct_post_clo_init, ct_instrument, ct_fini);
   VG_(needs_command_line_options)(ct_process_cmd_line_option, ct_print_usage,
                                   ct_print_debug_usage);
   VG_(needs_syscall_wrapper)(pre_syscall, post_syscall);
   VG_(track_start_client_code)(on_start_client_code);
   VG_(track_pre_deliver_signal)(on_deliver_signal);
   VG_(track_pre_thread_ll_exit)(on_thread_exit);
   VG_(track_new_mem_mmap)(on_mmap);
   VG_(track_change_mem_mprotect)(on_mprotect);
   VG_(atfork)(NULL, NULL, child_after_fork);
}

VG_DETERMINE_INTERFACE_VERSION(ct_pre_clo_init)
