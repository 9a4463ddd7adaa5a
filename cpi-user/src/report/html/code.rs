//! The page's tables: the run's summary, the functions, the call edges, and each hot
//! function's annotated disassembly with its callers.

use std::collections::HashMap;

use serde::Serialize;

use super::{colour, flame, Graph, CODE_FUNCTIONS, TABLE_ROWS};
use crate::profile::model::{
    Estimate, FunctionProfile, InstructionProfile, ProcessProfile, Profile,
};
use crate::report::table::names::short_name;
use crate::report::table::{annotate, ellipsize, pid_text, share_pm, si, time, Notes};
use flame::Width;

/// An amount of the width measure, as the page writes it.
pub fn amount(width: Width, v: f64) -> String {
    match width {
        Width::Cycles => si(v),
        Width::Time => time(v),
        Width::Instructions => si(v),
        Width::Samples => format!("{v:.0}"),
    }
}

fn width_of(f: &FunctionProfile, width: Width) -> f64 {
    match width {
        Width::Cycles => f.measures.cycles.unwrap_or(0.0),
        Width::Time => f.measures.time_ns.unwrap_or(0.0),
        Width::Instructions => f.measures.instructions.unwrap_or(0.0),
        Width::Samples => f.samples as f64,
    }
}

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The run: mode and why, events, duration, losses, processes.
#[derive(Serialize)]
pub struct Summary {
    mode: &'static str,
    description: &'static str,
    reason: String,
    command: String,
    duration: String,
    events: Vec<[String; 5]>,
    lost: u64,
    losses: String,
    accuracy: Vec<[String; 2]>,
}

/// The summary of `p`.
pub fn summary(p: &Profile) -> Summary {
    let events = p
        .events
        .iter()
        .map(|e| {
            [
                e.name.clone(),
                e.role_names(),
                format!("{} {}", e.period, e.unit.name()),
                if e.jitter > 0 {
                    format!("+0..{}", e.jitter)
                } else {
                    "fixed".into()
                },
                e.samples.to_string(),
            ]
        })
        .collect();
    let accuracy = p
        .accuracy
        .iter()
        .flat_map(|a| {
            let pct = |v: f64| format!("{:.1} %", v * 100.0);
            [
                [
                    "instruction overlap with the exact trace".into(),
                    pct(a.overlap_instruction),
                ],
                ["block overlap".into(), pct(a.overlap_block)],
                ["function overlap".into(), pct(a.overlap_function)],
                [
                    "median CPI error (functions ≥ 2 % of cycles)".into(),
                    a.cpi_error_median.map_or("-".into(), pct),
                ],
            ]
        })
        .collect();
    Summary {
        mode: p.mode.name(),
        description: p.mode.description(),
        reason: p.mode_reason.clone(),
        command: p.command.join(" "),
        duration: format!("{:.2} s", p.duration_secs),
        events,
        lost: p.lost.lost(),
        losses: p.lost.breakdown(),
        accuracy,
    }
}

/// The functions with annotated code on the page, hottest first: (process, function).
fn hot_functions(p: &Profile, width: Width) -> Vec<(usize, usize)> {
    let mut all: Vec<(f64, usize, usize)> = p
        .processes
        .iter()
        .enumerate()
        .flat_map(|(pi, pr)| {
            pr.functions
                .iter()
                .enumerate()
                .map(move |(fi, f)| (width_of(f, width), pi, fi))
        })
        .filter(|(w, _, _)| *w > 0.0)
        .collect();
    let total: f64 = all.iter().map(|a| a.0).sum();
    all.retain(|a| a.0 >= CODE_MIN_SHARE * total);
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    all.into_iter()
        .take(CODE_FUNCTIONS)
        .map(|(_, pi, fi)| (pi, fi))
        .collect()
}

/// Functions with less than this share of the whole get no code section.
const CODE_MIN_SHARE: f64 = 0.005;

/// For the frames: function name and binary file name → its code section.
pub(crate) fn code_ids(p: &Profile, width: Width) -> HashMap<(String, String), usize> {
    let mut ids = HashMap::new();
    for (id, (pi, fi)) in hot_functions(p, width).into_iter().enumerate() {
        let f = &p.processes[pi].functions[fi];
        ids.entry((f.name.clone(), base(&f.binary).to_string()))
            .or_insert(id);
    }
    ids
}

/// One row of the functions table; its strings are numbers in the page's
/// [`super::Strings`].
#[derive(Serialize)]
pub(crate) struct FunctionRow {
    name: usize,
    /// The name as the terminal shortens it (the full one is the cell's tooltip).
    short: usize,
    comm: usize,
    pid: u32,
    /// The pid, or `N pids` for processes of one name merged.
    pid_text: String,
    binary: usize,
    samples: u64,
    share: f64,
    /// The share as the tables write it, with its sampling error in a time profile.
    share_text: String,
    amount: String,
    width: f64,
    instructions: Option<f64>,
    instructions_text: String,
    cpi: Option<f64>,
    cpi_text: String,
    /// The timed CPI (from the branch records' cycle counts) as the terminal's table
    /// writes it, `≠` where it and the CPI disagree; its value for sorting.
    timed: Option<f64>,
    timed_text: String,
    /// The CPI cell's fills: against the process's CPI, and on the absolute scale.
    fill: String,
    abs_fill: String,
    code: Option<usize>,
}

/// The functions of every process, hottest first, at most [`TABLE_ROWS`].
pub(crate) fn table_rows(
    p: &Profile,
    look: &super::Look,
    total: f64,
    pids: &std::collections::BTreeMap<String, usize>,
) -> Vec<FunctionRow> {
    let (width, counts, cpi) = (look.width, look.counts, look.cpi);
    let ids: HashMap<(usize, usize), usize> = hot_functions(p, width)
        .into_iter()
        .enumerate()
        .map(|(id, k)| (k, id))
        .collect();
    let all_samples: u64 = p.processes.iter().map(|pr| pr.samples).sum();
    let mut all: Vec<_> = p
        .processes
        .iter()
        .enumerate()
        .flat_map(|(pi, pr)| {
            pr.functions
                .iter()
                .enumerate()
                .map(move |(fi, f)| (pi, pr, fi, f))
        })
        // Every function the terminal lists: sampled, or with a measure (a function
        // only branch records reached has instructions and no samples).
        .filter(|(_, _, _, f)| {
            f.samples > 0
                || width_of(f, width) > 0.0
                || (counts && f.measures.instructions.is_some_and(|i| i > 0.0))
        })
        .collect();
    all.sort_by(|a, b| {
        (width_of(b.3, width).total_cmp(&width_of(a.3, width))).then(a.3.name.cmp(&b.3.name))
    });
    all.truncate(TABLE_ROWS);
    let strings = look.strings;
    all.into_iter()
        .map(|(pi, pr, fi, f)| {
            let w = width_of(f, width);
            let est = f.measures.cpi.filter(|_| cpi);
            let (fill, abs_fill) = cpi_fills(look, est, pr, f.samples);
            FunctionRow {
                name: strings.id(&f.name),
                short: strings.id(&short_name(&f.name)),
                comm: strings.id(&pr.comm),
                pid: pr.pid,
                pid_text: pid_text(pr, pids),
                binary: strings.id(base(&f.binary)),
                samples: f.samples,
                share: if total > 0.0 { w / total } else { 0.0 },
                share_text: share_pm(
                    p.mode,
                    if total > 0.0 { w / total } else { 0.0 },
                    all_samples,
                    &Notes::default(),
                ),
                amount: amount(width, w),
                width: w,
                instructions: f.measures.instructions.filter(|_| counts),
                instructions_text: f
                    .measures
                    .instructions
                    .filter(|_| counts)
                    .map_or("-".into(), si),
                cpi: est.map(|e| e.value),
                cpi_text: cpi_text(est.map(|e| (e.value, e.rel_error)), cpi),
                timed: f.timed_cpi.map(|e| e.value),
                timed_text: timed_cell(f),
                fill,
                abs_fill,
                code: ids.get(&(pi, fi)).copied(),
            }
        })
        .collect()
}

/// The two fills of a CPI cell (see [`colour::fills`]): `est` against the CPI of its
/// process `pr`, as the flame graph sets a frame's self CPI against it, and on the
/// absolute scale; `samples` the samples behind `est`. A cell without a CPI is grey
/// on both scales: the legend's "too few samples".
pub(super) fn cpi_fills(
    look: &super::Look,
    est: Option<Estimate>,
    pr: &ProcessProfile,
    samples: u64,
) -> (String, String) {
    if est.is_none() {
        let none = colour::frame(look.cpi, None);
        return (none.clone(), none);
    }
    let pair = |e: Estimate| (e.value, e.rel_error);
    let reference = pr.measures.cpi.filter(|_| look.cpi).map(pair);
    colour::fills(
        look.cpi,
        est.map(|e| e.value),
        est.map(pair),
        reference,
        samples,
    )
}

/// A function's timed CPI as the terminal's top-functions table writes it: `v ±e%`
/// (` ≠` where it and the sampled CPI disagree), `below floor` where it had the
/// inputs and samples but too few, else `-`. Never withheld: it is the branch
/// records' own.
fn timed_cell(f: &FunctionProfile) -> String {
    match f.timed_cpi {
        Some(e) => format!(
            "{:.2} ±{:.1}%{}",
            e.value,
            e.rel_error * 100.0,
            if f.cpi_disagree { " ≠" } else { "" }
        ),
        None if f.measures.instructions.is_some() && f.samples > 0 => "below floor".into(),
        None => "-".into(),
    }
}

/// Whether any row has a timed CPI (the functions table's column, as the terminal's).
pub(crate) fn any_timed(rows: &[FunctionRow]) -> bool {
    rows.iter().any(|r| r.timed.is_some())
}

fn cpi_text(est: Option<(f64, f64)>, cpi: bool) -> String {
    match (cpi, est) {
        (false, _) => "-".into(),
        (true, None) => "too few samples".into(),
        (true, Some((v, rel))) => format!("{v:.2} ±{:.1}%", rel * 100.0),
    }
}

/// One hot function's section: headline, callers, annotated code; its name, binary
/// and comm numbers in the page's [`super::Strings`].
#[derive(Serialize)]
pub(crate) struct CodeSection {
    id: usize,
    name: usize,
    binary: usize,
    comm: usize,
    pid: u32,
    headline: String,
    source: Option<String>,
    callers: Graph,
    rows: Vec<CodeRow>,
    dropped_rows: usize,
}

/// One row of annotated code: a block header, a gap, a source line or an instruction.
#[derive(Serialize, Default)]
pub(crate) struct CodeRow {
    kind: &'static str,
    address: String,
    count: String,
    samples: u64,
    cycles: String,
    cpi: String,
    /// The CPI's fills (a block's outline, an instruction's cell): against the
    /// process's CPI, and on the absolute scale; empty without a CPI.
    fill: String,
    abs_fill: String,
    heat: String,
    text: String,
    hot: bool,
}

/// Instructions shown per function; past it the page says how many were left out.
const CODE_ROWS: usize = 3000;

/// The sections of the [`CODE_FUNCTIONS`] hottest functions.
pub(super) fn sections(p: &Profile, look: &super::Look) -> Vec<CodeSection> {
    let width = look.width;
    hot_functions(p, width)
        .into_iter()
        .enumerate()
        .map(|(id, (pi, fi))| {
            let pr = &p.processes[pi];
            let f = &pr.functions[fi];
            let tree = flame::callers_of(p, width, &f.name, base(&f.binary));
            let total = tree.nodes[0].total.width;
            let (frames, dropped) = super::svg_frames(&tree, true, look, total);
            let writer = p.binaries.iter().find(|b| b.path == f.binary);
            let sources = annotate::source_rows(&f.lines, writer.and_then(|b| b.owner));
            let rows = code_rows(pr, f, look, &sources);
            CodeSection {
                id,
                name: look.strings.id(&f.name),
                binary: look.strings.id(&f.binary),
                comm: look.strings.id(&pr.comm),
                pid: pr.pid,
                headline: headline(f, look),
                source: f.source.as_ref().map(|s| format!("{}:{}", s.file, s.line)),
                callers: Graph::of(frames, dropped),
                dropped_rows: rows.len().saturating_sub(CODE_ROWS),
                rows: rows.into_iter().take(CODE_ROWS).collect(),
            }
        })
        .collect()
}

fn headline(f: &FunctionProfile, look: &super::Look) -> String {
    let (width, cpi) = (look.width, look.cpi);
    let mut s = format!(
        "{:x}-{:x}, {} bytes, {} samples, {} {}",
        f.address,
        f.address + f.size,
        f.size,
        f.samples,
        amount(width, width_of(f, width)),
        width.name()
    );
    if look.counts && width != Width::Instructions {
        s.push_str(&format!(
            ", {} instructions",
            f.measures.instructions.map_or("-".into(), si)
        ));
    }
    if look.counts {
        s.push_str(&format!(
            ", CPI {}{}",
            cpi_text(f.measures.cpi.map(|e| (e.value, e.rel_error)), cpi),
            timed_text(f.timed_cpi.filter(|_| cpi), f.cpi_disagree)
        ));
    }
    s
}

/// `, timed CPI v ±e%` (from the branch records' cycle counts), with ` ≠` where it
/// and the sampled CPI disagree; empty without one.
fn timed_text(timed: Option<crate::profile::model::Estimate>, disagree: bool) -> String {
    timed.map_or(String::new(), |e| {
        format!(
            ", timed CPI {:.2} ±{:.1}%{}",
            e.value,
            e.rel_error * 100.0,
            if disagree { " ≠" } else { "" }
        )
    })
}

/// The weight an instruction is ranked and heat-mapped by: the page's width measure
/// (cycles, instructions), else samples.
fn weight(l: &InstructionProfile, width: Width) -> f64 {
    match width {
        Width::Cycles => l.cycles.unwrap_or(0.0),
        Width::Instructions => l.count,
        Width::Time | Width::Samples => l.samples as f64,
    }
}

/// The rows of `f`'s annotated code: block headers (CPI ± error, and the timed CPI
/// with `≠` where the two disagree), gaps, the source lines as the terminal's annotate
/// gives them (`sources`: `file:line` and the line's text where readable), and the
/// instructions.
fn code_rows(
    pr: &ProcessProfile,
    f: &FunctionProfile,
    look: &super::Look,
    sources: &[Option<String>],
) -> Vec<CodeRow> {
    let (width, cpi) = (look.width, look.cpi);
    let total: f64 = f.lines.iter().map(|l| weight(l, width)).sum();
    let hottest = f
        .lines
        .iter()
        .filter(|l| weight(l, width) > 0.0)
        .max_by(|a, b| weight(a, width).total_cmp(&weight(b, width)))
        .map(|l| l.address);
    let mut rows = Vec::new();
    let gaps = annotate::gaps(&f.lines, &f.blocks);
    for ((l, gap), source) in f.lines.iter().zip(gaps).zip(sources) {
        if let Some(b) = f.blocks.iter().find(|b| b.start == l.address) {
            let est = b.cpi.filter(|_| cpi);
            let (fill, abs_fill) = cpi_fills(look, est, pr, b.samples);
            rows.push(CodeRow {
                kind: "block",
                address: format!("{:x}", b.start),
                text: format!(
                    "block {:x}-{:x}: {} instructions, ×{}, CPI {}{}",
                    b.start,
                    b.end,
                    b.len,
                    si(b.count),
                    cpi_text(est.map(|e| (e.value, e.rel_error)), cpi),
                    timed_text(b.timed_cpi.filter(|_| cpi), b.cpi_disagree)
                ),
                fill,
                abs_fill,
                ..CodeRow::default()
            });
        } else if gap {
            rows.push(CodeRow {
                kind: "gap",
                text: "⋯".into(),
                ..CodeRow::default()
            });
        }
        if let Some(text) = source {
            rows.push(CodeRow {
                kind: "source",
                text: text.clone(),
                ..CodeRow::default()
            });
        }
        rows.push(instruction_row(pr, f, l, look, total, hottest));
    }
    rows
}

fn instruction_row(
    pr: &ProcessProfile,
    f: &FunctionProfile,
    l: &InstructionProfile,
    look: &super::Look,
    total: f64,
    hottest: Option<u64>,
) -> CodeRow {
    let est = l.cpi.filter(|_| look.cpi);
    let (fill, abs_fill) = match est {
        Some(_) => cpi_fills(look, est, pr, l.samples),
        None => Default::default(),
    };
    CodeRow {
        kind: "insn",
        address: format!("{:x}", l.address),
        count: if look.counts {
            si(l.count)
        } else {
            String::new()
        },
        samples: l.samples,
        cycles: l.cycles.filter(|_| look.counts).map_or(String::new(), si),
        cpi: est.map_or(String::new(), |e| {
            format!("{:.2} ±{:.0}%", e.value, e.rel_error * 100.0)
        }),
        fill,
        abs_fill,
        heat: colour::heat(if total > 0.0 {
            weight(l, look.width) / total
        } else {
            0.0
        }),
        text: jump_targets(&l.text, pr, f),
        hot: hottest == Some(l.address),
    }
}

/// An instruction's text with a branch target named as perf names it,
/// `jne 11e0 <leaf+0x20>` (the terminal's annotate does the same), the name as the
/// terminal shortens it and at most [`TARGET_NAME`] characters: every instruction
/// that branches to a function would otherwise write its name again.
fn jump_targets(text: &str, pr: &ProcessProfile, f: &FunctionProfile) -> String {
    let named = annotate::named_target(text, |addr| {
        pr.functions
            .iter()
            .find(|g| g.binary == f.binary && g.address <= addr && addr < g.address + g.size)
            .map(|g| (g.name.as_str(), g.address))
    });
    let Some((head, inner)) = named.strip_suffix('>').and_then(|t| t.rsplit_once(" <")) else {
        return named;
    };
    let (name, off) = match inner.rfind('+') {
        Some(i) => inner.split_at(i),
        None => (inner, ""),
    };
    let short = ellipsize(&short_name(name), TARGET_NAME);
    format!("{head} <{short}{off}>")
}

/// The most characters of a branch target's name in annotated code.
const TARGET_NAME: usize = 60;

/// One calls-only edge (from branch records), its names numbers in the page's
/// [`super::Strings`].
#[derive(Serialize)]
pub(crate) struct EdgeRow {
    comm: usize,
    caller: usize,
    callee: usize,
    count: String,
}

/// The most frequent calls of every process (CPI profiles with branch records).
pub(crate) fn call_edges(p: &Profile, strings: &super::Strings) -> Vec<EdgeRow> {
    let mut all: Vec<_> = p
        .processes
        .iter()
        .flat_map(|pr| pr.calls.iter().map(move |c| (pr, c)))
        .collect();
    all.sort_by(|a, b| b.1.count.total_cmp(&a.1.count));
    all.into_iter()
        .take(100)
        .map(|(pr, c)| EdgeRow {
            comm: strings.id(&flame::process_name(pr)),
            caller: strings.id(&c.caller),
            callee: strings.id(&c.callee),
            count: si(c.count),
        })
        .collect()
}
