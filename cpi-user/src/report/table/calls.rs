//! Call paths and calls: the hottest call paths, `--callers FUNC` (the paths into
//! FUNC) and `--callgraph` (callers and callees, from the stacks or from the branch
//! records that are calls).

use super::pathtext::{distinct_paths, PathRow};
use super::*;

/// The hottest call paths of `procs` (each path's own samples, time or cycles and its
/// leaf's CPI on it), then the call tree's hottest nodes with inclusive and self CPI
/// (cpi-user/src/profile/paths.rs). Nothing when no sample carried a stack.
pub(super) fn call_paths(
    mode: Mode,
    procs: &[&ProcessProfile],
    opts: &TableOptions,
    notes: &Notes,
) -> String {
    let many = procs.len() > 1;
    let folded: Vec<(&ProcessProfile, Vec<StackProfile>)> = procs
        .iter()
        .map(|pr| (*pr, paths::folded_paths(&pr.stacks, sample_floor())))
        .collect();
    let mut paths: Vec<(&ProcessProfile, &StackProfile)> = folded
        .iter()
        .flat_map(|(pr, v)| v.iter().map(move |s| (*pr, s)))
        .collect();
    if paths.is_empty() {
        return String::new();
    }
    paths.sort_by(|a, b| paths::hottest_path_first(a.1, b.1));
    let totals = Shares {
        weight: paths.iter().map(|(_, s)| paths::weight(s)).sum(),
        samples: paths.iter().map(|(_, s)| s.samples).sum(),
    };
    let shown = paths.len().min(opts.top);
    let build = |max: usize| {
        let mut h = vec!["path", "share", "samples"];
        if mode.has_cpi() {
            h.extend(["cycles", "instrs", "CPI ± error"]);
            notes.add(Notation::Error);
        } else {
            h.push("CPU time");
        }
        let mut t = new_table(h, 1);
        let texts = distinct_paths(
            &(paths[..shown].iter())
                .map(|(pr, s)| PathRow {
                    comm: many.then_some(pr.comm.as_str()),
                    frames: s.frames.iter().rev().map(|f| f.function.as_str()).collect(),
                })
                .collect::<Vec<_>>(),
            max,
        );
        if texts.iter().any(|t| t.contains('…')) {
            notes.add(Notation::Elided);
        }
        for ((_, s), text) in paths[..shown].iter().zip(texts) {
            let mut row = vec![
                text,
                share(mode, paths::weight(s), totals, notes),
                group(s.samples),
            ];
            if mode.has_cpi() {
                row.extend([
                    opt_si(s.cycles),
                    opt_si(s.instructions),
                    cpi(s.cpi, s.samples, inputs(s.cycles, s.instructions), notes),
                ]);
            } else {
                row.push(s.time_ns.map(time).unwrap_or_else(|| "-".into()));
            }
            t.add_row(row);
        }
        t
    };
    let mut out = finish(
        "hottest call paths (recursion folded)",
        &fitted(opts.width, build),
        shown,
        paths.len(),
        opts.width,
    );
    out.push_str(&tree::call_tree_table(
        mode,
        procs,
        totals,
        opts.top * 2,
        opts.width,
        notes,
    ));
    out
}

/// `--callers FUNC`: the call paths into FUNC (root down to its outermost call), with
/// what ran under it there.
pub(super) fn callers_table(
    mode: Mode,
    procs: &[&ProcessProfile],
    name: &str,
    opts: &TableOptions,
    notes: &Notes,
) -> String {
    let many = procs.len() > 1;
    let all = || procs.iter().flat_map(|pr| pr.stacks.iter());
    let totals = Shares {
        weight: all().map(paths::weight).sum(),
        samples: all().map(|s| s.samples).sum(),
    };
    // Recursion folded: the depths of a recursive sort are one row, not twenty that
    // read the same once cut to the width.
    let nodes: Vec<(&ProcessProfile, PathNode)> = procs
        .iter()
        .flat_map(|pr| {
            paths::callers(&paths::folded_paths(&pr.stacks, sample_floor()), name)
                .into_iter()
                .map(move |n| (*pr, n))
        })
        .collect();
    if nodes.is_empty() {
        let why = if procs.iter().all(|pr| pr.stacks.is_empty()) {
            "the profile has no call stacks"
        } else {
            "no call path holds it"
        };
        return format!(
            "
paths into {name}: none ({why})
"
        );
    }
    let shown = nodes.len().min(opts.top);
    let build = |max: usize| {
        let mut h = vec!["path", "share", "samples"];
        if mode.has_cpi() {
            h.extend(["cycles", "CPI ± error"]);
            notes.add(Notation::Error);
        } else {
            h.push("CPU time");
        }
        let mut t = new_table(h, 1);
        let texts = distinct_paths(
            &(nodes[..shown].iter())
                .map(|(pr, n)| PathRow {
                    comm: many.then_some(pr.comm.as_str()),
                    frames: n.path.iter().map(|f| f.function.as_str()).collect(),
                })
                .collect::<Vec<_>>(),
            max,
        );
        if texts.iter().any(|t| t.contains('…')) {
            notes.add(Notation::Elided);
        }
        for ((_, n), text) in nodes[..shown].iter().zip(texts) {
            let i = &n.inclusive;
            let mut row = vec![
                text,
                share(mode, i.weight(), totals, notes),
                group(i.samples),
            ];
            if mode.has_cpi() {
                row.extend([
                    opt_si(i.cycles),
                    cpi(
                        i.cpi(sample_floor()),
                        i.samples,
                        inputs(i.cycles, i.instructions),
                        notes,
                    ),
                ]);
            } else {
                row.push(i.time_ns.map(time).unwrap_or_else(|| "-".into()));
            }
            t.add_row(row);
        }
        t
    };
    finish(
        &format!("paths into {name} (recursion folded)"),
        &fitted(opts.width, build),
        shown,
        nodes.len(),
        opts.width,
    )
}

/// Callers (←) and callees (→) of each function of `focus` that has any, with the
/// estimated calls and the call records behind them (seed 001's calls-only call graph).
/// The callers and callees of `focus` from the call stacks, for modes without branch
/// records (a time profile): each edge weighs the samples of the stacks that hold it
/// (once per stack, so recursion does not count twice).
fn stack_call_graph(
    mode: Mode,
    p: &ProcessProfile,
    focus: &[&FunctionProfile],
    width: Option<usize>,
) -> String {
    if p.stacks.is_empty() {
        return format!(
            "\nno call graph: {} mode has no branch records and this process no call stacks \
             (-g)\n",
            mode.name()
        );
    }
    let total: u64 = p.stacks.iter().map(|s| s.samples).sum();
    let mut rows: Vec<[String; 3]> = Vec::new();
    for f in focus {
        let at =
            |fr: &crate::profile::model::StackFrame| fr.function == f.name && fr.binary == f.binary;
        // (caller?, name, binary) → samples.
        let mut edges: BTreeMap<(bool, String, String), u64> = BTreeMap::new();
        for s in &p.stacks {
            let mut seen = std::collections::BTreeSet::new();
            for i in (0..s.frames.len()).filter(|&i| at(&s.frames[i])) {
                let near = [
                    (true, s.frames.get(i + 1)),
                    (false, i.checked_sub(1).and_then(|j| s.frames.get(j))),
                ];
                for (caller, other) in near {
                    let Some(o) = other.filter(|o| !at(o)) else {
                        continue;
                    };
                    let key = (caller, o.function.clone(), o.binary.clone());
                    if seen.insert(key.clone()) {
                        *edges.entry(key).or_default() += s.samples;
                    }
                }
            }
        }
        if edges.is_empty() {
            continue;
        }
        rows.push([f.name.clone(), f.binary.clone(), group(f.samples)]);
        let mut edges: Vec<_> = edges.into_iter().collect();
        edges.sort_by(|a, b| (!a.0 .0, b.1).cmp(&(!b.0 .0, a.1)));
        for ((caller, name, binary), n) in edges {
            let arrow = if caller { "←" } else { "→" };
            rows.push([format!("  {arrow} {name}"), binary, group(n)]);
        }
    }
    if rows.is_empty() {
        return "\nno call graph for these functions: no call stack holds them\n".into();
    }
    let build = |max: usize| {
        let mut t = new_table(vec!["function", "binary", "samples"], 2);
        for [name, binary, n] in &rows {
            t.add_row(vec![
                ellipsize(name, max),
                ellipsize(&base(binary), max),
                n.clone(),
            ]);
        }
        t
    };
    format!(
        "\n{}{}\n",
        wrap(
            &format!(
                "call graph from call stacks (← callers, → callees; samples of the stacks \
                 through each edge, of {} with stacks; a function's own row: its samples)",
                group(total)
            ),
            width
        ),
        fitted(width, build)
    )
}

pub(super) fn call_graph(
    mode: Mode,
    p: &ProcessProfile,
    focus: &[&FunctionProfile],
    width: Option<usize>,
) -> String {
    if !mode.uses_ranges() {
        return stack_call_graph(mode, p, focus, width);
    }
    if p.calls.is_empty() {
        return "\nno call graph: no sampled branch record of this process is a call\n".into();
    }
    let is = |f: &FunctionProfile, name: &str, binary: &str| f.name == name && f.binary == binary;
    let mut rows: Vec<[String; 4]> = Vec::new();
    let mut shown = 0;
    for f in focus {
        let mut callers: Vec<&CallEdge> = p
            .calls
            .iter()
            .filter(|c| is(f, &c.callee, &c.callee_binary))
            .collect();
        let mut callees: Vec<&CallEdge> = p
            .calls
            .iter()
            .filter(|c| is(f, &c.caller, &c.caller_binary))
            .collect();
        if callers.is_empty() && callees.is_empty() {
            continue;
        }
        shown += 1;
        callers.sort_by(|a, b| b.count.total_cmp(&a.count));
        callees.sort_by(|a, b| b.count.total_cmp(&a.count));
        // The function's own row: the calls into it, when any were sampled.
        let (called, records) = if callers.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            (
                si(callers.iter().map(|c| c.count).sum()),
                group(callers.iter().map(|c| c.samples).sum()),
            )
        };
        rows.push([f.name.clone(), f.binary.clone(), called, records]);
        let edge = |arrow: &str, name: &str, binary: &str, c: &CallEdge| {
            [
                format!("  {arrow} {name}"),
                binary.to_string(),
                si(c.count),
                group(c.samples),
            ]
        };
        rows.extend(
            callers
                .iter()
                .map(|c| edge("←", &c.caller, &c.caller_binary, c)),
        );
        rows.extend(
            callees
                .iter()
                .map(|c| edge("→", &c.callee, &c.callee_binary, c)),
        );
    }
    let build = |max: usize| {
        let mut t = new_table(vec!["function", "binary", "calls", "records"], 2);
        for [name, binary, calls, records] in &rows {
            t.add_row(vec![
                ellipsize(name, max),
                ellipsize(&base(binary), max),
                calls.clone(),
                records.clone(),
            ]);
        }
        t
    };
    let records: u64 = p.calls.iter().map(|c| c.samples).sum();
    if shown == 0 {
        return format!(
            "\nno call graph for these functions: none of the {} call records involves them\n",
            group(records)
        );
    }
    format!(
        "\n{}{}\n",
        wrap(
            &format!(
                "call graph (calls only: ← callers, → callees; estimated calls, scaled like \
                 ranges, from {} call records)",
                group(records)
            ),
            width
        ),
        fitted(width, build)
    )
}
