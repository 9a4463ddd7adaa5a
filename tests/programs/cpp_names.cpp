// C++ names for the demangling tests (tests/tests/it/demangle.rs): a const method in a
// namespace, a function template instance, an overload pair and a function in an
// anonymous namespace (its demangled name has a space), each burning CPU. Runs for
// argv[1] seconds (default 2).
#include <cstdlib>
#include <ctime>

static volatile unsigned long sink;

static double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

namespace shapes {
struct Square {
    unsigned long side;
    __attribute__((noipa)) unsigned long area() const {
        unsigned long x = side;
        for (unsigned long i = 0; i < 300000; i++) x = x * 6364136223846793005UL + i;
        return x;
    }
};
}  // namespace shapes

template <typename T> __attribute__((noipa)) T mix(T seed) {
    T x = seed;
    for (unsigned long i = 0; i < 200000; i++) x = x * 2862933555777941757UL + 3037000493UL;
    return x;
}

__attribute__((noipa)) unsigned long work(int n) {
    unsigned long x = n;
    for (int i = 0; i < 100000; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
}

__attribute__((noipa)) unsigned long work(double d) { return work(static_cast<int>(d) + 1); }

namespace {
__attribute__((noipa)) unsigned long spin(int n) {
    unsigned long x = 1;
    for (int i = 0; i < n; i++) x = x * 3 + static_cast<unsigned long>(i);
    return x;
}
}  // namespace

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + secs;
    shapes::Square sq{static_cast<unsigned long>(argc)};
    while (now() < end) {
        sink += sq.area();
        sink += mix<unsigned long>(sink);
        sink += work(2.5);
        sink += spin(100000);
    }
    return 0;
}
