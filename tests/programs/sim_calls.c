/* Call-graph test program: call counts known by construction. main calls outer() N
 * times; outer calls inner() 3 times per call from one call site and leaf() once from
 * another; inner does a little data-dependent work so samples spread over all three.
 * noipa keeps gcc from cloning, inlining or specialising the functions, so every call
 * is a real `call` with the function's own name.
 * Usage: sim_calls [N] (default 100000). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noipa)) unsigned long leaf(unsigned long x)
{
    return x * 2654435761u + 1;
}

__attribute__((noipa)) unsigned long inner(unsigned long x)
{
    for (int i = 0; i < 4; i++)
        x = (x & 1) ? x * 3 + 1 : x >> 1;
    return x;
}

__attribute__((noipa)) unsigned long outer(unsigned long x)
{
    for (int i = 0; i < 3; i++)
        x = inner(x + i);
    /* Not a tail call: a `jmp` to leaf would not be a call record. */
    return leaf(x) ^ 5;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    unsigned long x = 12345;
    for (long i = 0; i < n; i++)
        x = outer(x + i);
    printf("%lu\n", x);
    return 0;
}
