// `cpi-bpf diff`'s test program (tests/tests/it/report_diff.rs): the same loop in two
// functions, alpha_work running it ALPHA_PERCENT % as long as beta_work (100 by default;
// the changed build is compiled with -DALPHA_PERCENT=130). A fixed amount of work, so
// two runs execute the same instructions. Runs argv[1] rounds (default 100) of 10⁵
// iterations per function, in calls of 1000 (≈ 1 µs): far below any sampling period, so
// a time profile's timer cannot beat with the program's rhythm (calls of 100 µs at
// 4999 Hz put long runs of samples in one function, then in the other).
#include <stdlib.h>

#ifndef ALPHA_PERCENT
#define ALPHA_PERCENT 100
#endif

static volatile unsigned long sink;

#define WORK(n)                                                                        \
    do {                                                                               \
        unsigned long x = 1;                                                           \
        for (unsigned long i = 0; i < (n); i++) x = x * 6364136223846793005UL + i;     \
        sink = x;                                                                      \
    } while (0)

__attribute__((noinline)) void alpha_work(unsigned long n) { WORK(n * ALPHA_PERCENT / 100); }
__attribute__((noinline)) void beta_work(unsigned long n) { WORK(n); }

int main(int argc, char **argv) {
    unsigned long rounds = argc > 1 ? strtoul(argv[1], 0, 10) : 100;
    for (unsigned long r = 0; r < rounds * 100; r++) {
        alpha_work(1000);
        beta_work(1000);
    }
    return 0;
}
