//! Perf maps (`/tmp/perf-PID.map`: `START SIZE NAME`, hex, one per line), which JIT
//! runtimes write to name the code they emit in anonymous memory.
//!
//! The file is written by a foreign process and may be any size (a runtime that logs
//! every placement appends for its whole life; a user can hard-link one 64 MiB file for
//! many processes), so it is read under a budget: its last `MAX_PERF_MAP_BYTES` bytes
//! (an append-only log's tail holds the latest placements, and later entries win
//! anyway), of which the last `MAX_PERF_MAP_ENTRIES` entries are kept. What is held is
//! compact — 24 bytes per entry and the names in one string, no allocation per entry —
//! and at most about 5.5 MiB; the symbolizer counts it in its byte bound and evicts it
//! with the rest of its cache (cpi-user/src/binary/symbolize.rs).

use std::io::{Read, Seek, SeekFrom};

use super::Function;

/// Bytes of a perf map read at most (its tail). Real maps name tens of thousands of
/// functions in about 100 bytes a line: a few MiB.
pub(crate) const MAX_PERF_MAP_BYTES: u64 = 4 << 20;

/// Entries of a perf map kept at most (the last ones read): bounds the entry table
/// (24 bytes each, 1.5 MiB) for files of short lines, which the byte budget alone
/// would let reach 700 Ki entries.
pub(crate) const MAX_PERF_MAP_ENTRIES: usize = 64 << 10;

/// One function of a perf map; its name is `names[name..name + len]`.
#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u64,
    size: u64,
    name: u32,
    len: u32,
}

/// What a perf map read left out, for the warning that names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// Bytes before the tail that was read.
    pub bytes_skipped: u64,
    /// Lines of the tail read but not kept (past `MAX_PERF_MAP_ENTRIES`).
    pub lines_dropped: u64,
}

/// A parsed perf map: entries sorted by start, one per start (the last written).
#[derive(Debug, Default)]
pub struct PerfMap {
    entries: Vec<Entry>,
    names: String,
    /// What the budget left out, if anything.
    pub cut: Option<Cut>,
}

impl PerfMap {
    /// Reads `file` (`len` bytes long when it was checked) under the budget; an
    /// unreadable file is an empty map.
    pub fn read(file: &mut (impl Read + Seek), len: u64) -> PerfMap {
        let skipped = len.saturating_sub(MAX_PERF_MAP_BYTES);
        let mut text = Vec::new();
        let read = file
            .seek(SeekFrom::Start(skipped))
            .and_then(|_| file.take(MAX_PERF_MAP_BYTES).read_to_end(&mut text));
        if read.is_err() {
            return PerfMap::default();
        }
        // Begun inside a line: that line is not whole.
        let whole = match (skipped, text.iter().position(|&b| b == b'\n')) {
            (0, _) => &text[..],
            (_, Some(nl)) => &text[nl + 1..],
            (_, None) => &[],
        };
        let mut map = PerfMap::parse(whole);
        if skipped > 0 || map.cut.is_some() {
            map.cut.get_or_insert_with(Cut::default).bytes_skipped = skipped;
        }
        map
    }

    /// Parses whole lines: bad ones are skipped (a foreign runtime wrote them), the last
    /// `MAX_PERF_MAP_ENTRIES` good ones kept.
    pub fn parse(text: &[u8]) -> PerfMap {
        let mut map = PerfMap::default();
        // Backwards, so the entries kept are the last ones and, of equal starts, the
        // first met (the last written) is kept by the stable sort and dedup.
        let mut lines = text.rsplit(|&b| b == b'\n');
        for line in lines.by_ref() {
            map.push(line);
            if map.entries.len() == MAX_PERF_MAP_ENTRIES {
                break;
            }
        }
        let dropped = lines.filter(|l| !l.is_empty()).count() as u64;
        if dropped > 0 {
            map.cut = Some(Cut {
                bytes_skipped: 0,
                lines_dropped: dropped,
            });
        }
        map.entries.sort_by_key(|e| e.start);
        map.entries.dedup_by_key(|e| e.start);
        map.entries.shrink_to_fit();
        map.names.shrink_to_fit();
        map
    }

    /// Adds the entry of `line`, if it is one.
    fn push(&mut self, line: &[u8]) {
        let mut f = line.splitn(3, |&b| b == b' ');
        let hex = |s: Option<&[u8]>| {
            let s = std::str::from_utf8(s?).ok()?;
            u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
        };
        let (Some(start), Some(size), Some(name)) = (hex(f.next()), hex(f.next()), f.next()) else {
            return;
        };
        if size == 0 {
            return;
        }
        let name = String::from_utf8_lossy(name);
        let name = name.trim();
        // Offsets fit: the text read is at most MAX_PERF_MAP_BYTES.
        self.entries.push(Entry {
            start,
            size,
            name: self.names.len() as u32,
            len: name.len() as u32,
        });
        self.names.push_str(name);
    }

    /// The function holding `addr`.
    pub fn lookup(&self, addr: u64) -> Option<Function> {
        let i = self
            .entries
            .partition_point(|e| e.start <= addr)
            .checked_sub(1)?;
        let e = self.entries[i];
        let f = Function {
            name: self.names[e.name as usize..(e.name + e.len) as usize].to_string(),
            start: e.start,
            size: e.size,
        };
        f.contains(addr).then_some(f)
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> u64 {
        (size_of::<PerfMap>()
            + self.entries.capacity() * size_of::<Entry>()
            + self.names.capacity()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(m: &PerfMap) -> Vec<&str> {
        m.entries
            .iter()
            .map(|e| &m.names[e.name as usize..(e.name + e.len) as usize])
            .collect()
    }

    #[test]
    fn perf_map_lines() {
        let m = PerfMap::parse(b"7f00 20 jit_a\nbad line\n0x7f40 10 jit b\n7f00 30 jit_a2\n");
        assert_eq!(names(&m), ["jit_a2", "jit b"]);
        let f = m.lookup(0x7f45).unwrap();
        assert_eq!((f.start, f.size, f.name.as_str()), (0x7f40, 0x10, "jit b"));
        assert!(m.lookup(0x7f50).is_none());
        assert!(m.cut.is_none());
    }

    /// A map of short lines past both budgets: its tail is read, its last entries kept,
    /// what was left out said, and what is held stays under 5.5 MiB.
    #[test]
    fn a_perf_map_over_the_budget_is_cut_and_held_small() {
        let lines = 6_000_000u64;
        let text: String = (0..lines).map(|i| format!("{:x} 1 f\n", i * 2)).collect();
        let len = text.len() as u64;
        let m = PerfMap::read(&mut std::io::Cursor::new(text.as_bytes()), len);
        assert!(m.heap_bytes() < 2 << 20, "{} bytes held", m.heap_bytes());
        assert_eq!(m.entries.len(), MAX_PERF_MAP_ENTRIES);
        let cut = m.cut.expect("the cut is said");
        assert!(cut.bytes_skipped > len / 2, "most of the file is not read");
        let skipped = len - MAX_PERF_MAP_BYTES;
        // Less the line the tail begins inside.
        let whole_lines = text[skipped as usize..].matches('\n').count() as u64 - 1;
        assert_eq!(
            cut,
            Cut {
                bytes_skipped: skipped,
                lines_dropped: whole_lines - MAX_PERF_MAP_ENTRIES as u64,
            }
        );
        // The last line is the last entry.
        let last = (lines - 1) * 2;
        assert_eq!(m.lookup(last).map(|f| f.start), Some(last));
        assert!(m.lookup(0).is_none(), "the head is not read");
    }
}
