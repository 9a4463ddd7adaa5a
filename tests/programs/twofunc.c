// The kernel matrix's (tests/tests/it/kernels.rs) program with a known split: the same
// loop body in two functions, alpha_work running it twice as often as beta_work, so
// alpha_work holds 2/3 of the time and beta_work 1/3. Runs for argv[1] seconds.
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

#define WORK(n)                                                                        \
    do {                                                                               \
        unsigned long x = 1;                                                           \
        for (unsigned long i = 0; i < (n); i++) x = x * 6364136223846793005UL + i;     \
        sink = x;                                                                      \
    } while (0)

__attribute__((noinline)) void alpha_work(unsigned long n) { WORK(2 * n); }
__attribute__((noinline)) void beta_work(unsigned long n) { WORK(n); }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + secs;
    while (now() < end) {
        alpha_work(200000);
        beta_work(200000);
    }
    return 0;
}
