//! Merging profiles of the same kind (the agent's windows, cpi-agent/src/store.rs)
//! into one: counts are summed per process (pid, comm), function (binary, address,
//! name), block, instruction and edge; shares, CPI and error bars are recomputed from the
//! merged sums, so a merged profile renders in every view and format like any other.
//!
//! What is exact and what is bounded:
//! - samples, time, cycles, instructions, execution counts, edge counts and losses are
//!   sums, exact;
//! - a CPI value is the ratio of the merged cycles and instructions (per instruction,
//!   block, function, process) — the same ratio [`super::analyze()`] takes;
//! - the samples behind a merged CPI are the sum of the windows' own (each the scarcer
//!   of its cycle samples and instruction evidence); a unit is `None` ("below floor")
//!   when that sum is under the floor;
//! - windows are independent samples, so a merged standard error adds the windows'
//!   absolute variances: rel² = Σ (rel_w · x_w)² / (Σ x_w)², x being the unit's cycles
//!   for CPI (the delta method for Σcycles / Σinstructions) and the value itself for
//!   cycles and instructions (cpi-user/src/profile/error.rs);
//! - blocks are rebuilt from the merged instructions at every block boundary any window
//!   had (windows see different branch targets, so their blocks can differ);
//! - timed CPI (LBR `cycles`) keeps no sums in the profile: the merged value is the
//!   windows' values weighted by their samples, its error theirs weighted alike.
//!
//! - call paths are summed by their chain of (function, binary) like functions, errors
//!   and CPI recomputed as `super::paths::PathTotals` does, then bounded again
//!   (`super::paths::bound_paths`);
//!
//! Profiles of different modes cannot be merged (their numbers mean different things).

use std::collections::{BTreeMap, BTreeSet};

use cpi_common::wire::EventRole;

use super::analyze::{estimate, hottest_call_first, hottest_first};
use super::error;
use super::model::add_count;
use super::model::{
    BlockProfile, CallEdge, EdgeProfile, Estimate, EventInfo, FunctionProfile, InstructionProfile,
    LossReport, Measures, Mode, ProcessProfile, Profile, StackFrame, StackProfile,
};
use super::paths::{self, PathKey, PathTotals};
use crate::fsafe::behalf::Owner;
use crate::procmap::ProcessIdentity;

/// Why profiles could not be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// Nothing was added.
    #[error("no profiles to merge")]
    Empty,
    /// Two profiles of different [`Mode`]s, by name.
    #[error("profiles of different modes cannot be merged ({0} and {1})")]
    Modes(&'static str, &'static str),
    /// A count summed past `u64::MAX`: no real run counts that much, so some input is
    /// corrupt or forged; refused rather than printed wrapped or clamped.
    #[error("counts exceed 2^64-1 when summed: a profile or window holds impossible counts")]
    Overflow,
}

/// Merges `profiles` (see the module doc) with the analysis' default sample floor.
pub fn merge(profiles: &[Profile]) -> Result<Profile, MergeError> {
    let mut m = Merger::new(super::AnalysisOptions::default().sample_floor);
    for p in profiles {
        m.add(p)?;
    }
    m.finish()
}

/// Keeps the processes `keep` selects (`report --store --comm`) and recounts the
/// events' samples from them, so the header counts what the table shows: branch events
/// from their branch samples, cycles and `cpu-clock` from their IP samples. Instruction
/// events and losses have no per-process count in a profile: they stay the whole
/// profile's.
pub fn retain_processes(p: &mut Profile, keep: impl FnMut(&ProcessProfile) -> bool) {
    p.processes.retain(keep);
    let sum = |count: fn(&ProcessProfile) -> u64| {
        p.processes
            .iter()
            .fold(0u64, |n, x| n.saturating_add(count(x)))
    };
    let (ip, branch) = (sum(|x| x.samples), sum(|x| x.branch_samples));
    for e in &mut p.events {
        // An event whose records are IP samples counts those (its records with a branch
        // stack are among them), else a branch event its branch samples.
        if e.serves(EventRole::Cycles) || e.serves(EventRole::CpuClock) {
            e.samples = ip;
        } else if e.serves(EventRole::Branches) {
            e.samples = branch;
        }
    }
}

/// Incremental merge: add profiles one at a time (memory holds the sums, not the
/// profiles), then [`Merger::finish`].
pub struct Merger {
    floor: u64,
    base: Option<Profile>,
    duration_secs: f64,
    events: Vec<EventInfo>,
    lost: LossReport,
    binaries: BTreeMap<String, super::model::BinaryInfo>,
    processes: BTreeMap<(u32, String), ProcAcc>,
    /// A count saturated ([`MergeError::Overflow`] from [`Merger::add`]).
    overflow: bool,
}

#[derive(Default)]
struct Sum {
    value: Option<f64>,
}

impl Sum {
    fn add(&mut self, v: Option<f64>) {
        if let Some(v) = v {
            *self.value.get_or_insert(0.0) += v;
        }
    }
}

/// Σ value × samples, its variance and Σ samples of an estimate (for weighted means).
#[derive(Default, Clone, Copy)]
struct Weighted {
    num: f64,
    var: f64,
    samples: u64,
}

impl Weighted {
    fn add(&mut self, e: Option<&Estimate>, overflow: &mut bool) {
        if let Some(e) = e {
            let x = e.value * e.samples as f64;
            self.num += x;
            self.var += (e.rel_error * x).powi(2);
            add_count(&mut self.samples, e.samples, overflow);
        }
    }

    /// The samples-weighted mean, as an estimate backed by all their samples.
    fn estimate(&self, floor: u64) -> Option<Estimate> {
        let rel = error::relative(self.num, self.var);
        estimate(self.num, self.samples as f64, rel, self.samples, floor)
    }
}

/// Σ (rel_w · x_w)² and Σ x_w over windows: the relative standard error of a sum of
/// independent windows' estimates, each weighing `x`.
#[derive(Default, Clone, Copy)]
struct Spread {
    var: f64,
    weight: f64,
}

impl Spread {
    fn add(&mut self, rel: Option<f64>, x: Option<f64>) {
        if let (Some(r), Some(x)) = (rel, x) {
            self.var += (r * x).powi(2);
            self.weight += x;
        }
    }

    /// A CPI estimate's share: its rel_error weighted by the unit's cycles.
    fn add_cpi(&mut self, e: Option<&Estimate>, cycles: Option<f64>) {
        self.add(e.map(|e| e.rel_error), cycles);
    }

    fn combine(&mut self, o: &Spread) {
        self.var += o.var;
        self.weight += o.weight;
    }

    /// The merged relative standard error.
    fn rel(&self) -> f64 {
        error::relative(self.weight, self.var)
    }

    /// [`Spread::rel`] where any window had one.
    fn rel_if_any(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.rel())
    }
}

/// Sums over windows of a unit's IP samples and [`Measures`].
#[derive(Default)]
struct MeasuresAcc {
    samples: u64,
    time_ns: Sum,
    cycles: Sum,
    instructions: Sum,
    cpi_samples: u64,
    cpi_spread: Spread,
    cycles_spread: Spread,
    instructions_spread: Spread,
}

impl MeasuresAcc {
    fn add(&mut self, samples: u64, m: &Measures, overflow: &mut bool) {
        add_count(&mut self.samples, samples, overflow);
        self.time_ns.add(m.time_ns);
        self.cycles.add(m.cycles);
        self.instructions.add(m.instructions);
        add_count(&mut self.cpi_samples, cpi_samples(m.cpi.as_ref()), overflow);
        self.cpi_spread.add_cpi(m.cpi.as_ref(), m.cycles);
        self.cycles_spread.add(m.cycles_rel_error, m.cycles);
        self.instructions_spread
            .add(m.instructions_rel_error, m.instructions);
    }

    /// The summed measures, with `cpi` (made by the owner from what it kept).
    fn sums(&self, cpi: Option<Estimate>) -> Measures {
        Measures {
            time_ns: self.time_ns.value,
            cycles: self.cycles.value,
            instructions: self.instructions.value,
            cycles_rel_error: self.cycles_spread.rel_if_any(),
            instructions_rel_error: self.instructions_spread.rel_if_any(),
            cpi,
        }
    }
}

struct ProcAcc {
    base: ProcessProfile,
    m: MeasuresAcc,
    branch_samples: u64,
    functions: BTreeMap<(String, u64, String), FuncAcc>,
    /// (caller, its binary, callee, its binary) → (Σ count, Σ samples).
    calls: BTreeMap<(String, String, String, String), (f64, u64)>,
    /// Call paths by their chain of (function, binary), leaf first: the first window's
    /// frames and the sums.
    stacks: BTreeMap<PathKey, (Vec<StackFrame>, PathTotals)>,
}

struct FuncAcc {
    base: FunctionProfile,
    m: MeasuresAcc,
    timed: Weighted,
    lines: BTreeMap<u64, LineAcc>,
    /// Every window's blocks: (start, end) → (Σ CPI samples, CPI spread, timed CPI).
    blocks: BTreeMap<(u64, u64), (u64, Spread, Weighted)>,
    edges: BTreeMap<(u64, u64, u8), EdgeProfile>,
}

struct LineAcc {
    base: InstructionProfile,
    count: f64,
    samples: u64,
    cycles: Sum,
    cpi_samples: u64,
    cpi_spread: Spread,
}

fn cpi_samples(e: Option<&Estimate>) -> u64 {
    e.map_or(0, |e| e.samples)
}

impl Merger {
    /// `floor`: units with fewer samples behind their CPI get `None`, as in analysis.
    pub fn new(floor: u64) -> Self {
        Merger {
            overflow: false,
            floor,
            base: None,
            duration_secs: 0.0,
            events: Vec::new(),
            lost: LossReport::default(),
            binaries: BTreeMap::new(),
            processes: BTreeMap::new(),
        }
    }

    /// No profile added so far.
    pub fn is_empty(&self) -> bool {
        self.base.is_none()
    }

    /// Adds `p`'s counts to the sums; refused when its mode differs from the first's.
    pub fn add(&mut self, p: &Profile) -> Result<(), MergeError> {
        if let Some(b) = &self.base {
            if b.mode != p.mode {
                return Err(MergeError::Modes(b.mode.name(), p.mode.name()));
            }
        } else {
            let mut base = p.clone();
            base.processes.clear();
            base.binaries.clear();
            base.events.clear();
            self.base = Some(base);
        }
        self.duration_secs += p.duration_secs;
        for e in &p.events {
            match self
                .events
                .iter_mut()
                .find(|m| m.role == e.role && m.name == e.name)
            {
                // The latest period (the governor may have changed it); samples summed.
                Some(m) => {
                    add_count(&mut m.samples, e.samples, &mut self.overflow);
                    m.period = e.period;
                    m.jitter = m.jitter.max(e.jitter);
                }
                None => self.events.push(e.clone()),
            }
        }
        self.lost.add_checked(&p.lost, &mut self.overflow);
        for b in &p.binaries {
            self.binaries
                .entry(b.path.clone())
                .and_modify(|known| known.owner = Owner::both(known.owner, b.owner))
                .or_insert_with(|| b.clone());
        }
        for proc in &p.processes {
            self.add_process(proc);
        }
        if self.overflow {
            return Err(MergeError::Overflow);
        }
        Ok(())
    }

    fn add_process(&mut self, p: &ProcessProfile) {
        let acc = self
            .processes
            .entry((p.pid, p.comm.clone()))
            .or_insert_with(|| ProcAcc {
                base: ProcessProfile {
                    functions: Vec::new(),
                    calls: Vec::new(),
                    stacks: Vec::new(),
                    ..p.clone()
                },
                m: MeasuresAcc::default(),
                branch_samples: 0,
                functions: BTreeMap::new(),
                calls: BTreeMap::new(),
                stacks: BTreeMap::new(),
            });
        // Who the process is was read once, when first seen; a window that missed it
        // (the process gone by then) takes it from another.
        if acc.base.identity == ProcessIdentity::default() {
            acc.base.identity.clone_from(&p.identity);
        }
        for s in &p.stacks {
            acc.stacks
                .entry(paths::frames_key(&s.frames))
                .or_insert_with(|| (s.frames.clone(), PathTotals::default()))
                .1
                .add(s);
        }
        for c in &p.calls {
            let e = acc
                .calls
                .entry((
                    c.caller.clone(),
                    c.caller_binary.clone(),
                    c.callee.clone(),
                    c.callee_binary.clone(),
                ))
                .or_default();
            e.0 += c.count;
            add_count(&mut e.1, c.samples, &mut self.overflow);
        }
        acc.m.add(p.samples, &p.measures, &mut self.overflow);
        add_count(
            &mut acc.branch_samples,
            p.branch_samples,
            &mut self.overflow,
        );
        for f in &p.functions {
            let fa = acc
                .functions
                .entry((f.binary.clone(), f.address, f.name.clone()))
                .or_insert_with(|| FuncAcc {
                    base: FunctionProfile {
                        blocks: Vec::new(),
                        edges: Vec::new(),
                        lines: Vec::new(),
                        ..f.clone()
                    },
                    m: MeasuresAcc::default(),
                    timed: Weighted::default(),
                    lines: BTreeMap::new(),
                    blocks: BTreeMap::new(),
                    edges: BTreeMap::new(),
                });
            fa.add(f, &mut self.overflow);
        }
    }

    /// The merged profile.
    pub fn finish(self) -> Result<Profile, MergeError> {
        let base = self.base.ok_or(MergeError::Empty)?;
        let mode = base.mode;
        let floor = self.floor;
        let processes = self
            .processes
            .into_values()
            .map(|p| p.finish(mode, floor))
            .collect();
        let mut merged = Profile {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            duration_secs: self.duration_secs,
            events: self.events,
            lost_samples: self.lost.lost(),
            lost: self.lost,
            binaries: self.binaries.into_values().collect(),
            processes,
            // Accuracy belongs to one simulated run, not to a merge of windows.
            accuracy: None,
            ..base
        };
        // Sums of relative counts are relative too: what one withheld the merge does.
        if let Some(why) = merged.cpi_withheld.take() {
            merged.without_cpi(why);
        }
        Ok(merged)
    }
}

impl FuncAcc {
    fn add(&mut self, f: &FunctionProfile, overflow: &mut bool) {
        self.m.add(f.samples, &f.measures, overflow);
        self.timed.add(f.timed_cpi.as_ref(), overflow);
        for l in &f.lines {
            let la = self.lines.entry(l.address).or_insert_with(|| LineAcc {
                base: l.clone(),
                count: 0.0,
                samples: 0,
                cycles: Sum::default(),
                cpi_samples: 0,
                cpi_spread: Spread::default(),
            });
            la.count += l.count;
            add_count(&mut la.samples, l.samples, overflow);
            la.cycles.add(l.cycles);
            add_count(&mut la.cpi_samples, cpi_samples(l.cpi.as_ref()), overflow);
            la.cpi_spread.add_cpi(l.cpi.as_ref(), l.cycles);
        }
        for b in &f.blocks {
            let e = self.blocks.entry((b.start, b.end)).or_default();
            add_count(&mut e.0, cpi_samples(b.cpi.as_ref()), overflow);
            e.1.add_cpi(b.cpi.as_ref(), b.cycles);
            e.2.add(b.timed_cpi.as_ref(), overflow);
        }
        for e in &f.edges {
            self.edges
                .entry((e.from, e.to, e.kind as u8))
                .and_modify(|m| {
                    m.count += e.count;
                    m.mispredicts += e.mispredicts;
                })
                .or_insert_with(|| e.clone());
        }
    }

    fn finish(self, floor: u64) -> FunctionProfile {
        let lines: Vec<InstructionProfile> =
            self.lines
                .into_values()
                .map(|l| InstructionProfile {
                    count: l.count,
                    samples: l.samples,
                    cycles: l.cycles.value,
                    cpi: l.cycles.value.and_then(|c| {
                        estimate(c, l.count, l.cpi_spread.rel(), l.cpi_samples, floor)
                    }),
                    ..l.base
                })
                .collect();
        let blocks = rebuild_blocks(&self.blocks, &lines, floor);
        // Analysis takes a function's CPI over its decoded instructions.
        let (cycles_on_lines, instr_on_lines) = lines.iter().fold((None, 0.0), |(c, n), l| {
            (
                match (c, l.cycles) {
                    (None, None) => None,
                    (c, l) => Some(c.unwrap_or(0.0) + l.unwrap_or(0.0)),
                },
                n + l.count,
            )
        });
        let (cpi_cycles, cpi_instr) = if instr_on_lines > 0.0 {
            (cycles_on_lines, instr_on_lines)
        } else {
            (
                self.m.cycles.value,
                self.m.instructions.value.unwrap_or(0.0),
            )
        };
        let cpi = cpi_cycles.and_then(|c| {
            estimate(
                c,
                cpi_instr,
                self.m.cpi_spread.rel(),
                self.m.cpi_samples,
                floor,
            )
        });
        let mut merged = FunctionProfile {
            samples: self.m.samples,
            measures: self.m.sums(cpi),
            timed_cpi: self.timed.estimate(floor),
            cpi_disagree: false,
            blocks,
            edges: self.edges.into_values().collect(),
            lines,
            ..self.base
        };
        merged.flag_disagreement();
        merged
    }
}

/// Blocks of the merged instructions, cut at every boundary any window's blocks had.
fn rebuild_blocks(
    windows: &BTreeMap<(u64, u64), (u64, Spread, Weighted)>,
    lines: &[InstructionProfile],
    floor: u64,
) -> Vec<BlockProfile> {
    let cuts: BTreeSet<u64> = windows.keys().flat_map(|&(s, e)| [s, e]).collect();
    let mut out = Vec::new();
    for &(start, end) in windows.keys() {
        let mut pieces: Vec<u64> = cuts.range(start..end).copied().collect();
        pieces.push(end);
        for w in pieces.windows(2) {
            let (a, b) = (w[0], w[1]);
            if out
                .iter()
                .any(|x: &BlockProfile| x.start == a && x.end == b)
            {
                continue;
            }
            let in_piece: Vec<&InstructionProfile> = lines
                .iter()
                .filter(|l| (a..b).contains(&l.address))
                .collect();
            if in_piece.is_empty() {
                continue;
            }
            // Every window block covering this piece: its CPI samples, CPI error and
            // timed CPI (a piece of a window's block takes that block's relative error).
            let mut samples_behind: u64 = 0;
            let mut spread = Spread::default();
            let mut timed = Weighted::default();
            for (_, (s, sp, t)) in windows.iter().filter(|((s, e), _)| *s <= a && b <= *e) {
                samples_behind = samples_behind.saturating_add(*s);
                spread.combine(sp);
                timed.num += t.num;
                timed.var += t.var;
                timed.samples = timed.samples.saturating_add(t.samples);
            }
            let cycles = in_piece
                .iter()
                .filter_map(|l| l.cycles)
                .fold(None, |acc: Option<f64>, c| Some(acc.unwrap_or(0.0) + c));
            let instr: f64 = in_piece.iter().map(|l| l.count).sum();
            let cycle_samples: u64 = in_piece.iter().map(|l| l.samples).sum();
            out.push(BlockProfile {
                start: a,
                end: b,
                len: in_piece.len() as u32,
                count: in_piece[0].count,
                samples: cycle_samples,
                cycles,
                cpi: cycles.and_then(|c| {
                    estimate(
                        c,
                        instr,
                        spread.rel(),
                        samples_behind.min(cycle_samples),
                        floor,
                    )
                }),
                timed_cpi: timed.estimate(floor),
                cpi_disagree: false,
            });
        }
    }
    out.sort_by_key(|b| (b.start, b.end));
    out
}

impl ProcAcc {
    fn finish(self, mode: Mode, floor: u64) -> ProcessProfile {
        let mut functions: Vec<FunctionProfile> = self
            .functions
            .into_values()
            .map(|f| f.finish(floor))
            .collect();
        // Shares of the merged weight: cycles where there is a PMU, else time.
        let weight = |cycles: Option<f64>, time: Option<f64>| match mode {
            Mode::TimeProfile => time.unwrap_or(0.0),
            _ => cycles.unwrap_or(0.0),
        };
        let total = weight(self.m.cycles.value, self.m.time_ns.value);
        for f in &mut functions {
            f.share = if total > 0.0 {
                weight(f.measures.cycles, f.measures.time_ns) / total
            } else {
                0.0
            };
        }
        functions.sort_by(hottest_first);
        let cpi = match mode {
            Mode::TimeProfile => None,
            Mode::IpSampling => self.m.cycles.value.and_then(|c| {
                estimate(
                    c,
                    self.m.instructions.value.unwrap_or(0.0),
                    self.m.cpi_spread.rel(),
                    self.m.cpi_samples,
                    floor,
                )
            }),
            // As analysis: over the functions analysed at instruction level.
            Mode::Cpi | Mode::Simulated | Mode::Instructions => {
                let (c, n) = functions
                    .iter()
                    .filter_map(|f| {
                        Some((f.measures.cycles.unwrap_or(0.0), f.measures.instructions?))
                    })
                    .fold((0.0, 0.0), |(c, n), (fc, fi)| (c + fc, n + fi));
                estimate(c, n, self.m.cpi_spread.rel(), self.m.cpi_samples, floor)
            }
        };
        ProcessProfile {
            samples: self.m.samples,
            branch_samples: self.branch_samples,
            measures: self.m.sums(cpi),
            functions,
            calls: {
                let mut calls: Vec<CallEdge> = self
                    .calls
                    .into_iter()
                    .map(
                        |((caller, caller_binary, callee, callee_binary), (count, samples))| {
                            CallEdge {
                                caller,
                                caller_binary,
                                callee,
                                callee_binary,
                                count,
                                samples,
                            }
                        },
                    )
                    .collect();
                calls.sort_by(hottest_call_first);
                calls
            },
            stacks: {
                let mut stacks: Vec<StackProfile> = self
                    .stacks
                    .into_values()
                    .map(|(frames, t)| t.into_path(frames, floor))
                    .collect();
                paths::bound_paths(&mut stacks, floor);
                stacks
            },
            ..self.base
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::{BinaryInfo, EdgeKind, PROFILE_FORMAT_VERSION};

    fn est(value: f64, samples: u64) -> Option<Estimate> {
        Some(Estimate {
            value,
            rel_error: 1.0 / (samples as f64).sqrt(),
            samples,
        })
    }

    fn line(address: u64, count: f64, samples: u64, cycles: f64, cpi_s: u64) -> InstructionProfile {
        InstructionProfile {
            address,
            count,
            samples,
            cycles: Some(cycles),
            // As analysis: below the floor (20) no CPI.
            cpi: if cpi_s >= 20 {
                est(cycles / count, cpi_s)
            } else {
                None
            },
            text: format!("insn at {address:#x}"),
            source: None,
        }
    }

    /// A CPI-mode window: one process, one function with two instructions at 0x10 and
    /// 0x14, one block [0x10, 0x18) (or two, split at 0x14), one taken edge.
    fn window(scale: f64, split: bool) -> Profile {
        let lines = vec![
            line(0x10, 100.0 * scale, 10, 300.0 * scale, 10),
            line(0x14, 100.0 * scale, 30, 500.0 * scale, 30),
        ];
        let blocks = if split {
            vec![
                BlockProfile {
                    start: 0x10,
                    end: 0x14,
                    len: 1,
                    count: 100.0 * scale,
                    samples: 10,
                    cycles: Some(300.0 * scale),
                    cpi: est(3.0, 10),
                    timed_cpi: None,
                    cpi_disagree: false,
                },
                BlockProfile {
                    start: 0x14,
                    end: 0x18,
                    len: 1,
                    count: 100.0 * scale,
                    samples: 30,
                    cycles: Some(500.0 * scale),
                    cpi: est(5.0, 30),
                    timed_cpi: None,
                    cpi_disagree: false,
                },
            ]
        } else {
            vec![BlockProfile {
                start: 0x10,
                end: 0x18,
                len: 2,
                count: 100.0 * scale,
                samples: 40,
                cycles: Some(800.0 * scale),
                cpi: est(4.0, 40),
                timed_cpi: None,
                cpi_disagree: false,
            }]
        };
        let f = FunctionProfile {
            name: "hot".into(),
            mangled: None,
            binary: "/bin/x".into(),
            address: 0x10,
            size: 8,
            samples: 40,
            share: 0.8,
            measures: Measures {
                time_ns: None,
                cycles: Some(800.0 * scale),
                instructions: Some(200.0 * scale),
                cycles_rel_error: Some(0.1),
                instructions_rel_error: None,
                cpi: est(4.0, 40),
            },
            timed_cpi: None,
            cpi_disagree: false,
            bolt_name: None,
            source: None,
            blocks,
            edges: vec![EdgeProfile {
                from: 0x14,
                to: 0x10,
                kind: EdgeKind::Taken,
                count: 99.0 * scale,
                mispredicts: 1.0,
                to_function: None,
                to_binary: None,
            }],
            lines,
        };
        let cold = FunctionProfile {
            name: "cold".into(),
            address: 0x40,
            samples: 10,
            share: 0.2,
            measures: Measures {
                cycles: Some(200.0 * scale),
                instructions: None,
                cpi: None,
                ..f.measures
            },
            blocks: vec![],
            edges: vec![],
            lines: vec![],
            ..f.clone()
        };
        Profile {
            format_version: PROFILE_FORMAT_VERSION,
            tool_version: "0".into(),
            mode: Mode::Cpi,
            mode_reason: "test".into(),
            command: vec![],
            duration_secs: 10.0,
            events: vec![EventInfo {
                role: cpi_common::wire::EventRole::Cycles,
                name: "cycles".into(),
                period: 1009,
                jitter: 0,
                thinning: 1,
                unit: crate::profile::model::EventUnit::Events,
                samples: 50,
                also: Vec::new(),
            }],
            perturbation: cpi_common::policy::Perturbation::User,
            range_window: 31,
            lost_samples: 1,
            lost: LossReport {
                ring_full: 1,
                unmapped_samples: 1,
                ..Default::default()
            },
            binaries: vec![BinaryInfo {
                path: "/bin/x".into(),
                build_id: None,
                deleted: false,
                stripped: false,
                owner: None,
            }],
            processes: vec![ProcessProfile {
                pid: 7,
                comm: "x".into(),
                identity: Default::default(),
                samples: 50,
                branch_samples: 20,
                measures: Measures {
                    time_ns: None,
                    cycles: Some(1000.0 * scale),
                    instructions: Some(200.0 * scale),
                    cycles_rel_error: None,
                    instructions_rel_error: None,
                    cpi: est(4.0, 40),
                },
                functions: vec![f, cold],
                calls: vec![],
                stacks: vec![],
            }],
            accuracy: None,
            recorded_on: None,
            cpi_withheld: None,
            unread: Vec::new(),
        }
    }

    #[test]
    fn call_paths_merge_by_their_frame_chain() {
        use crate::profile::paths::tests::path;
        let (mut a, mut b) = (window(1.0, false), window(3.0, false));
        a.processes[0].stacks = vec![
            path(&["hot", "main"], 30, 1200.0, 300.0),
            path(&["cold", "main"], 10, 100.0, 100.0),
        ];
        let mut moved = path(&["hot", "main"], 50, 2000.0, 500.0);
        moved.frames[0].address = 0x1234;
        b.processes[0].stacks = vec![moved];
        let m = merge(&[a, b]).unwrap();
        let s = &m.processes[0].stacks;
        assert_eq!(s.len(), 2);
        assert_eq!(paths::key(&s[0]), [("hot", "/bin/p"), ("main", "/bin/p")]);
        assert_eq!(
            (s[0].samples, s[0].cycles, s[0].instructions),
            (80, Some(3200.0), Some(800.0))
        );
        assert_eq!(s[0].frames[0].address, 0x1000, "the first window's frames");
        let cpi = s[0].cpi.unwrap();
        assert_eq!((cpi.value, cpi.samples), (4.0, 80));
        // Variances add: cycles (120² + 200²), instructions (30² + 50²), rel 0.1 each.
        let want = (120f64.hypot(200.0) / 3200.0).hypot(30f64.hypot(50.0) / 800.0);
        assert!((cpi.rel_error - want).abs() < 1e-12);
        assert_eq!(s[1].samples, 10);
    }

    #[test]
    fn sums_and_recomputes_from_the_sums() {
        let m = merge(&[window(1.0, false), window(3.0, false)]).unwrap();
        assert_eq!(m.duration_secs, 20.0);
        assert_eq!(m.events[0].samples, 100);
        assert_eq!((m.lost.ring_full, m.lost_samples), (2, 2));
        assert_eq!(m.binaries.len(), 1);
        let p = &m.processes[0];
        assert_eq!((p.samples, p.branch_samples), (100, 40));
        assert_eq!(p.measures.cycles, Some(4000.0));
        let f = &p.functions[0];
        assert_eq!(f.name, "hot", "hottest first");
        assert_eq!(
            (f.samples, f.measures.cycles, f.measures.instructions),
            (80, Some(3200.0), Some(800.0))
        );
        let cpi = f.measures.cpi.unwrap();
        assert_eq!((cpi.value, cpi.samples), (4.0, 80));
        // Independent windows: absolute variances add, each window's CPI error weighed
        // by its cycles (800 and 2400 of 3200), likewise the cycles' own error.
        let merged = |rel: f64| rel * 800f64.hypot(2400.0) / 3200.0;
        assert!((cpi.rel_error - merged(1.0 / 40f64.sqrt())).abs() < 1e-12);
        assert!((f.measures.cycles_rel_error.unwrap() - merged(0.1)).abs() < 1e-12);
        assert_eq!(
            f.measures.instructions_rel_error, None,
            "no window had one (older files)"
        );
        assert!((f.share - 3200.0 / 4000.0).abs() < 1e-12);
        assert_eq!(p.functions[1].name, "cold");
        assert!((p.functions[1].share - 0.2).abs() < 1e-12);
        // Process CPI over the functions with instructions, samples summed.
        assert_eq!(p.measures.cpi.unwrap().value, 4.0);
        assert_eq!(p.measures.cpi.unwrap().samples, 80);
        let l = &f.lines[1];
        assert_eq!((l.count, l.samples, l.cycles), (400.0, 60, Some(2000.0)));
        assert_eq!(l.cpi.unwrap().value, 5.0);
        assert_eq!(l.text, "insn at 0x14");
        assert_eq!(f.edges.len(), 1);
        assert_eq!((f.edges[0].count, f.edges[0].mispredicts), (396.0, 2.0));
        assert_eq!(f.blocks.len(), 1);
        let b = &f.blocks[0];
        assert_eq!((b.count, b.len, b.cycles), (400.0, 2, Some(3200.0)));
        assert_eq!(b.cpi.unwrap().value, 4.0);
    }

    #[test]
    fn blocks_are_cut_where_any_window_cut_them() {
        let m = merge(&[window(1.0, false), window(1.0, true)]).unwrap();
        let f = &m.processes[0].functions[0];
        let spans: Vec<(u64, u64)> = f.blocks.iter().map(|b| (b.start, b.end)).collect();
        assert_eq!(spans, [(0x10, 0x14), (0x14, 0x18)]);
        assert_eq!(f.blocks[0].count, 200.0);
        assert_eq!(f.blocks[0].cpi.unwrap().value, 3.0);
        assert_eq!(f.blocks[1].cpi.unwrap().value, 5.0);
    }

    #[test]
    fn below_floor_stays_below_floor_and_modes_must_agree() {
        let mut m = Merger::new(100);
        m.add(&window(1.0, false)).unwrap();
        let p = m.finish().unwrap();
        assert!(
            p.processes[0].functions[0].measures.cpi.is_none(),
            "40 samples < 100"
        );
        let mut tp = window(1.0, false);
        tp.mode = Mode::TimeProfile;
        let mut m = Merger::new(20);
        m.add(&window(1.0, false)).unwrap();
        assert!(matches!(
            m.add(&tp),
            Err(MergeError::Modes("cpi", "time-profile"))
        ));
        assert!(matches!(Merger::new(1).finish(), Err(MergeError::Empty)));
    }

    /// Hostile input: two windows edited to hold 2^64-1 samples are refused, not summed to a
    /// wrapped count.
    #[test]
    fn counts_past_u64_max_are_an_error_not_a_wrap() {
        let mut p = window(1.0, false);
        p.processes[0].samples = u64::MAX;
        p.lost.ring_full = 1;
        let mut m = Merger::new(1);
        m.add(&p).unwrap();
        assert!(matches!(m.add(&p), Err(MergeError::Overflow)));
        let mut q = p.clone();
        q.processes[0].samples = 1;
        q.lost.ring_full = u64::MAX;
        assert!(matches!(merge(&[q.clone(), q]), Err(MergeError::Overflow)));
    }

    #[test]
    fn one_profile_merges_to_itself() {
        let w = window(1.0, false);
        let mut m = merge(std::slice::from_ref(&w)).unwrap();
        m.tool_version = w.tool_version.clone();
        assert_eq!(m, w);
    }
}
