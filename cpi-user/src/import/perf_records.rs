//! The records of a perf ring buffer other than samples (mappings, names, forks,
//! losses, throttling), decoded alike for a perf.data file ([`super::perf_data`]) and the
//! collector's live buffers (cpi-user/src/collect/sideband.rs, perf_ring.rs).

use super::perf_data::{c_str, hex, u32_at, u64_at};
use crate::procmap::{MappedObject, Mapping};

const PERF_RECORD_MMAP: u32 = 1;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_COMM: u32 = 3;
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
            (pid != ppid).then_some(SideRecord::Fork { pid, ppid })
        }
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
