/* `uselib LIB MS`: loads the shared library LIB (tests/programs/hostlib.c) and spins in
 * its lib_hot() for MS milliseconds of wall time, then exits; says `loaded` on stderr
 * once the library is mapped. The process of the hostile-host tests whose library is
 * truncated, replaced or upgraded under it (tests/tests/it/hostile.rs). */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

static void done(int sig) {
    (void)sig;
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: uselib LIB MS\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    void (*hot)(void) = (void (*)(void))dlsym(h, "lib_hot");
    if (!hot) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    long ms = atol(argv[2]);
    struct itimerval t = {{0, 0}, {ms / 1000, (ms % 1000) * 1000}};
    signal(SIGALRM, done);
    setitimer(ITIMER_REAL, &t, 0);
    fprintf(stderr, "loaded\n");
    hot();
    return 0;
}
