#!/usr/bin/env bash
# One-shot cost on a program whose hot code is in a 100 MB library (BENCHMARKS.md,
# "One-shot on a 100 MB library"). As root, from the repository root, after
# `cargo build --release`:
#   tests/bench/oneshot_big_library.sh RUNS SECS NAME=BINARY [NAME=BINARY ...]
# Generates libbig.so: 20 000 functions (gcc -O1 on a generated C file) and 96 MiB of
# random .rodata (.incbin), and a program that calls its functions for SECS seconds.
# Then, alternating the builds RUNS times each, runs
#   BINARY --format json --output p.json -- ./bigprog SECS
# and prints per run the profiler's peak RSS (VmHWM of /proc/PID/status, read every
# 5 ms), its wall time, the time after the command stopped (wall time less the
# "after N s" it prints: start-up included, an upper bound) and the JSON's size.
set -euo pipefail
runs=${1:?runs}; secs=${2:?seconds}; shift 2
dir=$(mktemp -d /tmp/cpi-bigl-XXXX)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import sys
d = sys.argv[1]
n = 20000
with open(f'{d}/big.c', 'w') as f:
    for i in range(n):
        f.write(f'int big{i}(int x) {{ for (int j = 0; j < {i % 13 + 3}; j++) '
                f'x = x * {i % 7 + 3} + (x >> {i % 5 + 1}) + {i}; return x; }}\n')
    f.write('typedef int (*fn)(int);\nconst fn big_table[] = {')
    f.write(','.join(f'big{i}' for i in range(n)))
    f.write('};\nconst int big_count = %d;\n' % n)
with open(f'{d}/prog.c', 'w') as f:
    f.write('''#include <stdlib.h>
#include <time.h>
typedef int (*fn)(int);
extern const fn big_table[]; extern const int big_count;
extern const unsigned char big_blob[];
int main(int argc, char **argv) {
    double secs = atof(argv[1]);
    struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
    volatile int s = 0;
    for (unsigned long k = 0;; k++) {
        s += big_table[(k * 7919) % big_count](s) + big_blob[(k * 4099) % (96u << 20)];
        if ((k & 0xffff) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > secs) break;
        }
    }
    return 0;
}
''')
PY
head -c $((96 << 20)) /dev/urandom >"$dir/blob.bin"
printf '%s\n' '.section .note.GNU-stack,"",@progbits' '.section .rodata' '.globl big_blob' \
  '.type big_blob, @object' '.size big_blob, 100663296' 'big_blob:' ".incbin \"$dir/blob.bin\"" \
  >"$dir/blob.S"
gcc -O1 -fPIC -shared -o "$dir/libbig.so" "$dir/big.c" "$dir/blob.S"
gcc -O2 -o "$dir/bigprog" "$dir/prog.c" -L"$dir" -lbig -Wl,-rpath,"$dir"
echo "libbig.so: $(stat -c %s "$dir/libbig.so") bytes, $(nm -D --defined-only "$dir/libbig.so" | grep -c ' T big') functions"
printf '%-10s %4s %10s %8s %11s %10s\n' build run peakKB wall_s after_stop_s json_B
for ((r = 1; r <= runs; r++)); do
  for spec in "$@"; do
    name=${spec%%=*}; bin=${spec#*=}
    t0=$(date +%s.%N)
    "$bin" --format json --output "$dir/p.json" -- "$dir/bigprog" "$secs" 2>"$dir/err" & pid=$!
    hwm=0
    while kill -0 $pid 2>/dev/null; do
      h=$(awk '/VmHWM/ { print $2 }' /proc/$pid/status 2>/dev/null || true)
      [[ -n $h && $h -gt $hwm ]] && hwm=$h
      sleep 0.005
    done
    wait $pid || { echo "$name failed:"; cat "$dir/err"; exit 1; }
    wall=$(echo "$(date +%s.%N) - $t0" | bc -l)
    ran=$(grep -o 'after [0-9.]* s' "$dir/err" | head -1 | awk '{ print $2 }')
    printf '%-10s %4d %10d %8.2f %11.2f %10d\n' "$name" "$r" "$hwm" "$wall" \
      "$(echo "$wall - ${ran:-0}" | bc -l)" "$(stat -c %s "$dir/p.json")"
    rm -f "$dir/p.json"
  done
done
grep -m1 'stopped' "$dir/err" || true
