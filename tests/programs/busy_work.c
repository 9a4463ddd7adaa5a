/* Fixed CPU-bound work for overhead benchmarks: argv[1] rounds (default 40, ≈ 3 s here) of the same
 * loop as busy.c; prints the wall and CPU time of the work itself on stderr
 * (`work_seconds=W cpu_seconds=C`), so profiler start-up is not part of the figure. On a
 * shared machine the CPU time is the steadier figure (waiting for a CPU is not in it;
 * the sampling interrupts and the BPF program, which run on the task's time, are). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long hot_spin(unsigned long n) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++)
        x = x * 6364136223846793005UL + i;
    return x;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 40;
    struct timespec a, b, ca, cb;
    clock_gettime(CLOCK_MONOTONIC, &a);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
    for (long r = 0; r < rounds; r++)
        sink += hot_spin(10000000 + (r & 1)); /* not loop-invariant: no hoisting */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
    clock_gettime(CLOCK_MONOTONIC, &b);
    fprintf(stderr, "work_seconds=%.6f cpu_seconds=%.6f\n",
            (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9,
            (cb.tv_sec - ca.tv_sec) + (cb.tv_nsec - ca.tv_nsec) / 1e9);
    return 0;
}
