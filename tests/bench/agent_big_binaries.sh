#!/usr/bin/env bash
# The agent's peak memory when the host runs programs whose code is in very large
# binaries, as a build host does (BENCHMARKS.md, "Agent memory on a build host").
# As root, from the repository root, after `cargo build --release`:
#   tests/bench/agent_big_binaries.sh RUNS SECS NAME=BINARY [NAME=BINARY ...]
# Alternating the builds RUNS times each: starts the agent at default settings and keeps
# every CPU busy for SECS seconds, half with Debian's llvm-objdump-19 disassembling the
# agent's own executable (its code is in libLLVM.so.19.1, 129 MB, a 6 MB symbol table),
# half with rustc -O compiling a small program (librustc_driver, 153 MB, and Rust's own
# libLLVM, 199 MB); then prints the agent's VmHWM (the peak of VmRSS: its windows end on
# the wall clock's multiples of 10 s, where binaries are first symbolized).
set -euo pipefail
runs=${1:?runs}; secs=${2:?seconds}; shift 2
dir=$(mktemp -d /tmp/cpi-bigbin-XXXX)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/small.rs" <<'RS'
fn main() {
    let v: Vec<u64> = (0..1000).map(|x| x * x).collect();
    println!("{}", v.iter().sum::<u64>());
}
RS
objdump=/usr/bin/llvm-objdump-19
[[ -x $objdump ]] || { echo "needs $objdump (apt install llvm-19)" >&2; exit 1; }
for ((r = 0; r < runs; r++)); do
  for spec in "$@"; do
    name=${spec%%=*}; bin=${spec#*=}
    rm -rf "$dir/store"
    "$bin" agent --store "$dir/store" --metrics-addr off 2> "$dir/agent.log" &
    agent=$!
    loads=()
    for i in $(seq "$(nproc)"); do
      # Each load in its own process group, stopped as a whole below.
      if ((i % 2)); then
        setsid bash -c "while :; do $objdump -d --no-show-raw-insn '$bin' > /dev/null; done" &
      else
        setsid bash -c "cd '$dir' && while :; do rustc -O -o small small.rs 2> /dev/null; done" &
      fi
      loads+=($!)
    done
    sleep "$secs"
    hwm=$(awk '/^VmHWM/{print $2 / 1024}' /proc/$agent/status)
    rss=$(awk '/^VmRSS/{print $2 / 1024}' /proc/$agent/status)
    for l in "${loads[@]}"; do kill -- "-$l" 2> /dev/null || true; done
    kill -INT $agent; wait $agent || true
    echo "$name run $r: VmHWM $hwm MiB, VmRSS $rss MiB at the end," \
      "$(ls "$dir/store" | wc -l) windows"
  done
done
