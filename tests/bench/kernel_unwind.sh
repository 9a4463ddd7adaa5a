#!/usr/bin/env bash
# What a sample's user stack costs the kernel side under the agent, per build: the
# kernel's own `run_time_ns / run_cnt` of `ip_cpu_clock` (BENCHMARKS.md, "In-kernel cost
# per sample"; the decision on unwinding in the kernel). As root, from
# the repository root, after `cargo build --release`:
#   tests/bench/kernel_unwind.sh RUNS NAME=BINARY [NAME=BINARY ...]
# Alternating the builds RUNS times each, and `--no-stacks` of the first: one
# tests/programs/deep_frames.c per CPU (30 frame-pointer frames deep), the agent at a fixed
# 250 Hz, the program's runs counted between 8 s and 28 s after the agent starts.
set -euo pipefail
. tests/bench/stack_common.sh
runs=${1:?runs}; shift
dir=$(mktemp -d /tmp/cpi-kunwind-XXXX)
pids=()
trap 'kill "${pids[@]}" 2> /dev/null || true; rm -rf "$dir"; sysctl -qw kernel.bpf_stats_enabled=0' EXIT
gcc -O1 -fno-omit-frame-pointer -fno-optimize-sibling-calls -o "$dir/deep" \
  tests/programs/deep_frames.c
kernel_ns() {
  local bin=$1; shift
  pids=()
  for ((c = 0; c < $(nproc); c++)); do "$dir/deep" 30 & pids+=($!); done
  sysctl -qw kernel.bpf_stats_enabled=1
  "$bin" agent --store "$dir/store" --metrics-addr 127.0.0.1:19557 \
    --frequency 250 --min-frequency 250 "$@" 2> "$dir/agent.log" &
  local agent=$!
  sleep 8; local a; a=$(snap); sleep 20; local b; b=$(snap)
  kill -INT $agent; wait $agent || true
  kill "${pids[@]}"; wait "${pids[@]}" 2> /dev/null || true
  sysctl -qw kernel.bpf_stats_enabled=0
  rm -rf "$dir/store"
  python3 -c 'import sys; a, b = [list(map(int, x.split())) for x in sys.argv[1:]]
print("%.0f ns a run (%d runs)" % ((b[0] - a[0]) / max(1, b[1] - a[1]), b[1] - a[1]))' "$a" "$b"
}
for ((r = 0; r < runs; r++)); do
  first=1
  for build in "$@"; do
    name=${build%%=*} bin=${build#*=}
    echo "$name: $(kernel_ns "$bin")"
    if ((first)); then
      echo "$name --no-stacks: $(kernel_ns "$bin" --no-stacks)"
      first=0
    fi
  done
done
