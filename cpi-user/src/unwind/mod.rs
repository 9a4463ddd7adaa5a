//! User stacks unwound in user space from what the kernel side copied: the registers at
//! the sample and the top of the user stack (cpi-ebpf/src/main.rs, `wire::StackHeader`).
//!
//! Each module's `.eh_frame` (through `.eh_frame_hdr`) drives the `framehop` unwinder;
//! a module without them, or whose file could not be captured, is walked by frame
//! pointers. Unwinding stops where it can no longer be trusted and says why
//! ([`Stop`]): code in no file mapping (JIT, anonymous memory, the vDSO) ends the stack
//! there, and nothing past it is invented. Files are read only through the captured
//! files (cpi-user/src/procmap/captured.rs: the descriptor, or reopened by the checked
//! path if the LRU closed it), mapped with
//! cpi-user/src/fsafe/map.rs; the unwind sections of each file are kept once, under a
//! byte bound, least recently used out.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Error as FrameError, ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection, ObjectSegment};

use crate::procmap::{CapturedFile, MappedObject, ProcessMaps};

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
}

/// The registers and stack bytes of one sample.
#[derive(Clone, Copy, Debug)]
pub struct UserRegs {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer: the address of `stack[0]`.
    pub sp: u64,
    /// Frame pointer (`rbp`).
    pub bp: u64,
}

/// The unwind sections of one file, shared by every process that maps it.
#[derive(Debug)]
struct Sections {
    eh_frame: Option<(Range<u64>, Arc<[u8]>)>,
    eh_frame_hdr: Option<(Range<u64>, Arc<[u8]>)>,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    /// `PT_LOAD` (vaddr, file offset, file size), for the load bias of a mapping.
    loads: Vec<(u64, u64, u64)>,
    bytes: u64,
}

impl Sections {
    /// Reads the unwind sections of `file`; `None` when it is not a readable x86-64 ELF
    /// (its frames are then walked by frame pointers).
    fn read(file: &File) -> Option<Sections> {
        let map = crate::fsafe::map::GuardedMap::new(file).ok()?;
        let elf = object::File::parse(map.bytes()).ok()?;
        if elf.architecture() != object::Architecture::X86_64 {
            return None;
        }
        let section = |name: &str| {
            let s = elf.section_by_name(name)?;
            let data: Arc<[u8]> = s.data().ok()?.into();
            Some((s.address()..s.address() + s.size(), data))
        };
        let range = |name: &str| {
            elf.section_by_name(name)
                .map(|s| s.address()..s.address() + s.size())
        };
        let eh_frame = section(".eh_frame");
        let eh_frame_hdr = section(".eh_frame_hdr");
        let loads = elf
            .segments()
            .map(|s| (s.address(), s.file_range().0, s.file_range().1))
            .collect();
        // A file truncated under the mapping read as zeros: not its unwind information.
        if map.truncated() {
            return None;
        }
        let bytes = [&eh_frame, &eh_frame_hdr]
            .iter()
            .filter_map(|s| s.as_ref().map(|(_, d)| d.len() as u64))
            .sum::<u64>()
            + 256;
        Some(Sections {
            eh_frame,
            eh_frame_hdr,
            text: range(".text"),
            got: range(".got"),
            loads,
            bytes,
        })
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

    fn module_info(&self) -> ExplicitModuleSectionInfo<Arc<[u8]>> {
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.clone(),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: self.eh_frame.as_ref().map(|(_, d)| Arc::clone(d)),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(_, d)| Arc::clone(d)),
            ..Default::default()
        }
    }
}

/// A file's identity while it is held open: device, inode, size and change time.
type FileKey = (u64, u64, u64, i64);

/// One process's modules, built from the maps they were built for.
struct ProcessUnwinder {
    maps: ProcessMaps,
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    /// Executable file mappings, sorted: where unwinding may continue.
    code: Vec<Range<u64>>,
}

/// Unwinds the copied user stacks of many processes.
pub struct StackUnwinder {
    sections: HashMap<FileKey, (Option<Arc<Sections>>, u64)>,
    bytes: u64,
    byte_bound: u64,
    tick: u64,
    processes: HashMap<u32, ProcessUnwinder>,
    cache: CacheX86_64,
    max_frames: usize,
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

/// Default bound on the unwind sections held (libc's are ≈ 0.1 MiB).
pub const DEFAULT_BYTE_BOUND: u64 = 64 << 20;

impl StackUnwinder {
    /// At most `max_frames` frames per stack; unwind sections held up to `byte_bound`
    /// bytes (files in use by a process being unwound may exceed it until it is done).
    pub fn new(max_frames: usize, byte_bound: u64) -> Self {
        StackUnwinder {
            sections: HashMap::new(),
            bytes: 0,
            byte_bound,
            tick: 0,
            processes: HashMap::new(),
            cache: CacheX86_64::new(),
            max_frames,
        }
    }

    /// Bytes of unwind sections held.
    pub fn held_bytes(&self) -> u64 {
        self.bytes
    }

    /// Drops what is held for processes `keep` says are gone.
    pub fn retain_processes(&mut self, keep: impl Fn(u32) -> bool) {
        self.processes.retain(|pid, _| keep(*pid));
    }

    /// Unwinds one sample of `pid` whose mappings are `maps` and whose captured files
    /// are `files` (by mapping start): frames leaf first (`[0]` the IP, then return
    /// addresses) and why it stopped.
    pub fn unwind(
        &mut self,
        pid: u32,
        maps: &ProcessMaps,
        files: &HashMap<u64, Arc<CapturedFile>>,
        regs: UserRegs,
        stack: &[u8],
        copied_in_full: bool,
    ) -> (Vec<u64>, Stop) {
        if self.processes.get(&pid).is_none_or(|p| p.maps != *maps) {
            let built = self.build(pid, maps, files);
            self.processes.insert(pid, built);
        }
        let proc = &self.processes[&pid];
        let in_code = |a: u64| {
            let i = proc.code.partition_point(|r| r.start <= a);
            i > 0 && proc.code[i - 1].contains(&a)
        };
        let end = regs.sp.saturating_add(stack.len() as u64);
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(regs.sp).ok_or(())? as usize;
            let b = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
        };
        let mut frames = Vec::new();
        let mut it = proc.unwinder.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut self.cache,
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
                    if !in_code(lookup) {
                        break Stop::UnknownCode;
                    }
                    if frames.len() >= self.max_frames {
                        break Stop::FrameLimit;
                    }
                }
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
        (frames, stop)
    }

    fn build(
        &mut self,
        pid: u32,
        maps: &ProcessMaps,
        files: &HashMap<u64, Arc<CapturedFile>>,
    ) -> ProcessUnwinder {
        let mut unwinder = UnwinderX86_64::new();
        let mut code = Vec::new();
        for m in maps.mappings.iter().filter(|m| m.executable) {
            let MappedObject::File { path, .. } = &m.object else {
                continue;
            };
            code.push(m.start..m.end);
            // A file whose descriptor the LRU closed is reopened by its checked path.
            let file = files
                .get(&m.start)
                .and_then(|c| c.open(pid, m, path, true).ok());
            let sections = file.and_then(|f| self.sections_of(&f));
            let (base, info) = match sections
                .as_ref()
                .and_then(|s| Some((s.base_avma(m.start, m.offset)?, s.module_info())))
            {
                Some(x) => x,
                // No unwind information: frame pointers.
                None => (m.start, ExplicitModuleSectionInfo::default()),
            };
            unwinder.add_module(Module::new(
                path.display().to_string(),
                m.start..m.end,
                base,
                info,
            ));
        }
        code.sort_by_key(|r| r.start);
        self.evict();
        ProcessUnwinder {
            maps: maps.clone(),
            unwinder,
            code,
        }
    }

    fn sections_of(&mut self, file: &File) -> Option<Arc<Sections>> {
        let meta = file.metadata().ok()?;
        let key = (meta.dev(), meta.ino(), meta.size(), meta.ctime());
        self.tick += 1;
        if let Some((s, used)) = self.sections.get_mut(&key) {
            *used = self.tick;
            return s.clone();
        }
        let s = Sections::read(file).map(Arc::new);
        self.bytes += s.as_ref().map_or(64, |s| s.bytes);
        self.sections.insert(key, (s.clone(), self.tick));
        s
    }

    /// Least recently used files out until under the bound.
    fn evict(&mut self) {
        while self.bytes > self.byte_bound && self.sections.len() > 1 {
            let Some((&key, _)) = self.sections.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            if let Some((s, _)) = self.sections.remove(&key) {
                self.bytes -= s.as_ref().map_or(64, |s| s.bytes);
            }
        }
    }
}
