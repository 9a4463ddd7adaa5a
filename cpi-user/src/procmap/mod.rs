//! pid → mappings → (object, file offset). Read from `/proc/PID/maps` when a pid is
//! first seen (and again on a miss), or through a running thread's `/proc/TID` when the
//! group leader has exited before the other threads ([`ProcessMaps::read_live`]); kept
//! after the pid exits so late samples still resolve. The PMU model fills the same type
//! from the guest's maps.

use std::path::{Path, PathBuf};

pub use crate::fsafe::FileId;

mod captured;
mod cgroup;
pub use captured::{open_mapped_file, CaptureCounter, CaptureCounts, CapturedFile, CapturedFiles};
pub use cgroup::{is_kubepods, pod_dirs, ProcessIdentity};

/// Why maps could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcMapError {
    /// `/proc/PID/maps` could not be read (the process is gone, or not ours to read).
    // The cause is in the message, not a `source()`, so that a chain prints it once.
    #[error("reading /proc/{pid}/maps: {cause}")]
    Read {
        /// The process.
        pid: u32,
        /// Why.
        cause: std::io::Error,
    },
    /// A line that is not `start-end perms offset dev inode [path]`.
    #[error("line {line} of a maps file is malformed: {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
}

/// What a mapping maps.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MappedObject {
    /// A file; `deleted` when the kernel marks it `(deleted)`.
    File {
        /// The path as the process saw it (in its own mount namespace).
        path: PathBuf,
        /// The file was deleted or replaced since it was mapped.
        deleted: bool,
    },
    /// Anonymous memory (JIT code lands here).
    Anon,
    /// `[vdso]`, `[heap]`, `[stack]`, …
    Special(String),
}

impl MappedObject {
    /// The object a mapping's name (`/proc/PID/maps`' last field, a perf mmap record's
    /// file name) denotes. Only an absolute path is a file: `anon_inode:bpf-map`,
    /// `socket:[…]` and the like are kernel objects no path opens (the agent sampling
    /// itself on a kernel that cannot filter in BPF sees its own ring buffer's).
    pub(crate) fn from_name(name: &str) -> MappedObject {
        if name.is_empty() || name.starts_with("//anon") {
            MappedObject::Anon
        } else if !name.starts_with('/') || name.starts_with("//") {
            MappedObject::Special(name.to_string())
        } else if let Some(p) = name.strip_suffix(" (deleted)") {
            MappedObject::File {
                path: PathBuf::from(p),
                deleted: true,
            }
        } else {
            MappedObject::File {
                path: PathBuf::from(name),
                deleted: false,
            }
        }
    }

    /// The name reports use for the object.
    pub fn display_name(&self) -> String {
        match self {
            MappedObject::File { path, .. } => path.display().to_string(),
            MappedObject::Anon => "[anon]".to_string(),
            MappedObject::Special(s) => s.clone(),
        }
    }
}

/// One line of `/proc/PID/maps` (or one side-band mmap record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First runtime address.
    pub start: u64,
    /// One past the last runtime address.
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// Mapped executable (`x` in the permissions).
    pub executable: bool,
    /// What is mapped.
    pub object: MappedObject,
    /// The mapped file's device and inode as the kernel recorded them at mapping time
    /// (`None` for non-file mappings and recordings from elsewhere): a file opened later
    /// by path must be this one (cpi-user/src/fsafe/mod.rs).
    pub file_id: Option<FileId>,
}

impl Mapping {
    /// An executable mapping of a file: what is captured (captured.rs) and unwound
    /// (cpi-user/src/unwind/mod.rs) per file.
    pub(crate) fn executable_file(&self) -> bool {
        self.executable && matches!(self.object, MappedObject::File { .. })
    }

    /// True when `addr` is in `[start, end)`.
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }

    /// File offset of a runtime address inside this mapping.
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// A process's mappings, sorted by start address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessMaps {
    /// Sorted by start, not overlapping.
    pub mappings: Vec<Mapping>,
}

impl ProcessMaps {
    /// `/proc/PID/maps`, parsed.
    pub fn read(pid: u32) -> Result<Self, ProcMapError> {
        Self::read_from(pid, &proc_dir(pid))
    }

    /// The maps of process `pid` (sampled in its thread `tid`) and the directory they
    /// were read through, for its `map_files` ([`CapturedFiles::capture`]): `/proc/PID`,
    /// or, when that reads empty (a group leader that exited while other threads run
    /// is a zombie with no maps), the first of its other threads' that does not
    /// (`thread_dirs` below).
    pub fn read_live(pid: u32, tid: u32) -> Result<(Self, PathBuf), ProcMapError> {
        let dir = proc_dir(pid);
        let maps = Self::read_from(pid, &dir)?;
        if !maps.mappings.is_empty() {
            return Ok((maps, dir));
        }
        for dir in thread_dirs(pid, tid) {
            // A thread gone (or going) since it was listed reads empty, or not at all.
            match Self::read_from(pid, &dir) {
                Ok(m) if !m.mappings.is_empty() => return Ok((m, dir)),
                _ => {}
            }
        }
        Ok((maps, proc_dir(pid)))
    }

    fn read_from(pid: u32, dir: &Path) -> Result<Self, ProcMapError> {
        let text = std::fs::read_to_string(dir.join("maps"))
            .map_err(|cause| ProcMapError::Read { pid, cause })?;
        Self::parse(&text)
    }

    /// These maps, plus the mappings of `older` (read before an `exec`) that none of
    /// these overlaps: samples taken before the exec still resolve to the old image.
    /// One binary search per older mapping: a process with 25 000 mappings is merged at
    /// every re-read of its maps (a pairwise check cost seconds).
    pub(crate) fn with_older(mut self, older: ProcessMaps) -> Self {
        let new = &self.mappings;
        let kept: Vec<Mapping> = older
            .mappings
            .into_iter()
            .filter(|o| {
                // Sorted and disjoint, so the ends are sorted too.
                let i = new.partition_point(|n| n.end <= o.start);
                new.get(i).is_none_or(|n| n.start >= o.end)
            })
            .collect();
        self.mappings.extend(kept);
        self.mappings.sort_by_key(|m| m.start);
        self
    }

    /// Puts `m` in place of the mappings it overlaps (a newer mapping wins), in place.
    pub(crate) fn overlay(&mut self, m: Mapping) {
        let lo = self.mappings.partition_point(|o| o.end <= m.start);
        let hi = lo + self.mappings[lo..].partition_point(|o| o.start < m.end);
        self.mappings.splice(lo..hi, [m]);
    }

    /// True when `m` is one of these mappings, the same in every field.
    pub fn holds(&self, m: &Mapping) -> bool {
        self.mappings
            .binary_search_by_key(&m.start, |o| o.start)
            .is_ok_and(|i| self.mappings[i] == *m)
    }

    /// Parses the `/proc/PID/maps` text format.
    pub fn parse(text: &str) -> Result<Self, ProcMapError> {
        let mut mappings = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = || ProcMapError::Malformed {
                line: i + 1,
                text: line.to_string(),
            };
            let mut f = line.splitn(6, ' ').filter(|s| !s.is_empty());
            let range = f.next().ok_or_else(bad)?;
            let perms = f.next().ok_or_else(bad)?;
            let offset = f.next().ok_or_else(bad)?;
            let dev = f.next().ok_or_else(bad)?;
            let inode = f.next().ok_or_else(bad)?;
            let name = f.next().map(str::trim).unwrap_or("");
            let (s, e) = range.split_once('-').ok_or_else(bad)?;
            let hex = |t: &str| u64::from_str_radix(t, 16).map_err(|_| bad());
            let (major, minor) = dev.split_once(':').ok_or_else(bad)?;
            let num = |t: &str| u32::from_str_radix(t, 16).map_err(|_| bad());
            let (major, minor) = (num(major)?, num(minor)?);
            let ino: u64 = inode.parse().map_err(|_| bad())?;
            let object = MappedObject::from_name(name);
            mappings.push(Mapping {
                start: hex(s)?,
                end: hex(e)?,
                offset: hex(offset)?,
                executable: perms.as_bytes().get(2) == Some(&b'x'),
                file_id: (matches!(object, MappedObject::File { .. }) && ino != 0)
                    .then(|| FileId::new(major, minor, ino)),
                object,
            });
        }
        mappings.sort_by_key(|m| m.start);
        Ok(ProcessMaps { mappings })
    }

    /// The mapping holding `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        m.contains(addr).then_some(m)
    }
}

/// This process's resident set, in bytes (`/proc/self/statm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resident {
    /// All of it (`VmRSS`).
    pub total: u64,
    /// File-backed and shared pages (`RssFile` + `RssShmem`): mapped binaries, the
    /// BPF ring buffer.
    pub file: u64,
}

/// This process's [`Resident`] set; `None` when `/proc` cannot be read. Each thread
/// opens `/proc/self/statm` once and reads it again from offset 0 (a `seq_file` writes
/// it anew at each read from the start): the unwinder asks every 32 unwinds, and opening
/// this file each time was 6 % of the agent's CPU at 250 Hz (BENCHMARKS.md, "Agent
/// under churn").
pub fn own_resident() -> Option<Resident> {
    use std::os::unix::fs::FileExt;
    thread_local! {
        static STATM: Option<std::fs::File> = std::fs::File::open("/proc/self/statm").ok();
    }
    let mut buf = [0u8; 256];
    let n = STATM.with(|f| f.as_ref()?.read_at(&mut buf, 0).ok())?;
    let statm = std::str::from_utf8(&buf[..n]).ok()?;
    let mut f = statm.split_whitespace().skip(1);
    let mut pages = || f.next()?.parse::<u64>().ok();
    let (total, file) = (pages()?, pages()?);
    let page = crate::fsafe::page_size() as u64;
    Some(Resident {
        total: total * page,
        file: file * page,
    })
}

/// True while task `pid` (a process, or a thread by its id) has not exited
/// ([`ProcStat::exited`]). A zombie keeps its `/proc/PID` until its parent reaps it,
/// but no maps, no threads and no samples to come: it is gone.
pub fn alive(pid: u32) -> bool {
    ProcStat::of(pid).is_some_and(|s| !s.exited())
}

/// What cpi-bpf reads of a task's `/proc/PID/stat` (proc(5)); the one parser of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 2, as `/proc/PID/comm`: set by the process, so it may hold spaces and `)`.
    pub comm: String,
    /// Field 3: `R`, `S`, `D`, …; `Z` once it has exited, until its parent reaps it.
    pub state: char,
    /// Field 4: its parent process.
    pub parent: u32,
    /// Fields 14 and 15: user plus system CPU time of the process, clock ticks.
    pub cpu_ticks: u64,
    /// Field 20: threads in its process (a zombie main thread counts itself).
    pub threads: u64,
    /// Field 22: start time, clock ticks since boot; with the pid, what identifies a
    /// process across pid reuse.
    pub start: u64,
}

impl ProcStat {
    /// Of task `pid`; `None` when there is no such task.
    pub fn of(pid: u32) -> Option<ProcStat> {
        Self::read(&format!("/proc/{pid}/stat"))
    }

    fn read(path: &str) -> Option<ProcStat> {
        Self::parse(&std::fs::read_to_string(path).ok()?)
    }

    /// `None` when `text` is not a stat line. The fields after comm are counted from
    /// its last `)`, the only one the kernel writes after it.
    pub fn parse(text: &str) -> Option<ProcStat> {
        let (open, close) = (text.find('(')?, text.rfind(')')?);
        let comm = text.get(open + 1..close)?.to_string();
        // Field 3 onwards.
        let f: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
        let num = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
        let mut state = f.first()?.chars();
        Some(ProcStat {
            comm,
            state: state.next().filter(|_| state.next().is_none())?,
            parent: u32::try_from(num(4)?).ok()?,
            cpu_ticks: num(14)?.checked_add(num(15)?)?,
            threads: num(20)?,
            start: num(22)?,
        })
    }

    /// The process has exited: its main thread is a zombie (or dead) and no other thread
    /// is left; only its exit status waits for its parent. One whose main thread exited
    /// while other threads run has not (its pidfd is not readable either).
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X') && self.threads <= 1
    }
}

/// `/proc/PID`.
fn proc_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
}

/// The thread ids of process `pid` (`/proc/PID/task`), sorted.
pub fn threads(pid: u32) -> std::io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The directories of `pid`'s threads other than its group leader, through which its
/// address space is read once the leader has exited (a zombie leader's `maps` and
/// `map_files` are empty while its other threads still run its code): `tid`'s first,
/// while it is one of them (the thread a sample came from is likely still running),
/// then the others in `/proc/PID/task`, listed only if needed. Each is `/proc/TID`,
/// not `/proc/PID/task/TID`, which has no `map_files`; `tid` is taken only while
/// `/proc/PID/task/TID` exists, so a thread id now used by another process is not.
fn thread_dirs(pid: u32, tid: u32) -> impl Iterator<Item = PathBuf> {
    let member = tid != pid && Path::new(&format!("/proc/{pid}/task/{tid}")).exists();
    let own = member.then_some(tid);
    let others = std::iter::once_with(move || threads(pid).unwrap_or_default())
        .flatten()
        .filter(move |&t| t != pid && t != tid);
    own.into_iter().chain(others).map(proc_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one open `/proc/self/statm` is read anew each time: after 64 MiB are touched
    /// it still lies between two reads of `VmRSS` in `/proc/self/status` around it (a
    /// bracket, as other tests allocate in this process meanwhile).
    #[test]
    fn the_resident_set_is_read_anew_from_one_open_file() {
        let vm_rss = || -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
                * 1024
        };
        let bracketed = || {
            let (a, r, b) = (vm_rss(), own_resident().expect("statm").total, vm_rss());
            let slack = 1 << 20;
            assert!(
                (a.min(b).saturating_sub(slack)..=a.max(b) + slack).contains(&r),
                "statm {r} outside VmRSS {a}..{b}"
            );
            r
        };
        let before = bracketed();
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        let after = bracketed();
        std::hint::black_box(&v);
        assert!(after > before, "{before} then {after}");
    }

    const MAPS: &str = "\
55d0c6a00000-55d0c6a02000 r--p 00000000 fd:01 123 /usr/bin/cat
55d0c6a02000-55d0c6a07000 r-xp 00002000 fd:01 123 /usr/bin/cat
7f0000000000-7f0000001000 rwxp 00000000 00:00 0
7f0000100000-7f0000200000 r-xp 00010000 fd:01 9 /tmp/a.out (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_and_finds() {
        let m = ProcessMaps::parse(MAPS).unwrap();
        assert_eq!(m.mappings.len(), 5);
        let text = m.find(0x55d0c6a03000).unwrap();
        assert!(text.executable);
        assert_eq!(text.file_offset(0x55d0c6a03000), 0x3000);
        assert_eq!(m.find(0x7f0000000010).unwrap().object, MappedObject::Anon);
        assert_eq!(
            m.find(0x7f0000100000).unwrap().object,
            MappedObject::File {
                path: "/tmp/a.out".into(),
                deleted: true
            }
        );
        assert_eq!(
            m.find(0x7ffd00000000).unwrap().object.display_name(),
            "[stack]"
        );
        assert!(m.find(0x1000).is_none());
        assert!(m.find(0x55d0c6a07000).is_none(), "end is exclusive");
    }

    #[test]
    fn only_absolute_paths_name_files() {
        let special = |n: &str| MappedObject::Special(n.to_string());
        assert_eq!(MappedObject::from_name(""), MappedObject::Anon);
        assert_eq!(MappedObject::from_name("//anon"), MappedObject::Anon);
        assert_eq!(MappedObject::from_name("[vdso]"), special("[vdso]"));
        for kernel_object in ["anon_inode:bpf-map", "socket:[123]", "a.out"] {
            assert_eq!(
                MappedObject::from_name(kernel_object),
                special(kernel_object)
            );
        }
        assert_eq!(
            MappedObject::from_name("/memfd:jit (deleted)"),
            MappedObject::File {
                path: "/memfd:jit".into(),
                deleted: true
            }
        );
        let m =
            ProcessMaps::parse("1000-2000 r--s 00000000 00:0e 17 anon_inode:bpf-map\n").unwrap();
        assert_eq!(m.mappings[0].object, special("anon_inode:bpf-map"));
        assert_eq!(m.mappings[0].file_id, None, "no file to capture");
    }

    #[test]
    fn older_mappings_stay_where_the_new_image_does_not_overlap() {
        let old = ProcessMaps::parse(
            "1000-2000 r-xp 00000000 fd:01 1 /bin/old\n5000-6000 r-xp 00000000 fd:01 1 /bin/old\n",
        )
        .unwrap();
        let new = ProcessMaps::parse("1800-3000 r-xp 00000000 fd:01 2 /bin/new\n").unwrap();
        let m = new.with_older(old);
        assert_eq!(m.mappings.len(), 2, "{m:?}");
        assert_eq!(m.find(0x1900).unwrap().object.display_name(), "/bin/new");
        assert_eq!(m.find(0x5800).unwrap().object.display_name(), "/bin/old");
        assert!(
            m.find(0x1100).is_none(),
            "an overlapped old mapping is gone"
        );
    }

    #[test]
    fn a_newer_mapping_replaces_the_ones_it_overlaps_in_place() {
        let mut m = ProcessMaps::parse(
            "1000-2000 r-xp 00000000 fd:01 1 /a\n3000-4000 r-xp 00000000 fd:01 2 /b\n\
             5000-6000 r-xp 00000000 fd:01 3 /c\n",
        )
        .unwrap();
        let newer = ProcessMaps::parse("1800-3800 r-xp 00000000 fd:01 4 /d\n").unwrap();
        let d = newer.mappings[0].clone();
        m.overlay(d.clone());
        let names: Vec<String> = m.mappings.iter().map(|x| x.object.display_name()).collect();
        assert_eq!(names, ["/d", "/c"]);
        assert!(m.holds(&d));
        // Same start, another file: not held.
        let other = Mapping {
            file_id: Some(FileId::new(0xfd, 1, 5)),
            ..d.clone()
        };
        assert!(!m.holds(&other));
        m.overlay(
            ProcessMaps::parse("7000-8000 r-xp 00000000 fd:01 6 /e\n")
                .unwrap()
                .mappings[0]
                .clone(),
        );
        assert_eq!(m.mappings.len(), 3);
        assert_eq!(m.find(0x7800).unwrap().object.display_name(), "/e");
    }

    #[test]
    fn malformed_line_is_an_error_with_its_number() {
        let err = ProcessMaps::parse("zz-yy r-xp\n").unwrap_err();
        assert!(
            matches!(err, ProcMapError::Malformed { line: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let line = |comm: &str, state: &str, threads: u32| {
            format!(
                "4242 ({comm}) {state} 17 4242 4242 0 -1 4194560 100 0 0 0 30 12 0 0 20 0 \
                 {threads} 0 123456 1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1\n"
            )
        };
        let s = ProcStat::parse(&line("a) Z 1 (b", "R", 1)).unwrap();
        assert_eq!(
            s,
            ProcStat {
                comm: "a) Z 1 (b".into(),
                state: 'R',
                parent: 17,
                cpu_ticks: 42,
                threads: 1,
                start: 123456,
            }
        );
        assert!(!s.exited());
        let zombie = ProcStat::parse(&line("sh", "Z", 1)).unwrap();
        assert!(zombie.exited());
        // `ps` shows it `Zl`: the main thread exited (pthread_exit), two others run.
        let main_gone = ProcStat::parse(&line("sh", "Z", 3)).unwrap();
        assert!(!main_gone.exited());
        assert_eq!(ProcStat::parse(&line("sh", "RS", 1)), None);
        assert_eq!(ProcStat::parse("4242 (sh) R 1 2"), None);
        assert_eq!(ProcStat::parse(""), None);
        let me = ProcStat::of(std::process::id()).unwrap();
        assert!(!me.exited(), "{me:?}");
    }

    /// `tests/programs/leader_exit.c`: its main thread left by `pthread_exit` while the
    /// worker spins, so `/proc/PID/maps` and `map_files` are empty. Read as a sample of
    /// the worker, of the exited leader, or naming a thread id outside the process, the
    /// maps come through the worker's `/proc/TID` (which has `map_files`, unlike
    /// `/proc/PID/task/TID`), and the program's text is captured through it. Its file
    /// is also reopened through the worker by a path that names nothing here (as from a
    /// mount namespace of its own), as an evicted capture is.
    #[test]
    fn a_process_whose_leader_exited_is_read_through_a_running_thread() {
        use crate::procmap::CapturedFiles;
        let Some(exe) = crate::binary::testbin::debug_build("leader_exit") else {
            return;
        };
        struct Kill(std::process::Child);
        impl Drop for Kill {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Kill(std::process::Command::new(&exe).arg("30").spawn().unwrap());
        let pid = child.0.id();
        let t0 = std::time::Instant::now();
        while !ProcStat::of(pid).is_some_and(|s| s.state == 'Z' && s.threads == 2) {
            assert!(
                t0.elapsed().as_secs() < 30,
                "{pid}: {:?}",
                ProcStat::of(pid)
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let worker = threads(pid)
            .unwrap()
            .into_iter()
            .find(|&t| t != pid)
            .unwrap();
        assert!(ProcessMaps::read(pid).unwrap().mappings.is_empty());
        let text = |maps: &ProcessMaps| {
            maps.mappings
                .iter()
                .find(|m| m.executable && m.object.display_name() == exe.display().to_string())
                .cloned()
        };
        for tid in [worker, pid, std::process::id()] {
            let (maps, dir) = ProcessMaps::read_live(pid, tid).unwrap();
            assert_eq!(dir, proc_dir(worker), "sampled in {tid}");
            let m = text(&maps).unwrap_or_else(|| panic!("no text of {exe:?} in {maps:?}"));
            let got = CapturedFiles::default().capture(&dir, [&m]);
            assert!(
                got.contains_key(&m.start),
                "text not captured through {dir:?}"
            );
            let got = CapturedFiles::default().capture_live(pid, tid, &maps.mappings);
            assert!(got.contains_key(&m.start), "capture_live, sampled in {tid}");
        }
        let (maps, _) = ProcessMaps::read_live(pid, pid).unwrap();
        let m = text(&maps).unwrap();
        let elsewhere = Path::new("/nonexistent/leader_exit");
        crate::procmap::open_mapped_file(pid, &m, elsewhere, true, None)
            .expect("reopened through the worker's map_files");
    }

    #[test]
    fn an_exited_process_its_parent_has_not_reaped_is_not_alive() {
        let z = cpi_tests::Zombie::spawn();
        assert!(
            Path::new(&format!("/proc/{}", z.pid())).exists(),
            "a zombie keeps its /proc entry"
        );
        assert!(!alive(z.pid()), "zombie {} is alive", z.pid());
        assert!(alive(std::process::id()));
    }
}
