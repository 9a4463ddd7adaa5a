//! cpi-bpf kernel side: perf_event programs that turn each counter overflow into one
//! wire record (cpi-common `wire`) in a BPF ring buffer.
//!
//! * `branch_sample` — on the retired-taken-branches event (opened with
//!   `PERF_SAMPLE_BRANCH_STACK`): the branch stack the PMI froze for this sample
//!   (`bpf_read_branch_records`, Linux 5.6). There is deliberately no
//!   `bpf_get_branch_snapshot` fallback: on x86 it disables and re-enables the whole PMU
//!   and re-reads the LBR into the per-CPU buffer this very sample's frozen stack lives
//!   in, from inside the overflow handler that has the PMU stopped; and it can only help
//!   where the frozen stack is missing, which an event opened with a branch stack never
//!   is (docs/METHOD.md, "Kernels").
//!
//! User space loads only the programs the mode it runs needs (cpi-user/src/collect/mod.rs
//! `load`), so a kernel lacking a helper of one program still runs the others.
//! * `ip_cycles`, `ip_instructions`, `ip_cpu_clock` — the interrupted IP, one program per
//!   event role so the role is a constant of the program.
//!
//! Stacks (`wire::StackMode`, a read-only global set at load): a record due gets its
//! kernel frames (`bpf_get_stack`) when taken in kernel mode, and the user registers
//! with the top of the user stack, copied in page-aligned chunks so a stack whose next
//! page is unmapped still gives what precedes it, up to the process's cap
//! (`STACK_CAPS`: user space lowers it for processes whose stacks end well before the
//! copy would); user space unwinds it (cpi-user/src/unwind/). Such records vary in
//! length: they are built in a per-CPU scratch buffer and copied out with their real
//! length (BENCHMARKS.md, "Call stacks").
//!
//! Filter (`KernelConfig::filter`, the agent's `--pid`/`--cgroup` on system-wide events):
//! before anything else, a sample whose tgid is not in `ALLOWED_TGIDS`, or none of whose
//! cgroup v2 ancestors is in `ALLOWED_CGROUPS`, is counted as `Counter::Filtered` and
//! dropped, so an unwanted process costs one map lookup, not a record (docs/METHOD.md,
//! "Filtering in the kernel").
//!
//! Following a process tree (`FILTER_FOLLOW`: `-p` and `-- CMD` as root, on per-CPU
//! events): `follow_fork` (raw tracepoint `task_newtask`, the end of a successful
//! `copy_process`) puts each process a kept process forks into `ALLOWED_TASKS` by its
//! `task_struct` address (the tracepoint gives the child's task, not its pid); the
//! child's first sample, or first fork, moves its tgid into `ALLOWED_TGIDS`.
//! `follow_exit` (`sched_process_exit`) takes an exiting task out; user space takes
//! out the tgids of processes gone. Threads (`CLONE_THREAD`) share their process's
//! tgid and need no entry.
//!
//! Every program thins with the shared policy (`ThinState::on_overflow`, per CPU and per
//! role) and weights each record by the summed `sample_period` it stands for. Losses are
//! counted per CPU (`wire::Counter`). The `#[perf_event]` wrapper returns 0, which (6.10+)
//! also suppresses the kernel's own sample output: the ring buffer is the only output.
#![no_std]
#![no_main]

mod sys;

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    helpers::bpf_get_current_pid_tgid,
    macros::{map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{PerfEventContext, RawTracePointContext},
};
use cpi_common::{
    policy::{KernelConfig, ThinState, FILTER_CGROUP, FILTER_FOLLOW, FILTER_TGID},
    wire::{
        BranchEntry, BranchSample, Counter, EventRole, IpSample, SampleHeader, SampleKind,
        StackHeader, StackMode, COUNTERS as COUNTER_SLOTS, FLAG_KERNEL, FLAG_STACK, FLAG_STACK_CUT,
        MAX_BRANCH_ENTRIES, MAX_CGROUP_LEVEL, MAX_FILTER_CGROUPS, MAX_FILTER_TGIDS,
        MAX_KERNEL_FRAMES, MAX_STACK_BYTES, MAX_STACK_CAPS, MAX_USER_FRAMES, STACK_CHUNK,
        WIRE_VERSION,
    },
};
use sys::Scratch;

/// Wire records. User space resizes it at load time (`--ring-buffer`).
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Index 0: the collector's [`KernelConfig`].
#[map]
static CONFIG: Array<KernelConfig> = Array::with_max_entries(1, 0);

/// Thinning state per CPU, indexed by [`EventRole`] (each event thins on its own).
#[map]
static THIN: PerCpuArray<ThinState> = PerCpuArray::with_max_entries(4, 0);

/// Loss and error counters per CPU, indexed by [`Counter`].
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Processes the filter keeps, by tgid (the value is unused).
#[map]
static ALLOWED_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_FILTER_TGIDS, 0);

/// Processes forked by kept processes, by `task_struct` address, until their first
/// sample or fork puts their tgid in `ALLOWED_TGIDS` (`FILTER_FOLLOW`; the value is
/// unused). Each leaves at its exit.
#[map]
static ALLOWED_TASKS: HashMap<u64, u8> = HashMap::with_max_entries(MAX_FILTER_TGIDS, 0);

/// `clone(2)`'s flag for a new thread of the caller's process.
const CLONE_THREAD: u64 = 0x0001_0000;

/// Cgroup v2 ids the filter keeps, with everything below them (the value is unused).
#[map]
static ALLOWED_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(MAX_FILTER_CGROUPS, 0);

/// Bytes of user stack to copy, by tgid, for processes whose stacks user space found to
/// end well before [`MAX_STACK_BYTES`] (cpi-user/src/collect/stack_caps.rs): each KiB
/// not copied saves ≈ 0.18 µs a sample (BENCHMARKS.md, "Copying less stack").
#[map]
static STACK_CAPS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_STACK_CAPS, 0);

const BRANCH_BYTES: u32 = (MAX_BRANCH_ENTRIES * core::mem::size_of::<BranchEntry>()) as u32;

/// A [`StackMode`] as `u32`, written by the loader into `.rodata` (frozen): the verifier
/// sees a constant and skips the branches of the other modes, helpers included.
// SAFETY: the symbol name is unique in this object; only the loader (by name) and
// `sys::loader_value` (by volatile read) touch it.
#[unsafe(no_mangle)]
static STACK_MODE: u32 = StackMode::Off as u32;

const KERNEL_BYTES: usize = MAX_KERNEL_FRAMES * 8;
const USER_BYTES: usize = MAX_USER_FRAMES * 8;
const FIXED_MAX: usize = core::mem::size_of::<BranchSample>();
const STACK_HEADER: usize = core::mem::size_of::<StackHeader>();
/// Room for the longest record, plus one chunk: the verifier bounds each chunk's offset
/// and size separately, so a copy may appear to it to reach one chunk past the end.
const SCRATCH_BYTES: usize =
    FIXED_MAX + STACK_HEADER + KERNEL_BYTES + USER_BYTES + MAX_STACK_BYTES + STACK_CHUNK;

/// Where a record with a stack is built before it is copied out with its real length.
#[repr(C)]
pub struct ScratchBytes {
    bytes: [u8; SCRATCH_BYTES],
}

#[map]
static SCRATCH: PerCpuArray<ScratchBytes> = PerCpuArray::with_max_entries(1, 0);

/// 1 when the kernel gives perf_event programs `bpf_get_current_ancestor_cgroup_id`
/// (not 5.10), written by the loader like [`STACK_MODE`]: at 0 the verifier never sees
/// the call, and the cgroup filter stays in user space.
// SAFETY: as `STACK_MODE`: a unique name, read by the loader and `sys::loader_value`.
#[unsafe(no_mangle)]
static CGROUP_ANCESTORS: u32 = 0;

#[inline(always)]
fn cgroup_ancestors() -> bool {
    sys::loader_value(&CGROUP_ANCESTORS) != 0
}

#[inline(always)]
fn stack_mode() -> u32 {
    sys::loader_value(&STACK_MODE)
}

/// Submit flags: wake the collector only once the ring is a quarter full; otherwise it
/// drains on its own timer. A wake-up per sample would make the collector compete
/// with the profiled program for the CPU at every sample.
#[inline(always)]
fn wakeup_flags() -> u64 {
    let avail = SAMPLES.query(BPF_RB_AVAIL_DATA as u64);
    let size = SAMPLES.query(BPF_RB_RING_SIZE as u64);
    if avail >= size / 4 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[inline(always)]
fn count(c: Counter) {
    // Per-CPU slot, and perf_event programs do not nest on one CPU: a plain add.
    if let Some(n) = sys::per_cpu_mut(&COUNTERS, c as u32) {
        *n += 1;
    }
}

/// Whether process `tgid`, the current task's, is kept: named, or (`FILTER_FOLLOW`)
/// forked by a kept process, whose tgid goes into `ALLOWED_TGIDS` here so its other
/// threads are kept too.
#[inline(always)]
fn kept(cfg: &KernelConfig, tgid: u32) -> bool {
    if ALLOWED_TGIDS.get_ptr(tgid).is_some() {
        return true;
    }
    if cfg.filter & FILTER_FOLLOW == 0 || ALLOWED_TASKS.get_ptr(sys::current_task()).is_none() {
        return false;
    }
    // A full map (or a concurrent update) leaves the tgid to the next look-up, which
    // finds the task again.
    let _ = ALLOWED_TGIDS.insert(tgid, 1, 0);
    true
}

/// Whether the current task passes every allow-list `cfg.filter` names; the loop is
/// bounded by a constant.
#[inline(always)]
fn wanted(cfg: &KernelConfig) -> bool {
    if cfg.filter & FILTER_TGID != 0 && !kept(cfg, (bpf_get_current_pid_tgid() >> 32) as u32) {
        return false;
    }
    if cgroup_ancestors() && cfg.filter & FILTER_CGROUP != 0 {
        for level in 0..=MAX_CGROUP_LEVEL {
            if cfg.cgroup_levels & (1 << level) == 0 {
                continue;
            }
            // 0: the task's cgroup is above this level.
            let id = sys::ancestor_cgroup_id(level as i32);
            if id != 0 && ALLOWED_CGROUPS.get_ptr(id).is_some() {
                return true;
            }
        }
        return false;
    }
    true
}

/// Filters, counts the overflow and applies thinning; `Some(weight)` when a record is
/// due.
#[inline(always)]
fn admit(ctx: &PerfEventContext, role: EventRole) -> Option<(u64, bool)> {
    let cfg = CONFIG.get(0).copied().unwrap_or_default();
    if cfg.filter != 0 && !wanted(&cfg) {
        count(Counter::Filtered);
        return None;
    }
    count(Counter::Seen);
    let data = sys::event_data(ctx);
    let (period, kernel) = (data.sample_period, data.regs.cs & 3 == 0);
    if kernel && cfg.include_kernel == 0 {
        // Kernel samples are excluded at open time too; this catches the rest. Not
        // counted as emitted, so user space sees them as seen − emitted − lost.
        return None;
    }
    let st = sys::per_cpu_mut(&THIN, role as u32)?;
    if st.rng_state == 0 {
        // Zeroed per-CPU state: seed each CPU differently so phases do not line up.
        *st = ThinState::new(sys::random_u64() | 1);
    }
    match st.on_overflow(period, cfg.thinning) {
        Some(w) => Some((w, kernel)),
        None => {
            count(Counter::Thinned);
            None
        }
    }
}

#[inline(always)]
fn header(
    ctx: &PerfEventContext,
    kind: SampleKind,
    role: EventRole,
    weight: u64,
    kernel: bool,
) -> SampleHeader {
    let id = bpf_get_current_pid_tgid();
    SampleHeader {
        version: WIRE_VERSION,
        kind: kind as u16,
        flags: if kernel { FLAG_KERNEL } else { 0 },
        nr: 0,
        cpu: sys::cpu(),
        tgid: (id >> 32) as u32,
        tid: id as u32,
        event: role as u32,
        period: weight,
        time_ns: sys::now_ns(),
        ip: sys::event_data(ctx).regs.rip,
        cgroup_id: sys::cgroup_id(),
    }
}

/// Bytes of the current process's user stack to copy: its cap, else all a record holds.
#[inline(always)]
fn stack_cap() -> usize {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    sys::map_value(&STACK_CAPS, &tgid)
        .map_or(MAX_STACK_BYTES, |c| (c as usize).min(MAX_STACK_BYTES))
}

/// Appends the stack section after the `fixed` bytes already in `buf` and copies the
/// record out; false when the ring was full.
#[inline(always)]
fn output_with_stack(
    ctx: &PerfEventContext,
    buf: &Scratch,
    mut h: SampleHeader,
    fixed: usize,
    kernel: bool,
) -> bool {
    let mut sh = StackHeader::default();
    let mut off = fixed + STACK_HEADER;
    if kernel {
        let got = buf.kernel_stack(ctx, off, KERNEL_BYTES);
        if got > 0 && got as usize <= KERNEL_BYTES {
            let got = got as usize & !7;
            sh.kernel_nr = (got / 8) as u16;
            off += got;
        }
    }
    let mut regs = Some(sys::event_data(ctx).regs).filter(|_| !kernel);
    if kernel && stack_mode() == StackMode::CopyStack as u32 {
        regs = sys::user_regs_at_entry(sys::event_data(ctx).regs);
    } else if kernel && stack_mode() == StackMode::CopyStackUserFramePointers as u32 {
        let got = buf.user_frames(ctx, off, USER_BYTES);
        if got > 0 && got as usize <= USER_BYTES {
            let got = got as usize & !7;
            sh.user_nr = (got / 8) as u16;
            off += got;
        }
    }
    if let Some(regs) = regs {
        sh.user_ip = regs.rip;
        sh.user_sp = regs.rsp;
        sh.user_bp = regs.rbp;
        // Page-aligned chunks: the first up to the end of the page holding sp. The
        // constant bound stays beside the cap: old verifiers learn nothing from
        // comparing two unknown values.
        let cap = stack_cap();
        let mut len: usize = 0;
        let mut want = (STACK_CHUNK - (regs.rsp as usize & (STACK_CHUNK - 1))).min(cap);
        for _ in 0..MAX_STACK_BYTES / STACK_CHUNK + 1 {
            if len >= MAX_STACK_BYTES || len >= cap || want == 0 || want > STACK_CHUNK {
                break;
            }
            if buf.read_user(off + len, want, regs.rsp + len as u64) != 0 {
                break;
            }
            len += want;
            want = cap.saturating_sub(len).min(STACK_CHUNK);
        }
        if len >= cap {
            h.flags |= FLAG_STACK_CUT;
        }
        sh.stack_len = len as u32;
        off += len;
    }
    buf.write(0, h);
    buf.write(fixed, sh);
    let flags = wakeup_flags();
    match buf.bytes(off) {
        Some(record) => SAMPLES.output::<[u8]>(record, flags).is_ok(),
        None => true,
    }
}

/// Writes `h` (flagged [`FLAG_STACK`]) at the start of `buf`, whose `fixed` bytes the
/// record's body fills, appends the stack and counts the outcome.
#[inline(always)]
fn emit_with_stack(
    ctx: &PerfEventContext,
    buf: &Scratch,
    mut h: SampleHeader,
    fixed: usize,
    kernel: bool,
) {
    h.flags |= FLAG_STACK;
    if output_with_stack(ctx, buf, h, fixed, kernel) {
        count(Counter::Emitted);
    } else {
        count(Counter::RingFull);
    }
}

#[inline(always)]
fn emit_ip(ctx: &PerfEventContext, role: EventRole) {
    let Some((weight, kernel)) = admit(ctx, role) else {
        return;
    };
    if stack_mode() != StackMode::Off as u32 {
        let Some(buf) = Scratch::of(&SCRATCH) else {
            return;
        };
        let h = header(ctx, SampleKind::Ip, role, weight, kernel);
        emit_with_stack(ctx, &buf, h, core::mem::size_of::<IpSample>(), kernel);
        return;
    }
    let Some(mut slot) = SAMPLES.reserve::<IpSample>(0) else {
        count(Counter::RingFull);
        return;
    };
    slot.write(IpSample {
        header: header(ctx, SampleKind::Ip, role, weight, kernel),
    });
    slot.submit(wakeup_flags());
    count(Counter::Emitted);
}

/// The header of a branch record whose helper returned `got` bytes of entries.
#[inline(always)]
fn branch_header(ctx: &PerfEventContext, weight: u64, kernel: bool, got: i64) -> SampleHeader {
    let mut h = header(ctx, SampleKind::Branch, EventRole::Branches, weight, kernel);
    h.nr = (got as u64 / core::mem::size_of::<BranchEntry>() as u64) as u16;
    h
}

#[perf_event]
pub fn branch_sample(ctx: PerfEventContext) -> u32 {
    let Some((weight, kernel)) = admit(&ctx, EventRole::Branches) else {
        return 0;
    };
    if stack_mode() != StackMode::Off as u32 {
        let Some(buf) = Scratch::of(&SCRATCH) else {
            return 0;
        };
        let at = core::mem::size_of::<SampleHeader>();
        let got = buf.branch_records(&ctx, at, BRANCH_BYTES as usize);
        if got <= 0 {
            count(Counter::BranchError);
            return 0;
        }
        let h = branch_header(&ctx, weight, kernel, got);
        emit_with_stack(&ctx, &buf, h, core::mem::size_of::<BranchSample>(), kernel);
        return 0;
    }
    let Some(mut slot) = SAMPLES.reserve::<BranchSample>(0) else {
        count(Counter::RingFull);
        return 0;
    };
    // The helper writes straight into the reserved record: no 768-byte stack copy.
    let got = sys::branch_records_into(&ctx, &mut slot);
    if got <= 0 {
        count(Counter::BranchError);
        slot.discard(0);
        return 0;
    }
    sys::set_branch_header(&mut slot, branch_header(&ctx, weight, kernel, got));
    slot.submit(wakeup_flags());
    count(Counter::Emitted);
    0
}

#[perf_event]
pub fn ip_cycles(ctx: PerfEventContext) -> u32 {
    emit_ip(&ctx, EventRole::Cycles);
    0
}

#[perf_event]
pub fn ip_instructions(ctx: PerfEventContext) -> u32 {
    emit_ip(&ctx, EventRole::Instructions);
    0
}

#[perf_event]
pub fn ip_cpu_clock(ctx: PerfEventContext) -> u32 {
    emit_ip(&ctx, EventRole::CpuClock);
    0
}

/// The filter's config when it follows a process tree, else `None`.
#[inline(always)]
fn following() -> Option<KernelConfig> {
    CONFIG
        .get(0)
        .copied()
        .filter(|c| c.filter & FILTER_FOLLOW != 0)
}

/// `task_newtask(struct task_struct *task, u64 clone_flags)`, in the parent: a new
/// process of a kept process is followed from here on.
#[raw_tracepoint(tracepoint = "task_newtask")]
pub fn follow_fork(ctx: RawTracePointContext) -> i32 {
    let Some(cfg) = following() else {
        return 0;
    };
    let clone_flags: u64 = ctx.arg(1);
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !kept(&cfg, parent) || clone_flags & CLONE_THREAD != 0 {
        return 0;
    }
    let child: u64 = ctx.arg(0);
    if ALLOWED_TASKS.insert(child, 1, 0).is_err() {
        sys::per_cpu_add(&COUNTERS, Counter::Unfollowed as u32);
    }
    0
}

/// `sched_process_exit`, in the exiting task: its address leaves `ALLOWED_TASKS`
/// before the memory can name another task. Its tgid stays: the first thread may exit
/// while others run (`pthread_exit` in `main`), and nothing here tells the last thread
/// from the others on every kernel; user space takes out the tgids of processes gone
/// (cpi-user/src/collect/filter.rs, `sweep`).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn follow_exit(_ctx: RawTracePointContext) -> i32 {
    if following().is_some() {
        let _ = ALLOWED_TASKS.remove(sys::current_task());
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY: the kernel reads the license from the `license` section by that name; the
// symbol is unique and plain bytes, never read by code.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
