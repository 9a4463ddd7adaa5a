/* Work in short-lived threads and processes, for the tests of counting per CPU
 * (tests/tests/it/short_lived.rs). Each prints its own CPU time from getrusage on
 * stderr, the truth a time profile's samples should add up to:
 *   short_lived threads SECONDS US  runs threads one after another, each spinning US µs
 *                                   of its own CPU time in `thread_work`, until SECONDS
 *                                   of CPU are spent; prints `cpu_seconds=S threads=N`.
 *   short_lived proc MS             spins MS ms in `proc_work` and exits; prints
 *                                   `pid=P cpu_seconds=S`.
 *   short_lived tree N MS           waits for a line on stdin (the profiler attached),
 *                                   then forks N children one after another, each
 *                                   spinning MS ms in 0.5 ms threads; prints
 *                                   `cpu_seconds=S` for itself and its children. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double seconds_of(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

static double rusage_seconds(int who) {
    struct rusage ru;
    getrusage(who, &ru);
    return seconds_of(ru.ru_utime) + seconds_of(ru.ru_stime);
}

/* Spins `s` seconds of this thread's CPU time. */
__attribute__((noinline)) static void spin(double s) {
    double end = thread_cpu() + s;
    unsigned long x = 1;
    while (thread_cpu() < end)
        for (int i = 0; i < 200; i++)
            x = x * 6364136223846793005UL + i;
    sink = x;
}

__attribute__((noinline)) void *thread_work(void *arg) {
    spin(*(double *)arg);
    return NULL;
}

__attribute__((noinline)) void proc_work(double s) { spin(s); }

/* Threads of `each` seconds, one after another, until `total` seconds of the process's
 * CPU are spent; the number of threads. */
static long run_threads(double total, double each) {
    long n = 0;
    while (rusage_seconds(RUSAGE_SELF) < total) {
        pthread_t t;
        if (pthread_create(&t, NULL, thread_work, &each) != 0) {
            perror("pthread_create");
            exit(1);
        }
        pthread_join(t, NULL);
        n++;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "threads") == 0) {
        long n = run_threads(atof(argv[2]), atof(argv[3]) / 1e6);
        fprintf(stderr, "cpu_seconds=%f threads=%ld\n", rusage_seconds(RUSAGE_SELF), n);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "proc") == 0) {
        proc_work(atof(argv[2]) / 1e3);
        fprintf(stderr, "pid=%d cpu_seconds=%f\n", (int)getpid(), rusage_seconds(RUSAGE_SELF));
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "tree") == 0) {
        char line[64];
        if (!fgets(line, sizeof line, stdin))
            return 1;
        int n = atoi(argv[2]);
        double ms = atof(argv[3]);
        for (int i = 0; i < n; i++) {
            pid_t pid = fork();
            if (pid == 0) {
                run_threads(ms / 1e3, 0.0005);
                _exit(0);
            }
            if (pid < 0 || waitpid(pid, NULL, 0) != pid) {
                perror("fork");
                return 1;
            }
        }
        fprintf(stderr, "cpu_seconds=%f\n",
                rusage_seconds(RUSAGE_SELF) + rusage_seconds(RUSAGE_CHILDREN));
        return 0;
    }
    fprintf(stderr, "usage: short_lived threads SECONDS US | proc MS | tree N MS\n");
    return 2;
}
