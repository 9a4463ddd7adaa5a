// Maps N distinct small executable files, then runs for SECS seconds, calling into them
// now and then (tests/tests/it/hostile.rs: one descriptor per file would exhaust a root
// profiler's). Usage: manymaps DIR N SECS
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    int n = atoi(argv[2]);
    double secs = atof(argv[3]);
    // mov eax, 1; ret — then padding to one page.
    unsigned char page[4096];
    memset(page, 0xcc, sizeof page);
    memcpy(page, "\xb8\x01\x00\x00\x00\xc3", 6);
    int (**fns)(void) = calloc(n, sizeof *fns);
    char path[4096];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%05d.so", argv[1], i);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, page, sizeof page) != sizeof page)
            return perror(path), 1;
        void *p = mmap(0, sizeof page, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            return perror("mmap"), 1;
        close(fd);
        fns[i] = (int (*)(void))p;
    }
    fprintf(stderr, "mapped %d\n", n);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    volatile unsigned long sink = 0;
    for (unsigned long k = 0;; k++) {
        sink += fns[k % n]();
        for (int j = 0; j < 1000; j++)
            sink += j * k;
        if ((k & 0xfff) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > secs)
                break;
        }
    }
    return 0;
}
