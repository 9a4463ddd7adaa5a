// Maps N distinct small executable files, then runs for SECS seconds, calling into them
// now and then (tests/tests/it/hostile.rs: one descriptor per file would exhaust a root
// profiler's). With CHURN ≥ 0 it also spends most of its time in a loop in a file of its
// own, and maps a new such file every CHURN seconds (0: never) and moves into it: a new
// mapping that samples land in, which a profiler must learn (BENCHMARKS.md, "A hostile
// host: mapping churn"). Usage: manymaps DIR N SECS [CHURN]
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int (*fn)(void);

// One page of code: CODE, then int3 padding.
static fn map_code(const char *path, const char *code, size_t len) {
    unsigned char page[4096];
    memset(page, 0xcc, sizeof page);
    memcpy(page, code, len);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, page, sizeof page) != sizeof page)
        return perror(path), exit(1), (fn)0;
    void *p = mmap(0, sizeof page, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return perror("mmap"), exit(1), (fn)0;
    close(fd);
    return (fn)p;
}

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec - t0->tv_sec + (t.tv_nsec - t0->tv_nsec) / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5)
        return 2;
    int n = atoi(argv[2]);
    double secs = atof(argv[3]);
    double churn = argc == 5 ? atof(argv[4]) : -1;
    fn *fns = calloc(n, sizeof *fns);
    char path[4096];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%05d.so", argv[1], i);
        // mov eax, 1; ret
        fns[i] = map_code(path, "\xb8\x01\x00\x00\x00\xc3", 6);
    }
    // mov ecx, 100000; l: dec ecx; jnz l; mov eax, 1; ret
    static const char spin[] = "\xb9\xa0\x86\x01\x00\xff\xc9\x75\xfc\xb8\x01\x00\x00\x00\xc3";
    int mapped = 0;
    fn hot = 0;
    if (churn >= 0) {
        snprintf(path, sizeof path, "%s/g%05d.so", argv[1], mapped++);
        hot = map_code(path, spin, sizeof spin - 1);
    }
    fprintf(stderr, "mapped %d\n", n);
    struct timespec t0, last;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    last = t0;
    volatile unsigned long sink = 0;
    for (unsigned long k = 0;; k++) {
        sink += fns[k % n]();
        if (hot)
            for (int j = 0; j < 10; j++)
                sink += hot();
        else
            for (int j = 0; j < 1000; j++)
                sink += j * k;
        if ((k & (hot ? 0xf : 0xfff)) == 0) {
            if (since(&t0) > secs)
                break;
            if (churn > 0 && since(&last) > churn) {
                clock_gettime(CLOCK_MONOTONIC, &last);
                snprintf(path, sizeof path, "%s/g%05d.so", argv[1], mapped++);
                hot = map_code(path, spin, sizeof spin - 1);
            }
        }
    }
    if (churn > 0)
        fprintf(stderr, "mapped %d new\n", mapped - 1);
    return 0;
}
