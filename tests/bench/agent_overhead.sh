#!/usr/bin/env bash
# Agent steady-state cost beside `perf record -a` (BENCHMARKS.md, "Agent steady state"
# and "Agent under churn"). As root, from the repository root, after
# `cargo build --release`:
#   tests/bench/agent_overhead.sh SECONDS [churn] [build] [agent flags...]
# Keeps both CPUs busy with two shell loops; with `churn`, also starts 150 short-lived
# processes per second (tests/programs/churn.c); with `build`, also keeps real `rustc`
# compilations running for the whole run: `cargo build --release --offline -p cpi-user`
# (its dependencies from the local registry, the eBPF object skipped) into a scratch
# target directory, removed before each round so every round compiles the same crates
# and runs the same build scripts; `nice -n ${BUILD_NICE:-10}`, `-j ${BUILD_JOBS:-4}`
# (deep, distinct `rustc` stacks and a stream of new binaries, as on a host running
# builds). After a 20 s warm-up, prints every 30 s
# the agent's and perf's CPU (Δ utime+stime of /proc/PID/stat, % of one core since the
# warm-up), RSS (VmRSS) and output size, then the agent's own metrics.
# AGENTS="NAME=BINARY ..." runs several builds side by side under the same load (e.g.
# before and after a change: their ratio is measured in one run); the default is
# AGENTS="agent=./target/release/cpi-bpf".
set -euo pipefail
secs=${1:?seconds}; shift
churn=0 build=0
while [[ ${1:-} == churn || ${1:-} == build ]]; do
  if [[ $1 == churn ]]; then churn=1; else build=1; fi
  shift
done
dir=$(mktemp -d /tmp/cpi-bench-XXXX)
port=19464
hz=$(getconf CLK_TCK)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  # The build loop leads its own process group: end cargo and its rustc children too.
  [[ -n ${builder:-} ]] && kill -- "-$builder" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir/build"
}
trap cleanup EXIT
for _ in 1 2; do (while :; do :; done) & pids+=($!); done
if ((churn)); then
  gcc -O2 -o "$dir/churn" tests/programs/churn.c
  "$dir/churn" $(( (secs + 60) * 150 )) 150 2>/dev/null & pids+=($!)
fi
if ((build)); then
  setsid bash -c 'while :; do
      rm -rf "$1"
      AYA_BUILD_SKIP=1 nice -n "$2" cargo build -q --release --offline -p cpi-user \
        -j "$3" --target-dir "$1" >/dev/null 2>&1 && echo >>"$1.rounds" || sleep 1
    done' build "$dir/build" "${BUILD_NICE:-10}" "${BUILD_JOBS:-4}" & builder=$!
fi
read -ra specs <<<"${AGENTS:-agent=./target/release/cpi-bpf}"
names=(); agents=()
for i in "${!specs[@]}"; do
  name=${specs[$i]%%=*}; bin=${specs[$i]#*=}
  "$bin" agent --store "$dir/store-$name" --metrics-addr 127.0.0.1:$((port + i)) "$@" \
    2>"$dir/agent-$name.log" & agents+=($!); pids+=($!); names+=("$name")
done
perf record -q -a -F 999 -e cpu-clock -o "$dir/perf.data" 2>/dev/null & perf=$!; pids+=($perf)
ticks() { awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
rss() { awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
sleep 20
declare -A t0s
for a in "${agents[@]}"; do t0s[$a]=$(ticks "$a"); done
p0=$(ticks $perf); t0=$(date +%s.%N)
printf '%6s' t
for n in "${names[@]}"; do printf ' %10s %10s %12s' "$n%" "${n}MiB" "${n}KB"; done
printf ' %10s %10s %12s\n' perf% perfMiB perfdataKB
for ((t = 30; t <= secs; t += 30)); do
  sleep 30
  now=$(date +%s.%N)
  pct() { echo "($(ticks "$1") - $2) / $hz / ($now - $t0) * 100" | bc -l; }
  printf '%6d' "$t"
  for i in "${!agents[@]}"; do
    a=${agents[$i]}
    printf ' %10.3f %10s %12d' "$(pct "$a" "${t0s[$a]}")" "$(rss "$a")" \
      "$(du -sk "$dir/store-${names[$i]}" | cut -f1)"
  done
  printf ' %10.3f %10s %12d\n' "$(pct $perf "$p0")" "$(rss $perf)" \
    "$(du -k "$dir/perf.data" | cut -f1)"
done
if ((build)); then
  echo "build rounds completed: $({ cat "$dir/build.rounds" 2>/dev/null || true; } | wc -l)"
fi
for i in "${!agents[@]}"; do
  echo "${names[$i]}:"
  curl -s 127.0.0.1:$((port + i))/metrics | grep -E '^cpi_bpf_(samples_total|windows_total|tracked_processes|cache_bytes|sampling_frequency_hz|bpf_run_seconds_total|window_analysis_seconds_sum|samples_lost_total|captured_files)' || true
  grep governor "$dir/agent-${names[$i]}.log" | tail -3 || true
done
