//! `cpi-bpf diff BASE NEW`: which processes and functions changed between two profiles,
//! told from noise by the profiles' own error model (cpi-user/src/profile/error.rs).
//!
//! **Units.** Processes are matched by comm (pids differ between runs; the processes of
//! one comm are summed), functions by comm, the *file name* of their binary and their
//! name (two builds of one program live at different paths), call paths by comm and
//! their chain of function names with recursion folded (cpi-user/src/profile/paths.rs),
//! those with at least 1 % of their process in either profile. Two main processes of
//! different names (one program built twice under two names) are matched with each
//! other and their functions by name (`align`).
//!
//! **Quantities and their errors** (σ: one standard error, as every ± of a profile):
//! * the *amount*: cycles, or cpu-clock time in a time profile. Cycles: σ =
//!   cycles × `cycles_rel_error` (the replicate error). Time: a time profile's n samples
//!   of one period are Poisson, σ = time / √n. Files written before the error model have
//!   no relative error: 1/√samples stands in for it, as it does in their `Estimate`s.
//! * instructions: σ = instructions × `instructions_rel_error` (the same fallback).
//! * CPI = Σcycles / Σinstructions, from two independent samplers: relative σ² = the sum
//!   of the two relative σ² (cpi-user/src/profile/error.rs `quotient`); only where every
//!   process of the comm had a CPI (above the sample floor).
//! * shares of the process total, s = x / X with x part of X: with y = X − x independent
//!   of x, Var s = ((1 − 2s) Var x + s² Var X) / X² (the delta method; binomial
//!   s(1 − s)/N for Poisson counts).
//!
//! A unit found in one profile only counts as 0 ± 0 in the other (its one side's error
//! stays); its CPI is not compared. Processes of one comm sum their values and variances.
//!
//! **Tests.** For each quantity, Δ = new − base and z = Δ / √(σ_base² + σ_new²); its
//! two-sided p-value is from the normal distribution. Each σ is itself estimated (32
//! replicates; a time profile's Poisson σ is exact), so z's true tails are somewhat
//! heavier (Student's t with ≈ 62 degrees of freedom); the replicates also overstate σ
//! for bursty units (cpi-user/src/profile/error.rs), which errs the other way.
//! tests/tests/it/report_diff.rs measures the false-positive rate over 20 seed pairs. The
//! quantities of the chosen [`Basis`] of every process and function are
//! tested together, one family, with the Benjamini–Hochberg procedure at level α: when
//! nothing changed, the chance of flagging anything is at most α; among those flagged,
//! the expected share of false ones is at most α.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::profile::model::{FunctionProfile, Mode, ProcessProfile, Profile, StackProfile};
use crate::profile::paths::folded_paths;

mod align;
pub(crate) mod render;

pub use align::{aligned, Matching, Pairing};
pub use render::render;

/// The default significance level (false discovery rate) of [`diff`].
pub const DEFAULT_ALPHA: f64 = 0.01;

/// Why two profiles cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A time profile against one that counts cycles: no quantity in common.
    #[error(
        "cannot compare a {base} profile with a {new} one: one measures CPU time, the other \
         cycles"
    )]
    Incomparable {
        /// The base profile's mode.
        base: &'static str,
        /// The new profile's mode.
        new: &'static str,
    },
    /// α outside (0, 1).
    #[error("the significance level must be between 0 and 1 (exclusive), not {0}")]
    Alpha(f64),
}

/// Which changes decide significance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// Absolute amounts, instructions and CPI: the same workload run twice.
    Absolute,
    /// Shares of the process total and CPI: runs of different lengths.
    Share,
}

/// How to compare.
#[derive(Clone, Copy, Debug)]
pub struct DiffOptions {
    /// Significance level: the false discovery rate of Benjamini–Hochberg.
    pub alpha: f64,
    /// Which quantities are tested.
    pub basis: Basis,
    /// How processes and functions are matched.
    pub matching: Matching,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            alpha: DEFAULT_ALPHA,
            basis: Basis::Absolute,
            matching: Matching::Auto,
        }
    }
}

/// One quantity of one unit in both profiles.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// The value in the base profile (0 where the unit is absent).
    pub base: f64,
    /// Its standard error.
    pub base_error: f64,
    /// The value in the new profile.
    pub new: f64,
    /// Its standard error.
    pub new_error: f64,
    /// new − base.
    pub delta: f64,
    /// √(base_error² + new_error²).
    pub delta_error: f64,
    /// delta / base; `None` when base is 0.
    pub delta_rel: Option<f64>,
    /// delta / delta_error (0 when both are 0, ±∞ for a change without error; JSON
    /// writes ∞ as null).
    pub z: f64,
    /// Two-sided p-value of z.
    pub p: f64,
    /// Whether the quantity is in the tested family ([`Basis`]).
    pub tested: bool,
    /// Tested and found significant.
    pub significant: bool,
}

impl Change {
    pub(crate) fn new(base: (f64, f64), new: (f64, f64)) -> Change {
        let (b, vb) = base;
        let (n, vn) = new;
        let delta = n - b;
        let delta_error = (vb + vn).max(0.0).sqrt();
        let z = z_score(delta, delta_error);
        Change {
            base: b,
            base_error: vb.max(0.0).sqrt(),
            new: n,
            new_error: vn.max(0.0).sqrt(),
            delta,
            delta_error,
            delta_rel: (b != 0.0).then(|| delta / b),
            z,
            p: p_value(z),
            tested: false,
            significant: false,
        }
    }
}

/// What a unit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitKind {
    /// A process (all processes of one comm).
    Process,
    /// A function of a comm's processes.
    Function,
    /// A call path of a comm's processes (recursion folded, paths of the same chain of
    /// names summed), named leaf first: `leaf ← caller ← … ← root`.
    Path,
}

impl UnitKind {
    /// The order of the table's sections.
    fn rank(self) -> u8 {
        match self {
            UnitKind::Process => 0,
            UnitKind::Function => 1,
            UnitKind::Path => 2,
        }
    }
}

/// One process or function in both profiles.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnitDiff {
    /// Process or function.
    pub kind: UnitKind,
    /// The function's name, or the process's comm.
    pub name: String,
    /// The comm the unit belongs to.
    pub comm: String,
    /// The file name of the function's binary (a path's leaf's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
    /// In the base profile.
    pub in_base: bool,
    /// In the new profile.
    pub in_new: bool,
    /// Any tested quantity significant.
    pub significant: bool,
    /// By quantity: `cycles` or `time_ns`, `instructions`, `cpi`, and the shares of the
    /// process total `cycles_share` or `time_ns_share`, `instructions_share`.
    #[serde(flatten)]
    pub changes: BTreeMap<&'static str, Change>,
}

impl UnitDiff {
    /// The tested change with the smallest p-value (the table's row).
    pub(crate) fn headline(&self) -> Option<(&'static str, &Change)> {
        self.changes
            .iter()
            .filter(|(_, c)| c.tested)
            .min_by(|a, b| {
                a.1.p
                    .total_cmp(&b.1.p)
                    .then(b.1.z.abs().total_cmp(&a.1.z.abs()))
            })
            .map(|(k, c)| (*k, c))
    }

    /// Nothing on either side: every quantity 0 → 0 (a function without cycles or
    /// instructions in either profile); the tables leave it out.
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.values().all(|c| c.base == 0.0 && c.new == 0.0)
    }

    fn size(&self, amount: &str) -> f64 {
        self.changes.get(amount).map_or(0.0, |c| c.base.max(c.new))
    }
}

/// The comparison of two profiles.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diff {
    /// The base profile's mode.
    pub base_mode: Mode,
    /// The new profile's mode.
    pub new_mode: Mode,
    /// The amount compared: `cycles` or `time_ns`.
    pub amount: &'static str,
    /// The significance level (false discovery rate).
    pub alpha: f64,
    /// Which quantities were tested.
    pub basis: Basis,
    /// How many tests the family held.
    pub tests: usize,
    /// How many were significant.
    pub significant: usize,
    /// The main processes matched with each other despite their names, if any: their
    /// functions matched by name (the module `align`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pairing: Option<Pairing>,
    /// Processes, then functions; each significant first, then by |z|, then by size.
    pub units: Vec<UnitDiff>,
}

/// A value and its variance.
type Var = (f64, f64);

fn add(a: &mut Var, b: Var) {
    a.0 += b.0;
    a.1 += b.1;
}

/// The variance of `value` with relative error `rel`, or 1/√samples where the file has
/// none (files before the error model).
pub(crate) fn variance(value: f64, rel: Option<f64>, samples: u64) -> f64 {
    let rel = rel.unwrap_or(1.0 / (samples.max(1) as f64).sqrt());
    (value * rel).powi(2)
}

/// One unit's sums in one profile.
#[derive(Default, Clone, Copy)]
struct Sums {
    amount: Var,
    instructions: Option<Var>,
    cycles: Option<Var>,
    /// Every part had a CPI above the floor.
    cpi_ok: bool,
}

impl Sums {
    /// The sums of one process or function: amount, instructions and cycles with
    /// their variances.
    fn of(time: bool, u: UnitFields) -> Sums {
        let cycles = u
            .cycles
            .map(|c| (c, variance(c, u.cycles_rel_error, u.samples)));
        let amount = if time {
            let t = u.time_ns.unwrap_or(0.0);
            // Poisson: n samples of equal weight, Var = n w² = t² / n.
            (
                t,
                if u.samples > 0 {
                    t * t / u.samples as f64
                } else {
                    0.0
                },
            )
        } else {
            cycles.unwrap_or_default()
        };
        Sums {
            amount,
            instructions: u
                .instructions
                .map(|i| (i, variance(i, u.instructions_rel_error, u.samples))),
            cycles,
            cpi_ok: u.has_cpi,
        }
    }

    fn merge(&mut self, o: Sums) {
        add(&mut self.amount, o.amount);
        let both = |a: &mut Option<Var>, b: Option<Var>| match (a.as_mut(), b) {
            (Some(x), Some(y)) => add(x, y),
            _ => *a = None,
        };
        both(&mut self.instructions, o.instructions);
        both(&mut self.cycles, o.cycles);
        self.cpi_ok &= o.cpi_ok;
    }

    /// CPI and its variance: the quotient rule for independent samplers.
    fn cpi(&self) -> Option<Var> {
        let ((c, vc), (i, vi)) = (self.cycles?, self.instructions?);
        if !self.cpi_ok || c <= 0.0 || i <= 0.0 {
            return None;
        }
        let r = c / i;
        Some((r, r * r * (vc / (c * c) + vi / (i * i))))
    }
}

/// The fields [`Sums::of`] reads, common to processes, functions and call paths (the
/// HTML report's frames read them too).
pub(crate) struct UnitFields {
    pub(crate) samples: u64,
    pub(crate) time_ns: Option<f64>,
    pub(crate) cycles: Option<f64>,
    pub(crate) instructions: Option<f64>,
    pub(crate) cycles_rel_error: Option<f64>,
    pub(crate) instructions_rel_error: Option<f64>,
    /// The unit has a CPI of its own (above its floor, not withheld).
    pub(crate) has_cpi: bool,
}

impl From<&ProcessProfile> for UnitFields {
    fn from(p: &ProcessProfile) -> Self {
        UnitFields {
            samples: p.samples,
            time_ns: p.measures.time_ns,
            cycles: p.measures.cycles,
            instructions: p.measures.instructions,
            cycles_rel_error: p.measures.cycles_rel_error,
            instructions_rel_error: p.measures.instructions_rel_error,
            has_cpi: p.measures.cpi.is_some(),
        }
    }
}

impl From<&StackProfile> for UnitFields {
    fn from(s: &StackProfile) -> Self {
        UnitFields {
            samples: s.samples,
            time_ns: s.time_ns,
            cycles: s.cycles,
            instructions: s.instructions,
            cycles_rel_error: s.cycles_rel_error,
            instructions_rel_error: s.instructions_rel_error,
            has_cpi: s.cpi.is_some(),
        }
    }
}

impl From<&FunctionProfile> for UnitFields {
    fn from(f: &FunctionProfile) -> Self {
        UnitFields {
            samples: f.samples,
            time_ns: f.measures.time_ns,
            cycles: f.measures.cycles,
            instructions: f.measures.instructions,
            cycles_rel_error: f.measures.cycles_rel_error,
            instructions_rel_error: f.measures.instructions_rel_error,
            has_cpi: f.measures.cpi.is_some(),
        }
    }
}

/// A function's key within its comm: (binary file name, name).
type FnKey = (String, String);

/// One comm's sums in one profile.
#[derive(Default)]
struct CommSums {
    process: Option<Sums>,
    functions: BTreeMap<FnKey, Sums>,
    /// Call paths by their name (leaf first), with the leaf's binary file name.
    paths: BTreeMap<String, (String, Sums)>,
}

fn merge_into(slot: &mut Option<Sums>, s: Sums) {
    match slot {
        Some(x) => x.merge(s),
        None => *slot = Some(s),
    }
}

/// Every comm of `p` with its process and function sums.
fn sums(p: &Profile, time: bool) -> BTreeMap<String, CommSums> {
    let mut out: BTreeMap<String, CommSums> = BTreeMap::new();
    for proc in &p.processes {
        let c = out.entry(proc.comm.clone()).or_default();
        merge_into(&mut c.process, Sums::of(time, proc.into()));
        for f in &proc.functions {
            let key = (file_name(&f.binary).to_string(), f.name.clone());
            let mut slot = c.functions.remove(&key);
            merge_into(&mut slot, Sums::of(time, f.into()));
            c.functions.insert(key, slot.expect("just merged"));
        }
        let floor = crate::profile::AnalysisOptions::default().sample_floor;
        for path in folded_paths(&proc.stacks, floor) {
            let name: Vec<&str> = path.frames.iter().map(|f| f.function.as_str()).collect();
            let leaf = path.frames.first().map_or("", |f| file_name(&f.binary));
            let sums = Sums::of(time, (&path).into());
            match c.paths.get_mut(&name.join(" ← ")) {
                Some((_, s)) => s.merge(sums),
                None => {
                    c.paths.insert(name.join(" ← "), (leaf.to_string(), sums));
                }
            }
        }
    }
    out
}

/// Paths with less than this share of their process (in both profiles) are not tested:
/// each test costs the others power, and a path that small is in its function's row.
const PATH_MIN_SHARE: f64 = 0.01;

/// The paths of one comm worth testing: at least [`PATH_MIN_SHARE`] of the process in
/// either profile.
fn paths_to_test<'a>(cb: Option<&'a CommSums>, cn: Option<&'a CommSums>) -> Vec<&'a String> {
    let big = |c: Option<&'a CommSums>| {
        c.into_iter().flat_map(move |c| {
            let total = c.process.map_or(0.0, |p| p.amount.0);
            c.paths
                .iter()
                .filter(move |(_, (_, s))| s.amount.0 >= PATH_MIN_SHARE * total)
                .map(|(k, _)| k)
        })
    };
    let keys: std::collections::BTreeSet<&String> = big(cb).chain(big(cn)).collect();
    keys.into_iter().collect()
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Compares `base` with `new` (see the module documentation for the method).
pub fn diff(base: &Profile, new: &Profile, opts: &DiffOptions) -> Result<Diff, DiffError> {
    if !(opts.alpha > 0.0 && opts.alpha < 1.0) {
        return Err(DiffError::Alpha(opts.alpha));
    }
    let time = base.mode == Mode::TimeProfile;
    if time != (new.mode == Mode::TimeProfile) {
        return Err(DiffError::Incomparable {
            base: base.mode.name(),
            new: new.mode.name(),
        });
    }
    let amount = if time { "time_ns" } else { "cycles" };
    let pairing = align::pair(base, new, opts.matching);
    let (base, new) = aligned(base, new, pairing.as_ref());
    let (b, n) = (sums(&base, time), sums(&new, time));
    let mut units = Vec::new();
    let comms: std::collections::BTreeSet<&String> = b.keys().chain(n.keys()).collect();
    for comm in comms {
        let (cb, cn) = (b.get(comm), n.get(comm));
        let totals = (cb.and_then(|c| c.process), cn.and_then(|c| c.process));
        units.push(unit(UnitKind::Process, comm, None, totals, None, amount));
        let keys: std::collections::BTreeSet<&FnKey> = cb
            .iter()
            .chain(cn.iter())
            .flat_map(|c| c.functions.keys())
            .collect();
        for key in keys {
            let pair = (
                cb.and_then(|c| c.functions.get(key).copied()),
                cn.and_then(|c| c.functions.get(key).copied()),
            );
            let name = (key.1.as_str(), comm.as_str());
            units.push(unit(
                UnitKind::Function,
                name.0,
                Some((name.1, &key.0)),
                pair,
                Some(totals),
                amount,
            ));
        }
        for key in paths_to_test(cb, cn) {
            let (b_, n_) = (
                cb.and_then(|c| c.paths.get(key)),
                cn.and_then(|c| c.paths.get(key)),
            );
            let leaf = b_.or(n_).map_or("", |(l, _)| l.as_str());
            units.push(unit(
                UnitKind::Path,
                key,
                Some((comm.as_str(), leaf)),
                (b_.map(|p| p.1), n_.map(|p| p.1)),
                Some(totals),
                amount,
            ));
        }
    }
    let tests = test(&mut units, opts);
    units.sort_by(|x, y| {
        let z = |u: &UnitDiff| u.headline().map_or(0.0, |(_, c)| c.z.abs());
        x.kind
            .rank()
            .cmp(&y.kind.rank())
            .then(y.significant.cmp(&x.significant))
            .then(z(y).total_cmp(&z(x)))
            .then(y.size(amount).total_cmp(&x.size(amount)))
    });
    Ok(Diff {
        base_mode: base.mode,
        new_mode: new.mode,
        amount,
        alpha: opts.alpha,
        basis: opts.basis,
        tests,
        significant: units.iter().filter(|u| u.significant).count(),
        pairing,
        units,
    })
}

/// One unit's changes; `totals` (its process in each profile) for the shares.
fn unit(
    kind: UnitKind,
    name: &str,
    function_of: Option<(&str, &str)>,
    (b, n): (Option<Sums>, Option<Sums>),
    totals: Option<(Option<Sums>, Option<Sums>)>,
    amount: &'static str,
) -> UnitDiff {
    let (bs, ns) = (b.unwrap_or_default(), n.unwrap_or_default());
    let mut changes = BTreeMap::new();
    changes.insert(amount, Change::new(bs.amount, ns.amount));
    // An absent unit has no instructions: 0 ± 0, when the other side has them.
    let instr = |s: &Option<Sums>, other: &Option<Sums>| match s {
        Some(s) => s.instructions,
        None => other.and_then(|o| o.instructions).map(|_| (0.0, 0.0)),
    };
    let instructions = instr(&b, &n).zip(instr(&n, &b));
    if let Some((ib, in_)) = instructions {
        changes.insert("instructions", Change::new(ib, in_));
    }
    if let (Some(cb), Some(cn)) = (b.and_then(|s| s.cpi()), n.and_then(|s| s.cpi())) {
        changes.insert("cpi", Change::new(cb, cn));
    }
    if let Some((tb, tn)) = totals {
        let share = |x: Var, t: Option<Sums>, pick: fn(&Sums) -> Option<Var>| {
            t.and_then(|t| pick(&t))
                .map_or((0.0, 0.0), |tot| share_of(x, tot))
        };
        let sa = |s: &Sums| Some(s.amount);
        let a_share = Change::new(share(bs.amount, tb, sa), share(ns.amount, tn, sa));
        changes.insert(
            if amount == "cycles" {
                "cycles_share"
            } else {
                "time_ns_share"
            },
            a_share,
        );
        if let Some((ib, in_)) = instructions {
            let si = |s: &Sums| s.instructions;
            changes.insert(
                "instructions_share",
                Change::new(share(ib, tb, si), share(in_, tn, si)),
            );
        }
    }
    UnitDiff {
        kind,
        name: name.to_string(),
        comm: function_of.map_or(name, |f| f.0).to_string(),
        binary: function_of.map(|f| f.1.to_string()),
        in_base: b.is_some(),
        in_new: n.is_some(),
        significant: false,
        changes,
    }
}

/// x / X and its variance, x part of X (see the module documentation).
pub(crate) fn share_of((x, vx): Var, (t, vt): Var) -> Var {
    if t <= 0.0 {
        return (0.0, 0.0);
    }
    let s = x / t;
    (s, ((1.0 - 2.0 * s) * vx + s * s * vt).max(0.0) / (t * t))
}

/// Marks the tested quantities of `units` and the significant ones; the family's size.
fn test(units: &mut [UnitDiff], opts: &DiffOptions) -> usize {
    let tested = |k: &str| match opts.basis {
        Basis::Absolute => matches!(k, "cycles" | "time_ns" | "instructions" | "cpi"),
        Basis::Share => k == "cpi" || k.ends_with("_share"),
    };
    let mut family: Vec<&mut Change> = units
        .iter_mut()
        .flat_map(|u| u.changes.iter_mut())
        .filter(|(k, _)| tested(k))
        .map(|(_, c)| c)
        .collect();
    let p: Vec<f64> = family.iter().map(|c| c.p).collect();
    for (c, s) in family.iter_mut().zip(benjamini_hochberg(&p, opts.alpha)) {
        c.tested = true;
        c.significant = s;
    }
    for u in units.iter_mut() {
        u.significant = u.changes.values().any(|c| c.significant);
    }
    p.len()
}

/// z = Δ / σ: 0 for no change, ±∞ for a change without error.
pub(crate) fn z_score(delta: f64, sigma: f64) -> f64 {
    if delta == 0.0 {
        0.0
    } else if sigma > 0.0 {
        delta / sigma
    } else {
        f64::INFINITY.copysign(delta)
    }
}

/// Two-sided p-value of a standard normal z: erfc(|z| / √2).
pub(crate) fn p_value(z: f64) -> f64 {
    erfc(z.abs() / std::f64::consts::SQRT_2)
}

/// The complementary error function, to a relative error below 1.2·10⁻⁷ (Chebyshev
/// fit: Press et al., *Numerical Recipes*, `erfcc`).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| c + t * acc);
    let r = t * (-z * z + poly).exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Benjamini–Hochberg at false discovery rate `alpha`: with p sorted ascending, the
/// largest k with p₍ₖ₎ ≤ k·α/m, and every test with p ≤ p₍ₖ₎ is a discovery.
pub(crate) fn benjamini_hochberg(p: &[f64], alpha: f64) -> Vec<bool> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let k = (0..m)
        .rev()
        .find(|&i| p[order[i]] <= (i + 1) as f64 * alpha / m as f64)
        .map_or(0, |i| i + 1);
    let mut out = vec![false; m];
    order[..k].iter().for_each(|&i| out[i] = true);
    out
}

#[cfg(test)]
mod tests;
