//! How far a profile is from the exact answer.
//!
//! The truth ([`Truth`], runtime addresses) is put in the profile's address space with
//! the same symboliser analysis uses, and compared unit by unit:
//! * **overlap** Σᵢ min(p̂ᵢ, pᵢ) of the normalised counts (1 = identical distributions)
//!   of instructions, blocks, functions and edges. Units are the union of both sides; a
//!   unit the profile misses counts fully against it. Blocks are the profile's own
//!   blocks in analysed functions and, in functions the profile does not have, the
//!   blocks of the same CFG builder with the traced branch targets as extra leaders; a
//!   block's count is its first instruction's. Edges are taken transfers (keyed by
//!   source and target address) and fall-through edges out of block ends.
//! * **CPI error** |ĉ − c| / c per function, over functions with at least
//!   [`CPI_SHARE_FLOOR`] of the cycles: median and maximum.
//! * **per call path** (`compare_paths`): a path is its chain of function names, leaf
//!   first, cut at `MAX_USER_FRAMES` frames as a sampled stack is; its exact
//!   instructions and cycles are those of the instructions that ran in the leaf function
//!   with that stack (the replay's calling contexts, cpi-user/src/sim/shadow.rs), its
//!   estimate the profile's [`StackProfile`]s of that chain. Overlap of the normalised
//!   instructions, and CPI error over paths with [`CPI_SHARE_FLOOR`] of the cycles, also
//!   in units of the error the profile reports.

use std::collections::{BTreeMap, HashMap};

use super::path_truth::{PathKey, PathTruth};
use super::replay::{InsnTruth, Truth};
use crate::binary::{CodeObject, Symbolizer, SymbolizerOptions};
pub use crate::profile::model::{Accuracy, FunctionAccuracy, PathAccuracy};
use crate::profile::model::{EdgeKind, FunctionProfile, Profile, StackProfile};
use crate::profile::paths::RARE_FRAME;

/// Functions below this share of the truth's cycles are left out of the CPI error.
pub const CPI_SHARE_FLOOR: f64 = 0.02;
/// Call paths listed in [`Accuracy::paths`] at most.
const PATHS_LISTED: usize = 50;

/// An estimate further than this many of its own reported errors from the exact answer
/// is a bug (a bias), not bad luck: the accuracy section names it.
pub const BUG_ERRORS: f64 = 4.0;

/// An estimate of a function that misses its exact value by more than [`BUG_ERRORS`] of
/// the errors the profile reports for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Miss {
    /// What was estimated: `"instructions"` or `"CPI"`.
    pub what: &'static str,
    /// The profile's value.
    pub est: f64,
    /// The exact value.
    pub exact: f64,
    /// The relative error the profile reports for `est`.
    pub rel_error: f64,
    /// |est − exact| in units of that error (infinite where the error is 0).
    pub errors: f64,
}

/// The estimates of `f` (instructions, CPI) more than [`BUG_ERRORS`] of their own errors
/// from the exact answer.
pub fn misses(f: &FunctionAccuracy) -> Vec<Miss> {
    let inst = Some((f.instructions_est, f.instructions_true as f64)).zip(f.instructions_rel_error);
    let cpi = f.cpi_est.zip(f.cpi_true).zip(f.cpi_rel_error);
    [("instructions", inst), ("CPI", cpi)]
        .into_iter()
        .filter_map(|(what, v)| {
            let ((est, exact), rel_error) = v?;
            let sigma = rel_error * est.abs();
            let errors = if sigma > 0.0 {
                (est - exact).abs() / sigma
            } else if est == exact {
                0.0
            } else {
                f64::INFINITY
            };
            (errors > BUG_ERRORS).then_some(Miss {
                what,
                est,
                exact,
                rel_error,
                errors,
            })
        })
        .collect()
}

/// Σ min(p̂, p) over the union of keys, each side normalised by its own total.
pub fn overlap<K: std::hash::Hash + Eq>(est: &HashMap<K, f64>, truth: &HashMap<K, f64>) -> f64 {
    let te: f64 = est.values().sum();
    let tt: f64 = truth.values().sum();
    if te <= 0.0 || tt <= 0.0 {
        return if te <= 0.0 && tt <= 0.0 { 1.0 } else { 0.0 };
    }
    truth
        .iter()
        .map(|(k, &p)| (p / tt).min(est.get(k).copied().unwrap_or(0.0) / te))
        .sum()
}

/// (binary name, address in it).
type Addr = (String, u64);
/// (binary of the source, from, to, fall-through?).
type EdgeKey = (String, u64, u64, bool);

#[derive(Default)]
struct FuncTruth {
    name: String,
    instructions: u64,
    cycles: u64,
    /// ELF function: its start and size (for the CFG of unanalysed functions).
    elf: Option<(
        std::sync::Arc<crate::binary::Binary>,
        crate::binary::Function,
    )>,
}

/// A truth symboliser: what the profile's analysis would resolve the trace's runtime
/// addresses to.
fn truth_symbolizer() -> Symbolizer {
    Symbolizer::new(SymbolizerOptions {
        use_proc: false,
        ..Default::default()
    })
}

/// The truth per instruction in profile addresses ((binary, address in it) → exact
/// counts and cycles), and the truth per function (by its start).
fn resolve_truth(
    sym: &mut Symbolizer,
    truth: &Truth,
) -> (HashMap<Addr, InsnTruth>, BTreeMap<Addr, FuncTruth>) {
    let mut insns: HashMap<Addr, InsnTruth> = HashMap::new();
    let mut funcs: BTreeMap<Addr, FuncTruth> = BTreeMap::new();
    for (&a, t) in &truth.insns {
        let Ok(r) = sym.resolve(truth.pid, &truth.maps, a) else {
            continue;
        };
        let e = insns.entry((r.object_name.clone(), r.vaddr)).or_default();
        e.count += t.count;
        e.cycles += t.cycles;
        e.fall_out += t.fall_out;
        let f = funcs
            .entry((r.object_name.clone(), r.function.start))
            .or_default();
        if f.name.is_empty() {
            f.name = sym.display_name(&r);
        }
        f.instructions += t.count;
        f.cycles += t.cycles;
        if let (CodeObject::Elf(b), None) = (&r.object, &f.elf) {
            f.elf = Some((b.clone(), r.function.clone()));
        }
    }
    (insns, funcs)
}

/// Exact counts and cycles per instruction in profile addresses: what
/// `sim::calibrate` judges each unit's estimate against.
pub(crate) struct TruthByAddress(HashMap<Addr, InsnTruth>);

impl TruthByAddress {
    /// Resolves `truth` as the analysis resolves samples.
    pub fn new(truth: &Truth) -> Self {
        TruthByAddress(resolve_truth(&mut truth_symbolizer(), truth).0)
    }

    /// (executions, cycles) of the instruction at `address` of `binary`.
    pub fn get(&self, binary: &str, address: u64) -> (u64, u64) {
        self.0
            .get(&(binary.to_string(), address))
            .map_or((0, 0), |t| (t.count, t.cycles))
    }
}

/// Compares the profile of process `pid` with the truth.
pub fn compare(profile: &Profile, truth: &Truth) -> Accuracy {
    let mut sym = truth_symbolizer();
    // Truth per instruction and function, in profile addresses.
    let (insns, funcs) = resolve_truth(&mut sym, truth);
    let mut units = TruthUnits::new(&mut sym, truth, &insns);
    // The profile's process.
    let proc = profile.processes.iter().find(|p| p.pid == truth.pid);
    let empty = Vec::new();
    let pfuncs = proc.map(|p| &p.functions).unwrap_or(&empty);
    let est = Estimates::new(pfuncs, &mut units);
    units.add_unprofiled(&funcs, &est.funcs);
    let func_true: HashMap<Addr, f64> = funcs
        .iter()
        .map(|(k, f)| (k.clone(), f.instructions as f64))
        .collect();
    let (functions, errors, without) = function_accuracy(&funcs, pfuncs);
    let median = median(&errors);
    let paths = proc
        .filter(|p| !p.stacks.is_empty())
        .map(|p| compare_paths(&PathTruth::new(&mut sym, truth), &p.stacks))
        .unwrap_or_default();
    Accuracy {
        overlap_instruction: overlap(&est.insns, &units.insns),
        overlap_block: overlap(&est.blocks, &units.blocks),
        overlap_function: overlap(&est.funcs, &func_true),
        overlap_edge: overlap(&est.edges, &units.edges),
        cpi_error_median: median,
        cpi_error_max: errors.last().copied(),
        functions_without_cpi: without,
        instructions_true: truth.instructions,
        cycles_true: truth.cycles,
        instructions_est: proc.and_then(|p| p.measures.instructions),
        cycles_est: proc.and_then(|p| p.measures.cycles),
        instructions_unknown: truth.unknown_instructions,
        functions,
        overlap_path: paths.overlap,
        path_cpi_error_median: paths.cpi_error_median,
        path_cpi_error_max: paths.cpi_error_max,
        path_cpi_errors_reported_median: paths.errors_reported_median,
        paths_without_cpi: paths.without_cpi,
        paths: paths.paths,
    }
}

/// The truth per unit in profile addresses: what a profile's estimates are compared with.
struct TruthUnits {
    /// Executions per instruction.
    insns: HashMap<Addr, f64>,
    /// Fall-throughs out of each instruction.
    fall_out: HashMap<Addr, u64>,
    /// Executions per block (by its start), of the blocks of either side.
    blocks: HashMap<Addr, f64>,
    /// Traversals per edge, taken and fall-through.
    edges: HashMap<EdgeKey, f64>,
    /// The taken branches' targets per function (by its start): leaders of its blocks.
    targets: HashMap<Addr, Vec<u64>>,
}

impl TruthUnits {
    /// The instructions' truth, and the taken edges' from the trace; blocks and
    /// fall-through edges come with the functions ([`Estimates::new`],
    /// [`TruthUnits::add_unprofiled`]).
    fn new(sym: &mut Symbolizer, truth: &Truth, insns: &HashMap<Addr, InsnTruth>) -> Self {
        let mut units = TruthUnits {
            insns: insns
                .iter()
                .map(|(k, t)| (k.clone(), t.count as f64))
                .collect(),
            fall_out: insns.iter().map(|(k, t)| (k.clone(), t.fall_out)).collect(),
            blocks: HashMap::new(),
            edges: HashMap::new(),
            targets: HashMap::new(),
        };
        let pid = truth.pid;
        for (&(from, to), t) in &truth.taken {
            let (Ok(rf), Ok(rt)) = (
                sym.resolve(pid, &truth.maps, from),
                sym.resolve(pid, &truth.maps, to),
            ) else {
                continue;
            };
            *units
                .edges
                .entry((rf.object_name.clone(), rf.vaddr, rt.vaddr, false))
                .or_default() += t.count as f64;
            units
                .targets
                .entry((rt.object_name.clone(), rt.function.start))
                .or_default()
                .push(rt.vaddr);
        }
        units
    }

    /// The executions of the instruction at `k`.
    fn count(&self, k: &Addr) -> f64 {
        self.insns.get(k).copied().unwrap_or(0.0)
    }

    /// The fall-throughs out of the instruction at `address` of `binary`.
    fn fall_out_of(&self, binary: &str, address: u64) -> u64 {
        self.fall_out
            .get(&(binary.to_string(), address))
            .copied()
            .unwrap_or(0)
    }

    /// The blocks and fall-through edges of the functions the profile does not have
    /// (`profiled`: those it has), from the same CFG builder.
    fn add_unprofiled(&mut self, funcs: &BTreeMap<Addr, FuncTruth>, profiled: &HashMap<Addr, f64>) {
        for (fk, ft) in funcs {
            if profiled.contains_key(fk) {
                continue;
            }
            let Some((bin, func)) = &ft.elf else {
                continue;
            };
            let extra = self.targets.get(fk).cloned().unwrap_or_default();
            let Ok(cfg) = bin.cfg(func, &extra) else {
                continue;
            };
            for b in &cfg.blocks {
                let k = (fk.0.clone(), b.start);
                let c = self.count(&k);
                if c > 0.0 {
                    self.blocks.insert(k, c);
                }
                let last = &cfg.instructions[b.last()];
                if last.kind.falls_through() {
                    let c = self.fall_out_of(&fk.0, last.addr);
                    if c > 0 {
                        self.edges
                            .insert((fk.0.clone(), last.addr, last.next(), true), c as f64);
                    }
                }
            }
        }
    }
}

/// A profile's estimate per unit, in profile addresses.
struct Estimates {
    insns: HashMap<Addr, f64>,
    blocks: HashMap<Addr, f64>,
    edges: HashMap<EdgeKey, f64>,
    funcs: HashMap<Addr, f64>,
}

impl Estimates {
    /// The estimates of the profile's functions `pfuncs`; the truth of their blocks and
    /// fall-through edges goes to `units`.
    fn new(pfuncs: &[FunctionProfile], units: &mut TruthUnits) -> Self {
        let mut est = Estimates {
            insns: HashMap::new(),
            blocks: HashMap::new(),
            edges: HashMap::new(),
            funcs: HashMap::new(),
        };
        for f in pfuncs {
            for l in &f.lines {
                est.insns.insert((f.binary.clone(), l.address), l.count);
            }
            for b in &f.blocks {
                let k = (f.binary.clone(), b.start);
                est.blocks.insert(k.clone(), b.count);
                units.blocks.insert(k.clone(), units.count(&k));
            }
            for e in &f.edges {
                let ft = e.kind == EdgeKind::FallThrough;
                *est.edges
                    .entry((f.binary.clone(), e.from, e.to, ft))
                    .or_default() += e.count;
                if ft {
                    let c = units.fall_out_of(&f.binary, e.from);
                    units
                        .edges
                        .insert((f.binary.clone(), e.from, e.to, true), c as f64);
                }
            }
            est.funcs.insert(
                (f.binary.clone(), f.address),
                f.measures.instructions.unwrap_or(0.0),
            );
        }
        est
    }
}

/// Per-function CPI against the truth `funcs`: the functions worth listing, hottest
/// first; the sorted CPI errors of those with [`CPI_SHARE_FLOOR`] of the cycles; and
/// how many of those have no CPI.
fn function_accuracy(
    funcs: &BTreeMap<Addr, FuncTruth>,
    pfuncs: &[FunctionProfile],
) -> (Vec<FunctionAccuracy>, Vec<f64>, u64) {
    let total_cycles: u64 = funcs.values().map(|f| f.cycles).sum();
    let by_key: HashMap<Addr, &FunctionProfile> = pfuncs
        .iter()
        .map(|f| ((f.binary.clone(), f.address), f))
        .collect();
    let mut functions = Vec::new();
    let mut errors = Vec::new();
    let mut without = 0;
    for (k, ft) in funcs {
        let share = if total_cycles > 0 {
            ft.cycles as f64 / total_cycles as f64
        } else {
            0.0
        };
        let est = by_key.get(k);
        let cpi_true = (ft.instructions > 0).then(|| ft.cycles as f64 / ft.instructions as f64);
        let cpi_est = est.and_then(|f| f.measures.cpi).map(|c| c.value);
        let cpi_error = match (cpi_est, cpi_true) {
            (Some(e), Some(t)) if t > 0.0 => Some((e - t).abs() / t),
            _ => None,
        };
        if share >= CPI_SHARE_FLOOR {
            match cpi_error {
                Some(e) => errors.push(e),
                None => without += 1,
            }
        }
        if share < 0.001 && est.is_none() {
            continue; // keep the list readable: tiny functions nobody sampled
        }
        functions.push(FunctionAccuracy {
            name: est
                .map(|f| f.name.clone())
                .unwrap_or_else(|| ft.name.clone()),
            binary: k.0.clone(),
            address: k.1,
            share,
            instructions_true: ft.instructions,
            instructions_est: est.and_then(|f| f.measures.instructions).unwrap_or(0.0),
            cycles_true: ft.cycles,
            cycles_est: est.and_then(|f| f.measures.cycles).unwrap_or(0.0),
            cpi_true,
            cpi_est,
            cpi_error,
            cpi_rel_error: est.and_then(|f| f.measures.cpi).map(|c| c.rel_error),
            instructions_rel_error: est.and_then(|f| f.measures.instructions_rel_error),
        });
    }
    functions.sort_by(|a, b| b.share.total_cmp(&a.share));
    errors.sort_by(f64::total_cmp);
    (functions, errors, without)
}

/// The median of sorted `v`.
fn median(v: &[f64]) -> Option<f64> {
    let n = v.len();
    (n > 0).then(|| {
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    })
}

/// Exact (instructions, cycles) per call path (function names, leaf first, at most
/// `MAX_USER_FRAMES`): the replay's per-context truth with each return address named
/// by the function of its call instruction (`ret - 1`), as analysis names sampled
/// stacks. The paths [`compare`] judges the profile's by.
pub fn path_truth(truth: &Truth) -> PathTruth {
    PathTruth::new(&mut truth_symbolizer(), truth)
}

/// The per-path part of [`Accuracy`].
#[derive(Debug, Default, PartialEq)]
pub(crate) struct PathComparison {
    /// [`Accuracy::overlap_path`].
    pub overlap: Option<f64>,
    /// [`Accuracy::path_cpi_error_median`].
    pub cpi_error_median: Option<f64>,
    /// [`Accuracy::path_cpi_error_max`].
    pub cpi_error_max: Option<f64>,
    /// [`Accuracy::path_cpi_errors_reported_median`].
    pub errors_reported_median: Option<f64>,
    /// [`Accuracy::paths_without_cpi`].
    pub without_cpi: u64,
    /// [`Accuracy::paths`].
    pub paths: Vec<PathAccuracy>,
}

/// What a path is compared by: a path of the truth, the `[rare callees]` path under
/// a node of the profile's tree ([`PathTree`]), or a profile path the truth lacks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Compared {
    Truth(PathKey),
    Rare(u32),
    Other(Vec<String>),
}

/// The profile's paths root first as a tree of name ids (the truth's, then its own),
/// marking the nodes whose rare callees were folded into a `[rare callees]` path.
struct PathTree<'t> {
    truth: &'t PathTruth,
    extra: HashMap<String, u32>,
    extra_names: Vec<String>,
    /// (parent, name) per node; node 0 is the root (no frame).
    nodes: Vec<(u32, u32)>,
    index: HashMap<(u32, u32), u32>,
    rare: Vec<bool>,
}

impl<'t> PathTree<'t> {
    fn new(truth: &'t PathTruth) -> Self {
        PathTree {
            truth,
            extra: HashMap::new(),
            extra_names: Vec::new(),
            nodes: vec![(0, 0)],
            index: HashMap::new(),
            rare: vec![false],
        }
    }

    fn id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.truth.id(name) {
            return id;
        }
        let next = (self.truth.name_count() + self.extra_names.len()) as u32;
        *self.extra.entry(name.to_string()).or_insert_with(|| {
            self.extra_names.push(name.to_string());
            next
        })
    }

    /// The node of `names` (leaf first), added with its ancestors when new.
    fn insert(&mut self, names: &[&str]) -> u32 {
        let mut at = 0;
        for name in names.iter().rev() {
            let id = self.id(name);
            let next = self.nodes.len() as u32;
            let n = *self.index.entry((at, id)).or_insert(next);
            if n == next {
                self.nodes.push((at, id));
                self.rare.push(false);
            }
            at = n;
        }
        at
    }

    /// Where a truth path of these ids (root first) compares: the `[rare callees]` path
    /// of the deepest node it reaches when that node folded its rare callees and the
    /// path goes on below it, else the path itself.
    fn place(&self, key: PathKey, root_first: &[u32]) -> Compared {
        let mut at = 0;
        for id in root_first {
            match self.index.get(&(at, *id)) {
                Some(&n) => at = n,
                None if self.rare[at as usize] => return Compared::Rare(at),
                None => break,
            }
        }
        Compared::Truth(key)
    }

    /// The names of node `n`, leaf first.
    fn names(&self, mut n: u32) -> Vec<String> {
        let mut out = Vec::new();
        while n != 0 {
            let (parent, id) = self.nodes[n as usize];
            out.push(match (id as usize).checked_sub(self.truth.name_count()) {
                Some(i) => self.extra_names[i].clone(),
                None => self.truth.name(id).to_string(),
            });
            n = parent;
        }
        out
    }
}

/// Compares the profile's call paths `est` with the exact `truth` per path. Profile
/// paths of the same chain of names are summed; their CPI is the sum's, with the
/// largest error any of them reports. A `[rare callees]` path of the profile (the
/// narrow paths it folded under a caller, cpi-user/src/profile/paths.rs `fold_plan`)
/// is compared with the truth's paths that go on below that caller where the profile
/// has no node.
pub(crate) fn compare_paths(truth: &PathTruth, est: &[StackProfile]) -> PathComparison {
    #[derive(Default)]
    struct Est {
        instructions: f64,
        cycles: f64,
        cpi: Option<(f64, f64)>,
        parts: usize,
    }
    let mut tree = PathTree::new(truth);
    let mut by_chain: HashMap<Compared, Est> = HashMap::new();
    for s in est {
        let names: Vec<&str> = s.frames.iter().map(|f| f.function.as_str()).collect();
        let key = match names.split_first() {
            Some((&RARE_FRAME, callers)) => {
                let n = tree.insert(callers);
                tree.rare[n as usize] = true;
                Compared::Rare(n)
            }
            _ => {
                tree.insert(&names);
                match truth.key_of(&names) {
                    Some(k) => Compared::Truth(k),
                    None => Compared::Other(names.iter().map(|n| n.to_string()).collect()),
                }
            }
        };
        let e = by_chain.entry(key).or_default();
        e.instructions += s.instructions.unwrap_or(0.0);
        e.cycles += s.cycles.unwrap_or(0.0);
        e.parts += 1;
        e.cpi = match (e.cpi, s.cpi) {
            (None, Some(c)) if e.parts == 1 => Some((c.value, c.rel_error)),
            (Some((v, r)), Some(c)) => Some((v, r.max(c.rel_error))),
            _ => None,
        };
    }
    for e in by_chain.values_mut() {
        if e.parts > 1 {
            e.cpi = e
                .cpi
                .filter(|_| e.instructions > 0.0)
                .map(|(_, r)| (e.cycles / e.instructions, r));
        }
    }
    let mut exact: HashMap<Compared, (u64, u64)> = HashMap::new();
    let mut ids = Vec::new();
    for (k, v) in truth.keyed() {
        let at = match by_chain.contains_key(&Compared::Truth(k)) {
            true => Compared::Truth(k),
            false => {
                truth.ids_root_first(k, &mut ids);
                tree.place(k, &ids)
            }
        };
        let e = exact.entry(at).or_default();
        e.0 += v.0;
        e.1 += v.1;
    }
    let est_instr: HashMap<&Compared, f64> =
        by_chain.iter().map(|(k, e)| (k, e.instructions)).collect();
    let true_instr: HashMap<&Compared, f64> = exact.iter().map(|(k, t)| (k, t.0 as f64)).collect();
    let total_cycles: u64 = exact.values().map(|t| t.1).sum();
    let mut listed = Vec::new();
    let (mut errors, mut reported, mut without) = (Vec::new(), Vec::new(), 0);
    for (k, &(instructions, cycles)) in &exact {
        let share = if total_cycles > 0 {
            cycles as f64 / total_cycles as f64
        } else {
            0.0
        };
        let e = by_chain.get(k);
        let cpi_true = (instructions > 0).then(|| cycles as f64 / instructions as f64);
        let cpi = e.and_then(|e| e.cpi);
        let cpi_error = match (cpi, cpi_true) {
            (Some((v, _)), Some(t)) if t > 0.0 => Some((v - t).abs() / t),
            _ => None,
        };
        if share >= CPI_SHARE_FLOOR {
            match (cpi, cpi_true) {
                (Some((v, rel)), Some(t)) if t > 0.0 => {
                    let err = (v - t).abs();
                    errors.push(err / t);
                    let bar = rel * v;
                    reported.push(if bar > 0.0 {
                        err / bar
                    } else if err == 0.0 {
                        0.0
                    } else {
                        f64::INFINITY
                    });
                }
                _ => without += 1,
            }
        }
        listed.push((
            k,
            PathAccuracy {
                frames: Vec::new(),
                share,
                instructions_true: instructions,
                instructions_est: e.map_or(0.0, |e| e.instructions),
                cycles_true: cycles,
                cycles_est: e.map_or(0.0, |e| e.cycles),
                cpi_true,
                cpi_est: cpi.map(|c| c.0),
                cpi_error,
                cpi_rel_error: cpi.map(|c| c.1),
            },
        ));
    }
    listed.sort_by(|a, b| {
        (b.1.share.total_cmp(&a.1.share)).then(b.1.instructions_true.cmp(&a.1.instructions_true))
    });
    listed.truncate(PATHS_LISTED);
    let mut paths: Vec<PathAccuracy> = listed
        .into_iter()
        .map(|(k, mut p)| {
            p.frames = match k {
                Compared::Truth(k) => truth.names(*k).into_iter().map(str::to_string).collect(),
                Compared::Rare(n) => std::iter::once(RARE_FRAME.to_string())
                    .chain(tree.names(*n))
                    .collect(),
                Compared::Other(names) => names.clone(),
            };
            p
        })
        .collect();
    paths.sort_by(|a, b| b.share.total_cmp(&a.share).then(a.frames.cmp(&b.frames)));
    errors.sort_by(f64::total_cmp);
    reported.sort_by(f64::total_cmp);
    PathComparison {
        overlap: Some(overlap(&est_instr, &true_instr)),
        cpi_error_median: median(&errors),
        cpi_error_max: errors.last().copied(),
        errors_reported_median: median(&reported),
        without_cpi: without,
        paths,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// propeller_sample_1.bin's `main` before the tracer recorded its `jmp` to the next
    /// instruction: 1.76G instructions of 2.16G and CPI 4.394 of 3.578, each with an error
    /// that rounds to ±0.0 %: both named. Within 4 errors: nothing named.
    #[test]
    fn estimates_beyond_four_of_their_errors_are_misses() {
        let main = FunctionAccuracy {
            name: "main".into(),
            binary: "propeller_sample_1.bin".into(),
            address: 0x1920,
            share: 0.66,
            instructions_true: 2_160_000_029,
            instructions_est: 1_758_716_581.0,
            cycles_true: 7_730_000_000,
            cycles_est: 7_728_000_000.0,
            cpi_true: Some(3.578),
            cpi_est: Some(4.394),
            cpi_error: Some(0.228),
            cpi_rel_error: Some(0.0003),
            instructions_rel_error: Some(0.0004),
        };
        let m = misses(&main);
        assert_eq!(
            m.iter().map(|m| m.what).collect::<Vec<_>>(),
            ["instructions", "CPI"]
        );
        // |4.394 − 3.578| / (0.0003 × 4.394) ≈ 619 errors.
        assert!((m[1].errors - 619.0).abs() < 1.0, "{m:?}");
        let fine = FunctionAccuracy {
            instructions_est: 2_160_000_029.0 * (1.0 + 3.9 * 0.0004),
            cpi_est: Some(3.578 * (1.0 - 3.9 * 0.0003)),
            ..main.clone()
        };
        assert!(misses(&fine).is_empty());
        // An error of 0 that misses is infinitely many errors away; one that hits is not.
        let exact = FunctionAccuracy {
            cpi_rel_error: Some(0.0),
            instructions_rel_error: Some(0.0),
            instructions_est: 2_160_000_029.0,
            ..main
        };
        let m = misses(&exact);
        assert_eq!(m.len(), 1);
        assert!(m[0].what == "CPI" && m[0].errors.is_infinite());
    }

    #[test]
    fn overlap_is_one_for_equal_shapes_and_counts_misses() {
        let a: HashMap<u32, f64> = [(1, 10.0), (2, 30.0)].into();
        let b: HashMap<u32, f64> = [(1, 1.0), (2, 3.0)].into();
        assert!(
            (overlap(&a, &b) - 1.0).abs() < 1e-12,
            "scale does not matter"
        );
        let c: HashMap<u32, f64> = [(1, 1.0), (3, 3.0)].into();
        // p = (.25, .75, 0) vs p̂ = (.25, 0, .75): overlap .25.
        assert!((overlap(&c, &b) - 0.25).abs() < 1e-12);
        assert_eq!(overlap(&HashMap::<u32, f64>::new(), &b), 0.0);
    }

    fn path(
        frames: &[&str],
        instructions: f64,
        cycles: f64,
        cpi: Option<(f64, f64)>,
    ) -> StackProfile {
        use crate::profile::model::{Estimate, StackFrame};
        StackProfile {
            frames: frames
                .iter()
                .map(|f| StackFrame {
                    function: f.to_string(),
                    binary: "/bin/x".into(),
                    address: 0,
                })
                .collect(),
            end: crate::profile::StackEnd::Complete,
            samples: 10,
            branch_samples: 10,
            time_ns: None,
            cycles: Some(cycles),
            instructions: Some(instructions),
            cpi: cpi.map(|(value, rel_error)| Estimate {
                value,
                rel_error,
                samples: 10,
            }),
            cycles_rel_error: None,
            instructions_rel_error: None,
            range_hits: 10,
        }
    }

    fn chain(frames: &[&str]) -> Vec<String> {
        frames.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn paths_compare_by_name_chain_with_reported_errors() {
        // Exact: main;a;leaf 600 instructions at CPI 2, main;b;leaf 300 at CPI 1,
        // main 100 at CPI 1 (cycles: 1200, 300, 100).
        let truth = PathTruth::of(&[
            (&["leaf", "a", "main"], (600, 1200)),
            (&["leaf", "b", "main"], (300, 300)),
            (&["main"], (100, 100)),
        ]);
        let est = [
            // Same shape, CPI 2.2 ± 5 %: 0.1 off, 2 reported errors (0.11 each).
            path(&["leaf", "a", "main"], 6000.0, 13200.0, Some((2.2, 0.05))),
            // Split in two profile paths of one chain: summed.
            path(&["leaf", "b", "main"], 1000.0, 1000.0, Some((1.0, 0.02))),
            path(&["leaf", "b", "main"], 2000.0, 2000.0, Some((1.0, 0.04))),
            // A path the truth does not have.
            path(&["other", "main"], 1000.0, 1000.0, None),
        ];
        let c = compare_paths(&truth, &est);
        // p̂ = (.6, .3, 0, .1) against p = (.6, .3, .1, 0): overlap .9.
        assert!((c.overlap.unwrap() - 0.9).abs() < 1e-12, "{c:?}");
        // Paths with ≥ 2 % of cycles: all three exact ones; main has no estimate.
        assert_eq!(c.without_cpi, 1);
        assert!((c.cpi_error_max.unwrap() - 0.1).abs() < 1e-12);
        assert!((c.cpi_error_median.unwrap() - 0.05).abs() < 1e-12);
        // Reported errors: 0.2 / (0.05 × 2.2) ≈ 1.82 and 0 → median ≈ 0.91.
        let z = c.errors_reported_median.unwrap();
        assert!((z - 0.2 / 0.11 / 2.0).abs() < 1e-9, "{z}");
        let b = c.paths.iter().find(|p| p.frames[1] == "b").unwrap();
        assert_eq!((b.instructions_est, b.cpi_rel_error), (3000.0, Some(0.04)));
        assert_eq!(c.paths[0].frames, chain(&["leaf", "a", "main"]));
        assert!((c.paths[0].share - 0.75).abs() < 1e-12);
        // No estimate at all: no overlap, every checked path without CPI.
        let none = compare_paths(&truth, &[]);
        assert_eq!(none.overlap, Some(0.0));
        assert_eq!(none.without_cpi, 3);
        assert_eq!(none.errors_reported_median, None);
    }
}
