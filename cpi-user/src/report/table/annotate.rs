//! `--annotate FUNC`: the function's instructions with their counts, samples, cycles
//! and CPI (a time profile: samples and shares), the source lines interleaved where the
//! binary has DWARF, gaps between listed instructions marked, and jump targets named
//! `<func+0xoff>` as perf annotate names them.

use std::collections::HashMap;
use std::fmt::Write;
use std::io::Read;
use std::path::Path;

use comfy_table::{CellAlignment, Table};

use super::{
    cpi, ellipsize, fitted, group, inputs, new_table, no_such_function, opt_si, range, share_pm,
    si, time, wrap, Notes, TableError,
};
use crate::fsafe::behalf::Owner;
use crate::fsafe::escape;
use crate::profile::model::{
    BlockProfile, FunctionProfile, InstructionProfile, Mode, ProcessProfile, Profile,
};

pub(super) fn annotate(
    p: &Profile,
    name: &str,
    renamed: &HashMap<String, String>,
    width: Option<usize>,
    notes: &Notes,
    out: &mut String,
) -> Result<(), TableError> {
    let mut found = false;
    for proc in &p.processes {
        for f in proc.functions.iter().filter(|f| f.is_named(name)) {
            found = true;
            out.push('\n');
            // The full name over the instructions, where the tables show a short one.
            let full = renamed.iter().find(|(_, shown)| **shown == f.name);
            let full = full.map_or(f.name.as_str(), |(full, _)| full.as_str());
            let writer = p.binaries.iter().find(|b| b.path == f.binary);
            let writer = writer.and_then(|b| b.owner);
            out.push_str(&annotate_function(
                p.mode, proc, f, full, width, notes, writer,
            ));
        }
    }
    if found {
        return Ok(());
    }
    Err(no_such_function(p, name))
}

fn annotate_function(
    mode: Mode,
    proc: &ProcessProfile,
    f: &FunctionProfile,
    full_name: &str,
    width: Option<usize>,
    notes: &Notes,
    writer: Option<Owner>,
) -> String {
    let mut s = function_line(mode, proc, f, full_name, width, notes);
    if f.lines.is_empty() {
        s.push_str("no per-instruction data for this function\n");
        return s;
    }
    let hottest = hottest(mode, &f.lines);
    let sources = source_rows(&f.lines, writer);
    s.push_str(&fitted(width, |max| {
        instruction_table(mode, proc, f, &sources, hottest, max, notes)
    }));
    s.push('\n');
    let mut marks = Vec::new();
    if hottest.is_some() {
        marks.push("▶ hottest instruction");
    }
    if gaps(&f.lines, &f.blocks).iter().any(|&g| g) {
        marks.push("…: instructions not listed (no samples)");
    }
    if !marks.is_empty() {
        s.push_str(&wrap(&marks.join("; "), width));
    }
    s
}

/// The line over a function's instructions: where it is and what it cost.
fn function_line(
    mode: Mode,
    proc: &ProcessProfile,
    f: &FunctionProfile,
    full_name: &str,
    width: Option<usize>,
    notes: &Notes,
) -> String {
    let mut s = format!(
        "{} [{}] pid {} ({}): {}, {} bytes, {} samples",
        full_name,
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
            opt_si(f.measures.cycles),
            opt_si(f.measures.instructions),
            cpi(
                f.measures.cpi,
                f.samples,
                inputs(f.measures.cycles, f.measures.instructions),
                notes
            )
        );
    } else if let Some(t) = f.measures.time_ns {
        let _ = write!(s, ", {} CPU", time(t));
    }
    if let Some(src) = &f.source {
        // Source paths come from the binary, not escaped with the rest of the profile.
        let _ = write!(s, ", source {}:{}", escape(&src.file), src.line);
    }
    wrap(&s, width)
}

/// The hottest instruction: most cycles, or most samples in a time profile, or the most
/// executed when neither was sampled; none when nothing ran.
fn hottest(mode: Mode, lines: &[InstructionProfile]) -> Option<u64> {
    let key = |l: &InstructionProfile| {
        if mode.has_cpi() {
            (l.cycles.unwrap_or(0.0), l.count)
        } else {
            (l.samples as f64, l.count)
        }
    };
    lines
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
        .map(|l| l.address)
}

/// The longest x86 instruction, in bytes.
const MAX_INSTRUCTION: u64 = 15;

/// Per line of `f`, whether instructions lie unlisted between it and the line before
/// (a time profile kept by the agent lists its sampled instructions only). A profile
/// holds no instruction lengths: a gap is certain where the line before ends a basic
/// block that stops short of this line, or where the two lie further apart than the
/// longest instruction; shorter gaps outside blocks go unmarked.
pub(crate) fn gaps(lines: &[InstructionProfile], blocks: &[BlockProfile]) -> Vec<bool> {
    let mut out = vec![false; lines.len()];
    for (i, w) in lines.windows(2).enumerate() {
        let (a, b) = (w[0].address, w[1].address);
        let block_end = blocks
            .iter()
            .find(|bl| bl.start <= a && a < bl.end)
            .map(|bl| bl.end);
        out[i + 1] = match block_end {
            Some(end) if b >= end => b != end,
            Some(_) => false,
            None => b.saturating_sub(a) > MAX_INSTRUCTION,
        };
    }
    out
}

/// The instructions of `f` with their numbers, source lines (`sources`, per line) and
/// gaps between them; names and text at most `max` characters.
fn instruction_table(
    mode: Mode,
    proc: &ProcessProfile,
    f: &FunctionProfile,
    sources: &[Option<String>],
    hottest: Option<u64>,
    max: usize,
    notes: &Notes,
) -> Table {
    let block_at = |addr: u64| f.blocks.iter().find(|b| b.start == addr);
    let gaps = gaps(&f.lines, &f.blocks);
    let head: &[&str] = if mode.has_cpi() {
        &[
            "",
            "address",
            "count",
            "samples",
            "cycles",
            "CPI",
            "block CPI",
            "instruction",
        ]
    } else {
        &["", "address", "samples", "share", "instruction"]
    };
    let last = head.len() - 1;
    let mut t = new_table(head.to_vec(), 2);
    if let Some(c) = t.column_mut(last) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    let samples: u64 = f.lines.iter().map(|l| l.samples).sum();
    for ((l, src), gap) in f.lines.iter().zip(sources).zip(gaps) {
        if gap {
            let mut row = vec![String::new(); last + 1];
            row[1] = "…".into();
            t.add_row(row);
        }
        if let Some(src) = src {
            let mut row = vec![String::new(); last];
            row.push(fit_source(src, max));
            t.add_row(row);
        }
        let mut row = vec![
            marker(hottest == Some(l.address)),
            format!("{:x}", l.address),
        ];
        if mode.has_cpi() {
            row.extend([
                si(l.count),
                group(l.samples),
                opt_si(l.cycles),
                cpi(l.cpi, l.samples, l.cycles.is_some(), notes),
                block_at(l.address)
                    .map(|b| cpi(b.cpi, b.samples, b.cycles.is_some(), notes))
                    .unwrap_or_default(),
            ]);
        } else {
            let p = l.samples as f64 / samples.max(1) as f64;
            row.extend([group(l.samples), share_pm(mode, p, samples, notes)]);
        }
        let function_at = |addr: u64| {
            proc.functions
                .iter()
                .find(|g| g.binary == f.binary && g.address <= addr && addr < g.address + g.size)
                .map(|g| (g.name.as_str(), g.address))
        };
        row.push(fit_instruction(&named_target(&l.text, function_at), max));
        t.add_row(row);
    }
    t
}

/// `text` with a direct branch's target written as perf annotate writes it,
/// `jne 11e0 <leaf+0x20>`, for the disassembler's `jne short 00000000000011E0h` (or
/// `0x11e0`): `function_at` gives the name and start of the function holding an address.
pub(crate) fn named_target<'a>(
    text: &str,
    function_at: impl Fn(u64) -> Option<(&'a str, u64)>,
) -> String {
    let mut words: Vec<&str> = text.split(' ').collect();
    let branch = words
        .first()
        .is_some_and(|m| m.starts_with('j') || *m == "call" || m.starts_with("loop"));
    let target = words.last().and_then(|w| parse_address(w));
    let (true, Some(addr)) = (branch, target) else {
        return text.to_string();
    };
    words.retain(|w| *w != "short" && *w != "near");
    words.pop();
    let mut s = format!("{} {addr:x}", words.join(" "));
    if let Some((name, start)) = function_at(addr) {
        match addr - start {
            0 => {
                let _ = write!(s, " <{name}>");
            }
            off => {
                let _ = write!(s, " <{name}+{off:#x}>");
            }
        }
    }
    s
}

/// An instruction in at most `max` characters that keeps a branch's target: the name
/// in `<name+0x20>` is shortened first (`jne 3d450 <sqli…+0x80>`), then dropped
/// (`jne 3d450`); any other instruction is cut at its end.
fn fit_instruction(text: &str, max: usize) -> String {
    let n = text.chars().count();
    let named = text.strip_suffix('>').and_then(|t| t.rsplit_once(" <"));
    let Some((head, inner)) = named.filter(|_| n > max) else {
        return ellipsize(text, max);
    };
    let (name, off) = match inner.rfind('+') {
        Some(i) => inner.split_at(i),
        None => (inner, ""),
    };
    let fixed = head.chars().count() + off.chars().count() + 3;
    let room = max.saturating_sub(fixed);
    if room >= 4 {
        format!("{head} <{}{off}>", ellipsize(name, room))
    } else {
        ellipsize(head, max)
    }
}

/// An address as the disassembler writes an operand: `00000000000011E0h` or `0x11e0`.
fn parse_address(w: &str) -> Option<u64> {
    let hex = match w.strip_prefix("0x") {
        Some(h) => h,
        None => w.strip_suffix('h')?,
    };
    if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Per instruction, the source line to show above it when it starts a new one (as perf
/// annotate interleaves source): `file:line` by the file's last component, then the
/// line's text when the source file is readable here by `writer`, who could have
/// written the binary that names it.
pub(crate) fn source_rows(
    lines: &[InstructionProfile],
    writer: Option<Owner>,
) -> Vec<Option<String>> {
    let mut files: HashMap<&str, Option<Vec<String>>> = HashMap::new();
    let mut last = None;
    lines
        .iter()
        .map(|l| {
            let src = l.source.as_ref()?;
            if last == Some(src) {
                return None;
            }
            last = Some(src);
            let name = Path::new(&src.file).file_name()?.to_string_lossy();
            let text = files
                .entry(&src.file)
                .or_insert_with(|| read_source(Path::new(&src.file), writer))
                .as_ref()
                .and_then(|t| t.get(src.line.checked_sub(1)? as usize))
                .map(|t| format!("  {}", escape(t.trim())))
                .unwrap_or_default();
            Some(format!("{}:{}{text}", escape(&name), src.line))
        })
        .collect()
}

/// A row of [`source_rows`] in at most `max` characters: the line's text is cut first,
/// then the file's name, never the `:line` that says where the code came from.
fn fit_source(row: &str, max: usize) -> String {
    if row.chars().count() <= max {
        return row.to_string();
    }
    let (place, text) = row.split_once("  ").unwrap_or((row, ""));
    let room = max.saturating_sub(place.chars().count() + 2);
    if room >= 2 && !text.is_empty() {
        return format!("{place}  {}", ellipsize(text, room));
    }
    match place.rsplit_once(':') {
        Some((file, line)) => {
            let keep = max.saturating_sub(line.chars().count() + 1).max(2);
            format!("{}:{line}", ellipsize(file, keep))
        }
        None => ellipsize(place, max),
    }
}

/// A source file's lines, when it can be read safely (cpi-user/src/fsafe/mod.rs): a
/// regular file, never blocking, at most 16 MiB; as root, one the binary's `writer`
/// (or the user a recording came from) could read (a refusal is said: the caller asks
/// once per file).
fn read_source(path: &Path, writer: Option<Owner>) -> Option<Vec<String>> {
    let mut text = Vec::new();
    let f = match crate::fsafe::open_named_by(path, writer) {
        Ok(f) => f,
        Err(e @ crate::fsafe::OpenError::NotReadable { .. }) => {
            log::warn!("{}", crate::chain(&e));
            return None;
        }
        Err(_) => return None,
    };
    f.take(16 << 20).read_to_end(&mut text).ok()?;
    Some(
        String::from_utf8_lossy(&text)
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

fn marker(hot: bool) -> String {
    if hot { "▶" } else { "" }.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_targets_are_named_as_perf_names_them() {
        let at = |a: u64| (0x11c0..0x1200).contains(&a).then_some(("leaf", 0x11c0));
        assert_eq!(
            named_target("jne short 00000000000011E0h", at),
            "jne 11e0 <leaf+0x20>"
        );
        assert_eq!(
            named_target("call 00000000000011C0h", at),
            "call 11c0 <leaf>"
        );
        assert_eq!(
            named_target("jmp 0x4000", at),
            "jmp 4000",
            "outside any function"
        );
        for plain in ["mov eax,10h", "call qword ptr [rip+2F0Ah]", "add rdi,1"] {
            assert_eq!(named_target(plain, at), plain);
        }
    }

    #[test]
    fn gaps_are_marked_where_instructions_are_missing() {
        let line = |address| InstructionProfile {
            address,
            count: 0.0,
            samples: 1,
            cycles: None,
            cpi: None,
            text: String::new(),
            source: None,
        };
        let lines = [line(0x100), line(0x104), line(0x140), line(0x14f)];
        assert_eq!(gaps(&lines, &[]), [false, false, true, false]);
    }

    #[test]
    fn a_cut_source_row_keeps_its_file_and_line() {
        let row =
            "sqlite3.c:91234  rc = sqlite3VdbeMemFromBtreeZeroOffset(pC->uc.pCursor, p2, &m);";
        assert_eq!(fit_source(row, 200), row);
        assert_eq!(fit_source(row, 30), "sqlite3.c:91234  rc = sqlite3…");
        // No room for the text: the place alone, its line whole.
        assert_eq!(fit_source(row, 18), "sqlite3.c:91234");
        let long = format!("{}.c:7  x = 1;", "generated_".repeat(8));
        assert_eq!(fit_source(&long, 20), "generated_generat…:7");
    }

    #[test]
    fn a_cut_branch_keeps_its_target() {
        let jump = "jne 3d450 <sqlite3BtreeIndexMoveto+0x80>";
        assert_eq!(fit_instruction(jump, 60), jump);
        assert_eq!(fit_instruction(jump, 22), "jne 3d450 <sqli…+0x80>");
        assert_eq!(fit_instruction(jump, 14), "jne 3d450");
        assert_eq!(
            fit_instruction("call 26890 <memcmp@plt>", 18),
            "call 26890 <memc…>"
        );
        assert_eq!(fit_instruction("mov rdi,[r13+88h]", 10), "mov rdi,[…");
    }
}
