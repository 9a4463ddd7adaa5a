//! Analysis cost on a large stripped binary (BENCHMARKS.md "Analysis"). Not a test of
//! correctness: run explicitly with
//! `cargo test --release -p cpi-user --lib -- --ignored --nocapture bench_analysis`.

use super::tests::{ip, opts, run_info};
use super::*;
use crate::binary::testbin::maps_for;
use crate::binary::Binary;
use crate::binary::{Cfg, FlowKind, Function};
use cpi_common::wire::{BranchEntry, BranchSample, SampleHeader};
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::time::Instant;

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
#[ignore = "benchmark: run by hand, figures go to BENCHMARKS.md"]
fn bench_analysis_libpython() {
    let path = Path::new("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0");
    if !path.exists() {
        crate::binary::testbin::skip(format_args!("{} not installed", path.display()));
        return;
    }
    const BASE: u64 = 0x7f12_3400_0000;
    const PID: u32 = 9;
    const FUNCS: usize = 2000;
    const TAKEN: u64 = 5_000_000;
    const BRANCH_PERIOD: u64 = 13;
    const CYCLE_PERIOD: u64 = 997;
    const DEPTH: usize = 32;
    const WINDOW: usize = 16;
    let bin = Binary::open(path).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    // The FUNCS largest functions are the "sampled" ones; walks pick them with a
    // skewed (hot/cold) distribution.
    let mut funcs: Vec<Function> = bin.functions().collect();
    funcs.sort_by_key(|f| std::cmp::Reverse(f.size));
    funcs.truncate(FUNCS);
    let t_cfg = Instant::now();
    let cfgs: Vec<Cfg> = funcs.iter().map(|f| bin.cfg(f, &[]).unwrap()).collect();
    eprintln!(
        "disassembly + blocks of {FUNCS} functions: {:.3} s",
        t_cfg.elapsed().as_secs_f64()
    );

    let mut set = SampleSet::new(WINDOW);
    set.process(PID).maps = Some(maps_for(path, &bin, BASE));
    let mut ring: std::collections::VecDeque<BranchEntry> = Default::default();
    let (mut taken, mut executed) = (0u64, 0u64);
    let mut f = 0usize;
    let mut i = 0usize;
    while taken < TAKEN {
        let cfg = &cfgs[f];
        let ins = &cfg.instructions[i];
        executed += 1;
        if executed % CYCLE_PERIOD == 0 {
            set.add_ip(&ip(PID, EventRole::Cycles, BASE + ins.addr, CYCLE_PERIOD))
                .unwrap();
        }
        let target = ins.target.and_then(|t| cfg.instruction_at(t));
        let jump = match ins.kind {
            FlowKind::CondBranch if target.is_some() && rng.gen_bool(0.5) => target,
            FlowKind::Jump if target.is_some() => target,
            FlowKind::Next | FlowKind::CondBranch | FlowKind::Syscall
                if i + 1 < cfg.instructions.len() =>
            {
                i += 1;
                continue;
            }
            _ => None,
        };
        // A taken branch: inside the function, or out of it to the next walk.
        let (to_f, to_i) = match jump {
            Some(j) => (f, j),
            None => {
                // Each exit site (call, ret, indirect jump) has a few fixed
                // destinations, skewed towards the hottest functions.
                let pick = (ins.addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40)
                    .wrapping_add(rng.gen_range(0..3));
                let r = (pick % 10_000) as f64 / 10_000.0;
                ((r * r * r * FUNCS as f64) as usize, 0)
            }
        };
        let to = BASE + cfgs[to_f].instructions[to_i].addr;
        ring.push_front(BranchEntry::new(BASE + ins.addr, to, false, 3));
        ring.truncate(DEPTH);
        taken += 1;
        if taken % BRANCH_PERIOD == 0 && ring.len() == DEPTH {
            let header = SampleHeader {
                tgid: PID,
                period: BRANCH_PERIOD,
                ..Default::default()
            };
            let entries: Vec<BranchEntry> = ring.iter().copied().collect();
            set.add_branch(&BranchSample::new(header, &entries));
        }
        (f, i) = (to_f, to_i);
    }
    let b = &set.processes[&PID].branches;
    let (samples, ranges, edges) = (b.samples, b.range_count(), b.taken_count());
    drop(cfgs);
    let rss_before = peak_rss_kib();
    let t0 = Instant::now();
    let prof = analyze(&set, run_info(Mode::Cpi), &opts());
    let dt = t0.elapsed();
    let rss_after = peak_rss_kib();
    let json = serde_json::to_vec(&prof).unwrap().len();
    let pp = &prof.processes[0];
    let lines: usize = pp.functions.iter().map(|f| f.lines.len()).sum();
    eprintln!(
        "libpython3.11: {} functions analysed ({} lines), {samples} branch samples, \
         {ranges} distinct ranges, {edges} distinct taken edges, {} cycle samples: \
         analysis {:.3} s, peak RSS {} MiB before / {} MiB after, profile JSON {} MiB, \
         invalid ranges {}",
        pp.functions.len(),
        lines,
        pp.samples,
        dt.as_secs_f64(),
        rss_before / 1024,
        rss_after / 1024,
        json >> 20,
        prof.lost.invalid_ranges,
    );
}
