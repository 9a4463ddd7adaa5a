#!/usr/bin/env python3
"""Summary of tests/bench/agent_memory.sh rows: per agent, median (p90, max) of each memory
column, CPU % of one core over the rows, and the last loss and sample counts.
Usage: agent_memory_stats.py OUT [SINCE [UNTIL]] (times HH:MM:SS)."""
import sys, csv, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter='\t'))
since = sys.argv[2] if len(sys.argv) > 2 else '00:00:00'
until = sys.argv[3] if len(sys.argv) > 3 else '99:99:99'
names = []
for r in rows:
    if r['name'] not in names: names.append(r['name'])
def q(v, p):
    v = sorted(v); return v[min(len(v)-1, int(p*len(v)))]
for n in names:
    rs = [r for r in rows if r['name'] == n and since <= r['time'] <= until]
    if not rs: continue
    out = [n, str(len(rs))]
    for k in ['VmRSS', 'RssAnon', 'RssFile', 'self_bin', 'ringbuf']:
        v = [float(r[k]) for r in rs]
        out.append(f"{k} {st.median(v):.1f} ({q(v,0.9):.1f}, {max(v):.1f})")
    t = [int(r['ticks']) for r in rs]
    from datetime import datetime
    dt = (datetime.strptime(rs[-1]['time'], '%H:%M:%S') - datetime.strptime(rs[0]['time'], '%H:%M:%S')).total_seconds()
    out.append(f"cpu {100*(t[-1]-t[0])/100/dt:.2f}%")
    out.append(f"ring_full {rs[-1]['ring_full']} samples {rs[-1]['samples']} freq {rs[-1]['freq']}")
    print(' | '.join(out))
