#!/usr/bin/env python3
"""What the agent holds of two compilers' libraries at its peak (BENCHMARKS.md, "Agent
memory on a build host"). As root, from the repository root, after
`cargo build --release`:

    tests/bench/agent_peak_pages.py BINARY SECONDS

Starts BINARY's agent at default settings with the load of agent_big_binaries.sh (on
two CPUs: llvm-objdump-19 disassembling BINARY, rustc -O compiling a small program),
polls its VmRSS every 0.1 s and, at each new high, reads /proc/PID/pagemap for its
mappings of librustc_driver and Rust's libLLVM 22: which of their sections are resident
(by file offset, from `readelf -S`). Prints VmHWM, the agent's CPU and, for the highest
VmRSS seen, the resident MiB of each mapping by section.
"""
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

from agent_churn import proc_cpu, status_kib as status

BIG = ("librustc_driver", "libLLVM.so.22")


def sections(path):
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m:
            found.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16)))
    return found


def resident_by_section(pid):
    """{mapping: (KiB resident, {section: KiB})} for the big libraries' mappings."""
    res = {}
    with open(f"/proc/{pid}/pagemap", "rb") as pm, open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            p = line.split()
            if len(p) < 6 or not any(b in p[5] for b in BIG):
                continue
            start, end = (int(x, 16) for x in p[0].split("-"))
            offset = int(p[2], 16)
            pm.seek(start // 4096 * 8)
            data = pm.read((end - start) // 4096 * 8)
            present = [i for i in range(len(data) // 8)
                       if struct.unpack_from("<Q", data, i * 8)[0] >> 63]
            if not present:
                continue
            secs, by = sections(p[5]), {}
            for i in present:
                at = offset + i * 4096
                name = next((n for n, o, s in secs if o <= at < o + s), "?")
                by[name] = by.get(name, 0) + 4
            res[f"{os.path.basename(p[5])} at {p[0].split('-')[0]}"] = (len(present) * 4, by)
    return res


def main():
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit("usage: tests/bench/agent_peak_pages.py BINARY SECONDS")
    binary, secs = sys.argv[1], int(sys.argv[2])
    work = tempfile.mkdtemp(prefix="cpi-peak-")
    with open(os.path.join(work, "small.rs"), "w") as f:
        f.write("fn main() { let v: Vec<u64> = (0..1000).map(|x| x * x).collect(); "
                "println!(\"{}\", v.iter().sum::<u64>()); }\n")
    agent = subprocess.Popen([binary, "agent", "--store", os.path.join(work, "store"),
                              "--metrics-addr", "off"],
                             stderr=open(os.path.join(work, "agent.log"), "w"))
    loads = [
        subprocess.Popen(["bash", "-c", "while :; do /usr/bin/llvm-objdump-19 -d "
                          f"--no-show-raw-insn '{binary}' > /dev/null; done"],
                         start_new_session=True),
        subprocess.Popen(["bash", "-c", f"cd '{work}' && while :; do rustc -O -o small "
                          "small.rs 2> /dev/null; done"], start_new_session=True),
    ]
    highest, best, end = 0, {}, time.time() + secs
    try:
        while time.time() < end:
            rss = status(agent.pid, "VmRSS")
            if rss > highest:
                highest, best = rss, resident_by_section(agent.pid)
            time.sleep(0.1)
        cpu = proc_cpu(agent.pid)
        hwm = status(agent.pid, "VmHWM")
    finally:
        for p in loads:
            os.killpg(p.pid, signal.SIGKILL)
        agent.send_signal(signal.SIGINT)
        agent.wait()
    print(f"VmHWM {hwm / 1024:.1f} MiB, highest VmRSS seen {highest / 1024:.1f} MiB, "
          f"agent CPU {cpu:.2f} s in {secs} s")
    for name, (kib, by) in best.items():
        parts = ", ".join(f"{n} {v / 1024:.1f}" for n, v in sorted(by.items(), key=lambda x: -x[1])[:6])
        print(f"  {name}: {kib / 1024:.1f} MiB resident ({parts})")


if __name__ == "__main__":
    main()
