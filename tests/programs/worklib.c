/* A small shared library (`-shared -fPIC`, no soname) whose lib_work() runs a loop of
 * N steps: tests/programs/leader_exit_libs.c loads hundreds of copies of it. */
unsigned long lib_work(unsigned long n) {
    volatile unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++)
        x = x * 6364136223846793005UL + i;
    return x;
}
