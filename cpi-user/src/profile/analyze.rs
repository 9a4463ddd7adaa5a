//! Analysis: a [`SampleSet`] (runtime addresses, per process) → a [`Profile`] (binary
//! addresses, per process, function, block, edge and instruction).
//!
//! 1. Every sampled address is symbolised to a function (once per address).
//! 2. IP samples: per instruction and event role, samples and Σ periods. `cpu-clock`
//!    periods are time (ns), `cycles` periods are cycles, `instructions` periods are
//!    instructions (IP-sampling mode only).
//! 3. Branch records (CPI and simulated modes): each taken edge belongs to the function
//!    of its source; its target, and every range start, becomes a block leader of its
//!    function. Each range must start and end in the same ELF function; otherwise it
//!    is invalid.
//! 4. Functions with any sample are disassembled ([`crate::binary::Cfg`], once per run
//!    and function, blocks per process) and the range algorithm ([`super::flow`])
//!    gives instruction, block and fall-through counts.
//! 5. CPI = cycles / instructions per process, function, block and instruction, with
//!    `samples` = the scarcer of cycle samples and range occurrences (instruction
//!    samples in IP-sampling mode) and rel_error one standard error
//!    ([`super::error`]); `None` below the floor.
//!    Timed CPI (LBR `cycles`) is the second estimator per function and block.
//!
//! Process-level CPI covers the ELF functions analysed (user code): kernel and JIT
//! cycles have no instruction counts (branch records are user-only by default) and
//! are left out of it, though they stay in the process's `cycles`.
//!
//! Call paths ([`StackProfile`], from the samples' stacks): frames are symbolised like
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
//! - ranges the process drops as invalid are dropped here too (in
//!   `lost.invalid_ranges`).
//!
//! Paths are then ordered and bounded ([`super::paths`]).
//!
//! Nothing is dropped silently: unsymbolisable IP samples go to
//! `lost.unmapped_samples`, invalid range occurrences to `lost.invalid_ranges`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cpi_common::wire::EventRole;

use super::aggregate::{ProcessSamples, RangeStat, SampleSet, TakenStat};
use super::error::{self, Groups};
use super::flow::{check_range, count_ranges, RangeCounts};
use super::model::{
    BinaryInfo, BlockProfile, CallEdge, EdgeKind, EdgeProfile, Estimate, FunctionProfile,
    InstructionProfile, LossReport, Mode, ProcessProfile, Profile, RunInfo, StackFrame,
    StackProfile, PROFILE_FORMAT_VERSION,
};
use super::paths::{bound_paths, pseudo_path, DROPPED_FRAME, MAX_PATHS, NO_STACK_FRAME};
use super::stack::{CallStack, StackEnd, StackStat};
use crate::binary::{
    Binary, Cfg, CodeObject, FlowKind, Function, Instruction, Resolved, SourceLines, Symbolizer,
    SymbolizerOptions,
};
use crate::procmap::ProcessMaps;
use crate::progress::{self, Unit};

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
    /// (cpi-user/src/agent/mod.rs). A time profile then decodes its sampled instructions
    /// only, so a window costs what its samples do, not what the sizes of the functions
    /// they hit do.
    Evidence,
}

/// IP-sample tallies of one role: (samples, Σ periods, Σ periods per group).
#[derive(Clone, Debug, Default, PartialEq)]
struct Tally {
    samples: u64,
    weight: u64,
    /// `weight` per group of samples (cpi-user/src/profile/error.rs); none for
    /// `cpu-clock` (aggregate.rs keeps none).
    groups: Option<Box<Groups>>,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.add_parts(o.samples, o.weight, o.groups.as_deref());
    }

    fn add_parts(&mut self, samples: u64, weight: u64, groups: Option<&Groups>) {
        self.samples += samples;
        self.weight += weight;
        if let Some(g) = groups {
            self.groups.get_or_insert_default().add_scaled(g, 1.0);
        }
    }

    /// The variance of `weight`.
    fn variance(&self) -> f64 {
        self.groups.as_ref().map_or(0.0, |g| g.variance())
    }

    /// One standard error of `weight`, relative to it.
    fn rel_error(&self) -> f64 {
        error::relative(self.weight as f64, self.variance())
    }
}

const ROLES: usize = 4;

fn role_index(r: EventRole) -> usize {
    r as usize
}

/// A taken branch leaving a function: where it goes, if known.
struct TakenWork {
    from: u64,
    /// (function index, address in its binary).
    to: Option<(usize, u64)>,
    stat: TakenStat,
}

/// What was gathered for one function of one process.
struct FunctionWork {
    object: CodeObject,
    object_name: String,
    function: Function,
    /// The function's name as people read it (demangled once: profile functions, calls,
    /// edges and stack frames all use it).
    name: String,
    /// vaddr → tallies per role.
    ips: BTreeMap<u64, [Tally; ROLES]>,
    /// (start, end) in binary addresses.
    ranges: Vec<(u64, u64, RangeStat)>,
    taken: Vec<TakenWork>,
    /// Branch-record targets inside this function.
    leaders: Vec<u64>,
}

impl FunctionWork {
    fn key(&self) -> FuncKey {
        (self.object_name.clone(), self.function.start)
    }

    /// Anything of its own to report (not just a branch target seen at a window edge).
    fn has_evidence(&self) -> bool {
        !(self.ips.is_empty() && self.ranges.is_empty() && self.taken.is_empty())
    }

    fn total(&self, role: EventRole) -> Tally {
        let mut t = Tally::default();
        for v in self.ips.values() {
            t.add(&v[role_index(role)]);
        }
        t
    }
}

/// Key of a function within a process: (object name, start address).
type FuncKey = (String, u64);

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
/// always-on agent's windows, cpi-user/src/agent/mod.rs).
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
        decoded: HashMap::new(),
        users: HashMap::new(),
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
            *ctx.users.entry(w.key()).or_default() += 1;
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

/// The order of a process's functions: most cycles first, then most samples (a time
/// profile has no cycles), then name, binary and address so equal ones sort the same
/// on every run. Merging (`profile/merge.rs`) orders by it too.
pub(super) fn hottest_first(a: &FunctionProfile, b: &FunctionProfile) -> std::cmp::Ordering {
    b.cycles
        .unwrap_or(0.0)
        .total_cmp(&a.cycles.unwrap_or(0.0))
        .then(b.samples.cmp(&a.samples))
        .then(a.name.cmp(&b.name))
        .then(a.binary.cmp(&b.binary))
        .then(a.address.cmp(&b.address))
}

/// The order of a process's call edges: most calls first, then by caller and callee
/// (names, then binaries) so equal ones sort the same on every run. Merging orders by
/// it too.
pub(super) fn hottest_call_first(a: &CallEdge, b: &CallEdge) -> std::cmp::Ordering {
    b.count
        .total_cmp(&a.count)
        .then_with(|| (&a.caller, &a.callee).cmp(&(&b.caller, &b.callee)))
        .then_with(|| {
            (&a.caller_binary, &a.callee_binary).cmp(&(&b.caller_binary, &b.callee_binary))
        })
}

/// CPI = cycles / instructions with its relative standard error `rel_error`
/// (cpi-user/src/profile/error.rs); `None` below the floor or without instructions. The
/// one CPI estimate: merging (`profile/merge.rs`) uses it too.
pub(super) fn estimate(
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
fn cpi_of(
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
fn timed_cpi_of(
    (cycles, cycles_groups): (f64, &Groups),
    (instructions, instructions_groups): (f64, &Groups),
    samples: u64,
    floor: u64,
) -> Option<Estimate> {
    let rel = error::ratio(cycles_groups, instructions_groups);
    estimate(cycles, instructions, rel, samples, floor).filter(|_| rel > error::RESOLUTION)
}

/// Symbolises one process's addresses once each and collects the functions they hit.
struct ProcessResolver<'a> {
    pid: u32,
    maps: &'a ProcessMaps,
    cache: HashMap<u64, Option<(usize, u64)>>,
    index: HashMap<FuncKey, usize>,
    funcs: Vec<FunctionWork>,
}

impl<'a> ProcessResolver<'a> {
    /// (function index, address in the binary) of a runtime address.
    fn resolve(
        &mut self,
        sym: &mut Symbolizer,
        binaries: &mut BTreeMap<String, BinaryInfo>,
        addr: u64,
    ) -> Option<(usize, u64)> {
        if let Some(&r) = self.cache.get(&addr) {
            return r;
        }
        let r = match sym.resolve(self.pid, self.maps, addr) {
            Ok(r) => {
                note_binary(binaries, &r);
                let key = (r.object_name.clone(), r.function.start);
                let vaddr = r.vaddr;
                let i = *self.index.entry(key).or_insert_with(|| {
                    self.funcs.push(FunctionWork {
                        name: sym.display_name(&r),
                        object: r.object,
                        object_name: r.object_name,
                        function: r.function,
                        ips: BTreeMap::new(),
                        ranges: Vec::new(),
                        taken: Vec::new(),
                        leaders: Vec::new(),
                    });
                    self.funcs.len() - 1
                });
                Some((i, vaddr))
            }
            Err(e) => {
                log::debug!("{e}");
                None
            }
        };
        self.cache.insert(addr, r);
        r
    }
}

struct Ctx<'a> {
    mode: Mode,
    opts: &'a AnalysisOptions,
    sym: &'a mut Symbolizer,
    lost: LossReport,
    binaries: BTreeMap<String, BinaryInfo>,
    /// Decoded functions by (object, start), shared by the processes of the run.
    decoded: HashMap<FuncKey, Arc<[Instruction]>>,
    /// Processes yet to analyse each function; its decoding is dropped at zero.
    users: HashMap<FuncKey, usize>,
    /// The current process's call records: (caller, callee) function indices.
    calls: BTreeMap<(usize, usize), (f64, u64)>,
    /// Functions analysed so far, and the stage they are shown in on a terminal.
    analysed: u64,
    analysing: Option<progress::Stage>,
}

/// Per-function results the process totals need.
struct FunctionOutcome {
    profile: FunctionProfile,
    /// Cycles, cycle samples, instructions (per group of samples) and instruction samples
    /// that enter the process CPI (ELF functions analysed at instruction level).
    cpi_inputs: Option<(Tally, f64, Groups, u64)>,
    /// Instructions in each of the function's valid ranges (binary addresses): what a
    /// call path's ranges weigh ([`Ctx::stacks`]).
    range_lengths: Vec<(u64, u64, u64)>,
}

impl Ctx<'_> {
    /// Symbolises one process's samples into per-function work.
    fn gather<'m>(&mut self, p: &ProcessSamples, maps: &'m ProcessMaps) -> ProcessResolver<'m> {
        self.lost.short_samples += p.branches.short_samples;
        self.lost.invalid_ranges += p.branches.backward_ranges;
        let mut res = ProcessResolver {
            pid: p.pid,
            maps,
            cache: HashMap::new(),
            index: HashMap::new(),
            funcs: Vec::new(),
        };
        for (&role, agg) in &p.ips {
            // Sorted: the aggregate's hash order must not change float sums between
            // two analyses of the same samples.
            for (&ip, (samples, weight, groups)) in sorted(&agg.by_ip) {
                match res.resolve(self.sym, &mut self.binaries, ip) {
                    Some((i, vaddr)) => res.funcs[i].ips.entry(vaddr).or_default()
                        [role_index(role)]
                    .add_parts(*samples, *weight, groups.as_deref()),
                    None => self.lost.unmapped_samples += samples,
                }
            }
        }
        if self.mode.uses_ranges() {
            self.gather_branches(p, &mut res);
        }
        res
    }

    /// The process's profile from its gathered work.
    fn finish(&mut self, p: &ProcessSamples, mut res: ProcessResolver<'_>) -> ProcessProfile {
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

    /// The process's call paths (see "Call paths" in the module doc).
    fn stacks(
        &mut self,
        p: &ProcessSamples,
        res: &mut ProcessResolver<'_>,
        lens: &HashMap<(usize, u64, u64), u64>,
    ) -> Vec<StackProfile> {
        let agg = &p.stacks;
        if agg.stacks.is_empty() && agg.dropped.samples() == 0 {
            return Vec::new();
        }
        let role = sample_role(self.mode);
        let ranged = self.mode.uses_ranges();
        // Paths are summed and ranked by compact frames (a function's index, an
        // address); names are written out only for the paths the profile keeps: deep
        // stacks named frame by frame cost ~20× their addresses (seen: +60 MiB for a
        // moment in an agent sampling rustc).
        let mut names = FrameNames::default();
        let mut paths: BTreeMap<Vec<u32>, PathAcc> = BTreeMap::new();
        let mut entries: Vec<(&CallStack, &StackStat)> = agg.stacks.iter().collect();
        entries.sort_unstable_by(|a, b| {
            (&a.0.kernel, &a.0.user, a.0.end as u8).cmp(&(&b.0.kernel, &b.0.user, b.0.end as u8))
        });
        let mut stacked = PathAcc::default();
        // Every stack's own path first, so a path keeps the frames (addresses) of a
        // stack that ran it rather than of a callee path a range implied.
        let mut symbolised = Vec::with_capacity(entries.len());
        for (stack, stat) in entries {
            let frames = self.frames(stack, res);
            stacked.add_ips(stat, role);
            let acc = path_acc(&mut paths, &mut names, res, &frames, stack.end);
            acc.add_ips(stat, role);
            acc.branch_samples += stat.branch_samples;
            symbolised.push((stack.end, stat, frames));
        }
        for (end_of_stack, stat, frames) in symbolised {
            if !ranged {
                break;
            }
            for (&(start, end), r) in sorted(&stat.ranges) {
                let s = res.resolve(self.sym, &mut self.binaries, start);
                let e = res.resolve(self.sym, &mut self.binaries, end);
                // Ranges the process drops (counted in `lost.invalid_ranges`) are
                // dropped here too.
                let (Some((fs, vs)), Some((fe, ve))) = (s, e) else {
                    continue;
                };
                let Some(&n) = lens.get(&(fs, vs, ve)).filter(|_| fs == fe) else {
                    continue;
                };
                let target = match frames.iter().position(|f| f.func == Some(fs)) {
                    // The leaf's function, or a caller's: that frame's path.
                    Some(k) => frames[k..].to_vec(),
                    // A function not on the stack: a callee of the leaf that returned
                    // within the window.
                    None => {
                        let mut v = vec![FrameRef {
                            func: Some(fs),
                            address: res.funcs[fs].function.start,
                        }];
                        v.extend(frames.iter().copied());
                        v
                    }
                };
                let acc = path_acc(&mut paths, &mut names, res, &target, end_of_stack);
                acc.instructions += r.count * n as f64;
                acc.instruction_groups.add_scaled(&r.groups, n as f64);
                acc.range_hits += r.hits;
            }
        }
        // What no stack holds: evicted stacks, and samples without a stack (the
        // process's IP samples less those under stacks, kept or evicted).
        let mut dropped = PathAcc::default();
        dropped.add_ips(&agg.dropped, role);
        dropped.branch_samples = agg.dropped.branch_samples;
        // The hottest paths keep their names (room left for `[dropped]` and
        // `[no stack]`); the rest join `[dropped]`.
        let mut ranked: Vec<PathAcc> = paths.into_values().collect();
        ranked.sort_by(|a, b| {
            b.weight()
                .total_cmp(&a.weight())
                .then(b.samples.cmp(&a.samples))
        });
        for extra in ranked.split_off(ranked.len().min(MAX_PATHS - 2)) {
            dropped.absorb(extra);
        }
        let floor = self.opts.sample_floor;
        let mut out: Vec<StackProfile> = ranked
            .into_iter()
            .map(|a| {
                let frames = a.frames.iter().map(|f| f.named(res)).collect();
                a.into_path(frames, ranged, floor)
            })
            .collect();
        let mut no_stack = PathAcc::default();
        for (&r, a) in &p.ips {
            let (n, w) = stacked.ips.get(&r).copied().unwrap_or_default();
            let (dn, dw) = agg.dropped.ips.get(&r).copied().unwrap_or_default();
            let mut one = StackStat::default();
            one.ips.insert(
                r,
                (
                    a.samples.saturating_sub(n + dn),
                    a.weight.saturating_sub(w + dw),
                ),
            );
            no_stack.add_ips(&one, role);
        }
        // `unstacked` counts samples of both kinds.
        let ip_unstacked: u64 = no_stack.ips.values().map(|v| v.0).sum();
        no_stack.branch_samples = agg.unstacked.saturating_sub(ip_unstacked);
        for (name, mut a) in [(DROPPED_FRAME, dropped), (NO_STACK_FRAME, no_stack)] {
            if a.samples + a.branch_samples > 0 {
                a.end = StackEnd::Truncated;
                out.push(a.into_path(pseudo_path(name).frames, ranged, floor));
            }
        }
        bound_paths(&mut out, floor);
        out
    }

    /// The frames of `stack`, leaf first (kernel, then user): each one's function (index
    /// into `res.funcs`) and address in its binary; `None` and the runtime address where
    /// an address maps to nothing.
    fn frames(&mut self, stack: &CallStack, res: &mut ProcessResolver<'_>) -> Vec<FrameRef> {
        let user = stack.user.iter().enumerate().map(|(i, &a)| (a, i > 0));
        let all = stack.kernel.iter().map(|&a| (a, false)).chain(user);
        all.map(|(addr, is_return)| {
            // A return address follows its call: look the call up.
            let at = if is_return {
                addr.saturating_sub(1)
            } else {
                addr
            };
            match res.resolve(self.sym, &mut self.binaries, at) {
                Some((i, vaddr)) => FrameRef {
                    func: Some(i),
                    address: vaddr + u64::from(is_return),
                },
                None => FrameRef {
                    func: None,
                    address: addr,
                },
            }
        })
        .collect()
    }

    /// Attaches taken edges and ranges to functions; ranges that do not start and end
    /// in one function are invalid.
    fn gather_branches(&mut self, p: &ProcessSamples, res: &mut ProcessResolver<'_>) {
        for (&(from, to), stat) in sorted(&p.branches.taken) {
            let src = res.resolve(self.sym, &mut self.binaries, from);
            let dst = res.resolve(self.sym, &mut self.binaries, to);
            if let Some((ti, vto)) = dst {
                res.funcs[ti].leaders.push(vto);
            }
            if let Some((fi, vfrom)) = src {
                res.funcs[fi].taken.push(TakenWork {
                    from: vfrom,
                    to: dst,
                    stat: *stat,
                });
            }
        }
        for (&(start, end), stat) in sorted(&p.branches.ranges) {
            let s = res.resolve(self.sym, &mut self.binaries, start);
            let e = res.resolve(self.sym, &mut self.binaries, end);
            match (s, e) {
                (Some((fs, vs)), Some((fe, ve)))
                    if fs == fe && matches!(res.funcs[fs].object, CodeObject::Elf(_)) =>
                {
                    // A range start is a branch target too (of the oldest entry,
                    // whose own edge lies outside the window).
                    res.funcs[fs].leaders.push(vs);
                    res.funcs[fs].ranges.push((vs, ve, *stat));
                }
                _ => self.lost.invalid_ranges += stat.hits,
            }
        }
    }

    fn function(
        &mut self,
        index: usize,
        w: &FunctionWork,
        proc_weight: u64,
        names: &[(String, String)],
    ) -> FunctionOutcome {
        let primary = w.total(sample_role(self.mode));
        let opt = |r: EventRole| {
            let t = w.total(r);
            (t.samples > 0).then_some(t.weight as f64)
        };
        let name = &names[index].0;
        let mut profile = FunctionProfile {
            name: name.clone(),
            mangled: (*name != w.function.name).then(|| w.function.name.clone()),
            binary: w.object_name.clone(),
            address: w.function.start,
            size: w.function.size,
            samples: primary.samples,
            share: if proc_weight > 0 {
                primary.weight as f64 / proc_weight as f64
            } else {
                0.0
            },
            time_ns: opt(EventRole::CpuClock),
            cycles: opt(EventRole::Cycles),
            instructions: None,
            cycles_rel_error: opt(EventRole::Cycles)
                .map(|_| w.total(EventRole::Cycles).rel_error()),
            instructions_rel_error: None,
            cpi: None,
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
        };
        if let (false, LineDetail::Evidence, CodeObject::Elf(bin)) =
            (self.mode.has_cpi(), self.opts.lines, &w.object)
        {
            profile.lines = self.sampled_lines(bin, w);
            return FunctionOutcome {
                profile,
                cpi_inputs: None,
                range_lengths: Vec::new(),
            };
        }
        // Time profiles decode too (sampled functions only): annotate shows samples per
        // instruction there, as perf annotate does.
        let cfg = match &w.object {
            CodeObject::Elf(bin) => {
                let key = w.key();
                let instructions = match self.decoded.get(&key) {
                    Some(d) => Ok(d.clone()),
                    None => self.sym.decode(bin, &w.function),
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
                match instructions {
                    Ok(d) => Some(Cfg::from_instructions(&w.function, d, &w.leaders)),
                    Err(e) => {
                        log::warn!("{e}");
                        None
                    }
                }
            }
            _ => None,
        };
        let Some(cfg) = cfg else {
            // No code to walk: ranges here cannot be checked.
            self.lost.invalid_ranges += w.ranges.iter().map(|r| r.2.hits).sum::<u64>();
            return FunctionOutcome {
                profile,
                cpi_inputs: None,
                range_lengths: Vec::new(),
            };
        };
        let d = self.detail(index, w, &cfg, names);
        if !self.mode.has_cpi() {
            // Samples per instruction only: no counts, cycles, blocks or edges exist.
            profile.lines = d.lines;
            return FunctionOutcome {
                profile,
                cpi_inputs: None,
                range_lengths: Vec::new(),
            };
        }
        let instructions = d.instructions;
        profile.instructions = Some(instructions);
        profile.instructions_rel_error = Some(error::relative(instructions, d.instructions_var));
        profile.cpi = cpi_of(
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

    /// The lines of a time profile's sampled instructions ([`LineDetail::Evidence`]):
    /// the same lines [`LineDetail::Every`] gives those instructions, without decoding
    /// the rest of the function. A time profile has no instruction counts.
    fn sampled_lines(&mut self, bin: &Arc<Binary>, w: &FunctionWork) -> Vec<InstructionProfile> {
        let addrs: Vec<u64> = w.ips.keys().copied().collect();
        let found = match self.sym.instructions_holding(bin, &w.function, &addrs) {
            Ok(f) => f,
            Err(e) => {
                log::warn!("{e}");
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

    /// Instruction/block/edge level of one function.
    fn detail(
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

/// One frame of a path being summed: its function (an index into the resolver's
/// functions; `None`: no function, `[unknown]`) and address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameRef {
    func: Option<usize>,
    address: u64,
}

impl FrameRef {
    fn named(&self, res: &ProcessResolver<'_>) -> StackFrame {
        match self.func {
            Some(i) => StackFrame {
                function: res.funcs[i].name.clone(),
                binary: res.funcs[i].object_name.clone(),
                address: self.address,
            },
            None => StackFrame {
                function: "[unknown]".into(),
                binary: String::new(),
                address: self.address,
            },
        }
    }
}

/// Paths are summed by (function name, binary) frame by frame, as the profile names
/// them: one id per distinct pair.
#[derive(Default)]
struct FrameNames {
    by_func: HashMap<Option<usize>, u32>,
    by_name: HashMap<(String, String), u32>,
}

impl FrameNames {
    fn id(&mut self, f: &FrameRef, res: &ProcessResolver<'_>) -> u32 {
        if let Some(&id) = self.by_func.get(&f.func) {
            return id;
        }
        let named = f.named(res);
        let next = self.by_name.len() as u32;
        let id = *self
            .by_name
            .entry((named.function, named.binary))
            .or_insert(next);
        self.by_func.insert(f.func, id);
        id
    }
}

/// One call path being summed from the stacks.
#[derive(Default)]
struct PathAcc {
    frames: Vec<FrameRef>,
    end: StackEnd,
    /// IP samples and Σ periods per role.
    ips: BTreeMap<EventRole, (u64, u64)>,
    samples: u64,
    cycles_groups: Groups,
    branch_samples: u64,
    instructions: f64,
    instruction_groups: Groups,
    range_hits: u64,
}

impl PathAcc {
    /// Adds the IP samples of a stack; `role` counts as the path's samples.
    fn add_ips(&mut self, stat: &StackStat, role: EventRole) {
        for (&r, &(n, w)) in &stat.ips {
            let e = self.ips.entry(r).or_default();
            e.0 += n;
            e.1 += w;
            if r == role {
                self.samples += n;
            }
        }
        self.cycles_groups.add_scaled(&stat.cycles_groups, 1.0);
    }

    /// What the path weighs in orderings: cycles, else time, else samples (as
    /// cpi-user/src/profile/paths.rs `weight` ranks the named paths).
    fn weight(&self) -> f64 {
        [EventRole::Cycles, EventRole::CpuClock]
            .iter()
            .find_map(|r| self.ips.get(r).map(|v| v.1 as f64))
            .unwrap_or(self.samples as f64)
    }

    /// Adds everything of `o` (a path beyond the kept ones) but its frames.
    fn absorb(&mut self, o: PathAcc) {
        for (r, (n, w)) in o.ips {
            let e = self.ips.entry(r).or_default();
            e.0 += n;
            e.1 += w;
        }
        self.samples += o.samples;
        self.cycles_groups.add_scaled(&o.cycles_groups, 1.0);
        self.branch_samples += o.branch_samples;
        self.instructions += o.instructions;
        self.instruction_groups
            .add_scaled(&o.instruction_groups, 1.0);
        self.range_hits += o.range_hits;
    }

    fn into_path(self, frames: Vec<StackFrame>, ranged: bool, floor: u64) -> StackProfile {
        let weight = |r: EventRole| self.ips.get(&r).map(|v| v.1 as f64);
        let cycles = weight(EventRole::Cycles);
        let cycles_rel_error = cycles.map(|c| error::relative(c, self.cycles_groups.variance()));
        let n = self.instructions;
        let (instructions, instructions_rel_error) = if ranged && self.range_hits > 0 {
            (
                Some(n),
                Some(error::relative(n, self.instruction_groups.variance())),
            )
        } else {
            (None, None)
        };
        let cpi = match (cycles, cycles_rel_error, instructions_rel_error) {
            (Some(c), Some(rc), Some(ri)) => {
                let cycle_samples = self.ips.get(&EventRole::Cycles).map_or(0, |v| v.0);
                estimate(
                    c,
                    n,
                    error::quotient(rc, ri),
                    cycle_samples.min(self.range_hits),
                    floor,
                )
            }
            _ => None,
        };
        StackProfile {
            frames,
            end: self.end,
            samples: self.samples,
            branch_samples: self.branch_samples,
            time_ns: weight(EventRole::CpuClock),
            cycles,
            instructions,
            cpi,
            cycles_rel_error,
            instructions_rel_error,
            range_hits: self.range_hits,
        }
    }
}

/// The path of `frames` in `paths`, added empty when new.
fn path_acc<'p>(
    paths: &'p mut BTreeMap<Vec<u32>, PathAcc>,
    names: &mut FrameNames,
    res: &ProcessResolver<'_>,
    frames: &[FrameRef],
    end: StackEnd,
) -> &'p mut PathAcc {
    let key = frames.iter().map(|f| names.id(f, res)).collect();
    let acc = paths.entry(key).or_insert_with(|| PathAcc {
        frames: frames.to_vec(),
        end,
        ..Default::default()
    });
    if acc.end == StackEnd::Complete {
        acc.end = end;
    }
    acc
}

struct Detail {
    instructions: f64,
    /// The variance of `instructions` (cpi-user/src/profile/error.rs).
    instructions_var: f64,
    /// `instructions` per group of branch samples (ranged modes).
    instruction_groups: Groups,
    /// Range occurrences (or instruction samples) behind `instructions`.
    instruction_samples: u64,
    /// Cycles on decoded instructions.
    cycles: Tally,
    timed: Option<Estimate>,
    blocks: Vec<BlockProfile>,
    edges: Vec<EdgeProfile>,
    lines: Vec<InstructionProfile>,
}

/// A hash map's entries in key order (analysis is deterministic).
fn sorted<K: Ord, V>(m: &HashMap<K, V>) -> Vec<(&K, &V)> {
    let mut v: Vec<(&K, &V)> = m.iter().collect();
    v.sort_unstable_by(|a, b| a.0.cmp(b.0));
    v
}

fn note_binary(binaries: &mut BTreeMap<String, BinaryInfo>, r: &Resolved) {
    if binaries.contains_key(&r.object_name) {
        return;
    }
    let (build_id, stripped) = match &r.object {
        CodeObject::Elf(b) => (b.build_id.clone(), b.stripped()),
        _ => (None, false),
    };
    binaries.insert(
        r.object_name.clone(),
        BinaryInfo {
            path: r.object_name.clone(),
            build_id,
            deleted: r.deleted,
            stripped,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::testbin::{maps_for, TestProgram};
    use crate::binary::Binary;
    use crate::profile::error::{group_of, GROUPS};
    use cpi_common::policy::Perturbation;
    use cpi_common::wire::{IpSample, SampleHeader, SampleKind, FLAG_KERNEL, WIRE_VERSION};

    /// The relative standard error profile/error.rs gives the sum of `weights`, the
    /// i-th sample's weight falling in group `group_of(i)`: computed here from the
    /// formula, independently of `Groups`.
    pub(super) fn groups_rel(weights: &[f64]) -> f64 {
        let mut g = [0.0; GROUPS];
        for (i, w) in weights.iter().enumerate() {
            g[group_of(i as u64)] += w;
        }
        let total: f64 = weights.iter().sum();
        let mean = total / GROUPS as f64;
        let var =
            g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() * GROUPS as f64 / (GROUPS - 1) as f64;
        var.sqrt() / total
    }

    pub(super) fn ip(pid: u32, role: EventRole, addr: u64, period: u64) -> IpSample {
        IpSample {
            header: SampleHeader {
                version: WIRE_VERSION,
                kind: SampleKind::Ip as u16,
                flags: if addr >= crate::binary::symbolize::KERNEL_START {
                    FLAG_KERNEL
                } else {
                    0
                },
                tgid: pid,
                event: role as u32,
                period,
                ip: addr,
                ..Default::default()
            },
        }
    }

    pub(super) fn run_info(mode: Mode) -> RunInfo {
        RunInfo {
            mode,
            mode_reason: "test".into(),
            command: vec![],
            duration_secs: 1.0,
            events: vec![],
            perturbation: Perturbation::Both,
            lost: LossReport::default(),
        }
    }

    pub(super) fn opts() -> AnalysisOptions {
        AnalysisOptions {
            symbolizer: SymbolizerOptions {
                use_proc: false,
                kallsyms: None,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn time_profile_functions_losses_and_json() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        const BASE: u64 = 0x5555_5555_4000;
        for path in [&t.pie, &t.pie_stripped] {
            let bin = Binary::open(&t.pie).unwrap();
            let sum = bin.function_by_name("sum_loop").unwrap().start;
            let exported = bin.function_by_name("exported_entry").unwrap().start;
            let mut set = SampleSet::new(8);
            let p = set.process(100);
            p.comm = "loops".into();
            p.maps = Some(maps_for(path, &bin, BASE));
            let mut add = |addr, n| {
                for _ in 0..n {
                    set.add_ip(&ip(100, EventRole::CpuClock, addr, 1_000_000))
                        .unwrap();
                }
            };
            add(BASE + sum + 4, 20);
            add(BASE + sum + 8, 10);
            add(BASE + exported, 10);
            add(0xffff_ffff_8100_0000, 5);
            add(0x10, 3);
            let mut run = run_info(Mode::TimeProfile);
            run.lost.ring_full = 2;
            run.lost.thinned = 7;
            let prof = analyze(&set, run, &opts());
            assert_eq!(prof.lost.unmapped_samples, 3);
            assert_eq!(
                prof.lost_samples, 2,
                "ring_full only: not unmapped, not thinned"
            );
            let pp = &prof.processes[0];
            assert_eq!((pp.pid, pp.comm.as_str(), pp.samples), (100, "loops", 48));
            assert_eq!(pp.time_ns, Some(48e6));
            let f = &pp.functions;
            let stripped = path == &t.pie_stripped;
            let sum_name = if stripped {
                format!("func_{sum:x}")
            } else {
                "sum_loop".to_string()
            };
            assert_eq!(
                (f[0].name.as_str(), f[0].samples, f[0].address),
                (sum_name.as_str(), 30, sum)
            );
            assert_eq!(f[0].time_ns, Some(30e6));
            assert!((f[0].share - 30.0 / 48.0).abs() < 1e-12);
            assert_eq!((f[1].name.as_str(), f[1].samples), ("exported_entry", 10));
            assert_eq!(
                (f[2].name.as_str(), f[2].binary.as_str()),
                ("[kernel]", "[kernel]")
            );
            let b = prof
                .binaries
                .iter()
                .find(|b| b.path == path.display().to_string())
                .unwrap();
            assert_eq!(b.build_id, bin.build_id);
            assert_eq!(b.stripped, stripped);
            // The JSON fields issue 2 promises.
            let j = serde_json::to_value(&prof).unwrap();
            assert_eq!(j["mode"], "time-profile");
            assert_eq!(j["lost_samples"], 2);
            assert_eq!(j["processes"][0]["pid"], 100);
            assert_eq!(j["processes"][0]["comm"], "loops");
            assert_eq!(j["processes"][0]["samples"], 48);
            assert_eq!(j["processes"][0]["functions"][0]["name"], sum_name.as_str());
            assert_eq!(j["processes"][0]["functions"][0]["samples"], 30);
            assert_eq!(
                j["processes"][0]["functions"][0]["binary"],
                path.display().to_string()
            );
        }
    }

    /// The agent's lines (sampled instructions only, each decoded alone) are the lines
    /// of every instruction, kept where there are samples.
    #[test]
    fn evidence_lines_are_every_line_with_samples() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        const BASE: u64 = 0x5555_5555_4000;
        for path in [&t.pie, &t.pie_stripped] {
            let bin = Binary::open(path).unwrap();
            let main = Binary::open(&t.pie)
                .unwrap()
                .function_by_name("main")
                .unwrap();
            let mut set = SampleSet::new(8);
            let p = set.process(100);
            p.maps = Some(maps_for(path, &bin, BASE));
            // Every byte of main, some twice: instruction starts and middles.
            for off in 0..main.size {
                for _ in 0..1 + off % 2 {
                    set.add_ip(&ip(100, EventRole::CpuClock, BASE + main.start + off, 1000))
                        .unwrap();
                }
            }
            let every = analyze(&set, run_info(Mode::TimeProfile), &opts());
            let evidence = analyze(
                &set,
                run_info(Mode::TimeProfile),
                &AnalysisOptions {
                    lines: LineDetail::Evidence,
                    ..opts()
                },
            );
            let (a, b) = (
                &every.processes[0].functions,
                &evidence.processes[0].functions,
            );
            assert_eq!(a.len(), b.len());
            for (a, b) in a.iter().zip(b) {
                let kept: Vec<InstructionProfile> =
                    a.lines.iter().filter(|l| l.samples > 0).cloned().collect();
                assert!(kept.len() > 10, "{}: {} lines", a.name, kept.len());
                assert_eq!(kept, b.lines, "{}", a.name);
                assert_eq!(
                    b.lines.iter().map(|l| l.samples).sum::<u64>(),
                    a.samples,
                    "every sample on a line"
                );
            }
        }
    }

    #[test]
    fn deleted_binary_is_flagged_and_ip_sampling_has_cpi() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let bin = Binary::open(&t.plain).unwrap();
        let fib = bin.function_by_name("fib").unwrap().start;
        let maps = maps_for(&t.plain, &bin, 0);
        let text = maps
            .mappings
            .iter()
            .map(|m| match &m.object {
                crate::procmap::MappedObject::File { path, .. } => format!(
                    "{:x}-{:x} r-xp {:08x} {} {} (deleted)\n",
                    m.start,
                    m.end,
                    m.offset,
                    crate::binary::testbin::maps_dev_ino(path),
                    path.display()
                ),
                _ => String::new(),
            })
            .collect::<String>();
        let mut set = SampleSet::new(8);
        set.process(5).maps = Some(ProcessMaps::parse(&text).unwrap());
        for _ in 0..40 {
            set.add_ip(&ip(5, EventRole::Cycles, fib + 1, 1000))
                .unwrap();
        }
        for _ in 0..25 {
            set.add_ip(&ip(5, EventRole::Instructions, fib + 1, 500))
                .unwrap();
        }
        // The agent's cpu-clock companion (collect/events.rs `plan`): CPU time beside
        // the hardware events, leaving their numbers alone.
        for _ in 0..30 {
            set.add_ip(&ip(5, EventRole::CpuClock, fib + 1, 1_000_000))
                .unwrap();
        }
        let prof = analyze(&set, run_info(Mode::IpSampling), &opts());
        assert!(prof.binaries[0].deleted);
        assert_eq!(prof.processes[0].time_ns, Some(30e6));
        let f = &prof.processes[0].functions[0];
        assert_eq!(f.time_ns, Some(30e6));
        assert_eq!(f.name, "fib");
        assert_eq!((f.cycles, f.instructions), (Some(40_000.0), Some(12_500.0)));
        let cpi = f.cpi.unwrap();
        assert_eq!((cpi.value, cpi.samples), (3.2, 25));
        // Per instruction too: the instruction holding fib+1 has both.
        let l = f
            .lines
            .iter()
            .find(|l| l.address <= fib + 1 && fib + 1 < l.address + 8)
            .filter(|l| l.count > 0.0)
            .unwrap();
        assert_eq!(
            (l.count, l.cycles, l.samples),
            (12_500.0, Some(40_000.0), 40)
        );
        assert_eq!(l.cpi.unwrap().value, 3.2);
        assert_eq!(f.lines.iter().filter(|l| l.count > 0.0).count(), 1);
        // Independent samplers: 40 cycle samples of 1000 and 25 instructions samples of
        // 500, each spread over the groups of profile/error.rs, combine in quadrature.
        let (rel_c, rel_n) = (groups_rel(&[1000.0; 40]), groups_rel(&[500.0; 25]));
        assert!(rel_c > 0.0 && rel_n > 0.0);
        assert!((cpi.rel_error - rel_c.hypot(rel_n)).abs() < 1e-9);
        assert!((f.cycles_rel_error.unwrap() - rel_c).abs() < 1e-9);
        // Below the floor: no number.
        let mut o = opts();
        o.sample_floor = 26;
        let prof = analyze(&set, run_info(Mode::IpSampling), &o);
        assert_eq!(prof.processes[0].functions[0].cpi, None);
        assert_eq!(prof.processes[0].cpi, None);
    }
}

/// The range algorithm end to end (SampleSet → analyze) on real gcc output, with
/// branch traces whose exact counts are known.
#[cfg(test)]
mod range_tests {
    use super::tests::{groups_rel, ip, opts, run_info};
    use super::*;
    use crate::binary::testbin::{maps_for, TestProgram};
    use crate::binary::Binary;
    use cpi_common::wire::{BranchEntry, BranchSample, SampleHeader};
    use rand::{Rng, SeedableRng};
    use std::path::Path;

    const PID: u32 = 77;

    fn branch_sample(period: u64, newest_first: &[BranchEntry]) -> BranchSample {
        let header = SampleHeader {
            tgid: PID,
            period,
            ..Default::default()
        };
        BranchSample::new(header, newest_first)
    }

    fn set_for(path: &Path, bin: &Binary, base: u64, window: usize) -> SampleSet {
        let mut set = SampleSet::new(window);
        set.process(PID).maps = Some(maps_for(path, bin, base));
        set
    }

    fn func<'a>(p: &'a Profile, name: &str) -> &'a FunctionProfile {
        p.processes[0]
            .functions
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} not in profile"))
    }

    /// sum_loop of analysis_loops: its CFG, the loop's latch (backward jne) and head,
    /// the `ret` after the latch, and main's call to it.
    struct SumLoop {
        f: crate::binary::Function,
        cfg: Cfg,
        latch: usize,
        head: usize,
        ret: usize,
        call: Instruction,
    }

    fn sum_loop(bin: &Binary) -> SumLoop {
        let f = bin.function_by_name("sum_loop").unwrap().clone();
        let cfg = bin.cfg(&f, &[]).unwrap();
        let ins = &cfg.instructions;
        let latch = ins
            .iter()
            .position(|i| i.kind == FlowKind::CondBranch && i.target < Some(i.addr))
            .expect("a backward loop branch");
        let head = cfg.instruction_at(ins[latch].target.unwrap()).unwrap();
        let ret = latch + 1;
        assert_eq!(ins[ret].kind, FlowKind::Return);
        let main = bin.function_by_name("main").unwrap().clone();
        let call = bin
            .cfg(&main, &[])
            .unwrap()
            .instructions
            .iter()
            .find(|i| i.kind == FlowKind::Call && i.target == Some(f.start))
            .unwrap()
            .clone();
        SumLoop {
            f,
            cfg,
            latch,
            head,
            ret,
            call,
        }
    }

    /// sum_loop(a, 3) as gcc -O2 compiles it: entered by a call from main, three
    /// iterations (the backward jne taken twice), ret back to main. One sample of
    /// period 3000 with window 3 → each range occurrence stands for 1000, and the
    /// sample is added 50 times.
    #[test]
    fn sum_loop_three_iterations_exact() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        for (path, base) in [(&t.plain, 0u64), (&t.pie, 0x5555_5555_4000)] {
            let bin = Binary::open(path).unwrap();
            let SumLoop {
                f,
                cfg,
                latch,
                head,
                ret,
                call,
            } = sum_loop(&bin);
            let ins = &cfg.instructions;
            let rt = |a: u64| a + base;
            // Oldest → newest: call, jne, jne, ret; cycles since the previous entry.
            let e1 = BranchEntry::new(rt(call.addr), rt(f.start), false, 0);
            let e2 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), false, 12);
            let e3 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), true, 5);
            let e4 = BranchEntry::new(rt(ins[ret].addr), rt(call.next()), false, 7);
            let mut set = set_for(path, &bin, base, 3);
            for _ in 0..50 {
                set.add_branch(&branch_sample(3000, &[e4, e3, e2, e1]));
            }
            // The same function again, its entry once timed 14 cycles.
            let slow = BranchEntry::new(e2.from, e2.to, false, 14);
            let mut varied = set_for(path, &bin, base, 3);
            for i in 0..50 {
                let e2 = if i == 7 { slow } else { e2 };
                varied.add_branch(&branch_sample(3000, &[e4, e3, e2, e1]));
            }
            // Synthetic cycles: 30 samples on the loop head, 10 on the entry.
            for _ in 0..30 {
                set.add_ip(&ip(PID, EventRole::Cycles, rt(ins[head].addr), 997))
                    .unwrap();
            }
            for _ in 0..10 {
                set.add_ip(&ip(PID, EventRole::Cycles, rt(f.start), 1009))
                    .unwrap();
            }
            let mut o = opts();
            o.sample_floor = 10;
            let prof = analyze(&set, run_info(Mode::Cpi), &o);
            assert_eq!(prof.lost.invalid_ranges, 0);
            let fp = func(&prof, "sum_loop");
            // Per instruction: entry path once, body three times, ret once, the
            // n <= 0 exit never.
            let expect: Vec<f64> = (0..ins.len())
                .map(|i| {
                    if i < head || i == ret {
                        50_000.0
                    } else if i <= latch {
                        150_000.0
                    } else {
                        0.0
                    }
                })
                .collect();
            let got: Vec<f64> = fp.lines.iter().map(|l| l.count).collect();
            assert_eq!(got, expect, "{path:?}");
            assert_eq!(fp.lines[latch].text, ins[latch].text);
            let n_instr = (head + 1) + 3 * (latch + 1 - head);
            assert_eq!(fp.instructions, Some(50_000.0 * n_instr as f64));
            // Blocks: count = executions of the block.
            let block = |a: u64| fp.blocks.iter().find(|b| b.start == a).unwrap();
            assert_eq!(block(ins[head].addr).count, 150_000.0);
            assert_eq!(block(ins[head].addr).len as usize, latch + 1 - head);
            assert_eq!(block(f.start).count, 50_000.0);
            assert_eq!(block(ins[ret].addr).count, 50_000.0);
            // Edges: the loop's taken back edge twice per call, the exit fall-through
            // once, the return leaving for main.
            let edge = |from: u64, to: u64, kind: EdgeKind| {
                fp.edges
                    .iter()
                    .find(|e| e.from == from && e.to == to && e.kind == kind)
                    .unwrap_or_else(|| panic!("edge {from:#x}->{to:#x} {kind:?}"))
            };
            let back = edge(ins[latch].addr, ins[head].addr, EdgeKind::Taken);
            assert_eq!((back.count, back.mispredicts), (100_000.0, 50_000.0));
            assert_eq!(back.to_function, None);
            assert_eq!(
                edge(ins[latch].addr, ins[ret].addr, EdgeKind::FallThrough).count,
                50_000.0
            );
            let out = edge(ins[ret].addr, call.next(), EdgeKind::Taken);
            assert_eq!(out.to_function.as_deref(), Some("main"));
            assert_eq!(out.to_binary.as_deref(), Some(&*path.display().to_string()));
            let into_loop = fp
                .edges
                .iter()
                .filter(|e| e.kind == EdgeKind::FallThrough && e.to == ins[head].addr)
                .map(|e| e.count)
                .sum::<f64>();
            assert_eq!(
                into_loop, 50_000.0,
                "entry falls into the loop once per call"
            );
            // The oldest entry (main's call) only starts the oldest range: with window
            // 3 its own edge is outside the window and not counted.
            assert!(
                prof.processes[0].functions.iter().all(|f| f.name != "main"),
                "main has no evidence of its own: not reported"
            );
            // CPI from synthetic cycles: 30×997 + 10×1009 over the range instructions;
            // samples = min(40 cycle samples, 150 range occurrences).
            let cycles = 30.0 * 997.0 + 10.0 * 1009.0;
            let cpi = fp.cpi.unwrap();
            assert_eq!(cpi.value, cycles / (50_000.0 * n_instr as f64));
            assert_eq!(cpi.samples, 40);
            // The error model (profile/error.rs): the cycles through the groups their
            // 40 samples fell in (the head's 30 first, then the entry's 10); the
            // instructions through the groups of the 50 branch samples, not of the 150
            // ranges (1000 × n_instr instructions each).
            let mut periods = vec![997.0; 30];
            periods.extend([1009.0; 10]);
            let rel_c = groups_rel(&periods);
            let rel_n = groups_rel(&[1000.0 * n_instr as f64; 50]);
            assert!(rel_n > 0.0);
            assert!((fp.instructions_rel_error.unwrap() - rel_n).abs() < 1e-9);
            assert!((cpi.rel_error - rel_c.hypot(rel_n)).abs() < 1e-9);
            // The loop block: 30 cycle samples (< floor 10? no: 30 ≥ 10) → a number;
            // the entry block has 10 → a number; the ret block has none → None.
            let hb = block(ins[head].addr);
            assert_eq!(hb.cycles, Some(30.0 * 997.0));
            assert_eq!(
                hb.cpi.unwrap().value,
                30.0 * 997.0 / (150_000.0 * (latch + 1 - head) as f64)
            );
            assert_eq!(block(ins[ret].addr).cpi, None);
            // Timed LBR: 12 cycles over [entry, first jne], 5 over one iteration, 7 over
            // the last iteration + ret, in every one of the 50 samples: the ratio does not
            // vary between samples, so no error can be measured: below the floor.
            assert_eq!(fp.timed_cpi, None);
            // With the one slower entry, a number: 50 samples, each timing the three
            // ranges once (not 150), with the error of one sample in 50 differing.
            let vp = analyze(&varied, run_info(Mode::Cpi), &o);
            let timed = func(&vp, "sum_loop").timed_cpi.unwrap();
            let (r1, r2, r3) = (latch + 1, latch + 1 - head, latch + 2 - head);
            let want = (50.0 * 24.0 + 2.0) / (50 * (r1 + r2 + r3)) as f64;
            assert!((timed.value - want).abs() < 1e-12);
            assert_eq!(timed.samples, 50);
            assert!(timed.rel_error > 1e-5, "{}", timed.rel_error);
            // The loop block is timed alone in one range (5 cycles per iteration), but
            // the other two cover it with other blocks: its first and last iterations are
            // never timed alone, so it has no timed CPI.
            assert_eq!(hb.timed_cpi, None);
            // Process CPI covers the analysed functions.
            let pp = &prof.processes[0];
            assert_eq!(pp.branch_samples, 50);
            assert_eq!(pp.cpi.unwrap().value, cycles / pp.instructions.unwrap());
        }
    }

    /// Call paths of sum_loop called from main: frames symbolised (main's at its return
    /// address), cycles per path from the IP samples under it, instructions from the
    /// branch samples' ranges by the attribution rule, CPI with its error, and the
    /// samples without a stack in `[no stack]`.
    #[test]
    fn call_paths_get_their_samples_instructions_and_cpi() {
        let t = TestProgram::get("analysis_loops").expect("analysis_loops builds (gcc)");
        let base = 0x5555_5555_4000;
        let bin = Binary::open(&t.pie).unwrap();
        let SumLoop {
            f,
            cfg,
            latch,
            head,
            ret,
            call,
        } = sum_loop(&bin);
        let ins = &cfg.instructions;
        let rt = |a: u64| a + base;
        let e1 = BranchEntry::new(rt(call.addr), rt(f.start), false, 0);
        let e2 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), false, 0);
        let e3 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), false, 0);
        let e4 = BranchEntry::new(rt(ins[ret].addr), rt(call.next()), false, 0);
        let in_loop = CallStack {
            kernel: Box::new([]),
            user: Box::new([rt(ins[head].addr), rt(call.next())]),
            end: StackEnd::Complete,
        };
        // Taken in main after sum_loop returned: its ranges ran in a callee no longer
        // on the stack.
        let in_main = CallStack {
            user: Box::new([rt(call.next())]),
            ..in_loop.clone()
        };
        let mut set = set_for(&t.pie, &bin, base, 2);
        for _ in 0..40 {
            // Window 2 of [e3, e2, e1]: [entry, latch] and [head, latch].
            set.add_branch_with_stack(&branch_sample(2000, &[e3, e2, e1]), Some(&in_loop));
            // Window 2 of [e4, e3, e2]: [head, latch] and [head, ret].
            set.add_branch_with_stack(&branch_sample(2000, &[e4, e3, e2]), Some(&in_main));
            set.add_ip_with_stack(
                &ip(PID, EventRole::Cycles, rt(ins[head].addr), 997),
                Some(&in_loop),
            )
            .unwrap();
        }
        for _ in 0..5 {
            set.add_ip(&ip(PID, EventRole::Cycles, rt(ins[head].addr), 997))
                .unwrap();
        }
        let prof = analyze(&set, run_info(Mode::Cpi), &opts());
        let pp = &prof.processes[0];
        let names = |s: &StackProfile| -> Vec<String> {
            s.frames.iter().map(|f| f.function.clone()).collect()
        };
        let path = pp
            .stacks
            .iter()
            .find(|s| names(s) == ["sum_loop", "main"])
            .expect("sum_loop <- main");
        assert_eq!(
            path.frames[1].address,
            call.next(),
            "main at its return address"
        );
        assert_eq!(path.frames[0].address, ins[head].addr);
        assert_eq!((path.samples, path.branch_samples), (40, 40));
        assert_eq!(path.cycles, Some(40.0 * 997.0));
        // Both stacks' ranges ran in sum_loop: its instructions are all the path's,
        // 1000 per range occurrence (period 2000 / window 2).
        let body = (latch + 1 - head) as f64;
        let n = 40.0 * 1000.0 * ((latch + 1) as f64 + body + body + body + 1.0);
        assert_eq!(path.instructions, Some(n));
        assert_eq!(func(&prof, "sum_loop").instructions, Some(n));
        assert_eq!(path.range_hits, 160);
        let cpi = path.cpi.unwrap();
        assert_eq!(cpi.value, 40.0 * 997.0 / n);
        assert_eq!(cpi.samples, 40);
        assert!(cpi.rel_error > 0.0 && cpi.rel_error.is_finite());
        // main's own path: the samples taken there, no instructions of its own.
        let m = pp.stacks.iter().find(|s| names(s) == ["main"]).unwrap();
        assert_eq!((m.samples, m.branch_samples, m.instructions), (0, 40, None));
        let none = pp
            .stacks
            .iter()
            .find(|s| names(s) == ["[no stack]"])
            .unwrap();
        assert_eq!((none.samples, none.cycles), (5, Some(5.0 * 997.0)));
        assert_eq!(pp.stacks[0], *path, "hottest first");
        let total: u64 = pp.stacks.iter().map(|s| s.samples).sum();
        assert_eq!(total, pp.samples);
    }

    /// Two processes mapping the same PIE at different bases (one decode, shared
    /// between them) get the same function profile, each with its own leaders.
    #[test]
    fn processes_sharing_a_binary_get_the_same_profile() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let bin = Binary::open(&t.pie).unwrap();
        let f = bin.function_by_name("fib").unwrap().clone();
        let cfg = bin.cfg(&f, &[]).unwrap();
        let call = cfg
            .instructions
            .iter()
            .find(|i| i.kind == FlowKind::Call)
            .unwrap();
        let mut set = SampleSet::new(1);
        for (pid, base) in [(1u32, 0x5555_0000_0000u64), (2, 0x7000_0000_0000)] {
            set.process(pid).maps = Some(maps_for(&t.pie, &bin, base));
            let mut s = branch_sample(
                10,
                &[
                    BranchEntry::new(base + call.addr, base + f.start, false, 0),
                    BranchEntry::new(0x20, base + f.start, false, 0),
                ],
            );
            s.header.tgid = pid;
            set.add_branch(&s);
        }
        // Process 2 also saw a branch into the middle of fib: an extra leader.
        let mid = cfg.instructions[2].addr;
        let mut s = branch_sample(
            10,
            &[
                BranchEntry::new(0x7000_0000_0000 + call.addr, 0x10, false, 0),
                BranchEntry::new(0x30, 0x7000_0000_0000 + mid, false, 0),
            ],
        );
        s.header.tgid = 2;
        set.add_branch(&s);
        let prof = analyze(&set, run_info(Mode::Cpi), &opts());
        let fib = |i: usize| {
            prof.processes[i]
                .functions
                .iter()
                .find(|g| g.name == "fib")
                .unwrap()
        };
        let (a, b) = (fib(0), fib(1));
        let text = |f: &FunctionProfile| -> Vec<String> {
            f.lines.iter().map(|l| l.text.clone()).collect()
        };
        assert_eq!(text(a), text(b));
        assert_eq!(a.lines[0].count, 10.0);
        assert_eq!(b.lines[0].count, 10.0);
        assert_eq!(
            b.lines[2].count, 20.0,
            "both ranges cover the third instruction"
        );
        assert!(
            a.blocks.iter().all(|x| x.start != mid),
            "no leader in process 1"
        );
        assert!(
            b.blocks.iter().any(|x| x.start == mid),
            "leader in process 2"
        );
    }

    #[test]
    fn ranges_leaving_a_function_or_crossing_a_call_are_invalid() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let bin = Binary::open(&t.plain).unwrap();
        let sum = bin.function_by_name("sum_loop").unwrap().clone();
        let fib = bin.function_by_name("fib").unwrap().clone();
        let fcfg = bin.cfg(&fib, &[]).unwrap();
        let call = fcfg
            .instructions
            .iter()
            .find(|i| i.kind == FlowKind::Call)
            .unwrap();
        let mut set = set_for(&t.plain, &bin, 0, 1);
        // [sum_loop.start, fib's call]: leaves the function.
        set.add_branch(&branch_sample(
            1,
            &[
                BranchEntry::new(call.addr, fib.start, false, 0),
                BranchEntry::new(0x10, sum.start, false, 0),
            ],
        ));
        // [fib.start, the instruction after the call ... a later branch]: crosses the
        // call. The ending branch is the last instruction (ret).
        let ret = fcfg.instructions.last().unwrap();
        set.add_branch(&branch_sample(
            1,
            &[
                BranchEntry::new(ret.addr, 0x10, false, 0),
                BranchEntry::new(0x20, fib.start, false, 0),
            ],
        ));
        // [fib.start + 1, call]: not an instruction boundary.
        set.add_branch(&branch_sample(
            1,
            &[
                BranchEntry::new(call.addr, fib.start, false, 0),
                BranchEntry::new(0x20, fib.start + 1, false, 0),
            ],
        ));
        // A valid one: [fib.start, call].
        set.add_branch(&branch_sample(
            1,
            &[
                BranchEntry::new(call.addr, fib.start, false, 0),
                BranchEntry::new(0x20, fib.start, false, 0),
            ],
        ));
        let prof = analyze(&set, run_info(Mode::Cpi), &opts());
        assert_eq!(prof.lost.invalid_ranges, 3);
        assert_eq!(prof.lost_samples, 0, "invalid ranges are not lost samples");
        let f = func(&prof, "fib");
        let counted: Vec<u64> = f
            .lines
            .iter()
            .filter(|l| l.count > 0.0)
            .map(|l| l.address)
            .collect();
        let upto: Vec<u64> = fcfg
            .instructions
            .iter()
            .map(|i| i.addr)
            .filter(|&a| a <= call.addr)
            .collect();
        assert_eq!(counted, upto, "only the valid range counts");
        assert!(f.lines.iter().all(|l| l.count == 0.0 || l.count == 1.0));
    }

    /// Exact truth of a walk through one function's CFG.
    #[derive(Default)]
    struct Walk {
        /// Taken branches, oldest first (runtime addresses).
        taken: Vec<(u64, u64)>,
        count: HashMap<u64, f64>,
        fall: HashMap<(u64, u64), f64>,
        taken_count: HashMap<(u64, u64), f64>,
    }

    /// Random walk from the entry: conditionals go either way, direct jumps are
    /// followed, anything else leaves the function. Counts are committed when the
    /// taken branch ending their range is emitted (period-1 reproduction).
    fn walk(cfg: &Cfg, base: u64, rng: &mut rand::rngs::StdRng) -> Walk {
        let mut w = Walk::default();
        w.taken.push((0x20, base + cfg.function.start));
        let mut pending_c: Vec<u64> = Vec::new();
        let mut pending_f: Vec<(u64, u64)> = Vec::new();
        let mut i = 0usize;
        for _ in 0..20_000 {
            let ins = &cfg.instructions[i];
            pending_c.push(ins.addr);
            let target = ins.target.and_then(|t| cfg.instruction_at(t));
            let next = match ins.kind {
                FlowKind::CondBranch if target.is_some() && rng.gen_bool(0.5) => None,
                FlowKind::Jump if target.is_some() => None,
                FlowKind::Next | FlowKind::CondBranch | FlowKind::Syscall
                    if i + 1 < cfg.instructions.len() =>
                {
                    Some(i + 1)
                }
                _ => {
                    // Leaves the function (call, ret, indirect jump, tail call, trap).
                    w.taken.push((base + ins.addr, ins.target.unwrap_or(0x10)));
                    commit(&mut w, &mut pending_c, &mut pending_f);
                    return w;
                }
            };
            match next {
                Some(j) => {
                    if cfg.block_of[i] != cfg.block_of[j] {
                        pending_f.push((ins.addr, cfg.instructions[j].addr));
                    }
                    i = j;
                }
                None => {
                    let j = target.unwrap();
                    let to = cfg.instructions[j].addr;
                    w.taken.push((base + ins.addr, base + to));
                    *w.taken_count.entry((ins.addr, to)).or_default() += 1.0;
                    commit(&mut w, &mut pending_c, &mut pending_f);
                    i = j;
                }
            }
        }
        w // step limit: the unfinished range is not part of the truth
    }

    fn commit(w: &mut Walk, c: &mut Vec<u64>, f: &mut Vec<(u64, u64)>) {
        for a in c.drain(..) {
            *w.count.entry(a).or_default() += 1.0;
        }
        for e in f.drain(..) {
            *w.fall.entry(e).or_default() += 1.0;
        }
    }

    /// Every function of the program (plain, PIE, stripped): a period-1 sample at every
    /// taken branch of random walks reproduces the walks' exact counts.
    #[test]
    fn period_one_walks_reproduce_exact_counts() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        const WINDOW: usize = 4;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut checked = 0;
        for (path, base) in [
            (&t.plain, 0u64),
            (&t.pie, 0x5555_5555_4000),
            (&t.pie_stripped, 0x5555_5555_4000),
        ] {
            let bin = Binary::open(path).unwrap();
            for f in bin.functions().filter(|f| !f.name.starts_with('[')) {
                let cfg = bin.cfg(&f, &[]).unwrap();
                let mut set = set_for(path, &bin, base, WINDOW);
                let mut truth = Walk::default();
                for _ in 0..5 {
                    let mut w = walk(&cfg, base, &mut rng);
                    // Pad both ends with unmapped branches so the first and last ranges
                    // fall in WINDOW samples each, like every other range.
                    let pad = |k: u64| (0x1000 + 16 * k, 0x1008 + 16 * k);
                    let mut taken: Vec<(u64, u64)> = (0..WINDOW as u64).map(pad).collect();
                    taken.append(&mut w.taken);
                    taken.extend((0..WINDOW as u64).map(|k| pad(k + 8)));
                    w.taken = taken;
                    for j in WINDOW..w.taken.len() {
                        let e: Vec<BranchEntry> = (0..=WINDOW)
                            .map(|k| {
                                let (a, b) = w.taken[j - k];
                                BranchEntry::new(a, b, false, 0)
                            })
                            .collect();
                        set.add_branch(&branch_sample(1, &e));
                    }
                    for (k, v) in w.count {
                        *truth.count.entry(k).or_default() += v;
                    }
                    for (k, v) in w.fall {
                        *truth.fall.entry(k).or_default() += v;
                    }
                    for (k, v) in w.taken_count {
                        *truth.taken_count.entry(k).or_default() += v;
                    }
                }
                if truth.count.is_empty() {
                    continue;
                }
                let prof = analyze(&set, run_info(Mode::Cpi), &opts());
                let fp = func(&prof, &f.name);
                for l in &fp.lines {
                    let want = truth.count.get(&l.address).copied().unwrap_or(0.0);
                    assert_eq!(l.count, want, "{} {:#x} in {path:?}", f.name, l.address);
                }
                for e in &fp.edges {
                    let want = match (e.kind, e.to_function.is_some()) {
                        (EdgeKind::FallThrough, _) => truth.fall.get(&(e.from, e.to)),
                        (EdgeKind::Taken, false) => truth.taken_count.get(&(e.from, e.to)),
                        (EdgeKind::Taken, true) => continue,
                    };
                    assert_eq!(Some(&e.count), want, "{} edge {e:?}", f.name);
                }
                let n_fall = fp
                    .edges
                    .iter()
                    .filter(|e| e.kind == EdgeKind::FallThrough)
                    .count();
                assert_eq!(n_fall, truth.fall.len(), "{}", f.name);
                checked += 1;
            }
        }
        assert!(checked >= 15, "walked {checked} functions");
    }
}

/// Analysis cost on a large stripped binary (BENCHMARKS.md "Analysis"). Not a test of
/// correctness: run explicitly with
/// `cargo test --release -p cpi-user --lib -- --ignored --nocapture bench_analysis`.
#[cfg(test)]
mod bench {
    use super::tests::{ip, opts, run_info};
    use super::*;
    use crate::binary::testbin::maps_for;
    use crate::binary::Binary;
    use cpi_common::wire::{BranchEntry, BranchSample, SampleHeader};
    use rand::{Rng, SeedableRng};
    use std::path::Path;
    use std::time::Instant;

    fn peak_rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }

    #[test]
    #[ignore = "benchmark: run by hand, figures go to BENCHMARKS.md"]
    fn bench_analysis_libpython() {
        let path = Path::new("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0");
        if !path.exists() {
            crate::binary::testbin::skip(format_args!("{} not installed", path.display()));
            return;
        }
        const BASE: u64 = 0x7f12_3400_0000;
        const PID: u32 = 9;
        const FUNCS: usize = 2000;
        const TAKEN: u64 = 5_000_000;
        const BRANCH_PERIOD: u64 = 13;
        const CYCLE_PERIOD: u64 = 997;
        const DEPTH: usize = 32;
        const WINDOW: usize = 16;
        let bin = Binary::open(path).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        // The FUNCS largest functions are the "sampled" ones; walks pick them with a
        // skewed (hot/cold) distribution.
        let mut funcs: Vec<Function> = bin.functions().collect();
        funcs.sort_by_key(|f| std::cmp::Reverse(f.size));
        funcs.truncate(FUNCS);
        let t_cfg = Instant::now();
        let cfgs: Vec<Cfg> = funcs.iter().map(|f| bin.cfg(f, &[]).unwrap()).collect();
        eprintln!(
            "disassembly + blocks of {FUNCS} functions: {:.3} s",
            t_cfg.elapsed().as_secs_f64()
        );

        let mut set = SampleSet::new(WINDOW);
        set.process(PID).maps = Some(maps_for(path, &bin, BASE));
        let mut ring: std::collections::VecDeque<BranchEntry> = Default::default();
        let (mut taken, mut executed) = (0u64, 0u64);
        let mut f = 0usize;
        let mut i = 0usize;
        while taken < TAKEN {
            let cfg = &cfgs[f];
            let ins = &cfg.instructions[i];
            executed += 1;
            if executed % CYCLE_PERIOD == 0 {
                set.add_ip(&ip(PID, EventRole::Cycles, BASE + ins.addr, CYCLE_PERIOD))
                    .unwrap();
            }
            let target = ins.target.and_then(|t| cfg.instruction_at(t));
            let jump = match ins.kind {
                FlowKind::CondBranch if target.is_some() && rng.gen_bool(0.5) => target,
                FlowKind::Jump if target.is_some() => target,
                FlowKind::Next | FlowKind::CondBranch | FlowKind::Syscall
                    if i + 1 < cfg.instructions.len() =>
                {
                    i += 1;
                    continue;
                }
                _ => None,
            };
            // A taken branch: inside the function, or out of it to the next walk.
            let (to_f, to_i) = match jump {
                Some(j) => (f, j),
                None => {
                    // Each exit site (call, ret, indirect jump) has a few fixed
                    // destinations, skewed towards the hottest functions.
                    let pick = (ins.addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40)
                        .wrapping_add(rng.gen_range(0..3));
                    let r = (pick % 10_000) as f64 / 10_000.0;
                    ((r * r * r * FUNCS as f64) as usize, 0)
                }
            };
            let to = BASE + cfgs[to_f].instructions[to_i].addr;
            ring.push_front(BranchEntry::new(BASE + ins.addr, to, false, 3));
            ring.truncate(DEPTH);
            taken += 1;
            if taken % BRANCH_PERIOD == 0 && ring.len() == DEPTH {
                let header = SampleHeader {
                    tgid: PID,
                    period: BRANCH_PERIOD,
                    ..Default::default()
                };
                let entries: Vec<BranchEntry> = ring.iter().copied().collect();
                set.add_branch(&BranchSample::new(header, &entries));
            }
            (f, i) = (to_f, to_i);
        }
        let b = &set.processes[&PID].branches;
        let (samples, ranges, edges) = (b.samples, b.ranges.len(), b.taken.len());
        drop(cfgs);
        let rss_before = peak_rss_kib();
        let t0 = Instant::now();
        let prof = analyze(&set, run_info(Mode::Cpi), &opts());
        let dt = t0.elapsed();
        let rss_after = peak_rss_kib();
        let json = serde_json::to_vec(&prof).unwrap().len();
        let pp = &prof.processes[0];
        let lines: usize = pp.functions.iter().map(|f| f.lines.len()).sum();
        eprintln!(
            "libpython3.11: {} functions analysed ({} lines), {samples} branch samples, \
             {ranges} distinct ranges, {edges} distinct taken edges, {} cycle samples: \
             analysis {:.3} s, peak RSS {} MiB before / {} MiB after, profile JSON {} MiB, \
             invalid ranges {}",
            pp.functions.len(),
            lines,
            pp.samples,
            dt.as_secs_f64(),
            rss_before / 1024,
            rss_after / 1024,
            json >> 20,
            prof.lost.invalid_ranges,
        );
    }
}
