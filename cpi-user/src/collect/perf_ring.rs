//! Collection without root, as `perf record` and samply collect: where BPF is not
//! allowed but `perf_event_paranoid` (≤ 2) lets a user sample their own processes in user
//! space, each event of the mode is opened per thread and CPU (inherited by children),
//! and the kernel writes its samples into the event's own ring buffer, mapped here, with
//! the side-band records (MMAP2, COMM, FORK, LOST, THROTTLE) of the same processes.
//! Records are decoded by perf.data import's decoder (cpi-user/src/import/perf_data.rs:
//! one decoder for a file and a live ring) and handed to the same drain as the BPF
//! program's records, as the same wire records, so unwinding, aggregation and losses are
//! the BPF path's. No program runs in the kernel: no thinning, no kernel filter.

use std::collections::HashMap;

use cpi_common::wire::{
    BranchSample, EventRole, IpSample, SampleHeader, SampleKind, StackHeader, FLAG_KERNEL,
    FLAG_STACK, MAX_STACK_BYTES, WIRE_VERSION,
};

use super::caps::Capabilities;
use super::drain::Drain;
use super::events::EventSpec;
use super::ladder::OpenEvent;
use super::sys::ring::Ring;
use super::sys::{self, flag, PerfSys};
use super::target::Target;
use crate::import::perf_data::{self, EventAttr, Sample};
use crate::import::perf_records::{self, SideRecord};

/// Data pages of each CPU's sample buffer: 512 KiB, what `perf record` maps per CPU for
/// a user, and what the kernel lets a user lock per CPU (`perf_event_mlock_kb`, 516): all
/// the events of a CPU share it (`PERF_EVENT_IOC_SET_OUTPUT`), whatever the threads. At
/// 999 Hz a record with an 8 KiB stack copy fills it in about 60 ms; the collector is
/// woken when it is a quarter full.
pub(crate) const DATA_PAGES: usize = 128;

/// Said in the mode line of every session collected this way. Events per thread, each
/// inherited copy counting its own period from zero (perf's way): a thread or process
/// that runs less than a period is never sampled, and one that runs k.f periods is
/// sampled k times (docs/METHOD.md, "Short-lived threads").
pub(crate) const MODE_NOTE: &str = "without root: user space only, no in-kernel thinning, \
     counted per thread: threads shorter than a period are missed";

/// The remedy for a refusal, as samply says it: what would allow collection. File
/// capabilities on a binary others may run would let every user of the machine profile
/// root's processes, so the remedy restricts the binary to a group first.
pub(crate) fn remedy() -> String {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "/path/to/cpi-bpf".into());
    format!(
        "give cpi-bpf the capabilities for one group of users, as perf's documentation \
         does (`sudo groupadd -f perf_users; sudo chgrp perf_users {exe}; sudo chmod o-rwx \
         {exe}; sudo setcap cap_perfmon,cap_bpf+ep {exe}`: its members can profile every \
         process and read kernel addresses) or run it with sudo"
    )
}

/// Whether an unprivileged user may collect `target` through the kernel's perf ring
/// buffers ([`Capabilities::check_privileges`] failed): `Err` is the one line saying
/// why not and what would allow it.
pub fn allowed(caps: &Capabilities, target: &Target) -> Result<(), String> {
    match target {
        Target::SystemWide | Target::SystemWideWhile(_) | Target::Filtered(_) => {
            return Err(format!(
                "not root (euid {}): profiling every process (-a, filters) needs CAP_BPF and \
                 CAP_PERFMON: {}; without them cpi-bpf profiles your own processes (-p PID, \
                 -- CMD)",
                caps.euid,
                remedy()
            ))
        }
        Target::Pids(_) | Target::Command(_) => {}
    }
    match caps.perf_event_paranoid {
        Some(p) if p <= 2 => Ok(()),
        p => Err(format!(
            "not root (euid {}) and perf_event_paranoid is {}: your own processes can be \
             profiled at 2 or below (`sudo sysctl kernel.perf_event_paranoid=2`); or {}",
            caps.euid,
            p.map_or("unknown".to_string(), |p| p.to_string()),
            remedy()
        )),
    }
}

/// Refuses a `--pid` process that is not the user's: the kernel allows only those
/// (`/proc/PID` belongs to the process's owner, or to root when it may not be traced).
pub(crate) fn own_process(pid: u32, euid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(format!("/proc/{pid}")) {
        Ok(m) if m.uid() != euid => Err(format!(
            "pid {pid} belongs to uid {}, not to you (uid {euid}): without root cpi-bpf \
             profiles only your own processes; {}",
            m.uid(),
            remedy()
        )),
        // Gone: the target check says so.
        _ => Ok(()),
    }
}

/// `specs` as this path opens them: user space only, the sample written to the ring
/// (ip, tid, time, period, the branch stack where the event has one, user registers and
/// stack with `stacks`), the first event of each placement carrying the side-band
/// records, the fd polling readable once `wake_bytes` are unread.
pub fn specs(mut specs: Vec<EventSpec>, stacks: bool, wake_bytes: u32) -> Vec<EventSpec> {
    for (i, s) in specs.iter_mut().enumerate() {
        let a = &mut s.attr;
        a.flags |= flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV | flag::WATERMARK;
        // Events share a CPU's buffer: each sample says whose it is.
        a.sample_type |= sys::PERF_SAMPLE_IDENTIFIER;
        a.wakeup_events = wake_bytes;
        a.branch_sample_type &= !sys::PERF_SAMPLE_BRANCH_KERNEL;
        if stacks {
            a.sample_type |= sys::PERF_SAMPLE_REGS_USER | sys::PERF_SAMPLE_STACK_USER;
            a.sample_regs_user = sys::USER_REGS_BP_SP_IP;
            a.sample_stack_user = MAX_STACK_BYTES as u32;
        }
        if i == 0 {
            a.flags |= flag::MMAP | flag::MMAP2 | flag::COMM | flag::COMM_EXEC | flag::TASK;
        }
    }
    specs
}

/// One CPU's buffer.
struct SampleRing {
    ring: Ring,
    /// A copy of the event that owns it (the others on its CPU write into it), until
    /// [`SampleRings::take_ready_fds`] hands it over.
    fd: Option<std::os::fd::OwnedFd>,
    /// Its CPU: every sample in it was taken there.
    cpu: u32,
}

/// The sample buffers of a session, and what their records said of losses.
#[derive(Default)]
pub(crate) struct SampleRings {
    rings: Vec<SampleRing>,
    /// Each event's attributes as the decoder reads them, and its role, by event id.
    events: HashMap<u64, (EventAttr, EventRole)>,
    scratch: Vec<u8>,
    /// Samples of this pass, added after every buffer's side-band records were seen.
    pending: Vec<Vec<u8>>,
    /// Samples the kernel could not write, its buffer full (`PERF_RECORD_LOST`).
    pub lost: u64,
    /// `PERF_RECORD_THROTTLE`s.
    pub throttled: u64,
    /// Sample records shorter than their format.
    pub malformed: u64,
    decoded: u64,
}

impl SampleRings {
    /// Maps one buffer per CPU, for the first event of `open` (opened from `specs`)
    /// there, and points the CPU's other events at it.
    pub fn map(
        sys: &dyn PerfSys,
        open: &[OpenEvent],
        specs: &[EventSpec],
    ) -> std::io::Result<SampleRings> {
        let mut rings: Vec<SampleRing> = Vec::new();
        let mut owner: HashMap<Option<u32>, &OpenEvent> = HashMap::new();
        let mut events = HashMap::new();
        for e in open {
            let spec = &specs[e.spec_index];
            events.insert(sys.event_id(&e.fd)?, (decoder_attr(spec), spec.role));
            match owner.get(&e.place.cpu()) {
                Some(first) => sys.set_output(&e.fd, &first.fd)?,
                None => {
                    owner.insert(e.place.cpu(), e);
                    rings.push(SampleRing {
                        ring: Ring::map(&e.fd, DATA_PAGES)?,
                        fd: Some(e.fd.try_clone()?),
                        cpu: e.place.cpu().unwrap_or(0),
                    });
                }
            }
        }
        Ok(SampleRings {
            rings,
            events,
            ..Default::default()
        })
    }

    /// Reads every buffer: side-band records to `drain` as they come, then the samples.
    pub fn read(&mut self, drain: &mut Drain) {
        let events = &self.events;
        for r in &self.rings {
            let (pending, stats) = (&mut self.pending, &mut self.lost);
            let (throttled, malformed, decoded) =
                (&mut self.throttled, &mut self.malformed, &mut self.decoded);
            r.ring.read(&mut self.scratch, |kind, misc, body| {
                if kind == perf_data::PERF_RECORD_SAMPLE {
                    *decoded += 1;
                    // PERF_SAMPLE_IDENTIFIER: the event's id leads the sample.
                    let id = body
                        .get(..8)
                        .map(|b| u64::from_le_bytes(b.try_into().expect("8")));
                    let Some((attr, role)) = id.and_then(|id| events.get(&id)) else {
                        *malformed += 1;
                        return;
                    };
                    match perf_data::sample_of(attr, 0, body, *decoded) {
                        Ok(mut s) => {
                            s.kernel = perf_records::kernel_mode(misc);
                            pending.push(wire(&s, *role, r.cpu, attr));
                        }
                        Err(_) => *malformed += 1,
                    }
                    return;
                }
                match perf_records::side_record(kind, misc, body) {
                    Some(SideRecord::Lost(n)) => *stats += n,
                    Some(SideRecord::Throttle) => *throttled += 1,
                    Some(rec) => drain.observe(rec),
                    None => {}
                }
            });
        }
        for rec in self.pending.drain(..) {
            drain.add(&rec);
        }
    }

    /// The buffers' fds (copies of their events'), each readable once its buffer is a
    /// quarter full; handed over once.
    pub(crate) fn take_ready_fds(&mut self) -> Vec<std::os::fd::OwnedFd> {
        self.rings.iter_mut().filter_map(|r| r.fd.take()).collect()
    }

    /// Loss counts since the last call: (lost, throttled, malformed).
    pub(crate) fn take_losses(&mut self) -> (u64, u64, u64) {
        let out = (self.lost, self.throttled, self.malformed);
        (self.lost, self.throttled, self.malformed) = (0, 0, 0);
        out
    }
}

/// What the decoder needs of an event we opened.
fn decoder_attr(spec: &EventSpec) -> EventAttr {
    let a = &spec.attr;
    EventAttr {
        kind: a.type_,
        config: a.config,
        period_or_freq: a.sample_period,
        freq: a.flags & flag::FREQ != 0,
        sample_type: a.sample_type,
        read_format: a.read_format,
        branch_sample_type: a.branch_sample_type,
        sample_regs_user: a.sample_regs_user,
        sample_max_stack: a.sample_max_stack,
        name: Some(spec.name.clone()),
        ids: Vec::new(),
    }
}

/// A decoded sample as the wire record the BPF program writes for it: its fixed part,
/// then, where the event copies the user stack, the stack section (no kernel frames:
/// user space only).
fn wire(s: &Sample, role: EventRole, cpu: u32, attr: &EventAttr) -> Vec<u8> {
    let stack = s.user_regs.filter(|_| attr.has_user_stack());
    let mut flags = if s.kernel { FLAG_KERNEL } else { 0 };
    if stack.is_some() {
        flags |= FLAG_STACK;
    }
    let header = SampleHeader {
        version: WIRE_VERSION,
        kind: SampleKind::Ip as u16,
        flags,
        nr: 0,
        cpu,
        tgid: s.pid,
        tid: s.tid,
        event: role as u32,
        period: s.period,
        time_ns: s.time,
        ip: s.ip,
        // Not asked of the kernel (`PERF_SAMPLE_CGROUP`): the identity is read.
        cgroup_id: 0,
    };
    let mut out = if role == EventRole::Branches {
        sys::bytes_of(&BranchSample::new(header, &s.branches)).to_vec()
    } else {
        sys::bytes_of(&IpSample { header }).to_vec()
    };
    if let Some(regs) = stack {
        let bytes = &s.user_stack[..s.user_stack.len().min(MAX_STACK_BYTES)];
        let sh = StackHeader {
            kernel_nr: 0,
            user_nr: 0,
            stack_len: bytes.len() as u32,
            user_ip: regs.ip,
            user_sp: regs.sp,
            user_bp: regs.bp,
        };
        out.extend_from_slice(sys::bytes_of(&sh));
        out.extend_from_slice(bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::drain::{decode, Record};
    use crate::collect::events::Rate;
    use crate::profile::Mode;

    fn time_specs(stacks: bool) -> Vec<EventSpec> {
        let rate = Rate {
            frequency: 999,
            period: None,
            core_hz: 2_000_000_000,
        };
        let cpu = super::super::caps::Processor::of(super::super::caps::Vendor::Intel);
        let plan = super::super::events::plan(Mode::TimeProfile, &cpu, &rate, false, false);
        specs(plan, stacks, 4096)
    }

    #[test]
    fn events_ask_the_kernel_for_user_samples_stacks_and_side_band() {
        let s = time_specs(true);
        let a = &s[0].attr;
        assert_eq!(s[0].role, EventRole::CpuClock);
        for bit in [
            flag::EXCLUDE_KERNEL,
            flag::EXCLUDE_HV,
            flag::MMAP2,
            flag::COMM_EXEC,
            flag::TASK,
            flag::WATERMARK,
        ] {
            assert_ne!(a.flags & bit, 0, "{bit:#x}");
        }
        let want = sys::PERF_SAMPLE_IDENTIFIER
            | sys::PERF_SAMPLE_IP
            | sys::PERF_SAMPLE_TID
            | sys::PERF_SAMPLE_TIME
            | sys::PERF_SAMPLE_PERIOD
            | sys::PERF_SAMPLE_REGS_USER
            | sys::PERF_SAMPLE_STACK_USER;
        assert_eq!(a.sample_type, want);
        assert_eq!(a.sample_stack_user as usize, MAX_STACK_BYTES);
        assert_eq!(
            time_specs(false)[0].attr.sample_type & sys::PERF_SAMPLE_STACK_USER,
            0
        );
    }

    /// A sample record as the kernel lays it out for `sample_type` IDENTIFIER|IP|TID|
    /// TIME|PERIOD|REGS_USER|STACK_USER, decoded by import's decoder into the BPF program's wire
    /// record: the same fields, the same stack section.
    #[test]
    fn a_kernel_sample_becomes_the_bpf_programs_record() {
        let spec = &time_specs(true)[0];
        let attr = decoder_attr(spec);
        let mut b = Vec::new();
        for w in [5u64, 0x40_1000, 7 | 9 << 32, 123_456, 1_001_001] {
            b.extend(w.to_le_bytes());
        }
        b.extend(2u64.to_le_bytes()); // PERF_SAMPLE_REGS_ABI_64
        for reg in [0x7ff0_0100u64, 0x7ff0_0000, 0x40_1000] {
            b.extend(reg.to_le_bytes()); // bp, sp, ip (mask order)
        }
        b.extend((MAX_STACK_BYTES as u64).to_le_bytes());
        b.extend(vec![0xabu8; MAX_STACK_BYTES]);
        b.extend(16u64.to_le_bytes()); // dyn_size: what the kernel could copy
        let s = perf_data::sample_of(&attr, 0, &b, 1).unwrap();
        let rec = wire(&s, spec.role, 1, &attr);
        let (Record::Ip(ip), Some(stack)) = decode(&rec).expect("decodes") else {
            panic!("not an IP sample with a stack");
        };
        let h = ip.header;
        assert_eq!((h.tgid, h.tid, h.cpu, h.ip), (7, 9, 1, 0x40_1000));
        assert_eq!((h.period, h.time_ns), (1_001_001, 123_456));
        assert_eq!(h.event, EventRole::CpuClock as u32);
        assert_eq!(h.flags & FLAG_KERNEL, 0);
        assert_eq!(
            (
                stack.header.user_ip,
                stack.header.user_sp,
                stack.header.user_bp
            ),
            (0x40_1000, 0x7ff0_0000, 0x7ff0_0100)
        );
        assert_eq!(stack.stack, &[0xab; 16]);
        assert!(stack.kernel.is_empty() && stack.user.is_empty());
        // Cut short of its format: counted, not guessed.
        assert!(perf_data::sample_of(&attr, 0, &b[..48], 2).is_err());
    }

    #[test]
    fn refusals_say_what_would_allow_it() {
        let mut caps = Capabilities::probe_at(std::path::Path::new("/nonexistent"), 1000, "6.1");
        caps.perf_event_paranoid = Some(2);
        let own = Target::Command(vec!["true".into()]);
        assert_eq!(allowed(&caps, &own), Ok(()));
        assert!(allowed(&caps, &Target::Pids(vec![1])).is_ok());
        let all = allowed(&caps, &Target::SystemWide).unwrap_err();
        assert!(all.contains("setcap cap_perfmon,cap_bpf+ep"), "{all}");
        caps.perf_event_paranoid = Some(3);
        let e = allowed(&caps, &own).unwrap_err();
        assert!(
            e.contains("perf_event_paranoid is 3")
                && e.contains("sysctl kernel.perf_event_paranoid=2")
                && e.contains("setcap"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }
}
