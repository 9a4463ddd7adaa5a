//! cpi-bpf kernel side: perf_event programs that turn each counter overflow into one
//! wire record (cpi-common `wire`) in a BPF ring buffer.
//!
//! * `branch_sample` — on the retired-taken-branches event (opened with
//!   `PERF_SAMPLE_BRANCH_STACK`): the branch stack the PMI froze for this sample
//!   (`bpf_read_branch_records`, Linux 5.6). There is deliberately no
//!   `bpf_get_branch_snapshot` fallback: on x86 it disables and re-enables the whole PMU
//!   and re-reads the LBR into the per-CPU buffer this very sample's frozen stack lives
//!   in, from inside the overflow handler that has the PMU stopped; and it can only help
//!   where the frozen stack is missing, which an event opened with a branch stack never
//!   is (README, "Kernels").
//!
//! User space loads only the programs the mode it runs needs (cpi-user/src/collect/mod.rs
//! `load`), so a kernel lacking a helper of one program still runs the others.
//! * `ip_cycles`, `ip_instructions`, `ip_cpu_clock` — the interrupted IP, one program per
//!   event role so the role is a constant of the program.
//!
//! Every program thins with the shared policy (`ThinState::on_overflow`, per CPU and per
//! role) and weights each record by the summed `sample_period` it stands for. Losses are
//! counted per CPU (`wire::Counter`). The `#[perf_event]` wrapper returns 0, which (6.10+)
//! also suppresses the kernel's own sample output: the ring buffer is the only output.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{
        bpf_perf_event_data, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP,
        BPF_RB_RING_SIZE,
    },
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_read_branch_records,
    },
    macros::{map, perf_event},
    maps::{Array, PerCpuArray, RingBuf},
    programs::PerfEventContext,
};
use cpi_common::{
    policy::{KernelConfig, ThinState},
    wire::{
        BranchEntry, BranchSample, Counter, EventRole, IpSample, SampleHeader, SampleKind,
        COUNTERS as COUNTER_SLOTS, FLAG_KERNEL, MAX_BRANCH_ENTRIES, WIRE_VERSION,
    },
};

/// Wire records. User space resizes it at load time (`--ring-buffer`).
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Index 0: the collector's [`KernelConfig`].
#[map]
static CONFIG: Array<KernelConfig> = Array::with_max_entries(1, 0);

/// Thinning state per CPU, indexed by [`EventRole`] (each event thins on its own).
#[map]
static THIN: PerCpuArray<ThinState> = PerCpuArray::with_max_entries(4, 0);

/// Loss and error counters per CPU, indexed by [`Counter`].
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

const BRANCH_BYTES: u32 = (MAX_BRANCH_ENTRIES * core::mem::size_of::<BranchEntry>()) as u32;

/// Submit flags: wake the collector only once the ring is a quarter full; otherwise it
/// drains on its own timer. A wake-up per sample would make the collector compete
/// with the profiled program for the CPU at every sample.
#[inline(always)]
fn wakeup_flags() -> u64 {
    let avail = SAMPLES.query(BPF_RB_AVAIL_DATA as u64);
    let size = SAMPLES.query(BPF_RB_RING_SIZE as u64);
    if avail >= size / 4 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[inline(always)]
fn count(c: Counter) {
    if let Some(p) = COUNTERS.get_ptr_mut(c as u32) {
        // Per-CPU slot, and perf_event programs do not nest on one CPU: a plain add.
        unsafe { *p += 1 };
    }
}

/// Counts the overflow and applies thinning; `Some(weight)` when a record is due.
#[inline(always)]
fn admit(ctx: &PerfEventContext, role: EventRole) -> Option<(u64, bool)> {
    count(Counter::Seen);
    let data = ctx.ctx as *const bpf_perf_event_data;
    let (period, kernel) = unsafe { ((*data).sample_period, (*data).regs.cs & 3 == 0) };
    let cfg = CONFIG.get(0).copied().unwrap_or_default();
    if kernel && cfg.include_kernel == 0 {
        // Kernel samples are excluded at open time too; this catches the rest. Not
        // counted as emitted, so user space sees them as seen − emitted − lost.
        return None;
    }
    let st = THIN.get_ptr_mut(role as u32)?;
    let st = unsafe { &mut *st };
    if st.rng_state == 0 {
        // Zeroed per-CPU state: seed each CPU differently so phases do not line up.
        let seed = ((unsafe { bpf_get_prandom_u32() } as u64) << 32)
            | unsafe { bpf_get_prandom_u32() } as u64;
        *st = ThinState::new(seed | 1);
    }
    match st.on_overflow(period, cfg.thinning) {
        Some(w) => Some((w, kernel)),
        None => {
            count(Counter::Thinned);
            None
        }
    }
}

#[inline(always)]
fn header(
    ctx: &PerfEventContext,
    kind: SampleKind,
    role: EventRole,
    weight: u64,
    kernel: bool,
) -> SampleHeader {
    let id = bpf_get_current_pid_tgid();
    let data = ctx.ctx as *const bpf_perf_event_data;
    SampleHeader {
        version: WIRE_VERSION,
        kind: kind as u16,
        flags: if kernel { FLAG_KERNEL } else { 0 },
        nr: 0,
        cpu: unsafe { bpf_get_smp_processor_id() },
        tgid: (id >> 32) as u32,
        tid: id as u32,
        event: role as u32,
        period: weight,
        time_ns: unsafe { bpf_ktime_get_ns() },
        ip: unsafe { (*data).regs.rip },
    }
}

#[inline(always)]
fn emit_ip(ctx: &PerfEventContext, role: EventRole) {
    let Some((weight, kernel)) = admit(ctx, role) else {
        return;
    };
    let Some(mut slot) = SAMPLES.reserve::<IpSample>(0) else {
        count(Counter::RingFull);
        return;
    };
    slot.write(IpSample {
        header: header(ctx, SampleKind::Ip, role, weight, kernel),
    });
    slot.submit(wakeup_flags());
    count(Counter::Emitted);
}

#[perf_event]
pub fn branch_sample(ctx: PerfEventContext) -> u32 {
    let Some((weight, kernel)) = admit(&ctx, EventRole::Branches) else {
        return 0;
    };
    let Some(mut slot) = SAMPLES.reserve::<BranchSample>(0) else {
        count(Counter::RingFull);
        return 0;
    };
    let rec = slot.as_mut_ptr();
    // The helper writes straight into the reserved record: no 768-byte stack copy.
    let entries = unsafe { core::ptr::addr_of_mut!((*rec).entries) } as *mut core::ffi::c_void;
    let got = unsafe { bpf_read_branch_records(ctx.ctx, entries, BRANCH_BYTES, 0) };
    if got <= 0 {
        count(Counter::BranchError);
        slot.discard(0);
        return 0;
    }
    let mut h = header(
        &ctx,
        SampleKind::Branch,
        EventRole::Branches,
        weight,
        kernel,
    );
    h.nr = (got as u64 / core::mem::size_of::<BranchEntry>() as u64) as u16;
    unsafe { core::ptr::addr_of_mut!((*rec).header).write(h) };
    slot.submit(wakeup_flags());
    count(Counter::Emitted);
    0
}

#[perf_event]
pub fn ip_cycles(ctx: PerfEventContext) -> u32 {
    emit_ip(&ctx, EventRole::Cycles);
    0
}

#[perf_event]
pub fn ip_instructions(ctx: PerfEventContext) -> u32 {
    emit_ip(&ctx, EventRole::Instructions);
    0
}

#[perf_event]
pub fn ip_cpu_clock(ctx: PerfEventContext) -> u32 {
    emit_ip(&ctx, EventRole::CpuClock);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
