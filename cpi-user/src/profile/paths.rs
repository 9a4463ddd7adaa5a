//! Call paths of a profile ([`StackProfile`]): their order and bound in the file, and
//! the call tree read from them (inclusive and self totals per node, the paths into a
//! function). Analysis (cpi-user/src/profile/analyze.rs) and merging
//! (cpi-user/src/profile/merge.rs) bound the list; the reports read the tree.
//!
//! A node of the call tree is a path from the root (outermost frame) down to some
//! frame. Its **self** totals are those of the profile's paths that end there; its
//! **inclusive** totals those of every path through it. Errors: paths are summed as
//! independent estimates (variances add), the same rule merging windows follows; CPI =
//! Σ cycles / Σ instructions with rel² = rel²(cycles) + rel²(instructions)
//! (cpi-user/src/profile/error.rs), backed by the scarcer of the cycle samples and the
//! range occurrences.

use std::collections::HashMap;

use super::analyze::estimate;
use super::error;
use super::model::{Estimate, StackFrame, StackProfile};
use super::stack::StackEnd;

/// Most paths a process keeps in the profile file.
pub const MAX_PATHS: usize = 1000;

/// The frame of the path holding what no listed path does: stacks evicted by the memory
/// bound (cpi-user/src/profile/stack.rs) and paths past [`MAX_PATHS`].
pub const DROPPED_FRAME: &str = "[dropped]";

/// The frame of the path holding the samples that carried no stack.
pub const NO_STACK_FRAME: &str = "[no stack]";

/// A one-frame pseudo path named `name` (`[dropped]`, `[no stack]`).
pub fn pseudo_path(name: &str) -> StackProfile {
    StackProfile {
        frames: vec![StackFrame {
            function: name.to_string(),
            binary: String::new(),
            address: 0,
        }],
        end: StackEnd::Truncated,
        samples: 0,
        branch_samples: 0,
        time_ns: None,
        cycles: None,
        instructions: None,
        cpi: None,
        cycles_rel_error: None,
        instructions_rel_error: None,
        range_hits: 0,
    }
}

/// What a path weighs in orderings: cycles, else time, else samples.
pub fn weight(s: &StackProfile) -> f64 {
    s.cycles.or(s.time_ns).unwrap_or(s.samples as f64)
}

/// Hottest first, then by frames so equal paths sort the same on every run.
pub fn hottest_path_first(a: &StackProfile, b: &StackProfile) -> std::cmp::Ordering {
    weight(b)
        .total_cmp(&weight(a))
        .then(b.samples.cmp(&a.samples))
        .then_with(|| key(a).cmp(&key(b)))
}

/// A path's identity: its chain of (function, binary), leaf first.
pub fn key(s: &StackProfile) -> Vec<(&str, &str)> {
    s.frames
        .iter()
        .map(|f| (f.function.as_str(), f.binary.as_str()))
        .collect()
}

/// [`key`] owned, of a path's frames (what paths are summed by).
pub type PathKey = Vec<(String, String)>;

/// The [`PathKey`] of `frames`.
pub fn frames_key(frames: &[StackFrame]) -> PathKey {
    frames
        .iter()
        .map(|f| (f.function.clone(), f.binary.clone()))
        .collect()
}

/// Sums of paths as independent estimates.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PathTotals {
    /// IP samples.
    pub samples: u64,
    /// Branch samples.
    pub branch_samples: u64,
    /// cpu-clock ns.
    pub time_ns: Option<f64>,
    /// Cycles.
    pub cycles: Option<f64>,
    /// Instructions.
    pub instructions: Option<f64>,
    /// Variance of `cycles`.
    pub cycles_var: f64,
    /// Variance of `instructions`.
    pub instructions_var: f64,
    /// Range occurrences.
    pub range_hits: u64,
    /// The end of the first path that did not end `Complete`, else `Complete`.
    pub end: StackEnd,
}

fn add_opt(a: &mut Option<f64>, b: Option<f64>) {
    if let Some(b) = b {
        *a.get_or_insert(0.0) += b;
    }
}

fn var_of(v: Option<f64>, rel: Option<f64>) -> f64 {
    match (v, rel) {
        (Some(v), Some(r)) => (v * r).powi(2),
        _ => 0.0,
    }
}

impl PathTotals {
    /// What the sums weigh in orderings and shares: cycles, else time, else samples.
    pub fn weight(&self) -> f64 {
        self.cycles.or(self.time_ns).unwrap_or(self.samples as f64)
    }

    /// Adds one path.
    pub fn add(&mut self, s: &StackProfile) {
        self.samples = self.samples.saturating_add(s.samples);
        self.branch_samples = self.branch_samples.saturating_add(s.branch_samples);
        add_opt(&mut self.time_ns, s.time_ns);
        add_opt(&mut self.cycles, s.cycles);
        add_opt(&mut self.instructions, s.instructions);
        self.cycles_var += var_of(s.cycles, s.cycles_rel_error);
        self.instructions_var += var_of(s.instructions, s.instructions_rel_error);
        self.range_hits = self.range_hits.saturating_add(s.range_hits);
        if self.end == StackEnd::Complete {
            self.end = s.end;
        }
    }

    /// Relative standard error of the cycles.
    pub fn cycles_rel_error(&self) -> Option<f64> {
        self.cycles.map(|c| error::relative(c, self.cycles_var))
    }

    /// Relative standard error of the instructions.
    pub fn instructions_rel_error(&self) -> Option<f64> {
        self.instructions
            .map(|i| error::relative(i, self.instructions_var))
    }

    /// CPI of the sums; `None` below `floor` or without cycles and instructions.
    pub fn cpi(&self, floor: u64) -> Option<Estimate> {
        let (c, i) = (self.cycles?, self.instructions?);
        let rel = error::quotient(self.cycles_rel_error()?, self.instructions_rel_error()?);
        estimate(c, i, rel, self.samples.min(self.range_hits), floor)
    }

    /// The sums as a path of `frames`, its CPI recomputed.
    pub fn into_path(self, frames: Vec<StackFrame>, floor: u64) -> StackProfile {
        StackProfile {
            frames,
            end: self.end,
            samples: self.samples,
            branch_samples: self.branch_samples,
            time_ns: self.time_ns,
            cycles: self.cycles,
            instructions: self.instructions,
            cpi: self.cpi(floor),
            cycles_rel_error: self.cycles_rel_error(),
            instructions_rel_error: self.instructions_rel_error(),
            range_hits: self.range_hits,
        }
    }
}

/// Orders `paths` hottest first and keeps [`MAX_PATHS`] (the `[dropped]` path, if any,
/// among them): the rest are summed into the `[dropped]` path.
pub fn bound_paths(paths: &mut Vec<StackProfile>, floor: u64) {
    paths.sort_by(hottest_path_first);
    let is_dropped =
        |s: &StackProfile| s.frames.len() == 1 && s.frames[0].function == DROPPED_FRAME;
    if paths.len() <= MAX_PATHS {
        return;
    }
    let mut dropped = PathTotals::default();
    let mut kept = Vec::with_capacity(MAX_PATHS);
    for s in paths.drain(..) {
        if kept.len() < MAX_PATHS - 1 && !is_dropped(&s) {
            kept.push(s);
        } else {
            dropped.add(&s);
        }
    }
    kept.push(dropped.into_path(pseudo_path(DROPPED_FRAME).frames, floor));
    kept.sort_by(hottest_path_first);
    *paths = kept;
}

/// One node of the call tree.
#[derive(Clone, Debug, PartialEq)]
pub struct PathNode {
    /// The path from the root down to the node, root first.
    pub path: Vec<StackFrame>,
    /// Paths through the node.
    pub inclusive: PathTotals,
    /// Paths ending at the node.
    pub own: PathTotals,
    /// Distinct callees below the node ([`call_tree`] only).
    pub children: usize,
}

impl PathNode {
    /// The node's function.
    pub fn function(&self) -> &str {
        self.path.last().map_or("", |f| f.function.as_str())
    }
}

fn node_order(a: &PathNode, b: &PathNode) -> std::cmp::Ordering {
    b.inclusive
        .weight()
        .total_cmp(&a.inclusive.weight())
        .then(a.path.len().cmp(&b.path.len()))
        .then_with(|| {
            let k = |n: &PathNode| {
                n.path
                    .iter()
                    .map(|f| (f.function.clone(), f.binary.clone()))
                    .collect::<Vec<_>>()
            };
            k(a).cmp(&k(b))
        })
}

/// Every node of the call tree of `paths`, hottest (inclusive) first.
pub fn call_tree(paths: &[StackProfile]) -> Vec<PathNode> {
    let mut nodes: Vec<PathNode> = Vec::new();
    let mut index: HashMap<Vec<(&str, &str)>, usize> = HashMap::new();
    for s in paths {
        let root_first: Vec<&StackFrame> = s.frames.iter().rev().collect();
        let mut parent: Option<usize> = None;
        for depth in 1..=root_first.len() {
            let k: Vec<(&str, &str)> = root_first[..depth]
                .iter()
                .map(|f| (f.function.as_str(), f.binary.as_str()))
                .collect();
            let i = match index.get(&k) {
                Some(&i) => i,
                None => {
                    nodes.push(PathNode {
                        path: root_first[..depth].iter().map(|f| (*f).clone()).collect(),
                        inclusive: PathTotals::default(),
                        own: PathTotals::default(),
                        children: 0,
                    });
                    if let Some(p) = parent {
                        nodes[p].children += 1;
                    }
                    index.insert(k, nodes.len() - 1);
                    nodes.len() - 1
                }
            };
            parent = Some(i);
            nodes[i].inclusive.add(s);
            if depth == root_first.len() {
                nodes[i].own.add(s);
            }
        }
    }
    nodes.sort_by(node_order);
    nodes
}

/// The paths into `function` (root down to its outermost call on each path), with the
/// totals of everything under it there, hottest first.
pub fn callers(paths: &[StackProfile], function: &str) -> Vec<PathNode> {
    let mut nodes: Vec<PathNode> = Vec::new();
    for s in paths {
        let root_first: Vec<&StackFrame> = s.frames.iter().rev().collect();
        let Some(at) = root_first.iter().position(|f| f.function == function) else {
            continue;
        };
        let path: Vec<StackFrame> = root_first[..=at].iter().map(|f| (*f).clone()).collect();
        // One row per chain of names: the same chain through other call sites (other
        // return addresses) printed as identical rows (`--callers main`: three of them).
        let same_names = |n: &PathNode| {
            n.path.len() == path.len()
                && n.path
                    .iter()
                    .zip(&path)
                    .all(|(a, b)| a.function == b.function)
        };
        let i = match nodes.iter().position(same_names) {
            Some(i) => i,
            None => {
                nodes.push(PathNode {
                    path,
                    inclusive: PathTotals::default(),
                    own: PathTotals::default(),
                    children: 0,
                });
                nodes.len() - 1
            }
        };
        nodes[i].inclusive.add(s);
        if at + 1 == root_first.len() {
            nodes[i].own.add(s);
        }
    }
    nodes.sort_by(node_order);
    nodes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A path of `names` (leaf first) with `samples`, cycles and instructions.
    pub(crate) fn path(
        names: &[&str],
        samples: u64,
        cycles: f64,
        instructions: f64,
    ) -> StackProfile {
        let mut s = pseudo_path("");
        s.frames = names
            .iter()
            .map(|n| StackFrame {
                function: n.to_string(),
                binary: "/bin/p".into(),
                address: 0x1000,
            })
            .collect();
        s.end = StackEnd::Complete;
        s.samples = samples;
        s.cycles = Some(cycles);
        s.instructions = Some(instructions);
        s.cycles_rel_error = Some(0.1);
        s.instructions_rel_error = Some(0.1);
        s.range_hits = samples;
        s
    }

    #[test]
    fn tree_has_inclusive_and_self_cpi_per_node() {
        let paths = [
            path(&["leaf", "a", "main"], 100, 400.0, 100.0),
            path(&["a", "main"], 50, 100.0, 100.0),
            path(&["b", "main"], 30, 90.0, 30.0),
        ];
        let tree = call_tree(&paths);
        let main = &tree[0];
        assert_eq!(main.function(), "main");
        assert_eq!(main.inclusive.samples, 180);
        assert_eq!((main.own.samples, main.children), (0, 2));
        let a = tree.iter().find(|n| n.function() == "a").unwrap();
        assert_eq!(a.path.len(), 2);
        assert_eq!(a.inclusive.cycles, Some(500.0));
        // Inclusive CPI 500/200, self 100/100.
        assert_eq!(a.inclusive.cpi(1).unwrap().value, 2.5);
        assert_eq!(a.own.cpi(1).unwrap().value, 1.0);
        // Σ of independent paths: rel² = (40² + 10²)/500² + (10² + 10²)/200².
        let rel = a.inclusive.cpi(1).unwrap().rel_error;
        let want = ((1700.0f64 / 250_000.0) + 200.0 / 40_000.0).sqrt();
        assert!((rel - want).abs() < 1e-12, "{rel} {want}");
        assert!(a.own.cpi(1000).is_none(), "below the floor");
        assert_eq!(tree.len(), 4);
    }

    #[test]
    fn callers_are_the_paths_into_a_function() {
        let paths = [
            path(&["memcpy", "a", "main"], 10, 10.0, 10.0),
            path(&["memcpy", "b", "main"], 30, 30.0, 30.0),
            path(&["x", "memcpy", "b", "main"], 5, 5.0, 5.0),
            path(&["a", "main"], 7, 7.0, 7.0),
        ];
        let c = callers(&paths, "memcpy");
        assert_eq!(c.len(), 2);
        let names: Vec<&str> = c[0].path.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["main", "b", "memcpy"]);
        assert_eq!((c[0].inclusive.samples, c[0].own.samples), (35, 30));
        assert_eq!(c[1].inclusive.samples, 10);
    }

    /// The same chain of names through other call sites is one row, not one per return
    /// address (`--callers main` printed three identical rows).
    #[test]
    fn callers_through_other_call_sites_are_one_row() {
        let mut paths = [
            path(&["leaf", "main"], 4, 4.0, 4.0),
            path(&["leaf", "main"], 6, 6.0, 6.0),
            path(&["leaf", "other"], 1, 1.0, 1.0),
        ];
        paths[1].frames[0].address = 0x2000;
        paths[1].frames[1].address = 0x2040;
        let c = callers(&paths, "leaf");
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].inclusive.samples, c[1].inclusive.samples), (10, 1));
    }

    #[test]
    fn bound_sums_the_tail_into_dropped() {
        let mut paths: Vec<StackProfile> = (0..MAX_PATHS as u64 + 10)
            .map(|i| path(&[&format!("f{i}"), "main"], i + 1, (i + 1) as f64, 1.0))
            .collect();
        let total: u64 = paths.iter().map(|p| p.samples).sum();
        bound_paths(&mut paths, 1);
        assert_eq!(paths.len(), MAX_PATHS);
        assert_eq!(paths.iter().map(|p| p.samples).sum::<u64>(), total);
        let d = paths
            .iter()
            .find(|p| p.frames[0].function == DROPPED_FRAME)
            .unwrap();
        // The 11 coldest: samples 1..=11.
        assert_eq!(d.samples, 66);
    }
}
