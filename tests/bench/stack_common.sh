# Sourced by the stack benchmarks (stack_copy.sh, kernel_unwind.sh, stack_repeats.sh):
# what they share.

# The deep programs' inputs in directory $1: gen.c (tests/bench/compiler_input.py's
# 3 000-function file, for `gcc -O2 -c`) and deep.py (python3 serialising a 200-deep
# nested dict with `json.dumps`).
deep_inputs() {
  python3 tests/bench/compiler_input.py "$1/gen.c"
  cat > "$1/deep.py" <<'PY'
import json
d = {}
for i in range(200):
    d = {"k%d" % i: d, "v": list(range(20))}
for _ in range(3000):
    json.dumps(d)
PY
}

# run_time_ns and run_cnt of ip_cpu_clock, summed over its loaded copies.
snap() {
  bpftool -j prog show name ip_cpu_clock | python3 -c '
import json, sys
d = json.load(sys.stdin); d = d if isinstance(d, list) else [d]
print(sum(p.get("run_time_ns", 0) for p in d), sum(p.get("run_cnt", 0) for p in d))'
}
