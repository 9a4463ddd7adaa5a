// report_import test: a hot and a cold function.
__attribute__((noinline)) long hot(long n) { long s = 0; for (long i = 0; i < n; i++) s += i * i; return s; }
__attribute__((noinline)) long cold(long n) { return n * 3; }
int main(int argc, char **argv) { (void)argv; return (int)(hot(argc * 1000) + cold(argc)) & 1; }
