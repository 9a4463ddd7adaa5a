/* Process churn for the agent's churn test: `churn N RATE` starts N short-lived
 * processes, at most RATE per second, each a fresh exec of this program (`churn kid`)
 * that spins about 1 ms of CPU and exits (`churn N RATE MS COPIES`: each child spins
 * MS ms and is a copy of this program, `PATH-000` … `PATH-{COPIES-1}` in turn beside
 * its PATH, as tests/bench/agent_churn.py lays them out); it reaps them as it goes and prints
 * `started=N seconds=S` on stderr. Each child is a new process with its own pid, maps
 * and exec, as a fleet host's cron jobs, health checks and shell pipelines are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile unsigned long sink;

__attribute__((noinline)) void kid_spin(double seconds) {
    double end = cpu_now() + seconds;
    unsigned long x = 1;
    while (cpu_now() < end)
        for (int i = 0; i < 10000; i++)
            x = x * 6364136223846793005UL + i;
    sink = x;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "kid") == 0) {
        kid_spin(argc > 2 ? atof(argv[2]) / 1000 : 0.001);
        return 0;
    }
    long n = argc > 1 ? atol(argv[1]) : 1000;
    double rate = argc > 2 ? atof(argv[2]) : 150;
    const char *ms = argc > 3 ? argv[3] : "1";
    long copies = argc > 4 ? atol(argv[4]) : 0;
    char self[4096], exe[4200];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = 0;
    double t0 = now();
    long started = 0;
    for (long i = 0; i < n; i++) {
        double due = t0 + i / rate, wait = due - now();
        if (wait > 0)
            usleep((useconds_t)(wait * 1e6));
        if (copies > 0)
            snprintf(exe, sizeof exe, "%s-%03ld", self, i % copies);
        else
            snprintf(exe, sizeof exe, "%s", self);
        pid_t pid = fork();
        if (pid == 0) {
            execl(exe, exe, "kid", ms, (char *)0);
            _exit(127);
        }
        if (pid > 0)
            started++;
        while (waitpid(-1, 0, WNOHANG) > 0)
            ;
    }
    while (wait(0) > 0)
        ;
    fprintf(stderr, "started=%ld seconds=%.1f\n", started, now() - t0);
    return 0;
}
