#!/usr/bin/env bash
# What copying the user stack costs the sampled CPU, and what cutting the copy costs in
# complete stacks (BENCHMARKS.md, "Copying less stack"). As root, from
# the repository root, after `cargo build --release`:
#   tests/bench/stack_copy.sh RUNS NAME=BINARY [NAME=BINARY ...]
# Alternating the builds RUNS times each:
# - `tests/programs/busy.c` (two threads, shallow stacks) profiled at 999 Hz: the kernel's
#   own `run_time_ns / run_cnt` of `ip_cpu_clock` between 1.2 s and 2.9 s into the run
#   (after the first 64 stacks, where a process's cut is chosen), with stacks and, for the
#   first build, `--no-stacks`;
# - deep programs, one-shot at 999 Hz: `gcc -O2 -c` of tests/bench/compiler_input.py's
#   file, and python3 serialising a 200-deep nested dict with `json.dumps`: the stacks
#   truncated, over the samples.
set -euo pipefail
. tests/bench/stack_common.sh
runs=${1:?runs}; shift
dir=$(mktemp -d /tmp/cpi-stackcopy-XXXX)
trap 'rm -rf "$dir"; sysctl -qw kernel.bpf_stats_enabled=0' EXIT
gcc -O2 -pthread -o "$dir/busy" tests/programs/busy.c
deep_inputs "$dir"
kernel_ns() {
  local bin=$1; shift
  sysctl -qw kernel.bpf_stats_enabled=1
  "$dir/busy" 6 2 > /dev/null 2>&1 & local busy=$!
  "$bin" --pid $busy --frequency 999 --duration 3.5 --format json -o "$dir/busy.json" "$@" \
    2> /dev/null &
  local prof=$!
  sleep 1.2; local a; a=$(snap); sleep 1.7; local b; b=$(snap)
  wait $prof; kill $busy; wait $busy 2> /dev/null || true
  sysctl -qw kernel.bpf_stats_enabled=0
  python3 -c 'import sys; a, b = [list(map(int, x.split())) for x in sys.argv[1:]]
print("%.0f" % ((b[0] - a[0]) / max(1, b[1] - a[1])))' "$a" "$b"
}
# stacks_truncated of samples, in a one-shot profile.
truncated() {
  local bin=$1; shift
  "$bin" --frequency 999 --format json -o "$dir/deep.json" -- "$@" > /dev/null 2>&1
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
n = sum(e["samples"] for e in d["events"])
t = d["lost"]["stacks_truncated"]
print("%d of %d (%.1f %%)" % (t, n, 100 * t / max(1, n)))' "$dir/deep.json"
}
for ((r = 0; r < runs; r++)); do
  first=1
  for spec in "$@"; do
    name=${spec%%=*}; bin=${spec#*=}
    line="$name run $r: ip_cpu_clock $(kernel_ns "$bin") ns a run"
    if ((first)); then
      line+=" (--no-stacks $(kernel_ns "$bin" --no-stacks) ns)"
      first=0
    fi
    line+="; truncated: gcc $(truncated "$bin" gcc -O2 -c -o "$dir/gen.o" "$dir/gen.c")"
    line+=", python3 $(truncated "$bin" python3 "$dir/deep.py")"
    echo "$line"
  done
done
