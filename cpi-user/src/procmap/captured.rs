//! Files of executable mappings, opened while their process lives, so they can be read
//! after it exits, after the file is deleted or replaced, and when it is visible only in
//! the process's mount namespace (a container): an open file is the file itself, whatever
//! its path has become.
//!
//! One [`CapturedFile`] per (device, inode), shared by every process that maps it. At
//! most [`CapturedFiles::cap`] descriptors are held (a quarter of the soft
//! `RLIMIT_NOFILE`, within 64..=8192), so a process mapping thousands of files cannot
//! exhaust ours: beyond the cap the least recently used descriptors are closed, and a
//! file whose descriptor was closed is reopened by its path when next needed, through
//! the checked opener (cpi-user/src/fsafe/mod.rs) and accepted only if it is still the
//! captured file (device, inode, size, and build-id once parsed). Evictions, reopens and
//! refused reopens are counted ([`CaptureCounts`], the agent's
//! `cpi_bpf_captured_files_total`).

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::{proc_dir, thread_dirs, MappedObject, Mapping};
use crate::fsafe::{self, FileId, OpenError};

/// Evictions, reopens and refused reopens of captured files since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureCounts {
    /// Descriptors closed by the LRU while a process still mapped the file.
    pub evicted: u64,
    /// Evicted files reopened by path and found to be the captured file.
    pub reopened: u64,
    /// Evicted files that could not be reopened, or were another file (or another
    /// build) when reopened: their samples are counted unusable by analysis.
    pub reopen_failed: u64,
}

/// What the collector (evictions) and analysis (reopens) count, and the LRU clock.
#[derive(Debug, Default)]
struct Shared {
    clock: AtomicU64,
    evicted: AtomicU64,
    reopened: AtomicU64,
    reopen_failed: AtomicU64,
}

impl Shared {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A file captured from `/proc/PID/map_files`, shared by every process that maps it.
#[derive(Debug)]
pub struct CapturedFile {
    /// Device and inode.
    pub id: FileId,
    /// Size when captured: a reopened file of another size is not this one.
    pub len: u64,
    /// Build-id when first parsed ([`CapturedFile::check_build_id`]).
    build_id: OnceLock<Option<String>>,
    /// The descriptor, until the LRU closes it.
    fd: Mutex<Option<Arc<File>>>,
    /// Clock of its last use.
    used: AtomicU64,
    /// Windows in a row no process held it ([`CapturedFiles::release_idle`]).
    idle: AtomicU64,
    shared: Arc<Shared>,
}

impl CapturedFile {
    /// The open file, if the LRU has not closed it (a use either way).
    pub fn held(&self) -> Option<Arc<File>> {
        self.used.store(self.shared.tick(), Ordering::Relaxed);
        self.fd.lock().expect("not poisoned").clone()
    }

    /// The file of mapping `m` (whose path is `path`) of `pid`: the held descriptor, else
    /// reopened by [`open_mapped_file`] and accepted only if it has the captured identity
    /// and size (counted either way). The reopened descriptor is not kept: the cap holds.
    pub fn open(
        &self,
        pid: u32,
        m: &Mapping,
        path: &Path,
        live: bool,
    ) -> Result<Arc<File>, OpenError> {
        if let Some(f) = self.held() {
            return Ok(f);
        }
        let want = Mapping {
            file_id: Some(self.id),
            ..m.clone()
        };
        let r = open_mapped_file(pid, &want, path, live, Some(self.len));
        let counter = match &r {
            Ok(_) => &self.shared.reopened,
            Err(_) => &self.shared.reopen_failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        r.map(Arc::new)
    }

    /// Records the build-id of the file's first parse; a later parse (of a reopened file)
    /// with another build-id is not the captured file (counted as a failed reopen).
    pub(crate) fn check_build_id(&self, found: Option<&str>, path: &Path) -> Result<(), OpenError> {
        let want = self.build_id.get_or_init(|| found.map(str::to_string));
        if want.as_deref() == found {
            return Ok(());
        }
        self.shared.reopen_failed.fetch_add(1, Ordering::Relaxed);
        let show = |b: Option<&str>| b.unwrap_or("none").to_string();
        Err(OpenError::NotTheCapturedFile {
            path: path.to_path_buf(),
            what: format!(
                "build-id {} where {} was captured",
                show(found),
                show(want.as_deref())
            ),
        })
    }

    fn evict(&self) -> bool {
        self.fd.lock().expect("not poisoned").take().is_some()
    }
}

/// Opens the file of mapping `m` of `pid` by path: while the process is `live`,
/// `/proc/PID/map_files/START-END` (the mapped file itself) and `path` inside
/// `/proc/PID/root`, and the same through the first of its other threads' `/proc/TID`
/// (super::thread_dirs) when those fail (a group leader that exited has neither while
/// its other threads run); then `path` as mapped. The first that is the mapped file
/// (device and inode as recorded, and size `len` when given) is returned; a path naming
/// another file is refused, never read. Never blocks, regular files only
/// (cpi-user/src/fsafe/mod.rs).
pub fn open_mapped_file(
    pid: u32,
    m: &Mapping,
    path: &Path,
    live: bool,
    len: Option<u64>,
) -> Result<File, OpenError> {
    crate::binary::work::opened();
    let mut err = None;
    let mut accept = |r: Result<File, OpenError>| {
        let e = match r.and_then(|f| {
            fsafe::check_identity(&f, path, m.file_id)?;
            check_len(&f, path, len)?;
            Ok(f)
        }) {
            Ok(f) => return Some(f),
            Err(e) => e,
        };
        // The last error (the mapped path's own) is the one worth reporting, unless an
        // earlier path named another file than the mapped one.
        if !matches!(
            err,
            Some(OpenError::NotTheMappedFile { .. } | OpenError::NotTheCapturedFile { .. })
        ) {
            err = Some(e);
        }
        None
    };
    if live {
        // `tid` = `pid`: the other threads are listed only once `/proc/PID` has failed.
        let dirs = std::iter::once(proc_dir(pid)).chain(thread_dirs(pid, pid).take(1));
        for dir in dirs {
            let link = dir.join(format!("map_files/{:x}-{:x}", m.start, m.end));
            let found = accept(fsafe::open(&link))
                .or_else(|| accept(fsafe::open_in_root(&dir.join("root"), path)));
            if let Some(f) = found {
                return Ok(f);
            }
        }
    }
    match accept(fsafe::open(path)) {
        Some(f) => Ok(f),
        None => Err(err.expect("the mapped path was tried")),
    }
}

/// The file of mapping `m` of the live process at `dir`: `map_files/START-END`, else
/// (a user without `CAP_SYS_ADMIN` may not open those links, even of their own
/// processes) its path inside the process's `root`, when that is the file the kernel
/// says is mapped (device and inode).
fn open_live(dir: &Path, m: &Mapping) -> Option<File> {
    let link = dir.join(format!("map_files/{:x}-{:x}", m.start, m.end));
    if let Ok(f) = fsafe::open(&link) {
        return Some(f);
    }
    let (MappedObject::File { path, .. }, Some(id)) = (&m.object, m.file_id) else {
        return None;
    };
    let f = fsafe::open_in_root(&dir.join("root"), path).ok()?;
    fsafe::check_identity(&f, path, Some(id)).ok()?;
    Some(f)
}

fn check_len(f: &File, path: &Path, len: Option<u64>) -> Result<(), OpenError> {
    let Some(want) = len else { return Ok(()) };
    let found = f
        .metadata()
        .map_err(|cause| OpenError::Io {
            path: path.to_path_buf(),
            cause,
        })?
        .len();
    if found != want {
        return Err(OpenError::NotTheCapturedFile {
            path: path.to_path_buf(),
            what: format!("{found} bytes where {want} were captured"),
        });
    }
    Ok(())
}

/// Windows a captured file stays open with no process holding it
/// ([`CapturedFiles::release_idle`]).
pub(crate) const IDLE_WINDOWS: u64 = 6;

/// A handle on the counts of a [`CapturedFiles`].
#[derive(Clone, Debug)]
pub struct CaptureCounter(Arc<Shared>);

impl CaptureCounter {
    /// Evictions and reopens since start.
    pub fn counts(&self) -> CaptureCounts {
        let s = &self.0;
        CaptureCounts {
            evicted: s.evicted.load(Ordering::Relaxed),
            reopened: s.reopened.load(Ordering::Relaxed),
            reopen_failed: s.reopen_failed.load(Ordering::Relaxed),
        }
    }
}

/// The captured files of every process, bounded in descriptors by an LRU (module doc).
#[derive(Debug)]
pub struct CapturedFiles {
    by_inode: HashMap<FileId, Arc<CapturedFile>>,
    /// Entries whose descriptor is held.
    open: usize,
    cap: usize,
    /// `map_files` links opened so far.
    opened: u64,
    shared: Arc<Shared>,
}

impl Default for CapturedFiles {
    fn default() -> Self {
        let soft = fsafe::soft_nofile_limit();
        CapturedFiles::with_cap((soft / 4).clamp(64, 8192) as usize)
    }
}

impl CapturedFiles {
    /// At most `cap` descriptors held open.
    pub(crate) fn with_cap(cap: usize) -> Self {
        CapturedFiles {
            by_inode: HashMap::new(),
            open: 0,
            cap: cap.max(1),
            opened: 0,
            shared: Arc::default(),
        }
    }

    /// Captures the file of every executable file mapping of `maps` through
    /// `DIR/map_files/START-END` (`dir` from [`super::ProcessMaps::read_live`]); returns them by
    /// mapping start. Mappings whose file cannot be opened or is not a regular file are
    /// left out (the path is tried again, checked, at analysis). A mapping of a file
    /// already captured (the device and inode the kernel reports for it) shares that
    /// capture without a syscall: a forked child showing up with its parent's 25 000
    /// mappings costs no open. Each other mapping costs an open and an `fstat`: callers
    /// pass only the mappings they have not captured before.
    pub fn capture<'a>(
        &mut self,
        dir: &Path,
        maps: impl IntoIterator<Item = &'a Mapping>,
    ) -> HashMap<u64, Arc<CapturedFile>> {
        let mut out = HashMap::new();
        for m in maps {
            if !m.executable_file() {
                continue;
            }
            // The kernel's (device, inode) of this mapping names the captured file; an
            // evicted one is reopened and checked when analysis needs it, as below.
            if let Some(c) = m.file_id.and_then(|id| self.by_inode.get(&id)) {
                out.insert(m.start, Arc::clone(c));
                continue;
            }
            self.opened += 1;
            crate::binary::work::opened();
            let Some(file) = open_live(dir, m) else {
                continue;
            };
            let Ok(meta) = file.metadata() else {
                continue;
            };
            let id = FileId::of(&meta);
            // A known file keeps its state: one that was evicted is reopened by path when
            // analysis needs it, not here, where a pass over a process's 25 000 mappings
            // would otherwise close and reopen thousands of them.
            out.insert(m.start, self.keep(id, meta.len(), file, m));
        }
        out
    }

    /// The capture of file `id` (of `len` bytes), mapped by `m`: the one held already,
    /// else `file`'s.
    fn keep(&mut self, id: FileId, len: u64, file: File, m: &Mapping) -> Arc<CapturedFile> {
        if let Some(c) = self.by_inode.get(&id) {
            return Arc::clone(c);
        }
        log::debug!(
            "captured {} (device {}, inode {})",
            crate::fsafe::escape(&m.object.display_name()),
            id.dev,
            id.ino
        );
        self.make_room();
        let c = Arc::new(CapturedFile {
            id,
            len,
            build_id: OnceLock::new(),
            fd: Mutex::new(Some(Arc::new(file))),
            used: AtomicU64::new(self.shared.tick()),
            idle: AtomicU64::new(0),
            shared: Arc::clone(&self.shared),
        });
        self.open += 1;
        self.by_inode.insert(id, Arc::clone(&c));
        c
    }

    /// The files of `maps` (a process already gone, its mappings from the kernel's
    /// records) not captured yet, opened by their path as mapped and kept only if they
    /// are the file the kernel recorded (device and inode; [`open_mapped_file`]): once
    /// per binary, so that its later processes share the capture without a syscall
    /// (a process that lives a few milliseconds is gone before its sample is read).
    fn capture_recorded(&mut self, pid: u32, maps: &[Mapping]) -> HashMap<u64, Arc<CapturedFile>> {
        let mut out = HashMap::new();
        for m in maps.iter().filter(|m| m.executable_file()) {
            let (Some(id), super::MappedObject::File { path, .. }) = (m.file_id, &m.object) else {
                continue;
            };
            if let Some(c) = self.by_inode.get(&id) {
                out.insert(m.start, Arc::clone(c));
                continue;
            }
            self.opened += 1;
            let Ok(file) = open_mapped_file(pid, m, path, false, None) else {
                continue;
            };
            let Ok(meta) = file.metadata() else { continue };
            out.insert(m.start, self.keep(id, meta.len(), file, m));
        }
        out
    }

    /// Below the cap by one: files no process holds are closed first, then the least
    /// recently used eighth of the held descriptors (one scan for many evictions).
    fn make_room(&mut self) {
        if self.open < self.cap {
            return;
        }
        self.release_unused();
        if self.open < self.cap {
            return;
        }
        let mut held: Vec<(u64, FileId)> = self
            .by_inode
            .iter()
            .filter(|(_, c)| c.fd.lock().expect("not poisoned").is_some())
            .map(|(&id, c)| (c.used.load(Ordering::Relaxed), id))
            .collect();
        let n = (self.cap / 8).max(1).min(held.len());
        if n < held.len() {
            held.select_nth_unstable(n);
        }
        for (_, id) in &held[..n] {
            if self.by_inode[id].evict() {
                self.open -= 1;
                self.shared.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The most descriptors held at once.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Reads its evictions and reopens from another thread (reopens are counted by
    /// analysis, through the files handed out).
    pub fn counter(&self) -> CaptureCounter {
        CaptureCounter(Arc::clone(&self.shared))
    }

    /// [`CapturedFiles::capture`] through `/proc/PID`, else (a group leader that exited
    /// leaves its `map_files` empty) through the first of `pid`'s other threads
    /// (super::thread_dirs, `tid`'s first), else (all gone) by their recorded paths: for
    /// mappings known from the kernel's records rather than read from `/proc`.
    pub(crate) fn capture_live(
        &mut self,
        pid: u32,
        tid: u32,
        maps: &[Mapping],
    ) -> HashMap<u64, Arc<CapturedFile>> {
        let mut got = self.capture(&proc_dir(pid), maps);
        // Nothing (left) to capture, as for JIT code, is no sign of a leader gone.
        let missing: Vec<Mapping> = (maps.iter())
            .filter(|m| m.executable_file() && !got.contains_key(&m.start))
            .cloned()
            .collect();
        if missing.is_empty() {
            return got;
        }
        let rest = match thread_dirs(pid, tid).next() {
            Some(dir) => self.capture(&dir, &missing),
            // The whole process is gone.
            None => self.capture_recorded(pid, &missing),
        };
        got.extend(rest);
        got
    }

    /// Closes the files no process held for [`IDLE_WINDOWS`] calls in a row (once a
    /// window): a binary whose processes come and go (a cron job, a health check, a
    /// build's compilers) keeps its capture, and its next process opens nothing.
    /// Within the descriptor cap either way ([`Self::make_room`] closes idle files
    /// first).
    pub(crate) fn release_idle(&mut self) {
        let mut closed = 0;
        self.by_inode.retain(|_, c| {
            let keep =
                Arc::strong_count(c) > 1 || c.idle.fetch_add(1, Ordering::Relaxed) < IDLE_WINDOWS;
            if Arc::strong_count(c) > 1 {
                c.idle.store(0, Ordering::Relaxed);
            }
            if !keep && c.fd.lock().expect("not poisoned").is_some() {
                closed += 1;
            }
            keep
        });
        self.open -= closed;
    }

    /// Closes the files nothing else holds (every process that mapped them is gone).
    pub(crate) fn release_unused(&mut self) {
        let mut closed = 0;
        self.by_inode.retain(|_, c| {
            let keep = Arc::strong_count(c) > 1;
            if !keep && c.fd.lock().expect("not poisoned").is_some() {
                closed += 1;
            }
            keep
        });
        self.open -= closed;
    }

    /// `map_files` links opened since start (what capturing costs).
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// Descriptors held open.
    #[cfg(test)]
    pub(crate) fn open_files(&self) -> usize {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procmap::{MappedObject, ProcessMaps};
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    #[test]
    fn own_text_is_captured_once_per_file() {
        let me = std::process::id();
        let (maps, dir) = ProcessMaps::read_live(me, me).unwrap();
        let mut files = CapturedFiles::default();
        let got = files.capture(&dir, &maps.mappings);
        let here = own_text_is_captured_once_per_file as *const () as u64;
        let m = maps.find(here).expect("own text mapped");
        assert!(got.contains_key(&m.start), "own text captured");
        let again = files.capture(&dir, &maps.mappings);
        assert_eq!(again.len(), got.len());
        assert!(files.open_files() <= got.len(), "one open file per inode");
        assert!(files.open_files() > 0);
        assert!(CapturedFiles::default().cap() >= 64);
    }

    /// A fake process: `dir/map_files/START-END` links to files `lib0.so`… (what
    /// `/proc/PID/map_files` is), one executable mapping each.
    struct Fake {
        dir: PathBuf,
        maps: ProcessMaps,
    }

    impl Fake {
        fn new(name: &str, n: usize) -> Fake {
            let dir = std::env::temp_dir().join(format!("cpi-lru-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("map_files")).unwrap();
            let mut mappings = Vec::new();
            for i in 0..n as u64 {
                let path = dir.join(format!("lib{i}.so"));
                std::fs::write(&path, vec![i as u8; 100 + i as usize]).unwrap();
                let (start, end) = (0x10000 * (i + 1), 0x10000 * (i + 1) + 0x1000);
                symlink(&path, dir.join(format!("map_files/{start:x}-{end:x}"))).unwrap();
                mappings.push(Mapping {
                    start,
                    end,
                    offset: 0,
                    executable: true,
                    file_id: Some(FileId::of(&std::fs::metadata(&path).unwrap())),
                    object: MappedObject::File {
                        path,
                        deleted: false,
                    },
                });
            }
            Fake {
                dir,
                maps: ProcessMaps { mappings },
            }
        }

        fn only(&self, i: usize) -> &[Mapping] {
            &self.maps.mappings[i..=i]
        }

        fn path(&self, i: usize) -> PathBuf {
            self.dir.join(format!("lib{i}.so"))
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn the_least_recently_used_descriptors_are_closed_and_reopened_by_checked_path() {
        let fake = Fake::new("evict", 4);
        let mut files = CapturedFiles::with_cap(2);
        let mut held = HashMap::new();
        for i in 0..2 {
            held.extend(files.capture(&fake.dir, fake.only(i)));
        }
        macro_rules! file {
            ($i:expr) => {
                Arc::clone(&held[&fake.maps.mappings[$i].start])
            };
        }
        // lib0 is used after lib1, so lib1 is the least recently used when lib2 comes.
        assert!(file!(0).held().is_some());
        held.extend(files.capture(&fake.dir, fake.only(2)));
        assert_eq!(files.open_files(), 2);
        assert!(file!(1).held().is_none(), "lib1 was least recently used");
        assert!(file!(0).held().is_some() && file!(2).held().is_some());
        assert_eq!(files.counter().counts().evicted, 1);

        // Reopened by its path (the process is not live: no /proc paths), verified.
        let m1 = &fake.maps.mappings[1];
        let f = file!(1).open(0, m1, &fake.path(1), false).unwrap();
        assert_eq!(FileId::of(&f.metadata().unwrap()), file!(1).id);
        assert_eq!(files.counter().counts().reopened, 1);
        assert!(file!(1).held().is_none(), "a reopen does not take a slot");

        // A new file evicts lib0, now the least recently used; lib1 stays evicted.
        held.extend(files.capture(&fake.dir, fake.only(3)));
        assert!(file!(0).held().is_none() && file!(1).held().is_none());
        assert_eq!(
            (files.open_files(), files.counter().counts().evicted),
            (2, 2)
        );

        // lib0 rewritten in place to another size (same inode): refused.
        let m0 = &fake.maps.mappings[0];
        std::fs::write(fake.path(0), b"shorter").unwrap();
        let e = file!(0).open(0, m0, &fake.path(0), false).unwrap_err();
        assert!(matches!(e, OpenError::NotTheCapturedFile { .. }), "{e}");
        // Its path now names another file (replaced by rename): refused.
        std::fs::rename(fake.path(3), fake.path(0)).unwrap();
        let e = file!(0).open(0, m0, &fake.path(0), false).unwrap_err();
        assert!(matches!(e, OpenError::NotTheMappedFile { .. }), "{e}");
        assert_eq!(files.counter().counts().reopen_failed, 2);

        // A build-id other than the one first parsed is refused, and counted.
        file!(2).check_build_id(Some("aa"), &fake.path(2)).unwrap();
        file!(2).check_build_id(Some("aa"), &fake.path(2)).unwrap();
        let e = file!(2)
            .check_build_id(Some("bb"), &fake.path(2))
            .unwrap_err();
        assert!(e.to_string().contains("build-id bb where aa"), "{e}");
        assert_eq!(files.counter().counts().reopen_failed, 3);

        // Files no process holds are closed first.
        held.clear();
        files.release_unused();
        assert_eq!(files.open_files(), 0);
    }
}
