/* Synchronisation test program (seed 000's reason for S2): a hot loop with a constant
 * modelled cost per iteration (no data-dependent branches: the predictor is perfect once
 * warm), calling two functions of different cost. A fixed cycle period that is a
 * multiple of the iteration cost samples the same instruction every time.
 * Usage: sim_sync [iterations] (default 1000003). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static unsigned long heavy(unsigned long x)
{
    /* A divide: expensive in the cycle model. */
    return x / 7 + (x >> 3) + 1;
}

__attribute__((noinline)) static unsigned long light(unsigned long x)
{
    return (x ^ (x << 5)) + 3;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000003;
    unsigned long x = 12345;
    for (long i = 0; i < n; i++) {
        x = heavy(x);
        x = light(x);
    }
    printf("%lu\n", x);
    return 0;
}
