/* `leader_exit_libs LIB DIR N SECS`: copies the shared library LIB
 * (tests/programs/worklib.c) to DIR/w0000.so … (N files, each its own inode), loads
 * each, and says `loaded N` on stderr; then its main thread leaves by `pthread_exit`
 * while a worker calls lib_work() of every copy in turn for SECS seconds (also ended by
 * SIGTERM/SIGINT). The group leader is then a zombie whose `/proc/PID/map_files` and
 * `/proc/PID/root` are gone while the worker runs the copies' code
 * (tests/tests/it/hostile_threads.rs). */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef unsigned long (*work_fn)(unsigned long);

static work_fn *fns;
static int n;
static double seconds;
static volatile unsigned long sink;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void copy(const char *from, const char *to) {
    static char buf[1 << 20];
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    ssize_t len = in < 0 ? -1 : read(in, buf, sizeof buf);
    if (out < 0 || len <= 0 || write(out, buf, len) != len)
        perror(to), exit(1);
    close(in);
    close(out);
}

static void *worker(void *arg) {
    (void)arg;
    double end = now() + seconds;
    while (!stop && now() < end)
        for (int i = 0; i < n; i++)
            sink += fns[i](20000);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: leader_exit_libs LIB DIR N SECS\n");
        return 2;
    }
    n = atoi(argv[3]);
    seconds = atof(argv[4]);
    fns = calloc(n, sizeof *fns);
    char path[4096];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/w%04d.so", argv[2], i);
        copy(argv[1], path);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h || !(fns[i] = (work_fn)dlsym(h, "lib_work")))
            return fprintf(stderr, "%s\n", dlerror()), 1;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    pthread_t t;
    if (pthread_create(&t, 0, worker, 0) != 0)
        return 1;
    fprintf(stderr, "loaded %d\n", n);
    pthread_exit(0);
}
