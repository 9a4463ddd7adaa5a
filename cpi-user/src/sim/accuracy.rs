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

use std::collections::{BTreeMap, HashMap};

use super::replay::{InsnTruth, Truth};
use crate::binary::{CodeObject, Symbolizer, SymbolizerOptions};
pub use crate::profile::model::{Accuracy, FunctionAccuracy};
use crate::profile::model::{EdgeKind, Profile};

/// Functions below this share of the truth's cycles are left out of the CPI error.
pub const CPI_SHARE_FLOOR: f64 = 0.02;

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
            f.name = crate::binary::demangle(&r.function.name).into_owned();
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
pub struct TruthByAddress(HashMap<Addr, InsnTruth>);

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
    let pid = truth.pid;
    // Truth per instruction and function, in profile addresses.
    let (insns, funcs) = resolve_truth(&mut sym, truth);
    let insn_true: HashMap<Addr, f64> = insns
        .iter()
        .map(|(k, t)| (k.clone(), t.count as f64))
        .collect();
    let fall_out: HashMap<Addr, u64> = insns.iter().map(|(k, t)| (k.clone(), t.fall_out)).collect();
    let mut edge_true: HashMap<EdgeKey, f64> = HashMap::new();
    let mut targets: HashMap<Addr, Vec<u64>> = HashMap::new();
    for (&(from, to), t) in &truth.taken {
        let (Ok(rf), Ok(rt)) = (
            sym.resolve(pid, &truth.maps, from),
            sym.resolve(pid, &truth.maps, to),
        ) else {
            continue;
        };
        *edge_true
            .entry((rf.object_name.clone(), rf.vaddr, rt.vaddr, false))
            .or_default() += t.count as f64;
        targets
            .entry((rt.object_name.clone(), rt.function.start))
            .or_default()
            .push(rt.vaddr);
    }
    let total_cycles: u64 = funcs.values().map(|f| f.cycles).sum();

    // The profile's process.
    let proc = profile.processes.iter().find(|p| p.pid == pid);
    let empty = Vec::new();
    let pfuncs = proc.map(|p| &p.functions).unwrap_or(&empty);
    let mut insn_est: HashMap<Addr, f64> = HashMap::new();
    let mut block_est: HashMap<Addr, f64> = HashMap::new();
    let mut block_true: HashMap<Addr, f64> = HashMap::new();
    let mut edge_est: HashMap<EdgeKey, f64> = HashMap::new();
    let mut func_est: HashMap<Addr, f64> = HashMap::new();
    let truth_count = |k: &Addr| insn_true.get(k).copied().unwrap_or(0.0);
    for f in pfuncs {
        for l in &f.lines {
            insn_est.insert((f.binary.clone(), l.address), l.count);
        }
        for b in &f.blocks {
            let k = (f.binary.clone(), b.start);
            block_est.insert(k.clone(), b.count);
            block_true.insert(k.clone(), truth_count(&k));
        }
        for e in &f.edges {
            let ft = e.kind == EdgeKind::FallThrough;
            *edge_est
                .entry((f.binary.clone(), e.from, e.to, ft))
                .or_default() += e.count;
            if ft {
                let c = fall_out
                    .get(&(f.binary.clone(), e.from))
                    .copied()
                    .unwrap_or(0);
                edge_true.insert((f.binary.clone(), e.from, e.to, true), c as f64);
            }
        }
        func_est.insert((f.binary.clone(), f.address), f.instructions.unwrap_or(0.0));
    }
    // Functions the profile does not have: their blocks and fall-through edges, from
    // the same CFG builder.
    for (fk, ft) in &funcs {
        if func_est.contains_key(fk) {
            continue;
        }
        let Some((bin, func)) = &ft.elf else {
            continue;
        };
        let extra = targets.get(fk).cloned().unwrap_or_default();
        let Ok(cfg) = bin.cfg(func, &extra) else {
            continue;
        };
        for b in &cfg.blocks {
            let k = (fk.0.clone(), b.start);
            let c = truth_count(&k);
            if c > 0.0 {
                block_true.insert(k, c);
            }
            let last = &cfg.instructions[b.last()];
            if last.kind.falls_through() {
                let c = fall_out
                    .get(&(fk.0.clone(), last.addr))
                    .copied()
                    .unwrap_or(0);
                if c > 0 {
                    edge_true.insert((fk.0.clone(), last.addr, last.next(), true), c as f64);
                }
            }
        }
    }
    let func_true: HashMap<Addr, f64> = funcs
        .iter()
        .map(|(k, f)| (k.clone(), f.instructions as f64))
        .collect();

    // Per-function CPI.
    let by_key: HashMap<Addr, &crate::profile::model::FunctionProfile> = pfuncs
        .iter()
        .map(|f| ((f.binary.clone(), f.address), f))
        .collect();
    let mut functions = Vec::new();
    let mut errors = Vec::new();
    let mut without = 0;
    for (k, ft) in &funcs {
        let share = if total_cycles > 0 {
            ft.cycles as f64 / total_cycles as f64
        } else {
            0.0
        };
        let est = by_key.get(k);
        let cpi_true = (ft.instructions > 0).then(|| ft.cycles as f64 / ft.instructions as f64);
        let cpi_est = est.and_then(|f| f.cpi).map(|c| c.value);
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
            instructions_est: est.and_then(|f| f.instructions).unwrap_or(0.0),
            cycles_true: ft.cycles,
            cycles_est: est.and_then(|f| f.cycles).unwrap_or(0.0),
            cpi_true,
            cpi_est,
            cpi_error,
            cpi_rel_error: est.and_then(|f| f.cpi).map(|c| c.rel_error),
        });
    }
    functions.sort_by(|a, b| b.share.total_cmp(&a.share));
    errors.sort_by(f64::total_cmp);
    let median = (!errors.is_empty()).then(|| {
        let n = errors.len();
        if n % 2 == 1 {
            errors[n / 2]
        } else {
            (errors[n / 2 - 1] + errors[n / 2]) / 2.0
        }
    });
    Accuracy {
        overlap_instruction: overlap(&insn_est, &insn_true),
        overlap_block: overlap(&block_est, &block_true),
        overlap_function: overlap(&func_est, &func_true),
        overlap_edge: overlap(&edge_est, &edge_true),
        cpi_error_median: median,
        cpi_error_max: errors.last().copied(),
        functions_without_cpi: without,
        instructions_true: truth.instructions,
        cycles_true: truth.cycles,
        instructions_est: proc.and_then(|p| p.instructions),
        cycles_est: proc.and_then(|p| p.cycles),
        functions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
