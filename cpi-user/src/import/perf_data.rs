//! `perf.data` (the kernel's and perf's file layout, `PERFILE2`) → events, samples
//! with branch stacks, COMM and MMAP/MMAP2 records and the header's build-id table.
//!
//! Layout (tools/perf/util/header.h, include/uapi/linux/perf_event.h): a 104-byte
//! header (magic, size, attr_size, the attrs, data and event-types sections, a 256-bit
//! feature bitmap); the attrs section holds `perf_event_attr` + an ids section per
//! event; the data section holds records (`perf_event_header` + body); after the data
//! section, one (offset, size) section per feature bit set, of which this reads
//! `HEADER_BUILD_ID` (2), `HEADER_ARCH` (6: the recording machine's `uname -m`, whose
//! code this reads only when it is x86-64), `HEADER_CPUID` (9: which vendor's raw event codes),
//! `HEADER_EVENT_DESC` (12, the event names) and `HEADER_PMU_MAPPINGS` (16: which PMU a
//! dynamic event type is, e.g. hybrid Intel's `cpu_atom`).
//!
//! Samples follow the kernel's `perf_output_sample` order (kernel/events/core.c; the
//! record layout in include/uapi/linux/perf_event.h): identifier, ip, tid, time, addr,
//! id, stream id, cpu, period, read values, callchain, raw, branch stack (with its hw
//! index and per-entry counters when asked for), user regs, user stack bytes. The callchain becomes the
//! sample's [`CallStack`] ([`callchain`]); a `--call-graph dwarf` sample's user
//! registers (ip, sp, bp of a 64-bit task) and stack bytes are kept with it, for the
//! import to unwind (cpi-user/src/import/unwound.rs).
//!
//! The records are streamed ([`read`] calls a sink per sample), so memory does not
//! grow with the file. Written by hand rather than with the `linux-perf-data` crate:
//! its sample parser skips the branch stack without returning it, and its event types
//! hide the raw `type`/`config` the estimator choice needs.

use super::perf_records::{kernel_mode, side_record, Origin, RecordedProcesses, SideRecord};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};

use cpi_common::wire::BranchEntry;

use crate::procmap::MappedObject;
use crate::profile::stack::{CallStack, StackEnd};
use crate::unwind::UserRegs;

/// The file magic.
pub(crate) const MAGIC: &[u8; 8] = b"PERFILE2";
/// Largest single record the kernel writes (its size field is 16 bits).
const HEADER_SIZE: u64 = 104;
const PIPE_HEADER_SIZE: u64 = 16;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_TYPE_RAW: u32 = 4;

/// `PERF_RECORD_SAMPLE`.
pub const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_RECORD_COMPRESSED: u32 = 81;

const SAMPLE_IP: u64 = 1 << 0;
const SAMPLE_TID: u64 = 1 << 1;
const SAMPLE_TIME: u64 = 1 << 2;
const SAMPLE_ADDR: u64 = 1 << 3;
const SAMPLE_READ: u64 = 1 << 4;
const SAMPLE_CALLCHAIN: u64 = 1 << 5;
const SAMPLE_ID: u64 = 1 << 6;
const SAMPLE_CPU: u64 = 1 << 7;
const SAMPLE_PERIOD: u64 = 1 << 8;
const SAMPLE_STREAM_ID: u64 = 1 << 9;
const SAMPLE_RAW: u64 = 1 << 10;
const SAMPLE_BRANCH_STACK: u64 = 1 << 11;
const SAMPLE_REGS_USER: u64 = 1 << 12;
const SAMPLE_STACK_USER: u64 = 1 << 13;
const SAMPLE_IDENTIFIER: u64 = 1 << 16;

const FORMAT_TOTAL_TIME_ENABLED: u64 = 1 << 0;
const FORMAT_TOTAL_TIME_RUNNING: u64 = 1 << 1;
const FORMAT_ID: u64 = 1 << 2;
const FORMAT_GROUP: u64 = 1 << 3;
const FORMAT_LOST: u64 = 1 << 4;

/// `PERF_SAMPLE_REGS_ABI_64`, and x86's `PERF_REG_X86_BP`, `_SP`, `_IP`.
const REGS_ABI_64: u64 = 2;
const REG_BP: u32 = 6;
const REG_SP: u32 = 7;
const REG_IP: u32 = 8;

const BRANCH_HW_INDEX: u64 = 1 << 17;
/// `PERF_SAMPLE_BRANCH_COUNTERS` (6.8+): a u64 of event counts per entry follows them.
const BRANCH_COUNTERS: u64 = 1 << 19;
const ATTR_FLAG_FREQ: u64 = 1 << 10;

const MISC_BUILD_ID_SIZE: u16 = 1 << 15;

/// Callchain context markers (`enum perf_callchain_context`): the frames after one
/// belong to that context.
const CONTEXT_KERNEL: u64 = -128i64 as u64;
const CONTEXT_USER: u64 = -512i64 as u64;
/// Values at or above this are markers, not addresses.
const CONTEXT_MAX: u64 = -4095i64 as u64;
/// `kernel.perf_event_max_stack`'s default: the kernel's limit when the attr names none.
pub(crate) const DEFAULT_MAX_STACK: u64 = 127;

const FEAT_BUILD_ID: usize = 2;
const FEAT_ARCH: usize = 6;
const FEAT_CPUID: usize = 9;
const FEAT_EVENT_DESC: usize = 12;
const FEAT_PMU_MAPPINGS: usize = 16;

/// Why a perf.data file could not be read; one line each.
#[derive(Debug, thiserror::Error)]
pub enum PerfDataError {
    /// Reading or seeking failed.
    #[error("reading the file")]
    Io(#[from] std::io::Error),
    /// The file does not start with `MAGIC`.
    #[error("not a perf.data file (no PERFILE2 magic)")]
    NotPerfData,
    /// A pipe-mode stream (16-byte header): its attrs come as records, not read here.
    #[error(
        "pipe-mode perf.data (perf record -o -) is not read: save it as a file with \
         `perf inject -i FILE -o perf.data` and import that"
    )]
    PipeMode,
    /// A section or record runs past the end of the file; says which.
    #[error("truncated perf.data: {0}")]
    Truncated(String),
    /// A size or offset that cannot be right; says which.
    #[error("malformed perf.data: {0}")]
    Malformed(String),
    /// `PERF_RECORD_COMPRESSED` records (zstd), not decoded here.
    #[error(
        "compressed perf.data records (perf record -z) are not read: decompress with \
         `perf inject -i FILE -o plain.data`"
    )]
    Compressed,
    /// A sample's id matches no event of the attrs section.
    #[error("sample {index} names event id {id}, which no event attribute lists (unknown event)")]
    UnknownEvent {
        /// 0-based index of the sample in the file.
        index: u64,
        /// The sample's `PERF_SAMPLE_ID`/`IDENTIFIER` value.
        id: u64,
    },
}

/// One recorded event (`perf_event_attr` plus its name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventAttr {
    /// `perf_event_attr.type` (0 hardware, 1 software, 4 raw / the core PMU, ...).
    pub kind: u32,
    /// `perf_event_attr.config`: the event within its type.
    pub config: u64,
    /// `sample_period`, or the frequency when `freq` is set.
    pub period_or_freq: u64,
    /// Frequency mode (`perf record -F`): each sample carries its own period.
    pub freq: bool,
    /// `PERF_SAMPLE_*` bits: the layout of this event's sample records.
    pub sample_type: u64,
    /// `PERF_FORMAT_*` bits: the layout of `PERF_SAMPLE_READ` values.
    pub read_format: u64,
    /// `PERF_SAMPLE_BRANCH_*` bits: what the branch stack recorded (and whether it has
    /// the `hw_idx` word).
    pub branch_sample_type: u64,
    /// `sample_regs_user`: which user registers `PERF_SAMPLE_REGS_USER` records.
    pub sample_regs_user: u64,
    /// `sample_max_stack`: the callchain's frame limit (0: the recording machine's
    /// `kernel.perf_event_max_stack`, `DEFAULT_MAX_STACK` unless changed).
    pub sample_max_stack: u16,
    /// From `HEADER_EVENT_DESC` when the file has it (e.g. `cycles`, `cpu/r20c4/`).
    pub name: Option<String>,
    /// Sample ids that belong to this event.
    pub ids: Vec<u64>,
}

impl EventAttr {
    /// The event's samples carry a branch stack (`perf record -b`/`-j`).
    pub(crate) fn has_branch_stack(&self) -> bool {
        self.sample_type & SAMPLE_BRANCH_STACK != 0
    }

    /// The event's samples carry the time they were taken (`PERF_SAMPLE_TIME`).
    pub(crate) fn has_time(&self) -> bool {
        self.sample_type & SAMPLE_TIME != 0
    }

    /// The event's samples carry a callchain (`perf record -g`).
    pub(crate) fn has_callchain(&self) -> bool {
        self.sample_type & SAMPLE_CALLCHAIN != 0
    }

    /// The event's samples carry user registers and stack bytes
    /// (`perf record --call-graph dwarf`).
    pub(crate) fn has_user_stack(&self) -> bool {
        self.sample_type & SAMPLE_STACK_USER != 0
    }

    /// The software clock events (`cpu-clock`, `task-clock`): periods in nanoseconds.
    pub(crate) fn is_clock(&self) -> bool {
        self.kind == PERF_TYPE_SOFTWARE && matches!(self.config, 0 | 1)
    }

    /// Frames a callchain holds at most: a chain of this many was cut by the kernel.
    fn max_stack(&self) -> u64 {
        match self.sample_max_stack {
            0 => DEFAULT_MAX_STACK,
            n => n.into(),
        }
    }

    /// A name for messages: the recorded one, else `type/config`.
    pub fn display_name(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => format!("type {} config {:#x}", self.kind, self.config),
        }
    }
}

/// One sample, as the analysis needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Index into [`Header::events`].
    pub event: usize,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Sampled instruction pointer (runtime address).
    pub ip: u64,
    /// The kernel's perf clock at the sample, ns (`PERF_SAMPLE_TIME`; 0 without).
    pub time: u64,
    /// Events this sample stands for: the sample's own period, or the attr's fixed one.
    pub period: u64,
    /// Kernel order: entry 0 is the newest branch. Empty without a branch stack.
    pub branches: Vec<BranchEntry>,
    /// Taken in kernel mode (the record's cpumode).
    pub kernel: bool,
    /// The recorded callchain (`PERF_SAMPLE_CALLCHAIN`); `None` without one.
    pub stack: Option<CallStack>,
    /// The user registers `--call-graph dwarf` recorded (`PERF_SAMPLE_REGS_USER`), when
    /// they hold ip, sp and bp of a 64-bit task; `None` without (a kernel thread's
    /// sample has none).
    pub user_regs: Option<UserRegs>,
    /// The user stack bytes copied from sp up for `--call-graph dwarf`
    /// (`PERF_SAMPLE_STACK_USER`, its `dyn_size` bytes); empty without.
    pub user_stack: Vec<u8>,
    /// The copy is as long as the event asked (`dyn_size` = size): a stack that goes on
    /// past it is deeper than the copy, not cut by an unreadable page.
    pub user_stack_full: bool,
}

/// Everything but the samples.
#[derive(Clone, Debug, Default)]
pub struct Header {
    /// The recorded events, in attrs-section order.
    pub events: Vec<EventAttr>,
    /// Path → build-id (lowercase hex), from `HEADER_BUILD_ID`.
    pub build_ids: BTreeMap<String, String>,
    /// The recording CPU's `HEADER_CPUID` (`GenuineIntel,6,85,4` on x86).
    pub cpuid: Option<String>,
    /// The recording machine's architecture, `HEADER_ARCH` (`x86_64`, `aarch64`).
    pub arch: Option<String>,
    /// Event type → PMU name (`cpu`, `cpu_core`, `cpu_atom`, ...), `HEADER_PMU_MAPPINGS`.
    pub pmus: BTreeMap<u32, String>,
}

impl Header {
    /// The recording's architecture when it is known and not x86-64, the only one whose
    /// code this build reads.
    pub(crate) fn foreign_arch(&self) -> Option<&str> {
        self.arch.as_deref().filter(|a| *a != "x86_64")
    }

    /// Whether the recording's kernel addresses belong to another kernel than the one
    /// running here: another architecture's, or one whose build-id (`HEADER_BUILD_ID`'s
    /// `[kernel.kallsyms]`) is not this kernel's. This machine's `/proc/kallsyms` would
    /// name them wrongly (whatever symbol, module or BPF program sits at that address
    /// here). A recording without the kernel's build-id is taken as this kernel's, as
    /// `perf report` takes it.
    pub(crate) fn other_kernel(&self) -> bool {
        self.foreign_arch().is_some()
            || self
                .build_ids
                .get("[kernel.kallsyms]")
                .is_some_and(|recorded| {
                    crate::binary::kallsyms::running_build_id().as_ref() != Some(recorded)
                })
    }

    /// Whether `e` is a raw event of a core PMU (`-e r20c4`, `-e cpu_atom/rc0c4/`):
    /// `PERF_TYPE_RAW`, or a type the header maps to a core PMU.
    pub(crate) fn is_core_raw(&self, e: &EventAttr) -> bool {
        e.kind == PERF_TYPE_RAW
            || self
                .pmus
                .get(&e.kind)
                .is_some_and(|p| matches!(p.as_str(), "cpu" | "cpu_core" | "cpu_atom"))
    }
}

/// What the records besides samples said.
#[derive(Clone, Debug)]
pub struct Records {
    /// What the mappings, names and forks said of each process.
    pub(crate) processes: RecordedProcesses,
    /// Build-ids carried by MMAP2 records (`perf record --buildid-mmap`).
    pub build_ids: BTreeMap<String, String>,
    /// Sample records read.
    pub samples: u64,
    /// Records of types this reader does not use (LOST, THROTTLE, ...).
    pub other_records: u64,
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
pub(super) fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
pub(super) fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A NUL-terminated string at the start of `b`.
pub(super) fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Reads exactly `len` bytes at `offset`, with a truncation error naming `what`.
fn read_at<R: Read + Seek>(
    r: &mut R,
    offset: u64,
    len: u64,
    file_len: u64,
    what: &str,
) -> Result<Vec<u8>, PerfDataError> {
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(PerfDataError::Truncated(format!(
            "the {what} ({len} bytes at {offset}) lies beyond the end of the file ({file_len} bytes)"
        )));
    }
    r.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// The sections the records live in.
#[derive(Clone, Copy, Debug)]
struct Layout {
    data_offset: u64,
    data_size: u64,
    file_len: u64,
}

/// The feature sections `header` uses (build ids, architecture, CPU, event names, PMU
/// types), of those `features` flags, whose table starts at `table_off`.
fn read_features<R: Read + Seek>(
    r: &mut R,
    features: [u64; 4],
    table_off: u64,
    file_len: u64,
    header: &mut Header,
) -> Result<(), PerfDataError> {
    // Feature sections: one (offset, size) per set bit, in bit order, after the data.
    let set: Vec<usize> = (0..256)
        .filter(|&b| features[b / 64] >> (b % 64) & 1 == 1)
        .collect();
    let table = match read_at(
        r,
        table_off,
        16 * set.len() as u64,
        file_len,
        "feature table",
    ) {
        Ok(t) => t,
        // A file cut inside its feature table still has its samples: read them.
        Err(PerfDataError::Truncated(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    for (i, &bit) in set.iter().enumerate() {
        let (Some(off), Some(size)) = (u64_at(&table, 16 * i), u64_at(&table, 16 * i + 8)) else {
            break;
        };
        if ![
            FEAT_BUILD_ID,
            FEAT_ARCH,
            FEAT_CPUID,
            FEAT_EVENT_DESC,
            FEAT_PMU_MAPPINGS,
        ]
        .contains(&bit)
        {
            continue;
        }
        let Ok(sec) = read_at(r, off, size, file_len, "feature section") else {
            continue;
        };
        match bit {
            FEAT_BUILD_ID => parse_build_ids(&sec, &mut header.build_ids),
            // Named in messages: escaped, as another machine wrote it.
            FEAT_ARCH => {
                header.arch =
                    perf_string(&sec, 0).map(|(s, _)| crate::fsafe::escape(&s).into_owned())
            }
            FEAT_CPUID => header.cpuid = perf_string(&sec, 0).map(|(s, _)| s),
            FEAT_EVENT_DESC => parse_event_desc(&sec, &mut header.events),
            _ => parse_pmu_mappings(&sec, &mut header.pmus),
        }
    }
    Ok(())
}

/// Reads the header, the event attributes and the feature sections.
fn read_header<R: Read + Seek>(r: &mut R) -> Result<(Header, Layout), PerfDataError> {
    let file_len = r.seek(SeekFrom::End(0))?;
    r.seek(SeekFrom::Start(0))?;
    let mut head = vec![0u8; 16];
    let got = read_up_to(r, &mut head)?;
    if got < 8 || &head[..8] != MAGIC {
        return Err(PerfDataError::NotPerfData);
    }
    if got == 16 && u64_at(&head, 8) == Some(PIPE_HEADER_SIZE) {
        return Err(PerfDataError::PipeMode);
    }
    let h = read_at(r, 0, HEADER_SIZE, file_len, "file header")?;
    let g = |o| u64_at(&h, o).unwrap_or(0);
    // `attr_size` is that of `struct perf_file_attr`: the attr and its ids section.
    let entry = g(16);
    let attr_size = entry.saturating_sub(16);
    let (attrs_off, attrs_size) = (g(24), g(32));
    let (data_offset, data_size) = (g(40), g(48));
    let features: [u64; 4] = [g(72), g(80), g(88), g(96)];
    if !(64..=4096).contains(&attr_size) || attrs_size % entry != 0 || attrs_size == 0 {
        return Err(PerfDataError::Malformed(format!(
            "attribute size {attr_size}, attrs section {attrs_size} bytes"
        )));
    }
    let attrs = read_at(r, attrs_off, attrs_size, file_len, "attrs section")?;
    let mut events = Vec::new();
    for chunk in attrs.chunks(entry as usize) {
        let a = &chunk[..attr_size as usize];
        let (ids_off, ids_size) = (
            u64_at(chunk, attr_size as usize).unwrap_or(0),
            u64_at(chunk, attr_size as usize + 8).unwrap_or(0),
        );
        let ids = read_at(r, ids_off, ids_size, file_len, "event id list")?;
        let at = |o| u64_at(a, o).unwrap_or(0);
        events.push(EventAttr {
            kind: u32_at(a, 0).unwrap_or(0),
            config: at(8),
            period_or_freq: at(16),
            freq: at(40) & ATTR_FLAG_FREQ != 0,
            sample_type: at(24),
            read_format: at(32),
            branch_sample_type: if attr_size >= 80 { at(72) } else { 0 },
            sample_regs_user: if attr_size >= 88 { at(80) } else { 0 },
            sample_max_stack: if attr_size >= 112 {
                u16_at(a, 108).unwrap_or(0)
            } else {
                0
            },
            name: None,
            ids: ids.chunks_exact(8).filter_map(|c| u64_at(c, 0)).collect(),
        });
    }
    if data_offset
        .checked_add(data_size)
        .is_none_or(|e| e > file_len)
    {
        return Err(PerfDataError::Truncated(format!(
            "the data section ends at byte {}, the file has {file_len}",
            data_offset.saturating_add(data_size)
        )));
    }
    let mut header = Header {
        events,
        ..Header::default()
    };
    read_features(r, features, data_offset + data_size, file_len, &mut header)?;
    Ok((
        header,
        Layout {
            data_offset,
            data_size,
            file_len,
        },
    ))
}

fn read_up_to<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// `HEADER_BUILD_ID`: `{ perf_event_header; pid; build_id[24]; filename[] }` records.
fn parse_build_ids(sec: &[u8], out: &mut BTreeMap<String, String>) {
    let mut o = 0usize;
    while let (Some(misc), Some(size)) = (u16_at(sec, o + 4), u16_at(sec, o + 6)) {
        let size = size as usize;
        let Some(rec) = sec.get(o..o + size).filter(|_| size >= 8 + 4 + 24) else {
            break;
        };
        let id = &rec[12..36];
        let len = if misc & MISC_BUILD_ID_SIZE != 0 {
            (id[20] as usize).min(20)
        } else {
            20
        };
        let name = c_str(&rec[36..]);
        if !name.is_empty() {
            out.insert(name, hex(&id[..len]));
        }
        o += size;
    }
}

/// A header string at `o` (perf's `do_write_string`: u32 length, then the bytes,
/// NUL-padded); the string and the offset after it.
fn perf_string(sec: &[u8], o: usize) -> Option<(String, usize)> {
    let len = u32_at(sec, o)? as usize;
    let end = (o + 4).checked_add(len)?;
    Some((c_str(sec.get(o + 4..end)?), end))
}

/// `HEADER_PMU_MAPPINGS`: nr, then per PMU its type (u32) and name (string).
fn parse_pmu_mappings(sec: &[u8], out: &mut BTreeMap<u32, String>) {
    let Some(nr) = u32_at(sec, 0) else { return };
    let mut o = 4usize;
    for _ in 0..nr.min(4096) {
        let Some(kind) = u32_at(sec, o) else { return };
        let Some((name, next)) = perf_string(sec, o + 4) else {
            return;
        };
        out.insert(kind, name);
        o = next;
    }
}

/// `HEADER_EVENT_DESC`: nr, attr_size, then per event: attr, nr_ids, name, ids.
fn parse_event_desc(sec: &[u8], events: &mut [EventAttr]) {
    let (Some(nr), Some(attr_size)) = (u32_at(sec, 0), u32_at(sec, 4)) else {
        return;
    };
    let mut o = 8usize;
    for _ in 0..nr {
        let Some(nr_ids) = u32_at(sec, o + attr_size as usize) else {
            return;
        };
        o += attr_size as usize + 4;
        let Some(len) = u32_at(sec, o) else { return };
        let Some(name) = sec.get(o + 4..o + 4 + len as usize) else {
            return;
        };
        let name = c_str(name);
        o += 4 + len as usize;
        let first_id = u64_at(sec, o);
        o += 8 * nr_ids as usize;
        // Match by id (the order matches the attrs section in files perf writes).
        if let Some(e) = events
            .iter_mut()
            .find(|e| first_id.is_some_and(|id| e.ids.contains(&id)) && e.name.is_none())
        {
            e.name = Some(name);
        } else if let Some(e) = events.iter_mut().find(|e| e.name.is_none()) {
            e.name = Some(name);
        }
    }
}

/// Reads a perf.data file: its header, then every record; each sample goes to `sink`.
/// Returns the header and what the other records said.
pub fn read<R: Read + Seek>(
    r: &mut R,
    mut sink: impl FnMut(&Header, Sample),
) -> Result<(Header, Records), PerfDataError> {
    let (header, layout) = read_header(r)?;
    let mut recs = Records {
        processes: RecordedProcesses::new(Origin::Recording),
        build_ids: BTreeMap::new(),
        samples: 0,
        other_records: 0,
    };
    r.seek(SeekFrom::Start(layout.data_offset))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, r.by_ref());
    let mut pos = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    let by_id: BTreeMap<u64, usize> = header
        .events
        .iter()
        .enumerate()
        .flat_map(|(i, e)| e.ids.iter().map(move |&id| (id, i)))
        .collect();
    while pos < layout.data_size {
        let remaining = layout.data_size - pos;
        let mut h = [0u8; 8];
        if remaining < 8 {
            return Err(PerfDataError::Truncated(format!(
                "{remaining} stray bytes at the end of the data section"
            )));
        }
        reader.read_exact(&mut h)?;
        let kind = u32_at(&h, 0).unwrap_or(0);
        let misc = u16_at(&h, 4).unwrap_or(0);
        let size = u16_at(&h, 6).unwrap_or(0) as u64;
        if size < 8 || size > remaining {
            return Err(PerfDataError::Truncated(format!(
                "record at byte {} claims {size} bytes, {remaining} remain in the data \
                 section (file of {} bytes)",
                layout.data_offset + pos,
                layout.file_len
            )));
        }
        let body = &mut buf[..size as usize - 8];
        reader.read_exact(body)?;
        pos += size;
        match kind {
            PERF_RECORD_SAMPLE => {
                let mut s = parse_sample(&header, &by_id, body, recs.samples)?;
                s.kernel = kernel_mode(misc);
                recs.samples += 1;
                sink(&header, s);
            }
            PERF_RECORD_COMPRESSED => return Err(PerfDataError::Compressed),
            _ => match side_record(kind, misc, body) {
                // Which threads exited matters only to a live collector's `/proc` reads.
                Some(SideRecord::Throttle | SideRecord::Lost(_) | SideRecord::Exit { .. })
                | None => {
                    recs.other_records += 1;
                }
                Some(r) => {
                    if let SideRecord::Mmap {
                        mapping,
                        build_id: Some(id),
                        ..
                    } = &r
                    {
                        if let MappedObject::File { path, .. } = &mapping.object {
                            recs.build_ids
                                .insert(path.display().to_string(), id.clone());
                        }
                    }
                    recs.processes.observe(r);
                }
            },
        }
    }
    recs.processes.finish();
    Ok((header, recs))
}

/// A `PERF_RECORD_SAMPLE` body of a file, its event told by its id.
fn parse_sample(
    header: &Header,
    by_id: &BTreeMap<u64, usize>,
    b: &[u8],
    index: u64,
) -> Result<Sample, PerfDataError> {
    let event = event_of(header, by_id, &Fields { b, o: 0, index })?;
    sample_of(&header.events[event], event, b, index)
}

/// A `PERF_RECORD_SAMPLE` body of `attr`'s event (number `event`): what a perf.data file
/// holds and what the collector's own perf ring buffers hold without root
/// (cpi-user/src/collect/perf_ring.rs) are decoded here alike. `index` names the sample
/// in errors. Its `kernel` is left for the caller, which has the record's `misc`.
pub(crate) fn sample_of(
    attr: &EventAttr,
    event: usize,
    b: &[u8],
    index: u64,
) -> Result<Sample, PerfDataError> {
    let mut f = Fields { b, o: 0, index };
    let st = attr.sample_type;
    if st & SAMPLE_IDENTIFIER != 0 {
        f.take(8)?;
    }
    let mut s = Sample {
        event,
        pid: 0,
        tid: 0,
        ip: 0,
        time: 0,
        // Fixed-period recordings without PERF_SAMPLE_PERIOD stand for their period.
        period: if attr.freq {
            1
        } else {
            attr.period_or_freq.max(1)
        },
        branches: Vec::new(),
        kernel: false,
        stack: None,
        user_regs: None,
        user_stack: Vec::new(),
        user_stack_full: false,
    };
    if st & SAMPLE_IP != 0 {
        s.ip = f.u64()?;
    }
    if st & SAMPLE_TID != 0 {
        let at = f.take(8)?;
        s.pid = u32_at(b, at).ok_or_else(|| f.short())?;
        s.tid = u32_at(b, at + 4).ok_or_else(|| f.short())?;
    }
    if st & SAMPLE_TIME != 0 {
        s.time = f.u64()?;
    }
    for flag in [SAMPLE_ADDR, SAMPLE_ID, SAMPLE_STREAM_ID, SAMPLE_CPU] {
        if st & flag != 0 {
            f.take(8)?;
        }
    }
    if st & SAMPLE_PERIOD != 0 {
        s.period = f.u64()?;
    }
    if st & SAMPLE_READ != 0 {
        skip_read(&mut f, attr.read_format)?;
    }
    if st & SAMPLE_CALLCHAIN != 0 {
        let n = f.count(1 << 16)?;
        let at = f.take(8 * n)?;
        let ips = b[at..at + 8 * n]
            .chunks_exact(8)
            .filter_map(|c| u64_at(c, 0));
        s.stack = Some(callchain(ips, attr.max_stack()));
    }
    if st & SAMPLE_RAW != 0 {
        let at = f.take(4)?;
        let size = u32_at(b, at).ok_or_else(|| f.short())? as usize;
        f.take(size)?;
    }
    if st & SAMPLE_BRANCH_STACK != 0 {
        s.branches = branch_stack(&mut f, attr)?;
    }
    if st & SAMPLE_REGS_USER != 0 {
        s.user_regs = user_regs(&mut f, attr.sample_regs_user)?;
    }
    if st & SAMPLE_STACK_USER != 0 {
        // size, then (when size > 0) size bytes and dyn_size, the bytes actually copied.
        let size = f.u64()?;
        if size > 0 {
            let size = usize::try_from(size).map_err(|_| f.short())?;
            let at = f.take(size)?;
            let copied = f.u64()?.min(size as u64) as usize;
            s.user_stack = b[at..at + copied].to_vec();
            s.user_stack_full = copied == size;
        }
    }
    Ok(s)
}

/// A sample's bytes, read field by field in the order its `sample_type` gives.
struct Fields<'a> {
    b: &'a [u8],
    /// Where the next field starts.
    o: usize,
    /// The sample's number in the file, for errors.
    index: u64,
}

impl Fields<'_> {
    fn short(&self) -> PerfDataError {
        PerfDataError::Malformed(format!("sample {} is shorter than its format", self.index))
    }

    /// Claims the next `n` bytes: where they start.
    fn take(&mut self, n: usize) -> Result<usize, PerfDataError> {
        let at = self.o;
        self.o += n;
        if self.o > self.b.len() {
            return Err(self.short());
        }
        Ok(at)
    }

    /// The next u64.
    fn u64(&mut self) -> Result<u64, PerfDataError> {
        let at = self.take(8)?;
        u64_at(self.b, at).ok_or_else(|| self.short())
    }

    /// The next u64 as a number of entries, at most `max` (more: a corrupt sample).
    fn count(&mut self, max: usize) -> Result<usize, PerfDataError> {
        let nr = self.u64()?;
        usize::try_from(nr)
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| self.short())
    }
}

/// Which event a sample is of: PERF_SAMPLE_IDENTIFIER leads every sample when set; else
/// the only event, or PERF_SAMPLE_ID at its place.
fn event_of(
    header: &Header,
    by_id: &BTreeMap<u64, usize>,
    f: &Fields<'_>,
) -> Result<usize, PerfDataError> {
    let first = &header.events[0];
    let at = if header.events.len() == 1 {
        return Ok(0);
    } else if first.sample_type & SAMPLE_IDENTIFIER != 0 {
        0
    } else if first.sample_type & SAMPLE_ID != 0 {
        let st = first.sample_type;
        8 * [SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME, SAMPLE_ADDR]
            .iter()
            .filter(|&&flag| st & flag != 0)
            .count()
    } else {
        return Ok(0);
    };
    let id = u64_at(f.b, at).ok_or_else(|| f.short())?;
    by_id
        .get(&id)
        .copied()
        .ok_or(PerfDataError::UnknownEvent { index: f.index, id })
}

/// Skips PERF_SAMPLE_READ's values, laid out by the event's `read_format` `rf`.
fn skip_read(f: &mut Fields<'_>, rf: u64) -> Result<(), PerfDataError> {
    let per_value = 8 * (1 + usize::from(rf & FORMAT_ID != 0) + usize::from(rf & FORMAT_LOST != 0));
    let times = 8
        * (usize::from(rf & FORMAT_TOTAL_TIME_ENABLED != 0)
            + usize::from(rf & FORMAT_TOTAL_TIME_RUNNING != 0));
    if rf & FORMAT_GROUP != 0 {
        let n = f.count(4096)?;
        f.take(times + n * per_value)?;
    } else {
        f.take(times + per_value)?;
    }
    Ok(())
}

/// PERF_SAMPLE_BRANCH_STACK: the entries, newest first.
fn branch_stack(f: &mut Fields<'_>, attr: &EventAttr) -> Result<Vec<BranchEntry>, PerfDataError> {
    let nr = f.u64()?;
    if attr.branch_sample_type & BRANCH_HW_INDEX != 0 {
        f.take(8)?;
    }
    let n = usize::try_from(nr)
        .ok()
        .filter(|&n| n <= 1024)
        .ok_or_else(|| f.short())?;
    let at = f.take(24 * n)?;
    let entries = f.b[at..at + 24 * n]
        .chunks_exact(24)
        .map(|e| BranchEntry {
            from: u64_at(e, 0).unwrap_or(0),
            to: u64_at(e, 8).unwrap_or(0),
            flags: u64_at(e, 16).unwrap_or(0),
        })
        .collect();
    if attr.branch_sample_type & BRANCH_COUNTERS != 0 {
        f.take(8 * n)?;
    }
    Ok(entries)
}

/// PERF_SAMPLE_REGS_USER: abi, then one u64 per register of `mask` unless abi is NONE
/// (no regs: a kernel thread). The registers unwinding needs, where all were recorded.
fn user_regs(f: &mut Fields<'_>, mask: u64) -> Result<Option<UserRegs>, PerfDataError> {
    let abi = f.u64()?;
    if abi == 0 {
        return Ok(None);
    }
    let at = f.take(8 * mask.count_ones() as usize)?;
    // One u64 per bit of the mask, lowest bit first (x86's `perf_regs.h`).
    let reg = |bit: u32| {
        (mask >> bit & 1 == 1)
            .then(|| {
                u64_at(
                    f.b,
                    at + 8 * (mask & ((1 << bit) - 1)).count_ones() as usize,
                )
            })
            .flatten()
    };
    if abi != REGS_ABI_64 {
        return Ok(None);
    }
    Ok(match (reg(REG_IP), reg(REG_SP), reg(REG_BP)) {
        (Some(ip), Some(sp), Some(bp)) => Some(UserRegs { ip, sp, bp }),
        _ => None,
    })
}

/// A recorded callchain (`ips`, markers included) as a [`CallStack`]: frames after
/// `PERF_CONTEXT_KERNEL` are kernel frames, after `PERF_CONTEXT_USER` user frames (the
/// first of each is the interrupted IP); hypervisor and guest frames are another
/// machine's addresses and are left out. A chain holding `max_stack` frames was cut
/// there by the kernel: [`StackEnd::Truncated`].
pub fn callchain(ips: impl IntoIterator<Item = u64>, max_stack: u64) -> CallStack {
    let (mut kernel, mut user) = (Vec::new(), Vec::new());
    let mut frames = 0u64;
    // The kernel starts every chain with a marker; frames before one are taken as user.
    let mut context = CONTEXT_USER;
    for ip in ips {
        if ip >= CONTEXT_MAX {
            context = ip;
            continue;
        }
        frames += 1;
        match context {
            CONTEXT_KERNEL => kernel.push(ip),
            CONTEXT_USER => user.push(ip),
            // PERF_CONTEXT_HV and the guest contexts: another machine's addresses.
            _ => {}
        }
    }
    CallStack {
        kernel: kernel.into(),
        user: user.into(),
        end: if frames >= max_stack {
            StackEnd::Truncated
        } else {
            StackEnd::Complete
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST_KERNEL: u64 = -2176i64 as u64;
    const HV: u64 = -32i64 as u64;

    #[test]
    fn markers_split_kernel_and_user_frames() {
        let chain = [
            CONTEXT_KERNEL,
            0xffff_ffff_8100_0010,
            0xffff_ffff_8100_0020,
            CONTEXT_USER,
            0x40_1000,
            0x40_2000,
            0x40_3000,
        ];
        let s = callchain(chain, DEFAULT_MAX_STACK);
        assert_eq!(*s.kernel, [0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020]);
        assert_eq!(*s.user, [0x40_1000, 0x40_2000, 0x40_3000]);
        assert_eq!(s.end, StackEnd::Complete);
        // A user-mode sample: only the user context.
        let s = callchain([CONTEXT_USER, 0x40_1000], DEFAULT_MAX_STACK);
        assert!(s.kernel.is_empty());
        assert_eq!(*s.user, [0x40_1000]);
    }

    #[test]
    fn guest_and_hypervisor_frames_are_left_out() {
        let chain = [HV, 0x1, GUEST_KERNEL, 0x2, CONTEXT_USER, 0x40_1000];
        let s = callchain(chain, DEFAULT_MAX_STACK);
        assert!(s.kernel.is_empty());
        assert_eq!(*s.user, [0x40_1000]);
    }

    #[test]
    fn a_chain_at_the_frame_limit_is_truncated() {
        let frames = |n: u64| std::iter::once(CONTEXT_USER).chain(0x1000..0x1000 + n);
        assert_eq!(callchain(frames(126), 127).end, StackEnd::Complete);
        assert_eq!(callchain(frames(127), 127).end, StackEnd::Truncated);
        assert_eq!(callchain(frames(127), 127).user.len(), 127);
        // Markers do not count as frames.
        let split = [CONTEXT_KERNEL, 0xffff_ffff_8100_0000, CONTEXT_USER, 0x1000];
        assert_eq!(callchain(split, 2).end, StackEnd::Truncated);
        assert_eq!(callchain(split, 3).end, StackEnd::Complete);
        // The attr's own limit, else the kernel's default.
        let mut e = attr(SAMPLE_CALLCHAIN);
        assert_eq!(e.max_stack(), DEFAULT_MAX_STACK);
        e.sample_max_stack = 16;
        assert_eq!(e.max_stack(), 16);
    }

    fn attr(sample_type: u64) -> EventAttr {
        EventAttr {
            kind: PERF_TYPE_SOFTWARE,
            config: 0,
            period_or_freq: 4000,
            freq: true,
            sample_type,
            read_format: 0,
            branch_sample_type: 0,
            sample_regs_user: 1 | 1 << REG_BP | 1 << REG_SP | 1 << REG_IP,
            sample_max_stack: 0,
            name: None,
            ids: vec![],
        }
    }

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Every section between the callchain and `PERF_SAMPLE_DATA_SRC`, in the kernel's
    /// order: the fields read come from where perf_output_sample puts them.
    #[test]
    fn sample_layout_through_branch_counters_regs_and_user_stack() {
        const DATA_SRC: u64 = 1 << 15;
        let st = SAMPLE_IP
            | SAMPLE_TID
            | SAMPLE_PERIOD
            | SAMPLE_CALLCHAIN
            | SAMPLE_BRANCH_STACK
            | SAMPLE_REGS_USER
            | SAMPLE_STACK_USER
            | DATA_SRC;
        let mut e = attr(st);
        e.branch_sample_type = BRANCH_HW_INDEX | BRANCH_COUNTERS;
        let header = Header {
            events: vec![e],
            ..Header::default()
        };
        let mut b = words(&[0x40_1234, 7 | (8 << 32), 250_000]);
        b.extend(words(&[3, CONTEXT_USER, 0x40_1234, 0x40_2000]));
        // One branch entry, hw_idx before it, its counter after it.
        b.extend(words(&[1, 99, 0x40_1000, 0x40_1200, 0, 0xc0]));
        // regs: abi 64-bit, four registers: ax, bp, sp, ip.
        b.extend(words(&[2, 1, 0x7ffd_0100, 0x7ffd_0000, 0x40_1234]));
        // 16 bytes of stack reserved, 8 copied.
        b.extend(words(&[16, 0xaa, 0xbb, 8]));
        b.extend(words(&[0x1e05]));
        let s = parse_sample(&header, &BTreeMap::new(), &b, 0).unwrap();
        assert_eq!((s.ip, s.pid, s.tid, s.period), (0x40_1234, 7, 8, 250_000));
        assert_eq!(*s.stack.unwrap().user, [0x40_1234, 0x40_2000]);
        assert_eq!(s.branches.len(), 1);
        assert_eq!(
            (s.branches[0].from, s.branches[0].to),
            (0x40_1000, 0x40_1200)
        );
        assert_eq!(
            (s.user_regs.map(|r| (r.ip, r.sp, r.bp))),
            Some((0x40_1234, 0x7ffd_0000, 0x7ffd_0100))
        );
        assert_eq!(s.user_stack, 0xaau64.to_le_bytes());
        assert!(!s.user_stack_full, "8 of 16 bytes copied");
        // One word short of the user stack's dyn_size: refused, not misread.
        let cut = &b[..b.len() - 16];
        assert!(matches!(
            parse_sample(&header, &BTreeMap::new(), cut, 0),
            Err(PerfDataError::Malformed(_))
        ));
        // An empty branch stack (nr, hw_idx), no regs (abi NONE, a kernel thread) and no
        // stack (size 0): no dyn_size word.
        let mut k = words(&[0xffff_ffff_8100_0000, 1 | (1 << 32), 1000]);
        k.extend(words(&[2, CONTEXT_KERNEL, 0xffff_ffff_8100_0000]));
        k.extend(words(&[0, 0, 0, 0, 0x1e05]));
        let s = parse_sample(&header, &BTreeMap::new(), &k, 1).unwrap();
        assert_eq!(*s.stack.unwrap().kernel, [0xffff_ffff_8100_0000]);
        assert!(s.user_regs.is_none() && s.user_stack.is_empty());
    }
}
