/* A process whose main thread exits first (tests/tests/it/collect.rs): main starts a
 * worker that spins in `worker_spin` for argv[1] seconds (default 10), then leaves by
 * `pthread_exit`. The group leader is then a zombie whose `/proc/PID/maps` reads empty
 * while the worker still runs the program's code; the process exits when the worker
 * returns (also at SIGTERM/SIGINT). */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;
static volatile sig_atomic_t stop;
static double seconds = 10;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) unsigned long worker_spin(unsigned long n) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++)
        x = x * 6364136223846793005UL + i;
    return x;
}

__attribute__((noinline)) void *worker(void *arg) {
    (void)arg;
    double end = now() + seconds;
    while (!stop && now() < end)
        sink += worker_spin(2000000);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1)
        seconds = atof(argv[1]);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    pthread_t t;
    if (pthread_create(&t, 0, worker, 0) != 0)
        return 1;
    pthread_exit(0);
}
