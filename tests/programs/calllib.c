/* A shared library (`-shared -fPIC`) that only calls back: lib_calls(cb, n, rounds) runs
 * cb(n) `rounds` times, so its own code is a caller on the stack and (almost) never a
 * sample's address. tests/programs/stacks.c `late` loads it after its maps were read
 * (tests/tests/it/stacks_collect.rs). */
void lib_calls(void (*cb)(unsigned long), unsigned long n, unsigned long rounds) {
    for (unsigned long r = 0; r < rounds; r++) {
        cb(n);
        __asm__ volatile("" ::: "memory");
    }
}
