//! The collector's one tracker of processes, keyed by pid and start time: each
//! process's comm, mappings, identity (cgroup, container, pod) and captured files, read
//! when its pid is first sampled, re-read when an address misses them, taken from the
//! kernel's side-band records where they explain it (or its exit was recorded: `/proc`
//! is not asked of a process known gone), and kept after it exits. It tells
//! the unwinder which mappings changed and a window's reader which processes were
//! replaced or left ([`ProcessChanges`]): who keeps per-process state beside it (the
//! agent's symbolizer) drops the same.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::target;
use crate::import::perf_records::{RecordedProcesses, SideRecord};
use crate::procmap::{self, CapturedFiles, Mapping, ProcessIdentity, ProcessMaps};
use crate::profile::SampleSet;
use crate::unwind::StackUnwinder;

/// Re-read a process's maps on a miss at most this often (a genuinely unmapped
/// address must not turn every sample into a `/proc` read)…
const REREAD_EVERY: Duration = Duration::from_millis(100);

/// …and no sooner than this many times what the last read (and its captures) took: a
/// process with 25 000 mappings costs 50–100 ms a read, so one whose mappings the
/// kernel's records do not explain (records lost) cannot take more than 2 % of the
/// collector (BENCHMARKS.md, "A hostile host: mapping churn").
const REREAD_COST_RATIO: u32 = 50;

/// Cgroups whose identity is kept at most ([`Processes::by_cgroup`]); past it the table
/// starts again empty. A host has hundreds to a few thousand.
const MAX_CGROUPS: usize = 16_384;

/// What the collector did to learn processes' mappings since it started: it grows with
/// the mappings that changed, not with those the processes hold.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MapsWork {
    /// Reads of a `/proc/PID/maps`.
    pub reads: u64,
    /// Files of mappings opened to be captured.
    pub captures: u64,
}

/// The processes a window ended or replaced: `Processes` is their one tracker, and whoever
/// keeps state per process beside it (the agent's symbolizer) drops the same.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessChanges {
    /// Pids given to a new process since the previous window (another start time): what
    /// was kept for the old one is stale before this window is analysed.
    pub reused: Vec<u32>,
    /// Processes gone: no sample will follow this window's. Sorted.
    pub left: Vec<u32>,
}

/// What the collector knows of processes between samples and windows.
#[derive(Debug, Default)]
pub(crate) struct Processes {
    /// Reads of maps so far.
    pub(super) maps_reads: u64,
    /// When each process's maps may be read again on a miss.
    pub(super) maps_read_at: HashMap<u32, Instant>,
    /// Comm and maps of the processes of earlier windows ([`Processes::end_window`]),
    /// given back to a process when it shows up again in a later window.
    pub(super) known: HashMap<u32, Known>,
    /// Pids of this window whose earlier state belonged to another process (a new
    /// start time: the pid was reused), dropped at its first sample.
    pub(super) reused: Vec<u32>,
    /// Files of executable mappings, opened while their processes live.
    pub(super) files: CapturedFiles,
    /// Comm and executable mappings per pid from side-band records
    /// ([`super::sideband`]): what is left of a process gone before `/proc` was read,
    /// and, for one whose `exec` they saw, all its code: its maps are then not read.
    pub(super) recorded: RecordedProcesses,
    /// Identities by cgroup v2 id (a record's `cgroup_id`), each learnt from the first
    /// process of its cgroup read from `/proc` on a cgroup v2 host: later processes of
    /// the cgroup cost no read, and one gone before its first sample was drained still
    /// gets its container (BENCHMARKS.md, "Agent under churn").
    pub(super) by_cgroup: HashMap<u64, ProcessIdentity>,
}

impl Processes {
    /// The end of a window whose samples are `set`: each process's start time read
    /// once, what is known of it kept for later windows while its pid keeps its start
    /// time; what the unwinder and the captured files hold goes with the processes.
    pub(crate) fn end_window(
        &mut self,
        set: &mut SampleSet,
        unwinder: &mut StackUnwinder,
    ) -> ProcessChanges {
        let mut left = Vec::new();
        for (&pid, p) in &mut set.processes {
            // Read once, at the end of the process's first window: with the pid, what
            // tells it from a later process given the same pid. A process already gone
            // needs none: it will have no more samples.
            if p.start.is_none() && pid != 0 {
                p.start = unless_exited(&self.recorded, pid, target::process_start);
            }
            if p.start.is_none() && pid != 0 {
                left.push(pid);
                continue;
            }
            self.known.insert(
                pid,
                Known {
                    start: p.start,
                    comm: p.comm.clone(),
                    identity: p.identity.clone(),
                    maps: p.maps.clone(),
                    files: p.files.clone(),
                },
            );
        }
        // What is held per process stays bounded under churn: a process gone with no
        // sample in this window will have none later (its pid, if reused, is another
        // process, with another start time), so it leaves after its last window.
        self.known.retain(|pid, k| {
            let keep = set.processes.get(pid).map_or_else(
                || unless_exited(&self.recorded, *pid, target::process_start),
                |p| p.start,
            ) == k.start;
            if !keep {
                left.push(*pid);
            }
            keep
        });
        left.sort_unstable();
        left.dedup();
        let gone: HashSet<u32> = (self.recorded.iter())
            .map(|(pid, _)| pid)
            .filter(|pid| !set.processes.contains_key(pid) && !self.alive(*pid))
            .collect();
        self.recorded.retain(|pid| !gone.contains(&pid));
        self.recorded.forget_exits();
        self.maps_read_at
            .retain(|pid, _| self.known.contains_key(pid));
        let known = &self.known;
        unwinder.retain_processes(|pid| known.contains_key(&pid));
        // Files no process held for a while (the window handed out still holds its
        // own): a binary whose processes come and go keeps its capture.
        self.files.release_idle();
        ProcessChanges {
            reused: std::mem::take(&mut self.reused),
            left,
        }
    }

    /// Processes it keeps anything for (name, maps, files, side-band records,
    /// when maps were read): the largest of its per-process tables.
    pub(crate) fn held(&self) -> usize {
        self.known
            .len()
            .max(self.recorded.len())
            .max(self.maps_read_at.len())
    }

    /// Maps read and files captured since start.
    #[cfg(test)]
    pub(crate) fn maps_work(&self) -> MapsWork {
        MapsWork {
            reads: self.maps_reads,
            captures: self.files.opened(),
        }
    }

    /// Evictions and reopens of the captured files.
    pub(crate) fn capture_counter(&self) -> procmap::CaptureCounter {
        self.files.counter()
    }
    /// Takes in one side-band record (read before the samples it may explain).
    pub(crate) fn observe(&mut self, set: &mut SampleSet, record: SideRecord) {
        if let SideRecord::Comm {
            pid,
            name,
            exec: true,
            ..
        } = &record
        {
            // A new image: the old one's mappings stay for earlier samples (see
            // ProcessMaps::with_older); its name is the new one.
            if let Some(p) = set.processes.get_mut(pid) {
                p.comm.clone_from(name);
            }
        }
        self.recorded.observe(record);
    }

    /// A process's first sample of this window: what earlier windows learnt of it,
    /// unless its pid now belongs to another process (another start time). Only pids
    /// known from earlier windows, and not recorded gone, cost a `/proc/PID/stat` read
    /// here.
    pub(crate) fn first_in_window(&mut self, set: &mut SampleSet, pid: u32) {
        let Some(k) = self.known.get(&pid) else {
            return;
        };
        let start = unless_exited(&self.recorded, pid, target::comm_and_start);
        let p = set.process(pid);
        match start {
            // Gone already: no other process has taken the pid yet, so it is the one
            // we knew.
            None => p.comm.clone_from(&k.comm),
            Some((comm, start)) if k.start == Some(start) => p.comm = comm,
            Some(_) => {
                self.known.remove(&pid);
                self.maps_read_at.remove(&pid);
                self.reused.push(pid);
                return;
            }
        }
        p.start = k.start;
        p.identity.clone_from(&k.identity);
        p.maps.clone_from(&k.maps);
        p.files.clone_from(&k.files);
    }

    /// Comm, maps and mapped files of `pid`: on first sight taken from the kernel's
    /// records when they saw its `exec` (they hold all its code: its `/proc/PID/maps` is
    /// not read, and its files are the captures of earlier processes of the same
    /// binaries), else read; on a miss (`addr`, a user address, in none of the known
    /// mappings) taken from the records, else re-read (at most every `REREAD_EVERY`, and
    /// `REREAD_COST_RATIO` times the last read's cost). Only mappings not known before
    /// have their files captured: a new mapping costs its own open, not one per mapping
    /// the process holds, and a binary captured for another process none. What is read
    /// while the process lives is what analysis uses after it is gone: the files are
    /// opened at once (deleted, replaced and other-namespace binaries stay readable), and
    /// mappings from before an `exec` are kept where the new image does not overlap them.
    pub(crate) fn track(
        &mut self,
        set: &mut SampleSet,
        unwinder: &mut StackUnwinder,
        (pid, tid, cgroup_id): (u32, u32, u64),
        addr: Option<u64>,
    ) {
        let p = set.process(pid);
        if pid == 0 {
            // The idle task (system-wide, kernel samples): no /proc entry, no maps.
            p.comm = "swapper".to_string();
            return;
        }
        let first = p.maps.is_none() && !self.maps_read_at.contains_key(&pid);
        if tid != pid {
            self.recorded.other_thread_seen(pid);
        }
        // Gone already (a short-lived process, its samples drained after its exit):
        // `/proc` has nothing left of it, and the records say all there is.
        let gone = self.recorded.exited(pid);
        let named = self
            .recorded
            .get(pid)
            .filter(|r| (r.exec || gone) && !r.comm.is_empty());
        if p.comm.is_empty() {
            p.comm = match named {
                Some(r) => r.comm.clone(),
                None => comm_unless_exited(&self.recorded, pid),
            };
        }
        if first {
            // Now, before the process can exit: who it is (cgroup, container, pod).
            p.identity = self.identity(pid, cgroup_id, ProcessIdentity::read);
        }
        let miss = addr.filter(|&a| a != 0 && p.maps.as_ref().is_none_or(|m| m.find(a).is_none()));
        // The kernel's records explain a miss at once, without reading /proc (an exec'd
        // child whose maps were read as its parent's a moment ago, a library just
        // loaded). A first sample reads /proc while the process lives (what the records
        // hold lacks the vDSO and every file a fork inherited, and taking them alone
        // tripled the unmapped samples and failed stacks of short-lived children),
        // else takes the records ([`Self::read_maps`]).
        let explained = !first
            && miss.is_some_and(|a| self.adopt_recorded_address(set, unwinder, (pid, tid), a));
        if !explained && (first || miss.is_some() && self.maps_due(pid)) {
            self.read_maps(set, unwinder, pid, tid, first);
        }
        let p = set.process(pid);
        if p.comm.is_empty() {
            // Gone before its name could be read: the thread's, else the pid.
            p.comm = comm_unless_exited(&self.recorded, tid);
            if p.comm.is_empty() {
                p.comm = format!("[pid {pid}]");
            }
        }
    }

    /// Who process `pid` of cgroup v2 `cgroup_id` (0: unknown) is: its cgroup's identity
    /// where known, else `read` (from `/proc`: [`ProcessIdentity::read`]), and kept for
    /// its cgroup where `read` says every process of it has that identity.
    fn identity(
        &mut self,
        pid: u32,
        cgroup_id: u64,
        read: impl FnOnce(u32) -> Option<(ProcessIdentity, bool)>,
    ) -> Option<ProcessIdentity> {
        if let Some(known) = self.by_cgroup.get(&cgroup_id) {
            return Some(known.clone());
        }
        let (identity, shared) = unless_exited(&self.recorded, pid, read)?;
        if shared && cgroup_id != 0 {
            if self.by_cgroup.len() >= MAX_CGROUPS {
                self.by_cgroup.clear();
            }
            self.by_cgroup.insert(cgroup_id, identity.clone());
        }
        Some(identity)
    }

    /// An address of `pid` (thread `tid`), a sample's own or a frame's, in none of its
    /// known mappings but in one the kernel recorded (a library mapped since its maps
    /// were read): the recorded mappings join them. Only the records: a frame is often
    /// past the stack's end (garbage), and re-reading `/proc` for each would cost a
    /// short-lived process a read per sample ([`Self::track`] re-reads for a sample's
    /// own address, at most every [`REREAD_EVERY`]). True when they joined.
    pub(crate) fn adopt_recorded_address(
        &mut self,
        set: &mut SampleSet,
        unwinder: &mut StackUnwinder,
        (pid, tid): (u32, u32),
        addr: u64,
    ) -> bool {
        let recorded = (self.recorded.get(pid))
            .is_some_and(|r| r.maps.find(addr).is_some_and(|m| m.executable));
        if maps_hold(set, pid, addr) || !recorded {
            return false;
        }
        self.adopt_records(set, unwinder, pid, tid);
        true
    }

    /// A call stack's return address `addr` of `pid` in no mapping known: the mapping
    /// the kernel recorded ([`Self::adopt_recorded_address`]), else `/proc` read again
    /// (at most every [`REREAD_EVERY`], while the process lives). Per-CPU events record
    /// a library's mmap in its CPU's buffer, which may be drained after a sample taken on
    /// another CPU that returns into it. Whether the maps now hold `addr`.
    pub(crate) fn explain_stack_miss(
        &mut self,
        set: &mut SampleSet,
        unwinder: &mut StackUnwinder,
        (pid, tid): (u32, u32),
        addr: u64,
    ) -> bool {
        if self.adopt_recorded_address(set, unwinder, (pid, tid), addr) {
            return true;
        }
        if maps_hold(set, pid, addr) || self.recorded.exited(pid) || !self.maps_due(pid) {
            return false;
        }
        self.read_maps(set, unwinder, pid, tid, false);
        maps_hold(set, pid, addr)
    }

    /// Whether thread `tid` lives ([`procmap::alive`], through [`unless_exited`]).
    pub(crate) fn alive(&self, tid: u32) -> bool {
        unless_exited(&self.recorded, tid, |t| procmap::alive(t).then_some(())).is_some()
    }

    /// Whether `pid`'s maps may be read again ([`REREAD_EVERY`]).
    fn maps_due(&self, pid: u32) -> bool {
        self.maps_read_at
            .get(&pid)
            .is_none_or(|&t| Instant::now() >= t)
    }

    /// [`Self::track`]: `pid`'s mappings the kernel recorded that it does not know yet
    /// join its maps, their files captured (open them now, while the process lives:
    /// after it exits a file seen only in its mount namespace, a container's, cannot be
    /// found; a file captured for another process costs nothing).
    fn adopt_records(
        &mut self,
        set: &mut SampleSet,
        unwinder: &mut StackUnwinder,
        pid: u32,
        tid: u32,
    ) {
        let Some(r) = self.recorded.get(pid) else {
            return;
        };
        let p = set.process(pid);
        let fresh: Vec<Mapping> = (r.maps.mappings.iter())
            .filter(|r| p.maps.as_ref().is_none_or(|o| !o.holds(r)))
            .cloned()
            .collect();
        drop_replaced_captures(&mut p.files, fresh.iter());
        for (start, f) in self.files.capture_live(pid, tid, &fresh) {
            p.files.insert(start, f);
        }
        unwinder.maps_changed(pid, fresh.iter().map(|r| r.start..r.end));
        let maps = p.maps.get_or_insert_with(ProcessMaps::default);
        for r in fresh {
            maps.overlay(r);
        }
        if !r.comm.is_empty() {
            p.comm.clone_from(&r.comm);
        }
    }

    /// [`Self::track`]: reads `pid`'s maps from `/proc` (a process already gone keeps
    /// the maps and name read last time, else what the kernel recorded of it).
    fn read_maps(
        &mut self,
        set: &mut SampleSet,
        unwinder: &mut StackUnwinder,
        pid: u32,
        tid: u32,
        first: bool,
    ) {
        let p = set.process(pid);
        let began = Instant::now();
        self.maps_reads += 1;
        let live = unless_exited(&self.recorded, pid, |pid| {
            ProcessMaps::read_live(pid, tid).ok()
        });
        let read = match live {
            Some((m, dir)) => {
                let fresh: Vec<&Mapping> = (m.mappings.iter())
                    .filter(|x| p.maps.as_ref().is_none_or(|o| !o.holds(x)))
                    .collect();
                drop_replaced_captures(&mut p.files, fresh.iter().copied());
                // Merged below as `with_older`: the old maps overlaid with these.
                unwinder.maps_changed(pid, fresh.iter().map(|x| x.start..x.end));
                for (start, f) in self.files.capture(&dir, fresh) {
                    p.files.insert(start, f);
                }
                Some(m)
            }
            // Gone already: what the kernel recorded of it.
            None => self.recorded.get(pid).map(|r| {
                if !r.comm.is_empty() {
                    p.comm.clone_from(&r.comm);
                }
                for (start, f) in self.files.capture_live(pid, tid, &r.maps.mappings) {
                    p.files.insert(start, f);
                }
                r.maps.clone()
            }),
        };
        if let Some(m) = read {
            p.maps = Some(match p.maps.take() {
                Some(older) => m.with_older(older),
                None => m,
            });
        }
        // A miss usually means exec replaced the image (a shell wrapper or a pyenv
        // shim becoming the real program): its name changed with it. (On first sight
        // it was read a moment ago.)
        if !first {
            let comm = comm_unless_exited(&self.recorded, pid);
            if !comm.is_empty() {
                p.comm = comm;
            }
        }
        let wait = REREAD_EVERY.max(began.elapsed() * REREAD_COST_RATIO);
        self.maps_read_at.insert(pid, began + wait);
    }
}

/// Whether the maps known of `pid` hold `addr` in executable memory. Not merely in a
/// mapping: `ld.so` first reserves a library's whole extent readable only, then maps
/// its text over it, and maps read in between hold every address of that text in the
/// reservation (every stack of a run then stopped at libc's return into `main`).
fn maps_hold(set: &mut SampleSet, pid: u32, addr: u64) -> bool {
    (set.process(pid).maps.as_ref()).is_some_and(|m| m.find(addr).is_some_and(|m| m.executable))
}

/// What `read` finds in `/proc` of process or thread `tid`; `None`, without a read,
/// when the side-band records saw it exit ([`RecordedProcesses::exited`]). The one
/// gate by which a recorded exit spares `/proc`: every read of a process that may be
/// gone goes through it.
fn unless_exited<T>(
    recorded: &RecordedProcesses,
    tid: u32,
    read: impl FnOnce(u32) -> Option<T>,
) -> Option<T> {
    if recorded.exited(tid) {
        return None;
    }
    read(tid)
}

/// Thread `tid`'s name ([`target::comm`], through [`unless_exited`]); empty when gone.
fn comm_unless_exited(recorded: &RecordedProcesses, tid: u32) -> String {
    unless_exited(recorded, tid, |t| Some(target::comm(t))).unwrap_or_default()
}

/// Forgets the captures at the starts of `fresh` mappings that hold another file now
/// (an exec or a remap put it there). The same file keeps its capture: capturing it
/// again can fail (the process gone meanwhile, or a recorded range that
/// `/proc/PID/map_files` does not list), and its samples would then open it by path.
fn drop_replaced_captures<'m>(
    files: &mut HashMap<u64, std::sync::Arc<procmap::CapturedFile>>,
    fresh: impl Iterator<Item = &'m Mapping>,
) {
    for m in fresh {
        if files.get(&m.start).is_some_and(|f| m.file_id != Some(f.id)) {
            files.remove(&m.start);
        }
    }
}

/// What is kept of a process between windows.
#[derive(Debug)]
pub(super) struct Known {
    pub(super) start: Option<u64>,
    comm: String,
    identity: Option<ProcessIdentity>,
    maps: Option<ProcessMaps>,
    files: HashMap<u64, std::sync::Arc<procmap::CapturedFile>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup's identity, once read from a process of it on a cgroup v2 host, names
    /// its later processes without a read (also gone ones); on a hybrid host, or with
    /// an unknown id (0), each process is read.
    #[test]
    fn a_cgroups_identity_is_read_once_where_its_processes_share_it() {
        let pod = |n: &str| ProcessIdentity::of_path(&format!("/kubepods/besteffort/pod{n}"));
        let mut p = Processes::default();
        let reads = std::cell::Cell::new(0);
        let read = |id: ProcessIdentity, shared: bool| {
            let reads = &reads;
            move |_: u32| {
                reads.set(reads.get() + 1);
                Some((id, shared))
            }
        };
        let a = pod("a");
        assert_eq!(p.identity(10, 7, read(a.clone(), true)), Some(a.clone()));
        assert_eq!(p.identity(11, 7, read(pod("x"), true)), Some(a.clone()));
        assert_eq!(reads.get(), 1, "the cgroup's second process: no read");
        for gone in [12, 13] {
            p.recorded.observe(SideRecord::Exit { tid: gone, time: 1 });
        }
        assert_eq!(p.identity(12, 7, read(pod("x"), true)), Some(a), "gone");
        assert_eq!(
            p.identity(13, 9, read(pod("x"), true)),
            None,
            "gone, unknown"
        );
        assert_eq!(reads.get(), 1);
        assert_eq!(p.identity(14, 0, read(pod("b"), true)), Some(pod("b")));
        assert_eq!(p.identity(15, 0, read(pod("c"), true)), Some(pod("c")));
        // A hybrid host's identity is not its v2 cgroup's.
        assert_eq!(p.identity(16, 8, read(pod("d"), false)), Some(pod("d")));
        assert_eq!(p.identity(17, 8, read(pod("e"), false)), Some(pod("e")));
        assert_eq!(reads.get(), 5);
        assert_eq!(p.by_cgroup.len(), 1);
    }

    #[test]
    fn a_capture_is_dropped_only_when_its_mapping_holds_another_file() {
        let me = std::process::id();
        let (maps, dir) = ProcessMaps::read_live(me, me).unwrap();
        let here = a_capture_is_dropped_only_when_its_mapping_holds_another_file as *const ();
        let text = maps.find(here as u64).expect("own text mapped").clone();
        let mut files = CapturedFiles::default().capture(&dir, [&text]);
        assert!(files.contains_key(&text.start), "own text captured");

        // The same file mapped again at the same start (a re-read, a re-capture).
        drop_replaced_captures(&mut files, [&text].into_iter());
        assert!(
            files.contains_key(&text.start),
            "the same file keeps its capture"
        );

        // Another file (an exec or a remap), then anonymous memory, at that start.
        let mut other = text.clone();
        let id = text
            .file_id
            .expect("a file mapping has its device and inode");
        other.file_id = Some(procmap::FileId {
            ino: id.ino + 1,
            ..id
        });
        drop_replaced_captures(&mut files, [&other].into_iter());
        assert!(!files.contains_key(&text.start), "another file: dropped");
        let mut files = CapturedFiles::default().capture(&dir, [&text]);
        other.file_id = None;
        drop_replaced_captures(&mut files, [&other].into_iter());
        assert!(!files.contains_key(&text.start), "no file: dropped");
    }
}
