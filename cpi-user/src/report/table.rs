//! Human tables: the run header (mode first, losses always), top functions, hot blocks,
//! `--annotate FUNC`, and `--callgraph` (callers and callees from the branch records that
//! are calls). A time profile (no PMU) gets the same views over samples and
//! CPU time, and says so; units below the sample floor say so instead of a number. A
//! profile with an accuracy (`cpi-bpf simulate`) ends with it.

use std::fmt::Write;

use comfy_table::{presets, CellAlignment, Table, TableComponent};

use crate::profile::model::{
    role_name, Accuracy, BlockProfile, CallEdge, Estimate, FunctionProfile, Mode, ProcessProfile,
    Profile,
};

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
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            top: 20,
            annotate: None,
            callgraph: false,
        }
    }
}

/// Why a table could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// `--annotate` named a function the profile does not have.
    #[error("no function named {name:?} in the profile{}", suggest(.similar))]
    NoSuchFunction {
        /// The name asked for.
        name: String,
        /// Names in the profile that resemble it.
        similar: Vec<String>,
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
    let p = &super::terminal::escaped(p);
    let mut out = header(p);
    match &opts.annotate {
        Some(name) => {
            annotate(p, name, &mut out)?;
            if opts.callgraph {
                for proc in &p.processes {
                    let focus: Vec<&FunctionProfile> =
                        proc.functions.iter().filter(|f| f.name == *name).collect();
                    if !focus.is_empty() {
                        out.push_str(&call_graph(p.mode, proc, &focus));
                    }
                }
            }
        }
        None => {
            let (shown, rest) = processes_to_show(p);
            for proc in shown {
                out.push('\n');
                out.push_str(&process_line(p.mode, proc));
                if opts.callgraph {
                    let mut fns: Vec<&FunctionProfile> = proc.functions.iter().collect();
                    fns.sort_by(|a, b| heat(p.mode, b).total_cmp(&heat(p.mode, a)));
                    fns.truncate(opts.top);
                    out.push_str(&call_graph(p.mode, proc, &fns));
                } else {
                    out.push_str(&top_functions(p.mode, proc, opts.top));
                    out.push_str(&hot_blocks(p.mode, proc, opts.top));
                }
            }
            if !rest.is_empty() {
                let samples: u64 = rest.iter().map(|pr| pr.samples).sum();
                let _ = writeln!(
                    out,
                    "\n{} more processes below {}% of the samples each, {} samples in all \
                     (every process is in --format json/pprof)",
                    rest.len(),
                    MINOR_PROCESS_SHARE * 100.0,
                    group(samples)
                );
            }
            if p.processes.is_empty() {
                out.push_str("\nno samples attributed to any process\n");
            }
        }
    }
    if let Some(a) = &p.accuracy {
        out.push_str(&accuracy(a));
    }
    Ok(out)
}

fn pct_or_dash(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{:.2}%", v * 100.0))
}

/// The distance from the exact answer: overlaps, CPI error, the top functions.
fn accuracy(a: &Accuracy) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\naccuracy against the exact trace");
    let _ = writeln!(
        s,
        "  overlap: instruction {:.4}  block {:.4}  function {:.4}  edge {:.4}",
        a.overlap_instruction, a.overlap_block, a.overlap_function, a.overlap_edge
    );
    let _ = writeln!(
        s,
        "  CPI error (functions with >= 2% of cycles): median {}  max {}{}",
        pct_or_dash(a.cpi_error_median),
        pct_or_dash(a.cpi_error_max),
        if a.functions_without_cpi > 0 {
            format!("  ({} without a CPI estimate)", a.functions_without_cpi)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "  {:>7} {:>12} {:>12} {:>8} {:>8} {:>7}  function",
        "share", "instr true", "instr est", "CPI true", "CPI est", "error"
    );
    for f in a.functions.iter().take(15) {
        let cpi = |c: Option<f64>| c.map_or_else(|| "-".into(), |v| format!("{v:.3}"));
        let _ = writeln!(
            s,
            "  {:>6.2}% {:>12} {:>12.0} {:>8} {:>8} {:>7}  {}",
            f.share * 100.0,
            f.instructions_true,
            f.instructions_est,
            cpi(f.cpi_true),
            cpi(f.cpi_est),
            pct_or_dash(f.cpi_error),
            f.name
        );
    }
    s
}

fn header(p: &Profile) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "mode:         {}", p.mode.description());
    let _ = writeln!(s, "reason:       {}", p.mode_reason);
    if !p.command.is_empty() {
        let _ = writeln!(s, "command:      {}", p.command.join(" "));
    }
    let _ = write!(
        s,
        "duration:     {:.2} s    perturbation: {}",
        p.duration_secs,
        p.perturbation.name()
    );
    // The range window only means something where there are branch records.
    if p.range_window > 0 && p.mode.uses_ranges() {
        let _ = write!(s, "    range window: {}", p.range_window);
    }
    s.push('\n');
    for e in &p.events {
        let mut period = format!("period {} {}", e.period, e.unit);
        if e.jitter > 0 {
            let _ = write!(period, " + up to {} re-drawn", e.jitter);
        }
        if e.thinning > 1 {
            let _ = write!(period, ", thinned 1/{}", e.thinning);
        }
        let _ = writeln!(
            s,
            "event:        {:<13} {} ({period}): {} samples",
            role_name(e.role),
            e.name,
            group(e.samples)
        );
    }
    let _ = writeln!(
        s,
        "lost samples: {} {}",
        group(p.lost_samples),
        p.lost.breakdown()
    );
    for b in p.binaries.iter().filter(|b| b.deleted || b.stripped) {
        let what = match (b.deleted, b.stripped) {
            (true, true) => "deleted since mapped; stripped: function bounds from .eh_frame",
            (true, false) => "deleted since mapped",
            _ => "stripped: function bounds from .eh_frame",
        };
        let _ = writeln!(s, "note:         {}: {what}", b.path);
    }
    s
}

/// Processes with less than this share of all samples are summarised in one line:
/// a command that forks helpers (shell wrappers, `pyenv` shims) would otherwise bury the
/// process that matters under a table per helper.
const MINOR_PROCESS_SHARE: f64 = 0.01;

/// Processes to show in full, hottest first (always at least the hottest), and the rest.
fn processes_to_show(p: &Profile) -> (Vec<&ProcessProfile>, Vec<&ProcessProfile>) {
    let mut all: Vec<&ProcessProfile> = p.processes.iter().collect();
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

fn process_line(mode: Mode, p: &ProcessProfile) -> String {
    // A process that exited before it was first looked at has no name.
    let comm = if p.comm.is_empty() { "?" } else { &p.comm };
    let mut s = format!("pid {} ({comm}): {} samples", p.pid, group(p.samples));
    if p.branch_samples > 0 {
        let _ = write!(s, ", {} branch samples", group(p.branch_samples));
    }
    if let Some(t) = p.time_ns {
        let _ = write!(s, ", {} CPU", time(t));
    }
    if mode.has_cpi() {
        let _ = write!(
            s,
            ", {} cycles, {} instructions, CPI {}",
            opt_si(p.cycles),
            opt_si(p.instructions),
            cpi(
                p.cpi,
                p.samples.max(p.branch_samples),
                inputs(p.cycles, p.instructions)
            )
        );
    }
    s.push('\n');
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

fn finish(title: &str, t: &Table, shown: usize, total: usize) -> String {
    let mut s = format!("\n{title}");
    if shown < total {
        let _ = write!(s, " (top {shown} of {total})");
    }
    s.push('\n');
    s.push_str(&t.trim_fmt());
    s.push('\n');
    s
}

fn top_functions(mode: Mode, p: &ProcessProfile, top: usize) -> String {
    if p.functions.is_empty() {
        return "\nno functions with samples\n".to_string();
    }
    let mut fns: Vec<&FunctionProfile> = p.functions.iter().collect();
    // Hottest first by what the mode measures; the model promises this order, but a
    // hand-edited or foreign file need not keep it.
    fns.sort_by(|a, b| heat(mode, b).total_cmp(&heat(mode, a)));
    let shown = fns.len().min(top);
    let timed = fns.iter().any(|f| f.timed_cpi.is_some());
    let t = if mode.has_cpi() {
        let mut h = vec![
            "function",
            "binary",
            "cycles",
            "instructions",
            "CPI ± error",
        ];
        if timed {
            h.push("timed CPI");
        }
        h.extend(["share", "samples"]);
        let mut t = new_table(h, 2);
        for f in &fns[..shown] {
            let mut row = vec![
                f.name.clone(),
                base(&f.binary),
                opt_si(f.cycles),
                opt_si(f.instructions),
                cpi(f.cpi, f.samples, inputs(f.cycles, f.instructions)),
            ];
            if timed {
                row.push(cpi(f.timed_cpi, f.samples, f.instructions.is_some()));
            }
            row.extend([pct(f.share), group(f.samples)]);
            t.add_row(row);
        }
        t
    } else {
        let mut t = new_table(
            vec!["function", "binary", "samples", "CPU time", "share"],
            2,
        );
        for f in &fns[..shown] {
            t.add_row(vec![
                f.name.clone(),
                base(&f.binary),
                group(f.samples),
                f.time_ns.map(time).unwrap_or_else(|| "-".into()),
                pct(f.share),
            ]);
        }
        t
    };
    let title = if mode.has_cpi() {
        "top functions by cycles"
    } else {
        "top functions by CPU time (time profile)"
    };
    let mut s = finish(title, &t, shown, fns.len());
    if mode.has_cpi() {
        s.push_str(ERROR_LEGEND);
    }
    s
}

/// What every `±` of the tables means (cpi-user/src/profile/error.rs).
const ERROR_LEGEND: &str =
    "± = one standard error (the truth lies within ±1 for about 68 % of units, ±2 for 95 %)\n";

fn heat(mode: Mode, f: &FunctionProfile) -> f64 {
    if mode.has_cpi() {
        f.cycles.unwrap_or(0.0)
    } else {
        f.time_ns.unwrap_or(f.samples as f64)
    }
}

fn block_heat(b: &BlockProfile) -> (f64, f64, u64) {
    (b.cycles.unwrap_or(0.0), b.count, b.samples)
}

fn hot_blocks(mode: Mode, p: &ProcessProfile, top: usize) -> String {
    let mut blocks: Vec<(&FunctionProfile, &BlockProfile)> = p
        .functions
        .iter()
        .flat_map(|f| f.blocks.iter().map(move |b| (f, b)))
        .collect();
    if blocks.is_empty() {
        return "\nhot blocks: none in this profile (block counts need branch records)\n"
            .to_string();
    }
    blocks.sort_by(|(_, a), (_, b)| {
        let (ac, an, asm) = block_heat(a);
        let (bc, bn, bsm) = block_heat(b);
        bc.total_cmp(&ac)
            .then(bn.total_cmp(&an))
            .then(bsm.cmp(&asm))
            .then(a.start.cmp(&b.start))
    });
    let shown = blocks.len().min(top);
    let t = if mode.has_cpi() {
        let mut t = new_table(
            vec![
                "address range",
                "function",
                "instrs",
                "count",
                "cycles",
                "CPI ± error",
                "samples",
            ],
            2,
        );
        for (f, b) in &blocks[..shown] {
            t.add_row(vec![
                range(b.start, b.end),
                f.name.clone(),
                b.len.to_string(),
                si(b.count),
                opt_si(b.cycles),
                cpi(b.cpi, b.samples, b.cycles.is_some()),
                group(b.samples),
            ]);
        }
        t
    } else {
        let mut t = new_table(vec!["address range", "function", "instrs", "samples"], 2);
        for (f, b) in &blocks[..shown] {
            t.add_row(vec![
                range(b.start, b.end),
                f.name.clone(),
                b.len.to_string(),
                group(b.samples),
            ]);
        }
        t
    };
    finish("hot blocks", &t, shown, blocks.len())
}

/// Callers (←) and callees (→) of each function of `focus` that has any, with the
/// estimated calls and the call records behind them (seed 001's calls-only call graph).
fn call_graph(mode: Mode, p: &ProcessProfile, focus: &[&FunctionProfile]) -> String {
    if !mode.uses_ranges() {
        return format!(
            "\nno call graph: {} mode has no branch records (calls come from the branch \
             records that are calls)\n",
            mode.name()
        );
    }
    if p.calls.is_empty() {
        return "\nno call graph: no sampled branch record of this process is a call\n".into();
    }
    let is = |f: &FunctionProfile, name: &str, binary: &str| f.name == name && f.binary == binary;
    let mut t = new_table(vec!["function", "binary", "calls", "records"], 2);
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
        t.add_row(vec![f.name.clone(), base(&f.binary), called, records]);
        for c in callers {
            t.add_row(vec![
                format!("  ← {}", c.caller),
                base(&c.caller_binary),
                si(c.count),
                group(c.samples),
            ]);
        }
        for c in callees {
            t.add_row(vec![
                format!("  → {}", c.callee),
                base(&c.callee_binary),
                si(c.count),
                group(c.samples),
            ]);
        }
    }
    let records: u64 = p.calls.iter().map(|c| c.samples).sum();
    if shown == 0 {
        return format!(
            "\nno call graph for these functions: none of the {} call records involves them\n",
            group(records)
        );
    }
    format!(
        "\ncall graph (calls only: ← callers, → callees; estimated calls, scaled like ranges, \
         from {} call records)\n{}\n",
        group(records),
        t.trim_fmt()
    )
}

fn annotate(p: &Profile, name: &str, out: &mut String) -> Result<(), TableError> {
    let mut found = false;
    for proc in &p.processes {
        for f in proc.functions.iter().filter(|f| f.name == name) {
            found = true;
            out.push('\n');
            out.push_str(&annotate_function(p.mode, proc, f));
        }
    }
    if found {
        return Ok(());
    }
    let needle = name.to_lowercase();
    let mut similar: Vec<String> = p
        .processes
        .iter()
        .flat_map(|pr| pr.functions.iter())
        .filter(|f| f.name.to_lowercase().contains(&needle))
        .map(|f| f.name.clone())
        .collect();
    similar.sort();
    similar.dedup();
    similar.truncate(5);
    Err(TableError::NoSuchFunction {
        name: name.to_string(),
        similar,
    })
}

fn annotate_function(mode: Mode, proc: &ProcessProfile, f: &FunctionProfile) -> String {
    let mut s = format!(
        "{} [{}] pid {} ({}): {}, {} bytes, {} samples",
        f.name,
        f.binary,
        proc.pid,
        proc.comm,
        range(f.address, f.address + f.size),
        f.size,
        group(f.samples)
    );
    if mode.has_cpi() {
        let _ = write!(
            s,
            ", {} cycles, {} instructions, CPI {}",
            opt_si(f.cycles),
            opt_si(f.instructions),
            cpi(f.cpi, f.samples, inputs(f.cycles, f.instructions))
        );
    } else if let Some(t) = f.time_ns {
        let _ = write!(s, ", {} CPU", time(t));
    }
    s.push('\n');
    if f.lines.is_empty() {
        s.push_str("no per-instruction data for this function\n");
        return s;
    }
    // Hottest instruction: most cycles, or most samples in a time profile, or the most
    // executed when neither was sampled.
    let key = |l: &crate::profile::model::InstructionProfile| {
        if mode.has_cpi() {
            (l.cycles.unwrap_or(0.0), l.count)
        } else {
            (l.samples as f64, l.count)
        }
    };
    let hottest = f
        .lines
        .iter()
        .max_by(|a, b| {
            let (a0, a1) = key(a);
            let (b0, b1) = key(b);
            a0.total_cmp(&b0).then(a1.total_cmp(&b1))
        })
        .filter(|l| {
            let (k0, k1) = key(l);
            k0 > 0.0 || k1 > 0.0
        })
        .map(|l| l.address);
    let block_at = |addr: u64| f.blocks.iter().find(|b| b.start == addr);
    let t = if mode.has_cpi() {
        let mut t = new_table(
            vec![
                "",
                "address",
                "count",
                "samples",
                "cycles",
                "CPI",
                "block CPI",
                "instruction",
            ],
            2,
        );
        if let Some(c) = t.column_mut(7) {
            c.set_cell_alignment(CellAlignment::Left);
        }
        for l in &f.lines {
            t.add_row(vec![
                marker(hottest == Some(l.address)),
                format!("{:x}", l.address),
                si(l.count),
                group(l.samples),
                opt_si(l.cycles),
                cpi(l.cpi, l.samples, l.cycles.is_some()),
                block_at(l.address)
                    .map(|b| cpi(b.cpi, b.samples, b.cycles.is_some()))
                    .unwrap_or_default(),
                l.text.clone(),
            ]);
        }
        t
    } else {
        let mut t = new_table(vec!["", "address", "samples", "share", "instruction"], 2);
        if let Some(c) = t.column_mut(4) {
            c.set_cell_alignment(CellAlignment::Left);
        }
        let total: u64 = f.lines.iter().map(|l| l.samples).sum();
        for l in &f.lines {
            let share = if total > 0 {
                pct(l.samples as f64 / total as f64)
            } else {
                "-".into()
            };
            t.add_row(vec![
                marker(hottest == Some(l.address)),
                format!("{:x}", l.address),
                group(l.samples),
                share,
                l.text.clone(),
            ]);
        }
        t
    };
    s.push_str(&t.trim_fmt());
    s.push('\n');
    if hottest.is_some() {
        s.push_str("▶ hottest instruction\n");
    }
    s
}

fn marker(hot: bool) -> String {
    if hot { "▶" } else { "" }.to_string()
}

/// `value ±err%`; "below floor" when both inputs were measured but too few samples
/// stand behind them for an estimate; "-" when an input is missing.
fn cpi(e: Option<Estimate>, samples: u64, inputs: bool) -> String {
    match e {
        Some(e) => format!("{:.2} ±{:.1}%", e.value, e.rel_error * 100.0),
        None if inputs && samples > 0 => "below floor".to_string(),
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
fn si(v: f64) -> String {
    let a = v.abs();
    if a < 10_000.0 {
        return format!("{v:.0}");
    }
    let (scaled, suffix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| a >= *d)
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

fn time(ns: f64) -> String {
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
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(group(12), "12");
    }

    #[test]
    fn missing_estimate_with_samples_is_below_floor() {
        assert_eq!(cpi(None, 3, true), "below floor");
        assert_eq!(
            cpi(None, 3, false),
            "-",
            "no instructions: no CPI, not a floor"
        );
        assert_eq!(cpi(None, 0, true), "-");
        let e = Estimate {
            value: 1.5,
            rel_error: 0.031,
            samples: 1000,
        };
        assert_eq!(cpi(Some(e), 1000, true), "1.50 ±3.1%");
    }
}
