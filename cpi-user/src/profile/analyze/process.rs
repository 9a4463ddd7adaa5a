//! A process's profile: its functions analysed one by one, then summed into the
//! process's totals and CPI, its calls and functions ordered, its call paths added.

use std::collections::HashMap;
use std::sync::Arc;

use cpi_common::wire::EventRole;

use super::estimate::{cpi_of, Tally};
use super::order::{hottest_call_first, hottest_first};
use super::resolve::ProcessResolver;
use super::{sample_role, Ctx};
use crate::binary::{Binary, CodeObject, SourceLines};
use crate::profile::aggregate::ProcessSamples;
use crate::profile::error::{self, Groups};
use crate::profile::model::{CallEdge, Mode, ProcessProfile};

impl Ctx<'_> {
    /// The process's profile from its gathered work.
    pub(super) fn finish(
        &mut self,
        p: &ProcessSamples,
        mut res: ProcessResolver<'_>,
    ) -> ProcessProfile {
        let role = sample_role(self.mode);
        let proc_tally = |r: EventRole| {
            p.ips
                .get(&r)
                .map(|a| Tally {
                    samples: a.samples,
                    weight: a.weight,
                    groups: Some(Box::new(a.weight_groups)),
                })
                .unwrap_or_default()
        };
        let primary = proc_tally(role);
        // Functions are named as people read them everywhere in the profile (calls and
        // edges refer to them by that name); the symbol stays on the function.
        let names: Vec<(String, String)> = res
            .funcs
            .iter()
            .map(|w| (w.name.clone(), w.object_name.clone()))
            .collect();
        let mut cyc = Tally::default();
        let (mut instr, mut instr_groups, mut instr_samples) = (0.0, Groups::default(), 0u64);
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
                let ctx = sources.entry(Arc::as_ptr(bin)).or_default();
                let f = &mut out.profile;
                f.source = bin.source_line(f.address, ctx);
                for l in &mut f.lines {
                    l.source = bin.source_line(l.address, ctx);
                }
            }
            lens.extend(out.range_lengths.iter().map(|&(s, e, n)| ((i, s, e), n)));
            if let Some((c, n, g, s)) = out.cpi_inputs {
                cyc.add(&c);
                instr += n;
                instr_groups.add_scaled(&g, 1.0);
                instr_samples += s;
            }
            functions.push(out.profile);
        }
        let mut calls: Vec<CallEdge> = std::mem::take(&mut self.calls)
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
        functions.sort_by(hottest_first);

        let total = |r: EventRole| p.ips.get(&r).map(|a| a.weight as f64);
        let floor = self.opts.sample_floor;
        let cycles_rel_error = p
            .ips
            .contains_key(&EventRole::Cycles)
            .then(|| proc_tally(EventRole::Cycles).rel_error());
        // (instructions, their relative standard error, CPI).
        let (instructions, instructions_rel_error, cpi) = match self.mode {
            Mode::TimeProfile => (None, None, None),
            Mode::IpSampling => {
                let i = proc_tally(EventRole::Instructions);
                let c = proc_tally(EventRole::Cycles);
                let cpi = cpi_of(
                    &c,
                    i.weight as f64,
                    i.variance(),
                    c.samples.min(i.samples),
                    floor,
                );
                (
                    total(EventRole::Instructions),
                    total(EventRole::Instructions).map(|_| i.rel_error()),
                    cpi,
                )
            }
            Mode::Cpi | Mode::Simulated | Mode::Instructions => {
                let (n, var) = (instr, instr_groups.variance());
                (
                    (n > 0.0).then_some(n),
                    (n > 0.0).then(|| error::relative(n, var)),
                    cpi_of(&cyc, n, var, cyc.samples.min(instr_samples), floor),
                )
            }
        };
        ProcessProfile {
            pid: p.pid,
            comm: p.comm.clone(),
            identity: p.identity.clone().unwrap_or_default(),
            samples: primary.samples,
            branch_samples: p.branches.samples,
            time_ns: total(EventRole::CpuClock),
            cycles: total(EventRole::Cycles),
            instructions,
            cycles_rel_error,
            instructions_rel_error,
            cpi,
            functions,
            calls,
            stacks: self.stacks(p, &mut res, &lens),
        }
    }
}
