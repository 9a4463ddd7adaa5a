/* Test program for the binary/profile analysis unit tests: a counted loop, data-dependent
 * branches with a switch, recursion, and an exported function (kept in .dynsym so the
 * stripped copy still names it). noinline keeps each function a real function at -O2. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long sum_loop(const int *a, long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += a[i];
    return s;
}

__attribute__((noinline)) int classify(int x) {
    int r = 0;
    if (x & 1)
        r += 3;
    else
        r -= 1;
    switch (x % 7) {
    case 0: r += 11; break;
    case 1: r ^= 5; break;
    case 2: r *= 3; break;
    case 3: r -= 7; break;
    case 4: r += x; break;
    case 5: r |= 64; break;
    default: r = -r; break;
    }
    return r;
}

__attribute__((noinline)) long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__attribute__((noinline, visibility("default"))) long exported_entry(int n) {
    long t = 0;
    for (int i = 0; i < n; i++)
        t += classify(i);
    return t;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int *a = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        a[i] = i * 7;
    long r = sum_loop(a, n) + exported_entry(n) + fib(n % 25);
    printf("%ld\n", r);
    free(a);
    return 0;
}
