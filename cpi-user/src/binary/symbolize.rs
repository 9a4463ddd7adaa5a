//! Runtime address → (code object, address in its own space, function), through a
//! process's mappings.
//!
//! Kernel addresses are `[kernel]`; anonymous executable memory is `[anon]` (JIT), named
//! per function from `/tmp/perf-PID.map` when the runtime writes one (read under a budget,
//! cpi-user/src/binary/perfmap.rs); `[vdso]` and other
//! special mappings are named after the mapping. Files are opened through
//! `/proc/PID/map_files/` (which still works when the file was deleted or replaced) and
//! `/proc/PID/root/` (containers) when the process is live and
//! [`SymbolizerOptions::use_proc`] is set, else by the mapped path.
//!
//! The symbolizer is the cache that outlives analyses (the always-on agent keeps one for
//! its lifetime): binaries and perf maps by file identity (hard links of one perf map are
//! held once), and decoded functions ([`Symbolizer::decode`]), all in one LRU bounded in
//! bytes by [`Symbolizer::trim`]; files found unusable are remembered in a smaller bounded
//! memory (cpi-user/src/binary/negative.rs), counted in the same bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cfg::Sweep;
use super::demangle::{demangle, may_be_mangled};
use super::kallsyms::{Kallsyms, KernelSymbols};
use super::negative::Failures;
use super::perfmap::{Cut, PerfMap, MAX_PERF_MAP_BYTES, MAX_PERF_MAP_ENTRIES};
use super::{Binary, BinaryCache, BinaryError, Function, Instruction};
use crate::fsafe::budget;
use crate::procmap::{CapturedFile, MappedObject, Mapping, ProcessMaps};

/// Unusable files named in the log, at most.
const MAX_NAMED: usize = 1000;

/// Unusable files named in the one-line summary ([`Symbolizer::log_unusable`]).
const SUMMARY_NAMES: usize = 3;

/// Lowest x86-64 kernel address (canonical upper half).
pub(crate) const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// Why an address could not be symbolised.
#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    /// No mapping (and no perf map entry) holds the address.
    #[error("pid {pid}: {addr:#x} is in no mapping")]
    Unmapped {
        /// The process.
        pid: u32,
        /// The runtime address.
        addr: u64,
    },
    /// The mapped binary could not be used.
    #[error("pid {pid}: {addr:#x}")]
    Binary {
        /// The process.
        pid: u32,
        /// Start of the mapping.
        addr: u64,
        /// Why.
        source: Arc<BinaryError>,
    },
    /// The mapping's file offset is in no `PT_LOAD` of the binary.
    #[error("{path}: file offset {offset:#x} (runtime {addr:#x}) is in no PT_LOAD segment")]
    OutsideSegments {
        /// The mapped file.
        path: PathBuf,
        /// The file offset.
        offset: u64,
        /// The runtime address.
        addr: u64,
    },
    /// No function of the binary holds the address.
    #[error("{path}: no function contains {vaddr:#x}")]
    NoFunction {
        /// The mapped file.
        path: PathBuf,
        /// The address in the binary.
        vaddr: u64,
    },
}

/// Where the symbolizer looks.
#[derive(Clone, Debug)]
pub struct SymbolizerOptions {
    /// Open files through `/proc/PID/map_files` and `/proc/PID/root` (live processes).
    /// Off for recorded maps of processes that no longer exist (the PMU model).
    pub use_proc: bool,
    /// Directory holding `perf-PID.map` files.
    pub perf_map_dir: PathBuf,
    /// Kernel symbols (`/proc/kallsyms`) to name `[kernel]` functions; `None`, an
    /// unreadable file or hidden addresses (kptr_restrict) leave them `[kernel]`.
    pub kallsyms: Option<Kallsyms>,
    /// Where separate debug files of stripped binaries are looked up
    /// (cpi-user/src/binary/debugfile.rs).
    pub debug_root: super::DebugRoot,
    /// Files the caller has already said are unusable (an import's binaries not found
    /// here): their samples are still unmapped, but they are not named again.
    pub said: Vec<PathBuf>,
}

impl Default for SymbolizerOptions {
    fn default() -> Self {
        SymbolizerOptions {
            use_proc: true,
            perf_map_dir: PathBuf::from("/tmp"),
            kallsyms: Some(Kallsyms::new("/proc/kallsyms")),
            debug_root: super::DebugRoot::default(),
            said: Vec::new(),
        }
    }
}

/// What an address lies in.
#[derive(Clone, Debug)]
pub enum CodeObject {
    /// An ELF file.
    Elf(Arc<Binary>),
    /// The kernel.
    Kernel,
    /// Anonymous executable memory (JIT).
    Anon,
    /// `[vdso]` and other special mappings, by name.
    Special(String),
}

/// A symbolised address.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// What the address lies in.
    pub object: CodeObject,
    /// Path as mapped, or `[kernel]`, `[anon]`, `[vdso]`.
    pub object_name: String,
    /// The mapped file was deleted (or replaced) since it was mapped.
    pub deleted: bool,
    /// Address in the object's own space: ELF virtual address; the runtime address for
    /// non-file objects.
    pub vaddr: u64,
    /// The function; for non-ELF objects without a perf map, a pseudo-function named
    /// after the object covering the whole mapping.
    pub function: Function,
    /// Index into [`Binary::functions`] for ELF objects.
    pub function_index: Option<usize>,
}

/// Symbolises addresses of many processes, caching binaries, decoded functions and perf
/// maps.
pub struct Symbolizer {
    opts: SymbolizerOptions,
    binaries: BinaryCache,
    /// (pid, mapping start) → opened binary.
    by_mapping: HashMap<(u32, u64), Arc<Binary>>,
    /// (pid, mapping start) → why its binary could not be used.
    failed_mappings: Failures<(u32, u64), Arc<BinaryError>>,
    /// pid → its perf map's file, `None` where it has none (or none it may use).
    perf_maps: HashMap<u32, Option<PerfMapKey>>,
    /// Perf maps read, by file.
    perf_files: HashMap<PerfMapKey, PerfFile>,
    /// Perf maps (device, inode) already said to be cut.
    perf_cut_said: std::collections::HashSet<(u64, u64)>,
    /// (pid, mapping start) → the file opened while the process lived.
    captured: HashMap<(u32, u64), Arc<CapturedFile>>,
    /// Files already found unusable ([`Symbolizer::warn_once`]).
    warned: std::collections::HashSet<PathBuf>,
    /// Those not yet said, each with its full message ([`Symbolizer::log_unusable`]).
    unsaid: Vec<(PathBuf, String)>,
    /// Processes found gone (no `/proc/PID`): their `/proc` paths are not tried again.
    gone: std::collections::HashSet<u32>,
    /// Last use of each binary (by [`Binary::id`]), for [`Symbolizer::trim`].
    used: HashMap<u64, u64>,
    /// Decoded functions and demangled names by (binary id, start, size, form).
    decoded: HashMap<DecodedKey, Decoded>,
    /// Bytes of `decoded`.
    decoded_bytes: u64,
    clock: u64,
}

/// (binary id, function start, function size, what is kept of it).
type DecodedKey = (u64, u64, u64, Form);

/// A perf map file: device, inode, size and mtime (a grown file is read again).
type PerfMapKey = (u64, u64, u64, Option<std::time::SystemTime>);

/// A perf map in the cache.
struct PerfFile {
    map: PerfMap,
    /// Clock of its last use.
    used: u64,
}

/// What a cache entry keeps of a function (keys the kinds apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Form {
    Instructions,
    Sweep,
    Name,
    /// The instruction holding this address ([`Symbolizer::instructions_holding`]).
    Holding(u64),
}

/// What is kept of a decoded function.
#[derive(Clone)]
enum Decoding {
    /// Every instruction, formatted ([`Symbolizer::decode`]).
    Instructions(Arc<[Instruction]>),
    /// Where each instruction starts ([`Sweep`]).
    Sweep(Arc<Sweep>),
    /// The demangled name ([`Symbolizer::display_name`]).
    Name(Arc<str>),
    /// One instruction, formatted, or none ([`Symbolizer::instructions_holding`]).
    Holding(Option<Arc<Instruction>>),
}

/// A decoded function in the cache.
struct Decoded {
    value: Decoding,
    /// Heap bytes: the instructions (and their text) or sweep, and the entry.
    bytes: u64,
    /// Clock of its last use.
    used: u64,
}

/// Heap bytes of a cache entry besides its contents (key, entry, `Arc` counts).
const ENTRY_BYTES: usize = size_of::<DecodedKey>() + size_of::<Decoded>() + 2 * size_of::<usize>();

/// The instruction of `func`'s linear sweep (over `code`) that holds `addr`, decoded and
/// formatted.
fn holding(func: &Function, code: &[u8], sweep: &Sweep, addr: u64) -> Option<Instruction> {
    let off = u32::try_from(addr.checked_sub(func.start)?).ok()?;
    let at = sweep.holding(off)? as usize;
    Some(super::cfg::decode_one(func.start + at as u64, &code[at..]))
}

/// What [`Symbolizer::trim`] can drop.
enum Held {
    Binary(Arc<Binary>),
    Decoded(DecodedKey),
    PerfMap(PerfMapKey),
}

/// Nothing found unusable goes unsaid, whoever owned the symbolizer.
impl Drop for Symbolizer {
    fn drop(&mut self) {
        self.log_unusable();
    }
}

impl Symbolizer {
    /// An empty symbolizer.
    pub fn new(opts: SymbolizerOptions) -> Self {
        let warned = opts.said.iter().cloned().collect();
        Symbolizer {
            binaries: BinaryCache::with_debug_root(opts.debug_root.clone()),
            opts,
            by_mapping: HashMap::new(),
            failed_mappings: Failures::default(),
            perf_maps: HashMap::new(),
            perf_files: HashMap::new(),
            perf_cut_said: std::collections::HashSet::new(),
            captured: HashMap::new(),
            gone: std::collections::HashSet::new(),
            warned,
            unsaid: Vec::new(),
            used: HashMap::new(),
            decoded: HashMap::new(),
            decoded_bytes: 0,
            clock: 0,
        }
    }

    /// `func`'s instructions (of `bin`, which [`Symbolizer::resolve`] returned), decoded
    /// on first use and then kept until [`Symbolizer::trim`] drops them: analyses of later
    /// windows that sample the same function do not decode it again.
    pub fn decode(
        &mut self,
        bin: &Arc<Binary>,
        func: &Function,
    ) -> Result<Arc<[Instruction]>, BinaryError> {
        let d = self.cached((bin.id, func.start, func.size, Form::Instructions), || {
            let instructions: Arc<[Instruction]> = bin.decode(func)?.into();
            let bytes = instructions
                .iter()
                .map(|i| size_of::<Instruction>() + i.text.capacity())
                .sum();
            Ok((Decoding::Instructions(instructions), bytes))
        })?;
        let Decoding::Instructions(i) = d else {
            unreachable!("keyed apart")
        };
        Ok(i)
    }

    /// For each of `addrs`, the instruction of `func`'s linear sweep (the one
    /// [`Symbolizer::decode`] gives) that holds it, decoded and formatted alone; `None`
    /// where none does. It costs what the addresses do: the sweep's instruction lengths
    /// (4 bytes per instruction) and each address's instruction are cached, not the
    /// function's other instructions, so an address sampled again in a later window of
    /// the agent costs a lookup. Time profiles use it for their sampled instructions
    /// (cpi-user/src/profile/analyze.rs).
    pub(crate) fn instructions_holding(
        &mut self,
        bin: &Arc<Binary>,
        func: &Function,
        addrs: &[u64],
    ) -> Result<Vec<Option<Instruction>>, BinaryError> {
        // The function's bytes and sweep only on a miss: reading them faults the
        // binary's pages in again after each trim.
        let mut sweep: Option<(Arc<[u8]>, Arc<Sweep>)> = None;
        let mut found = Vec::with_capacity(addrs.len());
        for &a in addrs {
            let key = (bin.id, func.start, func.size, Form::Holding(a));
            let ins = match self.hit(key) {
                Some(Decoding::Holding(ins)) => ins,
                Some(_) => unreachable!("keyed apart"),
                None => {
                    let (code, swept) = match &sweep {
                        Some(s) => s.clone(),
                        None => sweep.insert(self.sweep(bin, func)?).clone(),
                    };
                    let ins = holding(func, &code, &swept, a).map(Arc::new);
                    let bytes = ins
                        .as_ref()
                        .map_or(0, |i| size_of::<Instruction>() + i.text.capacity());
                    self.keep(key, Decoding::Holding(ins.clone()), bytes);
                    ins
                }
            };
            found.push(ins.map(|i| Instruction::clone(&i)));
        }
        Ok(found)
    }

    /// `func`'s code and its linear sweep's instructions (cached).
    fn sweep(
        &mut self,
        bin: &Arc<Binary>,
        func: &Function,
    ) -> Result<(Arc<[u8]>, Arc<Sweep>), BinaryError> {
        let code: Arc<[u8]> = bin.code_of(func)?.into();
        let d = self.cached((bin.id, func.start, func.size, Form::Sweep), || {
            let sweep = Sweep::of(&code);
            let bytes = sweep.bytes();
            Ok((Decoding::Sweep(Arc::new(sweep)), bytes))
        })?;
        let Decoding::Sweep(sweep) = d else {
            unreachable!("keyed apart")
        };
        Ok((code, sweep))
    }

    /// The name people read of `r`'s function ([`demangle`]). An ELF function's is
    /// demangled on first use and kept in the decoded-function cache (the same LRU and
    /// byte bound, dropped with its binary): the agent's later windows, and other
    /// processes mapping the same binary, do not demangle it again (it was ≈ 6 % of the
    /// agent's CPU on a host running builds; BENCHMARKS.md, "Agent CPU on a build host").
    /// Cut to its budget ([`fsafe::budget`](fn@crate::fsafe::budget)): a binary may name a
    /// function with a 256 KiB symbol.
    pub fn display_name(&mut self, r: &Resolved) -> String {
        let name = &r.function.name;
        let CodeObject::Elf(bin) = &r.object else {
            return budget(&demangle(name)).into_owned();
        };
        if !may_be_mangled(name) {
            return budget(name).into_owned();
        }
        let f = &r.function;
        let d = self.cached((bin.id, f.start, f.size, Form::Name), || {
            let shown: Arc<str> = budget(&demangle(name)).into();
            let bytes = shown.len();
            Ok((Decoding::Name(shown), bytes))
        });
        let Ok(Decoding::Name(shown)) = d else {
            unreachable!("keyed apart, and made without error")
        };
        shown.to_string()
    }

    /// The cache entry at `key`, made by `make` (contents, their heap bytes) on a miss; a
    /// use of it and of its binary either way.
    fn cached(
        &mut self,
        key: DecodedKey,
        make: impl FnOnce() -> Result<(Decoding, usize), BinaryError>,
    ) -> Result<Decoding, BinaryError> {
        if let Some(d) = self.hit(key) {
            return Ok(d);
        }
        let (value, bytes) = make()?;
        self.keep(key, value.clone(), bytes);
        Ok(value)
    }

    /// The cache entry at `key`, if kept; a use of its binary either way.
    fn hit(&mut self, key: DecodedKey) -> Option<Decoding> {
        self.clock += 1;
        self.used.insert(key.0, self.clock);
        let d = self.decoded.get_mut(&key)?;
        d.used = self.clock;
        Some(d.value.clone())
    }

    /// Keeps `value` (of `bytes` heap bytes) at `key`, just missed by [`Symbolizer::hit`].
    fn keep(&mut self, key: DecodedKey, value: Decoding, bytes: usize) {
        let bytes = (bytes + ENTRY_BYTES) as u64;
        self.decoded_bytes += bytes;
        self.decoded.insert(
            key,
            Decoded {
                value,
                bytes,
                used: self.clock,
            },
        );
    }

    /// Files of `pid`'s executable mappings opened while it lived (by mapping start,
    /// cpi-user/src/procmap/captured.rs): read before any path, so a process that exited,
    /// exec'd, or ran a deleted or other-namespace binary still symbolises.
    pub(crate) fn add_captured(&mut self, pid: u32, files: &HashMap<u64, Arc<CapturedFile>>) {
        for (&start, f) in files {
            self.captured.insert((pid, start), Arc::clone(f));
        }
    }

    /// Process `pid` is known to be gone (its collector saw it leave): its `/proc`
    /// paths are not tried, not even once to learn so.
    pub fn process_gone(&mut self, pid: u32) {
        self.gone.insert(pid);
    }

    /// Forgets what is cached for process `pid` (its mappings' binaries stay cached by
    /// file): the always-on agent calls it when the process has exited or its pid was
    /// reused (cpi-agent/src/lib.rs).
    pub fn forget_process(&mut self, pid: u32) {
        self.by_mapping.retain(|&(p, _), _| p != pid);
        self.failed_mappings.retain(|&(p, _)| p != pid);
        self.captured.retain(|&(p, _), _| p != pid);
        self.perf_maps.remove(&pid);
        self.gone.remove(&pid);
    }

    /// Distinct binaries held, by id.
    fn held(&self) -> HashMap<u64, Arc<Binary>> {
        let mut held = HashMap::new();
        let mapped = self.by_mapping.values();
        for b in self.binaries.binaries().chain(mapped) {
            held.entry(b.id).or_insert_with(|| Arc::clone(b));
        }
        held
    }

    /// Heap bytes held: binaries' tables (`Binary::heap_bytes`; mapped pages are page
    /// cache, not counted — see cpi-user/src/binary/mod.rs), decoded functions, perf maps,
    /// remembered failures and kernel symbols.
    pub fn cache_bytes(&self) -> u64 {
        self.held().values().map(|b| b.heap_bytes()).sum::<u64>()
            + self.decoded_bytes
            + self.perf_map_bytes()
            + self.failure_bytes()
            + (self.opts.kallsyms.as_ref())
                .and_then(Kallsyms::table_if_read)
                .map_or(0, KernelSymbols::heap_bytes)
    }

    /// Heap bytes of the perf maps held.
    fn perf_map_bytes(&self) -> u64 {
        self.perf_files.values().map(|f| f.map.heap_bytes()).sum()
    }

    /// Heap bytes of the failures remembered.
    fn failure_bytes(&self) -> u64 {
        self.binaries.failure_bytes() + self.failed_mappings.bytes()
    }

    /// Drops the least recently used binaries, decoded functions and perf maps until at
    /// most `max_bytes` are held (a dropped binary takes its decoded functions with it),
    /// then, if still over, the oldest failures remembered; then drops the pages the
    /// binaries' mappings touched since the last trim from this process's resident set.
    pub fn trim(&mut self, max_bytes: u64) {
        let held = self.held();
        let mut order: Vec<(u64, Held, u64)> = held
            .values()
            .map(|b| {
                let used = self.used.get(&b.id).copied().unwrap_or(0);
                (used, Held::Binary(Arc::clone(b)), b.heap_bytes())
            })
            .chain(
                self.decoded
                    .iter()
                    .map(|(k, d)| (d.used, Held::Decoded(*k), d.bytes)),
            )
            .chain(
                self.perf_files
                    .iter()
                    .map(|(k, f)| (f.used, Held::PerfMap(*k), f.map.heap_bytes())),
            )
            .collect();
        order.sort_by_key(|h| h.0);
        let mut total = self.cache_bytes();
        for (_, item, bytes) in order {
            if total <= max_bytes {
                break;
            }
            match item {
                Held::Decoded(k) => {
                    // Gone already when its binary was dropped.
                    if let Some(d) = self.decoded.remove(&k) {
                        self.decoded_bytes -= d.bytes;
                        total = total.saturating_sub(d.bytes);
                    }
                }
                Held::PerfMap(k) => {
                    self.perf_files.remove(&k);
                    // Their processes read the file again on their next lookup.
                    self.perf_maps.retain(|_, m| *m != Some(k));
                    total = total.saturating_sub(bytes);
                }
                Held::Binary(bin) => {
                    self.binaries.evict(&bin);
                    self.by_mapping.retain(|_, b| !Arc::ptr_eq(b, &bin));
                    self.used.remove(&bin.id);
                    let mut freed = bytes;
                    self.decoded.retain(|k, d| {
                        let keep = k.0 != bin.id;
                        if !keep {
                            freed += d.bytes;
                        }
                        keep
                    });
                    self.decoded_bytes -= freed - bytes;
                    total = total.saturating_sub(freed);
                }
            }
        }
        while total > max_bytes {
            let Some(freed) = (self.binaries.forget_oldest_failure())
                .or_else(|| self.failed_mappings.pop_oldest())
            else {
                break;
            };
            total = total.saturating_sub(freed);
        }
        let held = self.held();
        self.used.retain(|id, _| held.contains_key(id));
        for b in held.values() {
            b.release_pages();
        }
    }

    /// Symbolises `addr` of process `pid` whose mappings are `maps`.
    pub fn resolve(
        &mut self,
        pid: u32,
        maps: &ProcessMaps,
        addr: u64,
    ) -> Result<Resolved, SymbolizeError> {
        if addr >= KERNEL_START {
            return Ok(self.kernel_lookup(addr));
        }
        let Some(m) = maps.find(addr) else {
            return self
                .perf_map_lookup(pid, addr)
                .ok_or(SymbolizeError::Unmapped { pid, addr });
        };
        match &m.object {
            MappedObject::Anon => Ok(self
                .perf_map_lookup(pid, addr)
                .unwrap_or_else(|| pseudo(CodeObject::Anon, "[anon]", addr, m.start, m.end))),
            MappedObject::Special(name) => Ok(pseudo(
                CodeObject::Special(name.clone()),
                name,
                addr,
                m.start,
                m.end,
            )),
            MappedObject::File { path, deleted } => {
                let bin = self.binary_for(pid, m, path)?;
                let offset = m.file_offset(addr);
                let vaddr =
                    bin.vaddr_of_offset(offset)
                        .ok_or_else(|| SymbolizeError::OutsideSegments {
                            path: path.clone(),
                            offset,
                            addr,
                        })?;
                let function =
                    bin.function_or_hole(vaddr)
                        .ok_or_else(|| SymbolizeError::NoFunction {
                            path: path.clone(),
                            vaddr,
                        })?;
                if bin.truncated() {
                    return Err(self.drop_truncated(pid, m, &bin));
                }
                Ok(Resolved {
                    function_index: bin.function_index(vaddr),
                    function,
                    object_name: path.display().to_string(),
                    deleted: *deleted,
                    vaddr,
                    object: CodeObject::Elf(bin),
                })
            }
        }
    }

    fn binary_for(
        &mut self,
        pid: u32,
        m: &Mapping,
        path: &Path,
    ) -> Result<Arc<Binary>, SymbolizeError> {
        let key = (pid, m.start);
        let r = match (self.by_mapping.get(&key), self.failed_mappings.get(&key)) {
            (Some(b), _) => Ok(Arc::clone(b)),
            (None, Some(e)) => Err(Arc::clone(e)),
            (None, None) => {
                let r = self.open_mapped(pid, m, path).map_err(Arc::new);
                match &r {
                    Ok(b) => drop(self.by_mapping.insert(key, Arc::clone(b))),
                    Err(e) => {
                        self.warn_once(path, pid, e);
                        self.remember_failed(key, e);
                    }
                }
                r
            }
        };
        if let Ok(b) = &r {
            self.clock += 1;
            self.used.insert(b.id, self.clock);
        }
        r.map_err(|source| SymbolizeError::Binary {
            pid,
            addr: m.start,
            source,
        })
    }

    /// The binary of mapping `m`: the file captured while the process lived (reopened by
    /// its checked path if the collector's LRU closed it); else opened by
    /// [`crate::procmap::open_mapped_file`]: `/proc/PID/map_files/…`, the path inside the
    /// process's root, then the path as mapped, each accepted only if it is the file the
    /// mapping recorded, so a replaced library or a planted link is refused.
    fn open_mapped(
        &mut self,
        pid: u32,
        m: &Mapping,
        path: &Path,
    ) -> Result<Arc<Binary>, BinaryError> {
        // A short-lived process is often gone before its samples are analysed: one failed
        // look instead of two per mapping.
        if self.opts.use_proc && !self.gone.contains(&pid) && !crate::procmap::alive(pid) {
            self.gone.insert(pid);
        }
        let live = self.opts.use_proc && !self.gone.contains(&pid);
        let Some(c) = self.captured.get(&(pid, m.start)).cloned() else {
            log::debug!(
                "symbols: opening {} for pid {pid} (not captured)",
                crate::fsafe::escape(&path.to_string_lossy())
            );
            let f = crate::procmap::open_mapped_file(pid, m, path, live, None)?;
            return self.binaries.get_open(&f, path);
        };
        // The open file itself, identified by fstat (no /proc path walk per process).
        let b = self
            .binaries
            .get_open(&*c.open(pid, m, path, live)?, path)?;
        c.check_build_id(b.build_id.as_deref(), path)?;
        Ok(b)
    }

    /// Remembers that mapping `key`'s binary is unusable, for `e`: its message (path and
    /// reason) is what it holds.
    fn remember_failed(&mut self, key: (u32, u64), e: &Arc<BinaryError>) {
        let heap = size_of::<BinaryError>() + e.to_string().len();
        self.failed_mappings.insert(key, Arc::clone(e), heap);
    }

    /// Notes why `path` is unusable, once per file (at most [`MAX_NAMED`] files, then once
    /// that more are not named), for [`Symbolizer::log_unusable`] to say.
    fn warn_once(&mut self, path: &Path, pid: u32, e: &BinaryError) {
        if self.warned.len() < MAX_NAMED {
            if self.warned.insert(path.to_path_buf()) {
                self.unsaid
                    .push((path.to_path_buf(), format!("pid {pid}: {e}")));
            }
        } else if self.warned.len() == MAX_NAMED {
            self.warned.insert(PathBuf::new());
            self.unsaid.push((
                PathBuf::new(),
                format!("more than {MAX_NAMED} unusable files: no longer named"),
            ));
        }
    }

    /// Says the files found unusable since the last call: one warning for one file;
    /// for more (a process whose libraries were all replaced), one warning with their
    /// count and the first names, each file's reason at info level (`-v`). Their samples
    /// are in the loss account (unmapped) either way.
    pub(crate) fn log_unusable(&mut self) {
        let (unsaid, overflow): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unsaid)
            .into_iter()
            .partition(|(p, _)| !p.as_os_str().is_empty());
        for (_, line) in overflow {
            log::warn!("{line}");
        }
        match unsaid.as_slice() {
            [] => {}
            [(_, one)] => log::warn!("{one}"),
            all => {
                let named: Vec<String> = all.iter().map(|(p, _)| p.display().to_string()).collect();
                log::warn!(
                    "{}",
                    files_summary(
                        "mapped files unusable, their samples counted as unmapped",
                        &named,
                        ""
                    )
                );
                for (_, line) in all {
                    log::info!("{line}");
                }
            }
        }
    }

    /// Forgets `bin`, found truncated under its mapping (cpi-user/src/fsafe/sys/map.rs):
    /// this mapping stays unusable, other processes' mappings reopen the file as it is.
    fn drop_truncated(&mut self, pid: u32, m: &Mapping, bin: &Arc<Binary>) -> SymbolizeError {
        self.binaries.evict(bin);
        self.by_mapping.retain(|_, b| !Arc::ptr_eq(b, bin));
        self.decoded.retain(|k, _| k.0 != bin.id);
        self.decoded_bytes = self.decoded.values().map(|d| d.bytes).sum();
        let e = Arc::new(BinaryError::Truncated {
            path: bin.path.clone(),
        });
        self.warn_once(&bin.path, pid, &e);
        self.remember_failed((pid, m.start), &e);
        SymbolizeError::Binary {
            pid,
            addr: m.start,
            source: e,
        }
    }

    fn kernel_lookup(&self, addr: u64) -> Resolved {
        let mut r = pseudo(CodeObject::Kernel, "[kernel]", addr, KERNEL_START, 0);
        // Read on the first kernel address, unless read ahead.
        if let Some(f) = (self.opts.kallsyms.as_ref()).and_then(|k| k.table().lookup(addr)) {
            r.function = f;
        }
        r
    }

    fn perf_map_lookup(&mut self, pid: u32, addr: u64) -> Option<Resolved> {
        let key = match self.perf_maps.get(&pid) {
            Some(k) => *k,
            None => {
                let k = self.read_perf_map(pid);
                self.perf_maps.insert(pid, k);
                k
            }
        }?;
        self.clock += 1;
        let file = self.perf_files.get_mut(&key)?;
        file.used = self.clock;
        Some(Resolved {
            object: CodeObject::Anon,
            object_name: "[anon]".into(),
            deleted: false,
            vaddr: addr,
            function: file.map.lookup(addr)?,
            function_index: None,
        })
    }

    /// `pid`'s perf map, read unless the same file (a hard link, or another process's
    /// same map) is held already; `None` if it has none it may use.
    fn read_perf_map(&mut self, pid: u32) -> Option<PerfMapKey> {
        use std::os::unix::fs::MetadataExt;
        let path = self.opts.perf_map_dir.join(format!("perf-{pid}.map"));
        let (mut f, meta) = open_perf_map(pid, &path)?;
        let key = (meta.dev(), meta.ino(), meta.len(), meta.modified().ok());
        if !self.perf_files.contains_key(&key) {
            let map = PerfMap::read(&mut f, meta.len());
            if let Some(cut) = map.cut {
                crate::fsafe::budget::refused(crate::fsafe::budget::Reader::PerfMap);
                self.say_cut(&path, (key.0, key.1), cut);
            }
            self.perf_files.insert(key, PerfFile { map, used: 0 });
        }
        Some(key)
    }

    /// Warns that the perf map at `path` (device, inode `id`) was cut by the budget, once
    /// per file (at most [`MAX_NAMED`] files).
    fn say_cut(&mut self, path: &Path, id: (u64, u64), cut: Cut) {
        if self.perf_cut_said.len() < MAX_NAMED && self.perf_cut_said.insert(id) {
            log::warn!(
                "{}: perf map over its budget: its first {} bytes not read, {} more lines \
                 not kept (the last {MAX_PERF_MAP_ENTRIES} functions of its last {} MiB are \
                 named; code elsewhere is [anon])",
                path.display(),
                cut.bytes_skipped,
                cut.lines_dropped,
                MAX_PERF_MAP_BYTES >> 20
            );
        }
    }
}

fn pseudo(object: CodeObject, name: &str, addr: u64, start: u64, end: u64) -> Resolved {
    Resolved {
        object,
        object_name: name.to_string(),
        deleted: false,
        vaddr: addr,
        function: Function {
            name: name.to_string(),
            start,
            size: end.wrapping_sub(start),
        },
        function_index: None,
    }
}

/// `/tmp/perf-PID.map`, where anyone can plant a file: used only if it is a regular
/// file, not a link, owned by root or by the user who owns process `pid` (as perf
/// requires); the file and its metadata.
fn open_perf_map(pid: u32, path: &Path) -> Option<(std::fs::File, std::fs::Metadata)> {
    use std::os::unix::fs::MetadataExt;
    let f = crate::fsafe::open_nofollow(path).ok()?;
    let meta = f.metadata().ok()?;
    let process_owner = std::fs::metadata(format!("/proc/{pid}"))
        .map(|m| m.uid())
        .ok();
    if !(meta.uid() == 0 || Some(meta.uid()) == process_owner) {
        log::warn!(
            "{}: owned by uid {}, not by the process's user: not read",
            path.display(),
            meta.uid()
        );
        return None;
    }
    Some((f, meta))
}

/// One line for many files with one problem: their count, `what` they are, the first
/// few names, `then` (a remedy, may be empty), and where each file's reason is (`-v`).
pub(crate) fn files_summary(what: &str, names: &[String], then: &str) -> String {
    let first = &names[..names.len().min(SUMMARY_NAMES)];
    let more = match names.len() - first.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "{} {what}: {}{more}{then} (each with its reason: -v)",
        names.len(),
        first.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::testbin::{maps_for, TestProgram};

    #[test]
    fn resolves_pie_non_pie_kernel_anon_vdso() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("cpi-sym-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("perf-4242.map"), "7f0000000100 40 jitted_fn\n").unwrap();
        std::fs::write(
            dir.join("kallsyms"),
            "0000000000000000 A fixed_percpu_data\n\
             ffffffff81000000 T _stext\n\
             ffffffff81000100 t do_syscall_64\n\
             ffffffff81000200 T entry_SYSCALL_64\n",
        )
        .unwrap();
        let mut s = Symbolizer::new(SymbolizerOptions {
            use_proc: false,
            perf_map_dir: dir.clone(),
            kallsyms: Some(Kallsyms::new(dir.join("kallsyms"))),
            ..Default::default()
        });
        for (path, base) in [(&t.plain, 0), (&t.pie, 0x5555_5555_4000)] {
            let bin = Binary::open(path).unwrap();
            let maps = maps_for(path, &bin, base);
            let f = bin.function_by_name("classify").unwrap();
            let r = s.resolve(4242, &maps, base + f.start + 2).unwrap();
            assert_eq!(r.function.name, "classify");
            assert_eq!(r.vaddr, f.start + 2);
            assert_eq!(r.object_name, path.display().to_string());
            assert!(matches!(r.object, CodeObject::Elf(_)));
            let r = s.resolve(4242, &maps, 0x7f00_0000_0110).unwrap();
            assert_eq!(
                (r.object_name.as_str(), r.function.name.as_str()),
                ("[anon]", "jitted_fn")
            );
            let r = s.resolve(4242, &maps, 0x7f00_0000_0800).unwrap();
            assert_eq!(r.function.name, "[anon]");
            let r = s.resolve(4242, &maps, 0x7fff_0000_0010).unwrap();
            assert_eq!(r.function.name, "[vdso]");
            let r = s.resolve(4242, &maps, 0xffff_ffff_8100_0180).unwrap();
            assert_eq!(r.object_name, "[kernel]");
            assert_eq!(
                (r.function.name.as_str(), r.function.size),
                ("do_syscall_64", 0x100)
            );
            // Below the first kernel symbol: the whole kernel.
            let r = s.resolve(4242, &maps, 0xffff_9000_0000_0000).unwrap();
            assert_eq!(r.function.name, "[kernel]");
            let e = s.resolve(4242, &maps, 0x10).unwrap_err();
            assert!(matches!(e, SymbolizeError::Unmapped { .. }), "{e}");
        }
        // A mapping of a file that is gone is a clear error.
        let maps = ProcessMaps::parse("400000-401000 r-xp 00000000 00:00 1 /gone/bin (deleted)\n")
            .unwrap();
        let e = crate::chain(&s.resolve(1, &maps, 0x400010).unwrap_err());
        assert!(e.contains("/gone/bin"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A perf map past the read budget, hard-linked for two processes (the test and a
    /// child of it, so the owner check passes for any user): held small, once, counted
    /// in the cache and dropped by its bound; read again when needed.
    #[test]
    fn perf_maps_are_bounded_shared_and_trimmed() {
        let dir = std::env::temp_dir().join(format!("cpi-perfmaps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pids = [std::process::id(), child.id()];
        // 1.5 M short lines, 13 MiB: past both budgets.
        let lines = 1_500_000u64;
        let at = |i: u64| 0x7f00_0000_0000 + 0x10 * i;
        let text: String = (0..lines)
            .map(|i| format!("{:x} 10 f{i}\n", at(i)))
            .collect();
        let first = dir.join(format!("perf-{}.map", pids[0]));
        std::fs::write(&first, &text).unwrap();
        std::fs::hard_link(&first, dir.join(format!("perf-{}.map", pids[1]))).unwrap();
        let mut s = Symbolizer::new(SymbolizerOptions {
            use_proc: false,
            perf_map_dir: dir.clone(),
            kallsyms: None,
            ..Default::default()
        });
        let none = ProcessMaps::parse("").unwrap();
        let last = at(lines - 1) + 4;
        let name = |s: &mut Symbolizer, pid| s.resolve(pid, &none, last).map(|r| r.function.name);
        assert_eq!(name(&mut s, pids[0]).unwrap(), format!("f{}", lines - 1));
        let held = s.cache_bytes();
        assert!(held > 0 && held < 4 << 20, "{held} bytes held");
        assert!(s.resolve(pids[0], &none, at(0)).is_err(), "the head is cut");
        assert_eq!(name(&mut s, pids[1]).unwrap(), format!("f{}", lines - 1));
        assert_eq!(s.cache_bytes(), held, "the hard link is held once");
        s.trim(held - 1);
        assert_eq!(s.cache_bytes(), 0, "trimmed with the cache");
        assert_eq!(name(&mut s, pids[1]).unwrap(), format!("f{}", lines - 1));
        assert_eq!(s.cache_bytes(), held, "read again");
        let _ = child.kill();
        let _ = child.wait();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Thousands of distinct non-ELF files mapped executable (long paths): what is
    /// remembered of their failures stays bounded, is counted in the cache, and leaves
    /// with it.
    #[test]
    fn failed_files_stay_bounded_and_leave_with_the_cache() {
        use crate::binary::negative::MAX_FAILURE_BYTES;
        let dir = std::env::temp_dir().join(format!("cpi-failed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut maps = String::new();
        for i in 0..3000u64 {
            let path = dir.join(format!("{}{i}", "x".repeat(200)));
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            let start = 0x1000_0000 + i * 0x1000;
            maps += &format!(
                "{start:x}-{:x} r-xp 00000000 {} {}\n",
                start + 0x1000,
                crate::binary::testbin::maps_dev_ino(&path),
                path.display()
            );
        }
        let maps = ProcessMaps::parse(&maps).unwrap();
        let mut s = Symbolizer::new(SymbolizerOptions {
            use_proc: false,
            kallsyms: None,
            ..Default::default()
        });
        for m in &maps.mappings {
            let e = s.resolve(7, &maps, m.start).unwrap_err();
            assert!(matches!(e, SymbolizeError::Binary { .. }), "{e}");
        }
        let held = s.cache_bytes();
        assert!(held > 0, "failures are counted");
        assert!(held <= 2 * MAX_FAILURE_BYTES, "{held} bytes held");
        s.trim(0);
        assert_eq!(s.cache_bytes(), 0, "and leave with the cache");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The test program's plain (non-PIE) binary mapped at its link addresses as pid 1,
    /// for a symbolizer that reads neither /proc nor kallsyms.
    struct PlainProgram {
        bin: Binary,
        maps: ProcessMaps,
    }

    impl PlainProgram {
        fn get() -> Option<(Symbolizer, Self)> {
            let t = TestProgram::get("analysis_loops")?;
            let s = Symbolizer::new(SymbolizerOptions {
                use_proc: false,
                kallsyms: None,
                ..Default::default()
            });
            let bin = Binary::open(&t.plain).unwrap();
            let maps = maps_for(&t.plain, &bin, 0);
            Some((s, Self { bin, maps }))
        }

        /// `name` resolved through `s`: the binary as `s` keeps it, and the function.
        fn at(&self, s: &mut Symbolizer, name: &str) -> (Arc<Binary>, Function) {
            let f = self.bin.function_by_name(name).unwrap();
            let r = s.resolve(1, &self.maps, f.start).unwrap();
            let CodeObject::Elf(b) = r.object else {
                panic!("{name} is in an ELF file")
            };
            (b, r.function)
        }
    }

    /// Decoded functions outlive analyses and leave in LRU order under a byte bound; a
    /// dropped binary takes its decoded functions with it.
    #[test]
    fn decoded_functions_are_cached_and_trimmed_least_recently_used_first() {
        let Some((mut s, plain)) = PlainProgram::get() else {
            return;
        };
        let (b, sum) = plain.at(&mut s, "sum_loop");
        let (_, fib) = plain.at(&mut s, "fib");
        let table = s.cache_bytes();
        assert_eq!(table, b.heap_bytes(), "only the binary's table so far");
        let d_sum = s.decode(&b, &sum).unwrap();
        assert!(
            Arc::ptr_eq(&d_sum, &s.decode(&b, &sum).unwrap()),
            "decoded once"
        );
        let with_sum = s.cache_bytes();
        let d_fib = s.decode(&b, &fib).unwrap();
        assert!(with_sum > table && s.cache_bytes() > with_sum);
        // Use sum_loop again: fib is now the least recently used.
        s.decode(&b, &sum).unwrap();
        s.trim(s.cache_bytes() - 1);
        assert_eq!(s.cache_bytes(), with_sum, "fib's instructions left");
        assert!(Arc::ptr_eq(&d_sum, &s.decode(&b, &sum).unwrap()));
        assert!(
            !Arc::ptr_eq(&d_fib, &s.decode(&b, &fib).unwrap()),
            "fib decoded anew"
        );
        assert_eq!(*d_fib, *s.decode(&b, &fib).unwrap());
        // Nothing may stay: the binary goes, and its decoded functions with it.
        s.trim(0);
        assert_eq!(s.cache_bytes(), 0);
        let (b2, sum2) = plain.at(&mut s, "sum_loop");
        assert!(!Arc::ptr_eq(&b, &b2), "reopened");
        assert!(!Arc::ptr_eq(&d_sum, &s.decode(&b2, &sum2).unwrap()));
    }

    /// An instruction found again comes from the cache, the same as made anew (and as
    /// the function's full decoding has it), counted in the cache bytes, and leaves with
    /// its binary.
    #[test]
    fn instructions_holding_are_cached_and_trimmed() {
        let Some((mut s, plain)) = PlainProgram::get() else {
            return;
        };
        let (b, func) = plain.at(&mut s, "sum_loop");
        let all = Symbolizer::new(SymbolizerOptions::default())
            .decode(&b, &func)
            .unwrap();
        // Each instruction's start and its last byte; one address outside the function.
        let mut addrs: Vec<u64> = all.iter().flat_map(|i| [i.addr, i.next() - 1]).collect();
        addrs.push(func.start + func.size);
        let want: Vec<Option<Instruction>> = all
            .iter()
            .flat_map(|i| [Some(i.clone()), Some(i.clone())])
            .chain([None])
            .collect();
        let before = s.cache_bytes();
        let miss = s.instructions_holding(&b, &func, &addrs).unwrap();
        let kept = s.cache_bytes() - before;
        assert!(kept > 0);
        let hit = s.instructions_holding(&b, &func, &addrs).unwrap();
        assert_eq!(s.cache_bytes() - before, kept, "kept once");
        assert_eq!(miss, want);
        assert_eq!(hit, want);
        s.trim(0);
        assert_eq!(s.cache_bytes(), 0, "gone with the binary");
    }

    #[test]
    fn live_process_through_proc() {
        // Our own process: resolve this very function through /proc/self.
        let pid = std::process::id();
        let maps = ProcessMaps::read(pid).unwrap();
        let mut s = Symbolizer::new(SymbolizerOptions::default());
        let addr = live_process_through_proc as *const () as usize as u64;
        let r = s.resolve(pid, &maps, addr).unwrap();
        assert!(
            r.function.name.contains("live_process_through_proc"),
            "{}",
            r.function.name
        );
    }

    /// A demangled name is the same from the cache as made anew, is counted in the cache
    /// bytes while kept, and leaves with its binary.
    #[test]
    fn demangled_names_are_cached_and_trimmed() {
        let pid = std::process::id();
        let maps = ProcessMaps::read(pid).unwrap();
        let mut s = Symbolizer::new(SymbolizerOptions::default());
        let addr = demangled_names_are_cached_and_trimmed as *const () as usize as u64;
        let r = s.resolve(pid, &maps, addr).unwrap();
        // This test's own symbol: mangled Rust.
        assert!(may_be_mangled(&r.function.name), "{}", r.function.name);
        let want = demangle(&r.function.name).into_owned();
        assert!(
            want.ends_with("::demangled_names_are_cached_and_trimmed"),
            "{want}"
        );
        let before = s.cache_bytes();
        let miss = s.display_name(&r);
        let kept = s.cache_bytes() - before;
        assert_eq!(kept, (want.len() + ENTRY_BYTES) as u64);
        let hit = s.display_name(&r);
        assert_eq!((&miss, &hit), (&want, &want));
        assert_eq!(s.cache_bytes() - before, kept, "kept once");
        s.trim(0);
        assert_eq!(s.cache_bytes(), 0, "gone with the binary");
        let r = s.resolve(pid, &maps, addr).unwrap();
        assert_eq!(s.display_name(&r), want, "made anew");
        // Names that are not mangled are not kept.
        let before = s.cache_bytes();
        let mut plain = r.clone();
        plain.function.name = "main".into();
        assert_eq!(s.display_name(&plain), "main");
        assert_eq!(s.cache_bytes(), before);
    }
}

#[cfg(test)]
mod live_tests {
    use super::*;

    /// A running program whose file was deleted still symbolises, through
    /// /proc/PID/map_files (needs root or the same user; this test's own child is ours).
    #[test]
    fn deleted_binary_of_a_live_process() {
        let dir = std::env::temp_dir().join(format!("cpi-deleted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("sleeper");
        if let Err(e) = std::fs::copy("/bin/sleep", &exe) {
            crate::binary::testbin::skip(format_args!("cannot copy /bin/sleep: {e}"));
            return;
        }
        let mut child = std::process::Command::new(&exe).arg("30").spawn().unwrap();
        let pid = child.id();
        // Wait until the exec has mapped the copy.
        let mut mapped = false;
        for _ in 0..200 {
            if let Ok(m) = ProcessMaps::read(pid) {
                if m.mappings.iter().any(|m| {
                    m.executable
                        && matches!(&m.object, MappedObject::File { path, .. } if path == &exe)
                }) {
                    mapped = true;
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::fs::remove_file(&exe).unwrap();
        // Resolve while the child lives: /proc/PID/map_files is the only way left.
        let resolved = mapped
            .then(|| {
                let maps = ProcessMaps::read(pid).ok()?;
                let text = maps
                    .mappings
                    .iter()
                    .find(|m| {
                        m.executable
                            && matches!(&m.object, MappedObject::File { deleted: true, .. })
                    })?
                    .clone();
                let mut s = Symbolizer::new(SymbolizerOptions {
                    kallsyms: None,
                    ..Default::default()
                });
                // sleep is stripped: scan the text for an address its FDEs cover.
                (text.start..text.end)
                    .step_by(64)
                    .find_map(|a| s.resolve(pid, &maps, a).ok())
            })
            .flatten();
        let _ = child.kill();
        let _ = child.wait();
        std::fs::remove_dir_all(&dir).unwrap();
        let r = resolved.expect("a function of the deleted, still running binary");
        assert!(r.deleted);
        assert_eq!(r.object_name, exe.display().to_string());
        assert!(matches!(r.object, CodeObject::Elf(ref b) if b.stripped()));
    }
}
