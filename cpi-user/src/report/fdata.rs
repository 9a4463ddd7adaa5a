//! BOLT `.fdata` export (what `llvm-bolt -data=FILE` and `merge-fdata` read; format
//! from BOLT's `DataReader`): one line per branch,
//!
//! `<1|0> <from symbol> <hex offset> <1|0> <to symbol> <hex offset> <mispreds> <count>`
//!
//! with offsets relative to the symbol (1) or, for a location outside any known
//! function, `0 <binary file name> <hex address>`. Fall-throughs are written as
//! branches from the last instruction of the source block to the next block's start
//! with 0 mispredictions, which is how BOLT's own aggregator records the straight-line
//! flow it rebuilds from LBR traces. A binary whose profile has no edges (no branch
//! records: IP sampling or a time profile) gets BOLT's `no_lbr` form instead: one
//! `1 <symbol> <hex offset> <samples>` line per sampled instruction.
//!
//! Symbols are named as BOLT names them, mangled ([`FunctionProfile::symbol`], not the
//! demangled name tables show): a global by its symbol, a local (`static`)
//! function as `name/N`, N counting the local symbols of that name in address order
//! (BOLT's `NameResolver::uniquify`). Analysis resolves those names from the binary's
//! symbol table and keeps them in the profile ([`FunctionProfile::bolt_name`]), so the
//! `.fdata` of a profile file does not depend on the files of the machine it is
//! rendered on.
//!
//! `.fdata` is per binary: [`render`] returns one file per binary, the main binary
//! first (the profiled command's executable, else the binary with most edge counts).

use std::collections::BTreeMap;
use std::fmt::Write;

use cpi_common::wire::EventRole;

use crate::profile::model::{EdgeKind, FunctionProfile, Profile};

/// One binary's `.fdata`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdataFile {
    /// The binary's path as in the profile.
    pub binary: String,
    /// The file's contents.
    pub text: String,
    /// Branch lines (or sample lines in `no_lbr` form) written.
    pub lines: usize,
    /// Whether the file is in `no_lbr` (sample) form.
    pub no_lbr: bool,
}

/// Why no `.fdata` could be written.
#[derive(Debug, thiserror::Error)]
pub enum FdataError {
    /// No binary has edges or sampled instructions.
    #[error(
        "nothing to write as .fdata: no binary in the profile has edges (branch records) \
         or per-instruction samples"
    )]
    Empty,
}

/// Binaries BOLT cannot rewrite.
fn is_file(binary: &str) -> bool {
    !binary.starts_with('[')
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// BOLT's parser splits on spaces and has no unescaping: a name with whitespace
/// cannot be written.
fn writable(name: &str) -> bool {
    !name.is_empty() && !name.contains(char::is_whitespace)
}

struct Binary<'a> {
    functions: Vec<&'a FunctionProfile>,
    /// Name → (start, BOLT's name).
    by_name: BTreeMap<&'a str, (u64, &'a str)>,
}

/// BOLT's name of a function: its local `name/N` when the profile has one, else its
/// symbol (mangled: BOLT matches symbols, not what people read).
fn bolt_name(f: &FunctionProfile) -> &str {
    f.bolt_name.as_deref().unwrap_or(f.symbol())
}

/// Renders one `.fdata` per binary with data, the main binary first.
pub fn render(p: &Profile) -> Result<Vec<FdataFile>, FdataError> {
    let mut bins: BTreeMap<&str, Binary> = BTreeMap::new();
    for f in p.processes.iter().flat_map(|pr| pr.functions.iter()) {
        if !is_file(&f.binary) {
            continue;
        }
        let b = bins.entry(f.binary.as_str()).or_insert_with(|| Binary {
            functions: Vec::new(),
            by_name: BTreeMap::new(),
        });
        b.functions.push(f);
        b.by_name.insert(f.name.as_str(), (f.address, bolt_name(f)));
    }
    let mut files: Vec<(f64, FdataFile)> = Vec::new();
    for (path, b) in &bins {
        let edge_weight: f64 = b
            .functions
            .iter()
            .flat_map(|f| f.edges.iter())
            .map(|e| e.count)
            .sum();
        let file = if b.functions.iter().any(|f| !f.edges.is_empty()) {
            branches(path, b, &bins)
        } else {
            samples(p, path, b)
        };
        if file.lines > 0 {
            files.push((edge_weight, file));
        }
    }
    if files.is_empty() {
        return Err(FdataError::Empty);
    }
    let command = p.command.first().map(|c| file_name(c));
    files.sort_by(|(wa, a), (wb, b)| {
        let main_a = command == Some(file_name(&a.binary));
        let main_b = command == Some(file_name(&b.binary));
        main_b
            .cmp(&main_a)
            .then(wb.total_cmp(wa))
            .then(a.binary.cmp(&b.binary))
    });
    Ok(files.into_iter().map(|(_, f)| f).collect())
}

fn branches(path: &str, b: &Binary, bins: &BTreeMap<&str, Binary>) -> FdataFile {
    // (from, to) → (mispreds, count), summed over processes.
    let mut lines: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
    for f in &b.functions {
        if !writable(bolt_name(f)) {
            continue;
        }
        for e in &f.edges {
            let here = bolt_name(f);
            let from = format!("1 {here} {:x}", e.from.wrapping_sub(f.address));
            let to = match (&e.to_function, &e.to_binary) {
                (None, _) => Some(format!("1 {here} {:x}", e.to.wrapping_sub(f.address))),
                (Some(name), to_bin) => {
                    let to_bin = to_bin.as_deref().unwrap_or(path);
                    let start = bins
                        .get(to_bin)
                        .and_then(|tb| tb.by_name.get(name.as_str()).copied());
                    match start {
                        Some((start, bolt)) if to_bin == path && writable(bolt) => {
                            Some(format!("1 {bolt} {:x}", e.to.wrapping_sub(start)))
                        }
                        // Another binary, or a function the profile does not know:
                        // BOLT takes the edge as leaving to an unknown place.
                        _ if writable(file_name(to_bin)) => {
                            Some(format!("0 {} {:x}", file_name(to_bin), e.to))
                        }
                        _ => None,
                    }
                }
            };
            let Some(to) = to else { continue };
            let mispreds = match e.kind {
                EdgeKind::Taken => e.mispredicts,
                EdgeKind::FallThrough => 0.0,
            };
            let v = lines.entry((from, to)).or_default();
            v.0 += mispreds;
            v.1 += e.count;
        }
    }
    let mut text = String::new();
    let mut n = 0;
    for ((from, to), (mispreds, count)) in &lines {
        let count = count.round() as u64;
        if count == 0 {
            continue;
        }
        let mispreds = (mispreds.round() as u64).min(count);
        let _ = writeln!(text, "{from} {to} {mispreds} {count}");
        n += 1;
    }
    FdataFile {
        binary: path.to_string(),
        text,
        lines: n,
        no_lbr: false,
    }
}

fn samples(p: &Profile, path: &str, b: &Binary) -> FdataFile {
    let event = p
        .events
        .iter()
        .find(|e| e.roles().any(|r| r != EventRole::Branches))
        .map(|e| e.name.as_str())
        .unwrap_or("cycles");
    let mut lines: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for f in b.functions.iter().filter(|f| writable(bolt_name(f))) {
        for l in f
            .lines
            .iter()
            .filter(|l| l.samples > 0 && l.address >= f.address)
        {
            *lines
                .entry((bolt_name(f).to_string(), l.address - f.address))
                .or_default() += l.samples;
        }
    }
    let mut text = format!("no_lbr {}\n", event.replace(char::is_whitespace, "_"));
    for ((name, off), samples) in &lines {
        let _ = writeln!(text, "1 {name} {off:x} {samples}");
    }
    FdataFile {
        binary: path.to_string(),
        text,
        lines: lines.len(),
        no_lbr: true,
    }
}
