//! Side-band records: the kernel's own account of every executable mapping and every
//! name change (`PERF_RECORD_MMAP2`, `PERF_RECORD_COMM`), written synchronously when a
//! process maps code or execs, as `perf record` gets them. A process that lives a
//! millisecond (`/bin/true` in a shell loop) is gone before its `/proc/PID/maps` can be
//! read; its records are not.
//!
//! One dummy software event (it counts nothing) per target placement carries them:
//! per CPU system-wide, inherited by the children of a started command or a `--pid`
//! process (children write into the parent event's buffer). The collector reads the
//! buffers before each pass over the sample ring, so a sample's mappings are known
//! before the sample is, and as soon as one is a quarter full ([`SidebandReader::fds`]
//! poll readable): however seldom the collector drains at a low sampling rate, a host
//! starting many processes does not fill them.

use std::io;
use std::os::fd::OwnedFd;

use super::sys::ring::Ring;
use super::sys::{self, flag, PerfEventAttr, PerfSys, Placements};
use crate::fsafe::page_size;
use crate::import::perf_records::{side_record, SideRecord};
use crate::procmap::{MappedObject, Mapping};

/// Data pages per buffer (a power of two): 64 KiB holds hundreds of records between two
/// passes.
const DATA_PAGES: usize = 16;

/// What one side-band record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sideband {
    /// Process `pid` mapped code.
    Mapping {
        /// The process.
        pid: u32,
        /// What it mapped.
        mapping: Mapping,
    },
    /// Thread `tid` of process `pid` is now called `comm` (`exec`: its image was
    /// replaced); whether that names the process is
    /// [`crate::import::perf_records::names_process`]'s to say.
    Comm {
        /// The process.
        pid: u32,
        /// The thread.
        tid: u32,
        /// Its new name.
        comm: String,
        /// The name changed with an `exec`.
        exec: bool,
    },
    /// Process `pid` was forked by `ppid`: it has its parent's mappings, and no
    /// record of them of its own.
    Fork {
        /// The child.
        pid: u32,
        /// Its parent.
        ppid: u32,
    },
    /// The kernel dropped this many records (buffer full).
    Lost(u64),
}

/// The attr of the dummy event that carries side-band records; its fd polls readable
/// once `wake_bytes` are unread.
pub fn attr(wake_bytes: u32) -> PerfEventAttr {
    PerfEventAttr {
        wakeup_events: wake_bytes,
        type_: sys::PERF_TYPE_SOFTWARE,
        size: sys::PERF_ATTR_SIZE,
        config: sys::PERF_COUNT_SW_DUMMY,
        flags: flag::DISABLED
            | flag::MMAP
            | flag::COMM
            | flag::MMAP2
            | flag::COMM_EXEC
            | flag::EXCLUDE_KERNEL
            | flag::EXCLUDE_HV
            | flag::WATERMARK,
        ..Default::default()
    }
}

/// The side-band buffers of a session.
#[derive(Default)]
pub(crate) struct SidebandReader {
    buffers: Vec<(OwnedFd, Ring)>,
    scratch: Vec<u8>,
}

impl SidebandReader {
    /// Opens (disabled) and maps one dummy event per placement, each on one CPU when
    /// they follow children (the kernel maps an inherited event's buffer only then).
    pub fn open(sys: &dyn PerfSys, places: &Placements) -> io::Result<SidebandReader> {
        let quarter = (page_size() * DATA_PAGES / 4) as u32;
        let mut buffers = Vec::new();
        for &at in &places.at {
            let fd = match sys.perf_event_open(&attr(quarter), at, places.follow) {
                Ok(fd) => fd,
                // A thread that exited since the placements were listed.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                Err(e) => return Err(e),
            };
            let ring = Ring::map(&fd, DATA_PAGES)?;
            buffers.push((fd, ring));
        }
        Ok(SidebandReader {
            buffers,
            scratch: Vec::new(),
        })
    }

    /// Enables every event (targets started with `enable_on_exec` enable themselves).
    pub fn enable(&self, sys: &dyn PerfSys) -> io::Result<()> {
        for (fd, _) in &self.buffers {
            sys.enable(fd)?;
        }
        Ok(())
    }

    /// The buffers' fds: each polls readable once its buffer is a quarter full.
    pub fn fds(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> + '_ {
        self.buffers
            .iter()
            .map(|(fd, _)| std::os::fd::AsFd::as_fd(fd))
    }

    /// Every record written since the last call, oldest first per buffer.
    pub fn read(&mut self, mut on: impl FnMut(Sideband)) {
        for (_, ring) in &self.buffers {
            ring.read(&mut self.scratch, |kind, misc, body| {
                if let Some(r) = parse(kind, misc, body) {
                    on(r);
                }
            });
        }
    }
}

/// Decodes one record's body (after the 8-byte header) with the decoder perf.data
/// import uses ([`side_record`]): executable mappings, names, new processes, losses.
pub fn parse(kind: u32, misc: u16, body: &[u8]) -> Option<Sideband> {
    of(side_record(kind, misc, body)?)
}

/// What a decoded record says of processes, when it says something (a throttle says
/// nothing of them).
pub fn of(record: SideRecord) -> Option<Sideband> {
    match record {
        SideRecord::Mmap {
            pid, mut mapping, ..
        } => {
            if !mapping.executable || mapping.start == mapping.end {
                return None;
            }
            // Identity only for a file with an inode (an MMAP2 record without build-id).
            mapping.file_id = mapping
                .file_id
                .filter(|id| id.ino != 0 && matches!(mapping.object, MappedObject::File { .. }));
            Some(Sideband::Mapping { pid, mapping })
        }
        SideRecord::Comm {
            pid,
            tid,
            name,
            exec,
        } => Some(Sideband::Comm {
            pid,
            tid,
            comm: name,
            exec,
        }),
        SideRecord::Fork { pid, ppid } => Some(Sideband::Fork { pid, ppid }),
        SideRecord::Lost(n) => Some(Sideband::Lost(n)),
        SideRecord::Throttle => None,
    }
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
        b.extend([0u8; 24]); // maj, min, ino, ino_generation
        b.extend(prot.to_ne_bytes());
        b.extend(2u32.to_ne_bytes()); // MAP_PRIVATE
        b.extend(name.as_bytes());
        b.push(0);
        b
    }

    #[test]
    fn executable_mmap2_records_become_mappings() {
        let body = mmap2(42, 0x1000, 0x2000, 0x3000, 5, "/usr/bin/true");
        let Some(Sideband::Mapping { pid, mapping }) = parse(10, 0, &body) else {
            panic!("not a mapping");
        };
        assert_eq!(pid, 42);
        assert_eq!(
            (mapping.start, mapping.end, mapping.offset),
            (0x1000, 0x3000, 0x3000)
        );
        assert_eq!(mapping.object.display_name(), "/usr/bin/true");
        let data = mmap2(42, 0x1000, 0x2000, 0, 3, "/etc/ld.so.cache");
        assert_eq!(parse(10, 0, &data), None, "not code");
        assert_eq!(parse(10, 0, &body[..20]), None, "truncated");
    }

    #[test]
    fn comm_records_say_exec() {
        let mut b = Vec::new();
        b.extend(7u32.to_ne_bytes());
        b.extend(7u32.to_ne_bytes());
        b.extend(b"true\0\0\0\0");
        assert_eq!(
            parse(3, 1 << 13, &b),
            Some(Sideband::Comm {
                pid: 7,
                tid: 7,
                comm: "true".into(),
                exec: true
            })
        );
    }

    /// The real thing, on this process: a mapping made after the event is enabled
    /// comes back as a record (root, or perf_event_paranoid ≤ 1).
    #[test]
    fn a_new_executable_mapping_of_this_process_is_recorded() {
        // Per-task events follow one thread: this test's own.
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let places = sys::Placements {
            at: vec![sys::Placement::Thread { tid: me as u32 }],
            follow: sys::Follow::Placed,
        };
        let mut r = match SidebandReader::open(&sys::Linux, &places) {
            Ok(r) => r,
            Err(e) => {
                crate::binary::testbin::skip(format_args!("cannot open a perf event here ({e})"));
                return;
            }
        };
        r.enable(&sys::Linux).unwrap();
        let f = std::fs::File::open("/bin/true").unwrap();
        // SAFETY: a fresh private, read-execute mapping of a file we hold; unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut seen = Vec::new();
        r.read(|s| seen.push(s));
        // SAFETY: mapped above.
        unsafe { libc::munmap(p, 4096) };
        assert!(
            seen.iter().any(|s| matches!(s,
                Sideband::Mapping { pid, mapping } if *pid == std::process::id()
                    && mapping.start == p as u64
                    && mapping.object.display_name().ends_with("true"))),
            "{seen:?}"
        );
    }
}
