//! What reading binaries cost since this process started: files opened for other
//! processes' mappings, symbol tables parsed and unwind tables read. Counted so that a
//! new process of a binary already seen can be shown to cost none of them (the agent's
//! `cpi_bpf_binaries_parsed_total` and `cpi_bpf_binary_opens_total`, checked under process churn): each is
//! keyed by the file (device and inode) and paid once while the file's entry is cached.
//! Process-wide counters, since the collector and the analysis each do a part.

use std::sync::atomic::{AtomicU64, Ordering};

static OPENS: AtomicU64 = AtomicU64::new(0);
static SYMBOL_TABLES: AtomicU64 = AtomicU64::new(0);
static UNWIND_TABLES: AtomicU64 = AtomicU64::new(0);

/// Counts since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BinaryWork {
    /// Files of other processes' mappings opened (captured, or by path).
    pub opens: u64,
    /// Binaries parsed for their functions and names (cpi-user/src/binary/mod.rs
    /// `BinaryCache`).
    pub symbol_tables: u64,
    /// Binaries whose unwind sections were read and checked (cpi-user/src/unwind).
    pub unwind_tables: u64,
}

/// The counts now.
pub fn binary_work() -> BinaryWork {
    BinaryWork {
        opens: OPENS.load(Ordering::Relaxed),
        symbol_tables: SYMBOL_TABLES.load(Ordering::Relaxed),
        unwind_tables: UNWIND_TABLES.load(Ordering::Relaxed),
    }
}

/// One file of a mapping opened.
pub(crate) fn opened() {
    OPENS.fetch_add(1, Ordering::Relaxed);
}

/// One binary parsed for symbols.
pub(crate) fn symbols_parsed() {
    SYMBOL_TABLES.fetch_add(1, Ordering::Relaxed);
}

/// One binary's unwind sections read.
pub(crate) fn unwind_read() {
    UNWIND_TABLES.fetch_add(1, Ordering::Relaxed);
}
