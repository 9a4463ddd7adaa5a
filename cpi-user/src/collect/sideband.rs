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

/// Data pages per buffer (a power of two): 64 KiB holds hundreds of records between two
/// passes.
const DATA_PAGES: usize = 16;

/// The attr of the dummy event that carries side-band records: mappings, names, and
/// forks and exits (the kernel sends those to any event with `mmap` or `comm`, no
/// `task` needed; an exit recorded spares a `/proc` read to learn a process is gone);
/// its fd polls readable once `wake_bytes` are unread.
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

    /// Every record written since the last call, oldest first per buffer, decoded
    /// with the decoder perf.data import uses ([`side_record`]).
    pub fn read(&mut self, mut on: impl FnMut(SideRecord)) {
        for (_, ring) in &self.buffers {
            ring.read(&mut self.scratch, |kind, misc, body| {
                if let Some(r) = side_record(kind, misc, body) {
                    on(r);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Side-band records of thread `tid` alone, enabled; `None` (said) where no perf
    /// event can be opened.
    fn on_thread(tid: u32) -> Option<SidebandReader> {
        let places = sys::Placements {
            at: vec![sys::Placement::Thread { tid }],
            follow: sys::Follow::Placed,
        };
        match SidebandReader::open(&sys::Linux, &places) {
            Ok(r) => {
                r.enable(&sys::Linux).unwrap();
                Some(r)
            }
            Err(e) => {
                crate::binary::testbin::skip(format_args!("cannot open a perf event here ({e})"));
                None
            }
        }
    }

    /// The real thing, on this process: a mapping made after the event is enabled
    /// comes back as a record (root, or perf_event_paranoid ≤ 1).
    #[test]
    fn a_new_executable_mapping_of_this_process_is_recorded() {
        // Per-task events follow one thread: this test's own.
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let Some(mut r) = on_thread(me as u32) else {
            return;
        };
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
                SideRecord::Mmap { pid, mapping, .. } if *pid == std::process::id()
                    && mapping.start == p as u64
                    && mapping.object.display_name().ends_with("true"))),
            "{seen:?}"
        );
    }

    /// The real thing: a thread that exits under the event leaves an EXIT record
    /// naming it (what spares the collector a `/proc` read to learn it is gone).
    #[test]
    fn a_thread_that_exits_is_recorded() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            go_rx.recv().unwrap();
        });
        let tid = tid_rx.recv().unwrap();
        let Some(mut r) = on_thread(tid) else {
            return;
        };
        go_tx.send(()).unwrap();
        t.join().unwrap();
        let mut seen = Vec::new();
        r.read(|s| seen.push(s));
        assert!(
            seen.iter()
                .any(|s| matches!(s, SideRecord::Exit { tid: t, time } if *t == tid && *time > 0)),
            "{seen:?}"
        );
    }
}
