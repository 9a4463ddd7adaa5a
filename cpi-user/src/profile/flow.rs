//! The range algorithm on one function's CFG.
//!
//! A range [start, end] is straight-line code between two consecutive taken branches
//! (the older one's target, the newer one's source, both inclusive), already weighted
//! Q/k by aggregation. A valid range adds its weight to every instruction in it and to
//! every fall-through edge it crosses, not-taken conditionals included.
//!
//! A range is **invalid** (dropped, counted in `lost.invalid_ranges`) when:
//! - start or end is not an instruction boundary of the function's linear disassembly
//!   (this includes ranges that leave the function: the caller checks both ends are in
//!   the same function first);
//! - end < start (running backwards);
//! - an instruction before the last one always transfers control: jmp, indirect jmp,
//!   call, indirect call, ret, or a trap. In particular a call is a taken branch, so a
//!   valid range contains a call only as its last instruction; the code after the call
//!   starts the next range when the callee returns. Conditional branches (not taken)
//!   and `syscall` (returns to the next instruction) may be crossed.
//!
//! The last instruction may be anything: a taken branch normally, any instruction when
//! the record's source was an interrupt or signal.
//!
//! A range that runs off the end of one function into the next (assembly and libc
//! have code that ends without a jump: the next function's first instruction simply
//! follows) is cut into one piece per function by the analysis
//! (`analyze/resolve.rs`); each piece but the last ends at its function's last
//! instruction, which must fall through ([`check_span`] with `falls_out`).

use std::collections::HashMap;

use crate::binary::{Cfg, Instruction};

use super::aggregate::RangeStat;
use super::error::Groups;

/// Why a range was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InvalidRange {
    /// An end is not an instruction start of this function.
    NotInstructionBoundary,
    /// Ends before it starts.
    Backwards,
    /// Crosses an unconditional transfer at this address.
    CrossesTransfer(u64),
}

/// Instruction index span `first..=last` of a range, or why it is invalid.
pub(crate) fn check_range(cfg: &Cfg, start: u64, end: u64) -> Result<(usize, usize), InvalidRange> {
    check_span(&cfg.instructions, start, end, false)
}

/// [`check_range`] over one function's `instructions` (sorted by address). With
/// `falls_out`, execution went on past `end` into the code after it without a taken
/// branch, so `end`'s instruction must fall through as well.
pub(crate) fn check_span(
    instructions: &[Instruction],
    start: u64,
    end: u64,
    falls_out: bool,
) -> Result<(usize, usize), InvalidRange> {
    if end < start {
        return Err(InvalidRange::Backwards);
    }
    let at = |a: u64| {
        instructions
            .binary_search_by_key(&a, |i| i.addr)
            .map_err(|_| InvalidRange::NotInstructionBoundary)
    };
    let (first, last) = (at(start)?, at(end)?);
    let crossed = if falls_out { last + 1 } else { last };
    if let Some(i) = instructions[first..crossed]
        .iter()
        .find(|i| i.kind.always_transfers())
    {
        return Err(InvalidRange::CrossesTransfer(i.addr));
    }
    Ok((first, last))
}

/// Counts from ranges on one function.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RangeCounts {
    /// Estimated executions per instruction.
    pub instr_count: Vec<f64>,
    /// Range occurrences covering each instruction.
    pub instr_hits: Vec<u64>,
    /// `instr_count` per group of samples (`profile/error.rs`).
    pub instr_groups: Vec<Groups>,
    /// (from block, to block) → estimated fall-through traversals.
    pub fall_through: HashMap<(usize, usize), f64>,
    /// Occurrences of valid ranges.
    pub valid_hits: u64,
    /// Occurrences of invalid ranges.
    pub invalid_hits: u64,
    /// Timed LBR, per block: cycles of the timed ranges inside the block.
    pub block_timed_cycles: Vec<f64>,
    /// Timed LBR, per block: instructions of those ranges.
    pub block_timed_instructions: Vec<f64>,
    /// Timed LBR, per block: the most samples that timed one of those ranges.
    pub block_timed_samples: Vec<u64>,
    /// Blocks that a range over several blocks covered: executions the LBR cannot time
    /// alone, so they have no timed CPI.
    pub block_shared: Vec<bool>,
    /// `block_timed_cycles` per group of samples.
    pub block_timed_cycles_groups: Vec<Groups>,
    /// `block_timed_instructions` per group of samples.
    pub block_timed_instructions_groups: Vec<Groups>,
    /// Timed LBR for the whole function: cycles of every timed occurrence.
    pub timed_cycles: f64,
    /// Instructions those timed occurrences covered.
    pub timed_instructions: f64,
    /// Samples behind the timed cycles, at least: the most that timed any one range
    /// (a window timing several ranges of the function is one sample).
    pub timed_samples: u64,
    /// `timed_cycles` per group of samples.
    pub timed_cycles_groups: Groups,
    /// `timed_instructions` per group of samples.
    pub timed_instructions_groups: Groups,
}

impl RangeCounts {
    /// Zero counts for `cfg` (no range applied).
    pub fn empty(cfg: &Cfg) -> Self {
        let (n, nb) = (cfg.instructions.len(), cfg.blocks.len());
        RangeCounts {
            instr_count: vec![0.0; n],
            instr_hits: vec![0; n],
            instr_groups: vec![Groups::default(); n],
            block_timed_cycles: vec![0.0; nb],
            block_timed_instructions: vec![0.0; nb],
            block_timed_samples: vec![0; nb],
            block_shared: vec![false; nb],
            block_timed_cycles_groups: vec![Groups::default(); nb],
            block_timed_instructions_groups: vec![Groups::default(); nb],
            ..Default::default()
        }
    }
}

/// Applies every range to `cfg`. Timed cycles of a range are measured per occurrence
/// (LBR `cycles` of the branch ending it covers exactly the range); a block's timed
/// cycles come from the ranges inside it, and only when no range covers it with others
/// (docs/METHOD.md, "Two CPI estimators").
pub(crate) fn count_ranges<'a>(
    cfg: &Cfg,
    ranges: impl IntoIterator<Item = (u64, u64, &'a RangeStat)>,
) -> RangeCounts {
    let mut c = RangeCounts::empty(cfg);
    for (start, end, r) in ranges {
        let (first, last) = match check_range(cfg, start, end) {
            Ok(span) => span,
            Err(why) => {
                log::trace!(
                    "{}: range {start:#x}..={end:#x} invalid: {why:?}",
                    cfg.function.name
                );
                c.invalid_hits += r.hits;
                continue;
            }
        };
        c.valid_hits += r.hits;
        for i in first..=last {
            c.instr_count[i] += r.count;
            c.instr_hits[i] += r.hits;
            c.instr_groups[i].add_scaled(&r.count_groups, 1.0);
            if i < last && cfg.block_of[i] != cfg.block_of[i + 1] {
                *c.fall_through
                    .entry((cfg.block_of[i], cfg.block_of[i + 1]))
                    .or_default() += r.count;
            }
        }
        let b = cfg.block_of[first];
        if b != cfg.block_of[last] {
            (cfg.block_of[first]..=cfg.block_of[last]).for_each(|b| c.block_shared[b] = true);
        }
        if r.timed_hits > 0 {
            let len = (last - first + 1) as f64;
            c.timed_cycles += r.timed_cycles;
            c.timed_instructions += r.timed_count * len;
            c.timed_samples = c.timed_samples.max(r.timed_samples);
            c.timed_cycles_groups
                .add_scaled(&r.timed_cycles_groups, 1.0);
            c.timed_instructions_groups
                .add_scaled(&r.timed_count_groups, len);
            // A block's timed CPI comes only from ranges inside it: the cycles of a
            // range over several blocks cannot be split between them (apportioning by
            // instructions put 3.7 % of sim_mix's block timed CPIs within ±1).
            if b == cfg.block_of[last] {
                c.block_timed_cycles[b] += r.timed_cycles;
                c.block_timed_instructions[b] += r.timed_count * len;
                c.block_timed_samples[b] = c.block_timed_samples[b].max(r.timed_samples);
                c.block_timed_cycles_groups[b].add_scaled(&r.timed_cycles_groups, 1.0);
                c.block_timed_instructions_groups[b].add_scaled(&r.timed_count_groups, len);
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::Function;

    /// 0x1000 xor eax,eax; 0x1002 add eax,edi; 0x1004 dec edi; 0x1006 jne 0x1002;
    /// 0x1008 call 0x2000; 0x100d ret.
    fn loop_cfg() -> Cfg {
        let code = [
            0x31, 0xc0, 0x01, 0xf8, 0xff, 0xcf, 0x75, 0xfa, 0xe8, 0xf3, 0x0f, 0x00, 0x00, 0xc3,
        ];
        let f = Function {
            name: "f".into(),
            start: 0x1000,
            size: code.len() as u64,
        };
        Cfg::build(&f, &code, &[])
    }

    /// A range counted `count` times over `hits` occurrences, all timed, with
    /// `timed_cycles` cycles in all.
    fn stat(count: f64, hits: u64, timed_cycles: f64, timed_hits: u64) -> RangeStat {
        RangeStat {
            count,
            hits,
            timed_cycles,
            timed_count: count,
            timed_hits,
            timed_samples: timed_hits,
            ..Default::default()
        }
    }

    #[test]
    fn loop_counts_exact() {
        // Entry → 3 iterations → call. Branch trace: (call into f at 0x1000), jne taken
        // twice, then call at 0x1008. Ranges: [0x1000,0x1006], [0x1002,0x1006] ×2 (the
        // loop's taken jne), and the exit: [0x1002, 0x1008] (jne not taken, then call).
        let cfg = loop_cfg();
        let a = stat(1.0, 1, 0.0, 0);
        let b = stat(1.0, 1, 0.0, 0);
        let d = stat(1.0, 1, 0.0, 0);
        let ranges = [
            (0x1000, 0x1006, &a),
            (0x1002, 0x1006, &b),
            (0x1002, 0x1008, &d),
        ];
        let c = count_ranges(&cfg, ranges);
        // xor, add, dec, jne, call, ret
        assert_eq!(c.instr_count, [1.0, 3.0, 3.0, 3.0, 1.0, 0.0]);
        assert_eq!(c.valid_hits, 3);
        // Blocks: [xor] [add dec jne] [call] [ret].
        assert_eq!(cfg.blocks.len(), 4);
        assert_eq!(c.fall_through[&(0, 1)], 1.0, "entry into the loop");
        assert_eq!(c.fall_through[&(1, 2)], 1.0, "jne not taken once");
        assert_eq!(c.fall_through.len(), 2);
    }

    #[test]
    fn invalid_ranges_are_dropped_and_counted() {
        let cfg = loop_cfg();
        let s = stat(5.0, 2, 0.0, 0);
        assert_eq!(
            check_range(&cfg, 0x1001, 0x1006),
            Err(InvalidRange::NotInstructionBoundary)
        );
        assert_eq!(
            check_range(&cfg, 0x1006, 0x1002),
            Err(InvalidRange::Backwards)
        );
        assert_eq!(
            check_range(&cfg, 0x1000, 0x100d),
            Err(InvalidRange::CrossesTransfer(0x1008)),
            "a call inside a range: the callee's branches would have ended it"
        );
        assert_eq!(check_range(&cfg, 0x1008, 0x1008), Ok((4, 4)));
        assert_eq!(
            check_range(&cfg, 0x1000, 0x2000),
            Err(InvalidRange::NotInstructionBoundary)
        );
        let c = count_ranges(&cfg, [(0x1000, 0x100d, &s), (0x1003, 0x1006, &s)]);
        assert_eq!(c.invalid_hits, 4);
        assert_eq!(c.valid_hits, 0);
        assert!(c.instr_count.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn timed_cycles_reach_a_block_only_from_ranges_inside_it() {
        let cfg = loop_cfg();
        // [xor | add dec jne]: 4 instructions over two blocks, 2 occurrences in 2
        // samples, 40 cycles in all; [add dec jne]: the loop block alone, 2 occurrences
        // in one sample, 30 cycles; [call] alone, 3 occurrences in 3 samples, 9 cycles.
        let across = stat(2.0, 2, 40.0, 2);
        let inside = RangeStat {
            timed_samples: 1,
            ..stat(2.0, 2, 30.0, 2)
        };
        let call = stat(3.0, 3, 9.0, 3);
        let c = count_ranges(
            &cfg,
            [
                (0x1000, 0x1006, &across),
                (0x1002, 0x1006, &inside),
                (0x1008, 0x1008, &call),
            ],
        );
        assert_eq!(
            (c.timed_cycles, c.timed_instructions, c.timed_samples),
            (79.0, 17.0, 3)
        );
        // The first block is never a whole range: no timed cycles are guessed for it.
        assert_eq!(c.block_timed_cycles[..3], [0.0, 30.0, 9.0]);
        assert_eq!(c.block_timed_instructions[..3], [0.0, 6.0, 3.0]);
        assert_eq!(c.block_timed_samples[..3], [0, 1, 3]);
        // The loop block also ran inside `across`, untimed alone: it gets no timed CPI;
        // the call block ran only as a range of its own.
        assert_eq!(c.block_shared[..3], [true, true, false]);
    }
}
