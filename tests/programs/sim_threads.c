/* Threads and signals under the tracer: signals delivered to the main thread while it
 * computes, then worker threads (Valgrind serialises them). Each worker is joined right
 * after it is created, so the main thread always blocks in the join (mid-range: its
 * state is saved and restored around the worker) and the run is the same every time;
 * overlapping work made libc's futex paths depend on scheduling, which differs between
 * two Valgrind runs (the callgrind comparison needs identical runs).
 * Usage: sim_threads. Prints a checksum. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static volatile long hits;

static void on_signal(int sig)
{
    hits += sig;
}

__attribute__((noinline)) static long work(long seed, long n)
{
    long acc = seed;
    for (long i = 0; i < n; i++)
        acc = acc * 6364136223846793005L + (acc >> 17) + i;
    return acc;
}

static void *worker(void *arg)
{
    long *r = arg;
    *r = work(*r, 400000);
    return NULL;
}

int main(void)
{
    pthread_t t[2];
    long r[2] = {1, 2};
    signal(SIGUSR1, on_signal);
    long acc = 0;
    for (int k = 0; k < 20; k++) {
        acc += work(k, 5000);
        raise(SIGUSR1);
    }
    for (int i = 0; i < 2; i++) {
        pthread_create(&t[i], NULL, worker, &r[i]);
        pthread_join(t[i], NULL);
    }
    printf("%ld %ld\n", acc + r[0] + r[1], (long)hits);
    return 0;
}
