//! Ring-buffer records → per-process [`SampleSet`], each process's comm, mappings and
//! identity from the one tracker of processes (`super::processes`), its stacks unwound.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use cpi_common::wire::{
    BranchSample, EventRole, IpSample, SampleHeader, SampleKind, StackHeader, FLAG_KERNEL,
    FLAG_STACK, FLAG_STACK_CUT, MAX_KERNEL_FRAMES, MAX_STACK_BYTES, MAX_USER_FRAMES, WIRE_VERSION,
};

use super::processes::{ProcessChanges, Processes};
use super::stack_caps::StackCaps;
use super::sys::{self, Placement};
use super::StackMemory;
use crate::import::perf_records::SideRecord;
use crate::procmap::{self, ProcessMaps};
use crate::profile::stack::{CallStack, StackEnd};
use crate::profile::SampleSet;
use crate::unwind::{StackUnwinder, Stop, UnwindHeap, UnwoundStack, UserRegs};

/// A decoded record.
#[derive(Debug)]
pub enum Record {
    /// A branch-stack sample (boxed: its entries make it large).
    Branch(Box<BranchSample>),
    /// An instruction-pointer sample.
    Ip(IpSample),
}

/// The stack section of a record flagged `FLAG_STACK` (cpi-common `wire::StackHeader`),
/// borrowed from the record.
#[derive(Debug)]
pub struct StackSection<'a> {
    /// Counts and user registers.
    pub header: StackHeader,
    /// Kernel frames, leaf first.
    pub kernel: Vec<u64>,
    /// User frames the kernel side walked itself, leaf first (empty when it copied the
    /// stack instead).
    pub user: Vec<u64>,
    /// User stack bytes from `header.user_sp` up.
    pub stack: &'a [u8],
    /// The copy stopped at its cap, not at an unreadable page: a stack going on past
    /// it was cut (`wire::FLAG_STACK_CUT`; a copy of all a record holds, from writers
    /// that do not set it).
    pub cut: bool,
}

fn frames(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .collect()
}

/// Decodes one ring-buffer record and its stack section; `None` for a wrong version,
/// kind or size, or a stack section whose counts disagree with its length or exceed
/// the wire limits.
pub fn decode(bytes: &[u8]) -> Option<(Record, Option<StackSection<'_>>)> {
    let h: SampleHeader = sys::read_plain(bytes)?;
    if h.version != WIRE_VERSION {
        return None;
    }
    let fixed = match SampleKind::from_u16(h.kind)? {
        SampleKind::Branch => size_of::<BranchSample>(),
        SampleKind::Ip => size_of::<IpSample>(),
    };
    let (record, rest) = bytes.split_at_checked(fixed)?;
    let stack = if h.flags & FLAG_STACK != 0 {
        let (sh, rest) = rest.split_at_checked(size_of::<StackHeader>())?;
        let sh: StackHeader = sys::read_plain(sh)?;
        let (k, u, n) = (
            sh.kernel_nr as usize,
            sh.user_nr as usize,
            sh.stack_len as usize,
        );
        if k > MAX_KERNEL_FRAMES
            || u > MAX_USER_FRAMES
            || n > MAX_STACK_BYTES
            || rest.len() != (k + u) * 8 + n
        {
            return None;
        }
        let (kernel, rest) = rest.split_at(k * 8);
        let (user, stack) = rest.split_at(u * 8);
        Some(StackSection {
            header: sh,
            kernel: frames(kernel),
            user: frames(user),
            stack,
            cut: h.flags & FLAG_STACK_CUT != 0 || n >= MAX_STACK_BYTES,
        })
    } else if rest.is_empty() {
        None
    } else {
        return None;
    };
    let rec = match SampleKind::from_u16(h.kind)? {
        SampleKind::Branch => Record::Branch(Box::new(sys::read_plain(record)?)),
        SampleKind::Ip => Record::Ip(IpSample { header: h }),
    };
    Some((rec, stack))
}

/// Stacks that did not reach the outermost frame, by reason (what reaches the profile's
/// loss account: cpi-user/src/profile/model.rs `LossReport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StackCounts {
    /// Cut at the frame limit or the end of the copied stack.
    pub truncated: u64,
    /// Stopped at code without a file behind it (JIT, anonymous memory, vDSO).
    pub unknown_code: u64,
    /// Unreadable stack or unwind rules that led nowhere.
    pub failed: u64,
    /// Cut where going on would cost too much: a frame whose unwind rules no compiler
    /// writes (cpi-user/src/unwind/cost.rs), or leaf only, once walking stacks took
    /// [`UNWIND_PER_PASS`] of CPU.
    pub too_costly: u64,
}

/// CPU time one pass over the ring ([`Drain::start_pass`]) may spend unwinding stacks;
/// past it the pass's samples keep their leaf frame only (counted in
/// [`StackCounts::too_costly`]). The agent cuts its windows between passes
/// (cpi-user/src/collect/session.rs `Live::run`): a pass that unwound without end, the
/// ring refilling behind it, cut none (BENCHMARKS.md, "Unwind rules that cost too
/// much"). A pass normally unwinds well under a millisecond (25 ms of samples at
/// ≈ 25 µs each); a backlog after a stall, a few tens.
///
/// Counted: the walk of each stack, in wall time (`Instant`: cheap), and when that
/// reaches the budget, the thread's CPU time in the pass (a system call), less the
/// one-off work of making a process's modules (each file's unwind sections read and
/// checked once, cpi-user/src/unwind/mod.rs `StackUnwinder::prepare`): on a loaded host
/// the wall time includes waiting for a CPU. The agent's first pass, opening every
/// binary on the host, took 289 ms of wall time and 94 ms of CPU, 282 ms of it making
/// modules and 0.0 ms walking stacks: charged to this budget, 516 of its 517 samples
/// kept their leaf only.
pub(crate) const UNWIND_PER_PASS: Duration = Duration::from_millis(250);

/// Wall time a pass may spend walking stacks whatever its CPU time, so that a loaded
/// host delays a window cut by at most about this much.
const UNWIND_WALL_PER_PASS: Duration = Duration::from_secs(1);

/// The collector's side of the ring buffer.
#[derive(Debug)]
pub(crate) struct Drain {
    /// The current window's samples.
    pub set: SampleSet,
    /// Records received per event role.
    pub received: BTreeMap<EventRole, u64>,
    /// Records that failed to decode (or had an unknown role).
    pub malformed: u64,
    /// Side-band records the kernel dropped (its buffer was full).
    pub sideband_lost: u64,
    /// What is known of the processes sampled ([`Processes`]).
    pub(super) processes: Processes,
    /// Periods set on the cpu-clock events since they were opened.
    pub cpu_clock: CpuClockPeriods,
    /// Stacks of this window that stopped short, by reason.
    pub stack_counts: StackCounts,
    unwinder: StackUnwinder,
    /// How much of each process's stack the kernel side copies.
    pub(super) stack_caps: StackCaps,
    /// The budget of this pass over the ring ([`UNWIND_PER_PASS`]).
    pass: PassBudget,
}

/// What a pass over the ring spent unwinding ([`UNWIND_PER_PASS`]).
#[derive(Debug)]
struct PassBudget {
    /// Wall time spent walking stacks…
    walking: Duration,
    /// …at which the thread's CPU time is read next.
    check_at: Duration,
    /// The thread's CPU time at the start of the pass…
    cpu_at_start: Duration,
    /// …and what making modules took of it since.
    one_off: Duration,
    /// Spent: the rest of the pass keeps leaf frames only.
    spent: bool,
    /// The thread's CPU time (collect/sys.rs `thread_cpu_time`; a fake in tests).
    cpu_time: fn() -> Duration,
}

impl PassBudget {
    fn new(cpu_time: fn() -> Duration) -> Self {
        PassBudget {
            walking: Duration::ZERO,
            check_at: UNWIND_PER_PASS,
            cpu_at_start: cpu_time(),
            one_off: Duration::ZERO,
            spent: false,
            cpu_time,
        }
    }

    /// Whether the pass may walk another stack: its CPU time (bar one-off work, an
    /// upper bound on the walks' own) is read once the walks took the budget in wall
    /// time, and again when they took the rest of it.
    fn allows_a_walk(&mut self) -> bool {
        if self.spent || self.walking < self.check_at {
            return !self.spent;
        }
        let cpu = (self.cpu_time)()
            .saturating_sub(self.cpu_at_start)
            .saturating_sub(self.one_off);
        if cpu >= UNWIND_PER_PASS || self.walking >= UNWIND_WALL_PER_PASS {
            self.spent = true;
            return false;
        }
        // The walks waited for a CPU: they may take the CPU budget left, in wall time.
        let left = UNWIND_PER_PASS
            .saturating_sub(cpu)
            .max(Duration::from_millis(1));
        self.check_at = (self.walking + left).min(UNWIND_WALL_PER_PASS);
        true
    }
}

/// The periods the collector set on its cpu-clock events since it opened them.
///
/// The kernel weights a `cpu-clock` sample with the period the event was *opened* with
/// (`hw.last_period` is set once in `perf_swevent_init_hrtimer`; `PERF_EVENT_IOC_PERIOD`
/// changes only when the timer fires), so after a re-draw or a rate change every
/// sample of that event would carry the old period: user-layer re-draws alone made time
/// profiles ≈ 3 % short. Samples of an event we re-drew are re-weighted with the period
/// set on it now; a sample is matched to its event by thread (per-thread events) or CPU
/// (per-CPU events). Threads born later have events of their own (`inherit`), created
/// with the period of their day, which the kernel reports right.
#[derive(Debug, Default)]
pub(crate) struct CpuClockPeriods {
    /// The period every cpu-clock event was opened with.
    pub opened: u64,
    /// Period now, of per-thread events, by thread.
    pub by_tid: HashMap<u32, u64>,
    /// Period now, of per-CPU events (system-wide), by CPU.
    pub by_cpu: HashMap<u32, u64>,
    /// Period now, of events of one thread on one CPU (collection without root, whose
    /// buffers the kernel maps per CPU: collect/perf_ring.rs), by thread and CPU.
    pub by_tid_cpu: HashMap<(u32, u32), u64>,
}

impl CpuClockPeriods {
    /// Records that the event placed at `at` now has `period`.
    pub fn set(&mut self, at: Placement, period: u64) {
        match at {
            Placement::ThreadOnCpu { tid, cpu } => self.by_tid_cpu.insert((tid, cpu), period),
            Placement::Thread { tid } => self.by_tid.insert(tid, period),
            Placement::Cpu { cpu } => self.by_cpu.insert(cpu, period),
            // Doctor's probes only: no samples to weigh.
            Placement::Me => None,
        };
    }

    /// The weight of a cpu-clock sample: its reported weight (whole periods as opened,
    /// summed over thinned overflows) in the period its event runs at now.
    fn weight(&self, h: &SampleHeader) -> u64 {
        let now = self
            .by_tid_cpu
            .get(&(h.tid, h.cpu))
            .or_else(|| self.by_tid.get(&h.tid))
            .or_else(|| self.by_cpu.get(&h.cpu))
            .copied();
        match now {
            Some(p) if self.opened > 0 && p != self.opened => {
                (h.period as u128 * p as u128 / self.opened as u128) as u64
            }
            _ => h.period,
        }
    }
}

/// What [`Drain::take_window`] hands out: one window's samples and counts.
#[derive(Debug)]
pub(crate) struct DrainWindow {
    /// The window's samples, per process, with comm and maps as known at its end.
    pub set: SampleSet,
    /// Records received per event role.
    pub received: BTreeMap<EventRole, u64>,
    /// Records that failed to decode.
    pub malformed: u64,
    /// Side-band records the kernel dropped in this window.
    pub sideband_lost: u64,
    /// Stacks of this window that stopped short, by reason.
    pub stack_counts: StackCounts,
    /// What the unwinder holds on the heap for later windows.
    pub unwind_heap: UnwindHeap,
    /// Processes whose state the drain dropped this window.
    pub changes: ProcessChanges,
}

impl Drain {
    /// An empty drain whose branch samples use `window` ranges each, its stacks held
    /// within `memory`.
    pub fn new(window: usize, memory: StackMemory) -> Self {
        let mut set = SampleSet::new(window);
        set.stack_bytes = memory.window_bytes;
        Drain {
            set,
            received: BTreeMap::new(),
            malformed: 0,
            sideband_lost: 0,
            processes: Processes::default(),
            cpu_clock: CpuClockPeriods::default(),
            stack_counts: StackCounts::default(),
            unwinder: StackUnwinder::new(MAX_USER_FRAMES, memory.unwind_bytes),
            stack_caps: StackCaps::default(),
            pass: PassBudget::new(super::sys::thread_cpu_time),
        }
    }

    /// A new pass over the ring: its unwinding time starts from zero
    /// ([`UNWIND_PER_PASS`]; the thread's CPU clock read once).
    pub(crate) fn start_pass(&mut self) {
        self.pass = PassBudget::new(self.pass.cpu_time);
    }

    /// Everything added since the previous call, with each process's comm and maps as
    /// known now; the drain starts an empty window and keeps what it knows of the
    /// processes for later ones.
    pub fn take_window(&mut self) -> DrainWindow {
        let next = self.set.empty_like();
        let mut set = std::mem::replace(&mut self.set, next);
        // Before the window's end forgets the exits it recorded.
        let processes = &self.processes;
        self.cpu_clock.by_tid.retain(|&tid, _| processes.alive(tid));
        let changes = self.processes.end_window(&mut set, &mut self.unwinder);
        for &pid in changes.left.iter().chain(&changes.reused) {
            self.stack_caps.forget(pid);
        }
        // The unwind sections' pages this window touched leave the resident set.
        self.unwinder.release_pages();
        DrainWindow {
            set,
            received: std::mem::take(&mut self.received),
            malformed: std::mem::take(&mut self.malformed),
            sideband_lost: std::mem::take(&mut self.sideband_lost),
            stack_counts: std::mem::take(&mut self.stack_counts),
            unwind_heap: self.unwinder.held_bytes(),
            changes,
        }
    }

    /// Processes the drain keeps anything for ([`Processes::held`]).
    pub fn held_processes(&self) -> usize {
        self.processes.held()
    }

    /// Maps read and files captured since start.
    #[cfg(test)]
    pub(crate) fn maps_work(&self) -> super::processes::MapsWork {
        self.processes.maps_work()
    }

    /// Evictions and reopens of the captured files.
    pub(crate) fn capture_counter(&self) -> procmap::CaptureCounter {
        self.processes.capture_counter()
    }

    /// Takes in one side-band record (read before the samples it may explain).
    pub fn observe(&mut self, s: SideRecord) {
        match s {
            SideRecord::Lost(n) => self.sideband_lost += n,
            s => self.processes.observe(&mut self.set, s),
        }
    }

    /// Adds one raw record.
    pub fn add(&mut self, bytes: &[u8]) {
        let Some((mut rec, section)) = decode(bytes) else {
            self.malformed += 1;
            return;
        };
        if let Record::Ip(s) = &mut rec {
            if s.header.event == EventRole::CpuClock as u32 {
                s.header.period = self.cpu_clock.weight(&s.header);
            }
        }
        let (h, user_addr) = match &rec {
            Record::Ip(s) => (s.header, s.header.ip),
            Record::Branch(s) => (s.header, s.entries().first().map_or(0, |e| e.to)),
        };
        let Some(role) = EventRole::from_u32(h.event) else {
            self.malformed += 1;
            return;
        };
        if !self.set.processes.contains_key(&h.tgid) {
            self.processes.first_in_window(&mut self.set, h.tgid);
        }
        self.processes.track(
            &mut self.set,
            &mut self.unwinder,
            (h.tgid, h.tid, h.cgroup_id),
            (h.flags & FLAG_KERNEL == 0).then_some(user_addr),
        );
        let stack = section.map(|sec| self.call_stack(h.tgid, h.tid, &sec));
        match &rec {
            Record::Ip(s) => {
                if self.set.add_ip_with_stack(s, stack.as_ref()).is_err() {
                    self.malformed += 1;
                    return;
                }
            }
            Record::Branch(s) => self.set.add_branch_with_stack(s, stack.as_ref()),
        }
        *self.received.entry(role).or_default() += 1;
    }

    /// The call stack of a record's stack section: user frames as the kernel walked
    /// them, else unwound now from the copied stack with the process's mappings (read
    /// by [`Processes::track`] just before), so a process that exits later loses nothing.
    fn call_stack(&mut self, pid: u32, tid: u32, sec: &StackSection) -> CallStack {
        let h = &sec.header;
        let mut too_costly = false;
        let (user, end) = if !sec.user.is_empty() {
            // The kernel's frame-pointer walk cannot say why it stopped.
            let end = if sec.user.len() >= MAX_USER_FRAMES {
                StackEnd::Truncated
            } else {
                StackEnd::Complete
            };
            (sec.user.clone(), end)
        } else if h.user_ip == 0 {
            // A kernel thread, or a kernel-mode sample without its user registers.
            (Vec::new(), StackEnd::Complete)
        } else if !self.pass.allows_a_walk() {
            too_costly = true;
            (vec![h.user_ip], StackEnd::Truncated)
        } else {
            let u = self.walk(pid, tid, sec);
            too_costly = u.stop == Stop::CostlyRules;
            self.stack_caps
                .observe(pid, u.used, u.stop == Stop::EndOfCopy);
            (u.frames, u.stop.into())
        };
        let c = &mut self.stack_counts;
        match end {
            _ if too_costly => c.too_costly += 1,
            StackEnd::Complete => {}
            StackEnd::Truncated => c.truncated += 1,
            StackEnd::UnknownCode => c.unknown_code += 1,
            StackEnd::Error => c.failed += 1,
        }
        CallStack {
            kernel: sec.kernel.clone().into_boxed_slice(),
            user: user.into_boxed_slice(),
            end,
        }
    }

    /// Unwinds `sec`'s copied stack of `pid` (thread `tid`). A walk that stopped at code
    /// in none of the process's known mappings takes in the mapping the kernel recorded,
    /// or `/proc`'s ([`Processes::explain_stack_miss`]), and walks again. A library mapped
    /// after the maps were read is found by its first sample there, but one that only
    /// calls back into code known before has no sample of its own: every stack through
    /// it stopped there (a `dlopen`ed plugin's; libc's when the first maps were read
    /// while `ld.so` was still mapping it, and then under every path of the run).
    fn walk(&mut self, pid: u32, tid: u32, sec: &StackSection) -> UnwoundStack {
        let u = self.walk_once(pid, sec);
        let Some(&at) = u.frames.last().filter(|_| u.stop == Stop::UnknownCode) else {
            return u;
        };
        // A return address is looked up at its call.
        let at = if u.frames.len() > 1 { at - 1 } else { at };
        let (set, unwinder) = (&mut self.set, &mut self.unwinder);
        if !(self.processes).explain_stack_miss(set, unwinder, (pid, tid), at)
            || self.unwinder.prepared(pid)
        {
            return u;
        }
        self.walk_once(pid, sec)
    }

    /// One walk of `sec`'s copied stack of `pid` with its maps as they are, its time
    /// taken from the pass's budget.
    fn walk_once(&mut self, pid: u32, sec: &StackSection) -> UnwoundStack {
        let h = &sec.header;
        let p = self.set.process(pid);
        let empty = ProcessMaps::default();
        let maps = p.maps.as_ref().unwrap_or(&empty);
        if !self.unwinder.prepared(pid) {
            let cpu = self.pass.cpu_time;
            let before = cpu();
            self.unwinder.prepare(pid, maps, &p.files);
            self.pass.one_off += cpu().saturating_sub(before);
        }
        let began = Instant::now();
        let u = self.unwinder.unwind(
            pid,
            maps,
            &p.files,
            UserRegs {
                ip: h.user_ip,
                sp: h.user_sp,
                bp: h.user_bp,
            },
            sec.stack,
            sec.cut,
        );
        self.pass.walking += began.elapsed();
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::target;
    use crate::procmap::{CapturedFiles, Mapping};
    use cpi_common::wire::{BranchEntry, MAX_BRANCH_ENTRIES};

    fn bytes_of<T: aya::Pod>(v: &T) -> Vec<u8> {
        sys::bytes_of(v).to_vec()
    }

    fn ip(pid: u32, ip: u64, role: EventRole) -> IpSample {
        IpSample {
            header: SampleHeader {
                version: WIRE_VERSION,
                kind: SampleKind::Ip as u16,
                tgid: pid,
                tid: pid,
                event: role as u32,
                period: 1000,
                ip,
                ..Default::default()
            },
        }
    }

    #[test]
    fn decodes_and_aggregates_with_maps_of_a_live_pid() {
        let me = std::process::id();
        let here = decodes_and_aggregates_with_maps_of_a_live_pid as *const () as u64;
        let mut d = Drain::new(4, StackMemory::default());
        for _ in 0..3 {
            d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        }
        let p = &d.set.processes[&me];
        assert_eq!(p.ips[&EventRole::CpuClock].samples, 3);
        assert_eq!(p.ips[&EventRole::CpuClock].weight, 3000);
        assert!(
            p.maps.as_ref().unwrap().find(here).is_some(),
            "own text mapped"
        );
        assert!(!p.comm.is_empty());
        assert_eq!(d.received[&EventRole::CpuClock], 3);
        assert_eq!(d.malformed, 0);
    }

    #[test]
    fn branch_records_round_trip() {
        let mut s = BranchSample {
            header: SampleHeader {
                version: WIRE_VERSION,
                kind: SampleKind::Branch as u16,
                nr: 3,
                tgid: 42,
                event: EventRole::Branches as u32,
                period: 90,
                ..Default::default()
            },
            entries: [BranchEntry::default(); MAX_BRANCH_ENTRIES],
        };
        s.entries[0] = BranchEntry::new(0x40, 0x50, false, 0);
        s.entries[1] = BranchEntry::new(0x20, 0x30, false, 0);
        s.entries[2] = BranchEntry::new(0x1, 0x10, false, 0);
        let mut d = Drain::new(2, StackMemory::default());
        d.add(&bytes_of(&s));
        assert_eq!(d.set.processes[&42].branches.samples, 1);
        assert_eq!(d.received[&EventRole::Branches], 1);
    }

    #[test]
    fn windows_split_samples_and_keep_what_is_known_of_processes() {
        let me = std::process::id();
        let here = windows_split_samples_and_keep_what_is_known_of_processes as *const () as u64;
        let mut d = Drain::new(4, StackMemory::default());
        d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        d.add(&[0u8; 3]);
        let w1 = d.take_window();
        assert_eq!(w1.set.processes[&me].ips[&EventRole::CpuClock].samples, 2);
        assert_eq!(w1.received[&EventRole::CpuClock], 2);
        assert_eq!(w1.malformed, 1);
        // Nothing since: an empty window, no sample in two windows.
        let w2 = d.take_window();
        assert!(w2.set.processes.is_empty() && w2.received.is_empty());
        assert_eq!((w2.malformed, w2.set.window), (0, 4));
        // The process comes back with the comm and maps known from the first window,
        // without re-reading /proc (its re-read clock is untouched).
        d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        let w3 = d.take_window();
        let p = &w3.set.processes[&me];
        assert_eq!(p.ips[&EventRole::CpuClock].samples, 1);
        assert_eq!(p.comm, w1.set.processes[&me].comm);
        assert_eq!(p.maps, w1.set.processes[&me].maps);
    }

    #[test]
    fn processes_are_keyed_by_pid_and_start_and_leave_after_their_last_window() {
        let me = std::process::id();
        let here = processes_are_keyed_by_pid_and_start_and_leave_after_their_last_window
            as *const () as u64;
        let mut d = Drain::new(1, StackMemory::default());
        // A pid that does not exist (above the kernel's pid_max limit), and one that
        // exited and is not reaped: both gone, though the zombie's pid is still taken.
        let zombie = cpi_tests::Zombie::spawn();
        for pid in [me, u32::MAX - 7, zombie.pid()] {
            d.add(&bytes_of(&ip(pid, here, EventRole::CpuClock)));
        }
        let w1 = d.take_window();
        let mut gone = vec![zombie.pid(), u32::MAX - 7];
        gone.sort_unstable();
        assert_eq!(w1.changes.left, gone);
        assert!(w1.changes.reused.is_empty());
        assert_eq!(d.held_processes(), 1);
        // No sample of ours in window 2: still alive with its start time, so kept.
        let w2 = d.take_window();
        assert_eq!(w2.changes, ProcessChanges::default());
        assert_eq!(d.held_processes(), 1);
        // Our pid with another start time is another process: what was kept is dropped
        // at its first sample and the pid reported reused.
        d.processes.known.get_mut(&me).unwrap().start = Some(1);
        d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        let w3 = d.take_window();
        assert_eq!(w3.changes.reused, [me]);
        assert_eq!(w3.set.processes[&me].start, target::process_start(me));
        assert!(w3.changes.left.is_empty() && target::process_start(me).is_some());
        // Kept for another start time and gone meanwhile (the pid reused by a process
        // with no sample): it leaves at the window's end.
        d.processes.known.get_mut(&me).unwrap().start = Some(1);
        assert_eq!(d.take_window().changes.left, [me]);
        assert_eq!(d.held_processes(), 0);
    }

    #[test]
    fn cpu_clock_samples_of_redrawn_events_weigh_their_period_now() {
        let mut d = Drain::new(1, StackMemory::default());
        d.cpu_clock.opened = 1000;
        d.cpu_clock.set(Placement::Thread { tid: 7 }, 1100); // thread 7's event re-drawn
        d.cpu_clock.set(Placement::Cpu { cpu: 1 }, 900); // CPU 1's event re-drawn
        let mut on = |tid: u32, cpu: u32, role: EventRole, period: u64| {
            let mut s = ip(1, 0, role);
            s.header.tid = tid;
            s.header.cpu = cpu;
            s.header.period = period;
            d.add(&bytes_of(&s));
        };
        on(7, 0, EventRole::CpuClock, 1000);
        on(7, 0, EventRole::CpuClock, 4000); // four thinned overflows
        on(8, 1, EventRole::CpuClock, 1000);
        on(9, 0, EventRole::CpuClock, 1000); // an inherited thread: as reported
        on(7, 0, EventRole::Cycles, 1000); // hardware events report their own period
        let p = &d.set.processes[&1];
        assert_eq!(p.ips[&EventRole::CpuClock].weight, 1100 + 4400 + 900 + 1000);
        assert_eq!(p.ips[&EventRole::Cycles].weight, 1000);
        // Without root, a thread's events are one per CPU, each re-drawn on its own.
        let mut d = Drain::new(1, StackMemory::default());
        d.cpu_clock.opened = 1000;
        d.cpu_clock
            .set(Placement::ThreadOnCpu { tid: 7, cpu: 0 }, 1100);
        d.cpu_clock
            .set(Placement::ThreadOnCpu { tid: 7, cpu: 1 }, 900);
        for (cpu, period) in [(0, 1000), (1, 1000), (2, 1000)] {
            let mut s = ip(1, 0, EventRole::CpuClock);
            (s.header.tid, s.header.cpu, s.header.period) = (7, cpu, period);
            d.add(&bytes_of(&s));
        }
        let p = &d.set.processes[&1];
        assert_eq!(p.ips[&EventRole::CpuClock].weight, 1100 + 900 + 1000);
    }

    /// `rec` followed by a stack section with `kernel` frames and `stack` bytes.
    fn with_stack<T: aya::Pod>(rec: &T, kernel: &[u64], regs: [u64; 3], stack: &[u8]) -> Vec<u8> {
        let mut b = bytes_of(rec);
        b[4] |= FLAG_STACK as u8; // SampleHeader::flags, little-endian
        let sh = StackHeader {
            kernel_nr: kernel.len() as u16,
            user_nr: 0,
            stack_len: stack.len() as u32,
            user_ip: regs[0],
            user_sp: regs[1],
            user_bp: regs[2],
        };
        b.extend(bytes_of(&sh));
        b.extend(kernel.iter().flat_map(|f| f.to_le_bytes()));
        b.extend_from_slice(stack);
        b
    }

    #[test]
    fn stack_sections_decode_and_inconsistent_ones_are_malformed() {
        let r = ip(1, 0x10, EventRole::CpuClock);
        let good = with_stack(
            &r,
            &[0xffff_ffff_8100_0000, 0xffff_ffff_8100_0100],
            [0; 3],
            &[7; 24],
        );
        let (_, sec) = decode(&good).expect("decodes");
        let sec = sec.expect("has a stack section");
        assert_eq!(sec.kernel, [0xffff_ffff_8100_0000, 0xffff_ffff_8100_0100]);
        assert_eq!(sec.stack, [7; 24]);
        // One byte short, one too many, a count past the limit, no header: all refused.
        assert!(decode(&good[..good.len() - 1]).is_none());
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long).is_none());
        let mut over = good.clone();
        let at = size_of::<IpSample>();
        over[at..at + 2].copy_from_slice(&(MAX_KERNEL_FRAMES as u16 + 1).to_le_bytes());
        assert!(decode(&over).is_none());
        assert!(decode(&good[..size_of::<IpSample>() + 4]).is_none());
        // Without the flag, trailing bytes are not a record either.
        let mut plain = bytes_of(&r);
        plain.push(0);
        assert!(decode(&plain).is_none());
    }

    #[test]
    fn stacks_stop_at_unknown_code_and_unreadable_stacks_are_counted() {
        let me = std::process::id();
        let code =
            stacks_stop_at_unknown_code_and_unreadable_stacks_are_counted as *const () as u64;
        let data = Box::new([0u64; 4]);
        let heap = data.as_ptr() as u64;
        let mut d = Drain::new(1, StackMemory::default());
        let r = ip(me, code, EventRole::CpuClock);
        // An IP in no file mapping (JIT, anonymous memory): that frame, nothing more.
        d.add(&with_stack(&r, &[], [heap, heap, 0], &[0; 64]));
        // Nothing copied: the caller cannot be found.
        d.add(&with_stack(&r, &[], [code, heap, 0], &[]));
        // Garbage: a stack made of one code address over and over ends at the frame
        // limit or the end of the copy, never past either. The address is one past this
        // function's first instruction, so each frame is looked up at that instruction,
        // where every compiler's CFI says CFA = rsp + 8 (`code` itself would be looked
        // up at `code - 1`: the padding before it, or whatever function the linker put
        // there).
        let ret = code + 1;
        let garbage: Vec<u8> = std::iter::repeat_n(ret.to_le_bytes(), MAX_STACK_BYTES / 8)
            .flatten()
            .collect();
        d.add(&with_stack(&r, &[], [code, heap, heap], &garbage));
        let p = &d.set.processes[&me];
        let ends: HashMap<StackEnd, Vec<usize>> =
            p.stacks.iter().fold(HashMap::new(), |mut m, (s, _)| {
                m.entry(s.end).or_default().push(s.user.len());
                m
            });
        assert_eq!(ends[&StackEnd::UnknownCode], [1], "{ends:?}");
        assert_eq!(ends[&StackEnd::Error], [1], "{ends:?}");
        assert!(
            ends[&StackEnd::Truncated]
                .iter()
                .all(|&n| n <= MAX_USER_FRAMES),
            "{ends:?}"
        );
        assert_eq!(
            d.stack_counts,
            StackCounts {
                truncated: 1,
                unknown_code: 1,
                failed: 1,
                too_costly: 0
            }
        );
        assert_eq!((d.malformed, p.stacks.unstacked), (0, 0));
        let w = d.take_window();
        assert_eq!(w.stack_counts.failed, 1);
        assert_eq!(d.stack_counts, StackCounts::default());
    }

    thread_local! {
        /// The CPU time [`fake_cpu`] reports to this test's drain.
        static CPU: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
    }

    fn fake_cpu() -> Duration {
        CPU.with(std::cell::Cell::get)
    }

    /// Once walking stacks took [`UNWIND_PER_PASS`] of wall time and the pass as much
    /// CPU, its samples keep their leaf frame only, counted as too costly; the next
    /// pass unwinds again.
    #[test]
    fn a_pass_past_its_unwinding_time_keeps_leaf_frames_and_counts_them() {
        let me = std::process::id();
        let code =
            a_pass_past_its_unwinding_time_keeps_leaf_frames_and_counts_them as *const () as u64;
        let data = Box::new([0u64; 4]);
        let heap = data.as_ptr() as u64;
        let mut d = Drain::new(1, StackMemory::default());
        d.pass.cpu_time = fake_cpu;
        let r = ip(me, code, EventRole::CpuClock);
        // Nothing copied: unwound, the stack fails after its leaf frame.
        let sample = with_stack(&r, &[], [code, heap, 0], &[]);
        d.start_pass();
        d.add(&sample);
        assert_eq!(d.stack_counts.failed, 1);
        d.pass.walking = UNWIND_PER_PASS;
        CPU.with(|c| c.set(UNWIND_PER_PASS));
        d.add(&sample);
        d.add(&sample);
        assert_eq!((d.stack_counts.failed, d.stack_counts.too_costly), (1, 2));
        let p = &d.set.processes[&me];
        let leaf = CallStack {
            kernel: Box::new([]),
            user: Box::new([code]),
            end: StackEnd::Truncated,
        };
        assert_eq!(p.stacks.get(&leaf).unwrap().samples(), 2);
        d.start_pass();
        d.add(&sample);
        assert_eq!((d.stack_counts.failed, d.stack_counts.too_costly), (2, 2));
        assert_eq!(d.take_window().stack_counts.too_costly, 2);
    }

    /// Wall time a loaded host made the walks wait for a CPU is not charged
    /// to the pass, nor is the CPU time of making a process's modules (its files' unwind
    /// sections read and checked, once); up to [`UNWIND_WALL_PER_PASS`] of walking,
    /// whatever the CPU time.
    #[test]
    fn waiting_for_a_cpu_and_reading_files_are_not_charged_to_the_pass() {
        let me = std::process::id();
        let code =
            waiting_for_a_cpu_and_reading_files_are_not_charged_to_the_pass as *const () as u64;
        let mut d = Drain::new(1, StackMemory::default());
        d.pass.cpu_time = fake_cpu;
        let sample = with_stack(&ip(me, code, EventRole::CpuClock), &[], [code, 0, 0], &[]);
        d.start_pass();
        // The walks took the budget (250 ms) in wall time, the pass 500 ms of CPU, all of
        // it but 10 ms making modules.
        d.pass.walking = UNWIND_PER_PASS;
        d.pass.one_off = Duration::from_millis(490);
        CPU.with(|c| c.set(Duration::from_millis(500)));
        d.add(&sample);
        d.add(&sample);
        assert_eq!(d.stack_counts.too_costly, 0);
        // Until the rest of the CPU budget (240 ms) is taken in wall time.
        assert_eq!(d.pass.check_at, Duration::from_millis(490));
        d.pass.walking = UNWIND_WALL_PER_PASS;
        d.add(&sample);
        assert_eq!(d.stack_counts.too_costly, 1);
        // The first sample of a process made its modules: the CPU time read around it
        // (a clock that moves 1 ms a read) is set apart, once.
        let mut d = Drain::new(1, StackMemory::default());
        d.pass.cpu_time = || {
            CPU.with(|c| c.set(c.get() + Duration::from_millis(1)));
            fake_cpu()
        };
        d.start_pass();
        assert!(!d.unwinder.prepared(me));
        d.add(&sample);
        d.add(&sample);
        assert!(d.unwinder.prepared(me));
        assert_eq!(d.pass.one_off, Duration::from_millis(1));
    }

    /// Files mapped executable into this process, one page each, side by side where
    /// nothing was mapped before (a stale mapping read earlier, of another test's memory
    /// since unmapped, would hide a new one), unmapped on drop.
    struct Mapped {
        dir: std::path::PathBuf,
        base: u64,
        pages: Vec<u64>,
    }

    impl Mapped {
        /// At `base` and up: tests running at once each use their own range.
        fn new(name: &str, base: u64) -> Mapped {
            let dir = std::env::temp_dir().join(format!("cpi-churn-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Mapped {
                dir,
                base,
                pages: Vec::new(),
            }
        }

        /// Maps one more file; its address.
        fn map(&mut self) -> u64 {
            use std::os::fd::AsRawFd;
            let path = self.dir.join(format!("f{}.so", self.pages.len()));
            std::fs::write(&path, [0xc3u8; 4096]).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            // SAFETY: a fresh private mapping of a file we own, unmapped on drop.
            let p = unsafe {
                libc::mmap(
                    (self.base + 4096 * self.pages.len() as u64) as *mut libc::c_void,
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_FIXED_NOREPLACE,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
            self.pages.push(p as u64);
            p as u64
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            for &p in &self.pages {
                // SAFETY: mapped by `map`, used by nothing else.
                unsafe { libc::munmap(p as *mut libc::c_void, 4096) };
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Held by the tests that map many files here, so that neither sees the other's.
    static MAPPING_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Hostile host: a process holding thousands of mappings that maps one more costs the
    /// collector that one mapping — one file captured, one unwind module, no re-read of
    /// its maps when the kernel's record explains it — not a pass over all it holds (25 000
    /// mappings made each new one cost 20 000 opens and an O(n²) merge: the agent's
    /// windows stopped).
    #[test]
    fn a_new_mapping_costs_its_own_capture_not_one_per_mapping_held() {
        const HELD: usize = 2000;
        let _alone = MAPPING_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::process::id();
        let mut mapped = Mapped::new("many", 0x2e00_0000_0000);
        for _ in 0..HELD {
            mapped.map();
        }
        let mut d = Drain::new(1, StackMemory::default());
        // Fewer descriptors than files, as for 25 000 files: most are closed at once.
        d.processes.files = CapturedFiles::with_cap(64);
        let reopens = d.capture_counter();
        // The kernel recorded every mapping (the collector ran while they were made).
        let now = ProcessMaps::read(me).unwrap();
        for &a in &mapped.pages {
            let m = now.find(a).unwrap().clone();
            d.observe(SideRecord::Mmap {
                pid: me,
                mapping: m,
                build_id: None,
            });
        }
        // A sample with its stack: maps read, every file captured, every module made.
        let sample = |d: &mut Drain, at: u64| {
            let r = ip(me, at, EventRole::CpuClock);
            d.add(&with_stack(&r, &[], [at, 0x1000, 0], &[0; 64]));
        };
        sample(&mut d, mapped.pages[0]);
        let first = d.maps_work();
        assert_eq!(first.reads, 1);
        assert!(first.captures >= HELD as u64, "{first:?}");
        let opened = reopens.counts().reopened;

        // One more mapping, its record read before its sample: no read, one capture.
        let new = mapped.map();
        let m = ProcessMaps::read(me).unwrap().find(new).unwrap().clone();
        d.observe(SideRecord::Mmap {
            pid: me,
            mapping: m,
            build_id: None,
        });
        sample(&mut d, new);
        let p = &d.set.processes[&me];
        assert!(p.maps.as_ref().unwrap().find(new).is_some());
        assert!(p.files.contains_key(&new), "the new file captured");
        let work = d.maps_work();
        assert_eq!(
            (work.reads, work.captures),
            (1, first.captures + 1),
            "{first:?} then {work:?}"
        );
        // Its module was added; the others' files were not reopened.
        assert_eq!(reopens.counts().reopened, opened);

        // One more without a record: found by a re-read once one is due (bounded wait),
        // which captures what changed — this file, and what the test harness's other
        // threads mapped meanwhile, if anything — not the 2 000 unchanged.
        let unrecorded = mapped.map();
        let t0 = Instant::now();
        while d.set.processes[&me]
            .maps
            .as_ref()
            .unwrap()
            .find(unrecorded)
            .is_none()
        {
            assert!(t0.elapsed() < Duration::from_secs(120), "never re-read");
            std::thread::sleep(Duration::from_millis(20));
            sample(&mut d, unrecorded);
        }
        let last = d.maps_work();
        assert_eq!(last.reads, 2, "{last:?}");
        assert!(
            (1..=10).contains(&(last.captures - work.captures)),
            "{work:?} then {last:?}"
        );
        assert!(
            reopens.counts().reopened - opened <= 10,
            "{:?}",
            reopens.counts()
        );
    }

    /// Hostile host: a forked child shows up holding its parent's mappings, whose files are
    /// captured already: it costs a read of its maps, not one `map_files` open per
    /// mapping (each fork of a process with 25 000 mappings opened 25 000), nor a reopen
    /// of files the LRU closed whose unwind sections are cached (the unwinder keeps
    /// those of at most `MAX_FILES` files, cpi-user/src/unwind/mod.rs: HELD stays below).
    #[test]
    fn a_forked_child_shares_its_parents_captured_files() {
        const HELD: usize = 800;
        let _alone = MAPPING_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::process::id();
        let mut mapped = Mapped::new("fork", 0x2f00_0000_0000);
        for _ in 0..HELD {
            mapped.map();
        }
        let mut d = Drain::new(1, StackMemory::default());
        d.processes.files = CapturedFiles::with_cap(64);
        let reopens = d.capture_counter();
        let sample = |d: &mut Drain, pid: u32, at: u64| {
            let r = ip(pid, at, EventRole::CpuClock);
            d.add(&with_stack(&r, &[], [at, 0x1000, 0], &[0; 64]));
        };
        sample(&mut d, me, mapped.pages[0]);
        let parent = d.maps_work();
        assert!(parent.captures >= HELD as u64, "{parent:?}");
        let reopened = reopens.counts().reopened;

        // SAFETY: the child only waits in `pause` (async-signal-safe) until killed.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "{}", std::io::Error::last_os_error());
        if child == 0 {
            loop {
                // SAFETY: see above.
                unsafe { libc::pause() };
            }
        }
        let child = child as u32;
        sample(&mut d, child, mapped.pages[1]);
        let work = d.maps_work();
        let p = &d.set.processes[&child];
        let files = p.files.len();
        // Executable file mappings the parent's read did not see (other tests' threads
        // map and unmap files meanwhile): the most the child may cost in captures.
        let unseen = {
            let (mine, its) = (&d.set.processes[&me].maps, &p.maps);
            let (mine, its) = (mine.as_ref().unwrap(), its.as_ref().unwrap());
            its.mappings
                .iter()
                .filter(|m| m.executable && m.file_id.is_some() && !mine.holds(m))
                .count() as u64
        };
        let shared = mapped
            .pages
            .iter()
            .filter(|a| {
                let (mine, its) = (&d.set.processes[&me].files, &p.files);
                its.contains_key(a) && std::sync::Arc::ptr_eq(&mine[a], &its[a])
            })
            .count();
        // SAFETY: our child; reaped at once.
        unsafe {
            libc::kill(child as i32, libc::SIGKILL);
            libc::waitpid(child as i32, std::ptr::null_mut(), 0);
        }
        assert_eq!(shared, HELD, "every file shared with the parent's capture");
        assert!(files >= HELD);
        assert_eq!(work.reads, parent.reads + 1, "{parent:?} then {work:?}");
        assert!(
            work.captures - parent.captures <= unseen,
            "{parent:?} then {work:?}; {unseen} mappings new to the child"
        );
        assert_eq!(
            reopens.counts().reopened,
            reopened,
            "{:?}",
            reopens.counts()
        );
    }

    /// Process churn: a process gone before its first sample (it lived a few milliseconds) is
    /// known from the kernel's records: a binary no process captured is opened once by
    /// its recorded path, and one captured for an earlier process costs it no open.
    #[test]
    fn a_gone_process_is_known_from_the_records_and_its_binary_captured_once() {
        let me = std::process::id();
        let here = a_gone_process_is_known_from_the_records_and_its_binary_captured_once
            as *const () as u64;
        let own = ProcessMaps::read(me).unwrap().find(here).unwrap().clone();
        let mut d = Drain::new(1, StackMemory::default());
        let exec = |d: &mut Drain, pid: u32, mapping: &Mapping| {
            d.observe(SideRecord::Comm {
                pid,
                tid: pid,
                name: "gone".into(),
                exec: true,
            });
            d.observe(SideRecord::Mmap {
                pid,
                mapping: mapping.clone(),
                build_id: None,
            });
        };
        // Pids no process has (above the kernel's limit of 2^22).
        let (first, second) = (0x7fff_0001, 0x7fff_0002);
        exec(&mut d, first, &own);
        d.add(&bytes_of(&ip(first, here, EventRole::CpuClock)));
        let w1 = d.maps_work();
        let p = &d.set.processes[&first];
        assert_eq!(p.comm, "gone");
        assert!(p.files.contains_key(&own.start), "captured by its path");
        assert_eq!(w1.reads, 1, "one read, finding it gone: {w1:?}");
        exec(&mut d, second, &own);
        d.add(&bytes_of(&ip(second, here, EventRole::CpuClock)));
        let w2 = d.maps_work();
        let (a, b) = (&d.set.processes[&first], &d.set.processes[&second]);
        assert!(std::sync::Arc::ptr_eq(
            &a.files[&own.start],
            &b.files[&own.start]
        ));
        assert_eq!(
            (w2.reads, w2.captures),
            (2, w1.captures),
            "{w1:?} then {w2:?}"
        );
    }

    /// Process churn: a process whose exit was recorded costs no `/proc` read: its first
    /// sample takes the records (not the maps `/proc` would give, here this live
    /// process's own, which the records say exited), and it leaves at the window's end
    /// with its thread's period state, without a look at `/proc`; so do its samples
    /// read late, in the next window.
    #[test]
    fn a_recorded_exit_spares_the_proc_reads_of_a_gone_process() {
        let me = std::process::id();
        let here = a_recorded_exit_spares_the_proc_reads_of_a_gone_process as *const () as u64;
        let own = ProcessMaps::read(me).unwrap().find(here).unwrap().clone();
        let mut d = Drain::new(1, StackMemory::default());
        d.observe(SideRecord::Comm {
            pid: me,
            tid: me,
            name: "recorded".into(),
            exec: false,
        });
        d.observe(SideRecord::Mmap {
            pid: me,
            mapping: own.clone(),
            build_id: None,
        });
        d.observe(SideRecord::Exit { tid: me, time: 1 });
        d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        let p = &d.set.processes[&me];
        assert_eq!(p.comm, "recorded", "named by the records");
        assert_eq!(p.maps.as_ref().unwrap().mappings, [own], "mapped by them");
        assert!(p.identity.is_none(), "no cgroup read");
        // The period of a per-thread event on it (a one-shot's).
        d.cpu_clock.by_tid.insert(me, 1000);
        let w = d.take_window();
        assert_eq!(w.changes.left, [me], "gone, though /proc would say alive");
        assert_eq!(w.set.processes[&me].start, None);
        assert!(d.cpu_clock.by_tid.is_empty());
        assert!(
            !d.processes.known.contains_key(&me),
            "not kept for later windows"
        );
        // A sample read late, in the next window, is still of the gone process.
        d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        assert_eq!(d.set.processes[&me].comm, "recorded");
        assert_eq!(d.take_window().changes.left, [me]);
        // A window without its samples forgets it: the next sample reads /proc.
        d.take_window();
        d.add(&bytes_of(&ip(me, here, EventRole::CpuClock)));
        let p = &d.set.processes[&me];
        assert!(
            p.maps.as_ref().unwrap().mappings.len() > 1,
            "read from /proc"
        );
        assert_ne!(p.comm, "recorded");
    }

    /// Process churn: a process's identity is kept for its cgroup v2 id where every process
    /// of that cgroup has it (a cgroup v2 host): a later process of the cgroup takes it
    /// without a `/proc` read, also one gone before its first sample was read (here a
    /// pid recorded exited, which `/proc` is not asked of). Id 0 (unknown) names none.
    #[test]
    fn a_cgroups_identity_names_its_later_processes_even_when_gone() {
        let me = std::process::id();
        let here = a_cgroups_identity_names_its_later_processes_even_when_gone as *const () as u64;
        let in_cgroup = |pid: u32, cgroup_id: u64| {
            let mut s = ip(pid, here, EventRole::CpuClock);
            s.header.cgroup_id = cgroup_id;
            bytes_of(&s)
        };
        let mut d = Drain::new(1, StackMemory::default());
        d.add(&in_cgroup(me, 77));
        let mine = d.set.processes[&me].identity.clone();
        assert!(mine.is_some(), "read from /proc");
        // Whether this host's cgroups share an identity (a cgroup v2 host), as the
        // reader says (its own tests pin that verdict down: procmap/cgroup.rs).
        let (_, v2_host) = crate::procmap::ProcessIdentity::read(me).unwrap();
        let (gone, unknown) = (me + 1_000_000, me + 1_000_001);
        for pid in [gone, unknown] {
            d.observe(SideRecord::Exit { tid: pid, time: 1 });
        }
        d.add(&in_cgroup(gone, 77));
        d.add(&in_cgroup(unknown, 0));
        let expected = if v2_host { mine } else { None };
        assert_eq!(
            d.set.processes[&gone].identity, expected,
            "v2 host: {v2_host}"
        );
        assert_eq!(d.set.processes[&unknown].identity, None);
    }

    /// A recorded exit of a process's main thread is not the process's once another
    /// of its threads is sampled (a main thread that called `pthread_exit`): `/proc`
    /// is asked, and the process stays.
    #[test]
    fn a_main_threads_exit_is_not_its_processs_when_another_thread_is_sampled() {
        let me = std::process::id();
        let here = a_main_threads_exit_is_not_its_processs_when_another_thread_is_sampled
            as *const () as u64;
        let mut d = Drain::new(1, StackMemory::default());
        d.observe(SideRecord::Exit { tid: me, time: 1 });
        let mut s = ip(me, here, EventRole::CpuClock);
        s.header.tid = me + 1;
        d.add(&bytes_of(&s));
        let p = &d.set.processes[&me];
        assert!(
            p.maps.as_ref().unwrap().find(here).is_some(),
            "read from /proc"
        );
        assert!(p.identity.is_some());
        let w = d.take_window();
        assert!(w.changes.left.is_empty(), "{:?}", w.changes);
        assert!(d.processes.known.contains_key(&me));
    }

    #[test]
    fn bad_records_are_counted_not_used() {
        let mut d = Drain::new(1, StackMemory::default());
        d.add(&[0u8; 7]);
        let mut wrong_version = ip(1, 0x10, EventRole::Cycles);
        wrong_version.header.version = WIRE_VERSION + 1;
        d.add(&bytes_of(&wrong_version));
        d.add(&bytes_of(&ip(1, 0x10, EventRole::Cycles))[..40]);
        let mut bad_role = ip(1, 0x10, EventRole::Cycles);
        bad_role.header.event = 99;
        d.add(&bytes_of(&bad_role));
        assert_eq!(d.malformed, 4);
        assert!(d.set.processes.values().all(|p| p.ips.is_empty()));
    }

    /// Live LBRs are opened with `PERF_SAMPLE_BRANCH_TYPE_SAVE` (collect/events.rs): the
    /// types the kernel writes into each entry's bitfield word come through the wire and
    /// the drain to the call-path attribution, which rebuilds the stack each range ran
    /// under from them (cpi-user/src/profile/stack.rs `add_branch`). The same record with
    /// the types cleared leaves every range on the sample's stack.
    #[test]
    fn typed_branch_entries_reach_call_path_attribution_typed() {
        use cpi_common::wire::branch_type as bt;
        let e = |from, to, t| BranchEntry::new(from, to, false, 0).with_type(t);
        // Newest first: main calls f at 0x100, f returns to 0x105, main jumps at 0x120.
        let typed = [
            e(0x120, 0x200, bt::UNCOND),
            e(0x1010, 0x105, bt::RET),
            e(0x100, 0x1000, bt::CALL),
            e(0x50, 0x80, bt::UNCOND),
        ];
        // The user frames as the kernel walked them (user_nr > 0): main, its caller.
        let record = |entries: &[BranchEntry]| {
            let s = BranchSample::new(
                SampleHeader {
                    version: WIRE_VERSION,
                    kind: SampleKind::Branch as u16,
                    tgid: 42,
                    tid: 42,
                    event: EventRole::Branches as u32,
                    period: 90,
                    ..Default::default()
                },
                entries,
            );
            let mut b = bytes_of(&s);
            b[4] |= FLAG_STACK as u8;
            let sh = StackHeader {
                user_nr: 2,
                user_ip: 0x210,
                ..Default::default()
            };
            b.extend(bytes_of(&sh));
            b.extend([0x210u64, 0x9000].iter().flat_map(|f| f.to_le_bytes()));
            b
        };
        let stacks_with_ranges = |entries: &[BranchEntry]| {
            let mut d = Drain::new(3, StackMemory::default());
            d.add(&record(entries));
            assert_eq!(d.malformed, 0);
            let stacks = &d.set.processes[&42].stacks;
            let mut got: Vec<_> = stacks
                .iter()
                .filter(|(_, st)| stacks.ranges_of(st).len() > 0)
                .map(|(k, st)| {
                    let mut r: Vec<(u64, u64)> = stacks.ranges_of(st).map(|r| *r.0).collect();
                    r.sort();
                    (k.user.to_vec(), r)
                })
                .collect();
            got.sort();
            got
        };
        assert_eq!(
            stacks_with_ranges(&typed),
            [
                (vec![0x80, 0x9000], vec![(0x80, 0x100)]),
                (vec![0x105, 0x9000], vec![(0x105, 0x120)]),
                (vec![0x1000, 0x105, 0x9000], vec![(0x1000, 0x1010)]),
            ]
        );
        let untyped: Vec<BranchEntry> = typed.iter().map(|x| x.with_type(0)).collect();
        assert_eq!(
            stacks_with_ranges(&untyped),
            [(
                vec![0x210, 0x9000],
                vec![(0x80, 0x100), (0x105, 0x120), (0x1000, 0x1010)]
            )]
        );
    }
}
