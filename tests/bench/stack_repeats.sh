#!/usr/bin/env bash
# How often a sample's user registers repeat: the most a cache of unwound stacks keyed by
# (ip, sp) could hit (BENCHMARKS.md, "Where to unwind"). As root, from
# the repository root: `perf record --user-regs=ip,sp` at 999 Hz of a tight loop 30
# frame-pointer frames deep (tests/programs/deep_frames.c), a shell loop, `gcc -O2 -c` of
# tests/bench/compiler_input.py's file, and python3 serialising a 200-deep nested dict.
#   tests/bench/stack_repeats.sh
set -euo pipefail
. tests/bench/stack_common.sh
dir=$(mktemp -d /tmp/cpi-repeats-XXXX)
trap 'rm -rf "$dir"' EXIT
gcc -O1 -fno-omit-frame-pointer -fno-optimize-sibling-calls -o "$dir/deep" \
  tests/programs/deep_frames.c
deep_inputs "$dir"
repeats() {
  perf record -q -e cpu-clock -F 999 --user-regs=ip,sp -o "$dir/perf.data" -- "$@" \
    > /dev/null 2>&1 || true
  perf script -i "$dir/perf.data" -F ip,uregs 2> /dev/null | python3 -c '
import collections, sys
seen = collections.Counter(tuple(l.split()) for l in sys.stdin if l.strip())
n = sum(seen.values())
print("%d samples, %d distinct (ip, sp): %.1f %% repeats"
      % (n, len(seen), 100 * (n - len(seen)) / max(1, n)))'
}
echo "deep_frames: $(repeats timeout 3 "$dir/deep" 30)"
echo "shell loop: $(repeats timeout 3 sh -c 'while :; do :; done')"
echo "gcc -O2 -c: $(repeats gcc -O2 -c "$dir/gen.c" -o "$dir/gen.o")"
echo "python3 json.dumps: $(repeats python3 "$dir/deep.py")"
