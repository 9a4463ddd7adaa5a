//! Human tables: the run header (mode first, losses always), top functions, hot blocks,
//! `--annotate FUNC`, and `--callgraph` (callers and callees from the branch records that
//! are calls); where samples carried stacks, the hottest call paths, the call tree's
//! inclusive and self CPI, and `--callers FUNC` (the paths into FUNC). A time profile (no PMU) gets the same views over samples and
//! CPU time, and says so; units below the sample floor say so instead of a number. A
//! profile with an accuracy (`cpi-bpf simulate`) ends with it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use comfy_table::{presets, CellAlignment, Table, TableComponent};

use crate::profile::merge;
use crate::profile::model::{
    unreadable_code_share, Accuracy, BlockProfile, CallEdge, Estimate, FunctionProfile, Mode,
    ProcessProfile, Profile, StackProfile, UNREADABLE_CODE_CEILING,
};
use crate::profile::paths::{self, PathNode};

mod accuracy;
pub(crate) mod annotate;
mod blocks;
mod calls;
mod header;
mod legend;
pub(crate) mod names;
mod pathtext;
mod tree;

use accuracy::accuracy;
use blocks::hot_blocks;
use calls::{call_graph, call_paths, callers_table};
use header::header;
use legend::legend;
pub(crate) use legend::{Notation, Notes};

/// What to render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableOptions {
    /// Rows per table (functions, blocks).
    pub top: usize,
    /// Show this function's annotated disassembly instead of the top tables.
    pub annotate: Option<String>,
    /// Show the calls-only call graph instead of the top tables: callers and callees
    /// of the hottest functions, or of `annotate`'s function after its disassembly.
    pub callgraph: bool,
    /// The widest line, in characters: C++ and Rust names are shortened as perf
    /// shortens templates (`fill<…>(…)`, names.rs), and names longer than their column
    /// cut with an ellipsis (the JSON keeps them whole). `None`: no limit and whole
    /// names, as perf's `--stdio` into a pipe.
    pub width: Option<usize>,
    /// The whole run header: the mode's reason, events and periods, losses by reason,
    /// notes on binaries.
    pub verbose: bool,
    /// A table per process instead of one list over all of them (perf's default,
    /// `--sort comm,dso,sym`: processes of one name are one); with `group_by` other
    /// than `Process`, a table per group.
    pub per_process: bool,
    /// What a process of the list (or a table of `per_process`) stands for: itself, or
    /// its comm, container or pod.
    pub group_by: GroupBy,
    /// The column the function tables are sorted by.
    pub sort: SortKey,
    /// Show the call paths into this function instead of the top tables.
    pub callers: Option<String>,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            top: 20,
            annotate: None,
            callgraph: false,
            width: None,
            verbose: false,
            per_process: false,
            sort: SortKey::Share,
            callers: None,
            group_by: GroupBy::Process,
        }
    }
}

/// What a row of the process list stands for (`--group-by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GroupBy {
    /// Each process (processes of one name merged, as perf does).
    #[default]
    Process,
    /// Every process of one name.
    Comm,
    /// Every process of one container (`namespace/pod/container`, else the container
    /// id); processes in none are `[no container]`.
    Container,
    /// Every process of one pod (`namespace/pod`, else the pod UID); processes in none
    /// are `[no pod]`.
    Pod,
}

impl GroupBy {
    /// What `n` groups are called in a sentence.
    fn noun(self, n: usize) -> &'static str {
        let (one, many) = match self {
            GroupBy::Process => ("process", "processes"),
            GroupBy::Comm => ("command", "commands"),
            GroupBy::Container => ("container", "containers"),
            GroupBy::Pod => ("pod", "pods"),
        };
        if n == 1 {
            one
        } else {
            many
        }
    }

    /// Every value with its name on the command line.
    pub const ALL: [(&'static str, GroupBy); 4] = [
        ("process", GroupBy::Process),
        ("comm", GroupBy::Comm),
        ("container", GroupBy::Container),
        ("pod", GroupBy::Pod),
    ];

    /// The value named `name`.
    pub fn named(name: &str) -> Option<GroupBy> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, g)| g)
    }

    /// The name of `pr`'s group, shown where the comm is.
    fn key(self, pr: &ProcessProfile) -> String {
        let id = &pr.identity;
        let pod = || match (&id.namespace, &id.pod) {
            (Some(ns), Some(pod)) => Some(format!("{ns}/{pod}")),
            _ => id.pod_uid.as_ref().map(|u| format!("pod {u}")),
        };
        match self {
            GroupBy::Process | GroupBy::Comm => pr.comm.clone(),
            GroupBy::Pod => pod().unwrap_or_else(|| "[no pod]".into()),
            GroupBy::Container => match (pod(), &id.container, &id.container_id) {
                (Some(p), Some(c), _) => format!("{p}/{c}"),
                (_, _, Some(cid)) => format!("container {}", &cid[..cid.len().min(12)]),
                _ => "[no container]".into(),
            },
        }
    }
}

/// `p` with each process named by its group: the list merges processes of one name
/// ([`all_processes`]), and so do the tables per process ([`by_name`]), so a group is
/// one.
fn grouped(p: &Profile, by: GroupBy) -> Profile {
    let mut g = p.clone();
    for pr in &mut g.processes {
        pr.comm = by.key(pr);
    }
    g
}

/// `p`'s processes with those of one name merged into one (profile/merge.rs), whose pid
/// is 0 where the name had several (perf's `--sort comm`), and the number of processes
/// behind each name.
pub(crate) fn by_name(p: &Profile) -> (Cow<'_, [ProcessProfile]>, BTreeMap<String, usize>) {
    let mut n: BTreeMap<String, usize> = BTreeMap::new();
    for pr in &p.processes {
        *n.entry(pr.comm.clone()).or_default() += 1;
    }
    if n.values().all(|&c| c == 1) {
        return (Cow::Borrowed(&p.processes), n);
    }
    let mut named = p.clone();
    for pr in &mut named.processes {
        if n[&pr.comm] > 1 {
            pr.pid = 0;
        }
    }
    let merged = merge::merge(std::slice::from_ref(&named)).unwrap_or(named);
    (Cow::Owned(merged.processes), n)
}

/// The pid column of `pr` in a view by name: `N pids` for a merged name.
pub(crate) fn pid_text(pr: &ProcessProfile, processes: &BTreeMap<String, usize>) -> String {
    match processes.get(&pr.comm) {
        Some(&n) if pr.pid == 0 && n > 1 => format!("{n} pids"),
        _ => pr.pid.to_string(),
    }
}

/// A column of the function tables to sort by: numbers largest first, names A to Z.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    /// Share of the cycles (CPU time in a time profile): the default.
    #[default]
    Share,
    /// Function name.
    Function,
    /// Binary path.
    Binary,
    /// Process name.
    Comm,
    /// Process id.
    Pid,
    /// Samples.
    Samples,
    /// CPU time.
    Time,
    /// Cycles.
    Cycles,
    /// Instructions.
    Instructions,
    /// CPI.
    Cpi,
}

impl SortKey {
    /// Every key with its name on the command line.
    pub const ALL: [(&'static str, SortKey); 10] = [
        ("share", SortKey::Share),
        ("function", SortKey::Function),
        ("binary", SortKey::Binary),
        ("comm", SortKey::Comm),
        ("pid", SortKey::Pid),
        ("samples", SortKey::Samples),
        ("time", SortKey::Time),
        ("cycles", SortKey::Cycles),
        ("instructions", SortKey::Instructions),
        ("cpi", SortKey::Cpi),
    ];

    /// The key named `name` (one of [`SortKey::ALL`]).
    pub fn named(name: &str) -> Option<SortKey> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, k)| k)
    }
}

/// Why a table could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// `--annotate` or `--callers` named a function the profile does not have.
    #[error("no function named {name:?} in the profile{}", suggest(.similar))]
    NoSuchFunction {
        /// The name asked for.
        name: String,
        /// Names in the profile that contain it, else the nearest by edit distance.
        similar: Vec<String>,
    },
    /// A short name (`fill<…>`) that several functions have.
    #[error("{name:?} names {} functions: {}; give the one meant", .candidates.len(), .candidates.join(", "))]
    Ambiguous {
        /// The name asked for.
        name: String,
        /// The full names it stands for.
        candidates: Vec<String>,
    },
}

fn suggest(similar: &[String]) -> String {
    if similar.is_empty() {
        String::new()
    } else {
        format!(" (similar: {})", similar.join(", "))
    }
}

/// Renders the header and either the top tables or the annotated function.
pub fn render(p: &Profile, opts: &TableOptions) -> Result<String, TableError> {
    let by_group;
    let p = match opts.group_by {
        GroupBy::Process => p,
        by => {
            by_group = grouped(p, by);
            &by_group
        }
    };
    let p = &super::terminal::escaped(p);
    // Names asked for are found among the full names, then shown as the tables show
    // them: shortened on a terminal (names.rs), whole into a pipe.
    let annotate = opts
        .annotate
        .as_deref()
        .map(|n| resolve(p, n))
        .transpose()?;
    let callers = opts.callers.as_deref().map(|n| resolve(p, n)).transpose()?;
    let short;
    let no_renames = HashMap::new();
    let (p, renamed) = match opts.width {
        Some(_) => {
            short = names::shortened(p);
            (&short.0, &short.1)
        }
        None => (p, &no_renames),
    };
    let shown = |n: String| renamed.get(&n).cloned().unwrap_or(n);
    let mut out = header(p, opts);
    let notes = Notes::of(p);
    let w = opts.width;
    match (annotate.map(shown), callers.map(shown)) {
        (Some(name), _) => {
            let name = &name;
            annotate::annotate(p, name, renamed, w, &notes, &mut out)?;
            if opts.callgraph {
                for proc in &p.processes {
                    let focus: Vec<&FunctionProfile> =
                        proc.functions.iter().filter(|f| f.is_named(name)).collect();
                    if !focus.is_empty() {
                        out.push_str(&call_graph(p.mode, proc, &focus, w));
                    }
                }
            }
        }
        (None, Some(name)) => {
            let procs: Vec<&ProcessProfile> = p.processes.iter().collect();
            out.push_str(&callers_table(p.mode, &procs, &name, opts, &notes));
        }
        (None, None) if p.processes.len() > 1 && !opts.per_process && !opts.callgraph => {
            all_processes(p, opts, &notes, &mut out);
        }
        (None, None) => per_process(p, opts, &notes, &mut out),
    }
    out.push_str(&legend(&notes, w));
    // `--callers` asks about one function's paths: the whole profile's accuracy
    // would bury its table.
    if let (Some(a), None) = (&p.accuracy, &opts.callers) {
        out.push_str(&accuracy(a, w));
    }
    Ok(out)
}

/// A table per process (per group when grouped), the processes below
/// [`MINOR_PROCESS_SHARE`] summed in one line.
fn per_process(p: &Profile, opts: &TableOptions, notes: &Notes, out: &mut String) {
    let w = opts.width;
    // A table per group when grouped; else per process.
    let (procs, names) = match opts.group_by {
        GroupBy::Process => (Cow::Borrowed(&p.processes[..]), BTreeMap::new()),
        _ => by_name(p),
    };
    let (shown, rest) = processes_to_show(&procs);
    for proc in shown {
        let pid = pid_text(proc, &names);
        out.push('\n');
        out.push_str(&wrap(&process_line(p.mode, proc, &pid, notes), w));
        let fns: Vec<Row> = proc
            .functions
            .iter()
            .map(|f| Row {
                f,
                comm: &proc.comm,
                pid: pid.clone(),
                share: f.share,
            })
            .collect();
        if opts.callgraph {
            let mut fns: Vec<&FunctionProfile> = proc.functions.iter().collect();
            fns.sort_by(|a, b| heat(p.mode, b).total_cmp(&heat(p.mode, a)));
            fns.truncate(opts.top);
            out.push_str(&call_graph(p.mode, proc, &fns, w));
        } else {
            out.push_str(&top_functions(p.mode, fns, false, opts, notes));
            let fns: Vec<&FunctionProfile> = proc.functions.iter().collect();
            out.push_str(&hot_blocks(p.mode, &fns, opts.top, w, notes));
            out.push_str(&call_paths(p.mode, &[proc], opts, notes));
        }
    }
    if !rest.is_empty() {
        let samples: u64 = rest.iter().map(|pr| pr.samples).sum();
        out.push('\n');
        out.push_str(&wrap(
            &format!(
                "{} more {} below {}% of the samples each, {} samples in all \
                 (every process is in --format json/pprof)",
                rest.len(),
                opts.group_by.noun(rest.len()),
                MINOR_PROCESS_SHARE * 100.0,
                group(samples)
            ),
            w,
        ));
    }
    if p.processes.is_empty() {
        out.push_str("\nno samples attributed to any process\n");
    }
}

/// One row of a function table: the function and the process (or processes of one
/// name) it ran in; `share` of what the table covers.
struct Row<'a> {
    f: &'a FunctionProfile,
    comm: &'a str,
    pid: String,
    share: f64,
}

/// One list over every process, as perf shows by default: processes of the same name
/// merged (profile/merge.rs), comm and pid columns, shares of the whole profile.
fn all_processes(p: &Profile, opts: &TableOptions, notes: &Notes, out: &mut String) {
    let (procs, names) = by_name(p);
    let procs = &procs[..];
    let total: f64 = procs
        .iter()
        .flat_map(|pr| pr.functions.iter())
        .map(|f| heat(p.mode, f))
        .sum();
    let rows: Vec<Row> = procs
        .iter()
        .flat_map(|pr| {
            let pid = pid_text(pr, &names);
            pr.functions.iter().map(move |f| Row {
                f,
                comm: &pr.comm,
                pid: pid.clone(),
                share: if total > 0.0 {
                    heat(p.mode, f) / total
                } else {
                    0.0
                },
            })
        })
        .collect();
    let _ = write!(
        out,
        "\n{} processes, {} samples (--per-process: a table each)\n",
        group(p.processes.len() as u64),
        group(p.processes.iter().map(|pr| pr.samples).sum())
    );
    out.push_str(&top_functions(p.mode, rows, true, opts, notes));
    let fns: Vec<&FunctionProfile> = procs.iter().flat_map(|pr| &pr.functions).collect();
    out.push_str(&hot_blocks(p.mode, &fns, opts.top, opts.width, notes));
    let procs: Vec<&ProcessProfile> = procs.iter().collect();
    out.push_str(&call_paths(p.mode, &procs, opts, notes));
}

/// Characters of a call path a table shows at most, into a pipe too: the table's
/// layout measures a cell once per word, so a path of 100 000 frames (a file handed
/// over) would cost minutes; a real path of 100 frames of 40 characters fits.
const MAX_PATH_CHARS: usize = 4096;

/// The share `x` is of `total` (0 when there is none).
fn share_of(x: f64, total: f64) -> f64 {
    if total > 0.0 {
        x / total
    } else {
        0.0
    }
}

/// The fewest samples behind a CPI the tables show (what analysis uses).
fn sample_floor() -> u64 {
    crate::profile::AnalysisOptions::default().sample_floor
}

/// What the shares of a table are of: the weight of everything it covers (cycles, else
/// time, else samples), and the samples behind that weight.
#[derive(Clone, Copy, Debug)]
struct Shares {
    weight: f64,
    samples: u64,
}

/// `x`'s share of `totals`; in a time profile with its sampling error in percentage
/// points (a sample lands in the unit with probability p: binomial, √(p(1−p)/n)), which
/// a CPI profile carries in its CPI column instead.
fn share(mode: Mode, x: f64, totals: Shares, notes: &Notes) -> String {
    share_pm(mode, share_of(x, totals.weight), totals.samples, notes)
}

/// The share `p` as [`share`] shows it, `samples` behind the whole.
pub(crate) fn share_pm(mode: Mode, p: f64, samples: u64, notes: &Notes) -> String {
    if mode.has_cpi() || samples == 0 {
        return pct(p);
    }
    let se = (p * (1.0 - p) / samples as f64).sqrt() * 100.0;
    // A share of none or all of the samples has no binomial spread to show.
    if se < 0.05 {
        return pct(p);
    }
    notes.add(Notation::Error);
    notes.add(Notation::ShareError);
    format!("{} ±{se:.1}", pct(p))
}

/// `text` broken at spaces into lines of at most `width` characters (continuations
/// indented two); a word longer than a line is shortened with an ellipsis.
pub(crate) fn wrap(text: &str, width: Option<usize>) -> String {
    let Some(width) = width else {
        return format!("{text}\n");
    };
    let mut out = String::new();
    let (mut line, mut len) = (String::new(), 0);
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let wlen = word.chars().count();
        if len > 0 && len + 1 + wlen > width {
            out.push_str(&line);
            out.push('\n');
            (line, len) = ("  ".into(), 2);
        } else if len > 0 {
            line.push(' ');
            len += 1;
        }
        let word = ellipsize(word, width.saturating_sub(len).max(2));
        len += word.chars().count();
        line.push_str(&word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// `s` in at most `max` characters: cut with "…" when longer (names in tables, status
/// lines on a narrow terminal).
pub fn ellipsize(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// The narrowest a name gets when a table is fitted to the width.
const MIN_NAME: usize = 5;

/// Names shorter than this lose to a column that says less (the function table's
/// binary).
const NARROW_NAME: usize = 16;

/// The table `build` makes, its names at most `max` characters (`usize::MAX` for
/// whole), with the longest names that keep every line within `width`; where names
/// would be cut below [`NARROW_NAME`], with one space between columns instead of two.
fn fitted(width: Option<usize>, build: impl Fn(usize) -> Table) -> String {
    fitted_cap(width, build).0
}

/// [`fitted`], and the cap on names it chose (`usize::MAX`: whole).
fn fitted_cap(width: Option<usize>, build: impl Fn(usize) -> Table) -> (String, usize) {
    let widest = |t: &str| t.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    let render = |max: usize, tight: bool| {
        let mut t = build(max);
        if tight {
            for c in t.column_iter_mut() {
                c.set_padding((0, 1));
            }
        }
        t.trim_fmt()
    };
    let whole = render(usize::MAX, false);
    let Some(width) = width else {
        return (whole, usize::MAX);
    };
    if widest(&whole) <= width {
        return (whole, usize::MAX);
    }
    // One space between columns where two would leave names shorter than NARROW_NAME.
    let tight = widest(&render(NARROW_NAME, false)) > width;
    // The longest cap that fits, by bisection (a cap changes one column's width).
    let (mut lo, mut hi) = (MIN_NAME, widest(&whole));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if widest(&render(mid, tight)) <= width {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (render(lo, tight), lo)
}

/// Processes with less than this share of all samples are summarised in one line:
/// a command that forks helpers (shell wrappers, `pyenv` shims) would otherwise bury the
/// process that matters under a table per helper.
const MINOR_PROCESS_SHARE: f64 = 0.01;

/// Processes to show in full, hottest first (always at least the hottest), and the rest.
fn processes_to_show(procs: &[ProcessProfile]) -> (Vec<&ProcessProfile>, Vec<&ProcessProfile>) {
    let mut all: Vec<&ProcessProfile> = procs.iter().collect();
    all.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.pid.cmp(&b.pid)));
    let total: u64 = all.iter().map(|pr| pr.samples).sum();
    let cut = all
        .iter()
        .position(|pr| (pr.samples as f64) < MINOR_PROCESS_SHARE * total as f64)
        .unwrap_or(all.len())
        .max(1.min(all.len()));
    let rest = all.split_off(cut);
    (all, rest)
}

/// The line over a process's (or a group's: `pid` is then `N pids`) tables.
fn process_line(mode: Mode, p: &ProcessProfile, pid: &str, notes: &Notes) -> String {
    // A process that exited before it was first looked at has no name.
    let comm = if p.comm.is_empty() { "?" } else { &p.comm };
    let mut s = if p.pid == 0 && pid != "0" {
        format!("{comm} ({pid}): {} samples", group(p.samples))
    } else {
        format!("pid {pid} ({comm}): {} samples", group(p.samples))
    };
    if p.branch_samples > 0 {
        let _ = write!(s, ", {} branch samples", group(p.branch_samples));
    }
    if let Some(t) = p.measures.time_ns {
        let _ = write!(s, ", {} CPU", time(t));
    }
    let unreadable = unreadable_code_share(&p.functions).filter(|&u| u >= UNREADABLE_CODE_CEILING);
    if let (true, Some(u)) = (mode.has_cpi(), unreadable) {
        let _ = write!(
            s,
            ", {} cycles, {} instructions of known code, CPI withheld: {:.1} % of the cycles \
             ran in code whose bytes could not be read (JIT), its instructions unknown",
            opt_si(p.measures.cycles),
            opt_si(p.measures.instructions),
            u * 100.0
        );
    } else if mode.has_cpi() {
        let _ = write!(
            s,
            ", {} cycles, {} instructions, CPI {}",
            opt_si(p.measures.cycles),
            opt_si(p.measures.instructions),
            cpi(
                p.measures.cpi,
                p.samples.max(p.branch_samples),
                inputs(p.measures.cycles, p.measures.instructions),
                notes
            )
        );
    }
    s
}

fn new_table(header: Vec<&str>, right_from: usize) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_HORIZONTAL_ONLY);
    // Rules above and below and under the header only: rows stay dense.
    for c in [
        TableComponent::HorizontalLines,
        TableComponent::MiddleIntersections,
        TableComponent::LeftBorderIntersections,
        TableComponent::RightBorderIntersections,
    ] {
        t.remove_style(c);
    }
    let n = header.len();
    t.set_header(header);
    for i in right_from..n {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// A table under its title (wrapped to `width`), saying when it shows only the top
/// `shown` of `total` rows.
fn finish(title: &str, table: &str, shown: usize, total: usize, width: Option<usize>) -> String {
    let mut title = title.to_string();
    if shown < total {
        let _ = write!(title, " (top {shown} of {total})");
    }
    let mut s = format!("\n{}", wrap(&title, width));
    s.push_str(table);
    s.push('\n');
    s
}

/// The top functions of `rows`, sorted by `opts.sort`; with `procs`, comm and pid
/// columns.
fn top_functions(
    mode: Mode,
    mut rows: Vec<Row>,
    procs: bool,
    opts: &TableOptions,
    notes: &Notes,
) -> String {
    if rows.is_empty() {
        return "\nno functions with samples\n".to_string();
    }
    sort_rows(mode, &mut rows, opts.sort);
    let samples = rows.iter().map(|r| r.f.samples).sum();
    let total = rows.len();
    let shown = total.min(opts.top);
    let rows = &rows[..shown];
    let timed = rows.iter().any(|r| r.f.timed_cpi.is_some());
    let build = |max: usize, binary: bool| {
        let mut h = vec!["function"];
        if binary {
            h.push("binary");
        }
        if procs {
            h.extend(["comm", "pid"]);
        }
        let first_number = h.len();
        if mode.has_cpi() {
            h.extend(["cycles", "instrs", "CPI ± error"]);
            notes.add(Notation::Error);
            if timed {
                h.push("timed CPI");
                notes.add(Notation::TimedCpi);
            }
            h.extend(["share", "samples"]);
        } else {
            h.extend(["samples", "CPU time", "share"]);
        }
        let mut t = new_table(h, first_number);
        for r in rows {
            let f = r.f;
            let mut row = vec![ellipsize(&f.name, max)];
            if binary {
                row.push(ellipsize(&base(&f.binary), max));
            }
            if procs {
                row.extend([ellipsize(or_unknown(r.comm), max), r.pid.clone()]);
            }
            if mode.has_cpi() {
                row.extend([
                    opt_si(f.measures.cycles),
                    opt_si(f.measures.instructions),
                    cpi(
                        f.measures.cpi,
                        f.samples,
                        inputs(f.measures.cycles, f.measures.instructions),
                        notes,
                    ),
                ]);
                if timed {
                    let timed_in = f.measures.instructions.is_some();
                    // Timed CPI is the branch entries' own: never withheld.
                    let mut t = estimate(f.timed_cpi, f.samples, timed_in, notes);
                    if f.cpi_disagree {
                        t.push_str(" ≠");
                        notes.add(Notation::Differs);
                    }
                    row.push(t);
                }
                row.extend([pct(r.share), group(f.samples)]);
            } else {
                row.extend([
                    group(f.samples),
                    f.measures.time_ns.map(time).unwrap_or_else(|| "-".into()),
                    share_pm(mode, r.share, samples, notes),
                ]);
            }
            t.add_row(row);
        }
        t
    };
    // Ranked by what the shares are of (import/mod.rs ranks a profile without cycles
    // by instructions).
    let title = match mode {
        Mode::TimeProfile => "top functions by CPU time (time profile)",
        Mode::Instructions => "top functions by instructions",
        _ => "top functions by cycles",
    };
    let title = match SortKey::ALL.iter().find(|(_, k)| *k == opts.sort) {
        Some((name, _)) if opts.sort != SortKey::Share => format!("{title}, sorted by {name}"),
        _ => title.to_string(),
    };
    // On a narrow terminal the binary column goes before names shrink below
    // NARROW_NAME characters (`disp…` says nothing).
    let (mut table, cap) = fitted_cap(opts.width, |max| build(max, true));
    if cap < NARROW_NAME {
        table = fitted(opts.width, |max| build(max, false));
        table.push_str("\nbinaries left out to fit the width (a wider terminal shows them)");
    }
    finish(&title, &table, shown, total, opts.width)
}

/// A process that exited before it was first looked at has no name.
fn or_unknown(comm: &str) -> &str {
    if comm.is_empty() {
        "?"
    } else {
        comm
    }
}

/// Rows in `key`'s order (numbers largest first, names A to Z), then hottest first.
fn sort_rows(mode: Mode, rows: &mut [Row], key: SortKey) {
    let num = |r: &Row| -> f64 {
        let f = r.f;
        match key {
            SortKey::Share | SortKey::Function | SortKey::Binary | SortKey::Comm => r.share,
            SortKey::Pid => -(r.pid.parse::<f64>().unwrap_or(f64::MAX)),
            SortKey::Samples => f.samples as f64,
            SortKey::Time => f.measures.time_ns.unwrap_or(0.0),
            SortKey::Cycles => f.measures.cycles.unwrap_or(0.0),
            SortKey::Instructions => f.measures.instructions.unwrap_or(0.0),
            SortKey::Cpi => f.measures.cpi.map_or(-1.0, |e| e.value),
        }
    };
    rows.sort_by(|a, b| {
        let by_name = match key {
            SortKey::Function => a.f.name.cmp(&b.f.name),
            SortKey::Binary => a.f.binary.cmp(&b.f.binary),
            SortKey::Comm => a.comm.cmp(b.comm),
            _ => std::cmp::Ordering::Equal,
        };
        by_name
            .then(num(b).total_cmp(&num(a)))
            .then(heat(mode, b.f).total_cmp(&heat(mode, a.f)))
    });
}

fn heat(mode: Mode, f: &FunctionProfile) -> f64 {
    if mode.has_cpi() {
        f.measures.cycles.unwrap_or(0.0)
    } else {
        f.measures.time_ns.unwrap_or(f.samples as f64)
    }
}

/// The full name `asked` stands for: itself where a function (by name or symbol) or a
/// call path's frame has it, else the one function whose short name it is
/// (names.rs). A short name of several functions is refused with their full names (the
/// error's `similar`), as an unknown name is with the names that resemble it.
fn resolve(p: &Profile, asked: &str) -> Result<String, TableError> {
    let functions = || p.processes.iter().flat_map(|pr| &pr.functions);
    let frames = || {
        p.processes
            .iter()
            .flat_map(|pr| &pr.stacks)
            .flat_map(|s| &s.frames)
            .map(|f| f.function.as_str())
    };
    if functions().any(|f| f.is_named(asked)) || frames().any(|f| f == asked) {
        return Ok(asked.to_string());
    }
    let mut full: Vec<String> = functions()
        .map(|f| f.name.as_str())
        .chain(frames())
        .filter(|n| names::is_short_for(asked, n))
        .map(str::to_string)
        .collect();
    full.sort();
    full.dedup();
    match full.len() {
        0 => Err(no_such_function(p, asked)),
        1 => Ok(full.remove(0)),
        _ => Err(TableError::Ambiguous {
            name: asked.to_string(),
            candidates: full,
        }),
    }
}

/// The error for a `name` the profile has no function of, with the names that contain
/// it, else the five nearest by edit distance (a typo: `cmq` for `cmp`).
fn no_such_function(p: &Profile, name: &str) -> TableError {
    let needle = name.to_lowercase();
    let mut all: Vec<&str> = p
        .processes
        .iter()
        .flat_map(|pr| pr.functions.iter())
        .map(|f| f.name.as_str())
        .collect();
    all.sort_unstable();
    all.dedup();
    let mut similar: Vec<String> = all
        .iter()
        .filter(|n| n.to_lowercase().contains(&needle))
        .map(|n| n.to_string())
        .collect();
    if similar.is_empty() {
        let mut scored: Vec<(usize, &str)> = all
            .iter()
            .map(|n| (strsim::levenshtein(&n.to_lowercase(), &needle), *n))
            .collect();
        scored.sort();
        similar = scored.into_iter().map(|(_, n)| n.to_string()).collect();
    }
    similar.truncate(5);
    TableError::NoSuchFunction {
        name: name.to_string(),
        similar,
    }
}

/// A cycles / instructions CPI as [`estimate`] writes it, or "-" when the profile
/// withholds CPI (its legend says why).
fn cpi(e: Option<Estimate>, samples: u64, inputs: bool, notes: &Notes) -> String {
    if notes.withheld.is_none() {
        return estimate(e, samples, inputs, notes);
    }
    if e.is_some() || (inputs && samples > 0) {
        notes.add(Notation::Withheld);
    }
    "-".to_string()
}

/// `value ±err%`; "below floor" when both inputs were measured but too few samples
/// stand behind them for an estimate; "-" when an input is missing.
fn estimate(e: Option<Estimate>, samples: u64, inputs: bool, notes: &Notes) -> String {
    match e {
        Some(e) => {
            notes.add(Notation::Error);
            format!("{:.2} ±{:.1}%", e.value, e.rel_error * 100.0)
        }
        None if inputs && samples > 0 => {
            notes.add(Notation::BelowFloor);
            "below floor".to_string()
        }
        None => "-".to_string(),
    }
}

fn inputs(cycles: Option<f64>, instructions: Option<f64>) -> bool {
    cycles.is_some() && instructions.is_some()
}

fn opt_si(v: Option<f64>) -> String {
    v.map(si).unwrap_or_else(|| "-".to_string())
}

/// Three significant digits with an SI suffix above 10 000 (exact below).
pub(crate) fn si(v: f64) -> String {
    let a = v.abs();
    if a < 10_000.0 {
        return format!("{v:.0}");
    }
    // The largest unit that leaves at least 1 after rounding to three digits (999,999
    // is 1.00M, not 1000k).
    let (scaled, suffix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| a >= *d * 0.9995)
        .map(|(d, s)| (v / d, s))
        .unwrap_or((v, ""));
    let digits = if scaled.abs() >= 100.0 {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{scaled:.digits$}{suffix}")
}

/// Thousands separators.
fn group(n: u64) -> String {
    let d = n.to_string();
    let mut s = String::with_capacity(d.len() + d.len() / 3);
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            s.push(',');
        }
        s.push(c);
    }
    s
}

fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

pub(crate) fn time(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

fn range(start: u64, end: u64) -> String {
    format!("{start:x}-{end:x}")
}

/// File name of a binary path (`[kernel]` and friends stay as they are).
fn base(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_compact_and_exact_below_ten_thousand() {
        assert_eq!(si(9999.0), "9999");
        assert_eq!(si(12_345.0), "12.3k");
        assert_eq!(si(1_234_567.0), "1.23M");
        assert_eq!(si(987_654_321.0), "988M");
        assert_eq!(si(999_999.0), "1.00M");
        assert_eq!(si(42_000_000.0), "42.0M");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(group(12), "12");
    }

    #[test]
    fn missing_estimate_with_samples_is_below_floor() {
        assert_eq!(cpi(None, 3, true, &Notes::default()), "below floor");
        assert_eq!(
            cpi(None, 3, false, &Notes::default()),
            "-",
            "no instructions: no CPI, not a floor"
        );
        assert_eq!(cpi(None, 0, true, &Notes::default()), "-");
        let e = Estimate {
            value: 1.5,
            rel_error: 0.031,
            samples: 1000,
        };
        assert_eq!(cpi(Some(e), 1000, true, &Notes::default()), "1.50 ±3.1%");
    }
}
