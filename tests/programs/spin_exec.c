/* Spins in `pre_exec_spin` for argv[1] seconds, then (with argv[2]) execs argv[2] with
 * the remaining arguments in the same process: the collection tests' program whose
 * first image is gone by the end of the run. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long pre_exec_spin(unsigned long n) {
    unsigned long x = 3;
    for (unsigned long i = 0; i < n; i++)
        x = x * 2862933555777941757UL + i;
    return x;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double end = now() + (argc > 1 ? atof(argv[1]) : 1);
    while (now() < end)
        sink += pre_exec_spin(1000000);
    if (argc > 2) {
        execv(argv[2], argv + 2);
        perror("execv");
        return 1;
    }
    return 0;
}
