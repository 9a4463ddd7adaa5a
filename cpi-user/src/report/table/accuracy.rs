//! The accuracy a simulated run ends with (`cpi-bpf simulate`): the CPI error per
//! function and call path against the exact trace.

use super::*;

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
