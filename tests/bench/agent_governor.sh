#!/usr/bin/env bash
# The governor's rates and the agent's whole cost (BENCHMARKS.md, "The governor holding
# still"). As root, from the repository root, after `cargo build --release`:
#   tests/bench/agent_governor.sh SECONDS [agent flags...]
# Keeps every CPU busy with one shell loop each, runs the agent, and every 10 s prints
# its sampling frequency and its cost, `cpi_bpf_agent_cpu_seconds_total` (user + system
# time of its threads + its BPF programs' run time: the governor's own figure), as % of
# one core since start; at the end, the cost from 60 s on, the rates seen from 60 s on,
# and the governor's log lines. BIN=path picks the binary (default ./target/release/cpi-bpf).
set -euo pipefail
secs=${1:?seconds}; shift
bin=${BIN:-./target/release/cpi-bpf}
dir=$(mktemp -d /tmp/cpi-gov-XXXX)
port=${PORT:-19474}
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do (while :; do :; done) & pids+=($!); done
"$bin" agent --store "$dir/store" --metrics-addr "127.0.0.1:$port" "$@" 2>"$dir/agent.log" &
pids+=($!)
metric() { curl -s "127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
start=$(date +%s.%N)
rates=() cost60=0 t60=$start
for ((t = 10; t <= secs; t += 10)); do
  sleep 10
  hz=$(metric cpi_bpf_sampling_frequency_hz)
  cost=$(metric cpi_bpf_agent_cpu_seconds_total)
  now=$(date +%s.%N)
  awk -v t="$t" -v hz="$hz" -v c="$cost" -v a="$start" -v b="$now" \
    'BEGIN { printf "%4d s: %s Hz, agent CPU + BPF %.3f %% of one core since start\n", t, hz, 100 * c / (b - a) }'
  if ((t == 60)); then cost60=$cost t60=$now; fi
  if ((t > 60)); then rates+=("$hz"); fi
done
awk -v c="$cost" -v c0="$cost60" -v a="$t60" -v b="$now" \
  'BEGIN { printf "from 60 s on: agent CPU + BPF %.3f %% of one core\n", 100 * (c - c0) / (b - a) }'
echo "rates from 60 s on: $(printf '%s\n' "${rates[@]}" | sort -n | uniq -c | awk '{ printf "%s Hz ×%s, ", $2, $1 }')"
grep governor "$dir/agent.log" || true
