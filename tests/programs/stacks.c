// Call stacks with known shares (tests/tests/it/stacks_collect.rs), run as
// `stacks MODE ROUNDS`:
//   chain   — main → path_a → path_b → leaf (2 units of work per round) and
//             main → path_c → leaf (1 unit): 2/3 of the time under main;path_a;path_b;leaf,
//             1/3 under main;path_c;leaf, the leaf the same function on both paths.
//   qsort   — main → sort_all → qsort (Debian's libc, no frame pointers) → … → by_value,
//             a comparison that burns CPU: nearly all the time under qsort.
//   recurse — main → recurse ×10 000 → leaf: deeper than any stack a sample carries.
//   late    — `stacks late ROUNDS LIB`: main → path_c → leaf for ROUNDS rounds, then
//             main → lib_calls (LIB, tests/programs/calllib.c, loaded only now) → leaf
//             for as many: the library's code is only ever a caller, never a sample's
//             own address.
//   grow    — main → path_c → leaf for ROUNDS rounds, then main → deep ×60 → leaf for as
//             many: shallow stacks first, then ≈ 5 KiB of stack, within the copy of
//             8 KiB but past what the shallow ones need.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile unsigned long sink;

__attribute__((noinline)) void leaf(unsigned long n) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + i;
    sink = x;
}
__attribute__((noinline)) void path_b(unsigned long n) { leaf(n); sink++; }
__attribute__((noinline)) void path_a(unsigned long n) { path_b(n); sink++; }
__attribute__((noinline)) void path_c(unsigned long n) { leaf(n); sink++; }

static int by_value(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    leaf(2000);
    return x < y ? -1 : x > y;
}

__attribute__((noinline)) void sort_all(unsigned long *v, size_t n) {
    qsort(v, n, sizeof *v, by_value);
    sink += v[0];
}

__attribute__((noinline)) unsigned long recurse(unsigned long depth, unsigned long n) {
    // A volatile local read after the call: gcc can turn neither into a loop, so every
    // one of the frames stays on the stack.
    volatile unsigned long here = depth;
    if (depth == 0) {
        leaf(n);
        return 1;
    }
    return recurse(depth - 1, n) + here;
}

__attribute__((noinline)) unsigned long deep(unsigned long depth, unsigned long n) {
    // 64 bytes of locals a frame, kept by a read after the call, as in `recurse`.
    volatile unsigned long pad[8] = {depth};
    if (depth == 0) {
        leaf(n);
        return 1;
    }
    return deep(depth - 1, n) + pad[0];
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "chain";
    unsigned long rounds = argc > 2 ? strtoul(argv[2], 0, 10) : 1000;
    if (!strcmp(mode, "chain")) {
        for (unsigned long r = 0; r < rounds; r++) {
            path_a(2000000);
            path_c(1000000);
        }
    } else if (!strcmp(mode, "qsort")) {
        enum { N = 512 };
        static unsigned long v[N];
        for (unsigned long r = 0; r < rounds; r++) {
            for (size_t i = 0; i < N; i++) v[i] = (i * 2654435761UL + r) % 1000003;
            sort_all(v, N);
        }
    } else if (!strcmp(mode, "grow")) {
        for (unsigned long r = 0; r < rounds; r++) path_c(1000000);
        for (unsigned long r = 0; r < rounds; r++) sink += deep(60, 1000000);
    } else if (!strcmp(mode, "late") && argc > 3) {
        for (unsigned long r = 0; r < rounds; r++) path_c(1000000);
        void *lib = dlopen(argv[3], RTLD_NOW);
        void (*calls)(void (*)(unsigned long), unsigned long, unsigned long) =
            lib ? (void (*)(void (*)(unsigned long), unsigned long, unsigned long))dlsym(
                      lib, "lib_calls")
                : 0;
        if (!calls) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        calls(leaf, 1000000, rounds);
    } else if (!strcmp(mode, "recurse")) {
        for (unsigned long r = 0; r < rounds; r++) sink += recurse(10000, 5000000);
    } else {
        return 2;
    }
    return 0;
}
