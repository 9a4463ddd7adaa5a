//! The page's hot-blocks table: the terminal's `hot blocks` (report/table/blocks.rs),
//! ranked the same way (cycles, then executions, then samples), over every process,
//! each block's CPI ± error coloured on the absolute scale and its timed CPI beside it
//! where the hardware timed its branch records (`≠` where the two disagree).

use serde::Serialize;

use super::code::cpi_fills;
use super::Look;
use crate::profile::model::{BlockProfile, Estimate, FunctionProfile, ProcessProfile, Profile};
use crate::report::table::{names::short_name, si};

/// Rows of the hot-blocks table.
pub(crate) const BLOCK_ROWS: usize = 100;

/// One row of the hot-blocks table; its strings are numbers in the page's
/// [`super::Strings`].
#[derive(Serialize)]
pub(crate) struct BlockRow {
    range: String,
    /// The function as the terminal shortens it, and whole (its tooltip).
    function: usize,
    full: usize,
    binary: usize,
    instructions: u32,
    count: f64,
    count_text: String,
    cycles: f64,
    cycles_text: String,
    cpi: Option<f64>,
    cpi_text: String,
    /// The CPI cell's fills: against its process's CPI, and on the absolute scale.
    fill: String,
    abs_fill: String,
    timed: String,
    disagree: bool,
    samples: u64,
    code: Option<usize>,
}

fn heat(b: &BlockProfile) -> (f64, f64, u64) {
    (b.cycles.unwrap_or(0.0), b.count, b.samples)
}

/// The [`BLOCK_ROWS`] hottest blocks of every process, and how many there are in all.
pub(crate) fn rows(p: &Profile, look: &Look) -> (Vec<BlockRow>, usize) {
    let mut all: Vec<(&ProcessProfile, &FunctionProfile, &BlockProfile)> = p
        .processes
        .iter()
        .flat_map(|pr| pr.functions.iter().map(move |f| (pr, f)))
        .flat_map(|(pr, f)| f.blocks.iter().map(move |b| (pr, f, b)))
        .collect();
    all.sort_by(|(_, _, a), (_, _, b)| {
        let ((ac, an, asm), (bc, bn, bsm)) = (heat(a), heat(b));
        bc.total_cmp(&ac)
            .then(bn.total_cmp(&an))
            .then(bsm.cmp(&asm))
            .then(a.start.cmp(&b.start))
    });
    let n = all.len();
    let text = |e: Option<&Estimate>, b: &BlockProfile| match e {
        Some(e) => format!("{:.2} ±{:.1}%", e.value, e.rel_error * 100.0),
        None if b.samples > 0 && b.cycles.is_some() => "below floor".into(),
        None => "-".into(),
    };
    let rows = all
        .into_iter()
        .take(BLOCK_ROWS)
        .map(|(pr, f, b)| {
            let est = b.cpi.filter(|_| look.cpi);
            let (fill, abs_fill) = cpi_fills(look, est, pr, b.samples);
            let binary = f.binary.rsplit('/').next().unwrap_or(&f.binary);
            BlockRow {
                range: format!("{:x}-{:x}", b.start, b.end),
                function: look.strings.id(&short_name(&f.name)),
                full: look.strings.id(&f.name),
                binary: look.strings.id(binary),
                instructions: b.len,
                count: b.count,
                count_text: si(b.count),
                cycles: b.cycles.unwrap_or(0.0),
                cycles_text: b.cycles.map_or("-".into(), si),
                cpi: est.map(|e| e.value),
                cpi_text: if look.cpi {
                    text(est.as_ref(), b)
                } else {
                    "-".into()
                },
                fill,
                abs_fill,
                timed: b.timed_cpi.filter(|_| look.cpi).map_or(String::new(), |e| {
                    format!("{:.2} ±{:.1}%", e.value, e.rel_error * 100.0)
                }),
                disagree: b.cpi_disagree && look.cpi,
                samples: b.samples,
                code: look.ids.get(&(f.name.clone(), binary.to_string())).copied(),
            }
        })
        .collect();
    (rows, n)
}

/// Whether any block of `rows` has a timed CPI (the table's column).
pub(crate) fn any_timed(rows: &[BlockRow]) -> bool {
    rows.iter().any(|r| !r.timed.is_empty())
}
