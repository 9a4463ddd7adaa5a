#!/usr/bin/env bash
# The agent filtered to one process of a busy host beside the unfiltered agent
# (BENCHMARKS.md, "Filtering in the kernel"). As root, from the repository root, after
# `cargo build --release`:
#   BEFORE=OTHER_BUILD tests/bench/agent_filter.sh SECONDS [agent flags...]
# Keeps both CPUs busy with two shell loops plus tests/programs/busy.c, the process the
# filters keep, moved into a cgroup v2 directory made here. Runs side by side, under the
# same load: this build unfiltered, with --pid and with --cgroup; with BEFORE set, the
# same three of that build. After a 20 s warm-up, prints each agent's CPU over SECONDS
# (Δ utime+stime of /proc/PID/stat, % of one core) and the samples its windows kept.
set -euo pipefail
secs=${1:?seconds}; shift
dir=$(mktemp -d /tmp/cpi-filter-bench-XXXX)
root=/sys/fs/cgroup
[[ $(stat -f -c %T $root) == cgroup2fs ]] || root=/sys/fs/cgroup/unified
cg=$root/cpi-filter-bench-$$
hz=$(getconf CLK_TCK)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
for _ in 1 2; do (while :; do :; done) & pids+=($!); done
gcc -O2 -o "$dir/busy" tests/programs/busy.c -lpthread
"$dir/busy" $((secs + 120)) 2>/dev/null & target=$!; pids+=($target)
mkdir "$cg"; echo "$target" > "$cg/cgroup.procs"
builds=("after=./target/release/cpi-bpf")
[[ -n ${BEFORE:-} ]] && builds+=("before=$BEFORE")
names=(); agents=()
for b in "${builds[@]}"; do
  for f in all pid cgroup; do
    case $f in
      all) filter=() ;;
      pid) filter=(--pid "$target") ;;
      cgroup) filter=(--cgroup "$cg") ;;
    esac
    name=${b%%=*}-$f
    "${b#*=}" agent --store "$dir/store-$name" --metrics-addr off "${filter[@]}" "$@" \
      2>"$dir/agent-$name.log" & agents+=($!); pids+=($!); names+=("$name")
  done
done
ticks() { awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
sleep 20
declare -A t0s
for a in "${agents[@]}"; do t0s[$a]=$(ticks "$a"); done
t0=$(date +%s.%N)
sleep "$secs"
now=$(date +%s.%N)
printf '%-16s %8s\n' agent 'cpu%'
for i in "${!agents[@]}"; do
  a=${agents[$i]}
  printf '%-16s %8.3f\n' "${names[$i]}" \
    "$(echo "($(ticks "$a") - ${t0s[$a]}) / $hz / ($now - $t0) * 100" | bc -l)"
done
