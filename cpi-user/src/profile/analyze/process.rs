//! A process's profile: its functions analysed one by one, then summed into the
//! process's totals and CPI, its calls and functions ordered, its call paths added.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cpi_common::wire::EventRole;

use super::estimate::{cpi_of, Tally};
use super::order::{hottest_call_first, hottest_first};
use super::resolve::ProcessResolver;
use super::{sample_role, Ctx};
use crate::binary::{Binary, CodeObject, SourceLines};
use crate::profile::aggregate::ProcessSamples;
use crate::profile::error::{self, Groups};
use crate::profile::model::{
    unreadable_code_share, CallEdge, Estimate, FunctionProfile, Measures, Mode, ProcessProfile,
    UNREADABLE_CODE_CEILING,
};

impl Ctx<'_> {
    /// The process's profile from its gathered work.
    pub(super) fn finish(
        &mut self,
        p: &ProcessSamples,
        mut res: ProcessResolver<'_>,
    ) -> ProcessProfile {
        let primary = process_tally(p, sample_role(self.mode));
        // Functions are named as people read them everywhere in the profile (calls and
        // edges refer to them by that name); the symbol stays on the function.
        let names: Vec<(String, String)> = res
            .funcs
            .iter()
            .map(|w| (w.name.clone(), w.object_name.clone()))
            .collect();
        let mut summed = Summed::default();
        let mut functions = Vec::with_capacity(res.funcs.len());
        // Line tables per binary, parsed at most once for all its functions here (and
        // not at all when the binary's cache knows every address).
        let mut sources: HashMap<*const Binary, Option<SourceLines<'_>>> = HashMap::new();
        let mut lens = HashMap::new();
        for (i, w) in res.funcs.iter().enumerate() {
            // Known only as a branch target outside the window: nothing to report.
            if !w.has_evidence() {
                continue;
            }
            let mut out = self.function(i, w, primary.weight, &names);
            self.analysed += 1;
            if let Some(s) = &self.analysing {
                s.update(self.analysed);
            }
            let elf = match &w.object {
                CodeObject::Elf(bin) if self.opts.source_lines => Some(bin),
                _ => None,
            };
            if let Some(bin) = elf {
                add_source_lines(
                    bin,
                    sources.entry(Arc::as_ptr(bin)).or_default(),
                    &mut out.profile,
                );
            }
            lens.extend(out.range_lengths.iter().map(|&(s, e, n)| ((i, s, e), n)));
            if let Some(inputs) = out.cpi_inputs {
                summed.add(inputs);
            }
            functions.push(out.profile);
        }
        let calls = call_edges(std::mem::take(&mut self.calls), &names);
        functions.sort_by(hottest_first);
        let cycles_rel_error = p
            .ips
            .contains_key(&EventRole::Cycles)
            .then(|| process_tally(p, EventRole::Cycles).rel_error());
        let (instructions, instructions_rel_error, mut cpi) = self.process_cpi(p, summed);
        if unreadable_code_share(&functions).is_some_and(|s| s >= UNREADABLE_CODE_CEILING) {
            cpi = None;
        }
        ProcessProfile {
            pid: p.pid,
            comm: p.comm.clone(),
            identity: p.identity.clone().unwrap_or_default(),
            samples: primary.samples,
            branch_samples: p.branches.samples,
            measures: Measures {
                time_ns: process_total(p, EventRole::CpuClock),
                cycles: process_total(p, EventRole::Cycles),
                instructions,
                cycles_rel_error,
                instructions_rel_error,
                cpi,
            },
            functions,
            calls,
            stacks: self.stacks(p, &mut res, &lens),
        }
    }

    /// The process's (instructions, their relative standard error, CPI).
    fn process_cpi(
        &self,
        p: &ProcessSamples,
        summed: Summed,
    ) -> (Option<f64>, Option<f64>, Option<Estimate>) {
        let floor = self.opts.sample_floor;
        match self.mode {
            Mode::TimeProfile => (None, None, None),
            Mode::IpSampling => {
                let i = process_tally(p, EventRole::Instructions);
                let c = process_tally(p, EventRole::Cycles);
                let cpi = cpi_of(
                    &c,
                    i.weight as f64,
                    i.variance(),
                    c.samples.min(i.samples),
                    floor,
                );
                (
                    process_total(p, EventRole::Instructions),
                    process_total(p, EventRole::Instructions).map(|_| i.rel_error()),
                    cpi,
                )
            }
            Mode::Cpi | Mode::Simulated | Mode::Instructions => {
                let (n, var) = (summed.instructions, summed.groups.variance());
                (
                    (n > 0.0).then_some(n),
                    (n > 0.0).then(|| error::relative(n, var)),
                    cpi_of(
                        &summed.cycles,
                        n,
                        var,
                        summed.cycles.samples.min(summed.samples),
                        floor,
                    ),
                )
            }
        }
    }
}

/// Σ periods of role `r` over the whole process, if it has samples of it.
fn process_total(p: &ProcessSamples, r: EventRole) -> Option<f64> {
    p.ips.get(&r).map(|a| a.weight as f64)
}

/// The IP samples of role `r` over the whole process.
fn process_tally(p: &ProcessSamples, r: EventRole) -> Tally {
    p.ips
        .get(&r)
        .map(|a| Tally {
            samples: a.samples,
            weight: a.weight,
            groups: Some(Box::new(a.weight_groups)),
        })
        .unwrap_or_default()
}

/// What the process's CPI sums over its functions analysed at instruction level
/// ([`super::function::FunctionOutcome::cpi_inputs`]).
#[derive(Default)]
struct Summed {
    cycles: Tally,
    instructions: f64,
    groups: Groups,
    samples: u64,
}

impl Summed {
    fn add(&mut self, (c, n, g, s): (Tally, f64, Groups, u64)) {
        self.cycles.add(&c);
        self.instructions += n;
        self.groups.add_scaled(&g, 1.0);
        self.samples += s;
    }
}

/// The source file and line of `f` and of its lines, from `bin`'s line tables.
fn add_source_lines<'a>(
    bin: &'a Binary,
    tables: &mut Option<SourceLines<'a>>,
    f: &mut FunctionProfile,
) {
    f.source = bin.source_line(f.address, tables);
    for l in &mut f.lines {
        l.source = bin.source_line(l.address, tables);
    }
}

/// The process's call records, named and ordered.
fn call_edges(
    calls: BTreeMap<(usize, usize), (f64, u64)>,
    names: &[(String, String)],
) -> Vec<CallEdge> {
    let mut calls: Vec<CallEdge> = calls
        .into_iter()
        .map(|((from, to), (count, samples))| CallEdge {
            caller: names[from].0.clone(),
            caller_binary: names[from].1.clone(),
            callee: names[to].0.clone(),
            callee_binary: names[to].1.clone(),
            count,
            samples,
        })
        .collect();
    calls.sort_by(hottest_call_first);
    calls
}
