#!/usr/bin/env python3
"""A system-wide CPI profile of 10 000 functions for the HTML report's size and load
benchmark (BENCHMARKS.md, "The HTML report of 10 000 functions"): 100 processes of 100
functions each; every function with 20 instructions, 5 blocks and a CPI; 60 call
paths of depth 6-14 per process. Built from the shape of a real `simulate` profile
(given as argv[1]), written to argv[2]. Deterministic (seeded)."""
import copy, json, random, sys

random.seed(7)
real = json.load(open(sys.argv[1]))
proc0 = real["processes"][0]
f0 = proc0["functions"][0]
out = copy.deepcopy(real)
out["processes"], out["stack_functions"], out["stack_frames"] = [], [], []
out["accuracy"] = None
fn_index, frame_index = {}, {}

def frame(name, binary, address):
    key = (name, binary)
    if key not in fn_index:
        fn_index[key] = len(out["stack_functions"])
        out["stack_functions"].append({"name": name, "binary": binary})
    fkey = (fn_index[key], address)
    if fkey not in frame_index:
        frame_index[fkey] = len(out["stack_frames"])
        out["stack_frames"].append({"function": fn_index[key], "address": address})
    return frame_index[fkey]

for p in range(100):
    binary = f"/usr/bin/service{p:03}"
    fns, total_c, total_i = [], 0.0, 0.0
    for i in range(100):
        f = copy.deepcopy(f0)
        f["name"] = f"svc{p:03}::handler_{i:03}<std::vector<int>>::run(int)"
        f["binary"], f["address"], f["size"] = binary, 0x1000 + i * 0x400, 0x300
        cycles = random.paretovariate(1.2) * 1e5
        cpi = random.uniform(0.3, 5.0)
        f["cycles"], f["instructions"] = cycles, cycles / cpi
        f["samples"] = int(cycles / 203) + 1
        f["cpi"] = {"value": cpi, "rel_error": 0.05, "samples": f["samples"]}
        f["timed_cpi"], f["bolt_name"], f["edges"] = None, None, []
        f["lines"] = [dict(f0["lines"][0], address=f["address"] + 3 * k, cycles=cycles / 20,
                           count=cycles / cpi / 20, text=f"add eax,{k}") for k in range(20)]
        f["blocks"] = [dict(f0["blocks"][0], start=f["address"] + 30 * k,
                            end=f["address"] + 30 * k + 30, len=10) for k in range(5)]
        total_c, total_i = total_c + cycles, total_i + cycles / cpi
        fns.append(f)
    stacks = []
    for s in range(60):
        depth = random.randint(6, 14)
        chain = random.sample(range(100), depth)
        leaf = fns[chain[0]]
        share = leaf["cycles"] / 60
        stacks.append({
            "frames": [frame(fns[c]["name"], binary, fns[c]["address"] + 8) for c in chain],
            "end": "complete", "samples": int(share / 2003) + 1, "branch_samples": 1,
            "time_ns": None, "cycles": share, "instructions": share / leaf["cpi"]["value"],
            "cpi": None, "cycles_rel_error": 0.05, "instructions_rel_error": 0.05, "range_hits": 1,
        })
    pr = copy.deepcopy(proc0)
    pr.update(pid=1000 + p, comm=f"service{p:03}", functions=fns, stacks=stacks, calls=[],
              cycles=total_c, instructions=total_i, samples=sum(f["samples"] for f in fns))
    out["processes"].append(pr)
json.dump(out, open(sys.argv[2], "w"))
