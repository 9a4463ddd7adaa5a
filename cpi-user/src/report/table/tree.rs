//! The call tree as perf's `report --children` prints it: one row per node, indented by
//! depth, with inclusive ("children") and self shares, and CPI where the mode has it;
//! recursion folded (cpi-user/src/profile/paths.rs, `folded_tree`), names shortened
//! (names.rs), branches below [`MIN_SHARE`] left out.

use super::Notation;
use super::{
    cpi, ellipsize, finish, fitted, inputs, new_table, or_unknown, sample_floor, share, time,
    Notes, Shares, MIN_NAME,
};
use crate::profile::model::{Mode, ProcessProfile};
use crate::profile::paths::{self, PathTotals};

/// Branches with less than this share of the table's total are not shown (perf's
/// default call-graph threshold, 0.5 %).
pub(super) const MIN_SHARE: f64 = 0.005;

/// Levels indented; deeper rows say their depth instead, so a deep stack keeps its
/// names on an 80-column terminal.
const MAX_INDENT: usize = 10;

/// One row of the tree.
struct Row {
    depth: usize,
    name: String,
    /// Recursion folded into the node: marked `↻` after the name, never cut off.
    recursive: bool,
    inclusive: PathTotals,
    own: PathTotals,
}

/// The rows of `procs`' folded trees in preorder, each process under a row of its own
/// when there are several; at most `top` rows.
fn rows(procs: &[&ProcessProfile], total: f64, top: usize) -> (Vec<Row>, bool) {
    let many = procs.len() > 1;
    let mut out = Vec::new();
    let mut cut = false;
    // Processes by their share, hottest first, as each tree's roots are.
    let weight = |pr: &ProcessProfile| pr.stacks.iter().map(paths::weight).sum::<f64>();
    let mut procs = procs.to_vec();
    procs.sort_by(|a, b| weight(b).total_cmp(&weight(a)));
    for pr in procs {
        let tree = paths::folded_tree(&pr.stacks);
        let shift = usize::from(many);
        if many {
            let mut inclusive = PathTotals::default();
            pr.stacks.iter().for_each(|s| inclusive.add(s));
            out.push(Row {
                depth: 0,
                name: format!("[{}]", or_unknown(&pr.comm)),
                recursive: false,
                inclusive,
                own: PathTotals::default(),
            });
        }
        let mut skip_below: Option<usize> = None;
        for i in tree.preorder() {
            let n = &tree.nodes[i];
            // A node under a hidden one is hidden with it.
            if skip_below.is_some_and(|d| n.depth > d) {
                continue;
            }
            skip_below = None;
            if n.inclusive.weight() < MIN_SHARE * total {
                skip_below = Some(n.depth);
                continue;
            }
            if out.len() == top {
                cut = true;
                break;
            }
            out.push(Row {
                depth: n.depth + shift,
                name: n.function.clone(),
                recursive: n.recursive,
                inclusive: n.inclusive.clone(),
                own: n.own.clone(),
            });
        }
    }
    (out, cut)
}

/// The indentation of a row at `depth`, and a depth mark past [`MAX_INDENT`] (which
/// the legend explains).
fn indent(depth: usize, notes: &Notes) -> String {
    let mut s = "  ".repeat(depth.min(MAX_INDENT));
    if depth > MAX_INDENT {
        s.push_str(&format!("[{depth}] "));
        notes.add(Notation::Depth);
    }
    s
}

/// A row's name column: indentation and name within `max` characters (a shallow row
/// keeps more of its name than a deep one), then the recursion mark.
fn row_name(r: &Row, max: usize, notes: &Notes) -> String {
    let pad = indent(r.depth, notes);
    let room = max.saturating_sub(pad.chars().count()).max(MIN_NAME);
    let mark = if r.recursive { " ↻" } else { "" };
    format!("{pad}{}{mark}", ellipsize(&r.name, room))
}

/// The call tree of `procs`: shares of `total` (the weight of every path), the time
/// profile's shares with their sampling error over `samples`.
pub(super) fn call_tree_table(
    mode: Mode,
    procs: &[&ProcessProfile],
    totals: Shares,
    top: usize,
    width: Option<usize>,
    notes: &Notes,
) -> String {
    let (rows, cut) = rows(procs, totals.weight, top);
    if rows.is_empty() {
        return String::new();
    }
    let floor = sample_floor();
    let build = |max: usize| {
        let mut h = vec!["function (↻ recursion folded)", "incl", "self"];
        if mode.has_cpi() {
            h.extend(["CPI incl", "CPI self"]);
        } else {
            h.push("CPU time");
        }
        let mut t = new_table(h, 1);
        for r in &rows {
            let (i, o) = (&r.inclusive, &r.own);
            let mut row = vec![
                row_name(r, max, notes),
                share(mode, i.weight(), totals, notes),
                share(mode, o.weight(), totals, notes),
            ];
            if mode.has_cpi() {
                row.extend([
                    cpi(
                        i.cpi(floor),
                        i.samples,
                        inputs(i.cycles, i.instructions),
                        notes,
                    ),
                    cpi(
                        o.cpi(floor),
                        o.samples,
                        inputs(o.cycles, o.instructions),
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
    let what = if mode.has_cpi() { "cycles" } else { "CPU time" };
    let title = format!(
        "call tree: inclusive and self {what}{} (branches under {}% not shown)",
        if cut {
            format!(", first {top} rows")
        } else {
            String::new()
        },
        MIN_SHARE * 100.0
    );
    finish(&title, &fitted(width, build), rows.len(), rows.len(), width)
}
