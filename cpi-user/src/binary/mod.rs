//! ELF binaries: build-id, file offset ↔ virtual address, function bounds, and (in
//! `cfg`) disassembly, basic blocks and the control-flow graph of one function.
//!
//! Function bounds come from `.symtab` when present, the binary's own or its separate
//! debug file's (`debugfile`: `.gnu_debuglink`, `/usr/lib/debug/.build-id/`);
//! otherwise (stripped binaries, as Debian ships them) from `.eh_frame` FDE starts, named from `.dynsym` where a dynamic
//! symbol starts at the same address and `func_<hexaddr>` elsewhere, and from Go's own
//! function table (`gopclntab`) in Go binaries. Executable code that
//! none of these covers is a hole named after the binary and its address
//! ([`Binary::function_or_hole`]), so no sample of a mapped file is lost for want of a
//! symbol. PLT sections are
//! pseudo-functions (`name@plt`-less: `[.plt]`, `[.plt.sec]`) so calls through them stay
//! inside a function.
//!
//! A [`Binary`] maps its file read-only ([`Binary::open`]) instead of reading it: a
//! compiler's `libLLVM.so` is 200 MB, of which a profile needs a few functions. What it
//! keeps on the heap is small and fixed after parsing: the load segments, one 16-byte
//! entry per function (start, size, and where its name lies in the mapping — no `String`
//! per function), and BOLT's local-name ordinals (4 bytes per function of a binary with
//! a symbol table). Code bytes and names are read from the mapping when a function is
//! decoded or named; decoded functions are cached, bounded, by
//! [`symbolize::Symbolizer`]. Bad ELF is an error, never a panic.
//!
//! Mapped pages are page cache, shared with every process that maps the same file, and
//! reclaimable; they are not heap and `Binary::heap_bytes` does not count them. They
//! do count in this process's resident set while touched, and on Linux 6.18 a touch
//! maps the page cache's whole folio, up to 2 MiB. So the pages read while parsing
//! (symbol and string tables, `.eh_frame`) are dropped from it as the tables are walked
//! and right after (`Binary::release_pages`), and the names and code read later from a
//! file of 8 MiB or more are copied with `pread` (`Binary::copy_at`), which maps
//! nothing (a smaller file's are read through the mapping, released every 4 MiB): read through the
//! mapping, a window naming a few thousand functions of two compilers' libraries held
//! 20 MiB of each (BENCHMARKS.md, "Agent memory on a build host").
//!
//! A file truncated in place while it is mapped (not replaced: a new file at the same
//! path is a new inode, see [`BinaryCache`]) would make reads past its new end fault with
//! `SIGBUS`; the mapping is a `fsafe::map::GuardedMap` (cpi-user/src/fsafe/sys/map.rs), so
//! such a read gets zeros instead and [`Binary::truncated`] says so: the symbolizer then
//! drops the binary and counts its samples as unusable. Files are opened with
//! cpi-user/src/fsafe/mod.rs (never blocking, regular files only).
//!
//! A file its owner rewrites in place (same inode) is read as it is at each read: names
//! may come out wrong, but a name is cut at `MAX_MAPPED_NAME` and copied before it is
//! checked as UTF-8 (`copied_utf8`), as are source file names (`lines`).

pub(crate) mod cfg;
pub(crate) mod debugfile;
pub mod demangle;
pub mod ehframe;
mod gopclntab;
pub(crate) mod kallsyms;
pub(crate) mod lines;
pub(crate) mod negative;
pub mod perfmap;
pub(crate) mod symbolize;
mod tables;
pub mod work;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use tables::{bolt_ordinals, copied_utf8, owned_utf8, symtab_of, Tables};

pub use cfg::{BasicBlock, Cfg, CfgEdge, FlowKind, Instruction};
pub use debugfile::DebugRoot;
pub use demangle::demangle;
pub use lines::{SourceLine, SourceLines};
pub use symbolize::{CodeObject, Resolved, SymbolizeError, Symbolizer, SymbolizerOptions};

/// ELF `PF_X`.
const PF_X: u32 = 1;

/// Why a binary could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    /// The file could not be opened safely (a FIFO, a device, another file than mapped).
    #[error(transparent)]
    Open(#[from] crate::fsafe::OpenError),
    /// The file was truncated while mapped: what was read is not the file.
    #[error("{path}: truncated while in use; not used")]
    Truncated {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be mapped.
    // The cause is in the message, not a `source()`: this error is stored and rendered
    // alone (`{e}`, [`BinaryError::Unusable`]), and a chain prints it once.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        cause: std::io::Error,
    },
    /// No ELF magic, or `object` could not parse the headers.
    #[error("{path}: not an ELF file ({reason})")]
    NotElf {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An ELF file for another machine.
    #[error("{path}: not an x86-64 ELF file ({arch})")]
    UnsupportedArch {
        /// The file.
        path: PathBuf,
        /// Its architecture.
        arch: String,
    },
    /// Headers or tables that point outside the file.
    #[error("{path}: malformed ELF: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A file that failed before and has not changed since ([`BinaryCache`]).
    #[error("{path}: unusable, not retried until the file changes: {reason}")]
    Unusable {
        /// The file.
        path: PathBuf,
        /// The first failure.
        reason: String,
    },
    /// A function whose bounds lie outside every executable segment.
    #[error("{path}: no code at {vaddr:#x}..{end:#x} (function {function})")]
    NoCode {
        /// The file.
        path: PathBuf,
        /// The function's name.
        function: String,
        /// Its start.
        vaddr: u64,
        /// Its end.
        end: u64,
    },
}

/// A function's bounds in the binary's own address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Symbol name, `func_<hexaddr>` for an unnamed FDE, `[.plt]`-style for PLTs.
    pub name: String,
    /// First address.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
}

impl Function {
    /// First address after the function.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }

    /// `vaddr` lies in the function.
    pub fn contains(&self, vaddr: u64) -> bool {
        (self.start..self.end()).contains(&vaddr)
    }
}

/// A `PT_LOAD` segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// Virtual address.
    pub vaddr: u64,
    /// Size in memory.
    pub memsz: u64,
    /// File offset.
    pub offset: u64,
    /// Size in the file.
    pub filesz: u64,
    /// `PF_X` is set.
    pub executable: bool,
}

/// Where function bounds came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundsSource {
    /// `.symtab` (not stripped).
    SymbolTable,
    /// `.eh_frame` FDEs + `.dynsym` (stripped).
    EhFrame,
}

/// The bytes of an ELF file.
enum Bytes {
    /// The file, mapped read-only and shared, guarded against truncation.
    Mapped(crate::fsafe::map::GuardedMap),
    /// Bytes handed to [`Binary::parse`].
    Owned(Box<[u8]>),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m.bytes(),
            Bytes::Owned(b) => b,
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bytes::Mapped(m) => write!(f, "{m:?}"),
            Bytes::Owned(b) => write!(f, "Owned({} bytes)", b.len()),
        }
    }
}

/// One function of the table: 16 bytes.
#[derive(Clone, Copy, Debug)]
struct FnEntry {
    start: u64,
    size: u32,
    /// [`NAME_SYNTH`], [`NAME_OWNED`] | index into `Binary::owned_names`, or the file
    /// offset of the NUL-terminated name (past the binary's length: in the debug file,
    /// at the offset minus that length).
    name: u32,
}

/// The name is `func_<start in hex>`.
const NAME_SYNTH: u32 = u32::MAX;
/// The name is held on the heap (PLT pseudo-functions; names past 2 GiB into a file,
/// or longer than [`MAX_MAPPED_NAME`]).
const NAME_OWNED: u32 = 1 << 31;
/// Bytes read of a mapped name at first: most names end within them.
const NAME_READ: usize = 256;

/// Longest name read from the mapping: longer ones are held on the heap when the table
/// is built, so a mapped name is cut here only if its file was rewritten in place since
/// (its NUL overwritten by its owner). Without the cut each such name ran to the end of
/// the file: a copy of the rest of the file (up to 2 GiB) per function named.
const MAX_MAPPED_NAME: usize = 16 << 10;

/// An executable segment's bytes: a range of the file.
#[derive(Clone, Copy, Debug)]
struct CodeRange {
    vaddr: u64,
    offset: usize,
    len: usize,
}

/// Distinct for every [`Binary`] opened by this process: keys caches of what was derived
/// from one (decoded functions), which a reopened file must not hit.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Bytes a binary's mapping may be read for names and code between two releases of its
/// pages ([`Binary::note_read`]), where they are not read with `pread`
/// ([`Binary::copy_at`]); a name counts as the page it lies in.
const READ_PER_RELEASE: u64 = 4 << 20;
const PAGE: u64 = 4096;

/// Drops the pages of a binary's mapping and its debug file's from the resident set
/// (they stay in the page cache; the next read faults them back in).
fn release_maps(bytes: &Bytes, debug: Option<&crate::fsafe::map::GuardedMap>, path: &Path) {
    let own = match bytes {
        Bytes::Mapped(m) => Some(m),
        Bytes::Owned(_) => None,
    };
    for m in own.into_iter().chain(debug) {
        if let Err(e) = m.dont_need() {
            log::debug!("{}: madvise(MADV_DONTNEED): {e}", path.display());
        }
    }
}

/// Files this large or larger keep a descriptor beside their mapping, to read names and
/// code with `pread` ([`Binary::copy_at`]); smaller ones are read through the mapping,
/// which holds at most their size, so a host's thousands of small binaries do not each
/// hold a descriptor.
const PREAD_FROM: u64 = 8 << 20;

/// `file` mapped, with its descriptor kept for `pread` when it is [`PREAD_FROM`] or
/// larger.
fn map_file(file: &std::fs::File) -> std::io::Result<crate::fsafe::map::GuardedMap> {
    use crate::fsafe::map::GuardedMap;
    match file.metadata()?.len() {
        n if n >= PREAD_FROM => GuardedMap::with_reads(file),
        _ => GuardedMap::new(file),
    }
}

/// One ELF file, parsed once, mapped (see the module documentation).
#[derive(Debug)]
pub struct Binary {
    /// The path it was opened by.
    pub path: PathBuf,
    /// GNU build-id, lowercase hex.
    pub build_id: Option<String>,
    /// `ET_DYN` (PIE or shared library): loaded at a base chosen at run time.
    pub dynamic: bool,
    /// Where the function bounds came from.
    pub bounds: BoundsSource,
    /// Every `PT_LOAD`.
    pub segments: Vec<LoadSegment>,
    /// The separate debug file symbols or source lines came from, when one was used.
    pub debug_file: Option<PathBuf>,
    /// Who could have written the file and its debug file, and so chose the source files
    /// their line tables name; `None` for bytes not read from a file.
    pub owner: Option<crate::fsafe::behalf::Owner>,
    id: u64,
    bytes: Bytes,
    /// The separate debug file's mapping: names at offsets past the binary's own bytes
    /// lie in it ([`FnEntry::name`]).
    debug: Option<crate::fsafe::map::GuardedMap>,
    /// Sorted by start, non-overlapping.
    functions: Vec<FnEntry>,
    owned_names: Vec<Box<str>>,
    /// Per function: its ordinal among the local `.symtab` symbols of its name (BOLT's
    /// `name/N`), 0 when global; empty when no function is local. Made on first use
    /// (only `.fdata` needs it): hashing every local symbol of each binary opened took a
    /// quarter of the agent's CPU on a host starting new binaries (BENCHMARKS.md, "Agent
    /// CPU: source lines and BOLT names").
    bolt_ordinals: OnceLock<Vec<u32>>,
    /// Bytes named or decoded from the mapping since its pages were last released
    /// ([`Binary::note_read`]).
    read_since_release: AtomicU64,
    code: Vec<CodeRange>,
    heap: u64,
    /// Source lines looked up so far ([`Binary::source_line`]).
    lines: lines::LineCache,
}

impl Binary {
    /// Maps `path` read-only and parses it. The file is not read: the headers and the
    /// symbol (or `.eh_frame`) tables are paged in while parsing and dropped from this
    /// process's resident set right after.
    pub fn open(path: &Path) -> Result<Binary, BinaryError> {
        Binary::open_with_debug(path, &DebugRoot::default())
    }

    /// [`Binary::open`] with separate debug files looked up under `root`.
    pub(crate) fn open_with_debug(path: &Path, root: &DebugRoot) -> Result<Binary, BinaryError> {
        Binary::from_file_with_debug(&crate::fsafe::open(path)?, path, root)
    }

    /// [`Binary::open`] for a file already opened (with cpi-user/src/fsafe/mod.rs);
    /// `path` names it.
    pub fn from_file(file: &std::fs::File, path: &Path) -> Result<Binary, BinaryError> {
        Binary::from_file_with_debug(file, path, &DebugRoot::default())
    }

    /// [`Binary::from_file`] with separate debug files looked up under `root`.
    pub fn from_file_with_debug(
        file: &std::fs::File,
        path: &Path,
        root: &DebugRoot,
    ) -> Result<Binary, BinaryError> {
        let map = map_file(file).map_err(|cause| BinaryError::Io {
            path: path.to_path_buf(),
            cause,
        })?;
        let debug = debugfile::find(path, map.bytes(), root);
        let owner = file.metadata().ok().map(|m| {
            let own = crate::fsafe::behalf::Owner::of(&m);
            debug.as_ref().map_or(own, |d| own.and(d.owner))
        });
        let mut bin = Binary::with_bytes(path, Bytes::Mapped(map), debug)?;
        bin.owner = owner;
        if bin.truncated() {
            crate::fsafe::budget::refused(crate::fsafe::budget::Reader::MappedFile);
            return Err(BinaryError::Truncated {
                path: path.to_path_buf(),
            });
        }
        bin.release_pages();
        Ok(bin)
    }

    /// The file shrank under the mapping and a read past its new end returned zeros:
    /// nothing read from this binary can be trusted.
    pub fn truncated(&self) -> bool {
        matches!(&self.bytes, Bytes::Mapped(m) if m.truncated())
            || self.debug.as_ref().is_some_and(|d| d.truncated())
    }

    /// Parses ELF bytes (copied: the binary owns them); `path` is only used for naming
    /// and errors.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Binary, BinaryError> {
        Binary::with_bytes(path, Bytes::Owned(data.into()), None)
    }

    fn with_bytes(
        path: &Path,
        bytes: Bytes,
        debug: Option<debugfile::DebugFile>,
    ) -> Result<Binary, BinaryError> {
        let (debug_file, debug) = debug.map(|d| (d.path, d.map)).unzip();
        // Names are compared in place while the tables are sorted, and a file its owner
        // rewrites meanwhile makes those comparisons inconsistent, on which the standard
        // sorts may panic: that file is an error, not the end of the root agent.
        let release = || release_maps(&bytes, debug.as_ref(), path);
        let parse = || {
            let debug_bytes = debug.as_ref().map(|d| d.bytes());
            Tables::parse(path, bytes.get(), debug_bytes, &release)
        };
        let t = std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse)).map_err(|_| {
            BinaryError::Malformed {
                path: path.to_path_buf(),
                what: "its symbol table changed while it was read".into(),
            }
        })??;
        let mut b = Binary {
            path: path.to_path_buf(),
            build_id: t.build_id,
            dynamic: t.dynamic,
            bounds: t.bounds,
            segments: t.segments,
            debug_file,
            owner: None,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            bytes,
            debug,
            functions: t.functions,
            owned_names: t.owned_names,
            bolt_ordinals: OnceLock::new(),
            read_since_release: AtomicU64::new(0),
            code: t.code,
            heap: 0,
            lines: lines::LineCache::default(),
        };
        b.heap = b.count_heap();
        Ok(b)
    }

    /// Heap bytes held: the function table, names held on the heap, segments, paths and
    /// (for [`Binary::parse`]) the file's bytes — what a cache counts. Mapped pages are
    /// not heap (module documentation).
    pub(crate) fn heap_bytes(&self) -> u64 {
        let ordinals = self.bolt_ordinals.get().map_or(0, |o| o.capacity() * 4) as u64;
        self.heap + self.lines.heap_bytes() + ordinals
    }

    fn count_heap(&self) -> u64 {
        let owned = match &self.bytes {
            Bytes::Mapped(_) => 0,
            Bytes::Owned(b) => b.len(),
        };
        let names: usize = self
            .owned_names
            .iter()
            .map(|n| n.len() + size_of::<Box<str>>())
            .sum();
        (size_of::<Binary>()
            + owned
            + names
            + self.functions.capacity() * size_of::<FnEntry>()
            + self.code.capacity() * size_of::<CodeRange>()
            + self.segments.capacity() * size_of::<LoadSegment>()
            + self.path.as_os_str().len()
            + self.debug_file.as_ref().map_or(0, |p| p.as_os_str().len())
            + self.build_id.as_ref().map_or(0, String::len)) as u64
    }

    /// Drops the mapping's pages from this process's resident set (they stay in the page
    /// cache; the next read faults them back in).
    fn release_pages(&self) {
        self.read_since_release.store(0, Ordering::Relaxed);
        release_maps(&self.bytes, self.debug.as_ref(), &self.path);
    }

    /// Counts `bytes` read through the mapping by naming or decoding a function (one
    /// without a descriptor for `pread`, [`Binary::copy_at`]); past
    /// [`READ_PER_RELEASE`] its pages leave the resident set ([`Self::release_pages`]).
    /// The symbolizer releases every binary's pages at the window's end, but a window
    /// that names and decodes thousands of functions of two compilers' libraries held
    /// 13-16 MiB of each at once (their `.strtab` and `.text`: BENCHMARKS.md, "Agent
    /// memory on a build host"). A slice read before a release reads the same bytes
    /// after it ([`crate::fsafe`]'s `GuardedMap::dont_need`).
    fn note_read(&self, bytes: u64) {
        let before = self
            .read_since_release
            .fetch_add(bytes.min(READ_PER_RELEASE), Ordering::Relaxed);
        if before.saturating_add(bytes) >= READ_PER_RELEASE {
            self.release_pages();
        }
    }

    /// The name BOLT gives `func` when its symbol is local (`static`): `name/N`, N
    /// counting the local symbols of that name in address order (BOLT's
    /// `NameResolver::uniquify`). `None` for a global or unknown symbol.
    pub fn bolt_local_name(&self, func: &Function) -> Option<String> {
        let i = self.function_index(func.start)?;
        // The symbol table and every local name were just read: their pages leave the
        // resident set now, not at the window's end (two 150-200 MB libraries in one
        // window held 29 and 31 MiB of pages until then: BENCHMARKS.md, "Agent memory
        // on a build host").
        let n = *self
            .bolt_ordinals
            .get_or_init(|| {
                let o = self.local_ordinals();
                self.release_pages();
                o
            })
            .get(i)?;
        let e = self.functions[i];
        (n > 0 && e.start == func.start && self.name_is(e, &func.name))
            .then(|| format!("{}/{n}", func.name))
    }

    /// Each function's BOLT ordinal ([`Binary::bolt_local_name`]), from the symbol
    /// table [`symtab_of`] chooses, as [`Tables::parse`] does.
    fn local_ordinals(&self) -> Vec<u32> {
        let Ok(file) = object::File::parse(self.data()) else {
            return Vec::new();
        };
        let debug = self.debug_data().and_then(|d| object::File::parse(d).ok());
        let Some(symtab) = symtab_of(&file, debug.as_ref()) else {
            return Vec::new();
        };
        let name = |e: FnEntry| -> &[u8] {
            match e.name {
                // No local is nameless: never a match.
                NAME_SYNTH => b"",
                n if n & NAME_OWNED != 0 => self.owned_names[(n & !NAME_OWNED) as usize].as_bytes(),
                off => self.mapped_name_in_place(off),
            }
        };
        let out = bolt_ordinals(&symtab, &self.functions, &name, &|| self.release_pages());
        if out.iter().all(|&n| n == 0) {
            return Vec::new();
        }
        out
    }

    /// The whole file, for readers of other sections ([`lines`](mod@lines)).
    fn data(&self) -> &[u8] {
        self.bytes.get()
    }

    /// The separate debug file's bytes, when one is used.
    fn debug_data(&self) -> Option<&[u8]> {
        self.debug.as_ref().map(|d| d.bytes())
    }

    /// Function bounds came from `.eh_frame` (no symbol table).
    pub fn stripped(&self) -> bool {
        self.bounds == BoundsSource::EhFrame
    }

    /// Number of functions.
    #[cfg(test)]
    pub(crate) fn function_count(&self) -> usize {
        self.functions.len()
    }

    /// Functions sorted by start address.
    pub fn functions(&self) -> impl ExactSizeIterator<Item = Function> + '_ {
        self.functions.iter().map(|&e| self.materialise(e))
    }

    /// Function `i` of [`Binary::functions`].
    pub fn function(&self, i: usize) -> Option<Function> {
        self.functions.get(i).map(|&e| self.materialise(e))
    }

    /// The function containing `vaddr`.
    pub fn function_at(&self, vaddr: u64) -> Option<Function> {
        self.function_index(vaddr).and_then(|i| self.function(i))
    }

    /// Index into [`Binary::functions`] of the function containing `vaddr`.
    pub(crate) fn function_index(&self, vaddr: u64) -> Option<usize> {
        let i = self.functions.partition_point(|f| f.start <= vaddr);
        let i = i.checked_sub(1)?;
        let f = self.functions[i];
        (vaddr - f.start < u64::from(f.size)).then_some(i)
    }

    /// The function containing `vaddr`, or where no function does but executable code
    /// lies, the hole between the functions around it (clipped to its segment), named
    /// after the file and the hole's address: `[prog]+0x4a1f0`. Code that neither a
    /// symbol nor an FDE covers (assembly without CFI, a binary stripped of both) is
    /// still code that ran: its samples are shown where they lie, not lost.
    pub fn function_or_hole(&self, vaddr: u64) -> Option<Function> {
        if let Some(f) = self.function_at(vaddr) {
            return Some(f);
        }
        let c = self
            .code
            .iter()
            .find(|c| (c.vaddr..c.vaddr + c.len as u64).contains(&vaddr))?;
        let i = self.functions.partition_point(|f| f.start <= vaddr);
        let after_prev = i.checked_sub(1).map_or(0, |p| {
            self.functions[p].start + u64::from(self.functions[p].size)
        });
        let start = after_prev.max(c.vaddr);
        let end = self
            .functions
            .get(i)
            .map_or(u64::MAX, |f| f.start)
            .min(c.vaddr + c.len as u64);
        let file = self.path.file_name().unwrap_or(self.path.as_os_str());
        Some(Function {
            name: format!("[{}]+{start:#x}", file.to_string_lossy()),
            start,
            size: end - start,
        })
    }

    /// The first function called `name` (reads every name: for tests and tools, not
    /// for lookups in a loop).
    pub fn function_by_name(&self, name: &str) -> Option<Function> {
        self.functions
            .iter()
            .find(|&&e| self.name_is(e, name))
            .map(|&e| self.materialise(e))
    }

    fn materialise(&self, e: FnEntry) -> Function {
        Function {
            name: self.name_of(e),
            start: e.start,
            size: u64::from(e.size),
        }
    }

    /// The name's bytes in the mapping, or the debug file's (up to its NUL).
    fn mapped_name_in_place(&self, off: u32) -> &[u8] {
        let own = self.bytes.get();
        let d = match (off as usize).checked_sub(own.len()) {
            None => &own[off as usize..],
            Some(o) => self
                .debug_data()
                .and_then(|d| d.get(o..))
                .unwrap_or_default(),
        };
        let d = &d[..d.len().min(MAX_MAPPED_NAME)];
        &d[..d.iter().position(|&b| b == 0).unwrap_or(d.len())]
    }

    /// The name's bytes in the file, or the debug file's (up to its NUL), copied.
    fn mapped_name(&self, off: u32) -> Vec<u8> {
        let mut b = self.copy_at(off as usize, NAME_READ);
        if b.len() == NAME_READ && !b.contains(&0) {
            b = self.copy_at(off as usize, MAX_MAPPED_NAME);
        }
        b.truncate(b.iter().position(|&x| x == 0).unwrap_or(b.len()));
        b
    }

    /// Up to `len` bytes at `off` of the file, or past its end of the debug file (as
    /// [`FnEntry::name`] counts offsets). A large mapped file is read with `pread`
    /// (`GuardedMap::read_at`: a read through the mapping keeps up to 2 MiB of it
    /// resident); a small one ([`map_file`]) through the mapping, counted
    /// ([`Binary::note_read`]).
    fn copy_at(&self, off: usize, len: usize) -> Vec<u8> {
        let own = self.bytes.get();
        let (map, at) = match (off.checked_sub(own.len()), &self.bytes) {
            (None, Bytes::Owned(_)) => return own[off..own.len().min(off + len)].to_vec(),
            (None, Bytes::Mapped(m)) => (m, off),
            (Some(o), _) => match &self.debug {
                Some(d) => (d, o),
                None => return Vec::new(),
            },
        };
        let mut buf = vec![0; len.min(map.bytes().len().saturating_sub(at))];
        match map.read_at(at, &mut buf) {
            Some(n) => buf.truncate(n),
            None => {
                let n = buf.len();
                buf.copy_from_slice(&map.bytes()[at..at + n]);
                self.note_read(n as u64 + PAGE);
            }
        }
        buf
    }

    fn name_of(&self, e: FnEntry) -> String {
        match e.name {
            NAME_SYNTH => format!("func_{:x}", e.start),
            n if n & NAME_OWNED != 0 => self.owned_names[(n & !NAME_OWNED) as usize].to_string(),
            off => owned_utf8(self.mapped_name(off)),
        }
    }

    fn name_is(&self, e: FnEntry, name: &str) -> bool {
        match e.name {
            NAME_SYNTH => name == format!("func_{:x}", e.start),
            n if n & NAME_OWNED != 0 => &*self.owned_names[(n & !NAME_OWNED) as usize] == name,
            off => self.mapped_name(off) == name.as_bytes(),
        }
    }

    /// Virtual address of a file offset (through the `PT_LOAD` that maps it).
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| (s.offset..s.offset + s.filesz).contains(&offset))
            .map(|s| offset - s.offset + s.vaddr)
    }

    /// File offset of a virtual address.
    #[cfg(test)]
    pub(crate) fn offset_of_vaddr(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| (s.vaddr..s.vaddr + s.filesz).contains(&vaddr))
            .map(|s| vaddr - s.vaddr + s.offset)
    }

    /// The code bytes of `[start, end)`, copied (`Binary::copy_at`), when they lie in
    /// one executable segment.
    pub fn code(&self, start: u64, end: u64) -> Option<Vec<u8>> {
        let (at, len) = self.code.iter().find_map(|c| {
            let lo = usize::try_from(start.checked_sub(c.vaddr)?).ok()?;
            let hi = usize::try_from(end.checked_sub(c.vaddr)?).ok()?;
            (lo <= hi && hi <= c.len).then_some((c.offset + lo, hi - lo))
        })?;
        let code = self.copy_at(at, len);
        // Short: the file was truncated under the mapping (`Binary::truncated`).
        (code.len() == len).then_some(code)
    }

    /// Disassembles `func` into basic blocks and its CFG. `extra_leaders` are addresses
    /// that must start a block (targets seen in branch records); ones that are not
    /// instruction boundaries of the function are ignored. Exact-count oracles use this
    /// with the block starts of a profile to compare block by block.
    pub fn cfg(&self, func: &Function, extra_leaders: &[u64]) -> Result<Cfg, BinaryError> {
        Ok(Cfg::from_instructions(
            func,
            self.decode(func)?.into(),
            extra_leaders,
        ))
    }

    /// `func`'s instructions (linear sweep), for `Cfg::from_instructions`.
    pub fn decode(&self, func: &Function) -> Result<Vec<Instruction>, BinaryError> {
        Ok(cfg::decode(func, &self.code_of(func)?))
    }

    /// `func`'s code bytes.
    fn code_of(&self, func: &Function) -> Result<Vec<u8>, BinaryError> {
        self.code(func.start, func.end())
            .ok_or_else(|| BinaryError::NoCode {
                path: self.path.clone(),
                function: func.name.clone(),
                vaddr: func.start,
                end: func.end(),
            })
    }
}

/// Binaries opened so far, keyed by the file's identity (device + inode, so the same
/// file reached through `/proc/PID/map_files/…` of many processes is parsed once) and
/// stamped with size + mtime so a replaced file is reopened. Failures are remembered
/// alike, bounded (`negative`).
#[derive(Default)]
pub struct BinaryCache {
    entries: HashMap<FileId, (FileStamp, Arc<Binary>)>,
    /// Why files could not be used, each with its stamp.
    failed: negative::Failures<FileId, (FileStamp, String)>,
    /// Where separate debug files are looked up.
    debug_root: DebugRoot,
}

/// (device, inode).
type FileId = (u64, u64);
type FileStamp = (u64, Option<SystemTime>);

impl BinaryCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache whose binaries take separate debug files from under `root`.
    pub(crate) fn with_debug_root(root: DebugRoot) -> Self {
        BinaryCache {
            debug_root: root,
            ..Self::default()
        }
    }

    /// The parsed binary at `path` (opened with cpi-user/src/fsafe/mod.rs), parsed on
    /// first use. A failure is remembered (and returned again) until the file changes or
    /// the bounded memory of failures lets it go, so a bad file is read about once.
    pub fn get(&mut self, path: &Path) -> Result<Arc<Binary>, BinaryError> {
        self.get_open(&crate::fsafe::open(path)?, path)
    }

    /// [`BinaryCache::get`] for a file already open (a captured mapping, or opened and
    /// identity-checked by the caller); `path` names it. Identified by `fstat`.
    pub(crate) fn get_open(
        &mut self,
        file: &std::fs::File,
        path: &Path,
    ) -> Result<Arc<Binary>, BinaryError> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata().map_err(|cause| BinaryError::Io {
            path: path.to_path_buf(),
            cause,
        })?;
        let stamp = (meta.len(), meta.modified().ok());
        let key = (meta.dev(), meta.ino());
        if let Some((s, b)) = self.entries.get(&key) {
            if *s == stamp {
                return Ok(Arc::clone(b));
            }
        }
        if let Some((s, reason)) = self.failed.get(&key) {
            if *s == stamp {
                return Err(BinaryError::Unusable {
                    path: path.to_path_buf(),
                    reason: reason.clone(),
                });
            }
        }
        self.entries.remove(&key);
        self.failed.remove(&key);
        work::symbols_parsed();
        log::debug!(
            "symbols: parsing {} (device {}, inode {})",
            crate::fsafe::escape(&path.to_string_lossy()),
            key.0,
            key.1
        );
        let r = Binary::from_file_with_debug(file, path, &self.debug_root).map(Arc::new);
        match &r {
            Ok(b) => {
                self.entries.insert(key, (stamp, Arc::clone(b)));
            }
            Err(e) => {
                let reason = e.to_string();
                let heap = reason.capacity();
                self.failed.insert(key, (stamp, reason), heap);
            }
        }
        r
    }

    /// Drops every cached entry holding `bin`.
    pub(crate) fn evict(&mut self, bin: &Arc<Binary>) {
        self.entries.retain(|_, (_, b)| !Arc::ptr_eq(b, bin));
    }

    /// The binaries held.
    pub fn binaries(&self) -> impl Iterator<Item = &Arc<Binary>> {
        self.entries.values().map(|(_, b)| b)
    }

    /// Heap bytes of the remembered failures.
    pub(crate) fn failure_bytes(&self) -> u64 {
        self.failed.bytes()
    }

    /// Forgets the oldest remembered failure (when the symbolizer's bound asks); its
    /// bytes, or `None` if none is left.
    pub(crate) fn forget_oldest_failure(&mut self) -> Option<u64> {
        self.failed.pop_oldest()
    }
}

#[cfg(test)]
pub(crate) mod testbin;

#[cfg(test)]
mod tests {
    use super::*;
    use testbin::{Scratch, TestProgram};

    /// Resident bytes of this process's mappings of `path` (`/proc/self/smaps`).
    fn resident_of(path: &Path) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut ours = false;
        let mut kib = 0;
        for l in smaps.lines() {
            let range = l.split(' ').next().unwrap_or_default();
            if range.contains('-') && range.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()) {
                ours = l.ends_with(&*path.to_string_lossy());
            } else if let Some(v) = l.strip_prefix("Rss:").filter(|_| ours) {
                kib += v.trim().trim_end_matches(" kB").parse::<u64>().unwrap();
            }
        }
        kib * 1024
    }

    /// Naming and decoding functions reads the file with `pread`: none of the mapping
    /// becomes resident. Where the mapping has no descriptor (it could not be
    /// duplicated) they read the mapping and release its pages every
    /// [`READ_PER_RELEASE`] bytes, not only at the window's end: after that many bytes of
    /// decoding one function, the page its name was read from is no longer resident.
    /// This test's own executable (tens of MB: its `.strtab` lies far from `.text`).
    #[test]
    fn names_and_code_are_read_without_keeping_the_mapping_resident() {
        let exe = std::env::current_exe().unwrap();
        let copy = Scratch::copy(&exe, "release-reads", 0);
        let read = Binary::open(&copy.path).unwrap();
        let i = (0..read.functions.len())
            .find(|&i| read.functions[i].size >= 64 && read.functions[i].name != NAME_SYNTH)
            .unwrap();
        let f = read.function(i).unwrap();
        read.decode(&f).unwrap();
        assert_eq!(resident_of(&copy.path), 0, "read with pread");
        drop(read);

        let file = std::fs::File::open(&copy.path).unwrap();
        let map = Bytes::Mapped(crate::fsafe::map::GuardedMap::new(&file).unwrap());
        let bin = Binary::with_bytes(&copy.path, map, None).unwrap();
        bin.release_pages();
        assert_eq!(resident_of(&copy.path), 0, "released");
        assert_eq!(bin.function(i).unwrap(), f);
        assert_eq!(bin.decode(&f).unwrap(), read_decoded(&copy.path, &f));
        let named_and_decoded = resident_of(&copy.path);
        assert!(named_and_decoded > 0);
        for _ in 0..READ_PER_RELEASE / PAGE {
            bin.decode(&f).unwrap();
        }
        let decoded = resident_of(&copy.path);
        assert!(
            decoded < named_and_decoded,
            "{decoded} bytes resident after decoding {} MiB, {named_and_decoded} before",
            READ_PER_RELEASE >> 20
        );
    }

    /// `f` decoded from `path` opened again (read with `pread`).
    fn read_decoded(path: &Path, f: &Function) -> Vec<Instruction> {
        Binary::open(path).unwrap().decode(f).unwrap()
    }

    /// Parsing releases the symbol table's pages as it walks it, not only at its end:
    /// at each release after the first, less is resident than the most resident at the
    /// same points of a parse that releases nothing. This test's own executable (about
    /// 20 000 symbols, 20 or more releases). On this project's ext4 the resident set
    /// grows in 2 MiB steps, so the test compares rather than bounds.
    #[test]
    fn the_symbol_table_is_released_as_it_is_parsed() {
        let exe = std::env::current_exe().unwrap();
        let copy = Scratch::copy(&exe, "release-parse", 0);
        let file = std::fs::File::open(&copy.path).unwrap();
        let map = crate::fsafe::map::GuardedMap::new(&file).unwrap();
        // (most resident at the calls after the first, calls) of one parse.
        let parse = |release: bool| {
            map.dont_need().unwrap();
            let (most, calls) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
            let hook = || {
                if calls.get() > 0 {
                    most.set(most.get().max(resident_of(&copy.path)));
                }
                calls.set(calls.get() + 1);
                if release {
                    map.dont_need().unwrap();
                }
            };
            Tables::parse(&copy.path, map.bytes(), None, &hook).unwrap();
            (most.get(), calls.get())
        };
        let (kept, calls) = parse(false);
        let (released, _) = parse(true);
        assert!(calls >= 10, "{calls} calls");
        assert!(
            released < kept,
            "at most {released} bytes resident with releases, {kept} without"
        );
    }

    /// A symbol without a size (crtstuff's `frame_dummy`) is a function up to the next
    /// symbol, as perf sizes it: its end is the next text symbol `nm -n` lists.
    #[test]
    fn unsized_symbols_run_to_the_next_symbol() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let bin = Binary::open(&t.plain).unwrap();
        let out = std::process::Command::new("nm")
            .args(["-n", "-S", "--defined-only"])
            .arg(&t.plain)
            .output()
            .unwrap();
        // (address, has a size, type, name) of each symbol, in address order.
        let listed = String::from_utf8(out.stdout).unwrap();
        let syms: Vec<(u64, bool, &str, &str)> = (listed.lines())
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let addr = u64::from_str_radix(f[0], 16).ok()?;
                match f[..] {
                    [_, _, kind, name] => Some((addr, true, kind, name)),
                    [_, kind, name] => Some((addr, false, kind, name)),
                    _ => None,
                }
            })
            .collect();
        let text = |k: &str| k.eq_ignore_ascii_case("t");
        let i = (syms.iter())
            .position(|s| s.3 == "frame_dummy")
            .expect("gcc's crtstuff");
        assert!(!syms[i].1, "frame_dummy has no size: {:?}", syms[i]);
        let next = (syms[i + 1..].iter())
            .find(|s| text(s.2) && s.0 > syms[i].0)
            .expect("a symbol after frame_dummy");
        let f = bin
            .function_at(syms[i].0 + 1)
            .expect("frame_dummy is a function");
        assert_eq!((f.name.as_str(), f.start), ("frame_dummy", syms[i].0));
        assert_eq!(f.start + f.size, next.0, "ends where {} starts", next.3);
    }

    #[test]
    fn not_elf_and_truncated_elf_are_errors() {
        let e = Binary::parse(Path::new("x"), b"hello").unwrap_err();
        assert!(matches!(e, BinaryError::NotElf { .. }), "{e}");
        let e = Binary::parse(Path::new("x"), b"\x7fELF\x02\x01\x01").unwrap_err();
        assert!(matches!(e, BinaryError::NotElf { .. }), "{e}");
        let e = Binary::open(Path::new("/nonexistent/bin")).unwrap_err();
        assert!(matches!(e, BinaryError::Open(_)), "{e}");
    }

    /// Failures are remembered until the memory of them is full, then the oldest leave
    /// (read again, they fail anew rather than as remembered).
    #[test]
    fn failures_are_remembered_oldest_out_first() {
        let dir = std::env::temp_dir().join(format!("cpi-failures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths: Vec<PathBuf> = (0..negative::MAX_FAILURES + 10)
            .map(|i| dir.join(format!("script{i}")))
            .collect();
        let mut c = BinaryCache::new();
        for p in &paths {
            std::fs::write(p, "#!/bin/sh\n").unwrap();
            let e = c.get(p).unwrap_err();
            assert!(matches!(e, BinaryError::NotElf { .. }), "{e}");
        }
        let e = c.get(paths.last().unwrap()).unwrap_err();
        assert!(matches!(e, BinaryError::Unusable { .. }), "remembered: {e}");
        let e = c.get(&paths[0]).unwrap_err();
        assert!(matches!(e, BinaryError::NotElf { .. }), "forgotten: {e}");
        assert!(c.failure_bytes() > 0 && c.failure_bytes() <= negative::MAX_FAILURE_BYTES);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_truncation_of_a_real_binary_is_handled() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let data = std::fs::read(&t.plain).unwrap();
        // Cut at many points: must return Ok or Err, never panic.
        for cut in (0..data.len()).step_by(97) {
            let _ = Binary::parse(Path::new("cut"), &data[..cut]);
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let data = std::fs::read(&t.stripped).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut parsed, mut decoded) = (0, 0);
        for _ in 0..300 {
            let mut d = data.clone();
            // A few random bytes anywhere (headers, .eh_frame, code, section table).
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..d.len());
                d[i] = rng.gen();
            }
            if let Ok(b) = Binary::parse(Path::new("corrupt"), &d) {
                parsed += 1;
                for f in b.functions() {
                    if b.cfg(&f, &[f.start + 1]).is_ok() {
                        decoded += 1;
                    }
                }
            }
        }
        assert!(
            parsed > 0 && decoded > 0,
            "{parsed} parsed, {decoded} decoded"
        );
    }

    #[test]
    fn symbols_build_id_and_offsets() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let b = Binary::open(&t.plain).unwrap();
        assert_eq!(b.bounds, BoundsSource::SymbolTable);
        let id = b.build_id.as_deref().expect("gcc links with a build-id");
        assert!(id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()));
        let f = b.function_by_name("sum_loop").expect("sum_loop");
        assert_eq!(b.function_at(f.start + 1).unwrap().name, "sum_loop");
        assert!(b.function_at(f.end()).is_none_or(|g| g.name != "sum_loop"));
        let off = b.offset_of_vaddr(f.start).unwrap();
        assert_eq!(b.vaddr_of_offset(off), Some(f.start));
        // nm agrees on the address.
        assert_eq!(t.nm("sum_loop"), Some(f.start));
    }

    #[test]
    fn stripped_bounds_match_the_symbol_table() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        for (plain, stripped) in [(&t.plain, &t.stripped), (&t.pie, &t.pie_stripped)] {
            let full = Binary::open(plain).unwrap();
            let s = Binary::open(stripped).unwrap();
            assert!(s.stripped() && !full.stripped());
            assert_eq!(s.build_id, full.build_id, "strip keeps the build-id");
            for name in ["sum_loop", "classify", "fib", "main"] {
                let f = full.function_by_name(name).unwrap();
                let g = s.function_at(f.start).unwrap();
                assert_eq!(
                    (g.start, g.size),
                    (f.start, f.size),
                    "{name} in {stripped:?}"
                );
                assert_eq!(g.name, format!("func_{:x}", f.start));
            }
            // The PLT is one pseudo-function, named, not func_<addr>.
            let plt = full
                .functions()
                .find(|f| f.name.starts_with("[.plt"))
                .unwrap();
            assert_eq!(s.function_at(plt.start).unwrap().name, plt.name);
            // An exported function keeps its .dynsym name.
            let e = full.function_by_name("exported_entry").unwrap();
            assert_eq!(s.function_at(e.start).unwrap().name, "exported_entry");
        }
    }

    /// The first function whose name lies in the mapping, and the name's file offset.
    fn mapped_name_at(bin: &Binary) -> (usize, u64) {
        bin.functions
            .iter()
            .enumerate()
            .find_map(|(i, e)| (e.name & NAME_OWNED == 0).then_some((i, u64::from(e.name))))
            .expect("a name in the mapping")
    }

    /// A user rewriting, in place, a binary the agent has mapped: names read after
    /// that stay bounded (before the cut, every name ran to the end of the file).
    #[test]
    fn names_rewritten_in_place_stay_bounded() {
        use std::os::unix::fs::FileExt;
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        // Room past the names for a run-on name longer than the cut.
        let s = Scratch::copy(&t.plain, "rewrite", 4 * MAX_MAPPED_NAME);
        let bin = Binary::open(&s.path).unwrap();
        let (i, off) = mapped_name_at(&bin);
        let honest = bin.function(i).unwrap().name;
        let len = std::fs::metadata(&s.path).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&s.path)
            .unwrap();
        f.write_all_at(&vec![b'A'; (len - off) as usize], off)
            .unwrap();
        let rewritten = bin.function(i).unwrap().name;
        assert!(rewritten.starts_with(&"A".repeat(honest.len())), "{honest}");
        assert_eq!(rewritten.len(), MAX_MAPPED_NAME);
        assert!(!bin.truncated());
    }

    /// A name rewritten while it is read is still UTF-8 ([`Scratch::flipping`]).
    #[test]
    fn names_rewritten_while_read_are_utf8() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let s = Scratch::copy(&t.plain, "utf8", 0);
        let bin = Binary::open(&s.path).unwrap();
        let (i, off) = mapped_name_at(&bin);
        let invalid = s.flipping(&[off], || {
            (0..2_000_000)
                .map(|_| bin.function(i).unwrap().name)
                .filter(|n| std::str::from_utf8(n.as_bytes()).is_err())
                .count()
        });
        assert_eq!(invalid, 0, "names that are not UTF-8");
    }

    /// Each function's BOLT ordinal against a direct count: the locals of its name at or
    /// below its start, when one of them starts there. This test's own executable, and
    /// `CPI_BIG_LIBRARY` when set (`--ignored`, with the benchmark below).
    #[test]
    fn bolt_ordinals_equal_a_direct_count() {
        let exe = std::env::current_exe().unwrap();
        let (named, repeated) = bolt_ordinals_against_a_count(&exe);
        assert!(
            named > 100 && repeated > 0,
            "{named} named, {repeated} past /1"
        );
    }

    /// (functions with a BOLT name, of them past `/1`) of `path`, after checking every
    /// function's against a direct count.
    fn bolt_ordinals_against_a_count(path: &Path) -> (usize, usize) {
        use object::{Object, ObjectSymbol};
        let data = std::fs::read(path).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let mut locals: HashMap<&[u8], Vec<u64>> = HashMap::new();
        for s in elf.symbols() {
            let named = s.name_bytes().ok().filter(|n| !n.is_empty());
            let kind = matches!(
                s.kind(),
                object::SymbolKind::Text | object::SymbolKind::Data
            );
            if let (Some(n), true, true) = (named, s.is_local(), kind) {
                locals.entry(n).or_default().push(s.address());
            }
        }
        let bin = Binary::open(path).unwrap();
        let (mut named, mut repeated) = (0, 0);
        for i in 0..bin.functions.len() {
            let f = bin.function(i).unwrap();
            let addrs = locals.get(f.name.as_bytes()).map_or(&[][..], Vec::as_slice);
            let count = addrs.iter().filter(|&&a| a <= f.start).count();
            let expected = addrs
                .contains(&f.start)
                .then(|| format!("{}/{count}", f.name));
            assert_eq!(bin.bolt_local_name(&f), expected, "{}", f.name);
            named += usize::from(expected.is_some());
            repeated += usize::from(count > 1 && expected.is_some());
        }
        (named, repeated)
    }

    /// What naming and decoding functions of a large library (as the agent's window
    /// does: its name, BOLT name and, for one in ten, its code) adds to this process's
    /// resident file pages at the most, and how long it takes (BENCHMARKS.md, "Agent
    /// memory on a build host"). `CPI_BIG_LIBRARY=PATH`, run alone:
    /// `cargo test --release -p cpi-user -- --ignored --nocapture bench_resident_naming`.
    #[test]
    #[ignore = "benchmark: needs CPI_BIG_LIBRARY, run by hand"]
    fn bench_resident_naming_a_large_library() {
        let path = PathBuf::from(std::env::var_os("CPI_BIG_LIBRARY").expect("CPI_BIG_LIBRARY"));
        let status = |key: &str| {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            let v = s.lines().find_map(|l| l.strip_prefix(key)).unwrap();
            v.trim().trim_end_matches(" kB").parse::<u64>().unwrap() << 10
        };
        let rss_file = || status("RssFile:");
        let (named, repeated) = bolt_ordinals_against_a_count(&path);
        eprintln!("BOLT names equal a direct count: {named}, {repeated} past /1");
        let bin = Binary::open(&path).unwrap();
        let n = bin.functions.len();
        // "5" resets the peak resident set (proc(5), /proc/pid/clear_refs).
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let (base, mut most, rss) = (rss_file(), 0, status("VmRSS:"));
        let t = std::time::Instant::now();
        // A fixed pseudo-random order (an LCG): the window's functions, spread over the file.
        let mut x: u64 = 1;
        for k in 0..4000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let f = bin.function((x >> 33) as usize % n).unwrap();
            std::hint::black_box(bin.bolt_local_name(&f));
            if k % 10 == 0 {
                std::hint::black_box(bin.decode(&f).ok());
            }
            if k % 20 == 0 {
                most = most.max(rss_file().saturating_sub(base));
            }
        }
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        eprintln!(
            "{}: {n} functions; 4000 named, 400 decoded in {:.1} ms; resident file pages \
             at most +{:.1} MiB; VmHWM +{:.1} MiB",
            path.display(),
            t.elapsed().as_secs_f64() * 1e3,
            mib(most),
            mib(status("VmHWM:").saturating_sub(rss))
        );
    }

    #[test]
    fn cache_reuses_and_reopens_on_change() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("cpi-bincache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bin");
        std::fs::copy(&t.plain, &p).unwrap();
        let mut c = BinaryCache::new();
        let a = c.get(&p).unwrap();
        assert!(Arc::ptr_eq(&a, &c.get(&p).unwrap()));
        std::fs::copy(&t.stripped, &p).unwrap();
        let b = c.get(&p).unwrap();
        assert!(b.stripped(), "a replaced file is reopened");
        std::fs::write(&p, b"junk").unwrap();
        assert!(c.get(&p).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod debian_tests {
    use super::tables::{collect_symbols, Cand};
    use super::*;
    use object::{Object, ObjectSection};

    /// Debian's stripped libraries: every exported function's FDE bounds (what a
    /// stripped binary gives us) equal its `.dynsym` bounds, and the code decodes.
    #[test]
    fn stripped_debian_library_bounds_match_dynsym() {
        let mut seen = 0;
        for p in [
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0",
            "/usr/bin/bzip2",
        ] {
            let path = Path::new(p);
            if !path.exists() {
                crate::binary::testbin::skip(format_args!("{p} not installed"));
                continue;
            }
            seen += 1;
            let data = std::fs::read(path).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let b = Binary::open(path).unwrap();
            assert!(b.stripped(), "{p}");
            let fdes = {
                let s = file.section_by_name(".eh_frame").unwrap();
                ehframe::fde_ranges(s.data().unwrap(), s.address()).unwrap()
            };
            let fde: HashMap<u64, u64> = fdes.iter().copied().collect();
            let dyn_funcs = collect_symbols(&file.dynamic_symbol_table().unwrap(), &|| {});
            let sized: Vec<&Cand> = dyn_funcs.iter().filter(|f| f.size > 0).collect();
            let same = sized
                .iter()
                .filter(|f| fde.get(&f.start) == Some(&f.size))
                .count();
            eprintln!(
                "{p}: {} functions, {} FDEs, {}/{} exported functions with equal FDE bounds",
                b.functions().len(),
                fdes.len(),
                same,
                sized.len()
            );
            assert!(
                same * 100 >= sized.len() * 98,
                "{p}: {same}/{}",
                sized.len()
            );
            for f in sized.iter().take(200) {
                let g = b.function_at(f.start).unwrap();
                assert_eq!(Some(g.name.as_str()), f.name.as_deref());
                let cfg = b.cfg(&g, &[]).unwrap();
                assert!(
                    cfg.instructions.iter().all(|i| i.text != "(bad)"),
                    "{:?}",
                    f.name
                );
            }
        }
        if seen == 0 {
            crate::binary::testbin::skip(format_args!("no Debian library to check"));
        }
    }

    /// Big shared libraries (LLVM: 100+ MB, hundreds of thousands of functions) are
    /// mapped, not read: the heap holds a compact table whatever the file's size, and
    /// names read back from the mapping agree with an independent reader (`nm -D`).
    #[test]
    fn big_libraries_keep_a_compact_table_with_right_names() {
        let mut libs: Vec<PathBuf> =
            vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1")];
        // A Rust toolchain's own libLLVM has a full .symtab (the other bounds source).
        if let Ok(out) = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
        {
            let lib = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("lib");
            if let Ok(dir) = std::fs::read_dir(lib) {
                libs.extend(dir.flatten().map(|e| e.path()).filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("libLLVM.so"))
                }));
            }
        }
        let mut seen = 0;
        for path in libs.iter().filter(|p| p.exists()) {
            seen += 1;
            let b = Binary::open(path).unwrap();
            let size = std::fs::metadata(path).unwrap().len();
            let n = b.function_count();
            eprintln!(
                "{}: {} MB, {:?}, {n} functions, {} KB heap",
                path.display(),
                size >> 20,
                b.bounds,
                b.heap_bytes() >> 10
            );
            assert!(n > 50_000, "{n} functions");
            // 16 B per function, 4 B of BOLT ordinal, fixed overhead.
            assert!(
                b.heap_bytes() <= 20 * n as u64 + (1 << 20),
                "{}",
                b.heap_bytes()
            );
            assert!(b.heap_bytes() < size / 20);
            let nm = std::process::Command::new("nm")
                .args(["-D", "--defined-only"])
                .arg(path)
                .output();
            let Ok(nm) = nm else {
                crate::binary::testbin::skip(format_args!("the name check: nm unavailable"));
                continue;
            };
            let text = String::from_utf8_lossy(&nm.stdout);
            let mut by_addr: HashMap<u64, Vec<&str>> = HashMap::new();
            for l in text.lines() {
                let mut f = l.split_whitespace();
                if let (Some(a), Some("T" | "t"), Some(name)) = (f.next(), f.next(), f.next()) {
                    if let Ok(a) = u64::from_str_radix(a, 16) {
                        // Versioned names print as name@VERSION or name@@VERSION.
                        let name = name.split('@').next().unwrap_or(name);
                        by_addr.entry(a).or_default().push(name);
                    }
                }
            }
            let mut checked = 0;
            // Thread-local symbols can print as `T` too (the Rust toolchain's libLLVM:
            // `_ZSt11__once_call` at 0x18): their value is an offset in the TLS block,
            // not code. No code lives in the first page (the ELF headers).
            let code = by_addr.iter().filter(|(&a, v)| v.len() == 1 && a >= 0x1000);
            for (&addr, names) in code.take(500) {
                let f = b.function_at(addr).expect("an exported function");
                assert_eq!((f.start, f.name.as_str()), (addr, names[0]));
                if checked < 3 {
                    // A scan of every name: a few are enough.
                    assert_eq!(b.function_by_name(&f.name).map(|g| g.start), Some(addr));
                }
                checked += 1;
            }
            assert!(checked > 100, "{checked} names checked");
        }
        if seen == 0 {
            crate::binary::testbin::skip(format_args!("no LLVM library installed"));
        }
    }
}
