//! What the readers of bytes that other users control refused, counted in one place.
//!
//! Each reader states its budget beside its parsing (bytes read, entries kept, memory
//! held, with cost linear in what it reads) because the bound is only meaningful there:
//! perf maps (cpi-user/src/binary/perfmap.rs), DWARF file names
//! (cpi-user/src/binary/lines.rs), debug-link CRCs (cpi-user/src/binary/debugfile.rs),
//! mapped files that fault (cpi-user/src/fsafe/sys/map.rs), Go function tables
//! (cpi-user/src/binary/gopclntab.rs), the kubelet's answer
//! (cpi-agent/src/kubelet.rs) and paths a recording names
//! (cpi-user/src/import/). When a file exceeds its budget, the reader says so once, naming
//! the file, and counts it here through [`refused`]: the agent exports the counts as
//! `cpi_bpf_refused_total{reader}`, so an operator sees that someone's file was cut or
//! refused without reading logs.

use std::sync::atomic::{AtomicU64, Ordering};

/// A reader of foreign bytes that can refuse (or cut) what it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reader {
    /// A mapped binary that faulted while read (truncated under the mapping, holes on a
    /// full filesystem): not used.
    MappedFile,
    /// DWARF line tables whose file names would render past their bound: no source lines.
    DwarfLines,
    /// A debug-link candidate larger than what is left of the CRC budget: not read.
    DebugLink,
    /// A perf map larger than its budget: cut to its tail.
    PerfMap,
    /// A kubelet answer from a peer that did not prove who it is: names not used.
    Kubelet,
    /// A file a recording names that the invoking user could not read: not opened.
    RecordedPath,
    /// A Go function table whose names would take more bytes than the table holds:
    /// the rest left unnamed.
    GoPclntab,
}

impl Reader {
    /// Every reader, in the order of their counts.
    pub const ALL: [Reader; 7] = [
        Reader::MappedFile,
        Reader::DwarfLines,
        Reader::DebugLink,
        Reader::PerfMap,
        Reader::Kubelet,
        Reader::RecordedPath,
        Reader::GoPclntab,
    ];

    /// The name metrics and messages use.
    pub fn name(self) -> &'static str {
        match self {
            Reader::MappedFile => "mapped_file",
            Reader::DwarfLines => "dwarf_lines",
            Reader::DebugLink => "debug_link",
            Reader::PerfMap => "perf_map",
            Reader::Kubelet => "kubelet",
            Reader::RecordedPath => "recorded_path",
            Reader::GoPclntab => "go_pclntab",
        }
    }
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static COUNTS: [AtomicU64; Reader::ALL.len()] = [ZERO; Reader::ALL.len()];

/// Counts one refusal (or cut) by `reader`.
pub fn refused(reader: Reader) {
    COUNTS[reader as usize].fetch_add(1, Ordering::Relaxed);
}

/// Refusals so far, by reader (every reader, zeros included).
pub fn refusals() -> [(Reader, u64); Reader::ALL.len()] {
    Reader::ALL.map(|r| (r, COUNTS[r as usize].load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reader_counts_on_its_own() {
        let before = refusals();
        refused(Reader::PerfMap);
        refused(Reader::PerfMap);
        let after = refusals();
        for ((r, b), (_, a)) in before.iter().zip(after) {
            // Other tests may refuse meanwhile: counts only grow, and these two landed.
            assert!(a >= *b, "{r:?}");
            if *r == Reader::PerfMap {
                assert!(a >= b + 2);
            }
        }
        assert_eq!(Reader::ALL.map(|r| r as usize), [0, 1, 2, 3, 4, 5, 6]);
    }
}
