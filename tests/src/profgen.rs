//! `llvm-profgen-19 --skip-symbolization`: an independent implementation of the range
//! algorithm the imports are compared with.

use std::path::Path;
use std::process::Command;

use crate::output_ok;

/// The ranges llvm-profgen derives from `script` (`perf script -F ip,brstack
/// --show-mmap-events` text) for `binary`, written to `out`: (start, end, count),
/// offsets from the executable segment's page.
pub fn ranges(script: &Path, binary: &Path, out: &Path) -> Vec<(u64, u64, f64)> {
    output_ok(
        Command::new("llvm-profgen-19")
            .arg("--skip-symbolization")
            .arg(format!("--perfscript={}", script.display()))
            .arg(format!("--binary={}", binary.display()))
            .arg(format!("--output={}", out.display())),
    );
    // `N` then N lines `start-end:count`, then the branch counts.
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .skip(1)
        .map_while(|l| {
            let (r, c) = l.split_once(':')?;
            let (a, b) = r.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                c.parse().ok()?,
            ))
        })
        .collect()
}

/// Σ counts of the ranges holding `addr`, the executable segment's page at `base`.
pub fn count_at(ranges: &[(u64, u64, f64)], base: u64, addr: u64) -> f64 {
    ranges
        .iter()
        .filter(|(a, b, _)| (base + a..=base + b).contains(&addr))
        .map(|r| r.2)
        .sum()
}
