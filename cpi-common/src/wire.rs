//! Wire format: what the kernel side (or the PMU model) writes into the ring buffer.
//!
//! All records are `#[repr(C)]`, fixed size and start with a [`SampleHeader`] carrying
//! [`WIRE_VERSION`], so a reader can reject a record it does not understand.
#![warn(missing_docs)]

/// Bumped on any layout change of the records below.
pub const WIRE_VERSION: u16 = 3;

/// Most branch entries one sample carries: Intel arch LBR / Skylake+ depth.
pub const MAX_BRANCH_ENTRIES: usize = 32;

/// `struct perf_branch_entry` from `include/uapi/linux/perf_event.h`, bit for bit.
///
/// `flags` is the kernel's bitfield word:
/// `mispred:1, predicted:1, in_tx:1, abort:1, cycles:16, type:4, spec:2, new_type:4,
/// priv:3, reserved:31` (little-endian bit order, bit 0 first).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BranchEntry {
    /// Address of the taken branch instruction.
    pub from: u64,
    /// Address it went to: the first instruction of the next straight-line range.
    pub to: u64,
    /// The kernel's bitfield word (layout above); read it through the methods.
    pub flags: u64,
}

impl BranchEntry {
    const CYCLES_SHIFT: u32 = 4;
    const TYPE_SHIFT: u32 = 20;

    /// An entry with the given misprediction bit and cycle count (0 = unknown).
    pub const fn new(from: u64, to: u64, mispred: bool, cycles: u16) -> Self {
        let flags =
            (mispred as u64) | (((!mispred) as u64) << 1) | ((cycles as u64) << Self::CYCLES_SHIFT);
        BranchEntry { from, to, flags }
    }

    /// The branch was mispredicted (`mispred` bit).
    pub const fn mispred(&self) -> bool {
        self.flags & 1 != 0
    }

    /// The branch was predicted (`predicted` bit); with [`Self::mispred`] both clear,
    /// the hardware did not say.
    pub const fn predicted(&self) -> bool {
        self.flags & 2 != 0
    }

    /// Core cycles since the previous entry (Intel Skylake+ LBR, ARM BRBE); 0 = unknown.
    pub const fn cycles(&self) -> u16 {
        ((self.flags >> Self::CYCLES_SHIFT) & 0xffff) as u16
    }

    /// `PERF_BR_*` branch type ([`branch_type`]; 0 = unknown).
    pub const fn branch_type(&self) -> u8 {
        ((self.flags >> Self::TYPE_SHIFT) & 0xf) as u8
    }

    /// This entry with its `PERF_BR_*` type set.
    pub const fn with_type(mut self, t: u8) -> Self {
        self.flags =
            (self.flags & !(0xf << Self::TYPE_SHIFT)) | (((t & 0xf) as u64) << Self::TYPE_SHIFT);
        self
    }
}

/// `PERF_BR_*` branch types (`include/uapi/linux/perf_event.h`), as
/// [`BranchEntry::branch_type`] gives them; 0 = unknown.
pub mod branch_type {
    /// Conditional jump.
    pub const COND: u8 = 1;
    /// Unconditional direct jump.
    pub const UNCOND: u8 = 2;
    /// Indirect jump.
    pub const IND: u8 = 3;
    /// Direct call.
    pub const CALL: u8 = 4;
    /// Indirect call.
    pub const IND_CALL: u8 = 5;
    /// Return.
    pub const RET: u8 = 6;
    /// Exception return (`iret`): the kernel's return to user mode.
    pub const ERET: u8 = 11;
}

/// What a record is.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKind {
    /// A [`BranchSample`]: the branch stack frozen at a sample.
    Branch = 1,
    /// An [`IpSample`]: the interrupted instruction pointer.
    Ip = 2,
}

impl SampleKind {
    /// The kind a [`SampleHeader::kind`] holds; `None` for a value this reader does not know.
    pub const fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(SampleKind::Branch),
            2 => Some(SampleKind::Ip),
            _ => None,
        }
    }
}

/// Which sampling event a record came from. Each eBPF program serves one role, so the
/// role is a constant of the program, not something read from the context.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventRole {
    /// Retired taken branches (or cycles) with a branch stack.
    Branches = 0,
    /// Core cycles: IP samples whose period is cycles.
    Cycles = 1,
    /// Retired instructions: IP samples (the imprecise "traditional" method).
    Instructions = 2,
    /// Software `cpu-clock`: IP samples whose period is nanoseconds (no PMU).
    CpuClock = 3,
}

impl EventRole {
    /// The role a [`SampleHeader::event`] holds; `None` for a value this reader does not know.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(EventRole::Branches),
            1 => Some(EventRole::Cycles),
            2 => Some(EventRole::Instructions),
            3 => Some(EventRole::CpuClock),
            _ => None,
        }
    }
}

/// The sampled IP was in kernel mode.
pub const FLAG_KERNEL: u16 = 1 << 0;

/// The fixed record is followed by a call stack: a [`StackHeader`], then
/// `kernel_nr` kernel frames (`u64`, leaf first), `user_nr` user frames (`u64`, leaf
/// first) and `stack_len` bytes of the user stack copied from `user_sp` upwards, for
/// unwinding in user space. Records with this flag are longer than their fixed size.
pub const FLAG_STACK: u16 = 1 << 1;

/// The copy of the user stack stopped at its cap (the process's entry in
/// `STACK_CAPS`, else [`MAX_STACK_BYTES`]), not at an unreadable page: a stack that
/// goes on past the copy was cut, not ended.
pub const FLAG_STACK_CUT: u16 = 1 << 2;

/// Most kernel frames a record carries.
pub const MAX_KERNEL_FRAMES: usize = 64;

/// Most user frames a record carries (frames already unwound by the writer: the PMU
/// model's exact stacks; unwinding from copied stack bytes stops at the same depth).
pub const MAX_USER_FRAMES: usize = 128;

/// Most bytes of user stack a record carries.
pub const MAX_STACK_BYTES: usize = 8192;

/// Most processes whose stack copy has a cap of its own (the kernel side's
/// `STACK_CAPS`, tgid → bytes, set by cpi-user/src/collect/stack_caps.rs); any other
/// process's copy runs to [`MAX_STACK_BYTES`].
pub const MAX_STACK_CAPS: u32 = 8192;

/// Bytes the kernel side copies per read of the user stack: chunks are page-aligned, so
/// a stack whose next page is unmapped still gives every byte up to it.
pub const STACK_CHUNK: usize = 4096;

/// How the kernel side takes stacks: the value of the eBPF object's read-only global
/// `STACK_MODE`, set at load time. Being a constant of the loaded program, it lets the
/// verifier drop the branches a kernel lacks the helpers for.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackMode {
    /// No stacks: records stay at their fixed size.
    Off = 0,
    /// Kernel frames, and the user registers plus the top of the user stack; for a
    /// sample taken in kernel mode the user registers are the task's saved ones
    /// (`bpf_task_pt_regs`, Linux 5.15).
    CopyStack = 1,
    /// As [`StackMode::CopyStack`], except that a sample taken in kernel mode gets the
    /// kernel's frame-pointer walk of the user stack (`user_nr` frames) instead: kernels
    /// without `bpf_task_pt_regs`.
    CopyStackUserFramePointers = 2,
}

/// The call-stack section of a record flagged [`FLAG_STACK`].
///
/// Kernel frames are what the kernel's own unwinder reports (entry 0 the interrupted
/// kernel IP). User frames, when the writer unwound them, start with the interrupted user
/// IP; the rest are return addresses. A writer that copies the stack instead sets
/// `user_nr = 0`, `stack_len` > 0 and the user registers the unwinding starts from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackHeader {
    /// Kernel frames that follow.
    pub kernel_nr: u16,
    /// User frames that follow the kernel frames.
    pub user_nr: u16,
    /// Bytes of user stack that follow the frames.
    pub stack_len: u32,
    /// User-mode instruction pointer at the sample (0 when unknown).
    pub user_ip: u64,
    /// User-mode stack pointer: the address of the first copied stack byte.
    pub user_sp: u64,
    /// User-mode frame pointer (`rbp`).
    pub user_bp: u64,
}

/// Common header of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleHeader {
    /// [`WIRE_VERSION`] of the writer; a reader drops records of another version.
    pub version: u16,
    /// A [`SampleKind`] as `u16`.
    pub kind: u16,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Valid entries in a branch sample (0 for IP samples).
    pub nr: u16,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// The [`EventRole`] that produced the record, as `u32`.
    pub event: u32,
    /// Events this record stands for: the event's sample period summed over every
    /// overflow since the previous emitted record on this CPU (in-kernel thinning).
    pub period: u64,
    /// `bpf_ktime_get_ns()` at the sample (simulated time in the PMU model).
    pub time_ns: u64,
    /// Interrupted instruction pointer.
    pub ip: u64,
    /// The id of the task's cgroup v2 (`bpf_get_current_cgroup_id`: the inode number of
    /// its directory in the cgroup2 file system); 0 when unknown (imports, the PMU model).
    /// User space names a process's container from it without reading `/proc`, also once
    /// the process is gone (cpi-user/src/collect/processes.rs).
    pub cgroup_id: u64,
}

/// Branch stack sample. Entry 0 is the **newest** branch (kernel order).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BranchSample {
    /// Who, when, where and how much (`nr` valid entries).
    pub header: SampleHeader,
    /// Newest first; only the first `header.nr` are valid (see [`Self::entries`]).
    pub entries: [BranchEntry; MAX_BRANCH_ENTRIES],
}

impl BranchSample {
    /// A branch record with `header`'s pid/tid/cpu/period/time/ip holding `newest_first`
    /// (entries past [`MAX_BRANCH_ENTRIES`] are dropped); version, kind, event and `nr`
    /// are set here.
    pub fn new(header: SampleHeader, newest_first: &[BranchEntry]) -> Self {
        let n = newest_first.len().min(MAX_BRANCH_ENTRIES);
        let mut entries = [BranchEntry::default(); MAX_BRANCH_ENTRIES];
        entries[..n].copy_from_slice(&newest_first[..n]);
        BranchSample {
            header: SampleHeader {
                version: WIRE_VERSION,
                kind: SampleKind::Branch as u16,
                event: EventRole::Branches as u32,
                nr: n as u16,
                ..header
            },
            entries,
        }
    }

    /// The valid entries, newest first.
    pub fn entries(&self) -> &[BranchEntry] {
        let n = (self.header.nr as usize).min(MAX_BRANCH_ENTRIES);
        &self.entries[..n]
    }
}

/// Instruction-pointer sample (cycles, instructions or cpu-clock event).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpSample {
    /// The whole record: the IP is [`SampleHeader::ip`], the weight its `period`.
    pub header: SampleHeader,
}

/// Per-CPU loss and error counters kept by the eBPF programs (index into a per-CPU
/// array map). User space sums them over CPUs and reports them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Samples the program handled (emitted or thinned); filtered ones are not.
    Seen = 0,
    /// Records written to the ring buffer.
    Emitted = 1,
    /// Records lost because the ring buffer was full.
    RingFull = 2,
    /// Branch helper returned an error (no branch stack on this sample).
    BranchError = 3,
    /// Samples dropped by in-kernel thinning (their period is carried by the next record).
    Thinned = 4,
    /// Samples of processes the filter does not want ([`crate::policy::KernelConfig::filter`]),
    /// dropped first thing: not seen, not a loss.
    Filtered = 5,
    /// Processes forked by a kept process that the filter could not follow
    /// ([`crate::policy::FILTER_FOLLOW`]): its map of children was full.
    Unfollowed = 6,
}

/// Number of [`Counter`] slots.
pub const COUNTERS: u32 = 7;

/// Most processes the kernel filter allows by tgid (`--pid`, and the live processes a
/// followed target forked), and most forked children it follows before their first
/// sample: a full map leaves later children out, counted as [`Counter::Unfollowed`].
pub const MAX_FILTER_TGIDS: u32 = 8192;

/// Most cgroups the kernel filter allows (`--cgroup`, or the agent's pod selectors: a
/// node runs at most 110 pods by default, one cgroup each, or one per selected
/// container).
pub const MAX_FILTER_CGROUPS: u32 = 256;

/// Deepest cgroup level the kernel filter checks (level 0 is the root): the bound of the
/// eBPF program's loop over a sample's ancestors.
pub const MAX_CGROUP_LEVEL: u32 = 31;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain-old-data, `#[repr(C)]`, no padding-dependent invariants.
    unsafe impl aya::Pod for super::BranchEntry {}
    unsafe impl aya::Pod for super::SampleHeader {}
    unsafe impl aya::Pod for super::IpSample {}
    unsafe impl aya::Pod for super::StackHeader {}
    unsafe impl aya::Pod for super::BranchSample {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_kernel_and_is_fixed() {
        assert_eq!(
            size_of::<BranchEntry>(),
            24,
            "struct perf_branch_entry is 24 bytes"
        );
        assert_eq!(size_of::<SampleHeader>(), 56);
        assert_eq!(offset_of!(BranchSample, entries), 56);
        assert_eq!(size_of::<BranchSample>(), 56 + 24 * MAX_BRANCH_ENTRIES);
        assert_eq!(size_of::<StackHeader>(), 32);
    }

    #[test]
    fn flag_bits_follow_the_kernel_bitfield() {
        // mispred bit 0, predicted bit 1, cycles bits 4..20, type bits 20..24.
        let e = BranchEntry {
            from: 1,
            to: 2,
            flags: 1 | (0xabcd << 4) | (0x5 << 20),
        };
        assert!(e.mispred());
        assert!(!e.predicted());
        assert_eq!(e.cycles(), 0xabcd);
        assert_eq!(e.branch_type(), 5);
        let p = BranchEntry::new(1, 2, false, 7);
        assert!(!p.mispred() && p.predicted());
        assert_eq!(p.cycles(), 7);
    }
}
