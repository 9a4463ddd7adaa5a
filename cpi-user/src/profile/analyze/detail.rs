//! The instruction, block and edge level of one decoded function: the range
//! algorithm's counts ([`crate::profile::flow`]) joined with the IP samples, and the
//! CPI of each line and block from them.

use std::ops::Range;

use cpi_common::wire::EventRole;

use super::estimate::{cpi_of, role_index, timed_cpi_of, Tally};
use super::resolve::FunctionWork;
use super::{sample_role, Ctx, LineDetail};
use crate::binary::{BasicBlock, Cfg, FlowKind, Instruction};
use crate::profile::error::Groups;
use crate::profile::flow::{count_ranges, RangeCounts};
use crate::profile::model::{BlockProfile, EdgeKind, EdgeProfile, Estimate, InstructionProfile};

pub(super) struct Detail {
    pub(super) instructions: f64,
    /// The variance of `instructions` (cpi-user/src/profile/error.rs).
    pub(super) instructions_var: f64,
    /// `instructions` per group of branch samples (ranged modes).
    pub(super) instruction_groups: Groups,
    /// Range occurrences (or instruction samples) behind `instructions`.
    pub(super) instruction_samples: u64,
    /// Cycles on decoded instructions.
    pub(super) cycles: Tally,
    pub(super) timed: Option<Estimate>,
    pub(super) blocks: Vec<BlockProfile>,
    pub(super) edges: Vec<EdgeProfile>,
    pub(super) lines: Vec<InstructionProfile>,
}

/// What is known of each instruction of a decoded function (indexed as
/// `Cfg::instructions`), from which its line and its block's profile are made.
struct PerInstruction {
    /// Executions: from the ranges, or IP-sampling mode's instructions samples.
    count: Vec<f64>,
    /// Range occurrences (or instruction samples) behind `count`.
    hits: Vec<u64>,
    /// `count` per group of samples.
    count_groups: Vec<Groups>,
    /// Cycle samples on the instruction.
    cycles: Vec<Tally>,
    /// Samples of the process's sample role.
    samples: Vec<u64>,
}

impl PerInstruction {
    /// The range counts `rc` joined with `w`'s IP samples; without ranges, instructions
    /// samples give the counts.
    fn new(cfg: &Cfg, rc: &RangeCounts, w: &FunctionWork, role: EventRole, ranged: bool) -> Self {
        let n = cfg.instructions.len();
        let mut p = PerInstruction {
            count: rc.instr_count.clone(),
            hits: rc.instr_hits.clone(),
            count_groups: rc.instr_groups.clone(),
            cycles: vec![Tally::default(); n],
            samples: vec![0u64; n],
        };
        for (&vaddr, t) in &w.ips {
            let Some(i) = cfg.instruction_containing(vaddr) else {
                continue;
            };
            p.cycles[i].add(&t[role_index(EventRole::Cycles)]);
            p.samples[i] += t[role_index(role)].samples;
            if !ranged {
                let ins = &t[role_index(EventRole::Instructions)];
                p.count[i] += ins.weight as f64;
                p.hits[i] += ins.samples;
                if let Some(g) = &ins.groups {
                    p.count_groups[i].add_scaled(g, 1.0);
                }
            }
        }
        p
    }

    /// The variance of the count of `span`. One range covers many instructions: a
    /// span's groups are summed before its variance is taken.
    fn span_var(&self, span: Range<usize>) -> f64 {
        let mut g = Groups::default();
        self.count_groups[span]
            .iter()
            .for_each(|x| g.add_scaled(x, 1.0));
        g.variance()
    }

    /// The line of instruction `i`.
    fn line(&self, i: usize, ins: &Instruction, floor: u64) -> InstructionProfile {
        let cyc = &self.cycles[i];
        InstructionProfile {
            address: ins.addr,
            count: self.count[i],
            samples: self.samples[i],
            cycles: (cyc.samples > 0).then_some(cyc.weight as f64),
            cpi: cpi_of(
                cyc,
                self.count[i],
                self.span_var(i..i + 1),
                cyc.samples.min(self.hits[i]),
                floor,
            ),
            text: ins.text.clone(),
            source: None,
        }
    }

    /// The profile of block `b`.
    fn block(&self, b: usize, blk: &BasicBlock, rc: &RangeCounts, floor: u64) -> BlockProfile {
        let span = blk.first..blk.first + blk.len;
        let mut c = Tally::default();
        self.cycles[span.clone()].iter().for_each(|t| c.add(t));
        let instr: f64 = self.count[span.clone()].iter().sum();
        let h = self.hits[span.clone()].iter().copied().max().unwrap_or(0);
        BlockProfile {
            start: blk.start,
            end: blk.end,
            len: blk.len as u32,
            count: self.count[blk.first],
            samples: self.samples[span.clone()].iter().sum(),
            cycles: (c.samples > 0).then_some(c.weight as f64),
            cpi: cpi_of(&c, instr, self.span_var(span), c.samples.min(h), floor),
            // A block that ranges over several blocks covered is timed only in the
            // executions that entered and left it by taken branches: not its CPI
            // (docs/METHOD.md, "Two CPI estimators").
            timed_cpi: timed_cpi_of(
                (rc.block_timed_cycles[b], &rc.block_timed_cycles_groups[b]),
                (
                    rc.block_timed_instructions[b],
                    &rc.block_timed_instructions_groups[b],
                ),
                rc.block_timed_samples[b],
                floor,
            )
            .filter(|_| !rc.block_shared[b]),
            cpi_disagree: false,
        }
    }
}

impl Ctx<'_> {
    /// Instruction/block/edge level of one function.
    pub(super) fn detail(
        &mut self,
        index: usize,
        w: &FunctionWork,
        cfg: &Cfg,
        names: &[(String, String)],
    ) -> Detail {
        let floor = self.opts.sample_floor;
        let ranged = self.mode.uses_ranges();
        let rc = if ranged {
            count_ranges(cfg, w.ranges.iter().map(|(s, e, r)| (*s, *e, r)))
        } else {
            RangeCounts::empty(cfg)
        };
        self.lost.invalid_ranges += rc.invalid_hits;
        let per = PerInstruction::new(cfg, &rc, w, sample_role(self.mode), ranged);
        let every = self.opts.lines == LineDetail::Every;
        let lines = cfg
            .instructions
            .iter()
            .enumerate()
            .filter(|&(i, _)| every || per.samples[i] > 0 || per.count[i] > 0.0)
            .map(|(i, ins)| per.line(i, ins, floor))
            .collect();
        let blocks = cfg
            .blocks
            .iter()
            .enumerate()
            .map(|(b, blk)| per.block(b, blk, &rc, floor))
            .collect();
        let edges = self.edges(index, w, cfg, &rc, names);
        let mut cycles = Tally::default();
        per.cycles.iter().for_each(|t| cycles.add(t));
        let mut instruction_groups = Groups::default();
        per.count_groups
            .iter()
            .for_each(|g| instruction_groups.add_scaled(g, 1.0));
        Detail {
            instructions: per.count.iter().sum(),
            instructions_var: per.span_var(0..cfg.instructions.len()),
            instruction_groups,
            instruction_samples: if ranged {
                rc.valid_hits
            } else {
                w.total(EventRole::Instructions).samples
            },
            cycles,
            timed: timed_cpi_of(
                (rc.timed_cycles, &rc.timed_cycles_groups),
                (rc.timed_instructions, &rc.timed_instructions_groups),
                rc.timed_samples,
                floor,
            ),
            blocks,
            edges,
            lines,
        }
    }

    /// The function's taken edges (those whose source is a call also go to the
    /// process's calls) and fall-through edges, in address order.
    fn edges(
        &mut self,
        index: usize,
        w: &FunctionWork,
        cfg: &Cfg,
        rc: &RangeCounts,
        names: &[(String, String)],
    ) -> Vec<EdgeProfile> {
        let mut edges: Vec<EdgeProfile> = w
            .taken
            .iter()
            .map(|t| {
                let src_kind = cfg.instruction_at(t.from).map(|i| cfg.instructions[i].kind);
                let leaves = matches!(
                    src_kind,
                    Some(FlowKind::Call | FlowKind::IndirectCall | FlowKind::Return)
                );
                // Calls-only call graph: the taken records whose source is a call.
                if let (Some(FlowKind::Call | FlowKind::IndirectCall), Some((ti, _))) =
                    (src_kind, t.to)
                {
                    let c = self.calls.entry((index, ti)).or_default();
                    c.0 += t.stat.count;
                    c.1 += t.stat.hits;
                }
                let (to, to_function, to_binary) = match t.to {
                    Some((ti, vto)) if ti == index && !leaves => (vto, None, None),
                    Some((ti, vto)) => (vto, Some(names[ti].0.clone()), Some(names[ti].1.clone())),
                    None => (0, Some("[unknown]".into()), Some("[unknown]".into())),
                };
                EdgeProfile {
                    from: t.from,
                    to,
                    kind: EdgeKind::Taken,
                    count: t.stat.count,
                    mispredicts: t.stat.mispredicts,
                    to_function,
                    to_binary,
                }
            })
            .collect();
        edges.extend(rc.fall_through.iter().map(|(&(a, b), &c)| EdgeProfile {
            from: cfg.instructions[cfg.blocks[a].last()].addr,
            to: cfg.blocks[b].start,
            kind: EdgeKind::FallThrough,
            count: c,
            mispredicts: 0.0,
            to_function: None,
            to_binary: None,
        }));
        edges.sort_by_key(|e| (e.from, e.to, e.kind as u8));
        edges
    }
}
