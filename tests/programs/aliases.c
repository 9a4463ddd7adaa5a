// One function under several names (tests/tests/it/symbols.rs): which one a profiler
// shows is perf's choose_best_symbol; calls through the PLT name their target.
#include <stdlib.h>

volatile unsigned long sink;

__attribute__((noinline)) void __hot_spin(unsigned long n) {
    for (unsigned long i = 0; i < n; i++)
        sink += i * i;
}

// A weak alias (perf prefers strong names), a local one (perf prefers globals) and a
// global with fewer leading underscores (perf prefers those).
extern void hot_spin_weak(unsigned long) __attribute__((weak, alias("__hot_spin")));
static void hot_spin_local(unsigned long) __attribute__((alias("__hot_spin"), used));
extern void hot_spin(unsigned long) __attribute__((alias("__hot_spin")));

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 200000000;
    hot_spin(n);
    return 0;
}
