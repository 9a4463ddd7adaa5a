//! Calibration of the error model (cpi-user/src/profile/error.rs): one exact trace
//! replayed through the PMU model with `seeds` different seeds, every seed's profile
//! judged unit by unit against the exact answer. A unit's estimate x̂ with reported
//! relative error r is *covered* at ±k when |x̂ − x| ≤ k·r·x̂. If each ± is one standard
//! error, ≈ 68.3 % of units are covered at ±1 and ≈ 95.4 % at ±2
//! (`cpi-bpf simulate --calibrate N -- CMD`, docs/METHOD.md, "Error bars").

use std::ffi::OsString;
use std::process::{ExitStatus, Stdio};

use super::accuracy::TruthByAddress;
use super::pmu::PmuConfig;
use super::{command_strings, profile_of, simulate_command, SimError};
use crate::profile::analyze::LineDetail;
use crate::profile::model::{Estimate, Profile};

/// Coverage of one kind of estimate, pooled over units and seeds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Coverage {
    /// What is estimated, e.g. `function CPI`.
    pub estimate: &'static str,
    /// Units with an estimate and a reported error (each seed counts its own).
    pub units: u64,
    /// Units whose true value lies within ±1 reported error.
    pub within_1: u64,
    /// … within ±2 reported errors.
    pub within_2: u64,
}

impl Coverage {
    fn new(estimate: &'static str) -> Self {
        Coverage {
            estimate,
            ..Default::default()
        }
    }

    /// Counts one unit: estimate `est` with relative error `rel` of true value `truth`.
    /// A zero estimate (nothing sampled) has no error to judge: left out.
    fn add(&mut self, est: f64, rel: f64, truth: f64) {
        if est == 0.0 {
            return;
        }
        let z = (est - truth).abs() / (rel * est.abs());
        self.units += 1;
        self.within_1 += (z <= 1.0) as u64;
        self.within_2 += (z <= 2.0) as u64;
    }

    /// The share of units within ±1 and ±2 reported errors.
    pub fn shares(&self) -> (f64, f64) {
        let n = self.units.max(1) as f64;
        (self.within_1 as f64 / n, self.within_2 as f64 / n)
    }
}

/// What a calibration run measured.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// Seeds replayed.
    pub seeds: u32,
    /// Coverage per kind of estimate.
    pub rows: Vec<Coverage>,
    /// How the command exited.
    pub status: ExitStatus,
    /// What the trace followed beyond one program ([`super::followed`]).
    pub followed: Option<String>,
}

/// Traces `cmd` once and measures the coverage of the reported errors over `seeds`
/// replays (seeds `cfg.seed`, `cfg.seed + 1`, …).
pub fn calibrate(
    cfg: &PmuConfig,
    seeds: u32,
    cmd: &[OsString],
    stdout: Stdio,
) -> Result<Calibration, SimError> {
    let cfgs: Vec<PmuConfig> = (0..seeds as u64)
        .map(|i| PmuConfig {
            seed: cfg.seed.wrapping_add(i),
            ..cfg.clone()
        })
        .collect();
    let out = simulate_command(&cfgs, cmd, stdout)?;
    let truth = TruthByAddress::new(&out.truth);
    let mut rows = vec![
        Coverage::new("function instructions"),
        Coverage::new("function cycles"),
        Coverage::new("function CPI"),
        Coverage::new("function timed CPI"),
        Coverage::new("block CPI"),
        Coverage::new("block timed CPI"),
    ];
    for (cfg, (samples, pmu)) in cfgs.iter().zip(&out.models) {
        let profile = profile_of(
            cfg,
            samples,
            &out.truth,
            pmu,
            command_strings(cmd),
            0.0,
            LineDetail::Every,
        );
        add_profile(&profile, out.truth.pid, &truth, &mut rows);
    }
    Ok(Calibration {
        seeds,
        rows,
        status: out.status,
        followed: super::followed(&out.truth),
    })
}

/// Adds every unit of process `pid` of `profile` to `rows` (in the order of
/// [`calibrate`]'s rows).
fn add_profile(profile: &Profile, pid: u32, truth: &TruthByAddress, rows: &mut [Coverage]) {
    let Some(p) = profile.processes.iter().find(|p| p.pid == pid) else {
        return;
    };
    let cpi = |row: &mut Coverage, e: &Option<Estimate>, (n, c): (u64, u64)| {
        if let (Some(e), true) = (e, n > 0) {
            row.add(e.value, e.rel_error, c as f64 / n as f64);
        }
    };
    for f in &p.functions {
        // Every instruction of an analysed function has a line: the function's truth is
        // the sum over its lines, a block's over the lines inside it.
        let lines: Vec<(u64, (u64, u64))> = f
            .lines
            .iter()
            .map(|l| (l.address, truth.get(&f.binary, l.address)))
            .collect();
        // Lines are in address order.
        let sum = |range: std::ops::Range<u64>| {
            let from = lines.partition_point(|(a, _)| *a < range.start);
            let to = lines.partition_point(|(a, _)| *a < range.end);
            lines[from..to]
                .iter()
                .fold((0, 0), |(n, c), (_, (tn, tc))| (n + tn, c + tc))
        };
        let (n, c) = sum(0..u64::MAX);
        // Instructions and cycles of the functions above the sample floor: those whose
        // CPI is shown (a function seen in one or two samples has an error as wide as
        // itself, which says nothing about calibration).
        if f.measures.cpi.is_some() {
            if let (Some(est), Some(rel)) =
                (f.measures.instructions, f.measures.instructions_rel_error)
            {
                rows[0].add(est, rel, n as f64);
            }
            if let (Some(est), Some(rel)) = (f.measures.cycles, f.measures.cycles_rel_error) {
                rows[1].add(est, rel, c as f64);
            }
        }
        cpi(&mut rows[2], &f.measures.cpi, (n, c));
        cpi(&mut rows[3], &f.timed_cpi, (n, c));
        for b in &f.blocks {
            let t = sum(b.start..b.end);
            cpi(&mut rows[4], &b.cpi, t);
            cpi(&mut rows[5], &b.timed_cpi, t);
        }
    }
}
