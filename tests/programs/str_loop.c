/* A loop whose work lies almost all in libc's string functions, among them strcasecmp
 * and strncasecmp, whose entry points run off their end into the _l variants (no jump
 * joins them): the ranges hardware records there span two functions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    char a[512], b[512];
    unsigned long acc = 0;
    for (int i = 0; i < n; i++) {
        memset(a, 'a' + i % 7, sizeof a - 1);
        a[sizeof a - 1] = 0;
        a[100 + i % 300] = 0;
        memcpy(b, a, sizeof a);
        acc += strlen(a);
        acc += strcmp(a, b);
        acc += strchr(a, 'z') ? 1 : 0;
        acc += (unsigned long)memchr(b, 0, sizeof b) & 1;
        strcpy(b, a);
        acc += strncmp(a, b, 50);
        acc += strcasecmp(a, b);
        acc += strncasecmp(a, b, 80);
    }
    printf("%lu\n", acc);
    return 0;
}
