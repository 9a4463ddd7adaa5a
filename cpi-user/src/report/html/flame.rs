//! The flame graph's data: the call stacks of every process merged into one tree, each
//! node with the cycles (or time), instructions and samples of its subtree, laid out as
//! frames. A frame's CPI is its subtree's Σ cycles / Σ instructions: a stack's
//! instructions are those that ran in its leaf function under it (profile/stack.rs), so
//! the sums over a subtree count each instruction once.
//!
//! Not drawn with inferno: its frame attributes are per function name and its colours
//! by name or by a differential self count, while here every frame carries its own
//! subtree's CPI ± error and numbers (the page's tooltips, and tests read them).

use std::collections::HashMap;

use crate::profile::error;
use crate::profile::model::{Mode, ProcessProfile, Profile};
use crate::profile::paths::fold_recursion;
use crate::report::diff::UnitFields;

/// What a frame's width measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Width {
    /// Cycles (CPI, IP sampling, simulated).
    Cycles,
    /// CPU time (a time profile).
    Time,
    /// Instructions (branch records without cycles or time: a taken-branch recording
    /// with no cycles event).
    Instructions,
    /// IP samples (neither cycles, time nor instructions recorded).
    Samples,
}

impl Width {
    /// The measure a profile's frames get: cycles where the mode counts them.
    pub fn of(p: &Profile) -> Width {
        let any = |f: fn(&ProcessProfile) -> bool| p.processes.iter().any(f);
        if p.mode.has_cpi() && any(|pr| pr.measures.cycles.is_some()) {
            Width::Cycles
        } else if any(|pr| pr.measures.time_ns.is_some()) {
            Width::Time
        } else if any(|pr| pr.measures.instructions.is_some()) {
            Width::Instructions
        } else {
            Width::Samples
        }
    }

    /// The unit's name as the page says it.
    pub fn name(self) -> &'static str {
        match self {
            Width::Cycles => "cycles",
            Width::Time => "CPU time",
            Width::Instructions => "instructions",
            Width::Samples => "samples",
        }
    }
}

/// Sums over a subtree.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Sums {
    /// The width measure (cycles, ns or samples).
    pub width: f64,
    /// Its variance.
    pub width_var: f64,
    /// Cycles, with their variance.
    pub cycles: f64,
    cycles_var: f64,
    /// Instructions, with their variance.
    pub instructions: f64,
    instructions_var: f64,
    /// IP samples.
    pub samples: u64,
    /// Units (processes, functions, call paths) summed here.
    units: u32,
    /// Whether the one unit summed here has a CPI of its own: a frame of one unit
    /// shows what that unit's row does, whose floor also counts the samples behind
    /// its instructions.
    unit_has_cpi: bool,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.units += o.units;
        self.unit_has_cpi = o.unit_has_cpi;
        self.width += o.width;
        self.width_var += o.width_var;
        self.cycles += o.cycles;
        self.cycles_var += o.cycles_var;
        self.instructions += o.instructions;
        self.instructions_var += o.instructions_var;
        self.samples += o.samples;
    }

    /// CPI and its relative standard error: `None` below `floor` IP samples or without
    /// instructions (the profile's own floor, so a frame never shows a CPI the tables
    /// would not), or where the one unit summed has none.
    pub fn cpi(&self, floor: u64) -> Option<(f64, f64)> {
        let own = self.units != 1 || self.unit_has_cpi;
        let measured = self.instructions > 0.0 && self.cycles > 0.0;
        (own && self.samples >= floor.max(1) && measured).then(|| {
            let rel = error::quotient(
                error::relative(self.cycles, self.cycles_var),
                error::relative(self.instructions, self.instructions_var),
            );
            (self.cycles / self.instructions, rel)
        })
    }

    /// The sums of one process, function or call path.
    fn of(width: Width, u: UnitFields) -> Sums {
        let var =
            |v: Option<f64>, rel: Option<f64>| (v.unwrap_or(0.0) * rel.unwrap_or(0.0)).powi(2);
        let w = measure(width, &u);
        Sums {
            width: w,
            width_var: width_variance(width, w, &u),
            cycles: u.cycles.unwrap_or(0.0),
            cycles_var: var(u.cycles, u.cycles_rel_error),
            instructions: u.instructions.unwrap_or(0.0),
            instructions_var: var(u.instructions, u.instructions_rel_error),
            samples: u.samples,
            units: 1,
            unit_has_cpi: u.has_cpi,
        }
    }
}

/// The variance of a width: cycles and instructions carry their own error; time and
/// samples are counts of samples, 1/√n (the diff's rule, one for both).
fn width_variance(width: Width, w: f64, u: &UnitFields) -> f64 {
    let rel = match width {
        Width::Cycles => u.cycles_rel_error,
        Width::Instructions => u.instructions_rel_error,
        Width::Time | Width::Samples => None,
    };
    crate::report::diff::variance(w, rel, u.samples)
}

fn measure(width: Width, u: &UnitFields) -> f64 {
    match width {
        Width::Cycles => u.cycles.unwrap_or(0.0),
        Width::Time => u.time_ns.unwrap_or(0.0),
        Width::Instructions => u.instructions.unwrap_or(0.0),
        Width::Samples => u.samples as f64,
    }
}

/// One node: a function called along one path.
#[derive(Clone, Debug)]
pub struct Node {
    /// Function name (a process node: `comm [pid]`).
    pub name: String,
    /// Binary file name (empty for the root and process nodes).
    pub binary: String,
    /// Inclusive sums.
    pub total: Sums,
    /// Sums of the stacks that end here: the function's own (self) cycles and
    /// instructions on this path.
    pub own: Sums,
    /// The caller's node (the root's is itself).
    pub parent: usize,
    children: Vec<usize>,
}

/// Call stacks merged into a tree: node 0 is the root (`all`).
#[derive(Clone, Debug)]
pub(crate) struct Tree {
    /// The nodes, parents before children.
    pub nodes: Vec<Node>,
    index: HashMap<(usize, String, String), usize>,
    /// Each process node's CPI ± relative error, its profile's own estimate (the
    /// tables' figure), that its frames' self CPI is set against; the root's, of every
    /// process.
    process_cpi: HashMap<usize, Reference>,
}

/// A process node's CPI, summed over the processes it stands for as Σ CPI·n / Σ n
/// (n: instructions), with its standard error.
#[derive(Clone, Copy, Debug, Default)]
struct Reference {
    weighted: f64,
    weighted_var: f64,
    instructions: f64,
}

impl Reference {
    fn add(&mut self, e: &crate::profile::model::Estimate, instructions: f64) {
        let w = e.value * instructions;
        self.weighted += w;
        self.weighted_var += (w * e.rel_error).powi(2);
        self.instructions += instructions;
    }

    fn cpi(&self) -> Option<(f64, f64)> {
        (self.instructions > 0.0 && self.weighted > 0.0).then(|| {
            (
                self.weighted / self.instructions,
                self.weighted_var.sqrt() / self.weighted,
            )
        })
    }
}

impl Tree {
    fn new() -> Tree {
        Tree {
            nodes: vec![Node {
                name: "all".into(),
                binary: String::new(),
                total: Sums::default(),
                own: Sums::default(),
                parent: 0,
                children: Vec::new(),
            }],
            index: HashMap::new(),
            process_cpi: HashMap::new(),
        }
    }

    /// Per node, the CPI ± relative error of the process node it stands under (itself,
    /// or its ancestor just below the root; the root's is every process's), where the
    /// profile has one. One pass, parents before children: a chain of 100 000 frames
    /// costs 100 000 steps, not a walk to the root from each.
    pub(crate) fn process_cpis(&self) -> Vec<Option<(f64, f64)>> {
        let mut process = vec![0usize; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            process[i] = if n.parent == 0 { i } else { process[n.parent] };
        }
        process
            .iter()
            .map(|p| self.process_cpi.get(p).and_then(Reference::cpi))
            .collect()
    }

    fn child(&mut self, parent: usize, name: &str, binary: &str) -> usize {
        let key = (parent, name.to_string(), binary.to_string());
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.nodes.len();
        self.nodes.push(Node {
            name: key.1.clone(),
            binary: key.2.clone(),
            total: Sums::default(),
            own: Sums::default(),
            parent,
            children: Vec::new(),
        });
        self.nodes[parent].children.push(i);
        self.index.insert(key, i);
        i
    }

    /// Adds `sums` along `path` (outermost first) under `parent`, and to every node on it.
    fn add_path<'a>(
        &mut self,
        parent: usize,
        path: impl Iterator<Item = (&'a str, &'a str)>,
        sums: &Sums,
    ) {
        let mut at = parent;
        self.nodes[0].total.add(sums);
        if parent != 0 {
            self.nodes[parent].total.add(sums);
        }
        for (name, binary) in path {
            at = self.child(at, name, binary);
            self.nodes[at].total.add(sums);
        }
        self.nodes[at].own.add(sums);
    }

    /// Names the process nodes of a profile whose processes of one name were merged
    /// (`pid` 0, `pids` the count behind each name) as the terminal does: `comm [N pids]`.
    pub(crate) fn name_merged_processes(
        &mut self,
        p: &Profile,
        pids: &std::collections::BTreeMap<String, usize>,
    ) {
        for pr in p.processes.iter().filter(|pr| pr.pid == 0) {
            let Some(&n) = pids.get(&pr.comm).filter(|&&n| n > 1) else {
                continue;
            };
            let old = process_name(pr);
            let Some(i) = self.index.remove(&(0, old, String::new())) else {
                continue;
            };
            let name = format!(
                "{} [{n} pids]",
                if pr.comm.is_empty() { "?" } else { &pr.comm }
            );
            self.nodes[i].name = name.clone();
            self.index.insert((0, name, String::new()), i);
        }
    }

    /// The child of `parent` named `name` in `binary`, if there is one.
    pub fn find(&self, parent: usize, name: &str, binary: &str) -> Option<usize> {
        self.index
            .get(&(parent, name.to_string(), binary.to_string()))
            .copied()
    }

    /// The children of `i`, alphabetically (as flamegraph.pl orders them, so two
    /// profiles of one program lay out alike).
    pub fn children(&self, i: usize) -> Vec<usize> {
        let mut c = self.nodes[i].children.clone();
        c.sort_by(|&a, &b| {
            (&self.nodes[a].name, &self.nodes[a].binary)
                .cmp(&(&self.nodes[b].name, &self.nodes[b].binary))
        });
        c
    }

    /// The part of node `i` no child accounts for.
    pub(crate) fn self_width(&self, i: usize) -> f64 {
        let n = &self.nodes[i];
        let children: f64 = n.children.iter().map(|&c| self.nodes[c].total.width).sum();
        (n.total.width - children).max(0.0)
    }
}

/// How processes become the graph's second row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProcessKey {
    /// `comm [pid]`: one node per process.
    Pid,
    /// `comm`: processes of one name merged, as a diff matches them across runs.
    Comm,
}

impl ProcessKey {
    fn name(self, pr: &ProcessProfile) -> String {
        match self {
            ProcessKey::Pid => process_name(pr),
            ProcessKey::Comm => if pr.comm.is_empty() { "?" } else { &pr.comm }.to_string(),
        }
    }
}

/// A process's node name: what its row in the tables says.
pub(crate) fn process_name(pr: &ProcessProfile) -> String {
    let comm = if pr.comm.is_empty() { "?" } else { &pr.comm };
    format!("{comm} [{}]", pr.pid)
}

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The tree of every process's stacks (root first), under one node per process. A
/// process without stacks gets one frame per function (leaf only), as the folded
/// export writes it.
pub(crate) fn callers_first(p: &Profile, width: Width, key: ProcessKey) -> Tree {
    let mut t = Tree::new();
    let mut own: HashMap<usize, Sums> = HashMap::new();
    for pr in &p.processes {
        let proc_node = t.child(0, &key.name(pr), "");
        own.entry(proc_node)
            .or_default()
            .add(&Sums::of(width, pr.into()));
        if let (Some(e), Some(n)) = (&pr.measures.cpi, pr.measures.instructions) {
            t.process_cpi.entry(proc_node).or_default().add(e, n);
            t.process_cpi.entry(0).or_default().add(e, n);
        }
        if pr.stacks.is_empty() {
            for f in &pr.functions {
                let sums = Sums::of(width, f.into());
                // What the width does not measure draws nothing.
                if sums.width <= 0.0 {
                    continue;
                }
                t.add_path(
                    proc_node,
                    std::iter::once((f.name.as_str(), base(&f.binary))),
                    &sums,
                );
            }
            continue;
        }
        for s in &pr.stacks {
            let sums = Sums::of(width, s.into());
            let folded = fold_recursion(&s.frames);
            let path = folded
                .iter()
                .map(|(f, _)| (f.function.as_str(), base(&f.binary)));
            t.add_path(proc_node, path, &sums);
        }
    }
    // A process's own totals and errors, not the sums of its stacks' errors: a stack's
    // few samples give it a wide error that adds up to more than the process's.
    let mut root = Sums::default();
    for (i, mut sums) in own {
        sums.width = sums.width.max(t.nodes[i].total.width);
        t.nodes[i].total = sums;
        root.add(&sums);
    }
    t.nodes[0].total = root;
    t
}

/// The callers of `function` (in `binary`) as an icicle: the function is the root, at
/// the top where a reader looks first, each caller below the one it called: every
/// stack whose leaf is `function` or that passes through it, from its innermost
/// occurrence outwards.
pub(crate) fn callers_of(p: &Profile, width: Width, function: &str, binary: &str) -> Tree {
    let mut t = Tree::new();
    t.nodes[0].name = function.to_string();
    t.nodes[0].binary = binary.to_string();
    for pr in &p.processes {
        for s in &pr.stacks {
            let Some(at) = s
                .frames
                .iter()
                .position(|f| f.function == function && base(&f.binary) == binary)
            else {
                continue;
            };
            let sums = Sums::of(width, s.into());
            // Root first, so the function last: reversed, its callers outwards.
            let folded = fold_recursion(&s.frames[at..]);
            let comm = process_name(pr);
            let path = folded
                .iter()
                .rev()
                .skip(1)
                .map(|(f, _)| (f.function.as_str(), base(&f.binary)))
                .chain(std::iter::once((comm.as_str(), "")));
            t.add_path(0, path, &sums);
        }
    }
    t
}

/// A frame placed on the graph: `x` and `w` as fractions of the root's width.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The node drawn.
    pub node: usize,
    /// Left edge, 0..1.
    pub x: f64,
    /// Width, 0..1.
    pub w: f64,
    /// Depth: 0 is the root.
    pub depth: usize,
}

/// The frames of `t` at least `min_width` wide (a fraction of the root), parents
/// before children; also the number of nodes left out for being narrower.
pub fn layout(t: &Tree, min_width: f64) -> (Vec<Frame>, usize) {
    let total = t.nodes[0].total.width;
    let mut frames = Vec::new();
    if total <= 0.0 {
        return (frames, 0);
    }
    let mut dropped = 0;
    let mut todo = vec![(0usize, 0.0f64, 0usize)];
    while let Some((i, x, depth)) = todo.pop() {
        let w = t.nodes[i].total.width / total;
        if w < min_width {
            dropped += 1 + descendants(t, i);
            continue;
        }
        frames.push(Frame {
            node: i,
            x,
            w,
            depth,
        });
        let mut cx = x;
        for c in t.children(i) {
            todo.push((c, cx, depth + 1));
            cx += t.nodes[c].total.width / total;
        }
    }
    (frames, dropped)
}

fn descendants(t: &Tree, i: usize) -> usize {
    t.nodes[i]
        .children
        .iter()
        .map(|&c| 1 + descendants(t, c))
        .sum()
}

/// Whether a profile's frames can carry a CPI: a mode that counts instructions, with
/// cycles to divide, and a profile that does not withhold it (relative instruction
/// counts: [`Profile::cpi_withheld`]).
pub fn has_cpi(p: &Profile) -> bool {
    p.mode.has_cpi()
        && !matches!(p.mode, Mode::Instructions)
        && Width::of(p) == Width::Cycles
        && p.cpi_withheld.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtree_cpi_is_sum_over_sum_with_errors_combined() {
        let mut s = Sums::default();
        let a = Sums {
            width: 300.0,
            width_var: 9.0,
            cycles: 300.0,
            cycles_var: 9.0,
            instructions: 100.0,
            instructions_var: 4.0,
            samples: 30,
            units: 1,
            unit_has_cpi: true,
        };
        s.add(&a);
        s.add(&a);
        let (cpi, rel) = s.cpi(20).expect("above the floor");
        assert!((cpi - 3.0).abs() < 1e-12);
        let want = ((18.0f64).sqrt() / 600.0).hypot((8.0f64).sqrt() / 200.0);
        assert!((rel - want).abs() < 1e-12, "{rel} vs {want}");
        assert_eq!(a.cpi(31), None, "below the floor: no CPI");
        let no_own = Sums {
            unit_has_cpi: false,
            ..a
        };
        assert_eq!(no_own.cpi(20), None, "one unit without a CPI of its own");
        let mut two = no_own;
        two.add(&no_own);
        assert!(two.cpi(20).is_some(), "two units: the sums' own estimate");
    }
}
