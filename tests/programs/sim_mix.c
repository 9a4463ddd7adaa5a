/* PMU-model test program: functions with clearly different CPI and dynamic behaviour.
 * - branchy(): a loop with a data-dependent (pseudo-random) branch: mispredictions;
 * - dispatch(): a switch compiled to a jump table (indirect jumps);
 * - fib(): recursion (calls and returns);
 * - divide(): integer divides (expensive static cost);
 * - sort_lib(): qsort from libc with a callback (calls into a shared library).
 * Usage: sim_mix [scale] (default 1). Prints a checksum so nothing is optimised away. */
#include <stdio.h>
#include <stdlib.h>

static unsigned long long state = 88172645463325252ULL;

static unsigned long long next_rand(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

__attribute__((noinline)) static long branchy(const unsigned char *data, int n)
{
    long acc = 0;
    for (int i = 0; i < n; i++) {
        if (data[i] & 1)
            acc += data[i];
        else
            acc ^= data[i] << 3;
    }
    return acc;
}

__attribute__((noinline)) static long dispatch(const unsigned char *data, int n)
{
    long acc = 0;
    for (int i = 0; i < n; i++) {
        switch (data[i] % 7) {
        case 0: acc += 3; break;
        case 1: acc ^= 0x55; break;
        case 2: acc -= i; break;
        case 3: acc = acc * 3 + 1; break;
        case 4: acc += data[i] >> 2; break;
        case 5: acc |= 0x100; break;
        default: acc -= 7; break;
        }
    }
    return acc;
}

__attribute__((noinline)) static long fib(int n)
{
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

__attribute__((noinline)) static long divide(const unsigned char *data, int n)
{
    long acc = 1;
    for (int i = 0; i < n; i++)
        acc += (1000003L * (i + 1)) / (data[i] + 1);
    return acc;
}

static int cmp(const void *a, const void *b)
{
    return (int)*(const unsigned *)a - (int)*(const unsigned *)b;
}

__attribute__((noinline)) static long sort_lib(int n)
{
    unsigned *v = malloc(n * sizeof *v);
    for (int i = 0; i < n; i++)
        v[i] = next_rand() % 100000;
    qsort(v, n, sizeof *v, cmp);
    long r = v[n / 2];
    free(v);
    return r;
}

int main(int argc, char **argv)
{
    int scale = argc > 1 ? atoi(argv[1]) : 1;
    int n = 20000;
    unsigned char *data = malloc(n);
    for (int i = 0; i < n; i++)
        data[i] = next_rand() & 0xff;
    long sum = 0;
    for (int r = 0; r < 10 * scale; r++) {
        sum += branchy(data, n);
        sum += dispatch(data, n);
        sum += divide(data, n / 4);
        sum += fib(16);
        sum += sort_lib(2000);
    }
    printf("%ld\n", sum);
    free(data);
    return 0;
}
