/* PMU-model test program: code shapes whose taken branches go to the next instruction,
 * a signal handler, and a loop of 2^k iterations. Each shape is a function of its own,
 * each a few percent of the run, so the accuracy section judges each one:
 * - jmp_next(): `jmp 1f; 1:` in a loop (a direct jump to the next instruction);
 * - call_next(): `call 1f; 1: pop` (reading the PC, as PIC thunks do);
 * - ind_jmp_next(): `jmp *reg` whose target is the next instruction (a jump table whose
 *   first case follows the jump, as gcc -O0 and clang -O2 lay them out);
 * - ind_call_next(): `call *reg` to the next instruction;
 * - dispatch(): a switch the compiler makes into a jump table;
 * - pow2(): a loop nest of 2^k iterations per call (a loop whose taken branches per
 *   call are a power of two can lock onto a period);
 * - on_signal(): a straight-line handler of 1600 instructions, run on every
 *   SIGUSR1 the main loop raises, once a round.
 * Built by gcc and clang at -O0 and -O2: the assembly shapes are fixed, the compiled
 * ones (loops, the switch) differ by compiler. Usage: sim_shapes [rounds] (default 2000).
 * Prints a checksum so nothing is optimised away. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;
static unsigned long long state = 88172645463325252ULL;
static volatile sig_atomic_t signals;

/* Stack room below rsp for a `call` in inline asm: leaf code at -O2 may keep locals in
 * the red zone, which a push would overwrite. */
#define SKIP_RED_ZONE "lea -128(%%rsp), %%rsp\n\t"
#define RESTORE_RED_ZONE "lea 128(%%rsp), %%rsp\n\t"

__attribute__((noinline)) static long jmp_next(long n)
{
    long acc = 0;
    for (long i = 0; i < n; i++) {
        __asm__ volatile("add %1, %0\n\t"
                         "jmp 1f\n"
                         "1:\n\t"
                         "xor $3, %0\n\t"
                         "jmp 2f\n"
                         "2:\n\t"
                         "add $1, %0"
                         : "+r"(acc)
                         : "r"(i));
    }
    return acc;
}

__attribute__((noinline)) static long call_next(long n)
{
    long acc = 0, pc = 0;
    for (long i = 0; i < n; i++) {
        __asm__ volatile(SKIP_RED_ZONE "call 1f\n"
                                       "1:\n\t"
                                       "pop %1\n\t" RESTORE_RED_ZONE "add %1, %0\n\t"
                                       "add %2, %0"
                         : "+r"(acc), "=&r"(pc)
                         : "r"(i));
    }
    return acc;
}

__attribute__((noinline)) static long ind_jmp_next(long n)
{
    long acc = 0, to = 0;
    for (long i = 0; i < n; i++) {
        __asm__ volatile("lea 1f(%%rip), %1\n\t"
                         "jmp *%1\n"
                         "1:\n\t"
                         "add %2, %0\n\t"
                         "lea 2f(%%rip), %1\n\t"
                         "jmp *%1\n"
                         "2:\n\t"
                         "xor $5, %0"
                         : "+r"(acc), "=&r"(to)
                         : "r"(i));
    }
    return acc;
}

__attribute__((noinline)) static long ind_call_next(long n)
{
    long acc = 0, to = 0;
    for (long i = 0; i < n; i++) {
        __asm__ volatile(SKIP_RED_ZONE "lea 1f(%%rip), %1\n\t"
                                       "call *%1\n"
                                       "1:\n\t"
                                       "pop %1\n\t" RESTORE_RED_ZONE "add %1, %0\n\t"
                                       "sub %2, %0"
                         : "+r"(acc), "=&r"(to)
                         : "r"(i));
    }
    return acc;
}

__attribute__((noinline)) static long dispatch(long n)
{
    long acc = 0;
    for (long i = 0; i < n; i++) {
        switch ((i * 7 + (acc & 3)) % 6) {
        case 0: acc += 3; break;
        case 1: acc ^= 0x55; break;
        case 2: acc -= i; break;
        case 3: acc = acc * 3 + 1; break;
        case 4: acc += i >> 2; break;
        default: acc |= 0x100; break;
        }
    }
    return acc;
}

__attribute__((noinline)) static long pow2(long n)
{
    long acc = 0;
    for (long j = 0; j < n; j++)
        for (long i = 0; i < 64; i++)
            acc += (i ^ j) & 7;
    return acc;
}

static void on_signal(int sig)
{
    long acc = sig;
    __asm__ volatile(".rept 1600\n\t"
                     "add $7, %0\n\t"
                     ".endr"
                     : "+r"(acc));
    sink += acc;
    signals++;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 2000;
    long acc = 0;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGUSR1, &sa, NULL);
    for (long r = 0; r < rounds; r++) {
        /* Trip counts vary from round to round: a round of fixed length near the period
         * would hold every sample of a re-draw at one phase of it (a lock the model does
         * show, not these shapes' concern). */
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        long n = 80 + (long)(state % 41);
        acc += jmp_next(n);
        acc += call_next(n);
        acc += ind_jmp_next(n);
        acc += ind_call_next(n);
        acc += dispatch(2 * n);
        acc += pow2(4);
        raise(SIGUSR1);
    }
    printf("%ld %ld %d\n", acc, sink, (int)signals);
    return 0;
}
