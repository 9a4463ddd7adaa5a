/* A shared library whose lib_hot() spins until the process is ended, for the
 * hostile-host tests (tests/tests/it/hostile.rs): its process maps it while a test
 * truncates it, replaces it with a FIFO or a link, or upgrades it by rename. Built with
 * `-shared -fPIC`; with -DUPGRADED, WRONG_fn comes first and covers the offsets where
 * lib_hot was, so a sample of the old build named from the new file says WRONG_fn.
 * `pad` (32 KiB of read-only data) puts everything but the code past the first 16 KiB,
 * the length the truncation row leaves. */

const volatile char pad[32768] = {1};

#ifdef UPGRADED
void WRONG_fn(void) {
    __asm__ volatile(".rept 4096\n nop\n .endr");
}
#endif

void lib_hot(void) {
    volatile unsigned long n = 0;
    for (;;)
        n += n * 3 + 1;
}
