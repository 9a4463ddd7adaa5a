//! The accuracy a simulated run ends with (`cpi-bpf simulate`): the CPI error per
//! function and call path against the exact trace.

use super::*;
use crate::sim::accuracy::{misses, BUG_ERRORS, CPI_SHARE_FLOOR};

/// " (N without a CPI estimate)" where N > 0.
fn without_cpi(n: u64) -> String {
    if n > 0 {
        format!(" ({n} without a CPI estimate)")
    } else {
        String::new()
    }
}

fn pct_or_dash(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{:.2}%", v * 100.0))
}

/// The distance from the exact answer: overlaps, CPI error, the top functions.
pub(super) fn accuracy(a: &Accuracy, width: Option<usize>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\naccuracy against the exact trace");
    let _ = writeln!(
        s,
        "  overlap: instruction {:.4}  block {:.4}  function {:.4}  edge {:.4}",
        a.overlap_instruction, a.overlap_block, a.overlap_function, a.overlap_edge
    );
    s += &indented(
        &format!(
            "CPI error (functions with >= 2% of cycles): median {} max {}{}",
            pct_or_dash(a.cpi_error_median),
            pct_or_dash(a.cpi_error_max),
            without_cpi(a.functions_without_cpi)
        ),
        width,
    );
    if a.instructions_unknown > 0 {
        s += &indented(
            &format!(
                "{} of the {} instructions ran in code whose bytes could not be read \
                 (JIT, vdso): their functions are unknown, and no CPI here includes them",
                si(a.instructions_unknown as f64),
                si(a.instructions_true as f64)
            ),
            width,
        );
    }
    s += &bugs(a, width);
    s += &accuracy_header("function", width);
    for f in a.functions.iter().take(15) {
        s += &accuracy_row(
            f.share,
            f.instructions_true,
            f.instructions_est,
            [f.cpi_true, f.cpi_est, f.cpi_error],
            &f.name,
            width,
        );
    }
    if let Some(o) = a.overlap_path {
        s += &indented(
            &format!(
                "call paths: instruction overlap {o:.4}; CPI error (paths with >= 2% of \
                 cycles): median {} ({} reported errors) max {}{}",
                pct_or_dash(a.path_cpi_error_median),
                a.path_cpi_errors_reported_median
                    .map_or_else(|| "-".into(), |z| format!("{z:.2}")),
                pct_or_dash(a.path_cpi_error_max),
                without_cpi(a.paths_without_cpi)
            ),
            width,
        );
        s += &accuracy_header("call path (leaf first)", width);
        for p in a.paths.iter().take(10) {
            s += &accuracy_row(
                p.share,
                p.instructions_true,
                p.instructions_est,
                [p.cpi_true, p.cpi_est, p.cpi_error],
                &runs(&p.frames).join(" <- "),
                width,
            );
        }
    }
    s
}

/// Each estimate of a function with ≥ 2 % of the cycles that misses its exact value by
/// more than [`BUG_ERRORS`] of the errors the profile reports, named in words: a bias
/// of the method, which the reported error (however small) does not cover.
fn bugs(a: &Accuracy, width: Option<usize>) -> String {
    let mut s = String::new();
    for f in a.functions.iter().filter(|f| f.share >= CPI_SHARE_FLOOR) {
        for m in misses(f) {
            let off = if m.exact != 0.0 {
                format!("{:+.1}%", (m.est - m.exact) / m.exact * 100.0)
            } else {
                "none ran".into()
            };
            s += &indented(
                &format!(
                    "BUG: {}'s {} is {}, the exact answer {} ({off}): {:.0} times the \
                     error it reports (±{}), more than {BUG_ERRORS:.0}: a bias, not \
                     sampling noise",
                    f.name,
                    m.what,
                    number(m.est),
                    number(m.exact),
                    m.errors,
                    fine_pct(m.rel_error)
                ),
                width,
            );
        }
    }
    s
}

/// A count in SI units, a ratio (CPI) with 3 decimals.
fn number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        si(v)
    } else {
        format!("{v:.3}")
    }
}

/// A relative error in percent with two significant digits, so that a small error
/// never reads as 0.0 %.
fn fine_pct(rel: f64) -> String {
    let p = rel * 100.0;
    if p == 0.0 {
        return "0 %".into();
    }
    let decimals = (1 - p.abs().log10().floor() as i32).clamp(1, 9) as usize;
    format!("{p:.decimals$} %")
}

/// The column heads of an accuracy table whose units are `what`.
fn accuracy_header(what: &str, width: Option<usize>) -> String {
    format!(
        "  {:>7} {:>12} {:>12} {:>8} {:>8} {:>7}  {}\n",
        "share",
        "instr true",
        "instr est",
        "CPI true",
        "CPI est",
        "error",
        ellipsize(what, accuracy_name_width(width))
    )
}

/// The room for a name after the accuracy table's columns (63 characters).
fn accuracy_name_width(width: Option<usize>) -> usize {
    width.map_or(usize::MAX, |w| w.saturating_sub(63).max(MIN_NAME))
}

/// `frames` (names) with each run of one name written once, `name ×N`: a path through
/// twelve levels of a recursive sort reads as one name, and paths that differ in depth
/// still read differently.
fn runs(frames: &[String]) -> Vec<String> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for f in frames {
        match out.last_mut() {
            Some((last, n)) if last == f => *n += 1,
            _ => out.push((f.clone(), 1)),
        }
    }
    out.into_iter()
        .map(|(f, n)| if n > 1 { format!("{f} ×{n}") } else { f })
        .collect()
}

/// `text` wrapped to `width` two characters in, as the accuracy summary lines are.
fn indented(text: &str, width: Option<usize>) -> String {
    wrap(text, width.map(|w| w.saturating_sub(2)))
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect()
}

/// One unit (function, call path) of an accuracy table: CPI true, estimated, error.
fn accuracy_row(
    share: f64,
    instructions_true: u64,
    instructions_est: f64,
    [cpi_true, cpi_est, error]: [Option<f64>; 3],
    name: &str,
    width: Option<usize>,
) -> String {
    let cpi = |c: Option<f64>| c.map_or_else(|| "-".into(), |v| format!("{v:.3}"));
    format!(
        "  {:>6.2}% {:>12} {:>12.0} {:>8} {:>8} {:>7}  {}\n",
        share * 100.0,
        instructions_true,
        instructions_est,
        cpi(cpi_true),
        cpi(cpi_est),
        pct_or_dash(error),
        ellipsize(name, accuracy_name_width(width))
    )
}
