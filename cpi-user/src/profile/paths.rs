//! Call paths of a profile ([`StackProfile`]): their order and bound in the file, and
//! the call tree read from them (inclusive and self totals per node, recursion folded;
//! the paths into a function). Analysis (cpi-user/src/profile/analyze.rs) and merging
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
pub(crate) const MAX_PATHS: usize = 1000;

/// The frame of the path holding what the stacks evicted by the memory bound held
/// (cpi-user/src/profile/stack.rs).
pub(crate) const DROPPED_FRAME: &str = "[dropped]";

/// The leaf frame of a path holding what its caller's rare callee paths held: beyond
/// [`MAX_PATHS`], the narrowest paths fold into their widest ancestor that keeps a node
/// of its own ([`fold_plan`]), as a flame graph's minimum width leaves narrow frames
/// in their parent's width. Alone, it holds rare outermost frames.
pub(crate) const RARE_FRAME: &str = "[rare callees]";

/// The frame of the path holding the samples that carried no stack.
pub(crate) const NO_STACK_FRAME: &str = "[no stack]";

/// A one-frame pseudo path named `name` (`[dropped]`, `[no stack]`).
pub(crate) fn pseudo_path(name: &str) -> StackProfile {
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
pub(crate) fn hottest_path_first(a: &StackProfile, b: &StackProfile) -> std::cmp::Ordering {
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
pub(crate) type PathKey = Vec<(String, String)>;

/// The [`PathKey`] of `frames`.
pub(crate) fn frames_key(frames: &[StackFrame]) -> PathKey {
    frames
        .iter()
        .map(|f| (f.function.clone(), f.binary.clone()))
        .collect()
}

/// Sums of paths as independent estimates.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PathTotals {
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
    pub(crate) fn into_path(self, frames: Vec<StackFrame>, floor: u64) -> StackProfile {
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

/// Where a path goes when a process's paths are bounded ([`fold_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fold {
    /// It keeps its frames.
    Keep,
    /// Its totals go to the [`RARE_FRAME`] path under its outermost `n` frames (`0`:
    /// the `[rare callees]` path alone).
    Into(usize),
}

/// A node of [`fold_plan`]'s tree: a distinct chain of frames from the root.
struct PlanNode {
    parent: u32,
    depth: u32,
    /// Σ weight of the paths through it.
    weight: f64,
    /// Whether a path ends here.
    own: bool,
    /// Children not kept (yet).
    open: u32,
}

/// No parent: a root of [`fold_plan`]'s tree.
const NO_NODE: u32 = u32::MAX;

/// Decides which paths keep their frames so that at most `budget` paths remain, the
/// `[rare callees]` paths the others fold into counted. `paths` are each path's frames
/// (ids, one per distinct frame name, leaf first as a path holds them) and weight.
///
/// The paths make a tree, root first, a node per distinct chain of frames weighing the
/// paths through it. Nodes are kept widest first (a parent before its children) while
/// the paths they make fit: each kept node's own path, and one `[rare callees]` path
/// under each kept node with a child not kept (one alone for roots not kept). A path
/// whose node is not kept goes to the `[rare callees]` path under its deepest kept
/// ancestor, so each kept frame still holds all that ran under it (its width and CPI
/// in a flame graph) and the shape of the tree is kept down to the narrowest nodes
/// the budget allows, where a `[dropped]` remainder had none.
pub(crate) fn fold_plan(paths: &[(&[u32], f64)], budget: usize) -> Vec<Fold> {
    if paths.len() <= budget {
        return vec![Fold::Keep; paths.len()];
    }
    let mut nodes: Vec<PlanNode> = Vec::new();
    let mut index: HashMap<(u32, u32), u32> = HashMap::new();
    let mut open_roots = 0u32;
    let mut ends = Vec::with_capacity(paths.len());
    for &(frames, weight) in paths {
        let mut at = NO_NODE;
        for &frame in frames.iter().rev() {
            let next = nodes.len() as u32;
            let node = *index.entry((at, frame)).or_insert(next);
            if node == next {
                let depth = match at {
                    NO_NODE => 0,
                    p => nodes[p as usize].depth + 1,
                };
                nodes.push(PlanNode {
                    parent: at,
                    depth,
                    weight: 0.0,
                    own: false,
                    open: 0,
                });
                match at {
                    NO_NODE => open_roots += 1,
                    p => nodes[p as usize].open += 1,
                }
            }
            nodes[node as usize].weight += weight;
            at = node;
        }
        if at != NO_NODE {
            nodes[at as usize].own = true;
        }
        ends.push(at);
    }
    let kept = keep_widest(&mut nodes, open_roots, budget);
    ends.into_iter()
        .map(|mut at| {
            if at == NO_NODE || kept[at as usize] {
                return Fold::Keep;
            }
            while at != NO_NODE && !kept[at as usize] {
                at = nodes[at as usize].parent;
            }
            match at {
                NO_NODE => Fold::Into(0),
                a => Fold::Into(nodes[a as usize].depth as usize + 1),
            }
        })
        .collect()
}

/// [`fold_plan`]'s choice: which nodes are kept, widest first while the paths fit.
fn keep_widest(nodes: &mut [PlanNode], mut open_roots: u32, budget: usize) -> Vec<bool> {
    // Σ weights only grow along a path, so a parent is never lighter than its child;
    // at equal weight the shallower goes first.
    let mut order: Vec<u32> = (0..nodes.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&nodes[a as usize], &nodes[b as usize]);
        y.weight
            .total_cmp(&x.weight)
            .then(x.depth.cmp(&y.depth))
            .then(a.cmp(&b))
    });
    let mut kept = vec![false; nodes.len()];
    // The one `[rare callees]` path of the roots not kept.
    let mut paths = usize::from(open_roots > 0);
    for i in order {
        let n = &nodes[i as usize];
        let parent_open = match n.parent {
            NO_NODE => open_roots,
            p if kept[p as usize] => nodes[p as usize].open,
            _ => break,
        };
        let adds = usize::from(n.own) + usize::from(n.open > 0);
        let after = (paths + adds).saturating_sub(usize::from(parent_open == 1));
        if after > budget {
            break;
        }
        paths = after;
        kept[i as usize] = true;
        match n.parent {
            NO_NODE => open_roots -= 1,
            p => nodes[p as usize].open -= 1,
        }
    }
    kept
}

/// Whether `s` is one of the one-frame pseudo paths that hold what no stack does
/// (`[dropped]`, `[no stack]`): never folded.
pub(crate) fn is_remainder(s: &StackProfile) -> bool {
    s.frames.len() == 1 && [DROPPED_FRAME, NO_STACK_FRAME].contains(&s.frames[0].function.as_str())
}

/// Orders `paths` hottest first and keeps at most [`MAX_PATHS`]: beyond them the
/// narrowest fold into `[rare callees]` paths ([`fold_plan`]); the pseudo paths
/// `[dropped]` and `[no stack]` are kept whole.
pub(crate) fn bound_paths(paths: &mut Vec<StackProfile>, floor: u64) {
    paths.sort_by(hottest_path_first);
    if paths.len() <= MAX_PATHS {
        return;
    }
    let (remainders, rest): (Vec<StackProfile>, Vec<StackProfile>) =
        std::mem::take(paths).into_iter().partition(is_remainder);
    let plan = {
        let mut ids: HashMap<(&str, &str), u32> = HashMap::new();
        let keys: Vec<Vec<u32>> = rest
            .iter()
            .map(|s| {
                s.frames
                    .iter()
                    .map(|f| {
                        let next = ids.len() as u32;
                        *ids.entry((f.function.as_str(), f.binary.as_str()))
                            .or_insert(next)
                    })
                    .collect()
            })
            .collect();
        let weighed: Vec<(&[u32], f64)> = keys
            .iter()
            .zip(&rest)
            .map(|(k, s)| (&k[..], weight(s)))
            .collect();
        fold_plan(&weighed, MAX_PATHS.saturating_sub(remainders.len()))
    };
    let mut rare: HashMap<PathKey, (Vec<StackFrame>, PathTotals)> = HashMap::new();
    let mut kept = remainders;
    for (s, fold) in rest.into_iter().zip(plan) {
        let Fold::Into(n) = fold else {
            kept.push(s);
            continue;
        };
        let frames = rare_frames(&s.frames[s.frames.len() - n..]);
        let sum = rare
            .entry(frames_key(&frames))
            .or_insert_with(|| (frames, PathTotals::default()));
        sum.1.add(&s);
    }
    // A `[rare callees]` path kept from an earlier bound (merged windows) takes the
    // paths folded beside it.
    kept.retain(|s| match rare.get_mut(&frames_key(&s.frames)) {
        Some(sum) => {
            sum.1.add(s);
            false
        }
        None => true,
    });
    kept.extend(
        rare.into_values()
            .map(|(frames, t)| t.into_path(frames, floor)),
    );
    kept.sort_by(hottest_path_first);
    *paths = kept;
}

/// The frames of the `[rare callees]` path under `callers` (leaf first).
pub(crate) fn rare_frames(callers: &[StackFrame]) -> Vec<StackFrame> {
    let mut frames = pseudo_path(RARE_FRAME).frames;
    frames.extend_from_slice(callers);
    frames
}

/// A path into a function ([`callers`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PathNode {
    /// The path from the root down to the node, root first.
    pub path: Vec<StackFrame>,
    /// Paths through the node.
    pub inclusive: PathTotals,
    /// Paths ending at the node.
    pub own: PathTotals,
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

/// One node of the call tree with recursion folded ([`folded_tree`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TreeNode {
    /// The node's function.
    pub function: String,
    /// Its binary.
    pub binary: String,
    /// Frames from the root (0) down to the node, recursion folded.
    pub depth: usize,
    /// Paths through the node (each once, however often it recurses on them).
    pub inclusive: PathTotals,
    /// Paths whose folded leaf is the node.
    pub own: PathTotals,
    /// Whether frames of a recursion (direct or through a cycle) were merged into it.
    pub recursive: bool,
    /// Callees, indices into the tree, hottest inclusive first.
    pub children: Vec<usize>,
}

/// The call tree of `paths` with recursion folded (a function appears once on each
/// path: a call back into a function already on the path returns to its node, and the
/// frames between are merged into it; perf's `--children` and pprof do not fold, and a
/// recursive sort then reads as one row per depth). Roots are the nodes at depth 0; [`FoldedTree::preorder`] walks
/// it hottest first. Call sites do not split a node (rows by name chain).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FoldedTree {
    /// Every node.
    pub nodes: Vec<TreeNode>,
    /// The outermost nodes, hottest inclusive first.
    pub roots: Vec<usize>,
}

impl FoldedTree {
    /// Node indices depth first, each node's children hottest first.
    pub(crate) fn preorder(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.nodes.len());
        let mut todo: Vec<usize> = self.roots.iter().rev().copied().collect();
        while let Some(i) = todo.pop() {
            out.push(i);
            todo.extend(self.nodes[i].children.iter().rev());
        }
        out
    }
}

/// `frames` (leaf first, as a path holds them) root first with recursion folded: a
/// frame whose function is already on the folded path returns to it, the frames
/// between dropped; each kept frame says whether a recursion was folded into it.
/// Linear in the frames: where each function sits on the folded path is kept in a map,
/// and a frame leaves the path (and the map) at most once, so a path of 100 000 frames
/// handed over in a file costs 100 000 steps, not a search of the path per frame.
pub(crate) fn fold_recursion(frames: &[StackFrame]) -> Vec<(&StackFrame, bool)> {
    let mut on: Vec<(&StackFrame, bool)> = Vec::with_capacity(frames.len());
    let mut at: HashMap<(&str, &str), usize> = HashMap::with_capacity(frames.len());
    for f in frames.iter().rev() {
        let key = (f.function.as_str(), f.binary.as_str());
        match at.get(&key) {
            Some(&i) => {
                for (o, _) in on.drain(i + 1..) {
                    at.remove(&(o.function.as_str(), o.binary.as_str()));
                }
                on[i].1 = true;
            }
            None => {
                at.insert(key, on.len());
                on.push((f, false));
            }
        }
    }
    on
}

/// `paths` with recursion folded ([`fold_recursion`]) and those whose folded chains of
/// names are the same summed (other call sites and other depths of one recursion are
/// one path), hottest first; CPI from `floor` samples.
pub(crate) fn folded_paths(paths: &[StackProfile], floor: u64) -> Vec<StackProfile> {
    let mut sums: Vec<(Vec<StackFrame>, PathTotals)> = Vec::new();
    let mut index: HashMap<Vec<String>, usize> = HashMap::new();
    for s in paths {
        let folded = fold_recursion(&s.frames);
        let names: Vec<String> = folded.iter().map(|(f, _)| f.function.clone()).collect();
        let i = *index.entry(names).or_insert_with(|| {
            let leaf_first = folded.iter().rev().map(|(f, _)| (*f).clone()).collect();
            sums.push((leaf_first, PathTotals::default()));
            sums.len() - 1
        });
        sums[i].1.add(s);
    }
    let mut out: Vec<StackProfile> = sums
        .into_iter()
        .map(|(frames, t)| t.into_path(frames, floor))
        .collect();
    out.sort_by(hottest_path_first);
    out
}

/// Builds the [`FoldedTree`] of `paths`.
pub(crate) fn folded_tree(paths: &[StackProfile]) -> FoldedTree {
    let mut t = FoldedTree::default();
    let mut index: HashMap<(Option<usize>, &str, &str), usize> = HashMap::new();
    for s in paths {
        // The folded path: node indices, root first.
        let mut on: Vec<usize> = Vec::new();
        for (f, recursive) in fold_recursion(&s.frames) {
            let parent = on.last().copied();
            let key = (parent, f.function.as_str(), f.binary.as_str());
            let i = *index.entry(key).or_insert_with(|| {
                t.nodes.push(TreeNode {
                    function: f.function.clone(),
                    binary: f.binary.clone(),
                    depth: on.len(),
                    inclusive: PathTotals::default(),
                    own: PathTotals::default(),
                    recursive: false,
                    children: Vec::new(),
                });
                let i = t.nodes.len() - 1;
                match parent {
                    Some(p) => t.nodes[p].children.push(i),
                    None => t.roots.push(i),
                }
                i
            });
            t.nodes[i].recursive |= recursive;
            on.push(i);
        }
        // Frames a recursion left (the `b` of a → b → a → c) are merged into the node
        // it returned to, so a parent's inclusive totals are its own plus its
        // children's.
        for &n in &on {
            t.nodes[n].inclusive.add(s);
        }
        if let Some(&leaf) = on.last() {
            t.nodes[leaf].own.add(s);
        }
    }
    let hottest = |nodes: &[TreeNode], v: &mut Vec<usize>| {
        v.sort_by(|&a, &b| {
            nodes[b]
                .inclusive
                .weight()
                .total_cmp(&nodes[a].inclusive.weight())
                .then_with(|| nodes[a].function.cmp(&nodes[b].function))
        })
    };
    for i in 0..t.nodes.len() {
        let mut c = std::mem::take(&mut t.nodes[i].children);
        hottest(&t.nodes, &mut c);
        t.nodes[i].children = c;
    }
    let mut roots = std::mem::take(&mut t.roots);
    hottest(&t.nodes, &mut roots);
    t.roots = roots;
    t
}

/// The paths into `function` (root down to its outermost call on each path), with the
/// totals of everything under it there, hottest first.
pub fn callers(paths: &[StackProfile], function: &str) -> Vec<PathNode> {
    let mut nodes: Vec<PathNode> = Vec::new();
    let mut rows: HashMap<Vec<&str>, usize> = HashMap::new();
    for s in paths {
        let root_first: Vec<&StackFrame> = s.frames.iter().rev().collect();
        let Some(at) = root_first.iter().position(|f| f.function == function) else {
            continue;
        };
        // One row per chain of names: the same chain through other call sites (other
        // return addresses) printed as identical rows (`--callers main`: three of them).
        // Found by a map of the chains, not a comparison with every row so far.
        let names: Vec<&str> = root_first[..=at]
            .iter()
            .map(|f| f.function.as_str())
            .collect();
        let i = *rows.entry(names).or_insert_with(|| {
            nodes.push(PathNode {
                path: root_first[..=at].iter().map(|f| (*f).clone()).collect(),
                inclusive: PathTotals::default(),
                own: PathTotals::default(),
            });
            nodes.len() - 1
        });
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
        let tree = folded_tree(&paths);
        let main = &tree.nodes[tree.roots[0]];
        assert_eq!(main.function, "main");
        assert_eq!(main.inclusive.samples, 180);
        assert_eq!((main.own.samples, main.children.len()), (0, 2));
        let a = tree.nodes.iter().find(|n| n.function == "a").unwrap();
        assert_eq!(a.depth, 1);
        assert_eq!(a.inclusive.cycles, Some(500.0));
        // Inclusive CPI 500/200, self 100/100.
        assert_eq!(a.inclusive.cpi(1).unwrap().value, 2.5);
        assert_eq!(a.own.cpi(1).unwrap().value, 1.0);
        // Σ of independent paths: rel² = (40² + 10²)/500² + (10² + 10²)/200².
        let rel = a.inclusive.cpi(1).unwrap().rel_error;
        let want = ((1700.0f64 / 250_000.0) + 200.0 / 40_000.0).sqrt();
        assert!((rel - want).abs() < 1e-12, "{rel} {want}");
        assert!(a.own.cpi(1000).is_none(), "below the floor");
        assert_eq!(tree.nodes.len(), 4);
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

    /// The names of the folded tree in preorder, indented two per depth.
    fn outline(t: &FoldedTree) -> Vec<String> {
        t.preorder()
            .into_iter()
            .map(|i| {
                let n = &t.nodes[i];
                let mark = if n.recursive { " ↻" } else { "" };
                let (inc, own) = (n.inclusive.samples, n.own.samples);
                format!("{}{}{mark} {inc}/{own}", "  ".repeat(n.depth), n.function)
            })
            .collect()
    }

    /// The linear folding gives what a search of the folded path per frame gives (the
    /// definition), on every path of up to 7 frames over 4 functions, and 100 000
    /// distinct frames fold to themselves.
    #[test]
    fn fold_recursion_is_the_search_per_frame() {
        fn searched(frames: &[StackFrame]) -> Vec<(&StackFrame, bool)> {
            let mut on: Vec<(&StackFrame, bool)> = Vec::new();
            for f in frames.iter().rev() {
                match on.iter().position(|(o, _)| o.function == f.function) {
                    Some(at) => {
                        on.truncate(at + 1);
                        on[at].1 = true;
                    }
                    None => on.push((f, false)),
                }
            }
            on
        }
        let names = ["a", "b", "c", "d"];
        for len in 1..=7u32 {
            for code in 0..4usize.pow(len) {
                let chain: Vec<&str> = (0..len).map(|i| names[code / 4usize.pow(i) % 4]).collect();
                let s = path(&chain, 1, 1.0, 1.0);
                assert_eq!(fold_recursion(&s.frames), searched(&s.frames), "{chain:?}");
            }
        }
        let deep: Vec<String> = (0..100_000).map(|i| format!("f{i}")).collect();
        let deep: Vec<&str> = deep.iter().map(String::as_str).collect();
        let s = path(&deep, 1, 1.0, 1.0);
        let folded = fold_recursion(&s.frames);
        assert_eq!(folded.len(), 100_000);
        assert!(folded.iter().all(|(_, recursive)| !recursive));
        assert_eq!(folded[0].0.function, "f99999", "root first");
    }

    /// Direct recursion (qsort's merge sort) and recursion through a cycle fold into
    /// one node per function on each path; the tree's totals add up.
    #[test]
    fn folded_tree_merges_recursion() {
        let paths = [
            path(
                &["cmp", "msort", "msort", "msort", "qsort", "main"],
                40,
                40.0,
                10.0,
            ),
            path(&["msort", "msort", "qsort", "main"], 20, 20.0, 10.0),
            path(&["cmp", "msort", "qsort", "main"], 10, 10.0, 10.0),
            path(&["leaf", "a", "b", "a", "main"], 5, 5.0, 5.0),
            path(&["b", "a", "main"], 3, 3.0, 3.0),
            path(&["main"], 1, 1.0, 1.0),
        ];
        let t = folded_tree(&paths);
        assert_eq!(
            outline(&t),
            [
                "main 79/1",
                "  qsort 70/0",
                "    msort ↻ 70/20",
                "      cmp 50/50",
                "  a ↻ 8/0",
                "    leaf 5/5",
                "    b 3/3",
            ]
        );
        let msort = t.nodes.iter().find(|n| n.function == "msort").unwrap();
        assert_eq!(msort.inclusive.cycles, Some(70.0));
        assert_eq!(msort.inclusive.cpi(1).unwrap().value, 70.0 / 30.0);
    }

    /// Nodes are kept widest first while the paths fit; the rest fold under their
    /// deepest kept caller, or alone.
    #[test]
    fn fold_plan_keeps_the_widest_nodes() {
        // main = 0, a = 1, b = 2, x = 3, y = 4: main → a → {x, y}, main → b, main.
        let (a_x, a_y, b, main) = ([3, 1, 0], [4, 1, 0], [2, 0], [0]);
        let paths: [(&[u32], f64); 4] = [(&a_x, 50.0), (&a_y, 1.0), (&b, 2.0), (&main, 10.0)];
        use Fold::*;
        assert_eq!(fold_plan(&paths, 4), [Keep; 4]);
        // main and a kept: main's own path, a's rare callees, main's rare callees.
        assert_eq!(fold_plan(&paths, 3), [Into(2), Into(2), Into(1), Keep]);
        assert_eq!(fold_plan(&paths, 2), [Into(1), Into(1), Into(1), Keep]);
        assert_eq!(fold_plan(&paths, 1), [Into(0); 4]);
    }

    /// Past [`MAX_PATHS`] the narrowest paths fold into `[rare callees]` under their
    /// callers: every sample stays, and each caller still holds all that ran under it.
    #[test]
    fn bound_folds_narrow_paths_under_their_callers() {
        let mut paths = vec![path(&["hot", "main"], 5000, 5000.0, 1.0)];
        for i in 0..40u64 {
            for j in 0..40 {
                let (leaf, mid) = (format!("leaf{j}"), format!("mid{i}"));
                let n = 1 + i % 3;
                paths.push(path(&[&leaf, &mid, "main"], n, n as f64, 1.0));
            }
        }
        let under = |paths: &[StackProfile], mid: &str| -> u64 {
            let through = |p: &&StackProfile| p.frames.iter().any(|f| f.function == mid);
            paths.iter().filter(through).map(|p| p.samples).sum()
        };
        let total: u64 = paths.iter().map(|p| p.samples).sum();
        let before: Vec<u64> = (0..40).map(|i| under(&paths, &format!("mid{i}"))).collect();
        bound_paths(&mut paths, 1);
        assert!(paths.len() <= MAX_PATHS, "{}", paths.len());
        assert_eq!(paths.iter().map(|p| p.samples).sum::<u64>(), total);
        let after: Vec<u64> = (0..40).map(|i| under(&paths, &format!("mid{i}"))).collect();
        assert_eq!(before, after);
        let rare: Vec<&StackProfile> = paths
            .iter()
            .filter(|p| p.frames[0].function == RARE_FRAME)
            .collect();
        assert!(!rare.is_empty());
        assert!(
            rare.iter().all(|p| p.frames.len() == 3),
            "folded under a mid frame"
        );
        assert!(paths.iter().all(|p| p.frames[0].function != DROPPED_FRAME));
        assert_eq!(paths[0].frames[0].function, "hot");
    }
}
