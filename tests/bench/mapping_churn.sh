#!/usr/bin/env bash
# The agent beside a process holding 25 000 file mappings (BENCHMARKS.md, "A hostile
# host: mapping churn"). As root, from the repository root, after `cargo build --release`:
#   tests/bench/mapping_churn.sh BINARY CHURN SECONDS [perf]
# Starts tests/programs/manymaps.c with 25 000 one-page executable files, spinning in a
# file of its own and mapping a new one every CHURN seconds (0: never), then
# `BINARY agent --pid` on it (interval 10 s). After a 12 s warm-up (the first read of its
# maps), prints the agent's CPU over SECONDS (Δ utime+stime of /proc/PID/stat), the
# windows it wrote and its metrics; with `perf`, records the agent meanwhile
# (`perf record -F 499 -g --call-graph dwarf`, perf.data in the printed directory).
set -euo pipefail
bin=${1:?binary}; churn=${2:?churn seconds}; secs=${3:?seconds}; rec=${4:-}
dir=$(mktemp -d /tmp/cpi-churn-XXXX)
mkdir "$dir/files"
gcc -O2 -o "$dir/manymaps" tests/programs/manymaps.c
"$dir/manymaps" "$dir/files" 25000 $((secs + 40)) "$churn" 2>"$dir/target.err" &
target=$!
until grep -q mapped "$dir/target.err"; do sleep 0.2; done
"$bin" agent --interval 10 --metrics-addr 127.0.0.1:19465 --pid "$target" \
  --store "$dir/store" 2>"$dir/agent.err" &
agent=$!
sleep 12
ticks() { awk '{print $14 + $15}' "/proc/$agent/stat"; }
c0=$(ticks); t0=$(date +%s.%N)
if [[ $rec == perf ]]; then
  perf record -F 499 -g --call-graph dwarf -o "$dir/perf.data" -p "$agent" -- sleep "$secs" \
    >/dev/null 2>&1
else
  sleep "$secs"
fi
c1=$(ticks); t1=$(date +%s.%N)
metrics=$(curl -s 127.0.0.1:19465/metrics | grep -E '^cpi_bpf_(windows_total|sampling_frequency_hz|captured_files_total)' | tr '\n' ' ')
kill -TERM "$agent"; wait "$agent" || true
kill "$target" 2>/dev/null; wait "$target" 2>/dev/null || true
hz=$(getconf CLK_TCK)
echo "churn=$churn: agent CPU $(echo "scale=2; 100 * ($c1 - $c0) / $hz / ($t1 - $t0)" | bc) % of a core over $(echo "$t1 - $t0" | bc) s; windows in the store: $(ls "$dir/store" | wc -l); $dir"
echo "$metrics"
