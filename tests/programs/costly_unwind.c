/* A local user's attack on the root agent (issue 17, tests/tests/it/hostile.rs):
 * `costly_unwind SECONDS` calls 600 leaf functions in turn, each spinning a few µs,
 * until SECONDS have passed. Each function's `.eh_frame` entry (FDE) carries 60,000 bytes of
 * `DW_CFA_remember_state`/`DW_CFA_restore_state` pairs before its first rule: valid
 * DWARF, under any byte bound a real library needs (librustc_driver has a 33 KB
 * entry), but gimli copies a whole row for each remember, so evaluating one entry
 * costs 30,000 row copies, and 600 functions defeat framehop's 509-slot rule cache.
 * No compiler writes this (at most 16 remembers in an entry of Debian's libc,
 * python3.11, libstdc++, libLLVM or librustc_driver): the unwinder refuses such a
 * file's rules (cpi-user/src/unwind/cost.rs). Written in assembly (GAS macros) so that
 * gcc builds it in seconds. */
#include <stdlib.h>
#include <time.h>

#define COSTLY_FUNCTIONS 600

__asm__(
    ".altmacro\n"
    ".macro costly_pairs\n"
    "  .cfi_escape 10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,"
    "10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,"
    "10,11,10,11,10,11,10,11\n"
    ".endm\n"
    ".macro costly_fn n\n"
    "  .globl costly_\\n\n"
    "  .type costly_\\n, @function\n"
    "costly_\\n:\n"
    "  .cfi_startproc\n"
    "  .rept 1000\n"
    "  costly_pairs\n"
    "  .endr\n"
    "  mov %rdi, %rcx\n"
    "1:\n"
    "  dec %rcx\n"
    "  jnz 1b\n"
    "  ret\n"
    "  .cfi_endproc\n"
    "  .size costly_\\n, .-costly_\\n\n"
    ".endm\n"
    ".macro costly_entry n\n"
    "  .quad costly_\\n\n"
    ".endm\n"
    ".text\n"
    ".set costly_i, 0\n"
    ".rept 600\n"
    "  costly_fn %costly_i\n"
    "  .set costly_i, costly_i + 1\n"
    ".endr\n"
    ".section .data.rel.ro, \"aw\"\n"
    ".globl costly_table\n"
    ".balign 8\n"
    "costly_table:\n"
    ".set costly_i, 0\n"
    ".rept 600\n"
    "  costly_entry %costly_i\n"
    "  .set costly_i, costly_i + 1\n"
    ".endr\n"
    ".noaltmacro\n"
    ".text\n");

extern void (*const costly_table[COSTLY_FUNCTIONS])(long);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10, start = now();
    for (unsigned k = 0; now() - start < seconds; k++) {
        /* A stride prime to the count: consecutive samples land far apart. */
        for (unsigned i = 0; i < COSTLY_FUNCTIONS; i++)
            costly_table[(i * 7919u + k) % COSTLY_FUNCTIONS](5000);
    }
    return 0;
}
