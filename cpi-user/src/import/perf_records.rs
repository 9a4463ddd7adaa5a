//! The records of a perf ring buffer other than samples (mappings, names, forks,
//! losses, throttling), decoded alike for a perf.data file ([`super::perf_data`]) and the
//! collector's live buffers (cpi-user/src/collect/sideband.rs, perf_ring.rs), and what
//! they say of each process ([`RecordedProcesses`]), kept alike for both.

use std::collections::HashMap;

use super::perf_data::{c_str, hex, u32_at, u64_at};
use crate::procmap::{MappedObject, Mapping, ProcessMaps};

const PERF_RECORD_MMAP: u32 = 1;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_EXIT: u32 = 4;
const PERF_RECORD_THROTTLE: u32 = 5;
const PERF_RECORD_FORK: u32 = 7;
const PERF_RECORD_MMAP2: u32 = 10;

const MISC_CPUMODE_MASK: u16 = 7;
const MISC_KERNEL: u16 = 1;
const MISC_MMAP_DATA: u16 = 1 << 13;
const MISC_COMM_EXEC: u16 = 1 << 13;
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// What a record other than a sample says, as a perf.data file and the collector's live
/// buffers (cpi-user/src/collect/sideband.rs, perf_ring.rs) both read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SideRecord {
    /// `PERF_RECORD_MMAP`/`MMAP2`: process `pid` mapped something.
    Mmap {
        /// The process.
        pid: u32,
        /// The mapping; an MMAP2 record's device and inode as its `file_id`.
        mapping: Mapping,
        /// The build-id an MMAP2 record carries instead of device and inode.
        build_id: Option<String>,
    },
    /// `PERF_RECORD_COMM`: thread `tid` of `pid` is now called `name`.
    Comm {
        /// The process.
        pid: u32,
        /// The thread.
        tid: u32,
        /// Its new name.
        name: String,
        /// Renamed by an `exec` (`PERF_RECORD_MISC_COMM_EXEC`).
        exec: bool,
    },
    /// `PERF_RECORD_FORK` of a new process `pid` (not a thread) by `ppid`.
    Fork {
        /// The child.
        pid: u32,
        /// Its parent.
        ppid: u32,
        /// When, on the kernel's perf clock.
        time: u64,
    },
    /// `PERF_RECORD_EXIT` of thread `tid` (a process's main thread: `tid` is its pid).
    Exit {
        /// The thread.
        tid: u32,
        /// When, on the kernel's perf clock.
        time: u64,
    },
    /// `PERF_RECORD_LOST`: the kernel dropped this many records, its buffer full.
    Lost(u64),
    /// `PERF_RECORD_THROTTLE`: the kernel stopped an event's sampling until its next
    /// tick (`kernel.perf_event_max_sample_rate`).
    Throttle,
}

/// The one rename rule of live collection and import: thread `tid`'s COMM record names
/// its process `pid` when it is an exec's (flagged only since Linux 3.16, so AutoFDO's
/// 2.6.34 recording in tests/data/autofdo names its exec by the main thread's COMM) or
/// the main thread's own (a prctl); another thread's name is the thread's, taken only
/// while the process has none (`named` false).
pub(crate) fn names_process(pid: u32, tid: u32, exec: bool, named: bool) -> bool {
    exec || tid == pid || !named
}

/// Where side-band records come from, which says what their mappings mean here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Origin {
    /// This machine's kernel, now (live collection): a mapping's device and inode name
    /// the file here, and a new mapping replaces what it overlaps, as in the process.
    /// The records are read before the samples they explain, and the collector keeps
    /// an image an `exec` replaced for earlier samples itself (`ProcessMaps::with_older`).
    #[default]
    Live,
    /// A recording (perf.data), perhaps made elsewhere: device and inode mean nothing
    /// here, and every mapping is kept (sorted by start, then in record order by
    /// [`RecordedProcesses::finish`]): an import places all of a process's samples on the
    /// mappings of the whole recording, so an image replaced by `exec` still explains
    /// the samples taken before it.
    Recording,
}

/// What the side-band records said of one process (a forked child's is its parent's:
/// the same code mapped, under the same exec, until it maps or execs its own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// Its name under [`names_process`]'s rule; empty until a COMM record (or its
    /// parent's) names it.
    pub comm: String,
    /// Its executable mappings.
    pub maps: ProcessMaps,
    /// Its `exec` was recorded: `maps` holds all its code since (bar the vDSO).
    pub exec: bool,
}

/// Exits (and forks) kept between two [`RecordedProcesses::forget_exits`]: a host's
/// exits of one window cost at most this many entries; one past it is asked of `/proc`.
const MAX_EXITS: usize = 65_536;

/// The one owner of what the kernel's side-band records say of each pid, for live
/// collection (collect/processes.rs) and perf.data import alike: its name (the rename
/// rule), its executable mappings, its `exec`, a forked child's inheritance, and, live,
/// which threads exited.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecordedProcesses {
    origin: Origin,
    by_pid: HashMap<u32, Recorded>,
    /// Threads whose exit was recorded (live collection), and when, kept while their
    /// process is held ([`Self::forget_exits`]): a process whose main thread is among
    /// them is gone, and needs no `/proc` read to say so.
    exited: HashMap<u32, u64>,
    /// Processes forked since then, and when: a pid given to a new process after its
    /// old one's exit is not gone. Each CPU has its buffer, so a short-lived child's
    /// exit is often read before its fork: the times order them.
    forked: HashMap<u32, u64>,
}

impl RecordedProcesses {
    /// None recorded yet, of records from `origin`.
    pub(crate) fn new(origin: Origin) -> Self {
        RecordedProcesses {
            origin,
            by_pid: HashMap::new(),
            exited: HashMap::new(),
            forked: HashMap::new(),
        }
    }

    /// Takes in one record, in the order the kernel wrote them; losses and throttling
    /// say nothing of processes.
    pub(crate) fn observe(&mut self, record: SideRecord) {
        match record {
            SideRecord::Mmap {
                pid, mut mapping, ..
            } => {
                if !mapping.executable || mapping.start >= mapping.end {
                    return;
                }
                let maps = &mut self.by_pid.entry(pid).or_default().maps;
                match self.origin {
                    Origin::Live => {
                        // Identity only for a file with an inode (an MMAP2 record
                        // without build-id).
                        mapping.file_id = mapping.file_id.filter(|id| {
                            id.ino != 0 && matches!(mapping.object, MappedObject::File { .. })
                        });
                        maps.overlay(mapping);
                    }
                    Origin::Recording => {
                        mapping.file_id = None;
                        maps.mappings.push(mapping);
                    }
                }
            }
            SideRecord::Comm {
                pid,
                tid,
                name,
                exec,
            } => {
                let r = self.by_pid.entry(pid).or_default();
                r.exec |= exec;
                if names_process(pid, tid, exec, !r.comm.is_empty()) {
                    r.comm = name;
                }
            }
            SideRecord::Fork { pid, ppid, time } => {
                if self.exited.get(&pid).is_some_and(|&exit| exit < time) {
                    self.exited.remove(&pid);
                }
                if self.forked.len() < MAX_EXITS {
                    self.forked.insert(pid, time);
                }
                // A child that maps nothing new has no records of its own: what its
                // parent had (name, mappings, exec) is its until it maps or execs.
                if let Some(parent) = self.by_pid.get(&ppid).cloned() {
                    self.by_pid.entry(pid).or_insert(parent);
                }
            }
            SideRecord::Exit { tid, time } => {
                let reborn = self.forked.get(&tid).is_some_and(|&fork| fork > time);
                if !reborn && self.exited.len() < MAX_EXITS {
                    self.exited.insert(tid, time);
                }
            }
            SideRecord::Lost(_) | SideRecord::Throttle => {}
        }
    }

    /// Whether thread `tid`'s exit was recorded and is kept ([`Self::forget_exits`]; for a
    /// process: its main thread's, `tid` its pid). False says nothing: the exit may
    /// predate the records, or be past [`MAX_EXITS`].
    pub(crate) fn exited(&self, tid: u32) -> bool {
        self.exited.contains_key(&tid)
    }

    /// A sample of another thread of process `pid`: the exit recorded of its main
    /// thread, if any, may not be the process's (a main thread that called
    /// `pthread_exit` leaves the others running), so it is forgotten, and `/proc`
    /// asked as before.
    pub(crate) fn other_thread_seen(&mut self, pid: u32) {
        self.exited.remove(&pid);
    }

    /// The end of a window: the exits it recorded have been acted on, but for those of
    /// processes still held (kept a window more for samples read late: they leave at
    /// the next window's end, known gone then too).
    pub(crate) fn forget_exits(&mut self) {
        let by_pid = &self.by_pid;
        self.exited = std::mem::take(&mut self.exited)
            .into_iter()
            .filter(|(pid, _)| by_pid.contains_key(pid))
            .collect();
        self.forked = HashMap::new();
    }

    /// The end of a recording's records ([`Origin::Recording`]): each process's
    /// mappings sorted by start, those of one start in record order.
    pub(crate) fn finish(&mut self) {
        for r in self.by_pid.values_mut() {
            r.maps.mappings.sort_by_key(|m| m.start);
        }
    }

    /// What was recorded of `pid`.
    pub(crate) fn get(&self, pid: u32) -> Option<&Recorded> {
        self.by_pid.get(&pid)
    }

    /// Every process recorded, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Recorded)> {
        self.by_pid.iter().map(|(&pid, r)| (pid, r))
    }

    /// Keeps only the processes `keep` says.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.by_pid.retain(|&pid, _| keep(pid));
    }

    /// Processes recorded.
    pub(crate) fn len(&self) -> usize {
        self.by_pid.len()
    }
}

/// The record of type `kind` with its header's `misc` and `body` (what follows the
/// 8-byte header), when it is one of [`SideRecord`]'s.
pub(crate) fn side_record(kind: u32, misc: u16, body: &[u8]) -> Option<SideRecord> {
    match kind {
        PERF_RECORD_MMAP | PERF_RECORD_MMAP2 => {
            let (pid, mapping, build_id) = parse_mmap(kind, misc, body)?;
            Some(SideRecord::Mmap {
                pid,
                mapping,
                build_id,
            })
        }
        PERF_RECORD_COMM => Some(SideRecord::Comm {
            pid: u32_at(body, 0)?,
            tid: u32_at(body, 4)?,
            name: c_str(body.get(8..)?),
            exec: misc & MISC_COMM_EXEC != 0,
        }),
        PERF_RECORD_FORK => {
            let (pid, ppid) = (u32_at(body, 0)?, u32_at(body, 4)?);
            // The time matters only live, where the kernel always writes it.
            let time = u64_at(body, 16).unwrap_or(0);
            (pid != ppid).then_some(SideRecord::Fork { pid, ppid, time })
        }
        // pid, ppid, tid, ptid, time.
        PERF_RECORD_EXIT => Some(SideRecord::Exit {
            tid: u32_at(body, 8)?,
            time: u64_at(body, 16)?,
        }),
        PERF_RECORD_LOST => Some(SideRecord::Lost(u64_at(body, 8)?)),
        PERF_RECORD_THROTTLE => Some(SideRecord::Throttle),
        _ => None,
    }
}

/// Whether a record's `misc` says it was taken in kernel mode.
pub(crate) fn kernel_mode(misc: u16) -> bool {
    misc & MISC_CPUMODE_MASK == MISC_KERNEL
}

/// `(pid, mapping, build-id)` of an MMAP/MMAP2 record; `None` for the kernel's maps.
fn parse_mmap(kind: u32, misc: u16, b: &[u8]) -> Option<(u32, Mapping, Option<String>)> {
    let pid = i32::from_le_bytes(b.get(0..4)?.try_into().ok()?);
    let pid = u32::try_from(pid).ok()?;
    let (start, len, pgoff) = (u64_at(b, 8)?, u64_at(b, 16)?, u64_at(b, 24)?);
    let (exec, build_id, name_at) = if kind == PERF_RECORD_MMAP {
        (misc & MISC_MMAP_DATA == 0, None, 32)
    } else {
        let id = (misc & MISC_MMAP_BUILD_ID != 0).then(|| {
            let n = (*b.get(32).unwrap_or(&0) as usize).min(20);
            hex(b.get(36..36 + n).unwrap_or(&[]))
        });
        let prot = u32_at(b, 56)?;
        (prot & 4 != 0, id, 64)
    };
    let file_id = (kind == PERF_RECORD_MMAP2 && misc & MISC_MMAP_BUILD_ID == 0)
        .then(|| {
            Some(crate::fsafe::FileId::new(
                u32_at(b, 32)?,
                u32_at(b, 36)?,
                u64_at(b, 40)?,
            ))
        })
        .flatten();
    let path = c_str(b.get(name_at..)?);
    let object = MappedObject::from_name(&path);
    Some((
        pid,
        Mapping {
            start,
            end: start.checked_add(len)?,
            offset: pgoff,
            executable: exec,
            object,
            file_id,
        },
        build_id,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mmap2(pid: u32, addr: u64, len: u64, pgoff: u64, prot: u32, name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(pid.to_ne_bytes());
        b.extend(pid.to_ne_bytes());
        for v in [addr, len, pgoff] {
            b.extend(v.to_ne_bytes());
        }
        b.extend([0u8; 8]); // maj, min
        b.extend(77u64.to_ne_bytes()); // ino
        b.extend([0u8; 8]); // ino_generation
        b.extend(prot.to_ne_bytes());
        b.extend(2u32.to_ne_bytes()); // MAP_PRIVATE
        b.extend(name.as_bytes());
        b.push(0);
        b
    }

    fn comm(pid: u32, tid: u32, name: &str, exec: bool) -> SideRecord {
        SideRecord::Comm {
            pid,
            tid,
            name: name.into(),
            exec,
        }
    }

    fn mmap(pid: u32, start: u64, end: u64, name: &str) -> SideRecord {
        let b = mmap2(pid, start, end - start, 0, 5, name);
        side_record(PERF_RECORD_MMAP2, 0, &b).expect("a mapping")
    }

    fn starts(r: &RecordedProcesses, pid: u32) -> Vec<(u64, String)> {
        let maps = &r.get(pid).expect("recorded").maps.mappings;
        maps.iter()
            .map(|m| (m.start, m.object.display_name()))
            .collect()
    }

    #[test]
    fn executable_mmap2_records_become_mappings() {
        let body = mmap2(42, 0x1000, 0x2000, 0x3000, 5, "/usr/bin/true");
        let mut live = RecordedProcesses::new(Origin::Live);
        live.observe(side_record(PERF_RECORD_MMAP2, 0, &body).expect("decoded"));
        let m = &live.get(42).expect("recorded").maps.mappings[0];
        assert_eq!((m.start, m.end, m.offset), (0x1000, 0x3000, 0x3000));
        assert_eq!(m.object.display_name(), "/usr/bin/true");
        assert_eq!(m.file_id.map(|id| id.ino), Some(77), "this machine's file");
        let mut imported = RecordedProcesses::new(Origin::Recording);
        imported.observe(side_record(PERF_RECORD_MMAP2, 0, &body).expect("decoded"));
        let m = &imported.get(42).expect("recorded").maps.mappings[0];
        assert_eq!(m.file_id, None, "another machine's inode");
        let data = mmap2(43, 0x1000, 0x2000, 0, 3, "/etc/ld.so.cache");
        live.observe(side_record(PERF_RECORD_MMAP2, 0, &data).expect("decoded"));
        assert_eq!(live.get(43), None, "not code");
        assert_eq!(
            side_record(PERF_RECORD_MMAP2, 0, &body[..20]),
            None,
            "truncated"
        );
    }

    #[test]
    fn comm_records_say_exec() {
        let mut b = Vec::new();
        b.extend(7u32.to_ne_bytes());
        b.extend(7u32.to_ne_bytes());
        b.extend(b"true\0\0\0\0");
        assert_eq!(
            side_record(PERF_RECORD_COMM, MISC_COMM_EXEC, &b),
            Some(comm(7, 7, "true", true))
        );
    }

    /// [`names_process`]: another thread's name does not rename its process once it
    /// has one; an exec's and the main thread's do; an exec is remembered.
    #[test]
    fn only_an_exec_or_the_main_thread_renames_a_process() {
        let mut r = RecordedProcesses::new(Origin::Live);
        let mut name = |tid: u32, name: &str, exec: bool| {
            r.observe(comm(9, tid, name, exec));
            let p = r.get(9).expect("recorded");
            (p.comm.clone(), p.exec)
        };
        assert_eq!(
            name(10, "worker", false),
            ("worker".into(), false),
            "a first name"
        );
        assert_eq!(
            name(9, "server", false),
            ("server".into(), false),
            "the main thread's"
        );
        assert_eq!(
            name(11, "pool-2", false),
            ("server".into(), false),
            "a thread's own"
        );
        assert_eq!(name(11, "sh", true), ("sh".into(), true), "an exec's");
    }

    /// A forked child is its parent until it maps or execs its own, under both origins;
    /// a child recorded before its fork record keeps its own.
    #[test]
    fn a_forked_child_has_its_parents_name_and_mappings() {
        for origin in [Origin::Live, Origin::Recording] {
            let mut r = RecordedProcesses::new(origin);
            r.observe(comm(5, 5, "bash", true));
            r.observe(mmap(5, 0x1000, 0x2000, "/bin/bash"));
            r.observe(SideRecord::Fork {
                pid: 6,
                ppid: 5,
                time: 1,
            });
            assert_eq!(r.get(6), r.get(5), "{origin:?}");
            r.observe(mmap(6, 0x8000, 0x9000, "/lib/x.so"));
            r.observe(comm(6, 6, "true", true));
            r.finish();
            assert_eq!(r.get(6).expect("child").comm, "true");
            assert_eq!(
                starts(&r, 6),
                [(0x1000, "/bin/bash".into()), (0x8000, "/lib/x.so".into())]
            );
            assert_eq!(
                starts(&r, 5),
                [(0x1000, "/bin/bash".into())],
                "the parent's own"
            );
            r.observe(mmap(8, 0x3000, 0x4000, "/bin/own"));
            r.observe(SideRecord::Fork {
                pid: 8,
                ppid: 5,
                time: 1,
            });
            r.observe(SideRecord::Fork {
                pid: 9,
                ppid: 7,
                time: 1,
            });
            assert_eq!(starts(&r, 8), [(0x3000, "/bin/own".into())]);
            assert_eq!(r.get(9), None, "a parent nothing was recorded of");
        }
    }

    /// An EXIT record names its thread and time. An exit is kept until the window's
    /// end forgets it; a fork of the same pid after it (a new process given the pid)
    /// clears it, whichever CPU's buffer is read first; the processes are told it
    /// when retained; a host's burst of exits is bounded.
    #[test]
    fn exits_are_recorded_until_forgotten_or_the_pid_forks_again() {
        let mut body = Vec::new();
        for v in [40u32, 1, 41, 40] {
            body.extend(v.to_ne_bytes()); // pid, ppid, tid, ptid
        }
        body.extend(123u64.to_ne_bytes()); // time
        assert_eq!(
            side_record(PERF_RECORD_EXIT, 0, &body),
            Some(SideRecord::Exit { tid: 41, time: 123 })
        );
        assert_eq!(side_record(PERF_RECORD_EXIT, 0, &body[..8]), None, "short");
        let fork = |pid, time| SideRecord::Fork { pid, ppid: 1, time };
        let mut r = RecordedProcesses::new(Origin::Live);
        r.observe(mmap(5, 0x1000, 0x2000, "/bin/sh"));
        r.observe(mmap(6, 0x1000, 0x2000, "/bin/sh"));
        // A short-lived child's exit read before its fork (another CPU's buffer).
        r.observe(SideRecord::Exit { tid: 5, time: 20 });
        r.observe(fork(5, 10));
        r.observe(SideRecord::Exit { tid: 7, time: 20 });
        assert!(r.exited(5) && r.exited(7) && !r.exited(6));
        let mut told = Vec::new();
        r.retain(|pid| {
            told.push(pid);
            pid != 5
        });
        told.sort_unstable();
        assert_eq!(told, [5, 6]);
        assert!(r.get(5).is_none() && r.get(6).is_some());
        // Pid 7 given to a new process: read after the old one's exit, or before it.
        r.observe(fork(7, 30));
        assert!(!r.exited(7), "pid 7 is a new process");
        r.observe(fork(8, 30));
        r.observe(SideRecord::Exit { tid: 8, time: 25 });
        assert!(!r.exited(8), "pid 8 is a new process");
        r.observe(mmap(9, 0x1000, 0x2000, "/bin/sh"));
        r.observe(SideRecord::Exit { tid: 9, time: 30 });
        r.forget_exits();
        assert!(
            !r.exited(5) && !r.exited(7),
            "forgotten with their processes"
        );
        assert!(r.exited(9), "kept while its process is held");
        r.retain(|pid| pid != 9);
        r.forget_exits();
        assert!(!r.exited(9) && r.get(9).is_none());
        for tid in 0..MAX_EXITS as u32 + 10 {
            r.observe(SideRecord::Exit { tid, time: 40 });
        }
        assert!(r.exited(0) && !r.exited(MAX_EXITS as u32), "bounded");
    }

    /// Live, a new mapping replaces what it overlaps; a recording keeps every mapping
    /// (an image replaced by exec explains the samples before it), sorted by start,
    /// then in record order. A mapping of no bytes is no mapping.
    #[test]
    fn origins_keep_overlapping_mappings_differently() {
        let mut live = RecordedProcesses::new(Origin::Live);
        let mut imported = RecordedProcesses::new(Origin::Recording);
        for r in [&mut live, &mut imported] {
            r.observe(mmap(1, 0x5000, 0x9000, "/old"));
            r.observe(mmap(1, 0x1000, 0x2000, "/lib"));
            r.observe(mmap(1, 0x5000, 0x6000, "/new"));
            r.observe(mmap(1, 0x7000, 0x7000, "/empty"));
            r.finish();
        }
        assert_eq!(
            starts(&live, 1),
            [(0x1000, "/lib".into()), (0x5000, "/new".into())]
        );
        assert_eq!(
            starts(&imported, 1),
            [
                (0x1000, "/lib".into()),
                (0x5000, "/old".into()),
                (0x5000, "/new".into())
            ]
        );
    }
}
