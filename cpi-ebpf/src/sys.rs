//! Every `unsafe` of the kernel side, each behind a safe function with the reason it is
//! sound: BPF helper calls, the perf context, the loader-written globals, per-CPU map
//! slots and the scratch buffer a record with a stack is built in.
//!
//! Two facts carry most of the arguments. A perf_event program runs in the overflow
//! handler with the PMU stopped, so two runs never nest on one CPU: a per-CPU slot
//! is this run's alone. And the verifier checks every helper's buffer against the
//! map value it points into, so the bounds below are the verifier's too: each buffer
//! write checks `off + len` against the scratch size before the helper sees it.

use aya_ebpf::{
    bindings::{bpf_perf_event_data, pt_regs, BPF_F_USER_STACK},
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id, bpf_get_prandom_u32,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_read_branch_records,
        generated::{
            bpf_get_current_task, bpf_get_current_task_btf, bpf_get_stack, bpf_probe_read_kernel,
            bpf_probe_read_user, bpf_task_pt_regs,
        },
    },
    maps::{ring_buf::RingBufEntry, HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use cpi_common::wire::{BranchSample, SampleHeader};

use crate::{BRANCH_BYTES, SCRATCH_BYTES};

/// A global the loader writes into `.rodata` before load.
#[inline(always)]
pub fn loader_value(v: &'static u32) -> u32 {
    // SAFETY: a reference is a valid, aligned pointer. Volatile so that the compiler
    // does not fold the initializer (the loader's value replaces it in the object).
    unsafe { core::ptr::read_volatile(v) }
}

/// This CPU's slot `index` of `map`, for this run alone.
#[inline(always)]
pub fn per_cpu_mut<T>(map: &'static PerCpuArray<T>, index: u32) -> Option<&'static mut T> {
    let p = map.get_ptr_mut(index)?;
    // SAFETY: the helper returned this CPU's value, valid for the program's run; runs
    // do not nest on one CPU, so no other reference to it exists while this one lives.
    Some(unsafe { &mut *p })
}

/// Adds one to this CPU's slot `index` of `map` from a tracepoint program. Unlike a
/// perf_event program, a tracepoint program may be preempted on its CPU by another
/// program that adds to the same slot, so no `&mut` is held across the add: a race
/// loses at most one count.
#[inline(always)]
pub fn per_cpu_add(map: &'static PerCpuArray<u64>, index: u32) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: the helper returned this CPU's value, valid for the program's run;
        // a plain read then write through the pointer, with no reference kept.
        unsafe { p.write_volatile(p.read_volatile().wrapping_add(1)) };
    }
}

/// The current task's `task_struct` address: a name for the task while it lives (the
/// filter deletes it at the task's exit, before the memory can be reused).
#[inline(always)]
pub fn current_task() -> u64 {
    // SAFETY: the helper takes no arguments; the address is only compared, never read.
    unsafe { bpf_get_current_task() }
}

/// A copy of `map`'s value for `key`, if it holds one.
#[inline(always)]
pub fn map_value<K, V: Copy>(map: &'static HashMap<K, V>, key: &K) -> Option<V> {
    let p = map.get_ptr(key)?;
    // SAFETY: the helper returned a pointer to the value, valid for the program's run
    // (an update from user space links a new element; this one is freed after RCU).
    Some(unsafe { *p })
}

/// The kernel's data for this overflow (period, registers).
#[inline(always)]
pub fn event_data(ctx: &PerfEventContext) -> &bpf_perf_event_data {
    // SAFETY: a perf_event program's context is the kernel's `bpf_perf_event_data`,
    // valid and unchanged for the program's run.
    unsafe { &*(ctx.ctx as *const bpf_perf_event_data) }
}

/// 64 random bits.
#[inline(always)]
pub fn random_u64() -> u64 {
    // SAFETY: the helper takes no arguments.
    let (hi, lo) = unsafe { (bpf_get_prandom_u32(), bpf_get_prandom_u32()) };
    ((hi as u64) << 32) | lo as u64
}

/// The CPU the program runs on.
#[inline(always)]
pub fn cpu() -> u32 {
    // SAFETY: the helper takes no arguments.
    unsafe { bpf_get_smp_processor_id() }
}

/// CLOCK_MONOTONIC in nanoseconds.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: the helper takes no arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// The id of the current task's cgroup v2 (Linux 4.18 for tracing programs).
#[inline(always)]
pub fn cgroup_id() -> u64 {
    // SAFETY: the helper takes no arguments.
    unsafe { bpf_get_current_cgroup_id() }
}

/// The id of the current task's cgroup v2 ancestor at `level` (0 when the task's cgroup
/// is above it). The caller loads this only where the kernel offers the helper to
/// perf_event programs (`CGROUP_ANCESTORS`).
#[inline(always)]
pub fn ancestor_cgroup_id(level: i32) -> u64 {
    // SAFETY: the helper takes a level only; any level is valid (0 when out of range).
    unsafe { bpf_get_current_ancestor_cgroup_id(level) }
}

/// The user registers the current task entered the kernel with, when they are user
/// registers (not a kernel thread's zeros); `regs` is any value to overwrite.
#[inline(always)]
pub fn user_regs_at_entry(mut regs: pt_regs) -> Option<pt_regs> {
    // SAFETY: the task pointer comes from the BTF helper (trusted by the verifier);
    // `bpf_probe_read_kernel` copies `size_of::<pt_regs>()` bytes into `regs`, which
    // has that size, and fails safely on a bad source.
    let got = unsafe {
        let saved = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        bpf_probe_read_kernel(
            (&raw mut regs).cast(),
            core::mem::size_of::<pt_regs>() as u32,
            saved.cast(),
        )
    };
    (got == 0 && regs.cs & 3 == 3).then_some(regs)
}

/// Writes the branch stack the PMI froze into the reserved record's entries; returns
/// the bytes written or the helper's error.
#[inline(always)]
pub fn branch_records_into(ctx: &PerfEventContext, slot: &mut RingBufEntry<BranchSample>) -> i64 {
    let rec = slot.as_mut_ptr();
    // SAFETY: `rec` is a reserved ring record; the helper writes at most BRANCH_BYTES
    // (the entries field's size) at the field's address.
    unsafe {
        let entries = (&raw mut (*rec).entries).cast();
        bpf_read_branch_records(ctx.ctx, entries, BRANCH_BYTES, 0)
    }
}

/// Sets the header of a reserved branch record whose entries are written.
#[inline(always)]
pub fn set_branch_header(slot: &mut RingBufEntry<BranchSample>, h: SampleHeader) {
    let rec = slot.as_mut_ptr();
    // SAFETY: `rec` is a reserved record; the header is a field of it.
    unsafe { (&raw mut (*rec).header).write(h) }
}

/// This CPU's scratch buffer of [`SCRATCH_BYTES`], where a record with a stack is built.
pub struct Scratch(*mut u8);

impl Scratch {
    /// This CPU's buffer (the run's alone, as [`per_cpu_mut`]).
    #[inline(always)]
    pub fn of<T>(map: &'static PerCpuArray<T>) -> Option<Scratch> {
        const { assert!(core::mem::size_of::<T>() == SCRATCH_BYTES) };
        map.get_ptr_mut(0).map(|p| Scratch(p.cast()))
    }

    /// Writes `v` at `off`, unaligned; nothing when it would not fit.
    #[inline(always)]
    pub fn write<T>(&self, off: usize, v: T) {
        if off + core::mem::size_of::<T>() <= SCRATCH_BYTES {
            // SAFETY: in bounds (checked), and the buffer is this run's alone.
            unsafe { self.0.add(off).cast::<T>().write_unaligned(v) }
        }
    }

    /// The kernel stack (return addresses) at `off`, at most `len` bytes; the bytes
    /// written or the helper's error.
    #[inline(always)]
    pub fn kernel_stack(&self, ctx: &PerfEventContext, off: usize, len: usize) -> i64 {
        self.get_stack(ctx, off, len, 0)
    }

    /// The user stack by frame pointers, as [`Self::kernel_stack`].
    #[inline(always)]
    pub fn user_frames(&self, ctx: &PerfEventContext, off: usize, len: usize) -> i64 {
        self.get_stack(ctx, off, len, BPF_F_USER_STACK as u64)
    }

    #[inline(always)]
    fn get_stack(&self, ctx: &PerfEventContext, off: usize, len: usize, flags: u64) -> i64 {
        if off + len > SCRATCH_BYTES {
            return -1;
        }
        // SAFETY: the helper writes at most `len` bytes at `off`, in bounds (checked).
        unsafe { bpf_get_stack(ctx.ctx.cast(), self.0.add(off).cast(), len as u32, flags) }
    }

    /// Copies `len` bytes of user memory at `src` to `off`; 0 or the helper's error
    /// (an unmapped page fails the copy, never faults).
    #[inline(always)]
    pub fn read_user(&self, off: usize, len: usize, src: u64) -> i64 {
        if off + len > SCRATCH_BYTES {
            return -1;
        }
        // SAFETY: in bounds (checked); the helper reads user memory with fault handling.
        unsafe { bpf_probe_read_user(self.0.add(off).cast(), len as u32, src as *const _) }
    }

    /// The branch stack the PMI froze, at `off`, at most `len` bytes; as
    /// [`Self::kernel_stack`].
    #[inline(always)]
    pub fn branch_records(&self, ctx: &PerfEventContext, off: usize, len: usize) -> i64 {
        if off + len > SCRATCH_BYTES {
            return -1;
        }
        // SAFETY: the helper writes at most `len` bytes at `off`, in bounds (checked).
        unsafe { bpf_read_branch_records(ctx.ctx, self.0.add(off).cast(), len as u32, 0) }
    }

    /// The first `len` bytes, written by the calls above.
    #[inline(always)]
    pub fn bytes(&self, len: usize) -> Option<&[u8]> {
        // SAFETY: in bounds (checked); the bytes are plain data.
        (len <= SCRATCH_BYTES).then(|| unsafe { core::slice::from_raw_parts(self.0, len) })
    }
}
