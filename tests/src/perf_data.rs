//! A small perf.data writer in the kernel's and perf's file layout
//! (tools/perf/util/header.h: a 104-byte header, attrs + id lists, the data section of
//! records, the feature table with `HEADER_BUILD_ID`, `HEADER_EVENT_DESC` and optionally
//! `HEADER_CPUID`), so the
//! import tests exercise every case without a PMU. `perf script`/`perf report` read
//! what it writes.

use std::path::Path;

use cpi_user::binary::{Binary, FlowKind};

/// `perf_event_attr` size written (PERF_ATTR_SIZE_VER7).
const ATTR_SIZE: usize = 128;
pub const SAMPLE_IP: u64 = 1 << 0;
pub const SAMPLE_TID: u64 = 1 << 1;
pub const SAMPLE_PERIOD: u64 = 1 << 8;
pub const SAMPLE_CALLCHAIN: u64 = 1 << 5;
/// `PERF_CONTEXT_USER`: the callchain frames after it are user frames.
pub const CONTEXT_USER: u64 = -512i64 as u64;
/// `PERF_CONTEXT_KERNEL`: the callchain frames after it are kernel frames.
pub const CONTEXT_KERNEL: u64 = -128i64 as u64;
pub const SAMPLE_BRANCH_STACK: u64 = 1 << 11;
pub const SAMPLE_IDENTIFIER: u64 = 1 << 16;
/// `PERF_SAMPLE_BRANCH_USER | PERF_SAMPLE_BRANCH_ANY`.
pub const BRANCH_USER_ANY: u64 = 1 | 8;

/// One event.
#[derive(Clone, Debug)]
pub struct Attr {
    /// 0 hardware, 4 raw.
    pub kind: u32,
    pub config: u64,
    pub period_or_freq: u64,
    pub freq: bool,
    pub branch_stack: bool,
    /// Samples carry a callchain (`perf record -g`).
    pub callchain: bool,
    pub name: String,
    pub id: u64,
}

impl Attr {
    fn sample_type(&self) -> u64 {
        let b = if self.branch_stack {
            SAMPLE_BRANCH_STACK
        } else {
            0
        };
        let c = if self.callchain { SAMPLE_CALLCHAIN } else { 0 };
        SAMPLE_IDENTIFIER | SAMPLE_IP | SAMPLE_TID | SAMPLE_PERIOD | b | c
    }
}

/// A branch entry: from, to, cycles (0 = untimed); mispredicted when `mispred`.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub from: u64,
    pub to: u64,
    pub cycles: u16,
    pub mispred: bool,
}

#[derive(Clone, Debug)]
pub enum Record {
    Comm {
        pid: u32,
        name: String,
        exec: bool,
    },
    Mmap2 {
        pid: u32,
        start: u64,
        len: u64,
        pgoff: u64,
        path: String,
    },
    /// `PERF_RECORD_FORK`: process `pid` forked by `ppid` (its main thread by theirs).
    Fork {
        pid: u32,
        ppid: u32,
    },
    Sample {
        /// Index into the attrs.
        attr: usize,
        pid: u32,
        tid: u32,
        ip: u64,
        period: u64,
        /// Newest first.
        branches: Vec<Entry>,
        /// The callchain as the kernel writes it (context markers included); written
        /// when the attr has callchains.
        callchain: Vec<u64>,
    },
}

fn pad8(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(8) {
        v.push(0);
    }
}

fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(8 + body.len());
    r.extend_from_slice(&kind.to_le_bytes());
    r.extend_from_slice(&misc.to_le_bytes());
    r.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
    r.extend_from_slice(body);
    r
}

fn cstr_padded(s: &str, align: usize) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    while !v.len().is_multiple_of(align) {
        v.push(0);
    }
    v
}

fn attr_bytes(a: &Attr) -> Vec<u8> {
    let mut v = vec![0u8; ATTR_SIZE];
    v[0..4].copy_from_slice(&a.kind.to_le_bytes());
    v[4..8].copy_from_slice(&(ATTR_SIZE as u32).to_le_bytes());
    v[8..16].copy_from_slice(&a.config.to_le_bytes());
    v[16..24].copy_from_slice(&a.period_or_freq.to_le_bytes());
    v[24..32].copy_from_slice(&a.sample_type().to_le_bytes());
    // flags: disabled, mmap (8), comm (9), freq (10), exclude_kernel (5), mmap2 (23).
    let flags = 1u64 | 1 << 5 | 1 << 8 | 1 << 9 | u64::from(a.freq) << 10 | 1 << 23;
    v[40..48].copy_from_slice(&flags.to_le_bytes());
    if a.branch_stack {
        v[72..80].copy_from_slice(&BRANCH_USER_ANY.to_le_bytes());
    }
    v
}

/// The data section's bytes.
fn data(attrs: &[Attr], records: &[Record]) -> Vec<u8> {
    let mut d = Vec::new();
    for r in records {
        match r {
            Record::Comm { pid, name, exec } => {
                let mut b = Vec::new();
                b.extend_from_slice(&pid.to_le_bytes());
                b.extend_from_slice(&pid.to_le_bytes());
                b.extend_from_slice(&cstr_padded(name, 8));
                d.extend(record(3, 2 | if *exec { 1 << 13 } else { 0 }, &b));
            }
            Record::Mmap2 {
                pid,
                start,
                len,
                pgoff,
                path,
            } => {
                let mut b = Vec::new();
                b.extend_from_slice(&pid.to_le_bytes());
                b.extend_from_slice(&pid.to_le_bytes());
                for x in [*start, *len, *pgoff] {
                    b.extend_from_slice(&x.to_le_bytes());
                }
                // maj, min, ino, ino_generation
                b.extend_from_slice(&8u32.to_le_bytes());
                b.extend_from_slice(&1u32.to_le_bytes());
                b.extend_from_slice(&12345u64.to_le_bytes());
                b.extend_from_slice(&0u64.to_le_bytes());
                // prot: r-x; flags: MAP_PRIVATE
                b.extend_from_slice(&5u32.to_le_bytes());
                b.extend_from_slice(&2u32.to_le_bytes());
                b.extend_from_slice(&cstr_padded(path, 8));
                d.extend(record(10, 2, &b));
            }
            Record::Fork { pid, ppid } => {
                let mut b = Vec::new();
                // pid, ppid, tid, ptid, time
                for x in [pid, ppid, pid, ppid] {
                    b.extend_from_slice(&x.to_le_bytes());
                }
                b.extend_from_slice(&0u64.to_le_bytes());
                d.extend(record(7, 0, &b));
            }
            Record::Sample {
                attr,
                pid,
                tid,
                ip,
                period,
                branches,
                callchain,
            } => {
                let a = &attrs[*attr];
                let mut b = Vec::new();
                b.extend_from_slice(&a.id.to_le_bytes());
                b.extend_from_slice(&ip.to_le_bytes());
                b.extend_from_slice(&pid.to_le_bytes());
                b.extend_from_slice(&tid.to_le_bytes());
                b.extend_from_slice(&period.to_le_bytes());
                if a.callchain {
                    b.extend_from_slice(&(callchain.len() as u64).to_le_bytes());
                    for ip in callchain {
                        b.extend_from_slice(&ip.to_le_bytes());
                    }
                }
                if a.branch_stack {
                    b.extend_from_slice(&(branches.len() as u64).to_le_bytes());
                    for e in branches {
                        b.extend_from_slice(&e.from.to_le_bytes());
                        b.extend_from_slice(&e.to.to_le_bytes());
                        // mispred bit 0, predicted bit 1, cycles bits 4..20.
                        let flags = if e.mispred { 1u64 } else { 2 } | u64::from(e.cycles) << 4;
                        b.extend_from_slice(&flags.to_le_bytes());
                    }
                }
                // PERF_RECORD_MISC_USER
                d.extend(record(9, 2, &b));
            }
        }
    }
    d
}

/// Writes a perf.data file. `build_ids`: (path, build-id bytes) for the header's table.
pub fn write(path: &Path, attrs: &[Attr], records: &[Record], build_ids: &[(String, Vec<u8>)]) {
    write_on(path, None, attrs, records, build_ids);
}

/// [`write()`] with the recording CPU's `HEADER_CPUID` (`GenuineIntel,6,85,4`), which
/// decides what raw event codes mean.
pub fn write_on(
    path: &Path,
    cpuid: Option<&str>,
    attrs: &[Attr],
    records: &[Record],
    build_ids: &[(String, Vec<u8>)],
) {
    let mut out = vec![0u8; 104];
    // attrs section: attr + ids section per event; the id lists follow it.
    let attrs_off = out.len();
    let attrs_size = attrs.len() * (ATTR_SIZE + 16);
    let ids_off = attrs_off + attrs_size;
    for (i, a) in attrs.iter().enumerate() {
        out.extend(attr_bytes(a));
        out.extend_from_slice(&((ids_off + 8 * i) as u64).to_le_bytes());
        out.extend_from_slice(&8u64.to_le_bytes());
    }
    for a in attrs {
        out.extend_from_slice(&a.id.to_le_bytes());
    }
    let data_off = out.len();
    let d = data(attrs, records);
    out.extend(&d);
    let data_size = d.len();
    // Feature table: HEADER_BUILD_ID (2), [HEADER_CPUID (9)], HEADER_EVENT_DESC (12).
    let table_off = out.len();
    out.extend(vec![0u8; 16 * (2 + usize::from(cpuid.is_some()))]);
    let mut bid = Vec::new();
    for (p, id) in build_ids {
        let mut b = Vec::new();
        b.extend_from_slice(&(-1i32).to_le_bytes());
        let mut raw = [0u8; 24];
        raw[..id.len()].copy_from_slice(id);
        raw[20] = id.len() as u8;
        b.extend_from_slice(&raw);
        b.extend_from_slice(&cstr_padded(p, 64));
        // PERF_RECORD_HEADER_BUILD_ID, misc USER | BUILD_ID_SIZE
        bid.extend(record(67, 2 | 1 << 15, &b));
    }
    let mut desc = Vec::new();
    desc.extend_from_slice(&(attrs.len() as u32).to_le_bytes());
    desc.extend_from_slice(&(ATTR_SIZE as u32).to_le_bytes());
    for a in attrs {
        desc.extend(attr_bytes(a));
        desc.extend_from_slice(&1u32.to_le_bytes());
        let name = cstr_padded(&a.name, 64);
        desc.extend_from_slice(&(name.len() as u32).to_le_bytes());
        desc.extend(name);
        desc.extend_from_slice(&a.id.to_le_bytes());
    }
    let mut sections = Vec::new();
    // perf's do_write_string: u32 length, the string NUL-padded to 64.
    let cpuid_body = cpuid.map(|c| {
        let s = cstr_padded(c, 64);
        let mut b = (s.len() as u32).to_le_bytes().to_vec();
        b.extend(s);
        b
    });
    for body in std::iter::once(bid)
        .chain(cpuid_body)
        .chain(std::iter::once(desc))
    {
        sections.push((out.len() as u64, body.len() as u64));
        out.extend(body);
    }
    for (i, (o, s)) in sections.iter().enumerate() {
        out[table_off + 16 * i..table_off + 16 * i + 8].copy_from_slice(&o.to_le_bytes());
        out[table_off + 16 * i + 8..table_off + 16 * i + 16].copy_from_slice(&s.to_le_bytes());
    }
    pad8(&mut out);
    let put = |out: &mut Vec<u8>, at: usize, v: u64| {
        out[at..at + 8].copy_from_slice(&v.to_le_bytes());
    };
    out[0..8].copy_from_slice(b"PERFILE2");
    put(&mut out, 8, 104);
    // sizeof(struct perf_file_attr): the attr and its ids section.
    put(&mut out, 16, ATTR_SIZE as u64 + 16);
    put(&mut out, 24, attrs_off as u64);
    put(&mut out, 32, attrs_size as u64);
    put(&mut out, 40, data_off as u64);
    put(&mut out, 48, data_size as u64);
    // event_types section: empty. Features bitmap: bits 2, (9) and 12.
    put(
        &mut out,
        72,
        1 << 2 | 1 << 12 | u64::from(cpuid.is_some()) << 9,
    );
    std::fs::write(path, out).expect("write perf.data");
}

/// A pipe-mode header (`perf record -o -`): magic and size 16.
pub fn write_pipe_header(path: &Path) {
    let mut out = b"PERFILE2".to_vec();
    out.extend_from_slice(&16u64.to_le_bytes());
    std::fs::write(path, out).expect("write pipe perf.data");
}

/// A function's loop: its head, the backward conditional branch closing it, and the
/// instructions in [head, branch].
#[derive(Clone, Copy, Debug)]
pub struct Loop {
    pub head: u64,
    pub branch: u64,
    pub instructions: usize,
}

/// The loop of function `name` in `bin`: its first backward conditional branch.
pub fn loop_of(bin: &Binary, name: &str) -> Loop {
    let f = bin
        .function_by_name(name)
        .unwrap_or_else(|| panic!("no function {name}"))
        .clone();
    let ins = bin.decode(&f).unwrap();
    let br = ins
        .iter()
        .find(|i| i.kind == FlowKind::CondBranch && i.target.is_some_and(|t| t < i.addr))
        .unwrap_or_else(|| panic!("{name} has no loop"));
    let head = br.target.unwrap();
    Loop {
        head,
        branch: br.addr,
        instructions: ins
            .iter()
            .filter(|i| (head..=br.addr).contains(&i.addr))
            .count(),
    }
}

/// A branch stack of `depth` entries, all `l`'s closing branch (newest first).
pub fn loop_stack(l: Loop, depth: usize, cycles: u16) -> Vec<Entry> {
    vec![
        Entry {
            from: l.branch,
            to: l.head,
            cycles,
            mispred: false,
        };
        depth
    ]
}

/// Intel's retired taken branches with branch stacks, period 500009 (`perf record -b -e
/// br_inst_retired.near_taken:u -c 500009`).
pub fn taken_attr(id: u64) -> Attr {
    Attr {
        kind: 4,
        config: 0x20c4,
        period_or_freq: 500_009,
        freq: false,
        branch_stack: true,
        callchain: false,
        name: "br_inst_retired.near_taken:u".into(),
        id,
    }
}

/// COMM and the executable's MMAP2 for `pid` running `bin`, mapped from `path` and
/// page-aligned as the kernel maps it.
pub fn exec_records(bin: &Binary, pid: u32, comm: &str, path: &str) -> Vec<Record> {
    let seg = bin.segments.iter().find(|s| s.executable).unwrap();
    let start = seg.vaddr & !0xfff;
    vec![
        Record::Comm {
            pid,
            name: comm.into(),
            exec: true,
        },
        Record::Mmap2 {
            pid,
            start,
            len: seg.memsz + (seg.vaddr - start),
            pgoff: seg.offset & !0xfff,
            path: path.into(),
        },
    ]
}

/// The build-id feature entry for `bin` recorded at `path`.
pub fn build_id(bin: &Binary, path: &str) -> (String, Vec<u8>) {
    let hex = bin.build_id.clone().expect("gcc writes a build-id");
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    (path.to_string(), bytes)
}

/// A copy of perf.data `src` at `dst` whose `HEADER_ARCH` feature string (bit 6: `uname
/// -m` of the recording machine) reads `arch`: a recording header synthesised for
/// another architecture from a real x86-64 one, its string rewritten in place (perf pads
/// it to 64 bytes).
pub fn with_arch(src: &Path, dst: &Path, arch: &str) {
    let mut b = std::fs::read(src).expect("read perf.data");
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let features = u64_at(&b, 72);
    assert!(features & 1 << 6 != 0, "{}: no HEADER_ARCH", src.display());
    // The feature table follows the data section, one (offset, size) per set bit.
    let table = (u64_at(&b, 40) + u64_at(&b, 48)) as usize;
    let index = (features & ((1 << 6) - 1)).count_ones() as usize;
    let at = u64_at(&b, table + 16 * index) as usize;
    let len = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    assert!(arch.len() < len, "{arch} does not fit in {len} bytes");
    let field = &mut b[at + 4..at + 4 + len];
    field.fill(0);
    field[..arch.len()].copy_from_slice(arch.as_bytes());
    std::fs::write(dst, b).expect("write perf.data");
}
