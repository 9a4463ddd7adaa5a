//! Figures for BENCHMARKS.md ("Tracer", "PMU model / aggregation"). Ignored: run with
//! `cargo test --release -p cpi-tests --test it -- --ignored --nocapture
//! --test-threads 1 bench_`.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Instant;

use cpi_common::policy::{PeriodPolicy, Perturbation};
use cpi_common::wire::{BranchSample, IpSample};
use cpi_tests::tracer::{tool_dir, words_text};
use cpi_user::profile::{CallStack, SampleSet};
use cpi_user::sim::pmu::{PmuConfig, SampleSink};
use cpi_user::sim::replay::Replay;
use cpi_user::sim::run::record_trace;

fn peak_rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024.0
}

fn replay(trace: &std::path::Path, pmu: Option<PmuConfig>) -> (Replay, SampleSet, f64) {
    let window = pmu.as_ref().map(|c| c.depth - 1).unwrap_or(1);
    let mut set = SampleSet::new(window);
    let mut r = Replay::default();
    let t = Instant::now();
    r.run(std::fs::File::open(trace).unwrap(), &mut set, pmu)
        .unwrap();
    (r, set, t.elapsed().as_secs_f64())
}

/// bzip2 -9 on `bytes` of words, traced to a file in a scratch folder: (trace, scratch,
/// tracer seconds with the trace discarded, native seconds).
fn bzip2_trace(bytes: usize) -> Option<(std::path::PathBuf, std::path::PathBuf, f64, f64)> {
    let tool = match tool_dir() {
        Ok(t) => t,
        Err(why) => {
            cpi_tests::skip(&why);
            return None;
        }
    };
    let dir = std::env::temp_dir().join(format!("cpi-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 1 MB of words for bzip2 (the run BENCHMARKS.md's tracer figures were measured
    // on).
    let input = dir.join("input.txt");
    std::fs::write(&input, words_text(bytes)).unwrap();
    let cmd: Vec<OsString> = ["/usr/bin/bzip2", "-c", "-9", input.to_str().unwrap()]
        .iter()
        .map(OsString::from)
        .collect();

    // Tracer alone, trace discarded.
    let t = Instant::now();
    record_trace(
        &tool,
        &cmd,
        std::path::Path::new("/dev/null"),
        Stdio::null(),
    )
    .unwrap();
    let trace_secs = t.elapsed().as_secs_f64();
    // Native run for the slowdown.
    let t = Instant::now();
    std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    let native = t.elapsed().as_secs_f64();
    // Trace kept, for the replays.
    let trace = dir.join("trace.bin");
    record_trace(&tool, &cmd, &trace, Stdio::null()).unwrap();
    Some((trace, dir, trace_secs, native))
}

#[test]
#[ignore]
fn bench_tracer_and_pmu_model() {
    let Some((trace, dir, trace_secs, native)) = bzip2_trace(1_000_000) else {
        return;
    };
    let bytes = std::fs::metadata(&trace).unwrap().len();
    let (r, _, replay_secs) = replay(&trace, None);
    let truth = r.truth();
    let records = truth.stats.records;
    eprintln!(
        "tracer: {} instructions, {} records ({:.0} MB) in {trace_secs:.2} s: {:.1} M instr/s \
         ({:.0}x native {native:.3} s)",
        truth.instructions,
        records,
        bytes as f64 / 1e6,
        truth.instructions as f64 / trace_secs / 1e6,
        trace_secs / native
    );
    eprintln!(
        "replay (cycle model + truth): {replay_secs:.2} s, {:.1} M records/s, {} distinct ranges",
        records as f64 / replay_secs / 1e6,
        truth.stats.distinct_ranges
    );

    // Defaults, then analysis: the simulate pipeline minus the tracer.
    let (rd, setd, d_secs) = replay(&trace, Some(PmuConfig::default()));
    let stats = rd.pmu().unwrap().stats.clone();
    let mut setd = setd;
    setd.process(truth.pid).maps = Some(truth.maps.clone());
    let t = Instant::now();
    let profile = cpi_user::sim::profile_of(
        &PmuConfig::default(),
        &setd,
        &rd.truth(),
        &stats,
        Vec::new(),
        0.0,
        cpi_user::profile::analyze::LineDetail::Every,
    );
    let analysis = t.elapsed().as_secs_f64();
    let acc = profile.accuracy.expect("profile_of measures the accuracy");
    eprintln!(
        "defaults: replay + PMU {d_secs:.2} s ({} branch, {} cycle samples); analysis + \
         accuracy {analysis:.2} s; overlap instr {:.4} block {:.4} fn {:.4} edge {:.4}; CPI error \
         median {:?} max {:?}",
        stats.branch_samples,
        stats.ip_samples,
        acc.overlap_instruction,
        acc.overlap_block,
        acc.overlap_function,
        acc.overlap_edge,
        acc.cpi_error_median,
        acc.cpi_error_max
    );
    eprintln!("peak RSS of this process: {:.0} MiB", peak_rss_mib());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore]
fn bench_aggregation_period_one() {
    let Some((trace, dir, _, _)) = bzip2_trace(200_000) else {
        return;
    };
    let (_, _, replay_secs) = replay(&trace, None);
    // PMU model at period 1: every taken branch is a 32-deep branch sample aggregated
    // (31 ranges + 31 taken edges each): aggregation throughput.
    let every = PmuConfig {
        branch: PeriodPolicy { base: 1, jitter: 0 },
        cycles: PeriodPolicy::around(2003),
        perturbation: Perturbation::None,
        ..PmuConfig::default()
    };
    let (r1, set1, pmu_secs) = replay(&trace, Some(every));
    let stats = r1.pmu().unwrap().stats.clone();
    let entries = stats.branch_samples * 32;
    eprintln!(
        "PMU model, branch period 1, depth 32: {pmu_secs:.2} s; {} branch samples = {} branch \
         records: {:.1} M records/s over the replay's own time ({:.1} M records/s end to end)",
        stats.branch_samples,
        entries,
        entries as f64 / (pmu_secs - replay_secs).max(1e-9) / 1e6,
        entries as f64 / pmu_secs / 1e6
    );
    // What the per-range stack attribution keys on: distinct (stack, range start) keys.
    let stacks = set1
        .processes
        .values()
        .flat_map(|p| p.stacks.iter().map(|(k, _)| k));
    let (keys, frames) = stacks.fold((0usize, 0usize), |(n, f), k| (n + 1, f + k.user.len()));
    eprintln!(
        "stack keys: {keys} distinct, {:.1} user frames on average; {} samples' stacks \
         evicted to stay within {} MiB",
        frames as f64 / keys.max(1) as f64,
        set1.stacks_evicted(),
        set1.stack_bytes >> 20
    );
    drop(set1);

    let _ = std::fs::remove_dir_all(&dir);
}

/// The PMU model's records, kept to be aggregated apart from the model.
#[derive(Default)]
struct Recorder {
    branches: Vec<(BranchSample, CallStack)>,
    ips: usize,
}

impl SampleSink for Recorder {
    fn branch(&mut self, s: &BranchSample, stack: &CallStack) {
        self.branches.push((*s, stack.clone()));
    }

    fn ip(&mut self, _: &IpSample, _: &CallStack) {
        self.ips += 1;
    }

    fn restart(&mut self) {
        *self = Recorder::default();
    }
}

/// The user-space cost of aggregating a branch sample with its
/// stack, the PMU model's own time left out. Branch period 211 (prime, > the LBR's 32
/// entries, so no two samples share a record, as at any real rate), the defaults
/// otherwise; each pass aggregates every sample into a fresh set (a window's start).
#[test]
#[ignore]
fn bench_aggregation_alone() {
    let Some((trace, dir, _, _)) = bzip2_trace(1_000_000) else {
        return;
    };
    let cfg = PmuConfig {
        branch: PeriodPolicy::around(211),
        ..PmuConfig::default()
    };
    let mut rec = Recorder::default();
    let mut r = Replay::default();
    r.run(
        std::fs::File::open(&trace).unwrap(),
        &mut rec,
        Some(cfg.clone()),
    )
    .unwrap();
    let n = rec.branches.len();
    let window = cpi_common::policy::range_window(cfg.depth);
    let mut used = 0;
    let mut ns: Vec<f64> = (0..7)
        .map(|_| {
            let mut set = SampleSet::new(window);
            set.weighting = cfg.weighting();
            let t = Instant::now();
            for (s, stack) in &rec.branches {
                set.add_branch_with_stack(s, Some(stack));
            }
            let secs = t.elapsed().as_secs_f64();
            used = set
                .processes
                .values()
                .map(|p| p.branches.samples)
                .sum::<u64>();
            secs * 1e9 / n as f64
        })
        .collect();
    ns.sort_by(f64::total_cmp);
    eprintln!(
        "aggregation alone, branch period 211, depth 32: {n} branch samples with stacks, {used} \
         deep enough ({} cycle samples not aggregated); ns per branch sample over 7 passes: \
         median {:.0}, min {:.0}, max {:.0}",
        rec.ips, ns[3], ns[0], ns[6]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
