//! The instruction, block and edge level of one decoded function: the range
//! algorithm's counts ([`crate::profile::flow`]) joined with the IP samples, and the
//! CPI of each line and block from them.

use cpi_common::wire::EventRole;

use super::estimate::{cpi_of, role_index, timed_cpi_of, Tally};
use super::resolve::FunctionWork;
use super::{sample_role, Ctx, LineDetail};
use crate::binary::{Cfg, FlowKind};
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
        let n = cfg.instructions.len();
        let ranged = self.mode.uses_ranges();
        let rc = if ranged {
            count_ranges(cfg, w.ranges.iter().map(|(s, e, r)| (*s, *e, r)))
        } else {
            RangeCounts::empty(cfg)
        };
        self.lost.invalid_ranges += rc.invalid_hits;
        let (mut count, mut hits) = (rc.instr_count.clone(), rc.instr_hits.clone());
        // Instruction counts per group of samples (ranges, or IP-sampling mode's
        // instructions samples). One range covers many instructions: a span's groups are
        // summed before its variance is taken.
        let mut count_groups = rc.instr_groups.clone();
        let span_var = |span: std::ops::Range<usize>, count_groups: &[Groups]| {
            let mut g = Groups::default();
            count_groups[span].iter().for_each(|x| g.add_scaled(x, 1.0));
            g.variance()
        };
        let mut cyc = vec![Tally::default(); n];
        let role = sample_role(self.mode);
        let mut primary = vec![0u64; n];
        for (&vaddr, t) in &w.ips {
            let Some(i) = cfg.instruction_containing(vaddr) else {
                continue;
            };
            cyc[i].add(&t[role_index(EventRole::Cycles)]);
            primary[i] += t[role_index(role)].samples;
            if !ranged {
                let ins = &t[role_index(EventRole::Instructions)];
                count[i] += ins.weight as f64;
                hits[i] += ins.samples;
                if let Some(g) = &ins.groups {
                    count_groups[i].add_scaled(g, 1.0);
                }
            }
        }

        let every = self.opts.lines == LineDetail::Every;
        let lines = cfg
            .instructions
            .iter()
            .enumerate()
            .filter(|&(i, _)| every || primary[i] > 0 || count[i] > 0.0)
            .map(|(i, ins)| InstructionProfile {
                address: ins.addr,
                count: count[i],
                samples: primary[i],
                cycles: (cyc[i].samples > 0).then_some(cyc[i].weight as f64),
                cpi: cpi_of(
                    &cyc[i],
                    count[i],
                    span_var(i..i + 1, &count_groups),
                    cyc[i].samples.min(hits[i]),
                    floor,
                ),
                text: ins.text.clone(),
                source: None,
            })
            .collect();

        let blocks = cfg
            .blocks
            .iter()
            .enumerate()
            .map(|(b, blk)| {
                let span = blk.first..blk.first + blk.len;
                let mut c = Tally::default();
                cyc[span.clone()].iter().for_each(|t| c.add(t));
                let instr: f64 = count[span.clone()].iter().sum();
                let h = hits[span.clone()].iter().copied().max().unwrap_or(0);
                BlockProfile {
                    start: blk.start,
                    end: blk.end,
                    len: blk.len as u32,
                    count: count[blk.first],
                    samples: primary[span.clone()].iter().sum(),
                    cycles: (c.samples > 0).then_some(c.weight as f64),
                    cpi: cpi_of(
                        &c,
                        instr,
                        span_var(span, &count_groups),
                        c.samples.min(h),
                        floor,
                    ),
                    // A block that ranges over several blocks covered is timed only in
                    // the executions that entered and left it by taken branches: not its
                    // CPI (docs/METHOD.md, "Two CPI estimators").
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
            })
            .collect();

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

        let mut cycles = Tally::default();
        cyc.iter().for_each(|t| cycles.add(t));
        let mut instruction_groups = Groups::default();
        count_groups
            .iter()
            .for_each(|g| instruction_groups.add_scaled(g, 1.0));
        Detail {
            instructions: count.iter().sum(),
            instructions_var: span_var(0..n, &count_groups),
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
}
