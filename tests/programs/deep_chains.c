/* Deep mutual recursion: CHAINS chains of calls DEPTH deep among four functions, each
 * chain a different sequence of them (which function comes next depends on the chain
 * and the depth), so every chain is a new set of calling contexts and of call paths
 * (by name) past the first few levels.
 * Usage: deep_chains [chains] [depth] (default 10 10000). Prints a checksum. */
#include <stdio.h>
#include <stdlib.h>

typedef unsigned long (*step_fn)(unsigned chain, unsigned depth);

static unsigned long step(unsigned chain, unsigned depth);

#define STEP(name, k)                                                    \
    __attribute__((noinline)) static unsigned long name(unsigned chain, \
                                                        unsigned depth) \
    {                                                                    \
        if (depth == 0)                                                  \
            return chain * 7 + k;                                        \
        return step(chain, depth - 1) * 3 + k;                           \
    }

STEP(walk_a, 1)
STEP(walk_b, 2)
STEP(walk_c, 3)
STEP(walk_d, 4)

static const step_fn steps[4] = {walk_a, walk_b, walk_c, walk_d};

/* The function at `depth` of chain `chain`: a hash of both, so chains part after a few
 * levels and never meet again. */
__attribute__((noinline)) static unsigned long step(unsigned chain, unsigned depth)
{
    unsigned h = (chain + 1) * 2654435761u ^ depth * 40503u;
    h ^= h >> 13;
    return steps[(h * 0x9E3779B1u) >> 30](chain, depth);
}

int main(int argc, char **argv)
{
    unsigned chains = argc > 1 ? (unsigned)atoi(argv[1]) : 10;
    unsigned depth = argc > 2 ? (unsigned)atoi(argv[2]) : 10000;
    unsigned long sum = 0;
    for (unsigned c = 0; c < chains; c++)
        sum += step(c, depth);
    printf("%lu\n", sum);
    return 0;
}
