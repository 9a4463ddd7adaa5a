//! The shipped eBPF programs run in a user-space interpreter (the `rbpf` crate), with
//! their helpers answering from recorded samples: what the kernel side does with a real
//! branch stack, checked on machines without a PMU (tests/tests/it/bpf_vm.rs).
//!
//! The object is the one cpi-user embeds (`cpi_user::collect::bpf_object`), loaded here as
//! aya would: each program's instructions from its section, each `ld_imm64` relocated to
//! a map (the legacy `maps` section aya-ebpf 0.2 emits) replaced by a handle of a map this
//! harness backs, and the one to `.rodata` (`STACK_MODE`) by the address of a copy that
//! holds the mode asked for, as aya's `override_global` does. The context is the uapi
//! `struct bpf_perf_event_data` (the layout the program reads; the kernel's verifier
//! rewrites those loads for its own struct). One CPU: per-CPU maps hold one value each.
//!
//! Memory: rbpf checks every load and store against the context, its stack and a set of
//! allowed addresses; every byte of every harness region is in that set, and each region
//! is followed by guard bytes checked after every run, so a store that starts inside a
//! region and runs past its end is caught too. Helpers that write check their destination
//! against the regions themselves.

use std::cell::RefCell;
use std::collections::BTreeMap;

use cpi_common::policy::KernelConfig;
use cpi_common::wire::StackMode;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// Helper ids (`include/uapi/linux/bpf.h`, `__BPF_FUNC_MAPPER`).
mod id {
    pub const MAP_LOOKUP_ELEM: u32 = 1;
    pub const KTIME_GET_NS: u32 = 5;
    pub const GET_PRANDOM_U32: u32 = 7;
    pub const GET_SMP_PROCESSOR_ID: u32 = 8;
    pub const GET_CURRENT_PID_TGID: u32 = 14;
    pub const GET_CURRENT_CGROUP_ID: u32 = 80;
    pub const GET_STACK: u32 = 67;
    pub const PROBE_READ_USER: u32 = 112;
    pub const PROBE_READ_KERNEL: u32 = 113;
    pub const READ_BRANCH_RECORDS: u32 = 119;
    pub const RINGBUF_OUTPUT: u32 = 130;
    pub const RINGBUF_RESERVE: u32 = 131;
    pub const RINGBUF_SUBMIT: u32 = 132;
    pub const RINGBUF_DISCARD: u32 = 133;
    pub const RINGBUF_QUERY: u32 = 134;
    pub const GET_CURRENT_TASK_BTF: u32 = 158;
    pub const TASK_PT_REGS: u32 = 175;
}

/// `BPF_MAP_TYPE_*` the object uses.
const MAP_ARRAY: u32 = 2;
const MAP_PERCPU_ARRAY: u32 = 6;
const MAP_RINGBUF: u32 = 27;
/// `BPF_MAP_TYPE_HASH`.
const MAP_HASH: u32 = 1;

const EFAULT: i64 = 14;
const ENOENT: i64 = 2;
const EINVAL: i64 = 22;
const EAGAIN: i64 = 11;
/// `BPF_F_GET_BRANCH_RECORDS_SIZE`.
const GET_BRANCH_RECORDS_SIZE: u64 = 1;
/// `BPF_F_USER_STACK`.
const USER_STACK: u64 = 1 << 8;
/// `struct perf_branch_entry`.
const BRANCH_ENTRY: usize = 24;

/// `struct bpf_perf_event_data`: x86-64 `struct pt_regs` (21 registers,
/// arch/x86/include/uapi/asm/ptrace.h), `sample_period`, `addr`.
const CTX_BYTES: usize = 21 * 8 + 16;
const RBP: usize = 4 * 8;
const RIP: usize = 16 * 8;
const CS: usize = 17 * 8;
const RSP: usize = 19 * 8;
const SAMPLE_PERIOD: usize = 21 * 8;

/// Guard bytes after each region, and the value they hold.
const GUARD: usize = 64;
const CANARY: u8 = 0xa5;

/// Bytes of ring buffer the harness backs: records are taken out after every run (a
/// consumer that keeps up), so one record's worth is enough; `RINGBUF_QUERY` answers
/// with [`RING_SIZE`], the size the collector asks for by default.
const RING_ARENA: usize = 64 << 10;
const RING_SIZE: u64 = 4 << 20;

/// One overflow as the kernel would hand it to the program.
#[derive(Clone, Debug, Default)]
pub struct Overflow {
    pub pid: u32,
    pub tid: u32,
    /// The interrupted IP (`regs.rip`).
    pub ip: u64,
    /// Taken in kernel mode (`regs.cs` privilege level 0, else 3).
    pub kernel: bool,
    /// `ctx->sample_period`.
    pub period: u64,
    /// `bpf_ktime_get_ns()`.
    pub time_ns: u64,
    /// `bpf_get_current_cgroup_id()` (the recordings hold none: any value).
    pub cgroup_id: u64,
    /// User `rsp` in the registers (the recordings hold none: any value).
    pub sp: u64,
    /// User `rbp` in the registers (likewise).
    pub bp: u64,
    /// What `bpf_read_branch_records` copies: `struct perf_branch_entry`s, newest first;
    /// `None`: the sample has no branch stack (-ENOENT).
    pub branches: Option<Vec<u8>>,
    /// Kernel frames `bpf_get_stack` answers with (none: -EFAULT).
    pub kernel_frames: Vec<u64>,
}

/// A map of the object, backed here.
#[derive(Debug)]
struct Map {
    name: String,
    kind: u32,
    value_size: usize,
    max_entries: usize,
    /// Region index of its values (arrays) or of the ring arena.
    region: usize,
}

/// Memory the program may touch besides its context and stack.
struct Regions {
    bufs: Vec<Box<[u8]>>,
}

impl Regions {
    fn add(&mut self, len: usize) -> usize {
        let mut b = vec![0u8; len + GUARD].into_boxed_slice();
        b[len..].fill(CANARY);
        self.bufs.push(b);
        self.bufs.len() - 1
    }

    fn len(&self, r: usize) -> usize {
        self.bufs[r].len() - GUARD
    }

    fn addr(&self, r: usize) -> u64 {
        self.bufs[r].as_ptr() as u64
    }

    /// The region holding `[addr, addr + len)` whole, and the offset in it.
    fn find(&self, addr: u64, len: usize) -> Option<(usize, usize)> {
        (0..self.bufs.len()).find_map(|r| {
            let off = addr.checked_sub(self.addr(r))? as usize;
            (off.checked_add(len)? <= self.len(r)).then_some((r, off))
        })
    }

    fn guards_intact(&self) -> bool {
        (0..self.bufs.len()).all(|r| self.bufs[r][self.len(r)..].iter().all(|&b| b == CANARY))
    }
}

/// What the helpers see: the maps, the overflow being handled, what was emitted.
struct State {
    regions: Regions,
    maps: Vec<Map>,
    ctx: u64,
    overflow: Overflow,
    /// Offset and size of the open ring reservation.
    reserved: Option<usize>,
    records: Vec<Vec<u8>>,
    rng: u64,
    /// The first misuse a helper saw (a program bug the kernel would refuse or fault on).
    error: Option<String>,
    /// `.rodata`'s region and bytes: the loader freezes it, so no run may change it.
    rodata: (usize, Vec<u8>),
}

thread_local! {
    /// Helpers are plain `fn`s: they find the harness of their thread here.
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn with<T>(f: impl FnOnce(&mut State) -> T) -> T {
    STATE.with(|s| f(s.borrow_mut().as_mut().expect("a harness on this thread")))
}

impl State {
    fn fail(&mut self, why: String) -> u64 {
        self.error.get_or_insert(why);
        -EFAULT as u64
    }

    fn map(&self, handle: u64) -> Option<&Map> {
        self.maps.get(handle.checked_sub(MAP_HANDLE)? as usize)
    }

    /// Writes `bytes` at `dst` if a region holds it whole.
    fn write(&mut self, dst: u64, bytes: &[u8], what: &str) -> bool {
        match self.regions.find(dst, bytes.len()) {
            Some((r, off)) => {
                self.regions.bufs[r][off..off + bytes.len()].copy_from_slice(bytes);
                true
            }
            None => {
                self.fail(format!(
                    "{what}: {} bytes at {dst:#x} outside the maps",
                    bytes.len()
                ));
                false
            }
        }
    }
}

/// Map handles the relocated `ld_imm64`s load (`MAP_HANDLE + index`): never an address
/// the program could dereference, only pass to helpers.
const MAP_HANDLE: u64 = 0x4d41_5000;

fn map_lookup_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    with(|s| {
        let Some(m) = s.map(map) else {
            return s.fail(format!("map_lookup_elem on {map:#x}, not a map"));
        };
        if m.kind == MAP_RINGBUF {
            return s.fail(format!("map_lookup_elem on ring buffer {}", m.name));
        }
        // Hash maps here are empty, as the kernel's are until user space fills them: the
        // filter's allow-lists (runs here are unfiltered) and the stack caps (every
        // process copies all a record holds).
        if m.kind == MAP_HASH {
            return 0;
        }
        // SAFETY: the key is on the program's stack (the verifier's rule; rbpf's stack is
        // not visible to helpers), 4 bytes for an array.
        let k = unsafe { (key as *const u32).read_unaligned() } as usize;
        if k >= m.max_entries {
            return 0;
        }
        s.regions.addr(m.region) + (k * m.value_size) as u64
    })
}

fn ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    with(|s| s.overflow.time_ns)
}

fn get_prandom_u32(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    with(|s| {
        // xorshift64: deterministic runs.
        s.rng ^= s.rng << 13;
        s.rng ^= s.rng >> 7;
        s.rng ^= s.rng << 17;
        s.rng >> 32
    })
}

fn get_smp_processor_id(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0
}

fn get_current_pid_tgid(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    with(|s| (u64::from(s.overflow.pid) << 32) | u64::from(s.overflow.tid))
}

fn get_current_cgroup_id(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    with(|s| s.overflow.cgroup_id)
}

/// `bpf_read_branch_records` as kernel/trace/bpf_trace.c has it.
fn read_branch_records(ctx: u64, buf: u64, size: u64, flags: u64, _: u64) -> u64 {
    with(|s| {
        if ctx != s.ctx {
            return s.fail(format!(
                "read_branch_records: ctx {ctx:#x} is not the context"
            ));
        }
        if flags & !GET_BRANCH_RECORDS_SIZE != 0 {
            return -EINVAL as u64;
        }
        let Some(entries) = s.overflow.branches.clone() else {
            return -ENOENT as u64;
        };
        if flags & GET_BRANCH_RECORDS_SIZE != 0 {
            return entries.len() as u64;
        }
        if buf == 0 || !(size as usize).is_multiple_of(BRANCH_ENTRY) {
            return -EINVAL as u64;
        }
        let n = entries.len().min(size as usize);
        if !s.write(buf, &entries[..n], "read_branch_records") {
            return -EFAULT as u64;
        }
        n as u64
    })
}

fn get_stack(ctx: u64, buf: u64, size: u64, flags: u64, _: u64) -> u64 {
    with(|s| {
        if ctx != s.ctx {
            return s.fail(format!("get_stack: ctx {ctx:#x} is not the context"));
        }
        let frames: Vec<u8> = if flags & USER_STACK == 0 {
            s.overflow
                .kernel_frames
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect()
        } else {
            Vec::new()
        };
        if frames.is_empty() {
            return -EFAULT as u64;
        }
        let n = frames.len().min(size as usize & !7);
        if !s.write(buf, &frames[..n], "get_stack") {
            return -EFAULT as u64;
        }
        n as u64
    })
}

/// No process memory is recorded: the read fails and, as the kernel's does, zeroes
/// `dst`: a map's bytes here; a `dst` in no map is on the program's stack (the only
/// other memory the verifier lets it pass), which rbpf keeps to itself and the program
/// does not read after a failed copy.
fn probe_read(dst: u64, size: u64, _: u64, _: u64, _: u64) -> u64 {
    with(|s| {
        if let Some((r, off)) = s.regions.find(dst, size as usize) {
            s.regions.bufs[r][off..off + size as usize].fill(0);
        }
        -EFAULT as u64
    })
}

/// A task handle for `bpf_task_pt_regs`, which answers with an address only
/// `bpf_probe_read_kernel` takes (and fails on).
fn task_handle(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0x7a5c_0000
}

fn ringbuf_reserve(map: u64, size: u64, flags: u64, _: u64, _: u64) -> u64 {
    with(|s| {
        let Some(m) = s.map(map).filter(|m| m.kind == MAP_RINGBUF) else {
            return s.fail(format!("ringbuf_reserve on {map:#x}, not a ring buffer"));
        };
        let region = m.region;
        if flags != 0 || s.reserved.is_some() {
            return s.fail("ringbuf_reserve: flags, or a second open reservation".into());
        }
        // The kernel's 8-byte record header comes first.
        if size as usize + 8 > s.regions.len(region) {
            return 0;
        }
        s.reserved = Some(size as usize);
        s.regions.addr(region) + 8
    })
}

fn ringbuf_end(data: u64, _flags: u64, submit: bool) -> u64 {
    with(|s| {
        let ring = s
            .maps
            .iter()
            .find(|m| m.kind == MAP_RINGBUF)
            .map(|m| m.region);
        let Some((ring, size)) = ring.zip(s.reserved.take()) else {
            return s.fail("ringbuf submit/discard without a reservation".into());
        };
        if data != s.regions.addr(ring) + 8 {
            return s.fail(format!(
                "ringbuf submit/discard of {data:#x}, not the reservation"
            ));
        }
        if submit {
            s.records.push(s.regions.bufs[ring][8..8 + size].to_vec());
        }
        0
    })
}

fn ringbuf_submit(data: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    ringbuf_end(data, flags, true)
}

fn ringbuf_discard(data: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    ringbuf_end(data, flags, false)
}

fn ringbuf_output(map: u64, data: u64, size: u64, _flags: u64, _: u64) -> u64 {
    with(|s| {
        if s.map(map).is_none_or(|m| m.kind != MAP_RINGBUF) {
            return s.fail(format!("ringbuf_output on {map:#x}, not a ring buffer"));
        }
        if size as usize + 8 > RING_ARENA {
            return -EAGAIN as u64;
        }
        match s.regions.find(data, size as usize) {
            Some((r, off)) => {
                let rec = s.regions.bufs[r][off..off + size as usize].to_vec();
                s.records.push(rec);
                0
            }
            None => s.fail(format!(
                "ringbuf_output: {size} bytes at {data:#x} outside the maps"
            )),
        }
    })
}

fn ringbuf_query(map: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    with(|s| {
        if s.map(map).is_none_or(|m| m.kind != MAP_RINGBUF) {
            return s.fail(format!("ringbuf_query on {map:#x}, not a ring buffer"));
        }
        // BPF_RB_RING_SIZE; BPF_RB_AVAIL_DATA and the positions: an empty ring.
        if flags == 1 {
            RING_SIZE
        } else {
            0
        }
    })
}

/// The object's programs, loaded and relocated, over maps backed by this harness (one
/// per thread at a time: the helpers find it in a thread-local).
pub struct Harness {
    programs: BTreeMap<String, Vec<u8>>,
    allowed: Vec<u64>,
}

impl Harness {
    /// Loads `object` (the embedded eBPF ELF) with `config` in its `CONFIG` map and
    /// `stacks` as its `STACK_MODE`.
    pub fn load(object: &[u8], config: KernelConfig, stacks: StackMode) -> Result<Self, String> {
        let elf = object::File::parse(object).map_err(|e| format!("eBPF object: {e}"))?;
        let mut regions = Regions { bufs: Vec::new() };
        let mut maps: Vec<Map> = Vec::new();
        let map_section = elf.section_by_name("maps").ok_or("no maps section")?;
        let map_defs = map_section.data().map_err(|e| e.to_string())?;
        let rodata = elf.section_by_name(".rodata").ok_or("no .rodata")?;
        let rodata_region = regions.add(rodata.size() as usize);
        regions.bufs[rodata_region][..rodata.size() as usize]
            .copy_from_slice(rodata.data().map_err(|e| e.to_string())?);
        let mut programs = BTreeMap::new();
        let mut found_stack_mode = false;
        for sym in elf.symbols() {
            let Some(section) = sym
                .section_index()
                .and_then(|i| elf.section_by_index(i).ok())
            else {
                continue;
            };
            let name = sym.name().map_err(|e| e.to_string())?.to_string();
            match section.name().unwrap_or("") {
                "maps" => {
                    // `struct bpf_map_def`: type, key_size, value_size, max_entries, flags...
                    let at = sym.address() as usize;
                    let word = |i: usize| {
                        u32::from_le_bytes(map_defs[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
                    };
                    let (kind, value_size, max_entries) =
                        (word(0), word(2) as usize, word(3) as usize);
                    let bytes = match kind {
                        MAP_ARRAY | MAP_PERCPU_ARRAY => value_size * max_entries,
                        MAP_RINGBUF => RING_ARENA,
                        // Hash maps, empty here: every lookup misses (`map_lookup_elem`).
                        MAP_HASH => 0,
                        k => return Err(format!("map {name}: type {k} not backed here")),
                    };
                    let region = regions.add(bytes);
                    maps.push(Map {
                        name,
                        kind,
                        value_size,
                        max_entries,
                        region,
                    });
                }
                ".rodata" if name == "STACK_MODE" => {
                    let at = sym.address() as usize;
                    regions.bufs[rodata_region][at..at + 4]
                        .copy_from_slice(&(stacks as u32).to_le_bytes());
                    found_stack_mode = true;
                }
                _ if sym.kind() == object::SymbolKind::Text
                    && section.name() == Ok("perf_event") =>
                {
                    let data = section.data().map_err(|e| e.to_string())?;
                    let (at, len) = (sym.address() as usize, sym.size() as usize);
                    programs.insert(name, (section.index(), at, data[at..at + len].to_vec()));
                }
                _ => {}
            }
        }
        if !found_stack_mode {
            return Err("no STACK_MODE in .rodata".into());
        }
        let config_map = maps
            .iter()
            .find(|m| m.name == "CONFIG")
            .ok_or("no CONFIG map")?;
        // SAFETY: `KernelConfig` is `#[repr(C)]` plain data without padding.
        let cfg = unsafe {
            std::slice::from_raw_parts(
                (&raw const config).cast::<u8>(),
                std::mem::size_of::<KernelConfig>(),
            )
        };
        regions.bufs[config_map.region][..cfg.len()].copy_from_slice(cfg);

        // Relocations: `ld_imm64` of a map → its handle; of `.rodata` → the copy's address.
        let mut relocated = BTreeMap::new();
        for (name, (index, start, mut code)) in programs {
            let section = elf.section_by_index(index).map_err(|e| e.to_string())?;
            for (off, rel) in section.relocations() {
                let off = off as usize;
                if off < start || off >= start + code.len() {
                    continue;
                }
                let object::RelocationTarget::Symbol(si) = rel.target() else {
                    return Err(format!("{name}: relocation at {off:#x} not to a symbol"));
                };
                let sym = elf.symbol_by_index(si).map_err(|e| e.to_string())?;
                let sym_name = sym.name().unwrap_or("");
                let i = off - start;
                if code[i] != 0x18 {
                    return Err(format!("{name}: relocation at {off:#x} not on an ld_imm64"));
                }
                let imm =
                    |c: &[u8], at: usize| u32::from_le_bytes(c[at..at + 4].try_into().unwrap());
                let addend = u64::from(imm(&code, i + 4)) | u64::from(imm(&code, i + 12)) << 32;
                let value = if let Some(m) = maps.iter().position(|m| m.name == sym_name) {
                    MAP_HANDLE + m as u64
                } else if sym_name == "STACK_MODE" || sym_name == "CGROUP_ANCESTORS" {
                    // CGROUP_ANCESTORS keeps the object's 0: no cgroup filter here.
                    regions.addr(rodata_region) + sym.address() + addend
                } else {
                    return Err(format!("{name}: relocation to {sym_name} not handled"));
                };
                code[i + 4..i + 8].copy_from_slice(&(value as u32).to_le_bytes());
                code[i + 12..i + 16].copy_from_slice(&((value >> 32) as u32).to_le_bytes());
            }
            relocated.insert(name, code);
        }
        let rodata = (
            rodata_region,
            regions.bufs[rodata_region][..regions.len(rodata_region)].to_vec(),
        );
        let allowed = (0..regions.bufs.len())
            .flat_map(|r| {
                let a = regions.addr(r);
                a..a + regions.len(r) as u64
            })
            .collect();
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            assert!(s.is_none(), "one harness per thread at a time");
            *s = Some(State {
                regions,
                maps,
                ctx: 0,
                overflow: Overflow::default(),
                reserved: None,
                records: Vec::new(),
                rng: 0x2545_f491_4f6c_dd1d,
                error: None,
                rodata,
            });
        });
        Ok(Harness {
            programs: relocated,
            allowed,
        })
    }

    /// A VM for `program`, its helpers and allowed memory registered.
    pub fn vm(&self, program: &str) -> Result<rbpf::EbpfVmMbuff<'_>, String> {
        let code = self
            .programs
            .get(program)
            .ok_or_else(|| format!("no program {program} in the object"))?;
        let mut vm = rbpf::EbpfVmMbuff::new(Some(code)).map_err(|e| format!("{program}: {e:?}"))?;
        let helpers: [(u32, rbpf::Helper); 17] = [
            (id::MAP_LOOKUP_ELEM, map_lookup_elem),
            (id::KTIME_GET_NS, ktime_get_ns),
            (id::GET_PRANDOM_U32, get_prandom_u32),
            (id::GET_SMP_PROCESSOR_ID, get_smp_processor_id),
            (id::GET_CURRENT_PID_TGID, get_current_pid_tgid),
            (id::GET_CURRENT_CGROUP_ID, get_current_cgroup_id),
            (id::GET_STACK, get_stack),
            (id::PROBE_READ_USER, probe_read),
            (id::PROBE_READ_KERNEL, probe_read),
            (id::READ_BRANCH_RECORDS, read_branch_records),
            (id::RINGBUF_OUTPUT, ringbuf_output),
            (id::RINGBUF_RESERVE, ringbuf_reserve),
            (id::RINGBUF_SUBMIT, ringbuf_submit),
            (id::RINGBUF_DISCARD, ringbuf_discard),
            (id::RINGBUF_QUERY, ringbuf_query),
            (id::GET_CURRENT_TASK_BTF, task_handle),
            (id::TASK_PT_REGS, task_handle),
        ];
        for (k, f) in helpers {
            vm.register_helper(k, f).map_err(|e| format!("{e:?}"))?;
        }
        vm.register_allowed_memory(&self.allowed);
        Ok(vm)
    }

    /// Runs `vm` on one overflow; the records it put in the ring buffer.
    pub fn run(&self, vm: &rbpf::EbpfVmMbuff<'_>, o: &Overflow) -> Result<Vec<Vec<u8>>, String> {
        let mut ctx = [0u8; CTX_BYTES];
        let put =
            |ctx: &mut [u8], at: usize, v: u64| ctx[at..at + 8].copy_from_slice(&v.to_le_bytes());
        put(&mut ctx, RIP, o.ip);
        // __USER_CS / __KERNEL_CS: the program tells modes by the privilege level.
        put(&mut ctx, CS, if o.kernel { 0x10 } else { 0x33 });
        put(&mut ctx, RSP, o.sp);
        put(&mut ctx, RBP, o.bp);
        put(&mut ctx, SAMPLE_PERIOD, o.period);
        with(|s| {
            s.ctx = ctx.as_ptr() as u64;
            s.overflow = o.clone();
        });
        let ret = vm
            .execute_program(&[], &ctx)
            .map_err(|e| format!("{e:?}"))?;
        with(|s| {
            if let Some(e) = s.error.take() {
                return Err(e);
            }
            if s.reserved.is_some() {
                return Err("a ring reservation left open".into());
            }
            if !s.regions.guards_intact() {
                return Err("a store ran past the end of a map".into());
            }
            let (r, bytes) = &s.rodata;
            if s.regions.bufs[*r][..bytes.len()] != bytes[..] {
                return Err("a store to the frozen .rodata".into());
            }
            if ret != 0 {
                return Err(format!("program returned {ret}"));
            }
            Ok(std::mem::take(&mut s.records))
        })
    }

    /// The value of per-CPU/array map `name`, slot `index` (this harness's one CPU).
    pub fn map_value(&self, name: &str, index: usize) -> Vec<u8> {
        with(|s| {
            let m = s.maps.iter().find(|m| m.name == name).expect("map");
            let at = index * m.value_size;
            s.regions.bufs[m.region][at..at + m.value_size].to_vec()
        })
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        STATE.with(|s| s.borrow_mut().take());
    }
}
