/* A shared library whose lib_hot() spins until the process is ended, for the
 * hostile-host tests (tests/tests/it/hostile.rs): its process maps it while a test
 * truncates it, replaces it with a FIFO or a link, or upgrades it by rename. Built with
 * `-shared -fPIC`; with -DUPGRADED, WRONG_fn comes first and covers the offsets where
 * lib_hot was, so a sample of the old build named from the new file says WRONG_fn.
 * `pad` (32 KiB of read-only data) puts everything but the code past the first 16 KiB,
 * the length the truncation row leaves.
 *
 * With -DPATCHABLE, lib_hot is a bare loop whose unwind rule gives its CFA as a DWARF
 * expression, `DW_OP_breg7 8; DW_OP_nop` (rsp + 8: right, and framehop evaluates an
 * expression at every unwind instead of caching a rule). Its owner can later rewrite
 * those five bytes in place, same length, into `DW_OP_skip -3`, an expression that
 * never ends (the unwind-sections row of tests/tests/it/hostile.rs). */

const volatile char pad[32768] = {1};

#ifdef UPGRADED
void WRONG_fn(void) {
    __asm__ volatile(".rept 4096\n nop\n .endr");
}
#endif

#ifdef PATCHABLE
__asm__(".text\n"
        ".globl lib_hot\n"
        ".type lib_hot, @function\n"
        "lib_hot:\n"
        "  .cfi_startproc\n"
        "  .cfi_escape 0x0f, 3, 0x77, 8, 0x96\n"
        "1:\n"
        "  pause\n"
        "  jmp 1b\n"
        "  .cfi_endproc\n"
        "  .size lib_hot, .-lib_hot\n");
#else
void lib_hot(void) {
    volatile unsigned long n = 0;
    for (;;)
        n += n * 3 + 1;
}
#endif
