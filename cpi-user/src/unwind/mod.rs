//! User stacks unwound in user space from what the kernel side copied: the registers at
//! the sample and the top of the user stack (cpi-ebpf/src/main.rs, `wire::StackHeader`).
//!
//! Each module's `.eh_frame` (through `.eh_frame_hdr`) drives the `framehop` unwinder;
//! a module without them, or whose file could not be captured, is walked by frame
//! pointers. Unwinding stops where it can no longer be trusted and says why
//! ([`Stop`]): code in no file mapping (JIT, anonymous memory, the vDSO) ends the stack
//! there, and nothing past it is invented. Files are read only through the captured
//! files (cpi-user/src/procmap/captured.rs: the descriptor, or reopened by the checked
//! path if the LRU closed it), mapped with cpi-user/src/fsafe/sys/map.rs, and unwound from
//! the mapping itself: the sections are file pages, touched where a lookup reads them,
//! not copied to the heap (a copy of `librustc_driver`'s 10 MB of `.eh_frame` per
//! build of a process made the agent's heap swing by tens of MiB). Each file is mapped
//! once, under a bound on the section bytes, least recently used out. A file
//! whose unwind rules would cost more to evaluate than any compiler's output does
//! (cost.rs) is never evaluated: a frame in it ends the stack there ([`Stop::CostlyRules`]).
//!
//! The bytes evaluated must be the bytes checked, and a shared mapping shows every later
//! write to its file: the owner of a library its process has mapped can rewrite
//! `.eh_frame` in place after the check (a `DW_OP_skip` back to itself hung the
//! collector; tests/tests/it/hostile.rs
//! `unwind_rules_rewritten_after_the_check_cannot_blind_the_agent`). So the sections are
//! used from the mapping only when only root can change the file
//! (cpi-user/src/fsafe/mod.rs `only_root_can_change`: root's, not group- or
//! other-writable, on a local filesystem); any other file's sections are copied to the
//! heap before the check and used from the copy, counted in the byte bound, and refused
//! (frame pointers) when the copies of files in use would pass it.

mod cost;

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Error as FrameError, ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection, ObjectSegment};

use crate::fsafe::map::GuardedMap;
use crate::fsafe::FileId;
use crate::procmap::{open_mapped_file, CapturedFile, MappedObject, Mapping, ProcessMaps};
use std::path::Path;

/// Why unwinding stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stop {
    /// The outermost frame was reached (`_start`'s CFI marks the return address
    /// undefined; a frame-pointer chain ends at a zero frame pointer).
    Root,
    /// The frame limit was reached.
    FrameLimit,
    /// The next frame lies past the copied stack bytes, which were as long as the
    /// kernel side copies: a deeper stack than was copied.
    EndOfCopy,
    /// A frame is in code without a file behind it (JIT, anonymous memory, vDSO).
    UnknownCode,
    /// The stack could not be read where the unwind rules point (nothing was copied,
    /// or the copy ended early at an unreadable page).
    Unreadable,
    /// The unwind rules led nowhere: a cycle, a stack moving the wrong way, a null
    /// return address (corrupt or missing unwind information on a frame-pointer-less
    /// frame).
    BadUnwind,
    /// A frame is in a file whose unwind rules cost more to evaluate than any
    /// compiler's output (cpi-user/src/unwind/cost.rs): the stack ends at that frame,
    /// which is real (an IP, or a return address its callee's rules gave).
    CostlyRules,
    /// The frame-pointer chain ended (a zero frame pointer) at a frame in a file whose
    /// unwind sections were not read (not captured, not found, past the byte bound):
    /// code built without frame pointers leaves anything in `rbp`, so the stack may go
    /// on past it. Only a file read and found without unwind sections (built with frame
    /// pointers, as Go's are) ends a stack at [`Stop::Root`] this way.
    Unread,
}

/// How far past a program's entry point its entry function's calls lie: glibc's
/// `_start` calls `__libc_start_main` 0x25 bytes in, ld.so's calls `_dl_start` 8 bytes
/// and `_dl_init` 0x30 bytes in.
const ENTRY_SPAN: u64 = 64;

/// What [`ProcessUnwinder::modules`] knows of one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ModuleFacts {
    rules: Rules,
    /// The runtime address of its file's entry point: the kernel jumps there with no
    /// return address, so a frame in the entry function is the stack's root, whether
    /// or not its CFI says so (Debian 12's ld.so has no FDE for `_start`: frame pointers
    /// past it read whatever `rbp` held).
    entry: Option<u64>,
}

impl ModuleFacts {
    /// Whether `a` lies in the module's entry function.
    fn at_entry(&self, a: u64) -> bool {
        self.entry
            .is_some_and(|e| (e..e.saturating_add(ENTRY_SPAN)).contains(&a))
    }
}

/// What a module's frames are unwound with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rules {
    /// Its `.eh_frame`, or frame pointers in a file read and found without one.
    Read,
    /// None: its rules cost too much to evaluate ([`Stop::CostlyRules`]).
    Costly,
    /// Frame pointers, its file's unwind sections not read ([`Stop::Unread`]).
    Unread,
}

/// One unwound stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwoundStack {
    /// Leaf first: `[0]` the IP, then return addresses.
    pub frames: Vec<u64>,
    /// Why it stopped.
    pub stop: Stop,
    /// Bytes of the copied stack the unwinding read, from `sp` to the end of the
    /// farthest word: what a copy of this stack needs ([`Stop::EndOfCopy`]: more).
    pub used: usize,
}

/// The registers and stack bytes of one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRegs {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer: the address of `stack[0]`.
    pub sp: u64,
    /// Frame pointer (`rbp`).
    pub bp: u64,
}

/// Where a file's unwind sections are read from.
#[derive(Clone, Debug)]
enum Backing {
    /// Its guarded mapping: a file only root can change.
    Mapped(Arc<GuardedMap>),
    /// A copy of its sections, made before they were checked.
    Copied(Arc<[u8]>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m.bytes(),
            Backing::Copied(c) => c,
        }
    }

    /// References to it.
    fn refs(&self) -> usize {
        match self {
            Backing::Mapped(m) => Arc::strong_count(m),
            Backing::Copied(c) => Arc::strong_count(c),
        }
    }
}

/// A section's bytes in its file's backing (empty without one: framehop's section info
/// wants a default).
#[derive(Clone, Debug, Default)]
struct SectionData {
    backing: Option<Backing>,
    range: Range<usize>,
    /// Set when framehop reads the bytes: their file's pages are released at the next
    /// [`StackUnwinder::release_pages`].
    touched: Arc<AtomicBool>,
}

impl std::ops::Deref for SectionData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.touched.store(true, Ordering::Relaxed);
        self.backing
            .as_ref()
            .and_then(|b| b.bytes().get(self.range.clone()))
            .unwrap_or_default()
    }
}

/// The unwind sections of one file, shared by every process that maps it.
#[derive(Debug)]
struct Sections {
    eh_frame: Option<(Range<u64>, SectionData)>,
    eh_frame_hdr: Option<(Range<u64>, SectionData)>,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    /// `PT_LOAD` (vaddr, file offset, file size), for the load bias of a mapping.
    loads: Vec<(u64, u64, u64)>,
    /// The ELF entry point (`e_entry`), where the kernel starts a program.
    entry: Option<u64>,
    /// Bytes of the unwind sections (mapped or copied).
    bytes: u64,
    /// The sections' backing: a mapping's touched pages [`StackUnwinder::release_pages`]
    /// drops…
    backing: Backing,
    /// …when framehop read its sections since the last release.
    touched: Arc<AtomicBool>,
    /// Why its rules are not evaluated, if they are not.
    costly: Option<cost::Costly>,
}

/// Heap bytes of one file's entry (besides the sections, when copied).
const ENTRY_HEAP_BYTES: u64 = 512;

/// Files whose unwind sections are held at most (each holds a guarded mapping,
/// cpi-user/src/fsafe/sys/map.rs `MAX_GUARDED`).
const MAX_FILES: usize = 1024;

impl Sections {
    /// Reads the unwind sections of `file`; `None` when it is not a readable x86-64 ELF
    /// (its frames are then walked by frame pointers). They are copied unless only root
    /// can change the file (the module doc). The check's verdict on the same bytes
    /// read before is kept in `verdicts`.
    fn read(file: &File, verdicts: &mut cost::Verdicts) -> Option<Sections> {
        let map = Arc::new(GuardedMap::new(file).ok()?);
        let elf = object::File::parse(map.bytes()).ok()?;
        if elf.architecture() != object::Architecture::X86_64 {
            return None;
        }
        let touched = Arc::new(AtomicBool::new(false));
        let section = |name: &str| {
            let s = elf.section_by_name(name)?;
            let (offset, size) = s.file_range()?;
            let start = usize::try_from(offset).ok()?;
            let range = start..start.checked_add(usize::try_from(size).ok()?)?;
            // Within the file as mapped (a corrupt header may point past it).
            map.bytes().get(range.clone())?;
            Some((s.address()..s.address() + s.size(), range))
        };
        let range = |name: &str| {
            elf.section_by_name(name)
                .map(|s| s.address()..s.address() + s.size())
        };
        let found = [section(".eh_frame"), section(".eh_frame_hdr")];
        let loads = elf
            .segments()
            .map(|s| (s.address(), s.file_range().0, s.file_range().1))
            .collect();
        let (text, got) = (range(".text"), range(".got"));
        let entry = Some(elf.entry()).filter(|&e| e != 0);
        let (backing, ranges) = if crate::fsafe::only_root_can_change(file) {
            (
                Backing::Mapped(Arc::clone(&map)),
                found.clone().map(|s| s.map(|(_, r)| r)),
            )
        } else {
            // One copy of both sections, read before anything checks them.
            let mut copy = Vec::new();
            let ranges = found.clone().map(|s| {
                let (_, r) = s?;
                let at = copy.len();
                copy.extend_from_slice(&map.bytes()[r.clone()]);
                Some(at..copy.len())
            });
            (Backing::Copied(copy.into()), ranges)
        };
        // A file truncated under the mapping read as zeros: not its unwind information.
        if map.truncated() {
            return None;
        }
        let [eh_frame, eh_frame_hdr] = [0, 1].map(|i| {
            let (svma, _) = found[i].clone()?;
            let data = SectionData {
                backing: Some(backing.clone()),
                range: ranges[i].clone()?,
                touched: Arc::clone(&touched),
            };
            Some((svma, data))
        });
        let bytes = [&eh_frame, &eh_frame_hdr]
            .iter()
            .filter_map(|s| s.as_ref().map(|(_, d)| d.range.len() as u64))
            .sum::<u64>();
        let costly = eh_frame.as_ref().and_then(|(r, d)| {
            let bytes = |d: &SectionData| &backing.bytes()[d.range.clone()];
            verdicts.check(&cost::UnwindSections {
                eh_frame: (bytes(d), r.start),
                eh_frame_hdr: eh_frame_hdr.as_ref().map(|(r, d)| (bytes(d), r.start)),
                text: text.as_ref().map(|t| t.start),
                got: got.as_ref().map(|g| g.start),
            })
        });
        // The check (or the copy) read every entry: out of the resident set again
        // (nothing else of this new mapping was read yet; a copied file's mapping is
        // dropped here).
        if let Err(e) = map.dont_need() {
            log::debug!("unwind sections: madvise(MADV_DONTNEED): {e}");
        }
        Some(Sections {
            eh_frame,
            eh_frame_hdr,
            text,
            got,
            loads,
            entry,
            bytes,
            backing,
            touched,
            costly,
        })
    }

    /// Whether a process's module uses the sections: their backing is referred to by
    /// more than this entry and its own sections.
    fn in_use(&self) -> bool {
        let own = 1 + [&self.eh_frame, &self.eh_frame_hdr]
            .iter()
            .filter(|s| s.is_some())
            .count();
        self.backing.refs() > own
    }

    /// The sections' bytes when copied to the heap.
    fn copied_bytes(&self) -> Option<u64> {
        matches!(self.backing, Backing::Copied(_)).then_some(self.bytes)
    }

    /// Runtime address of vaddr 0 for a mapping at `start` of file offset `offset`.
    fn base_avma(&self, start: u64, offset: u64) -> Option<u64> {
        let &(vaddr, off, _) = self
            .loads
            .iter()
            .find(|&&(_, off, size)| (off & !0xfff) <= offset && offset < off + size.max(1))?;
        Some(
            start
                .wrapping_sub(offset)
                .wrapping_add(off)
                .wrapping_sub(vaddr),
        )
    }

    fn module_info(&self) -> ExplicitModuleSectionInfo<SectionData> {
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.clone(),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: self.eh_frame.as_ref().map(|(_, d)| d.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            ..Default::default()
        }
    }
}

/// A file's identity: device and inode, and size. The captured files' own identity
/// (cpi-user/src/procmap/captured.rs), so a file read once is found again without its
/// descriptor (no change time: a reopened file is accepted on these alone).
type FileKey = (FileId, u64);

/// An executable file mapping as a module: start, end, file offset and file. A module
/// stays while its mapping is the same (its path may change: deleted, renamed).
type ModuleKey = (u64, u64, u64, Option<FileId>);

fn module_key(m: &Mapping) -> Option<ModuleKey> {
    m.executable_file()
        .then_some((m.start, m.end, m.offset, m.file_id))
}

/// framehop's module generations made so far (each new unwinder and each module added
/// or removed takes the next value of framehop's global `u16` counter): counted here,
/// where every unwinder of this process is changed, at least as often as framehop counts.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

fn generations() -> u64 {
    GENERATIONS.load(Ordering::Relaxed)
}

/// A cache entry is tagged with the generation of the unwinder that wrote it, and framehop's
/// generation is a `u16` shared by all unwinders: an entry outliving 65,536 later
/// generations would answer for a module set it was not made for (at ≈ 1,500 module
/// changes a second under churn, within a minute). A rule cache is therefore replaced
/// once the oldest generation it may hold is this many generations old, and an unwinder
/// whose modules stay unchanged takes a new generation at half of it
/// ([`ProcessUnwinder::refresh`]), so the caches it uses need not be replaced at every
/// use. Half the `u16` range: room for generations counted late.
const GENERATION_SPAN: u64 = 1 << 15;

/// A framehop rule cache and the oldest unwinder generation that has used it.
struct RuleCache {
    cache: Box<CacheX86_64>,
    oldest: u64,
}

impl RuleCache {
    fn new(generation: u64) -> Self {
        RuleCache {
            cache: Box::default(),
            oldest: generation,
        }
    }

    /// The cache, for an unwinder of `generation`; a new one if its entries could be
    /// confused with that generation's after a wrap ([`GENERATION_SPAN`]).
    fn get(&mut self, generation: u64) -> &mut CacheX86_64 {
        self.oldest = self.oldest.min(generation);
        if generations().saturating_sub(self.oldest) >= GENERATION_SPAN {
            *self = RuleCache::new(generation);
        }
        &mut self.cache
    }
}

/// One process's modules and the mappings they were made for.
struct ProcessUnwinder {
    unwinder: UnwinderX86_64<SectionData>,
    /// The generation (a count of [`GENERATIONS`]) `unwinder` was given last.
    generation: u64,
    /// Sorted by start (the maps' order): also where unwinding may continue; what the
    /// module's frames are unwound with.
    modules: Vec<(ModuleKey, ModuleFacts)>,
    /// Address ranges whose mappings changed since the modules were made
    /// ([`StackUnwinder::maps_changed`]).
    pending: Vec<Range<u64>>,
    /// Unwinds so far: a process earns its own rule cache at [`OWN_CACHE_AFTER`].
    unwinds: u64,
    /// Its own rule cache, once it has one.
    cache: Option<RuleCache>,
}

impl ProcessUnwinder {
    fn new() -> Self {
        ProcessUnwinder {
            unwinder: UnwinderX86_64::new(),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
            modules: Vec::new(),
            pending: std::iter::once(0..u64::MAX).collect(),
            unwinds: 0,
            cache: None,
        }
    }

    fn add_module(&mut self, module: Module<SectionData>) {
        self.unwinder.add_module(module);
        self.generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
    }

    fn remove_module(&mut self, start: u64) {
        self.unwinder.remove_module(start);
        self.generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives the unwinder a new generation, its modules unchanged (framehop has no call
    /// for it: a module where no code can be is added and removed), once its generation
    /// is half of [`GENERATION_SPAN`] old.
    fn refresh(&mut self) {
        if generations().saturating_sub(self.generation) >= GENERATION_SPAN / 2 {
            let nowhere = u64::MAX - 1..u64::MAX;
            self.add_module(Module::new(
                String::new(),
                nowhere.clone(),
                nowhere.start,
                ExplicitModuleSectionInfo::default(),
            ));
            self.remove_module(nowhere.start);
        }
    }
}

/// Unwinds after which a process gets a rule cache of its own. framehop's cache is
/// 509 slots, direct-mapped, and a slot written by another process's unwinder is a
/// miss: one cache shared by every process missed on 40 % of frame lookups with two
/// busy processes and a few others sampled (34 % on slots of another module set), and
/// a miss is a search of `.eh_frame_hdr` and an FDE's CFI evaluated (BENCHMARKS.md,
/// "Agent CPU per stack sample"). Processes sampled less (short-lived ones under
/// churn) share one cache.
const OWN_CACHE_AFTER: u64 = 64;

/// Processes with a rule cache of their own at most…
const MAX_OWN_CACHES: usize = 256;

/// …each about this many heap bytes (509 entries of address, generation and rule, and
/// gimli's unwind context).
const OWN_CACHE_BYTES: u64 = 16 << 10;

/// Unwinds between two reads of the resident set ([`StackUnwinder::release_pages`]): a
/// read of `/proc/self/statm` is a few µs, a stack sample ≈ 25 µs of the agent's time
/// (BENCHMARKS.md, "Agent CPU per stack sample"), and a cold unwind touches a few pages
/// per frame.
const RESIDENT_CHECK_EVERY: u32 = 32;

/// Unwinds the copied user stacks of many processes.
pub(crate) struct StackUnwinder {
    sections: HashMap<FileKey, (Option<Arc<Sections>>, u64)>,
    /// Unwind section bytes held ([`Sections::bytes`]), bounded by `byte_bound`…
    bytes: u64,
    /// …of which copied to the heap (the module doc), never more than `byte_bound`.
    copied: u64,
    byte_bound: u64,
    /// The cost check's verdicts, for files read again.
    verdicts: cost::Verdicts,
    tick: u64,
    processes: HashMap<u32, ProcessUnwinder>,
    /// The rule cache of processes without their own.
    cache: RuleCache,
    max_frames: usize,
    /// This process's resident file-backed bytes (`procmap::own_resident`; a fake in
    /// tests), read every [`RESIDENT_CHECK_EVERY`] unwinds…
    resident_file: fn() -> Option<u64>,
    /// …and compared with what it was after the sections' pages were last released.
    resident_base: u64,
    since_check: u32,
    /// Files no process ever held (a recording's, [`Self::for_recordings`]) are opened
    /// by their checked path.
    recorded: bool,
}

impl std::fmt::Debug for StackUnwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackUnwinder")
            .field("files", &self.sections.len())
            .field("bytes", &self.bytes)
            .field("processes", &self.processes.len())
            .finish_non_exhaustive()
    }
}

/// What a [`StackUnwinder`] holds on the heap ([`StackUnwinder::held_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindHeap {
    /// Unwind sections copied (the module doc): within the byte bound together with the
    /// mapped sections' resident pages ([`StackUnwinder::new`]).
    pub copies: u64,
    /// The rest: an entry per file read, rule caches, verdicts.
    pub other: u64,
}

impl UnwindHeap {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.copies + self.other
    }
}

/// Default bound on the unwind section bytes mapped (libc's are ≈ 0.1 MiB, libLLVM's
/// ≈ 10 MiB).
pub(crate) const DEFAULT_BYTE_BOUND: u64 = 64 << 20;

impl StackUnwinder {
    /// At most `max_frames` frames per stack; unwind sections mapped or copied up to
    /// `byte_bound` bytes (files a live process's modules use stay beyond it, until it
    /// leaves), and as many bytes resident between releases ([`Self::release_pages`]):
    /// the copies and the mapped sections' pages together, so a caller reserves
    /// `byte_bound` once for both (cpi-agent/src/lib.rs `symbolizer_bytes`).
    pub fn new(max_frames: usize, byte_bound: u64) -> Self {
        StackUnwinder {
            sections: HashMap::new(),
            bytes: 0,
            copied: 0,
            byte_bound,
            verdicts: cost::Verdicts::default(),
            tick: 0,
            processes: HashMap::new(),
            cache: RuleCache::new(generations()),
            max_frames,
            resident_file: || crate::procmap::own_resident().map(|r| r.file),
            resident_base: 0,
            since_check: 0,
            recorded: false,
        }
    }

    /// [`Self::new`] for stacks recorded elsewhere (perf's `--call-graph dwarf`,
    /// cpi-user/src/import/unwound.rs): no file is captured, so each mapping's file is
    /// opened by its path (the local copy import located) and used only if it is the
    /// file the mapping names (`Mapping::file_id`).
    pub(crate) fn for_recordings(max_frames: usize, byte_bound: u64) -> Self {
        StackUnwinder {
            recorded: true,
            ..Self::new(max_frames, byte_bound)
        }
    }

    /// Heap bytes held: the copied unwind sections, and the files' entries, the
    /// processes' own rule caches and the cost check's verdicts.
    pub(crate) fn held_bytes(&self) -> UnwindHeap {
        UnwindHeap {
            copies: self.copied,
            other: self.sections.len() as u64 * ENTRY_HEAP_BYTES
                + self.own_caches() as u64 * OWN_CACHE_BYTES
                + self.verdicts.held_bytes(),
        }
    }

    /// Processes with a rule cache of their own.
    fn own_caches(&self) -> usize {
        self.processes
            .values()
            .filter(|p| p.cache.is_some())
            .count()
    }

    /// Drops the pages of the unwind sections read since the last call from this
    /// process's resident set (each file whose sections framehop read): they stay in
    /// the page cache, so a later lookup there is
    /// a minor fault (cpi-user/src/fsafe/sys/map.rs `GuardedMap::dont_need`). Called at the
    /// end of each window, and whenever the file pages resident since the last call
    /// and the copies exceed the byte bound: a binary's `.eh_frame` is used in place,
    /// and the pages a window's lookups touch in a compiler's 100+ MB of libraries would
    /// otherwise stay in the resident set an operator reads (BENCHMARKS.md, "Agent
    /// memory on a build host").
    pub(crate) fn release_pages(&mut self) {
        for (s, _) in self.sections.values() {
            if let Some(Backing::Mapped(map)) = s
                .as_ref()
                .filter(|s| s.touched.swap(false, Ordering::Relaxed))
                .map(|s| &s.backing)
            {
                if let Err(e) = map.dont_need() {
                    log::debug!("unwind sections: madvise(MADV_DONTNEED): {e}");
                }
            }
        }
        self.resident_base = (self.resident_file)().unwrap_or(0);
        self.since_check = 0;
    }

    /// [`Self::release_pages`] when the resident file pages grew past what the byte
    /// bound leaves beside the copies since the last release (checked every
    /// [`RESIDENT_CHECK_EVERY`] unwinds).
    fn bound_resident(&mut self) {
        self.since_check += 1;
        if self.since_check < RESIDENT_CHECK_EVERY {
            return;
        }
        self.since_check = 0;
        let now = (self.resident_file)().unwrap_or(0);
        if now.saturating_sub(self.resident_base) + self.copied > self.byte_bound {
            self.release_pages();
        }
    }

    /// Drops what is held for processes `keep` says are gone.
    pub fn retain_processes(&mut self, keep: impl Fn(u32) -> bool) {
        self.processes.retain(|pid, _| keep(*pid));
    }

    /// Says that `pid`'s mappings in `changed` (new ones, and what they replaced) are
    /// not what they were: its next unwind remakes the modules there, and only there.
    /// (Comparing the maps at every sample, then all modules at every change, cost
    /// passes over a process's 25 000 mappings.)
    pub(crate) fn maps_changed(&mut self, pid: u32, changed: impl IntoIterator<Item = Range<u64>>) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.pending.extend(changed);
        }
    }

    /// Whether `pid`'s modules are made and none of its mappings changed since.
    pub(crate) fn prepared(&self, pid: u32) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(|p| p.pending.is_empty())
    }

    /// Makes `pid`'s modules from `maps` where they changed since [`Self::unwind`] last
    /// used them (at first, all): work done once per change of its mappings, with
    /// the first read of each file's unwind sections (cost.rs decodes them all), not
    /// per sample. [`Self::unwind`] does it itself; a caller that times the unwinding
    /// of samples calls it first (cpi-user/src/collect/drain.rs `UNWIND_PER_PASS`).
    pub(crate) fn prepare(
        &mut self,
        pid: u32,
        maps: &ProcessMaps,
        files: &HashMap<u64, Arc<CapturedFile>>,
    ) {
        if !self.prepared(pid) {
            // Out of the map while `update` borrows the file cache: once per change of
            // the process's mappings, not per sample, beside the files that change reads.
            let mut p = self
                .processes
                .remove(&pid)
                .unwrap_or_else(ProcessUnwinder::new);
            self.update(&mut p, pid, maps, files);
            self.processes.insert(pid, p);
        }
    }

    /// Unwinds one sample of `pid` whose mappings are `maps` and whose captured files
    /// are `files` (by mapping start). The modules are made from `maps` at `pid`'s first
    /// unwind, and remade where [`Self::maps_changed`] said.
    pub fn unwind(
        &mut self,
        pid: u32,
        maps: &ProcessMaps,
        files: &HashMap<u64, Arc<CapturedFile>>,
        regs: UserRegs,
        stack: &[u8],
        copied_in_full: bool,
    ) -> UnwoundStack {
        self.prepare(pid, maps, files);
        // Counted only every OWN_CACHE_AFTER unwinds of a process without one: a pass
        // over the processes, not one per sample.
        let earned =
            self.processes.get(&pid).is_some_and(|p| {
                p.cache.is_none() && (p.unwinds + 1).is_multiple_of(OWN_CACHE_AFTER)
            }) && self.own_caches() < MAX_OWN_CACHES;
        let proc = self.processes.get_mut(&pid).expect("inserted above");
        proc.unwinds += 1;
        proc.refresh();
        if earned {
            proc.cache = Some(RuleCache::new(proc.generation));
        }
        let proc = &mut *proc;
        let cache = match &mut proc.cache {
            Some(c) => c.get(proc.generation),
            None => self.cache.get(proc.generation),
        };
        // The rules of the module `a` is in.
        let module_of = |a: u64| {
            let i = proc.modules.partition_point(|(m, _)| m.0 <= a);
            let (m, facts) = proc.modules.get(i.checked_sub(1)?)?;
            (m.0..m.1).contains(&a).then_some(*facts)
        };
        let mut last = None;
        let end = regs.sp.saturating_add(stack.len() as u64);
        let mut used = 0;
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(regs.sp).ok_or(())? as usize;
            let b = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            used = used.max(off + 8);
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
        };
        let mut frames = Vec::new();
        let mut it = proc.unwinder.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            cache,
            &mut read,
        );
        let stop = loop {
            match it.next() {
                Ok(Some(f)) => {
                    frames.push(f.address());
                    let lookup = match f {
                        FrameAddress::InstructionPointer(a) => a,
                        FrameAddress::ReturnAddress(_) => f.address_for_lookup(),
                    };
                    let facts = module_of(lookup);
                    last = facts.map(|m| m.rules);
                    match facts {
                        None => break Stop::UnknownCode,
                        Some(m) if m.at_entry(lookup) => break Stop::Root,
                        // The next step would evaluate this frame's rules.
                        Some(m) if m.rules == Rules::Costly => break Stop::CostlyRules,
                        Some(_) => {}
                    }
                    if frames.len() >= self.max_frames {
                        break Stop::FrameLimit;
                    }
                }
                Ok(None) if last == Some(Rules::Unread) => break Stop::Unread,
                Ok(None) => break Stop::Root,
                Err(FrameError::CouldNotReadStack(a)) => {
                    break if copied_in_full && a >= end {
                        Stop::EndOfCopy
                    } else {
                        Stop::Unreadable
                    }
                }
                Err(_) => break Stop::BadUnwind,
            }
        };
        self.bound_resident();
        UnwoundStack { frames, stop, used }
    }

    /// Brings `p`'s modules to `maps` where they changed (`p.pending`): the modules
    /// there are removed, those of the executable file mappings there now added (a
    /// process with 25 000 mappings that maps one more adds one module).
    fn update(
        &mut self,
        p: &mut ProcessUnwinder,
        pid: u32,
        maps: &ProcessMaps,
        files: &HashMap<u64, Arc<CapturedFile>>,
    ) {
        let pending = std::mem::take(&mut p.pending);
        for r in &pending {
            let lo = p.modules.partition_point(|(k, _)| k.1 <= r.start);
            let hi = lo + p.modules[lo..].partition_point(|(k, _)| k.0 < r.end);
            for (k, _) in p.modules.drain(lo..hi).collect::<Vec<_>>() {
                p.remove_module(k.0);
            }
        }
        for r in &pending {
            let lo = maps.mappings.partition_point(|m| m.end <= r.start);
            for m in maps.mappings[lo..].iter().take_while(|m| m.start < r.end) {
                let Some(k) = module_key(m) else { continue };
                if let Err(i) = p.modules.binary_search_by_key(&k, |(k, _)| *k) {
                    let (module, facts) = self.module(pid, m, files);
                    p.modules.insert(i, (k, facts));
                    p.add_module(module);
                }
            }
        }
        self.evict(0);
    }

    /// The module of executable file mapping `m`: its unwind sections, else frame
    /// pointers; and what its frames are unwound with (rules that cost too much to
    /// evaluate are not given to framehop either).
    fn module(
        &mut self,
        pid: u32,
        m: &Mapping,
        files: &HashMap<u64, Arc<CapturedFile>>,
    ) -> (Module<SectionData>, ModuleFacts) {
        let path = match &m.object {
            MappedObject::File { path, .. } => path.as_path(),
            _ => std::path::Path::new(""),
        };
        // Sections already read are found by the captured identity; only a file not
        // read yet is opened, and one whose descriptor the LRU closed reopened by its
        // checked path.
        let captured = files.get(&m.start);
        let sections = match captured.and_then(|c| self.cached((c.id, c.len))) {
            Some(s) => s,
            None => {
                let file = match captured {
                    Some(c) => c.open(pid, m, path, true).ok(),
                    None if self.recorded && m.file_id.is_some() => {
                        open_mapped_file(pid, m, path, false, None)
                            .ok()
                            .map(Arc::new)
                    }
                    None => None,
                };
                file.and_then(|f| self.sections_of(&f, path))
            }
        };
        let costly = sections.as_ref().is_some_and(|s| s.costly.is_some());
        let (base, info, rules) = match sections
            .as_ref()
            .filter(|_| !costly)
            .and_then(|s| Some((s.base_avma(m.start, m.offset)?, s.module_info())))
        {
            Some((base, info)) => (base, info, Rules::Read),
            // No unwind information: frame pointers.
            None => (
                m.start,
                ExplicitModuleSectionInfo::default(),
                if costly { Rules::Costly } else { Rules::Unread },
            ),
        };
        let module = Module::new(path.display().to_string(), m.start..m.end, base, info);
        let entry = (rules == Rules::Read)
            .then(|| sections.as_ref()?.entry)
            .flatten()
            .map(|e| base.wrapping_add(e));
        (module, ModuleFacts { rules, entry })
    }

    /// The sections read for file `key` (`Some(None)`: it has none), a use.
    fn cached(&mut self, key: FileKey) -> Option<Option<Arc<Sections>>> {
        self.tick += 1;
        let (s, used) = self.sections.get_mut(&key)?;
        *used = self.tick;
        Some(s.clone())
    }

    fn sections_of(&mut self, file: &File, path: &Path) -> Option<Arc<Sections>> {
        let meta = file.metadata().ok()?;
        let key = (FileId::of(&meta), meta.len());
        if let Some(s) = self.cached(key) {
            return s;
        }
        crate::binary::work::unwind_read();
        log::debug!(
            "unwind tables: reading {} (device {}, inode {})",
            crate::fsafe::escape(&path.to_string_lossy()),
            key.0.dev,
            key.0.ino
        );
        let mut s = Sections::read(file, &mut self.verdicts).map(Arc::new);
        if let Some(copy) = s.as_ref().and_then(|s| s.copied_bytes()) {
            self.evict(copy);
            if self.copied + copy > self.byte_bound {
                // Files in use hold the copies: this one's frames by frame pointers.
                log::debug!(
                    "unwind sections: {copy} bytes to copy, {} copied already: not used",
                    self.copied
                );
                s = None;
            }
        }
        self.bytes += s.as_ref().map_or(0, |s| s.bytes);
        self.copied += s.as_ref().and_then(|s| s.copied_bytes()).unwrap_or(0);
        self.sections.insert(key, (s.clone(), self.tick));
        s
    }

    /// Least recently used files out until under the bounds with `room` bytes more, in
    /// one pass (one scan per file evicted made a process with 25 000 files quadratic).
    fn evict(&mut self, room: u64) {
        // Without room asked for, one file stays however large: the one just read.
        let keep = usize::from(room == 0);
        let over = |u: &Self| {
            (u.bytes + room > u.byte_bound && u.sections.len() > keep)
                || u.sections.len() > MAX_FILES
        };
        if !over(self) {
            return;
        }
        let mut by_use: Vec<(u64, FileKey)> = self
            .sections
            .iter()
            .map(|(&key, &(_, used))| (used, key))
            .collect();
        by_use.sort_unstable();
        for (_, key) in by_use {
            if !over(self) {
                break;
            }
            // A file a process's modules still use stays: dropping it here would map it
            // again for the next process, one more mapping of the same pages in the
            // resident set for as long as the first lives (seen: five of
            // `librustc_driver` while builds ran), and out of reach of `release_pages`.
            if self.sections[&key].0.as_ref().is_some_and(|s| s.in_use()) {
                continue;
            }
            if let Some((s, _)) = self.sections.remove(&key) {
                self.bytes -= s.as_ref().map_or(0, |s| s.bytes);
                self.copied -= s.as_ref().and_then(|s| s.copied_bytes()).unwrap_or(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::procmap::Mapping;

    const BASE: u64 = 0x5555_0000_0000;
    const SP: u64 = 0x7ffc_0000_0000;

    /// A process with one executable mapping of `file` at [`BASE`] (or of anonymous
    /// memory when `None`), its file captured as the collector captures it (through a
    /// `map_files` link in a fake `/proc/PID`).
    fn process(file: Option<&Path>) -> (ProcessMaps, HashMap<u64, Arc<CapturedFile>>) {
        process_in(&mut crate::procmap::CapturedFiles::default(), file)
    }

    /// [`process`], its file captured into `captured`.
    fn process_in(
        captured: &mut crate::procmap::CapturedFiles,
        file: Option<&Path>,
    ) -> (ProcessMaps, HashMap<u64, Arc<CapturedFile>>) {
        let len = file.map_or(0x1000, |p| std::fs::metadata(p).unwrap().len().max(0x1000));
        let object = match file {
            Some(p) => MappedObject::File {
                path: p.to_path_buf(),
                deleted: false,
            },
            None => MappedObject::Anon,
        };
        let maps = ProcessMaps {
            mappings: vec![Mapping {
                start: BASE,
                end: BASE + len,
                offset: 0,
                executable: true,
                object,
                file_id: None,
            }],
        };
        let Some(p) = file else {
            return (maps, HashMap::new());
        };
        let proc_dir = p.with_extension("proc");
        let _ = std::fs::remove_dir_all(&proc_dir);
        std::fs::create_dir_all(proc_dir.join("map_files")).unwrap();
        std::os::unix::fs::symlink(
            p,
            proc_dir.join(format!("map_files/{BASE:x}-{:x}", BASE + len)),
        )
        .unwrap();
        let files = captured.capture(&proc_dir, &maps.mappings);
        assert_eq!(files.len(), 1, "captured");
        (maps, files)
    }

    fn stack_of(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A file of `bytes` of its own: a path per call, so tests running at once never
    /// share one (two writing `true-no-eh-frame` and its `.proc` directory, one removing
    /// the other's link, failed a capture under load).
    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cpi-unwind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("{name}-{n}"));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    /// Rebuilding a process's unwinder (its maps changed) reopened every file
    /// whose descriptor the LRU had closed, cached sections or not (about 20 000 reopens
    /// per rebuild for a process with 25 000 mappings). The sections read before the
    /// eviction are used without a reopen.
    #[test]
    fn a_rebuild_reopens_no_evicted_file_whose_sections_are_cached() {
        let exe = std::env::current_exe().unwrap();
        let mut captured = crate::procmap::CapturedFiles::with_cap(1);
        let counter = captured.counter();
        let (maps, files) = process_in(&mut captured, Some(&exe));
        let pid = std::process::id();
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: 0,
        };
        let stack = stack_of(&[0, 0]);
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        u.unwind(pid, &maps, &files, regs, &stack, true);
        assert!(
            u.held_bytes().other > 0,
            "the executable's sections were read"
        );
        // A second file past the cap of one closes the first one's descriptor.
        let _other = process_in(&mut captured, Some(&temp("other", b"not an ELF file")));
        assert_eq!(counter.counts().evicted, 1);
        // The process mapped something more: its unwinder is rebuilt.
        let mut grown = maps.clone();
        grown.mappings.push(Mapping {
            start: BASE + (1 << 30),
            end: BASE + (1 << 30) + 0x1000,
            offset: 0,
            executable: true,
            object: MappedObject::Anon,
            file_id: None,
        });
        let added = grown.mappings.last().unwrap();
        u.maps_changed(pid, std::iter::once(added.start..added.end));
        u.unwind(pid, &grown, &files, regs, &stack, true);
        assert_eq!(counter.counts().reopened, 0, "{:?}", counter.counts());
        assert_eq!(counter.counts().reopen_failed, 0);
        // A file not read yet is still reopened by its checked path.
        let mut fresh = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        fresh.unwind(pid, &grown, &files, regs, &stack, true);
        assert_eq!(counter.counts().reopened, 1, "{:?}", counter.counts());
    }

    /// A recording's binaries were never captured: [`StackUnwinder::for_recordings`]
    /// opens each by its path, and only when it is the file the mapping names.
    #[test]
    fn recorded_binaries_are_opened_by_their_checked_path() {
        let exe = std::env::current_exe().unwrap();
        let (mut maps, _) = process(None);
        maps.mappings[0].object = MappedObject::File {
            path: exe.clone(),
            deleted: false,
        };
        let this = FileId::of(&std::fs::metadata(&exe).unwrap());
        let other = FileId::of(&std::fs::metadata("/usr/bin/true").unwrap());
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: 0,
        };
        let mut held = |u: &mut StackUnwinder, id| {
            maps.mappings[0].file_id = Some(id);
            u.unwind(1, &maps, &HashMap::new(), regs, &stack_of(&[0, 0]), true);
            u.held_bytes().total()
        };
        let recorded = || StackUnwinder::for_recordings(128, DEFAULT_BYTE_BOUND);
        assert!(held(&mut recorded(), this) > 0, "read by its path");
        assert_eq!(held(&mut recorded(), other), 0, "another file at the path");
        let live = &mut StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        assert_eq!(held(live, this), 0, "live: only captured files");
    }

    /// A process's own rule cache, and the cache processes share, give the frames a
    /// cold unwinder gives: sample after sample, two processes alternating, the stack
    /// bytes changing between rounds.
    #[test]
    fn rule_caches_give_the_frames_a_cold_unwinder_gives() {
        let file = temp("true-copy", &std::fs::read("/usr/bin/true").unwrap());
        let text = {
            let bytes = std::fs::read(&file).unwrap();
            let f = object::File::parse(&*bytes).unwrap();
            let t = f.section_by_name(".text").unwrap();
            (t.address(), t.size())
        };
        let (maps, files) = process(Some(&file));
        let mut warm = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        let mut deeper = 0;
        for round in 0..3u64 {
            // Return addresses into the code and frame pointers up the stack.
            let words: Vec<u64> = (0..64u64)
                .map(|i| match (i + round) % 3 {
                    0 => BASE + text.0 + (i * 37 + round * 101) % text.1,
                    1 => SP + 8 * (i + 2),
                    _ => i,
                })
                .collect();
            let stack = stack_of(&words);
            for ip in (0..text.1.min(0x800))
                .step_by(16)
                .map(|o| BASE + text.0 + o)
            {
                for pid in [1, 2] {
                    let regs = UserRegs {
                        ip,
                        sp: SP,
                        bp: SP + 8,
                    };
                    let got = warm.unwind(pid, &maps, &files, regs, &stack, true);
                    let cold = StackUnwinder::new(128, DEFAULT_BYTE_BOUND)
                        .unwind(pid, &maps, &files, regs, &stack, true);
                    assert_eq!(got, cold, "round {round}, pid {pid}, ip {ip:x}");
                    deeper += usize::from(got.frames.len() > 1);
                }
            }
        }
        assert_eq!(
            warm.own_caches(),
            2,
            "both processes earned their own cache"
        );
        assert!(deeper > 0, "no unwind went past the first frame");
    }

    /// framehop tags rule-cache entries with a `u16` generation shared by all unwinders,
    /// so no cache may hold entries 65,536 generations apart ([`GENERATION_SPAN`]). One
    /// process's module is replaced by another file at the same address at every sample,
    /// past 2^16 generations, while a second process's modules never change: every
    /// unwind gives the frames a cold unwinder gives, and no cache in use spans the
    /// range.
    #[test]
    fn rule_caches_are_replaced_before_generations_wrap() {
        let (a, b) = (
            temp("gen-true", &std::fs::read("/usr/bin/true").unwrap()),
            temp("gen-false", &std::fs::read("/usr/bin/false").unwrap()),
        );
        let layouts = [process(Some(&a)), process(Some(&b))];
        let text = |p: &Path| {
            let bytes = std::fs::read(p).unwrap();
            let f = object::File::parse(&*bytes).unwrap();
            f.section_by_name(".text").unwrap().address()
        };
        let ip = BASE + text(&a).max(text(&b)) + 0x40;
        let regs = UserRegs {
            ip,
            sp: SP,
            bp: SP + 8,
        };
        let stack = stack_of(&[SP + 16, ip, SP + 24, ip + 0x10, 0, 0]);
        let cold: Vec<_> = layouts
            .iter()
            .map(|(maps, files)| {
                StackUnwinder::new(128, DEFAULT_BYTE_BOUND)
                    .unwind(1, maps, files, regs, &stack, true)
            })
            .collect();
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        let start = generations();
        let mut replaced = 0;
        let mut oldest = 0;
        let mut round = 0usize;
        while generations() - start < 3 << 16 {
            let (maps, files) = &layouts[round % 2];
            u.maps_changed(1, std::iter::once(0..u64::MAX));
            let got = u.unwind(1, maps, files, regs, &stack, true);
            assert_eq!(got, cold[round % 2], "round {round}");
            // The cache each unwind used: the process's own, else the shared one.
            let used = |u: &StackUnwinder, pid| {
                u.processes[&pid].cache.as_ref().unwrap_or(&u.cache).oldest
            };
            assert!(generations() - used(&u, 1) < 1 << 16, "round {round}");
            if round.is_multiple_of(1024) {
                let (maps, files) = &layouts[0];
                assert_eq!(u.unwind(2, maps, files, regs, &stack, true), cold[0]);
                assert!(generations() - used(&u, 2) < 1 << 16, "round {round}");
            }
            let own = u.processes[&1].cache.as_ref().map_or(0, |c| c.oldest);
            replaced += usize::from(own > oldest);
            oldest = own;
            round += 1;
        }
        assert!(
            replaced > 2,
            "the process's cache was replaced {replaced} times"
        );
    }

    /// A file whose unwind rules no compiler writes (here one FDE's rule is a DWARF
    /// expression that branches back to itself: evaluated, it would never end) is
    /// never evaluated: the stack ends at the frame in it, flagged, and nothing is
    /// invented past it. The same file unchanged unwinds as before.
    #[test]
    fn a_file_with_costly_rules_ends_the_stack_at_its_frame() {
        let good = std::fs::read("/usr/bin/true").expect("Debian's /usr/bin/true");
        let mut bad = good.clone();
        let (text, eh) = {
            let f = object::File::parse(&*good).unwrap();
            let eh = f.section_by_name(".eh_frame").unwrap();
            let text = f.section_by_name(".text").unwrap().address();
            (text, (eh.file_range().unwrap().0 as usize, eh.address()))
        };
        // The first FDE with room: its instructions (after length, CIE pointer, address,
        // range and an empty augmentation: `zR`) become DW_CFA_def_cfa_expression
        // [DW_OP_skip -3], then DW_CFA_nop.
        let section = gimli::EhFrame::new(&good[eh.0..], gimli::LittleEndian);
        let bases = gimli::BaseAddresses::default().set_eh_frame(eh.1);
        let mut entries = gimli::UnwindSection::entries(&section, &bases);
        let fde = std::iter::from_fn(|| entries.next().unwrap())
            .find_map(|e| match e {
                gimli::CieOrFde::Fde(f) if f.entry_len() >= 24 => Some(f),
                _ => None,
            })
            .expect("an FDE");
        let (at, len) = (eh.0 + fde.offset(), fde.entry_len());
        bad[at + 17..at + 4 + len].fill(0);
        bad[at + 17..at + 22].copy_from_slice(&[0x0f, 3, 0x2f, 0xfd, 0xff]);
        let regs = UserRegs {
            ip: BASE + text + 0x40,
            sp: SP,
            bp: SP + 8,
        };
        let stack = stack_of(&[SP + 16, BASE + text + 0x80, 0, 0]);
        let unwind = |name: &str, bytes: &[u8]| {
            let (maps, files) = process(Some(&temp(name, bytes)));
            let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
            u.unwind(1, &maps, &files, regs, &stack, true)
        };
        let costly = unwind("true-costly", &bad);
        assert_eq!(
            (costly.frames, costly.stop),
            (vec![regs.ip], Stop::CostlyRules)
        );
        assert_ne!(unwind("true-fine", &good).stop, Stop::CostlyRules);
    }

    /// Checked rules are the evaluated rules: a file others than root can change is unwound from a copy of its
    /// sections made before they were checked: rewritten in place afterwards (same
    /// length, `.eh_frame` zeroed here), it unwinds as it did when read. From the
    /// mapping, the second process's unwind read the zeros and stopped.
    #[test]
    fn sections_rewritten_after_the_check_are_not_evaluated() {
        use std::os::unix::fs::FileExt;
        let good = std::fs::read("/usr/bin/true").expect("Debian's /usr/bin/true");
        let (text, eh) = {
            let f = object::File::parse(&*good).unwrap();
            let eh = f
                .section_by_name(".eh_frame")
                .unwrap()
                .file_range()
                .unwrap();
            (f.section_by_name(".text").unwrap().address(), eh)
        };
        let file = temp("true-rewritten", &good);
        // Another user's file (when the tests run as root; else the tester's own).
        if crate::fsafe::euid() == 0 {
            std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        }
        let (maps, files) = process(Some(&file));
        let regs = UserRegs {
            ip: BASE + text + 0x40,
            sp: SP,
            bp: SP + 8,
        };
        let stack = stack_of(&[SP + 16, BASE + text + 0x80, 0, 0]);
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        let before = u.unwind(1, &maps, &files, regs, &stack, true);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .write_all_at(&vec![0; eh.1 as usize], eh.0)
            .unwrap();
        // Another process, so no rule cached for the first answers.
        assert_eq!(u.unwind(2, &maps, &files, regs, &stack, true), before);
        assert!(u.held_bytes().copies >= eh.1, "the sections were copied");
    }

    /// Copies count in the byte bound: a file whose copy would pass it is unwound by
    /// frame pointers, and the copy of a file no process uses any more is dropped for
    /// the next file's.
    #[test]
    fn copied_sections_stay_within_the_byte_bound() {
        let copy = |name: &str, from: &str| {
            let p = temp(name, &std::fs::read(from).unwrap());
            if crate::fsafe::euid() == 0 {
                std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            }
            let bytes = std::fs::read(&p).unwrap();
            let f = object::File::parse(&*bytes).unwrap();
            let unwind = [".eh_frame", ".eh_frame_hdr"]
                .iter()
                .map(|n| f.section_by_name(n).unwrap().size())
                .sum::<u64>();
            (process(Some(&p)), unwind)
        };
        let (a, a_bytes) = copy("bound-true", "/usr/bin/true");
        let (b, b_bytes) = copy("bound-false", "/usr/bin/false");
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: 0,
        };
        let stack = stack_of(&[0, 0]);
        let bound = a_bytes.max(b_bytes);
        assert!(bound < a_bytes + b_bytes);
        let mut u = StackUnwinder::new(128, bound);
        u.unwind(1, &a.0, &a.1, regs, &stack, true);
        assert_eq!(u.held_bytes().copies, a_bytes, "a copied");
        // Process 1 still uses a: b's copy would pass the bound.
        u.unwind(2, &b.0, &b.1, regs, &stack, true);
        assert_eq!(u.held_bytes().copies, a_bytes, "b refused");
        // Once both are gone, a's copy makes room for b's.
        u.retain_processes(|_| false);
        let mut v = StackUnwinder::new(128, bound);
        v.unwind(1, &a.0, &a.1, regs, &stack, true);
        v.retain_processes(|_| false);
        v.unwind(2, &b.0, &b.1, regs, &stack, true);
        assert_eq!(v.held_bytes().copies, b_bytes, "a evicted, b copied");
    }

    /// The copies and the mapped sections' resident pages share one bound: pages are
    /// released once they grow past what the copies leave of it.
    #[test]
    fn copies_count_in_the_bound_on_resident_pages() {
        static RESIDENT: AtomicU64 = AtomicU64::new(0);
        let p = temp("resident-true", &std::fs::read("/usr/bin/true").unwrap());
        if crate::fsafe::euid() == 0 {
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        }
        let (maps, files) = process(Some(&p));
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: 0,
        };
        let stack = stack_of(&[0, 0]);
        let grown_by = |room: i64| {
            let mut u = StackUnwinder::new(128, 1 << 20);
            u.resident_file = || Some(RESIDENT.load(Ordering::Relaxed));
            RESIDENT.store(0, Ordering::Relaxed);
            u.unwind(1, &maps, &files, regs, &stack, true);
            let copies = u.held_bytes().copies;
            assert!(copies > 0, "another user's file is copied");
            let left = (1 << 20) - copies;
            RESIDENT.store(left.saturating_add_signed(room), Ordering::Relaxed);
            for _ in 0..RESIDENT_CHECK_EVERY {
                u.unwind(1, &maps, &files, regs, &stack, true);
            }
            u.resident_base > 0
        };
        assert!(grown_by(4096), "past what the copies leave: released");
        assert!(!grown_by(-4096), "within it: kept");
    }

    #[test]
    fn jit_code_ends_the_stack_at_its_frame() {
        let (maps, files) = process(None);
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        let regs = UserRegs {
            ip: BASE + 0x10,
            sp: SP,
            bp: SP,
        };
        let got = u.unwind(1, &maps, &files, regs, &stack_of(&[0; 8]), false);
        assert_eq!(
            (got.frames, got.stop),
            (vec![BASE + 0x10], Stop::UnknownCode)
        );
    }

    /// A zero frame pointer ends the stack as complete only in a file read and found
    /// without unwind sections (built with frame pointers); in a file not read — not
    /// captured, or not an ELF file — `rbp` may hold anything, and the stack may go on.
    #[test]
    fn a_zero_frame_pointer_is_the_root_only_in_a_file_read() {
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: 0,
        };
        let stack = stack_of(&[0; 8]);
        let stop = |maps: &ProcessMaps, files: &HashMap<u64, Arc<CapturedFile>>| {
            let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
            let got = u.unwind(1, maps, files, regs, &stack, true);
            (got.frames, got.stop)
        };
        let (maps, files) = process(Some(&without_unwind_sections()));
        assert_eq!(stop(&maps, &files), (vec![BASE + 0x100], Stop::Root));
        assert_eq!(
            stop(&maps, &HashMap::new()),
            (vec![BASE + 0x100], Stop::Unread),
            "not captured"
        );
        let (maps, files) = process(Some(&temp("not-elf-3", &[0x90; 0x2000])));
        assert_eq!(stop(&maps, &files), (vec![BASE + 0x100], Stop::Unread));
    }

    /// `/usr/bin/true` without its unwind sections: frames in it are walked by frame
    /// pointers, and a zero frame pointer is the root.
    fn without_unwind_sections() -> std::path::PathBuf {
        let bare = temp("true-no-eh-frame", b"");
        let out = std::process::Command::new("objcopy")
            .args(["--remove-section", ".eh_frame", "--remove-section"])
            .args([".eh_frame_hdr", "/usr/bin/true"])
            .arg(&bare)
            .output()
            .expect("binutils' objcopy");
        assert!(out.status.success(), "{out:?}");
        bare
    }

    /// How much of its copy a stack used (what the kernel side's cap on the copy is
    /// chosen from, cpi-user/src/collect/stack_caps.rs): up to the end of the farthest
    /// word read; a copy shorter than that ends it as cut, or unreadable.
    #[test]
    fn an_unwound_stack_says_how_much_of_its_copy_it_read() {
        let (maps, files) = process(Some(&without_unwind_sections()));
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: SP + 16,
        };
        // Two frames by frame pointers: (saved rbp, return address) at SP+16 and SP+48.
        let words = [9, 9, SP + 48, BASE + 0x200, 9, 9, 0, BASE + 0x300, 9, 9];
        let stack = stack_of(&words);
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        let whole = u.unwind(1, &maps, &files, regs, &stack, true);
        let frames = vec![BASE + 0x100, BASE + 0x200, BASE + 0x300];
        assert_eq!(whole.frames, frames);
        assert_eq!((whole.stop, whole.used), (Stop::Root, 64));
        let cut = u.unwind(1, &maps, &files, regs, &stack[..48], true);
        assert_eq!((cut.stop, cut.used), (Stop::EndOfCopy, 32));
        assert_eq!(cut.frames, frames[..2]);
        let short = u.unwind(1, &maps, &files, regs, &stack[..48], false);
        assert_eq!((short.stop, short.used), (Stop::Unreadable, 32));
    }

    /// The kernel starts a program at its entry point with no return address: a frame
    /// there is the root. Debian 12's ld.so has no FDE for its `_start`, so frame
    /// pointers past `_dl_start`'s return into it read whatever `rbp` held: 70 % of a
    /// short-lived program's stacks ended as bad unwinds.
    #[test]
    fn a_frame_in_the_entry_function_is_the_root() {
        let ld = Path::new("/lib64/ld-linux-x86-64.so.2");
        let bytes = std::fs::read(ld).unwrap();
        let entry = object::read::elf::ElfFile64::<object::Endianness>::parse(&*bytes)
            .unwrap()
            .entry();
        let (maps, files) = process(Some(ld));
        // `_start`: mov %rsp,%rdi; call _dl_start.
        let call = &bytes[entry as usize + 3..entry as usize + 8];
        assert_eq!(call[0], 0xe8, "ld.so's _start calls _dl_start at +3");
        let rel = i32::from_le_bytes(call[1..].try_into().unwrap());
        let dl_start = (entry + 8).wrapping_add_signed(rel.into());
        // A frame pointer below the stack: what frame-pointer unwinding would read.
        let unwind = |ip: u64| {
            let regs = UserRegs {
                ip,
                sp: SP,
                bp: SP - 0x100,
            };
            let stack = stack_of(&[BASE + entry + 8, 0, 0, 0]);
            let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
            let got = u.unwind(1, &maps, &files, regs, &stack, true);
            (got.frames, got.stop)
        };
        // At _dl_start's first instruction the return address is at the stack pointer.
        assert_eq!(
            unwind(BASE + dl_start),
            (vec![BASE + dl_start, BASE + entry + 8], Stop::Root)
        );
        assert_eq!(
            unwind(BASE + entry + 3),
            (vec![BASE + entry + 3], Stop::Root)
        );
    }

    #[test]
    fn a_frame_pointer_cycle_stops_as_a_bad_unwind() {
        // Not an ELF file: frames are walked by frame pointers. The saved frame pointer
        // points at itself, the return address back into the same code.
        let file = temp("not-elf", &[0x90; 0x2000]);
        let (maps, files) = process(Some(&file));
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: SP,
        };
        let stack = stack_of(&[SP, BASE + 0x200, SP, BASE + 0x200]);
        let UnwoundStack { frames, stop, .. } = u.unwind(1, &maps, &files, regs, &stack, false);
        assert!(frames.len() <= 3, "{frames:x?}");
        assert_eq!(stop, Stop::BadUnwind, "{frames:x?}");
    }

    #[test]
    fn an_unreadable_stack_stops_as_unreadable() {
        let file = temp("not-elf-2", &[0x90; 0x2000]);
        let (maps, files) = process(Some(&file));
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        let regs = UserRegs {
            ip: BASE + 0x100,
            sp: SP,
            bp: SP + 64,
        };
        let UnwoundStack { frames, stop, .. } = u.unwind(1, &maps, &files, regs, &[], false);
        assert_eq!((frames, stop), (vec![BASE + 0x100], Stop::Unreadable));
    }

    #[test]
    fn corrupt_eh_frame_never_panics_loops_or_claims_a_complete_stack() {
        let mut elf = std::fs::read("/usr/bin/true").expect("Debian's /usr/bin/true");
        let (eh, text, entry) = {
            let f = object::File::parse(&*elf).unwrap();
            let eh = f
                .section_by_name(".eh_frame")
                .unwrap()
                .file_range()
                .unwrap();
            let text = f.section_by_name(".text").unwrap().address();
            (eh, text, f.entry())
        };
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for b in &mut elf[eh.0 as usize..(eh.0 + eh.1) as usize] {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        let file = temp("true-corrupt", &elf);
        let (maps, files) = process(Some(&file));
        let mut u = StackUnwinder::new(128, DEFAULT_BYTE_BOUND);
        // Every 16th address of the code, against a stack of return addresses into it;
        // not the entry function, a root by the ELF header whatever the CFI says.
        let stack = stack_of(&[BASE + text + 0x40; 64]);
        let code = (0..0x400).step_by(16).map(|o| text + o);
        for ip in code
            .filter(|a| !(entry..entry + ENTRY_SPAN).contains(a))
            .map(|a| BASE + a)
        {
            let regs = UserRegs {
                ip,
                sp: SP,
                bp: SP + 8,
            };
            let UnwoundStack { frames, stop, .. } = u.unwind(1, &maps, &files, regs, &stack, true);
            assert!(!frames.is_empty() && frames.len() <= 128, "{frames:x?}");
            assert_ne!(stop, Stop::Root, "{ip:x}: {frames:x?}");
        }
    }
}
