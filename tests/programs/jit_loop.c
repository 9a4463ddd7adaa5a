/* Half of its work in code it writes at run time (an anonymous executable mapping, as
 * a JIT compiler's), half in a C loop: code whose bytes no file holds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* mov ecx, edi; xor eax, eax; 1: add eax, ecx; imul eax, eax, 3; dec ecx; jnz 1b; ret */
static const uint8_t CODE[] = {0x89, 0xf9, 0x31, 0xc0, 0x01, 0xc8, 0x6b, 0xc0,
                               0x03, 0xff, 0xc9, 0x75, 0xf7, 0xc3};

__attribute__((noinline)) static unsigned c_loop(unsigned n) {
    unsigned a = 0;
    for (unsigned i = n; i; i--) {
        a += i;
        a ^= a >> 3;
    }
    return a;
}

int main(int argc, char **argv) {
    unsigned rounds = argc > 1 ? (unsigned)atoi(argv[1]) : 20000;
    uint8_t *m = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return 1;
    memcpy(m, CODE, sizeof CODE);
    if (mprotect(m, 4096, PROT_READ | PROT_EXEC))
        return 1;
    unsigned (*jit)(unsigned) = (unsigned (*)(unsigned))m;
    volatile unsigned sink = 0;
    for (unsigned r = 0; r < rounds; r++)
        sink += jit(1000) + c_loop(1000);
    return (int)(sink & 1) * 0;
}
