#!/usr/bin/env bash
# Memory of agents running beside tests/bench/agent_overhead.sh (BENCHMARKS.md, "Agent
# memory: the ring and the allocator"). As root:
#   tests/bench/agent_memory.sh OUT NAME=PID:METRICSPORT ...
# Every 10 s, one row per agent to OUT (tab-separated): VmRSS, RssAnon, RssFile (MiB,
# /proc/PID/status); the resident MiB of every mapping of the agent's executable file (its
# code and data, and its own symbolizer's and unwinder's when it samples itself) and of
# its BPF map mappings (the ring buffer: /proc/PID/smaps); utime+stime ticks
# (/proc/PID/stat); and from its /metrics the ring_full losses, samples and the
# sampling rate. Summarise with tests/bench/agent_memory_stats.py OUT [SINCE [UNTIL]].
out=$1; shift
echo -e "time\tname\tVmRSS\tRssAnon\tRssFile\tself_bin\tringbuf\tticks\tring_full\tsamples\tfreq\tthreads" > "$out"
while :; do
  for spec in "$@"; do
    name=${spec%%=*}; rest=${spec#*=}; pid=${rest%%:*}; port=${rest#*:}
    [[ -d /proc/$pid ]] || continue
    exe=$(readlink /proc/$pid/exe)
    st=$(awk '/^VmRSS/{a=$2}/^RssAnon/{b=$2}/^RssFile/{c=$2}/^Threads/{t=$2}END{print a/1024"\t"b/1024"\t"c/1024"\t"t}' /proc/$pid/status)
    sm=$(awk -v exe="$exe" '/^[0-9a-f]+-[0-9a-f]+ /{cur=$6} /^Rss:/{ if (cur==exe) s+=$2; if (cur ~ /bpf-map/) r+=$2 } END{print s/1024"\t"r/1024}' /proc/$pid/smaps)
    tk=$(awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' /proc/$pid/stat)
    m=$(curl -s --max-time 2 127.0.0.1:$port/metrics)
    rf=$(echo "$m" | awk '/^cpi_bpf_samples_lost_total\{reason="ring_full"\}/{print $2}')
    sa=$(echo "$m" | awk '/^cpi_bpf_samples_total/{s+=$2}END{print s+0}')
    fr=$(echo "$m" | awk '/^cpi_bpf_sampling_frequency_hz/{print $2}')
    st2=$(echo "$st" | cut -f1-3); th=$(echo "$st" | cut -f4)
    echo -e "$(date +%H:%M:%S)\t$name\t$st2\t$sm\t$tk\t${rf:-}\t$sa\t${fr:-}\t$th" >> "$out"
  done
  sleep 10
done
