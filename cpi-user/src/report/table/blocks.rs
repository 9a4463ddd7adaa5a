//! The hottest basic blocks over the shown functions.

use super::*;

fn block_heat(b: &BlockProfile) -> (f64, f64, u64) {
    (b.cycles.unwrap_or(0.0), b.count, b.samples)
}

pub(super) fn hot_blocks(
    mode: Mode,
    fns: &[&FunctionProfile],
    top: usize,
    width: Option<usize>,
    notes: &Notes,
) -> String {
    let mut blocks: Vec<(&FunctionProfile, &BlockProfile)> = fns
        .iter()
        .flat_map(|&f| f.blocks.iter().map(move |b| (f, b)))
        .collect();
    if blocks.is_empty() {
        // Only a mode with branch records could have had them.
        return if mode.uses_ranges() {
            "\nhot blocks: none in this profile (no sampled branch records)\n".to_string()
        } else {
            String::new()
        };
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
    let build = |max: usize| {
        if mode.has_cpi() {
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
            notes.add(Notation::Error);
            for (f, b) in &blocks[..shown] {
                t.add_row(vec![
                    range(b.start, b.end),
                    ellipsize(&f.name, max),
                    b.len.to_string(),
                    si(b.count),
                    opt_si(b.cycles),
                    cpi(b.cpi, b.samples, b.cycles.is_some(), notes),
                    group(b.samples),
                ]);
            }
            t
        } else {
            let mut t = new_table(vec!["address range", "function", "instrs", "samples"], 2);
            for (f, b) in &blocks[..shown] {
                t.add_row(vec![
                    range(b.start, b.end),
                    ellipsize(&f.name, max),
                    b.len.to_string(),
                    group(b.samples),
                ]);
            }
            t
        }
    };
    finish(
        "hot blocks",
        &fitted(width, build),
        shown,
        blocks.len(),
        width,
    )
}
