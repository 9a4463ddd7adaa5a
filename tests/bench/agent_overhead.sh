#!/usr/bin/env bash
# Agent steady-state cost beside `perf record -a` (BENCHMARKS.md, "Agent steady state"
# and "Agent under churn"). As root, from the repository root, after
# `cargo build --release`:
#   tests/bench/agent_overhead.sh SECONDS [churn] [agent flags...]
# Keeps both CPUs busy with two shell loops; with `churn`, also starts 150 short-lived
# processes per second (tests/programs/churn.c). After a 20 s warm-up, prints every 30 s
# the agent's and perf's CPU (Δ utime+stime of /proc/PID/stat, % of one core since the
# warm-up), RSS (VmRSS) and output size, then the agent's own metrics.
set -euo pipefail
secs=${1:?seconds}; shift
churn=0
if [[ ${1:-} == churn ]]; then churn=1; shift; fi
dir=$(mktemp -d /tmp/cpi-bench-XXXX)
port=19464
hz=$(getconf CLK_TCK)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
for _ in 1 2; do (while :; do :; done) & pids+=($!); done
if ((churn)); then
  gcc -O2 -o "$dir/churn" tests/programs/churn.c
  "$dir/churn" $(( (secs + 60) * 150 )) 150 2>/dev/null & pids+=($!)
fi
./target/release/cpi-bpf agent --store "$dir/store" --metrics-addr 127.0.0.1:$port "$@" \
  2>"$dir/agent.log" & agent=$!; pids+=($agent)
perf record -q -a -F 999 -e cpu-clock -o "$dir/perf.data" 2>/dev/null & perf=$!; pids+=($perf)
ticks() { awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
rss() { awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
sleep 20
a0=$(ticks $agent); p0=$(ticks $perf); t0=$(date +%s.%N)
printf '%6s %10s %10s %12s %10s %10s %12s\n' t agent% agentMiB storeKB perf% perfMiB perfdataKB
for ((t = 30; t <= secs; t += 30)); do
  sleep 30
  now=$(date +%s.%N)
  pct() { echo "($(ticks "$1") - $2) / $hz / ($now - $t0) * 100" | bc -l; }
  printf '%6d %10.3f %10s %12d %10.3f %10s %12d\n' "$t" "$(pct $agent "$a0")" "$(rss $agent)" \
    "$(du -sk "$dir/store" | cut -f1)" "$(pct $perf "$p0")" "$(rss $perf)" \
    "$(du -k "$dir/perf.data" | cut -f1)"
done
curl -s 127.0.0.1:$port/metrics | grep -E '^cpi_bpf_(windows_total|tracked_processes|cache_bytes|sampling_frequency_hz|bpf_run_seconds_total|window_analysis_seconds_sum|samples_lost_total)' || true
grep governor "$dir/agent.log" | tail -3 || true
