//! Ring-buffer records → per-process [`SampleSet`], plus each process's comm, mappings
//! and mapped files, captured while it is alive ([`crate::procmap::capture`]: read when
//! the pid is first seen, re-read when an address misses them, kept after the process
//! exits or execs).

use std::collections::BTreeMap;

use cpi_common::wire::{
    BranchSample, EventRole, IpSample, SampleHeader, SampleKind, FLAG_KERNEL, WIRE_VERSION,
};

use crate::procmap::{capture, Tracker};
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

/// The collector's side of the ring buffer.
#[derive(Debug)]
pub struct Drain {
    pub set: SampleSet,
    /// Records received per event role.
    pub received: BTreeMap<EventRole, u64>,
    /// Records that failed to decode (or had an unknown role).
    pub malformed: u64,
    tracker: Tracker,
}

impl Drain {
    pub fn new(window: usize) -> Self {
        Drain {
            set: SampleSet::new(window),
            received: BTreeMap::new(),
            malformed: 0,
            tracker: Tracker::new(),
        }
    }

    /// Adds one raw record.
    pub fn add(&mut self, bytes: &[u8]) {
        let Some(rec) = decode(bytes) else {
            self.malformed += 1;
            return;
        };
        let (h, user_addr) = match &rec {
            Record::Ip(s) => (s.header, s.header.ip),
            Record::Branch(s) => (s.header, s.entries().first().map_or(0, |e| e.to)),
        };
        let Some(role) = EventRole::from_u32(h.event) else {
            self.malformed += 1;
            return;
        };
        self.track(h.tgid, (h.flags & FLAG_KERNEL == 0).then_some(user_addr));
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
    }

    /// Comm, maps and mapped files of `pid`: captured on first sight, and again when
    /// `addr` (a user address) is in none of the known mappings (at most every
    /// [`capture::REREAD_EVERY`]); earlier mappings stay for earlier samples.
    fn track(&mut self, pid: u32, addr: Option<u64>) {
        let p = self.set.process(pid);
        if pid == 0 {
            // The idle task (system-wide, kernel samples): no /proc entry, no maps.
            p.comm = "swapper".to_string();
            return;
        }
        let miss =
            addr.is_some_and(|a| a != 0 && p.maps.as_ref().is_none_or(|m| m.find(a).is_none()));
        if self.tracker.due(pid, miss) {
            // A process that already exited keeps the maps (and name) read last time.
            if let Some(m) = self.tracker.read(pid, p.maps.as_ref()) {
                p.maps = Some(m);
            }
            // A miss usually means exec replaced the image (a shell wrapper or a pyenv
            // shim becoming the real program): its name changed with it.
            let comm = capture::comm(pid, p.maps.as_ref());
            if p.comm.is_empty() || !comm.starts_with(':') {
                p.comm = comm;
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
