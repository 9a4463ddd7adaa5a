#!/usr/bin/env python3
"""Which ELF sections of EXE are resident in process PID, per mapping of EXE (present
pages from /proc/PID/pagemap, sections from `readelf -SW`), KiB. As root:
    tests/bench/resident_sections.py PID EXE
(BENCHMARKS.md, "Agent memory: the ring and the allocator")."""
import sys, struct, subprocess, re
pid = int(sys.argv[1]); exe = sys.argv[2]
secs = []
out = subprocess.run(["readelf", "-SW", exe], capture_output=True, text=True).stdout
for l in out.splitlines():
    m = re.match(r'\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)', l)
    if m and m.group(1) != 'NULL':
        secs.append((m.group(1), int(m.group(3),16), int(m.group(4),16)))
def sec_of(off):
    for n, o, s in secs:
        if o <= off < o + max(s,1): return n
    return '?'
pm = open(f"/proc/{pid}/pagemap", "rb")
for l in open(f"/proc/{pid}/maps"):
    f = l.split()
    if len(f) < 6 or f[5] != exe: continue
    a, b = [int(x,16) for x in f[0].split('-')]; off = int(f[2],16)
    counts = {}
    pm.seek(a // 4096 * 8); data = pm.read((b - a) // 4096 * 8)
    for i in range((b - a) // 4096):
        e = struct.unpack_from('<Q', data, i*8)[0]
        if e >> 63:
            s = sec_of(off + i*4096); counts[s] = counts.get(s, 0) + 4
    print(f[0], f[1], f[2], {k: v for k, v in sorted(counts.items(), key=lambda x: -x[1])})
