// report_fdata tests: three hot functions for BOLT (linked with --emit-relocs).
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) unsigned collatz_steps(unsigned long n) {
    unsigned steps = 0;
    while (n != 1) {
        if (n & 1)
            n = 3 * n + 1;
        else
            n >>= 1;
        steps++;
    }
    return steps;
}

// static: BOLT names it checksum/1, which the writer must follow.
static __attribute__((noipa)) unsigned long checksum(const unsigned char *p, unsigned long len) {
    unsigned long h = 5381;
    for (unsigned long i = 0; i < len; i++) {
        if (p[i] > 128)
            h = h * 33 + p[i];
        else
            h ^= p[i] << 3;
    }
    return h;
}

int main(int argc, char **argv) {
    unsigned long limit = argc > 1 ? strtoul(argv[1], 0, 10) : 20000;
    unsigned long total = 0;
    unsigned char buf[4096];
    for (unsigned i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 7919u >> 3);
    for (unsigned long n = 1; n < limit; n++)
        total += collatz_steps(n);
    for (int r = 0; r < 20; r++)
        total += checksum(buf, sizeof buf);
    printf("%lu\n", total);
    return 0;
}
