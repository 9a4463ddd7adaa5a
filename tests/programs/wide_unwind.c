/* A binary with a large mapped footprint for the agent's memory test
 * (tests/tests/it/agent_sinks.rs): `wide_unwind SECONDS` calls 2,000 leaf functions in
 * turn, each spinning a few µs, until SECONDS have passed. Each function's `.eh_frame`
 * entry (FDE) carries 20 KiB of `DW_CFA_same_value r15` (what r15's rule is anyway;
 * gas drops DW_CFA_nop) before its first rule, so unwinding from any
 * address in it reads the whole entry: samples spread over the functions touch the
 * 40 MB of `.eh_frame` page after page, as an unwinder walking a compiler's 100+ MB
 * libraries does.
 *
 * Built with -DCOSTLY, a local user's attack on the root agent
 * (tests/tests/it/hostile.rs): 600 functions, each FDE padded with 60,000 bytes of
 * `DW_CFA_remember_state`/`DW_CFA_restore_state` pairs. Valid DWARF, under any byte
 * bound a real library needs (librustc_driver has a 33 KB entry), but gimli copies a
 * whole row for each remember: evaluating one entry costs 30,000 row copies (≈ 6 ms),
 * and 600 functions defeat framehop's 509-slot rule cache. No compiler writes this (at
 * most 1,067 remembers in an entry of valgrind's tools, 442 in gcc's cc1, ≈ 260 µs to
 * evaluate at worst): the unwinder refuses such a file's rules
 * (cpi-user/src/unwind/cost.rs `MAX_COST`).
 *
 * Written in assembly (GAS macros) so that gcc builds it in seconds. */
#include <stdlib.h>
#include <time.h>

#ifdef COSTLY
#define WIDE_FUNCTIONS 600
#define WIDE_REPT "1000"
/* 30 remember/restore pairs. */
#define WIDE_PAD \
    "10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11," \
    "10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11," \
    "10,11,10,11"
#else
#define WIDE_FUNCTIONS 2000
#define WIDE_REPT "320"
/* 32 `DW_CFA_same_value r15`. */
#define WIDE_PAD \
    "8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15," \
    "8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15,8,15"
#endif
#define STR(x) #x
#define XSTR(x) STR(x)

__asm__(
    ".altmacro\n"
    ".macro wide_pad\n"
    "  .cfi_escape " WIDE_PAD "\n"
    ".endm\n"
    ".macro wide_fn n\n"
    "  .globl wide_\\n\n"
    "  .type wide_\\n, @function\n"
    "wide_\\n:\n"
    "  .cfi_startproc\n"
    "  .rept " WIDE_REPT "\n"
    "  wide_pad\n"
    "  .endr\n"
    "  mov %rdi, %rcx\n"
    "1:\n"
    "  dec %rcx\n"
    "  jnz 1b\n"
    "  ret\n"
    "  .cfi_endproc\n"
    "  .size wide_\\n, .-wide_\\n\n"
    ".endm\n"
    ".macro wide_entry n\n"
    "  .quad wide_\\n\n"
    ".endm\n"
    ".text\n"
    ".set wide_i, 0\n"
    ".rept " XSTR(WIDE_FUNCTIONS) "\n"
    "  wide_fn %wide_i\n"
    "  .set wide_i, wide_i + 1\n"
    ".endr\n"
    ".section .data.rel.ro, \"aw\"\n"
    ".globl wide_table\n"
    ".balign 8\n"
    "wide_table:\n"
    ".set wide_i, 0\n"
    ".rept " XSTR(WIDE_FUNCTIONS) "\n"
    "  wide_entry %wide_i\n"
    "  .set wide_i, wide_i + 1\n"
    ".endr\n"
    ".noaltmacro\n"
    ".text\n");

extern void (*const wide_table[WIDE_FUNCTIONS])(long);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10, start = now();
    for (unsigned k = 0; now() - start < seconds; k++) {
        /* A stride prime to the count: consecutive samples land far apart. */
        for (unsigned i = 0; i < WIDE_FUNCTIONS; i++)
            wide_table[(i * 7919u + k) % WIDE_FUNCTIONS](5000);
    }
    return 0;
}
