//! Analysis: a [`SampleSet`] (runtime addresses, per process) → a [`Profile`] (binary
//! addresses, per process, function, block, edge and instruction).
//!
//! 1. Every sampled address is symbolised to a function (once per address).
//! 2. IP samples: per instruction and event role, samples and Σ periods. `cpu-clock`
//!    periods are time (ns), `cycles` periods are cycles, `instructions` periods are
//!    instructions (IP-sampling mode only).
//! 3. Branch records (CPI and simulated modes): each taken edge belongs to the function
//!    of its source; its target, and every range start, becomes a block leader of its
//!    function. A range that starts and ends in different functions of one binary ran
//!    off the end of each into the next (code that ends without a jump, as libc's
//!    assembly does): it is cut into one piece per function, each counted in its own
//!    function, when every piece checks (`resolve`); otherwise it is invalid.
//! 4. Functions with any sample are disassembled ([`crate::binary::Cfg`], once per run
//!    and function, blocks per process) and the range algorithm (`super::flow`)
//!    gives instruction, block and fall-through counts.
//! 5. CPI = cycles / instructions per process, function, block and instruction, with
//!    `samples` = the scarcer of cycle samples and range occurrences (instruction
//!    samples in IP-sampling mode) and rel_error one standard error
//!    (`super::error`); `None` below the floor.
//!    Timed CPI (LBR `cycles`) is the second estimator per function and block.
//!
//! Process-level CPI covers the ELF functions analysed (user code): kernel and JIT
//! cycles have no instruction counts (branch records are user-only by default) and
//! are left out of it, though they stay in the process's `cycles`.
//!
//! Call paths (`StackProfile`, from the samples' stacks): frames are symbolised like
//! samples, return addresses at `addr - 1` (the call), kernel frames to kernel symbols
//! (or `[kernel]`), addresses in no mapping to `[unknown]`; stacks whose frames name the
//! same functions are one path. A path's samples, time and cycles are those of the IP
//! samples taken under it. Its instructions come from the branch samples taken under
//! its stacks: each range of such a sample's window (weighted as the process's) is
//! given to a path by the function it ran in —
//! - the leaf frame's function: the stack's own path;
//! - otherwise the function of a caller frame (the nearest to the leaf): that frame's
//!   path, the stack with the frames below it removed (the caller ran before it
//!   called down, within the window);
//! - otherwise (a function not on the stack): the stack with that function added as its
//!   leaf (a callee of the leaf that returned within the window; when the callee was
//!   itself called by a callee that returned, this names the wrong caller);
//! - a piece of a range over several functions whose function is not on the stack,
//!   when another piece's is: that frame's path with this function in its place (the
//!   code ran into it within the same call);
//! - ranges the process drops as invalid are dropped here too (in
//!   `lost.invalid_ranges`).
//!
//! Paths are then ordered and bounded, the narrowest folded into `[rare callees]` paths
//! under their callers (`super::paths::fold_plan`).
//!
//! Nothing is dropped silently: unsymbolisable IP samples go to
//! `lost.unmapped_samples`, invalid range occurrences to `lost.invalid_ranges`.
//!
//! The rooms, in the order a sample passes them: `resolve` symbolises a process's
//! addresses into per-function work; `function` analyses one function (decoding it
//! once per run) and `detail` its instructions, blocks and edges; `process` sums a
//! process's functions into its totals; `call_paths` sums its stacks into paths.
//! `estimate` holds the CPI estimators and `order` the orderings merging shares.
//! This file is the driver: the options, and one pass over the processes.

use std::collections::BTreeMap;

use cpi_common::wire::EventRole;

use super::aggregate::SampleSet;
use super::model::{BinaryInfo, LossReport, Mode, Profile, RunInfo, PROFILE_FORMAT_VERSION};
use crate::binary::{Symbolizer, SymbolizerOptions};
use crate::procmap::ProcessMaps;
use crate::progress::{self, Unit};

mod call_paths;
mod detail;
mod estimate;
mod function;
mod order;
mod process;
mod resolve;

pub(super) use estimate::estimate;
pub(super) use order::{hottest_call_first, hottest_first};

use function::DecodeCache;
use resolve::ProcessResolver;

/// How analysis runs.
#[derive(Clone, Debug)]
pub struct AnalysisOptions {
    /// Units (functions, blocks, instructions) with fewer samples than this behind their
    /// CPI get `cpi: None` ("below floor") instead of a number.
    pub sample_floor: u64,
    /// How runtime addresses are mapped to files and symbols.
    pub symbolizer: SymbolizerOptions,
    /// Which instructions get a line.
    pub lines: LineDetail,
    /// Look up each line's source file and line in the binary's DWARF. The always-on
    /// agent leaves it off by default: parsing the line tables of every new binary with
    /// debug information took 2.5× its CPU (BENCHMARKS.md, "Agent CPU: source lines").
    pub source_lines: bool,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            sample_floor: 20,
            symbolizer: SymbolizerOptions::default(),
            lines: LineDetail::Every,
            source_lines: true,
        }
    }
}

/// Which instructions of an analysed function get a line (`FunctionProfile::lines`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineDetail {
    /// Every instruction of the function (what `--annotate` shows).
    Every,
    /// Only instructions with samples or counts: what the always-on agent keeps
    /// (cpi-agent/src/lib.rs). A time profile then decodes its sampled instructions
    /// only, so a window costs what its samples do, not what the sizes of the functions
    /// they hit do.
    Evidence,
}

/// Analyses every process of `set`.
pub fn analyze(set: &SampleSet, run: RunInfo, opts: &AnalysisOptions) -> Profile {
    analyze_with(
        set,
        run,
        opts,
        &mut Symbolizer::new(opts.symbolizer.clone()),
    )
}

/// [`analyze`] with a caller-owned symbolizer, whose binary cache outlives the call (the
/// always-on agent's windows, cpi-agent/src/lib.rs).
pub fn analyze_with(
    set: &SampleSet,
    run: RunInfo,
    opts: &AnalysisOptions,
    sym: &mut Symbolizer,
) -> Profile {
    for p in set.processes.values() {
        sym.add_captured(p.pid, &p.files);
    }
    let mut ctx = Ctx {
        mode: run.mode,
        opts,
        sym,
        lost: run.lost.clone(),
        binaries: BTreeMap::new(),
        decoded: DecodeCache::default(),
        calls: BTreeMap::new(),
        analysed: 0,
        analysing: None,
    };
    // Symbolise everything first, so each decoded function is kept exactly as long as
    // a process still needs it.
    let empty = ProcessMaps::default();
    let symbolising = progress::stage(
        "symbolising",
        Some(set.processes.len() as u64),
        Unit::Count("processes"),
    );
    let gathered: Vec<ProcessResolver<'_>> = set
        .processes
        .values()
        .enumerate()
        .map(|(i, p)| {
            symbolising.update(i as u64);
            ctx.gather(p, p.maps.as_ref().unwrap_or(&empty))
        })
        .collect();
    drop(symbolising);
    let mut functions = 0;
    for res in &gathered {
        for w in res.funcs.iter().filter(|w| w.has_evidence()) {
            ctx.decoded.expect(w.key());
            functions += 1;
        }
    }
    ctx.analysing = Some(progress::stage(
        "analysing",
        Some(functions),
        Unit::Count("functions"),
    ));
    let processes = set
        .processes
        .values()
        .zip(gathered)
        .map(|(p, res)| ctx.finish(p, res))
        .collect();
    ctx.analysing = None;
    ctx.sym.log_unusable();
    let Ctx { lost, binaries, .. } = ctx;
    Profile {
        format_version: PROFILE_FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: run.mode,
        mode_reason: run.mode_reason,
        command: run.command,
        duration_secs: run.duration_secs,
        events: run.events,
        perturbation: run.perturbation,
        range_window: set.window as u32,
        lost_samples: lost.lost(),
        lost,
        binaries: binaries.into_values().collect(),
        processes,
        accuracy: None,
        recorded_on: None,
        cpi_withheld: None,
        unread: Vec::new(),
    }
}

/// The role whose IP samples are the process's "samples": cycles where there is a PMU,
/// cpu-clock in a time profile.
fn sample_role(mode: Mode) -> EventRole {
    match mode {
        Mode::TimeProfile => EventRole::CpuClock,
        Mode::Cpi | Mode::IpSampling | Mode::Simulated | Mode::Instructions => EventRole::Cycles,
    }
}

struct Ctx<'a> {
    mode: Mode,
    opts: &'a AnalysisOptions,
    sym: &'a mut Symbolizer,
    lost: LossReport,
    binaries: BTreeMap<String, BinaryInfo>,
    decoded: DecodeCache,
    /// The current process's call records: (caller, callee) function indices.
    calls: BTreeMap<(usize, usize), (f64, u64)>,
    /// Functions analysed so far, and the stage they are shown in on a terminal.
    analysed: u64,
    analysing: Option<progress::Stage>,
}

/// A hash map's entries in key order (analysis is deterministic).
fn sorted<'m, K: Ord, V>(m: impl IntoIterator<Item = (&'m K, &'m V)>) -> Vec<(&'m K, &'m V)> {
    let mut v: Vec<(&K, &V)> = m.into_iter().collect();
    v.sort_unstable_by(|a, b| a.0.cmp(b.0));
    v
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod range_tests;

#[cfg(test)]
mod bench;
