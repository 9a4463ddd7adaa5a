/* A CPU-bound loop at the bottom of DEPTH frame-pointer frames (default 30), for
 * measuring what a user stack costs the kernel side per sample (BENCHMARKS.md, "In-kernel
 * cost per sample", the decision on unwinding in the kernel). Build with frame pointers
 * and without sibling calls, so the kernel's own walk (bpf_get_stack's user stack) sees
 * every frame:
 *   gcc -O1 -fno-omit-frame-pointer -fno-optimize-sibling-calls -o deep_frames deep_frames.c
 *   ./deep_frames [DEPTH]     (runs until killed) */
#include <stdlib.h>

volatile unsigned long sink;

__attribute__((noinline)) static unsigned long descend(int depth) {
    if (depth == 0) {
        unsigned long x = 0;
        for (int i = 0; i < 100000; i++)
            x += i * (unsigned long)i;
        return x;
    }
    unsigned long r = descend(depth - 1) + depth;
    sink = r; /* keeps the call from becoming a loop */
    return r;
}

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 30;
    for (;;)
        sink += descend(depth);
}
