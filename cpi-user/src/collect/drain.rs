//! Ring-buffer records → per-process [`SampleSet`], plus each process's comm and
//! mappings (read when the pid is first seen, re-read when an address misses them, kept
//! after the process exits).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use cpi_common::wire::{
    BranchSample, EventRole, IpSample, SampleHeader, SampleKind, FLAG_KERNEL, WIRE_VERSION,
};

use super::target;
use crate::procmap::{CapturedFiles, ProcessMaps};
use crate::profile::SampleSet;

/// A decoded record.
#[derive(Debug)]
pub enum Record {
    Branch(Box<BranchSample>),
    Ip(IpSample),
}

/// Decodes one ring-buffer record; `None` for a wrong version, kind or size.
pub fn decode(bytes: &[u8]) -> Option<Record> {
    if bytes.len() < size_of::<SampleHeader>() {
        return None;
    }
    // SAFETY: length checked; read_unaligned copies plain data.
    let h: SampleHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    if h.version != WIRE_VERSION {
        return None;
    }
    match SampleKind::from_u16(h.kind)? {
        SampleKind::Branch if bytes.len() == size_of::<BranchSample>() => {
            // SAFETY: exact size of a plain-data record.
            Some(Record::Branch(Box::new(unsafe {
                std::ptr::read_unaligned(bytes.as_ptr().cast())
            })))
        }
        SampleKind::Ip if bytes.len() == size_of::<IpSample>() => {
            Some(Record::Ip(IpSample { header: h }))
        }
        _ => None,
    }
}

/// Re-read a process's maps on a miss at most this often (a genuinely unmapped
/// address must not turn every sample into a `/proc` read).
const REREAD_EVERY: Duration = Duration::from_millis(100);

/// The collector's side of the ring buffer.
#[derive(Debug)]
pub struct Drain {
    pub set: SampleSet,
    /// Records received per event role.
    pub received: BTreeMap<EventRole, u64>,
    /// Records that failed to decode (or had an unknown role).
    pub malformed: u64,
    /// Records received per (role, CPU) and per (role, thread): how often each open
    /// event (per CPU, or per thread) has fired, for the period re-draw schedule.
    pub by_cpu: HashMap<(EventRole, u32), u64>,
    pub by_thread: HashMap<(EventRole, u32), u64>,
    /// (period last set with `PERF_EVENT_IOC_PERIOD`, period opened with) of a software
    /// clock event, per (role, CPU) and (role, thread): the kernel keeps reporting the
    /// period the event was opened with for those (`hw.last_period` is set once, in
    /// `perf_swevent_init_hrtimer`), so their weights (n overflows × that period, see
    /// the eBPF program's thinning) are rescaled to the period really in force.
    pub clock_period_by_cpu: HashMap<(EventRole, u32), (u64, u64)>,
    pub clock_period_by_thread: HashMap<(EventRole, u32), (u64, u64)>,
    maps_read_at: HashMap<u32, Instant>,
    /// Files of executable mappings, opened while their processes live.
    files: CapturedFiles,
}

impl Drain {
    pub fn new(window: usize) -> Self {
        Drain {
            set: SampleSet::new(window),
            received: BTreeMap::new(),
            malformed: 0,
            by_cpu: HashMap::new(),
            by_thread: HashMap::new(),
            clock_period_by_cpu: HashMap::new(),
            clock_period_by_thread: HashMap::new(),
            maps_read_at: HashMap::new(),
            files: CapturedFiles::default(),
        }
    }

    /// Adds one raw record.
    pub fn add(&mut self, bytes: &[u8]) {
        let Some(mut rec) = decode(bytes) else {
            self.malformed += 1;
            return;
        };
        if let Record::Ip(s) = &mut rec {
            let h = &mut s.header;
            if let Some(role) = EventRole::from_u32(h.event) {
                if let Some(&(now, opened)) = self
                    .clock_period_by_thread
                    .get(&(role, h.tid))
                    .or_else(|| self.clock_period_by_cpu.get(&(role, h.cpu)))
                {
                    h.period =
                        (u128::from(h.period) * u128::from(now) / u128::from(opened.max(1))) as u64;
                }
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
        self.track(
            h.tgid,
            h.tid,
            (h.flags & FLAG_KERNEL == 0).then_some(user_addr),
        );
        match &rec {
            Record::Ip(s) => {
                if self.set.add_ip(s).is_err() {
                    self.malformed += 1;
                    return;
                }
            }
            Record::Branch(s) => self.set.add_branch(s),
        }
        *self.received.entry(role).or_default() += 1;
        *self.by_cpu.entry((role, h.cpu)).or_default() += 1;
        *self.by_thread.entry((role, h.tid)).or_default() += 1;
    }

    /// Comm, maps and mapped files of `pid`: read on first sight, re-read when `addr` (a
    /// user address) is in none of the known mappings (at most every `REREAD_EVERY`).
    /// What is read while the process lives is what analysis uses after it is gone:
    /// the files are opened at once (deleted, replaced and other-namespace binaries
    /// stay readable), and mappings from before an `exec` are kept where the new image
    /// does not overlap them.
    fn track(&mut self, pid: u32, tid: u32, addr: Option<u64>) {
        let p = self.set.process(pid);
        if pid == 0 {
            // The idle task (system-wide, kernel samples): no /proc entry, no maps.
            p.comm = "swapper".to_string();
            return;
        }
        let first = p.maps.is_none() && !self.maps_read_at.contains_key(&pid);
        if p.comm.is_empty() {
            p.comm = target::comm(pid);
        }
        let miss =
            addr.is_some_and(|a| a != 0 && p.maps.as_ref().is_none_or(|m| m.find(a).is_none()));
        let due = self
            .maps_read_at
            .get(&pid)
            .is_none_or(|t| t.elapsed() >= REREAD_EVERY);
        if first || (miss && due) {
            self.maps_read_at.insert(pid, Instant::now());
            // A process that already exited keeps the maps (and name) read last time.
            if let Ok((m, dir)) = ProcessMaps::read_live(pid, tid) {
                for (start, f) in self.files.capture(&dir, &m) {
                    p.files.insert(start, f);
                }
                p.maps = Some(match p.maps.take() {
                    Some(older) => m.with_older(&older),
                    None => m,
                });
            }
            // A miss usually means exec replaced the image (a shell wrapper or a pyenv
            // shim becoming the real program): its name changed with it.
            let comm = target::comm(pid);
            if !comm.is_empty() {
                p.comm = comm;
            }
        }
        if p.comm.is_empty() {
            // Gone before its name could be read: the thread's, else the pid.
            p.comm = target::comm(tid);
            if p.comm.is_empty() {
                p.comm = format!("[pid {pid}]");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpi_common::wire::{BranchEntry, MAX_BRANCH_ENTRIES};

    fn bytes_of<T>(v: &T) -> Vec<u8> {
        // SAFETY: plain-data records.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
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
        let mut d = Drain::new(4);
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
        let mut d = Drain::new(2);
        d.add(&bytes_of(&s));
        assert_eq!(d.set.processes[&42].branches.samples, 1);
        assert_eq!(d.received[&EventRole::Branches], 1);
    }

    #[test]
    fn bad_records_are_counted_not_used() {
        let mut d = Drain::new(1);
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
}
