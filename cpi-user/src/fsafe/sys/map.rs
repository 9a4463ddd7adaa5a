//! Read-only file mappings that a truncation cannot turn into a fatal `SIGBUS`.
//!
//! Why mapped and not read: binaries are mapped so that a 200 MB `libLLVM.so` costs its
//! function table on the heap, not its size (cpi-user/src/binary/mod.rs); reading the
//! whole file with bounded `pread`s would put every mapped library's bytes on the heap
//! (BENCHMARKS.md, "Truncated binaries": 123 MB of heap for libLLVM-19 against 1.8 MB),
//! and reading only the ranges used would mean a second ELF reader. So the mapping
//! stays, and a fault in it is recovered: every `GuardedMap` registers its range in a
//! fixed table; a process-wide `SIGBUS` handler that finds the faulting address there
//! maps zeros over the **whole** mapping, marks it truncated and returns, so the read
//! completes (with zeros) and the owner learns from `GuardedMap::truncated` that what
//! it read is not the file. One replacement per mapping, not one per faulting page: a
//! file whose every other page faults (holes on a full tmpfs) once cost a new mapping
//! per page until `vm.max_map_count` made the replacement fail and the fault killed the
//! root profiler. Any other `SIGBUS` goes to the handler that was there before
//! (Rust's own, then the default action). Cost when nothing is truncated: none on
//! reads; a slot claimed and released per mapping.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super as sys;

/// Mappings guarded at once; a binary opened beyond this is refused (counted by its
/// reader), never mapped unguarded.
pub(crate) const MAX_GUARDED: usize = 16384;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
};
static SLOTS: [Slot; MAX_GUARDED] = [FREE; MAX_GUARDED];
/// Where the next claim starts looking.
static HINT: AtomicUsize = AtomicUsize::new(0);
/// The `SIGBUS` action replaced (`sa_sigaction`, `sa_flags`), called for faults outside
/// every slot.
static PREVIOUS: OnceLock<(usize, libc::c_int)> = OnceLock::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &SLOTS {
        let len = s.len.load(Ordering::Acquire);
        let start = s.start.load(Ordering::Acquire);
        if len != 0 && addr.wrapping_sub(start) < len {
            // The whole mapping at once: it replaces one mapping by one, so it needs no
            // room under `vm.max_map_count`, and no later read of this file faults.
            // (Two threads faulting together both replace it; the second is a no-op.)
            let pages = len.next_multiple_of(sys::page_size());
            if sys::zeros_over(start, pages) {
                s.hit.store(true, Ordering::Release);
                return;
            }
        }
    }
    match PREVIOUS.get() {
        Some(&(f, flags)) if f != libc::SIG_DFL && f != libc::SIG_IGN => {
            if flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO, so it has
                // this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(f) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain handler's signature.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
                f(sig);
            }
        }
        _ => {
            // Default action: returning re-runs the faulting access, which then kills.
            // SAFETY: resetting a signal's disposition.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        }
    }
}

fn install() -> io::Result<()> {
    static DONE: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = DONE.get_or_init(|| {
        sys::page_size();
        let old = sys::install_sigbus(on_sigbus).map_err(|e| e.raw_os_error().unwrap_or(0))?;
        let _ = PREVIOUS.set((old.sa_sigaction, old.sa_flags));
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// A read-only shared mapping of a whole file, registered with the `SIGBUS` handler.
pub(crate) struct GuardedMap {
    // Dropped after the slot is released (`Drop` runs before fields drop).
    map: memmap2::Mmap,
    slot: usize,
    /// The file, for [`GuardedMap::read_at`] (when made [`GuardedMap::with_reads`]).
    file: Option<File>,
}

impl GuardedMap {
    /// Maps `file` (read-only, shared).
    pub fn new(file: &File) -> io::Result<GuardedMap> {
        install()?;
        // SAFETY: a read-only mapping this process never writes; a truncation under it
        // is recovered by the handler above instead of killing the process.
        let map = unsafe { memmap2::Mmap::map(file) }?;
        if map.is_empty() {
            return Ok(GuardedMap {
                map,
                slot: usize::MAX,
                file: None,
            });
        }
        let start = map.as_ptr() as usize;
        let first = HINT.load(Ordering::Relaxed);
        for k in 0..MAX_GUARDED {
            let i = (first + k) % MAX_GUARDED;
            let s = &SLOTS[i];
            if s.start
                .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.hit.store(false, Ordering::Relaxed);
                s.len.store(map.len(), Ordering::Release);
                HINT.store(i + 1, Ordering::Relaxed);
                return Ok(GuardedMap {
                    map,
                    slot: i,
                    file: None,
                });
            }
        }
        Err(io::Error::other(format!(
            "more than {MAX_GUARDED} files mapped at once"
        )))
    }

    /// [`GuardedMap::new`], keeping a descriptor of `file` for [`GuardedMap::read_at`]
    /// (none when it cannot be duplicated: reads then go through the mapping).
    pub fn with_reads(file: &File) -> io::Result<GuardedMap> {
        let mut m = GuardedMap::new(file)?;
        m.file = file.try_clone().ok();
        Ok(m)
    }

    /// Copies the file's bytes at `offset` into `buf` with `pread`, not through the
    /// mapping: a fault in a file mapping maps the page cache's whole folio, up to
    /// 2 MiB on Linux 6.18 (`filemap_map_pages`), so a few hundred names read through
    /// the mapping of a 200 MB library held 20 MiB of it in this process's resident set
    /// (BENCHMARKS.md, "Agent memory on a build host"); `pread` copies only what is
    /// asked. The bytes read, short at the file's end; a read that ends before the end
    /// of the mapping (the file shrank) marks it [`GuardedMap::truncated`], as a fault
    /// there would. `None` without a descriptor: the caller reads the mapping.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Option<usize> {
        use std::os::unix::fs::FileExt;
        let file = self.file.as_ref()?;
        let mut done = 0;
        while done < buf.len() {
            let at = (offset + done) as u64;
            match file.read_at(&mut buf[done..], at) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if done < buf.len() && offset.saturating_add(done) < self.map.len() {
            if let Some(s) = SLOTS.get(self.slot) {
                s.hit.store(true, Ordering::Release);
            }
        }
        Some(done)
    }

    /// The file's bytes as mapped (zeros where it was truncated, see
    /// [`GuardedMap::truncated`]).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// A read past the file's current end was recovered (what was read there is zeros,
    /// not the file), or came back short ([`GuardedMap::read_at`]).
    pub fn truncated(&self) -> bool {
        SLOTS
            .get(self.slot)
            .is_some_and(|s| s.hit.load(Ordering::Acquire))
    }

    /// `madvise(MADV_DONTNEED)` on the whole mapping (see `Binary::release_pages`).
    pub(crate) fn dont_need(&self) -> io::Result<()> {
        // SAFETY: a read-only shared file mapping. MADV_DONTNEED only unmaps its pages
        // from this process: "subsequent accesses ... will result in ... repopulating the
        // memory contents from the up-to-date contents of the underlying mapped file (for
        // shared file mappings ...)" (madvise(2)), so every slice into it reads the same
        // bytes afterwards (zeros where a recovered fault put them, as before).
        unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        }
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        if let Some(s) = SLOTS.get(self.slot) {
            s.len.store(0, Ordering::Release);
            s.start.store(0, Ordering::Release);
        }
    }
}

impl std::fmt::Debug for GuardedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GuardedMap({} bytes)", self.map.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_truncated_file_reads_as_zeros_and_says_so() {
        let dir = std::env::temp_dir().join(format!("cpi-guard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; 4 * 4096]).unwrap();
        let m = GuardedMap::new(&File::open(&p).unwrap()).unwrap();
        assert_eq!(m.bytes()[3 * 4096], 7);
        assert!(!m.truncated());
        m.dont_need().unwrap();
        f.set_len(4096).unwrap();
        // Page 3 is past the new end: a fault recovered, not a crash.
        let v = std::hint::black_box(&m.bytes()[3 * 4096 + 5]);
        assert_eq!(*v, 0);
        assert!(m.truncated());
        assert_eq!(
            m.bytes()[10],
            0,
            "the whole mapping is zeros now, not the file"
        );
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `read_at` copies the file without making the mapping resident, and a read cut
    /// short by a truncation marks the mapping truncated as a fault there would.
    #[test]
    fn reads_leave_the_mapping_alone_and_see_a_truncation() {
        let dir = std::env::temp_dir().join(format!("cpi-guard-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; 4 * 4096]).unwrap();
        let m = GuardedMap::with_reads(&File::open(&p).unwrap()).unwrap();
        let mut buf = [0u8; 100];
        assert_eq!(m.read_at(3 * 4096, &mut buf), Some(100));
        assert_eq!(buf, [7u8; 100]);
        let resident = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", m.bytes().as_ptr() as usize);
        let rss = (resident.lines())
            .skip_while(|l| !l.starts_with(&start))
            .find_map(|l| l.strip_prefix("Rss:"))
            .unwrap();
        assert_eq!(rss.trim(), "0 kB", "nothing of the mapping resident");
        assert!(!m.truncated());
        f.set_len(4096 + 50).unwrap();
        assert_eq!(m.read_at(4096, &mut buf), Some(50));
        assert!(m.truncated());
        let plain = GuardedMap::new(&File::open(&p).unwrap()).unwrap();
        assert_eq!(plain.read_at(0, &mut buf), None, "no descriptor kept");
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Mappings (lines of /proc/self/maps) that start inside `start..end`.
    fn mappings_within(start: usize, end: usize) -> usize {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| usize::from_str_radix(l.split('-').next()?, 16).ok())
            .filter(|&a| (start..end).contains(&a))
            .count()
    }

    /// Every other page faulting (the holes of a file on a full tmpfs) costs one
    /// replacement, not a mapping per page: 512 faulting pages once made 512 mappings,
    /// and 65 530 of them exhausted `vm.max_map_count` and killed the process.
    #[test]
    fn a_fault_storm_costs_one_mapping() {
        let dir = std::env::temp_dir().join(format!("cpi-storm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let page = sys::page_size();
        let pages = 1024;
        let f = File::create(&p).unwrap();
        f.set_len((pages * page) as u64).unwrap();
        let m = GuardedMap::new(&File::open(&p).unwrap()).unwrap();
        let start = m.bytes().as_ptr() as usize;
        f.set_len(0).unwrap();
        let mut sum = 0u64;
        for k in (0..pages).step_by(2) {
            sum += u64::from(*std::hint::black_box(&m.bytes()[k * page]));
        }
        assert_eq!(sum, 0);
        assert!(m.truncated());
        assert_eq!(mappings_within(start, start + pages * page), 1);
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
