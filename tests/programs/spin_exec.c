/* Spins in `spin_before_exec` for argv[1] seconds of CPU, then execs argv[2] with the
 * rest of the arguments: the collection tests' "program replaced by exec" case, whose
 * samples from before the exec must still name this program's function. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long spin_before_exec(double seconds)
{
    struct timespec t0, t;
    unsigned long x = 3;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    do {
        for (int i = 0; i < 100000; i++)
            x = x * 2862933555777941757UL + 3037000493UL;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
    return x;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: spin_exec SECONDS PROGRAM [ARGS...]\n");
        return 2;
    }
    sink = spin_before_exec(atof(argv[1]));
    execv(argv[2], argv + 2);
    perror("execv");
    return 127;
}
