//! `--format html`: one self-contained page (no network request, no server) with the
//! run's summary, a sortable table of the functions, a flame graph of the call stacks
//! coloured by CPI (`flame`), the callers of the hottest functions, and their
//! annotated disassembly (`code`).
//!
//! The page is a minijinja template with HTML auto-escaping: every name in it came from
//! another process and reaches the page only as text. A Content-Security-Policy of
//! `default-src 'none'` keeps the page from loading anything, whatever a name holds.
//!
//! Each distinct string another process chose (function names, binaries, comms) is
//! written once, in the page's string table (`Strings`); frames and rows refer to it
//! by number and the page's script puts the text in place. A name reached from many
//! callers was written once per frame, twice with its tooltip: a 256 KiB name called
//! from 200 functions made a 639 MB page.
//!
//! Size: frames narrower than `MIN_FRAME` of the whole are left out (their share is in
//! their parents' widths, and the page says how many), annotated code is given for the
//! `CODE_FUNCTIONS` hottest functions, and the table keeps `TABLE_ROWS` rows.

mod blocks;
mod code;
pub(crate) mod colour;
mod diff;
pub(crate) mod flame;
pub mod series;

pub use diff::render_diff;

use std::cell::RefCell;
use std::collections::HashMap;

use minijinja::{context, Environment};
use serde::Serialize;

use crate::profile::model::Profile;
use crate::profile::AnalysisOptions;
use flame::{Sums, Tree, Width};

/// Frames narrower than this fraction of the root (0.6 px of a 1 200 px graph) are
/// not drawn.
pub(crate) const MIN_FRAME: f64 = 0.0005;
/// Functions whose annotated code and callers the page holds, hottest first.
pub(crate) const CODE_FUNCTIONS: usize = 40;
/// Rows of the functions table.
pub(crate) const TABLE_ROWS: usize = 5000;

/// The graph's width in SVG units and a frame's height.
const GRAPH_WIDTH: f64 = 1200.0;
const FRAME_HEIGHT: f64 = 17.0;

/// Why a page could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HtmlError {
    /// The template failed to render (a bug: the template is built in).
    #[error("rendering the HTML page")]
    Template(#[from] minijinja::Error),
}

const PAGE: &str = include_str!("page.html");
const DIFF_PAGE: &str = include_str!("diff.html");
const GRAPH: &str = include_str!("graph.html");
const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// The HTML page of `p`.
pub fn render(p: &Profile) -> Result<String, HtmlError> {
    render_range(p, &[])
}

/// The HTML page of `p`, merged from the windows of a store range whose totals are
/// `series` (charted over time). Processes of one name are one, as the terminal merges
/// them (its list and shares), `N pids` where there were several.
pub fn render_range(p: &Profile, series: &[series::WindowTotals]) -> Result<String, HtmlError> {
    let (processes, pids) = crate::report::table::by_name(p);
    let merged;
    let p = match processes {
        std::borrow::Cow::Borrowed(_) => p,
        std::borrow::Cow::Owned(processes) => {
            merged = Profile {
                processes,
                ..p.clone()
            };
            &merged
        }
    };
    let width = Width::of(p);
    let cpi = flame::has_cpi(p);
    let floor = AnalysisOptions::default().sample_floor;
    let mut tree = flame::callers_first(p, width, flame::ProcessKey::Pid);
    tree.name_merged_processes(p, &pids);
    let total = tree.nodes[0].total.width;
    let ids = code::code_ids(p, width);
    let strings = Strings::default();
    let look = Look {
        width,
        counts: p.mode.has_cpi(),
        cpi,
        floor,
        ids: &ids,
        strings: &strings,
    };
    let (frames, dropped) = svg_frames(&tree, false, &look, total);
    let functions = code::table_rows(p, &look, total, &pids);
    let functions_timed = code::any_timed(&functions);
    let code = code::sections(p, &look);
    let (blocks, all_blocks) = blocks::rows(p, &look);
    let page = environment()?.get_template("page.html")?.render(context! {
        title => title(p),
        summary => code::summary(p),
        width_name => width.name(),
        counts => look.counts,
        cpi => cpi,
        uncoloured => uncoloured(p),
        heat_of => match width {
            Width::Cycles | Width::Instructions => width.name(),
            Width::Time | Width::Samples => "samples",
        },
        scale => colour::SCALE,
        relative_scale => colour::RELATIVE_SCALE,
        graph => Graph::of(frames, dropped),
        functions => functions,
        table_rows => TABLE_ROWS,
        functions_timed => functions_timed,
        timed => blocks::any_timed(&blocks),
        blocks => blocks,
        all_blocks => all_blocks,
        code => code,
        calls => code::call_edges(p, &strings),
        chart => series::Chart::of(series),
        strings => strings.json(),
        script => SCRIPT,
        style => STYLE,
    })?;
    Ok(page)
}

/// The page templates (`.html`: auto-escaped).
fn environment() -> Result<Environment<'static>, HtmlError> {
    let mut env = Environment::new();
    env.add_template("graph.html", GRAPH)?;
    env.add_template("page.html", PAGE)?;
    env.add_template("diff.html", DIFF_PAGE)?;
    Ok(env)
}

/// Why the frames of `p` are not coloured by CPI, for the legend: the reason it
/// withholds CPI, else what its events count (their names, as the recording or the
/// collector gave them).
fn uncoloured(p: &Profile) -> String {
    if let Some(why) = &p.cpi_withheld {
        return format!("{why}.");
    }
    let any = |f: fn(&crate::profile::model::ProcessProfile) -> bool| p.processes.iter().any(f);
    let counted = match (
        any(|pr| pr.measures.cycles.is_some()),
        any(|pr| pr.measures.instructions.is_some()),
    ) {
        (true, true) => "cycles and instructions, but too few samples for a CPI",
        (true, false) => "cycles but no instructions",
        (false, true) => "instructions but no cycles",
        (false, false) => "neither cycles nor instructions",
    };
    let events: Vec<&str> = p.events.iter().map(|e| e.name.as_str()).collect();
    let events = if events.is_empty() {
        "none recorded".to_string()
    } else {
        events.join(", ")
    };
    format!("its events ({events}) count {counted}, so there is no CPI to show.")
}

fn title(p: &Profile) -> String {
    if p.command.is_empty() {
        format!("cpi-bpf: {} profile", p.mode.name())
    } else {
        format!("cpi-bpf: {}", p.command.join(" "))
    }
}

/// The page's distinct strings, each held once in the order first asked for: the
/// template writes their numbers and `page.js` their text.
#[derive(Default)]
pub(crate) struct Strings(RefCell<HashMap<String, usize>>);

impl Strings {
    /// The number of `s` in the table.
    pub(crate) fn id(&self, s: &str) -> usize {
        let mut all = self.0.borrow_mut();
        if let Some(&i) = all.get(s) {
            return i;
        }
        let i = all.len();
        all.insert(s.to_string(), i);
        i
    }

    /// The table as a JSON array for a `<script type="application/json">`: `<`, `>`
    /// and `&` (which JSON has only inside strings) written as `\u` escapes, so no
    /// string can close the element or open a comment.
    fn json(self) -> String {
        let mut all: Vec<(String, usize)> = self.0.into_inner().into_iter().collect();
        all.sort_unstable_by_key(|a| a.1);
        let all: Vec<String> = all.into_iter().map(|a| a.0).collect();
        let json = serde_json::to_string(&all).expect("strings serialise");
        json.replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026")
    }
}

/// A graph as the template draws it.
#[derive(Serialize)]
struct Graph {
    frames: Vec<SvgFrame>,
    height: f64,
    dropped: usize,
}

impl Graph {
    fn of(frames: Vec<SvgFrame>, dropped: usize) -> Graph {
        let height = frames.iter().map(|f| f.y).fold(0.0, f64::max) + FRAME_HEIGHT;
        Graph {
            frames,
            height,
            dropped,
        }
    }
}

/// One frame as drawn: its place, colour, label and numbers (also in data attributes,
/// for scripts and tests).
#[derive(Serialize)]
struct SvgFrame {
    #[serde(skip)]
    node: usize,
    /// The name, the name as the terminal shortens it (the label's text) where that
    /// differs, and the binary: numbers in the page's [`Strings`].
    name: usize,
    short: Option<usize>,
    binary: usize,
    /// Fraction of the root, and in SVG units.
    fx: f64,
    fw: f64,
    x: String,
    w: String,
    y: f64,
    depth: usize,
    /// The fill shown: the relative scale (by default), and the absolute one.
    fill: String,
    abs_fill: String,
    /// The tooltip's numbers (the page puts the name and binary above them).
    tip: String,
    width: f64,
    self_width: f64,
    cycles: Option<f64>,
    instructions: Option<f64>,
    cpi: Option<f64>,
    cpi_error: Option<f64>,
    /// The frame's own (self) figures: the stacks that end in it.
    self_cycles: Option<f64>,
    self_instructions: Option<f64>,
    self_cpi: Option<f64>,
    self_cpi_error: Option<f64>,
    self_samples: u64,
    /// The CPI its relative colour is set against.
    reference_cpi: Option<f64>,
    reference_cpi_error: Option<f64>,
    samples: u64,
    share: f64,
    code: Option<usize>,
    /// In a differential graph: the frame's change against the base.
    change: Option<diff::FrameChange>,
}

/// How frames are measured, coloured and linked.
struct Look<'a> {
    width: Width,
    /// Whether the profile's mode counts instructions (the tables' instructions and
    /// CPI columns, as the terminal's).
    counts: bool,
    /// Whether the profile has CPI to colour by.
    cpi: bool,
    /// The profile's sample floor for a CPI.
    floor: u64,
    /// Function name and binary file name → its code section.
    ids: &'a HashMap<(String, String), usize>,
    /// The page's strings.
    strings: &'a Strings,
}

/// A frame's CPI figures: its subtree's and its own (self), each ± relative error, and
/// what its relative colour is set against.
struct FrameCpi {
    total: Option<(f64, f64)>,
    own: Option<(f64, f64)>,
    reference: Option<(f64, f64)>,
}

impl FrameCpi {
    /// In a flame graph, the self CPI against the process's; in a callers icicle
    /// (whose root is the function), the frame's CPI against the function's.
    fn of(
        t: &Tree,
        i: usize,
        icicle: bool,
        look: &Look,
        processes: &[Option<(f64, f64)>],
    ) -> FrameCpi {
        if !look.cpi {
            return FrameCpi {
                total: None,
                own: None,
                reference: None,
            };
        }
        let n = &t.nodes[i];
        let total = n.total.cpi(look.floor);
        if icicle {
            return FrameCpi {
                total,
                own: total,
                reference: t.nodes[0].total.cpi(look.floor),
            };
        }
        // A process's (and the root's) CPI is the profile's own estimate, the figure
        // the tables and the chart give, not its cycles over its instructions (which
        // count cycles in code the estimate leaves out).
        let process = i == 0 || n.parent == 0;
        FrameCpi {
            total: if process { processes[i] } else { total },
            own: n.own.cpi(look.floor),
            reference: processes[i],
        }
    }

    /// The fill on the relative scale (the page's default) and on the absolute one.
    fn fills(&self, look: &Look, own_samples: u64) -> (String, String) {
        let abs = self.total.map(|e| e.0);
        colour::fills(look.cpi, abs, self.own, self.reference, own_samples)
    }
}

/// The frames of `t` for the page: a flame graph (root at the bottom), or an icicle
/// (root at the top) for a callers view.
fn svg_frames(t: &Tree, icicle: bool, look: &Look, total: f64) -> (Vec<SvgFrame>, usize) {
    let (frames, dropped) = flame::layout(t, MIN_FRAME);
    let processes = t.process_cpis();
    let max_depth = frames.iter().map(|f| f.depth).max().unwrap_or(0);
    let out = frames
        .iter()
        .map(|f| {
            let n = &t.nodes[f.node];
            let y = if icicle { f.depth } else { max_depth - f.depth } as f64 * FRAME_HEIGHT;
            let px = f.w * GRAPH_WIDTH;
            let est = FrameCpi::of(t, f.node, icicle, look, &processes);
            let short = crate::report::table::names::short_name(&n.name);
            let own = if icicle { n.total } else { n.own };
            let (fill, abs_fill) = est.fills(look, own.samples);
            let counted = |v: f64| look.counts.then_some(v);
            let cycles =
                |s: &Sums| (look.counts && look.width == Width::Cycles).then_some(s.cycles);
            SvgFrame {
                node: f.node,
                tip: tip((&n.total, &own), look, &est, total),
                name: look.strings.id(&n.name),
                short: (short != n.name).then(|| look.strings.id(&short)),
                binary: look.strings.id(&n.binary),
                fx: f.x,
                fw: f.w,
                x: format!("{:.2}", f.x * GRAPH_WIDTH),
                w: format!("{px:.2}"),
                y,
                depth: f.depth,
                fill,
                abs_fill,
                width: n.total.width,
                self_width: t.self_width(f.node),
                cycles: cycles(&n.total),
                instructions: counted(n.total.instructions),
                cpi: est.total.map(|e| e.0),
                cpi_error: est.total.map(|e| e.1),
                self_cycles: cycles(&own),
                self_instructions: counted(own.instructions),
                self_cpi: est.own.map(|e| e.0),
                self_cpi_error: est.own.map(|e| e.1),
                self_samples: own.samples,
                reference_cpi: est.reference.map(|e| e.0),
                reference_cpi_error: est.reference.map(|e| e.1),
                samples: n.total.samples,
                share: if total > 0.0 {
                    n.total.width / total
                } else {
                    0.0
                },
                code: look.ids.get(&(n.name.clone(), n.binary.clone())).copied(),
                change: None,
            }
        })
        .collect();
    (out, dropped)
}

/// A frame's tooltip below its name and binary: width measure and share, and where
/// there are CPIs its self and total CPI ± error with the cycles and instructions
/// behind each.
fn tip((s, own): (&Sums, &Sums), look: &Look, est: &FrameCpi, total: f64) -> String {
    let width = look.width;
    let share = |w: f64| if total > 0.0 { 100.0 * w / total } else { 0.0 };
    let mut t = format!(
        "{}: {} ({:.2} %), self {} ({:.2} %)",
        width.name(),
        code::amount(width, s.width),
        share(s.width),
        code::amount(width, own.width),
        share(own.width),
    );
    let si = crate::report::table::si;
    if look.counts && width != Width::Instructions {
        t.push_str(&format!(
            "\ninstructions: {}, self {}",
            si(s.instructions),
            si(own.instructions)
        ));
    }
    if look.cpi {
        let cpi = |e: Option<(f64, f64)>| match e {
            Some((v, rel)) => format!("{v:.2} ± {:.1} %", rel * 100.0),
            None => "too few samples".into(),
        };
        t.push_str(&format!(
            "\nself CPI: {}, total CPI: {}",
            cpi(est.own),
            cpi(est.total)
        ));
        if let Some((r, _)) = est.reference {
            t.push_str(&format!(" (against {r:.2})"));
        }
    }
    t.push_str(&format!("\nsamples: {}, self {}", s.samples, own.samples));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_string_is_held_once_and_cannot_close_its_element() {
        let s = Strings::default();
        assert_eq!(s.id("main"), 0);
        assert_eq!(s.id("</script><!--&"), 1);
        assert_eq!(s.id("main"), 0);
        let json = s.json();
        assert!(!json.contains(['<', '>', '&']), "{json}");
        let back: Vec<String> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ["main", "</script><!--&"]);
    }
}
