//! One function of one process: its profile from the gathered work, decoding its code
//! once per run (shared by the processes that map it) and handing the instruction
//! level to [`super::detail`].

use std::collections::HashMap;
use std::sync::Arc;

use cpi_common::wire::EventRole;

use super::estimate::{cpi_of, role_index, Tally};
use super::resolve::{FuncKey, FunctionWork};
use super::{sample_role, Ctx, LineDetail};
use crate::binary::{Binary, BinaryError, Cfg, CodeObject, Instruction, Symbolizer};
use crate::fsafe::MAX_NAME_BYTES;
use crate::profile::error::{self, Groups};
use crate::profile::flow::check_range;
use crate::profile::model::{FunctionProfile, InstructionProfile, Measures};

/// Decoded functions by (object, start), shared by the processes of the run: each is
/// kept exactly as long as a process still has to analyse it.
#[derive(Default)]
pub(super) struct DecodeCache {
    decoded: HashMap<FuncKey, Arc<[Instruction]>>,
    /// Processes yet to analyse each function; its decoding is dropped at zero.
    users: HashMap<FuncKey, usize>,
}

impl DecodeCache {
    /// One more process will analyse the function `key`.
    pub(super) fn expect(&mut self, key: FuncKey) {
        *self.users.entry(key).or_default() += 1;
    }

    /// The instructions of `w`'s function, for one of the processes that expect it.
    fn instructions(
        &mut self,
        sym: &mut Symbolizer,
        bin: &Arc<Binary>,
        w: &FunctionWork,
    ) -> Result<Arc<[Instruction]>, BinaryError> {
        let key = w.key();
        let instructions = match self.decoded.get(&key) {
            Some(d) => Ok(d.clone()),
            None => sym.decode(bin, &w.function),
        };
        let users = self.users.entry(key.clone()).or_default();
        *users = users.saturating_sub(1);
        match (&instructions, *users) {
            (_, 0) => {
                self.decoded.remove(&key);
            }
            (Ok(d), _) => {
                self.decoded.entry(key).or_insert_with(|| d.clone());
            }
            (Err(_), _) => {}
        }
        instructions
    }
}

/// Per-function results the process totals need.
pub(super) struct FunctionOutcome {
    pub(super) profile: FunctionProfile,
    /// Cycles, cycle samples, instructions (per group of samples) and instruction samples
    /// that enter the process CPI (ELF functions analysed at instruction level).
    pub(super) cpi_inputs: Option<(Tally, f64, Groups, u64)>,
    /// Instructions in each of the function's valid ranges (binary addresses): what a
    /// call path's ranges weigh ([`Ctx::stacks`]).
    pub(super) range_lengths: Vec<(u64, u64, u64)>,
}

impl FunctionOutcome {
    /// A function without instruction counts: nothing of it enters the process CPI
    /// or weighs a call path's ranges.
    fn without_counts(profile: FunctionProfile) -> Self {
        FunctionOutcome {
            profile,
            cpi_inputs: None,
            range_lengths: Vec::new(),
        }
    }
}

impl Ctx<'_> {
    /// The profile of function `index` of the process, `w`, whose IP samples weigh
    /// `proc_weight` in all.
    pub(super) fn function(
        &mut self,
        index: usize,
        w: &FunctionWork,
        proc_weight: u64,
        names: &[(String, String)],
    ) -> FunctionOutcome {
        let mut profile = sampled_profile(w, &names[index].0, sample_role(self.mode), proc_weight);
        if let (false, LineDetail::Evidence, CodeObject::Elf(bin)) =
            (self.mode.has_cpi(), self.opts.lines, &w.object)
        {
            profile.lines = self.sampled_lines(bin, w);
            return FunctionOutcome::without_counts(profile);
        }
        // Time profiles decode too (sampled functions only): annotate shows samples per
        // instruction there, as perf annotate does.
        let Some(cfg) = self.cfg(w) else {
            // No code to walk: ranges here cannot be checked.
            self.lost.invalid_ranges += w.ranges.iter().map(|r| r.2.hits).sum::<u64>();
            return FunctionOutcome::without_counts(profile);
        };
        let d = self.detail(index, w, &cfg, names);
        if !self.mode.has_cpi() {
            // Samples per instruction only: no counts, cycles, blocks or edges exist.
            profile.lines = d.lines;
            return FunctionOutcome::without_counts(profile);
        }
        let instructions = d.instructions;
        profile.measures.instructions = Some(instructions);
        profile.measures.instructions_rel_error =
            Some(error::relative(instructions, d.instructions_var));
        profile.measures.cpi = cpi_of(
            &d.cycles,
            instructions,
            d.instructions_var,
            d.cycles.samples.min(d.instruction_samples),
            self.opts.sample_floor,
        );
        profile.timed_cpi = d.timed;
        let range_lengths = w
            .ranges
            .iter()
            .filter_map(|&(s, e, _)| {
                let (first, last) = check_range(&cfg, s, e).ok()?;
                Some((s, e, (last - first + 1) as u64))
            })
            .collect();
        profile.blocks = d.blocks;
        profile.edges = d.edges;
        profile.lines = d.lines;
        profile.flag_disagreement();
        FunctionOutcome {
            profile,
            cpi_inputs: Some((
                d.cycles,
                d.instructions,
                d.instruction_groups,
                d.instruction_samples,
            )),
            range_lengths,
        }
    }

    /// The control-flow graph of `w`'s function; `None` where there is no code to walk
    /// (not an ELF function, or its code is unreadable).
    fn cfg(&mut self, w: &FunctionWork) -> Option<Cfg> {
        match &w.object {
            CodeObject::Elf(bin) => match self.decoded.instructions(self.sym, bin, w) {
                Ok(d) => Some(Cfg::from_instructions(&w.function, d, &w.leaders)),
                Err(e) => {
                    log::warn!("{}", crate::chain(&e));
                    None
                }
            },
            _ => None,
        }
    }

    /// The lines of a time profile's sampled instructions ([`LineDetail::Evidence`]):
    /// the same lines [`LineDetail::Every`] gives those instructions, without decoding
    /// the rest of the function. A time profile has no instruction counts.
    fn sampled_lines(&mut self, bin: &Arc<Binary>, w: &FunctionWork) -> Vec<InstructionProfile> {
        let addrs: Vec<u64> = w.ips.keys().copied().collect();
        let found = match self.sym.instructions_holding(bin, &w.function, &addrs) {
            Ok(f) => f,
            Err(e) => {
                log::warn!("{}", crate::chain(&e));
                return Vec::new();
            }
        };
        let role = role_index(sample_role(self.mode));
        let mut lines: Vec<(InstructionProfile, Tally)> = Vec::new();
        for (t, ins) in w.ips.values().zip(found) {
            let Some(ins) = ins else {
                continue;
            };
            let samples = t[role].samples;
            let cycles = t[role_index(EventRole::Cycles)].clone();
            match lines.last_mut() {
                Some((l, c)) if l.address == ins.addr => {
                    l.samples += samples;
                    c.add(&cycles);
                }
                _ => lines.push((
                    InstructionProfile {
                        address: ins.addr,
                        count: 0.0,
                        samples,
                        cycles: None,
                        cpi: None,
                        text: ins.text,
                        source: None,
                    },
                    cycles,
                )),
            }
        }
        lines
            .into_iter()
            .filter(|(l, _)| l.samples > 0)
            .map(|(mut l, c)| {
                l.cycles = (c.samples > 0).then_some(c.weight as f64);
                l
            })
            .collect()
    }
}

/// `w`'s profile from its IP samples alone (role `role` counts as its samples), before
/// any instruction-level work.
fn sampled_profile(
    w: &FunctionWork,
    name: &str,
    role: EventRole,
    proc_weight: u64,
) -> FunctionProfile {
    let primary = w.total(role);
    let opt = |r: EventRole| {
        let t = w.total(r);
        (t.samples > 0).then_some(t.weight as f64)
    };
    FunctionProfile {
        name: name.to_string(),
        // A symbol over the name budget (cpi-user/src/fsafe/text.rs) is not kept: cut,
        // it names nothing BOLT could find.
        mangled: (name != w.function.name && w.function.name.len() <= MAX_NAME_BYTES)
            .then(|| w.function.name.clone()),
        binary: w.object_name.clone(),
        address: w.function.start,
        size: w.function.size,
        samples: primary.samples,
        share: if proc_weight > 0 {
            primary.weight as f64 / proc_weight as f64
        } else {
            0.0
        },
        measures: Measures {
            time_ns: opt(EventRole::CpuClock),
            cycles: opt(EventRole::Cycles),
            instructions: None,
            cycles_rel_error: opt(EventRole::Cycles)
                .map(|_| w.total(EventRole::Cycles).rel_error()),
            instructions_rel_error: None,
            cpi: None,
        },
        timed_cpi: None,
        cpi_disagree: false,
        bolt_name: match &w.object {
            CodeObject::Elf(bin) => bin.bolt_local_name(&w.function),
            _ => None,
        },
        source: None,
        blocks: Vec::new(),
        edges: Vec::new(),
        lines: Vec::new(),
    }
}
