/* A CPU-bound test program for the collection tests: almost all of its time is in
 * `hot_spin`, a little in `cold_spin`. Runs for argv[1] seconds (default 10), then
 * exits 0 (also on SIGTERM/SIGINT); with argv[2] = N it runs N threads doing the same.
 * At exit it prints its own CPU time (`cpu_seconds=S` on stderr): what a time profile's
 * samples should add up to. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

__attribute__((noinline)) unsigned long hot_spin(unsigned long n) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++)
        x = x * 6364136223846793005UL + i;
    return x;
}

__attribute__((noinline)) unsigned long cold_spin(unsigned long n) {
    unsigned long x = 7;
    for (unsigned long i = 0; i < n; i++)
        x ^= x << 13, x ^= x >> 7;
    return x;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double seconds = 10;

static void *work(void *arg) {
    (void)arg;
    double end = now() + seconds;
    while (!stop && now() < end) {
        sink += hot_spin(2000000);
        sink += cold_spin(20000);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1)
        seconds = atof(argv[1]);
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    pthread_t t[64];
    for (int i = 1; i < threads && i < 64; i++)
        pthread_create(&t[i], 0, work, 0);
    work(0);
    for (int i = 1; i < threads && i < 64; i++)
        pthread_join(t[i], 0);
    struct timespec cpu;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    fprintf(stderr, "cpu_seconds=%.6f\n", cpu.tv_sec + cpu.tv_nsec / 1e9);
    return 0;
}
