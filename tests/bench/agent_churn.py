#!/usr/bin/env python3
"""The agent under process churn from many distinct binaries (BENCHMARKS.md, "Agent
under churn"). As root, from the repository
root, after `cargo build --release`:

    tests/bench/agent_churn.py SECONDS [--rate 50] [--binaries 200] [--spin-ms 10]
                               [--warmup 30] [-- agent flags...]

Builds tests/programs/churn.c once and copies it BINARIES times under distinct names (a
distinct inode each: to the agent, distinct executables), keeps every CPU busy with one
shell loop each, starts the agent (default settings unless flags follow `--`), and execs
(tests/programs/churn.c) the copies round-robin at RATE new processes a second, each spinning SPIN_MS of CPU and
exiting. Every 10 s it prints the governor's rate, the agent's CPU (its own metric,
`cpi_bpf_agent_cpu_seconds_total`: user + system + BPF; and utime + stime of
/proc/PID/stat) since the warm-up, VmRSS and VmHWM; at the end a summary and the
governor's log lines. BIN=path picks the binary (default ./target/release/cpi-bpf).
The CPU count comes from the machine, so the same command gives a bigger host's row.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


def metrics(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in body.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        try:
            v = float(value)
        except ValueError:
            continue
        out[name] = v
        # A labelled family also by its name alone, summed over its labels.
        if "{" in name:
            base = name.split("{", 1)[0]
            out[base] = out.get(base, 0) + v
    return out


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seconds", type=int)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--binaries", type=int, default=200)
    ap.add_argument("--spin-ms", type=float, default=10)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--port", type=int, default=19476)
    # argparse cannot take flags after `--` beside a positional: split them off first.
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    a.agent_flags = argv[cut + 1:]
    binary = os.environ.get("BIN", "./target/release/cpi-bpf")
    work = tempfile.mkdtemp(prefix="cpi-churn-")
    children = []
    try:
        src = os.path.join(work, "churn")
        subprocess.run(["gcc", "-O2", "-o", src, "tests/programs/churn.c"], check=True)
        for i in range(a.binaries):
            shutil.copy(src, os.path.join(work, f"churn-{i:03d}"))
        for _ in range(os.cpu_count()):
            children.append(subprocess.Popen(["sh", "-c", "while :; do :; done"]))
        log = open(os.path.join(work, "agent.log"), "w")
        agent = subprocess.Popen(
            [binary, "agent", "--store", os.path.join(work, "store"),
             "--metrics-addr", f"127.0.0.1:{a.port}", *a.agent_flags],
            stderr=log)
        children.append(agent)
        start = time.monotonic()
        run(a, agent, src, start)
        log.close()
        with open(os.path.join(work, "agent.log")) as f:
            for line in f:
                if "governor" in line:
                    print(line.rstrip())
    finally:
        for c in children:
            c.send_signal(signal.SIGKILL if c.args[0] == "sh" else signal.SIGINT)
        for c in children:
            c.wait()
        shutil.rmtree(work, ignore_errors=True)


def run(a, agent, src, start):
    """Starts the churn (a C loop: Python's own exec took ≈ 30 ms a child beside the busy
    loops) and reads the agent every 10 s until SECONDS."""
    pid = agent.pid
    churn = subprocess.Popen(
        [src, str(int(a.rate * a.seconds)), f"{a.rate:g}", f"{a.spin_ms:g}",
         str(a.binaries)], stderr=subprocess.PIPE, text=True)
    base = None  # (time, metric CPU, /proc CPU) at the end of the warm-up
    rates = []
    for t in range(10, a.seconds + 1, 10):
        time.sleep(max(0, start + t - time.monotonic()))
        now = time.monotonic()
        m = metrics(a.port)
        cpu_m, cpu_p = m.get("cpi_bpf_agent_cpu_seconds_total", 0), proc_cpu(pid)
        hz = m.get("cpi_bpf_sampling_frequency_hz", 0)
        since = ""
        if base is not None:
            span = now - base[0]
            since = (f", since warm-up {100 * (cpu_m - base[1]) / span:.3f} % "
                     f"(metric) {100 * (cpu_p - base[2]) / span:.3f} % (/proc)")
            rates.append(hz)
        if base is None and t >= a.warmup:
            base = (now, cpu_m, cpu_p)
        print(f"{t:5d} s: {hz:g} Hz{since}, "
              f"VmRSS {status_kib(pid, 'VmRSS') / 1024:.1f} MiB, "
              f"VmHWM {status_kib(pid, 'VmHWM') / 1024:.1f} MiB, "
              f"tracked {m.get('cpi_bpf_tracked_processes', 0):g}, "
              f"binaries parsed {m.get('cpi_bpf_binaries_parsed_total', -1):g}",
              flush=True)
    churn.kill()
    churn.wait()
    if rates:
        rates.sort()
        print(f"rates after the warm-up: median {rates[len(rates) // 2]:g} Hz, "
              f"min {rates[0]:g}, max {rates[-1]:g}; {a.rate:g} processes/s asked "
              f"from {a.binaries} binaries on {os.cpu_count()} busy CPUs")
    print(f"VmHWM {status_kib(pid, 'VmHWM') / 1024:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
