//! The CPI estimators, and the IP-sample tallies they read: one place decides what a
//! CPI and its error are, for functions, blocks, lines, processes and (through
//! [`estimate`]) merged profiles and call paths.

use cpi_common::wire::EventRole;

use crate::profile::error::{self, Groups};
use crate::profile::model::Estimate;

/// IP-sample tallies of one role: (samples, Σ periods, Σ periods per group).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Tally {
    pub(super) samples: u64,
    pub(super) weight: u64,
    /// `weight` per group of samples (cpi-user/src/profile/error.rs); none for
    /// `cpu-clock` (aggregate.rs keeps none).
    pub(super) groups: Option<Box<Groups>>,
}

impl Tally {
    pub(super) fn add(&mut self, o: &Tally) {
        self.add_parts(o.samples, o.weight, o.groups.as_deref());
    }

    pub(super) fn add_parts(&mut self, samples: u64, weight: u64, groups: Option<&Groups>) {
        self.samples += samples;
        self.weight += weight;
        if let Some(g) = groups {
            self.groups.get_or_insert_default().add_scaled(g, 1.0);
        }
    }

    /// The variance of `weight`.
    pub(super) fn variance(&self) -> f64 {
        self.groups.as_ref().map_or(0.0, |g| g.variance())
    }

    /// One standard error of `weight`, relative to it.
    pub(super) fn rel_error(&self) -> f64 {
        error::relative(self.weight as f64, self.variance())
    }
}

pub(super) const ROLES: usize = 4;

pub(super) fn role_index(r: EventRole) -> usize {
    r as usize
}

/// CPI = cycles / instructions with its relative standard error `rel_error`
/// (cpi-user/src/profile/error.rs); `None` below the floor or without instructions. The
/// one CPI estimate: merging (`profile/merge.rs`) uses it too.
pub(in crate::profile) fn estimate(
    cycles: f64,
    instructions: f64,
    rel_error: f64,
    samples: u64,
    floor: u64,
) -> Option<Estimate> {
    (samples >= floor.max(1) && instructions > 0.0).then(|| Estimate {
        value: cycles / instructions,
        rel_error,
        samples,
    })
}

/// The CPI estimate of cycles `c` over `instructions` (with variance `instr_var`), two
/// independent samplers.
pub(super) fn cpi_of(
    c: &Tally,
    instructions: f64,
    instr_var: f64,
    samples: u64,
    floor: u64,
) -> Option<Estimate> {
    let rel = error::quotient(c.rel_error(), error::relative(instructions, instr_var));
    estimate(c.weight as f64, instructions, rel, samples, floor)
}

/// The timed-LBR CPI estimate of Σ cycles over Σ instructions of the same timed ranges,
/// each also given per group of samples. `None` below the floor, or when every group
/// of samples gave the same ratio: the samples then show no spread to measure an
/// error from (in the PMU model, whose costs are deterministic but for mispredictions, a
/// unit whose samples all missed a rare misprediction; docs/METHOD.md, "Two CPI estimators").
pub(super) fn timed_cpi_of(
    (cycles, cycles_groups): (f64, &Groups),
    (instructions, instructions_groups): (f64, &Groups),
    samples: u64,
    floor: u64,
) -> Option<Estimate> {
    let rel = error::ratio(cycles_groups, instructions_groups);
    estimate(cycles, instructions, rel, samples, floor).filter(|_| rel > error::RESOLUTION)
}
