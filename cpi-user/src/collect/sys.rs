//! Every raw syscall and ioctl the collector makes, and nothing else: `perf_event_open`,
//! the `PERF_EVENT_IOC_*` ioctls, reading an event's count, `pidfd_open`,
//! `BPF_ENABLE_STATS`, `statfs` (is a directory cgroup2), the kernel filter's map
//! updates (`FilterMaps`) and the stack caps' (`StackCapMap`), the thread's CPU
//! clock, and the collector's kernel timers (`Timer`). Callers get owned fds and
//! `io::Result`s, and say where an event counts with a [`Placement`] and what it follows
//! with a [`Follow`]: the kernel's pid, cpu, `-1`s and inherit flags are made here only.
//!
//! The collector reaches them through [`PerfSys`], so the mode ladder, the step-downs and
//! the exit paths are unit-tested with fake error codes (`collect/sys/fake.rs`, aya's
//! `sys/fake.rs` pattern) on machines without root.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod process;
pub(crate) mod ring;

/// Where one perf event counts: `perf_event_open`'s pid and cpu as a type (aya's
/// `PerfEventScope`), turned into the kernel's numbers and `-1`s only by [`Linux`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// The calling process, on any CPU (doctor's probes).
    Me,
    /// One thread (a process's first thread: the process), on any CPU.
    Thread {
        /// The thread.
        tid: u32,
    },
    /// One thread, on one CPU (the kernel maps an inherited event's buffer only then).
    ThreadOnCpu {
        /// The thread.
        tid: u32,
        /// The CPU.
        cpu: u32,
    },
    /// Every thread, on one CPU.
    Cpu {
        /// The CPU.
        cpu: u32,
    },
}

impl Placement {
    /// The thread it names, if it names one.
    pub fn tid(self) -> Option<u32> {
        match self {
            Placement::Thread { tid } | Placement::ThreadOnCpu { tid, .. } => Some(tid),
            Placement::Me | Placement::Cpu { .. } => None,
        }
    }

    /// The CPU it is bound to, if it is bound to one.
    pub fn cpu(self) -> Option<u32> {
        match self {
            Placement::ThreadOnCpu { cpu, .. } | Placement::Cpu { cpu } => Some(cpu),
            Placement::Me | Placement::Thread { .. } => None,
        }
    }

    /// `perf_event_open`'s `pid` and `cpu` (`-1`: any).
    fn pid_cpu(self) -> (libc::pid_t, libc::c_int) {
        let n = |v: u32| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
        match self {
            Placement::Me => (0, -1),
            Placement::Thread { tid } => (n(tid), -1),
            Placement::ThreadOnCpu { tid, cpu } => (n(tid), n(cpu)),
            Placement::Cpu { cpu } => (-1, n(cpu)),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Placement::Me => write!(f, "this process"),
            Placement::Thread { tid } => write!(f, "pid {tid}"),
            Placement::ThreadOnCpu { tid, cpu } => write!(f, "pid {tid} on cpu {cpu}"),
            Placement::Cpu { cpu } => write!(f, "cpu {cpu}"),
        }
    }
}

/// What an event follows beyond the threads its [`Placement`] names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Follow {
    /// Nothing more (a per-CPU event sees every thread already).
    #[default]
    Placed,
    /// Threads and children created after the open too (`flag::INHERIT`).
    Children,
    /// A command started suspended: its children too, counting from its exec
    /// (`flag::INHERIT`, `flag::ENABLE_ON_EXEC`).
    ChildrenFromExec,
}

impl Follow {
    /// The attr flags that say it.
    fn flags(self) -> u64 {
        match self {
            Follow::Placed => 0,
            Follow::Children => flag::INHERIT,
            Follow::ChildrenFromExec => flag::INHERIT | flag::ENABLE_ON_EXEC,
        }
    }
}

/// Where a session's events are opened: one event per placement, each following the same.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placements {
    /// One per event of each kind.
    pub at: Vec<Placement>,
    /// What every one of them follows.
    pub follow: Follow,
}

/// The system calls the collector makes on perf events, as a trait: [`Linux`] runs them,
/// `fake::FakeSys` (`collect/sys/fake.rs`) answers with scripted errors in unit tests.
pub trait PerfSys {
    /// `perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)` at `at`, with the attr
    /// flags of `follow` added.
    fn perf_event_open(
        &self,
        attr: &PerfEventAttr,
        at: Placement,
        follow: Follow,
    ) -> io::Result<OwnedFd>;
    /// Runs BPF program `prog` on every overflow of the event.
    fn set_bpf(&self, fd: &OwnedFd, prog: BorrowedFd<'_>) -> io::Result<()>;
    /// `PERF_EVENT_IOC_ENABLE`: start counting and sampling.
    fn enable(&self, fd: &OwnedFd) -> io::Result<()>;
    /// `PERF_EVENT_IOC_DISABLE`: stop; the count is kept.
    fn disable(&self, fd: &OwnedFd) -> io::Result<()>;
    /// New sample period; the kernel restarts the count from it.
    fn set_period(&self, fd: &OwnedFd, period: u64) -> io::Result<()>;
    /// The event's count so far (events, or ns for cpu-clock).
    fn read_count(&self, fd: &OwnedFd) -> io::Result<u64>;
    /// A pidfd: readable once the process exits.
    fn pidfd_open(&self, pid: u32) -> io::Result<OwnedFd>;
    /// `PERF_EVENT_IOC_SET_OUTPUT`: `fd`'s records go to `to`'s ring buffer (an event on
    /// the same CPU), as `perf record` shares one buffer per CPU.
    fn set_output(&self, fd: &OwnedFd, to: &OwnedFd) -> io::Result<()>;
    /// `PERF_EVENT_IOC_ID`: the id its samples carry (`PERF_SAMPLE_IDENTIFIER`), which
    /// its inherited copies' samples carry too.
    fn event_id(&self, fd: &OwnedFd) -> io::Result<u64>;
    /// `BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)`: per-program run-time accounting for as
    /// long as the returned fd stays open.
    fn enable_bpf_stats(&self) -> io::Result<OwnedFd>;
}

/// The real system calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct Linux;

impl PerfSys for Linux {
    fn perf_event_open(
        &self,
        attr: &PerfEventAttr,
        at: Placement,
        follow: Follow,
    ) -> io::Result<OwnedFd> {
        let mut a = *attr;
        a.flags |= follow.flags();
        let (pid, cpu) = at.pid_cpu();
        perf_event_open(&a, pid, cpu)
    }
    fn set_bpf(&self, fd: &OwnedFd, prog: BorrowedFd<'_>) -> io::Result<()> {
        ioctl(
            fd,
            PERF_EVENT_IOC_SET_BPF,
            prog.as_raw_fd() as libc::c_ulong,
        )
    }
    fn enable(&self, fd: &OwnedFd) -> io::Result<()> {
        ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    }
    fn disable(&self, fd: &OwnedFd) -> io::Result<()> {
        ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
    }
    fn set_period(&self, fd: &OwnedFd, period: u64) -> io::Result<()> {
        ioctl(
            fd,
            PERF_EVENT_IOC_PERIOD,
            &raw const period as libc::c_ulong,
        )
    }
    fn read_count(&self, fd: &OwnedFd) -> io::Result<u64> {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a local u64 (read_format 0: the count alone).
        let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
        match n {
            8 => Ok(v),
            n if n < 0 => Err(io::Error::last_os_error()),
            _ => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
    fn pidfd_open(&self, pid: u32) -> io::Result<OwnedFd> {
        let pid =
            libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: plain syscall with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd from the kernel.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
    fn enable_bpf_stats(&self) -> io::Result<OwnedFd> {
        aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| e.io_error)
    }
    fn set_output(&self, fd: &OwnedFd, to: &OwnedFd) -> io::Result<()> {
        ioctl(
            fd,
            PERF_EVENT_IOC_SET_OUTPUT,
            to.as_raw_fd() as libc::c_ulong,
        )
    }
    fn event_id(&self, fd: &OwnedFd) -> io::Result<u64> {
        let mut id = 0u64;
        ioctl(fd, PERF_EVENT_IOC_ID, &raw mut id as libc::c_ulong)?;
        Ok(id)
    }
}

/// The kernel filter's allow-lists (the eBPF maps `ALLOWED_TGIDS`, `ALLOWED_CGROUPS`;
/// cpi-user/src/collect/filter.rs), as a trait: [`BpfFilterMaps`] updates the loaded
/// object's, `fake::FakeMaps` records the calls in unit tests.
pub(crate) trait FilterMaps {
    /// Keep the samples of process `tgid`.
    fn allow_tgid(&mut self, tgid: u32) -> io::Result<()>;
    /// Stop keeping process `tgid` (it exited).
    fn remove_tgid(&mut self, tgid: u32) -> io::Result<()>;
    /// Keep the samples of cgroup `id` and its descendants.
    fn allow_cgroup(&mut self, id: u64) -> io::Result<()>;
    /// Stop keeping cgroup `id`.
    fn remove_cgroup(&mut self, id: u64) -> io::Result<()>;
    /// The levels of the cgroup tree the program compares (`KernelConfig::cgroup_levels`).
    fn set_cgroup_levels(&mut self, levels: u32) -> io::Result<()>;
    /// The allow-lists a sample must pass (`KernelConfig::filter`).
    fn set_filter_bits(&mut self, bits: u32) -> io::Result<()>;
    /// The processes kept by tgid now, those the eBPF program added included.
    fn tgids_held(&mut self) -> io::Result<Vec<u32>>;
}

/// The loaded eBPF object's filter maps.
pub(crate) struct BpfFilterMaps<'a>(pub &'a mut aya::Ebpf);

/// The loaded eBPF object's hash map `name`.
fn hash_map<'b, K: aya::Pod, V: aya::Pod>(
    bpf: &'b mut aya::Ebpf,
    name: &str,
) -> io::Result<aya::maps::HashMap<&'b mut aya::maps::MapData, K, V>> {
    let map = bpf
        .map_mut(name)
        .ok_or_else(|| io::Error::other(format!("map {name} missing from the object")))?;
    aya::maps::HashMap::try_from(map).map_err(io::Error::other)
}

impl FilterMaps for BpfFilterMaps<'_> {
    fn allow_tgid(&mut self, tgid: u32) -> io::Result<()> {
        hash_map::<u32, u8>(self.0, "ALLOWED_TGIDS")?
            .insert(tgid, 1, 0)
            .map_err(io::Error::other)
    }
    fn remove_tgid(&mut self, tgid: u32) -> io::Result<()> {
        hash_map::<u32, u8>(self.0, "ALLOWED_TGIDS")?
            .remove(&tgid)
            .map_err(io::Error::other)
    }
    fn allow_cgroup(&mut self, id: u64) -> io::Result<()> {
        hash_map::<u64, u8>(self.0, "ALLOWED_CGROUPS")?
            .insert(id, 1, 0)
            .map_err(io::Error::other)
    }
    fn remove_cgroup(&mut self, id: u64) -> io::Result<()> {
        hash_map::<u64, u8>(self.0, "ALLOWED_CGROUPS")?
            .remove(&id)
            .map_err(io::Error::other)
    }
    fn set_cgroup_levels(&mut self, levels: u32) -> io::Result<()> {
        self.update_config(|c| c.cgroup_levels = levels)
    }
    fn set_filter_bits(&mut self, bits: u32) -> io::Result<()> {
        self.update_config(|c| c.filter = bits)
    }
    fn tgids_held(&mut self) -> io::Result<Vec<u32>> {
        hash_map::<u32, u8>(self.0, "ALLOWED_TGIDS")?
            .keys()
            .collect::<Result<_, _>>()
            .map_err(io::Error::other)
    }
}

impl BpfFilterMaps<'_> {
    /// Changes one field of the program's config: it reads the config whole, each
    /// sample.
    fn update_config(
        &mut self,
        change: impl FnOnce(&mut cpi_common::policy::KernelConfig),
    ) -> io::Result<()> {
        let map = self
            .0
            .map_mut("CONFIG")
            .ok_or_else(|| io::Error::other("map CONFIG missing from the object"))?;
        let mut config: aya::maps::Array<_, cpi_common::policy::KernelConfig> =
            aya::maps::Array::try_from(map).map_err(io::Error::other)?;
        let mut c = config.get(&0, 0).map_err(io::Error::other)?;
        change(&mut c);
        config.set(0, c, 0).map_err(io::Error::other)
    }
}

/// Per-process caps on the user-stack copy (the eBPF map `STACK_CAPS`;
/// cpi-user/src/collect/stack_caps.rs), as a trait: [`BpfStackCaps`] updates the loaded
/// object's, a map in memory stands in for it in unit tests.
pub(crate) trait StackCapMap {
    /// Copy at most `bytes` of process `tgid`'s stack.
    fn set_cap(&mut self, tgid: u32, bytes: u32) -> io::Result<()>;
    /// Copy all a record holds of process `tgid`'s stack.
    fn remove_cap(&mut self, tgid: u32) -> io::Result<()>;
}

/// The loaded eBPF object's `STACK_CAPS`.
pub(crate) struct BpfStackCaps<'a>(pub &'a mut aya::Ebpf);

impl StackCapMap for BpfStackCaps<'_> {
    fn set_cap(&mut self, tgid: u32, bytes: u32) -> io::Result<()> {
        hash_map::<u32, u32>(self.0, "STACK_CAPS")?
            .insert(tgid, bytes, 0)
            .map_err(io::Error::other)
    }
    fn remove_cap(&mut self, tgid: u32) -> io::Result<()> {
        hash_map::<u32, u32>(self.0, "STACK_CAPS")?
            .remove(&tgid)
            .map_err(io::Error::other)
    }
}

/// `CGROUP2_SUPER_MAGIC` (`include/uapi/linux/magic.h`).
const CGROUP2_SUPER_MAGIC: libc::c_long = 0x6367_7270;

/// Whether `path` is on a cgroup2 file system (`statfs`).
pub(crate) fn is_cgroup2(path: &std::path::Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero `statfs` is valid plain data.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs fills a local struct from a valid C string.
    if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as libc::c_long == CGROUP2_SUPER_MAGIC)
}

/// `struct perf_event_attr` (`include/uapi/linux/perf_event.h`), `PERF_ATTR_SIZE_VER8`.
/// Our own definition rather than a binding crate's: the flag word is one `u64` we can
/// build and unit-test bit by bit (no machine here can open a branch-stack event).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfEventAttr {
    /// `PERF_TYPE_*`: hardware, software or raw.
    pub type_: u32,
    /// `PERF_ATTR_SIZE`: which version of the struct the kernel reads.
    pub size: u32,
    /// The event within its type (`PERF_COUNT_*` or a raw vendor code).
    pub config: u64,
    /// `sample_period` (or `sample_freq` with [`flag::FREQ`]).
    pub sample_period: u64,
    /// `PERF_SAMPLE_*` bits: what each sample record holds.
    pub sample_type: u64,
    /// `PERF_FORMAT_*` bits for `read()`; 0 = the count alone ([`PerfSys::read_count`]).
    pub read_format: u64,
    /// The kernel's bitfield word: see [`flag`].
    pub flags: u64,
    /// Records (or bytes, with the watermark flag) between ring-buffer wake-ups.
    pub wakeup_events: u32,
    /// Breakpoint type (unused here).
    pub bp_type: u32,
    /// Event-specific extension of `config` (unused here).
    pub config1: u64,
    /// Event-specific extension of `config1` (unused here).
    pub config2: u64,
    /// `PERF_SAMPLE_BRANCH_*` bits: which branches the branch stack records.
    pub branch_sample_type: u64,
    /// User registers to dump per sample (unused here).
    pub sample_regs_user: u64,
    /// Bytes of user stack to dump per sample (unused here).
    pub sample_stack_user: u32,
    /// Clock for sample times with `use_clockid` (unused here).
    pub clockid: i32,
    /// Registers at the interrupt to dump per sample (unused here).
    pub sample_regs_intr: u64,
    /// AUX-area wake-up watermark (unused here).
    pub aux_watermark: u32,
    /// Deepest call chain recorded (unused here).
    pub sample_max_stack: u16,
    /// Kernel padding; must be zero.
    pub reserved_2: u16,
    /// AUX data per sample (unused here).
    pub aux_sample_size: u32,
    /// Kernel padding; must be zero.
    pub reserved_3: u32,
    /// Value given to the signal handler with `sigtrap` (unused here).
    pub sig_data: u64,
    /// Event-specific extension of `config2` (unused here).
    pub config3: u64,
}

/// `PERF_ATTR_SIZE_VER8`.
pub(crate) const PERF_ATTR_SIZE: u32 = 136;

/// Generic hardware events (`config` is a `PERF_COUNT_HW_*`).
pub(crate) const PERF_TYPE_HARDWARE: u32 = 0;
/// Kernel software events (`config` is a `PERF_COUNT_SW_*`).
pub(crate) const PERF_TYPE_SOFTWARE: u32 = 1;
/// A vendor event code in `config` (e.g. [`crate::profile::events::INTEL_RETIRED_TAKEN`]).
pub(crate) const PERF_TYPE_RAW: u32 = 4;
/// A `PERF_TYPE_HARDWARE` config's bits 63..32 name the PMU it is for (Linux 5.13,
/// `PERF_PMU_TYPE_SHIFT`): what opens `cycles` on a hybrid part's second core PMU.
pub(crate) const PERF_PMU_TYPE_SHIFT: u32 = 32;
/// Core cycles.
pub(crate) const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
/// Retired instructions.
pub(crate) const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
/// CPU time in nanoseconds, driven by an hrtimer: works without a PMU.
pub(crate) const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
/// A software event that counts nothing: it only carries side-band records.
pub(crate) const PERF_COUNT_SW_DUMMY: u64 = 9;

/// Samples carry the interrupted IP.
pub(crate) const PERF_SAMPLE_IP: u64 = 1 << 0;
/// Samples carry pid and tid.
pub(crate) const PERF_SAMPLE_TID: u64 = 1 << 1;
/// Samples carry a timestamp.
pub(crate) const PERF_SAMPLE_TIME: u64 = 1 << 2;
/// Samples carry the period they stand for.
pub(crate) const PERF_SAMPLE_PERIOD: u64 = 1 << 8;
/// Samples carry the branch stack (LBR); needs `branch_sample_type`.
pub(crate) const PERF_SAMPLE_BRANCH_STACK: u64 = 1 << 11;
/// Samples start with their event's id (`PERF_EVENT_IOC_ID`), at a fixed place.
pub(crate) const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;
/// Samples carry the user registers of `sample_regs_user`.
pub(crate) const PERF_SAMPLE_REGS_USER: u64 = 1 << 12;
/// Samples carry `sample_stack_user` bytes of the user stack from its pointer up.
pub(crate) const PERF_SAMPLE_STACK_USER: u64 = 1 << 13;
/// x86-64's `PERF_REG_X86_BP`, `_SP` and `_IP` (arch/x86/include/uapi/asm/perf_regs.h):
/// what the unwinder starts from.
pub(crate) const USER_REGS_BP_SP_IP: u64 = 1 << 6 | 1 << 7 | 1 << 8;

/// Record branches in user mode.
pub const PERF_SAMPLE_BRANCH_USER: u64 = 1 << 0;
/// Record branches in kernel mode.
pub(crate) const PERF_SAMPLE_BRANCH_KERNEL: u64 = 1 << 1;
/// Record every kind of taken branch.
pub const PERF_SAMPLE_BRANCH_ANY: u64 = 1 << 3;
/// Save each entry's `PERF_BR_*` type (Linux 4.14): Intel LBR and AMD LbrExtV2 decode
/// it from the instruction, arch LBR reads it from `LBR_INFO`; AMD BRS refuses it.
pub(crate) const PERF_SAMPLE_BRANCH_TYPE_SAVE: u64 = 1 << 16;

/// Bits of [`PerfEventAttr::flags`] (bitfield order, bit 0 first).
pub mod flag {
    /// Open disabled; enabled later with `PERF_EVENT_IOC_ENABLE`.
    pub(crate) const DISABLED: u64 = 1 << 0;
    /// Children and new threads get the event too.
    pub(crate) const INHERIT: u64 = 1 << 1;
    /// Do not count in kernel mode.
    pub(crate) const EXCLUDE_KERNEL: u64 = 1 << 5;
    /// Do not count in the hypervisor.
    pub(crate) const EXCLUDE_HV: u64 = 1 << 6;
    /// `sample_period` is a frequency the kernel adapts the period to.
    pub const FREQ: u64 = 1 << 10;
    /// Enable at the target's next exec.
    pub(crate) const ENABLE_ON_EXEC: u64 = 1 << 12;
    /// `wakeup_events` counts bytes: the buffer's fd polls readable once that many are
    /// unread.
    pub(crate) const WATERMARK: u64 = 1 << 14;
    /// Side-band records: `PERF_RECORD_MMAP` for executable mappings (with
    /// [`COMM`], [`MMAP2`] and [`COMM_EXEC`], what `collect/sideband.rs` opens).
    pub(crate) const MMAP: u64 = 1 << 8;
    /// `PERF_RECORD_COMM` when a thread's name changes.
    pub const COMM: u64 = 1 << 9;
    /// Mapping records are `PERF_RECORD_MMAP2` (device, inode, build-id).
    pub const MMAP2: u64 = 1 << 23;
    /// Mark COMM records caused by exec.
    pub(crate) const COMM_EXEC: u64 = 1 << 24;
    /// `PERF_RECORD_FORK` and `PERF_RECORD_EXIT`.
    pub(crate) const TASK: u64 = 1 << 13;
}

const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
/// `_IOW('$', 4, __u64)`.
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
/// `_IO('$', 5)`.
const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
/// `_IOR('$', 7, __u64 *)`.
const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
/// `_IOW('$', 8, __u32)`.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

fn perf_event_open(
    attr: &PerfEventAttr,
    pid: libc::pid_t,
    cpu: libc::c_int,
) -> io::Result<OwnedFd> {
    let mut a = *attr;
    a.size = PERF_ATTR_SIZE;
    // SAFETY: `a` is a valid perf_event_attr of the size we declare.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const a,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Raises the soft limit on open files towards the hard one when it is below `want`;
/// returns the soft limit now.
pub(crate) fn raise_fd_limit(want: u64) -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < want && lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: want.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads a local struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
            return Ok(raised.rlim_cur);
        }
    }
    Ok(lim.rlim_cur)
}

/// CPU time the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`: a system call, ≈ 1.3 µs
/// on the 2-vCPU VM, where `Instant::now` is 50 ns); zero if it cannot be read.
pub(crate) fn thread_cpu_time() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`, which stamps the
/// BPF programs' samples; zero if it cannot be read.
pub(crate) fn monotonic_ns() -> u64 {
    u64::try_from(clock(libc::CLOCK_MONOTONIC).as_nanos()).unwrap_or(u64::MAX)
}

/// `clock_gettime(id)`; zero if it cannot be read.
fn clock(id: libc::clockid_t) -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills a local struct.
    if unsafe { libc::clock_gettime(id, &raw mut t) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Restores the default action of `sig` (the agent, after its first SIGTERM/SIGINT, so
/// that a second one ends it at once).
pub fn default_signal_action(sig: libc::c_int) {
    // SAFETY: SIG_DFL is always a valid disposition.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

fn ioctl(fd: &impl AsRawFd, req: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: perf ioctls with an integer or pointer-to-u64 argument, checked below.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The plain-data record at the start of `bytes` (any alignment); `None` when `bytes`
/// is shorter.
pub(crate) fn read_plain<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    let bytes = bytes.get(..size_of::<T>())?;
    // SAFETY: `bytes` holds a whole T, and any bit pattern is a valid `Pod`.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// The bytes of a plain-data record (the wire records have no padding:
/// cpi-common/src/wire.rs checks their sizes).
pub(crate) fn bytes_of<T: aya::Pod>(v: &T) -> &[u8] {
    // SAFETY: `v` is a whole T, viewed for as long as it is borrowed.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// A kernel timer (`timerfd`, `CLOCK_MONOTONIC`) the runtime's reactor watches: one
/// wake-up per expiry. A tokio timer more than 64 ms out sits in its wheel's coarser
/// level and costs a wake-up more to move down (a tokio interval re-arms one at each
/// tick): with the agent's 100 ms drain and its period re-draws, about a third of the
/// collector's wake-ups did nothing (BENCHMARKS.md, "Agent under churn").
pub(crate) struct Timer(tokio::io::unix::AsyncFd<OwnedFd>);

impl Timer {
    /// A timer, disarmed.
    pub(crate) fn new() -> io::Result<Timer> {
        let flags = libc::TFD_NONBLOCK | libc::TFD_CLOEXEC;
        // SAFETY: no pointers; a non-negative result is a new descriptor.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        watch(unsafe { OwnedFd::from_raw_fd(fd) }).map(Timer)
    }

    /// Expires `after` from now (at least a nanosecond: zero would disarm it), then every
    /// `every` when given; `after` `None` disarms it.
    pub(crate) fn set(&self, after: Option<Duration>, every: Option<Duration>) -> io::Result<()> {
        let first = after.map_or(Duration::ZERO, |a| a.max(Duration::from_nanos(1)));
        let spec = libc::itimerspec {
            it_interval: timespec(every.unwrap_or_default()),
            it_value: timespec(first),
        };
        // SAFETY: a timerfd and a local itimerspec; the old setting is not asked for.
        let r = unsafe {
            libc::timerfd_settime(self.0.as_raw_fd(), 0, &raw const spec, std::ptr::null_mut())
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next expiry (at once if one came since the last), however many passed.
    pub(crate) async fn expired(&self) -> io::Result<()> {
        loop {
            let mut ready = self.0.readable().await?;
            let read = ready.try_io(|fd| {
                let mut expiries = 0u64;
                // SAFETY: reads at most 8 bytes into a local u64.
                let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut expiries).cast(), 8) };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
            // `Err`: it would block (its readiness cleared): wait again.
            if let Ok(result) = read {
                return result;
            }
        }
    }
}

/// `d` as a `timespec`.
fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// An owned descriptor watched by the runtime's reactor for readiness.
pub(crate) fn watch(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns `fd`: open, and the same description, until it drops.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// A copy of `fd` (`dup`) watched for readiness: the same buffer's, closed with the
/// AsyncFd whatever the lifetime of `fd`'s owner.
pub(crate) fn watch_copy(
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    watch(fd.try_clone_to_owned()?)
}

/// aya's ring buffer watched for readiness.
pub(crate) fn watch_ring(
    ring: aya::maps::RingBuf<aya::maps::MapData>,
) -> io::Result<tokio::io::unix::AsyncFd<aya::maps::RingBuf<aya::maps::MapData>>> {
    // SAFETY: the ring buffer owns its map's fd, open until the AsyncFd drops it.
    unsafe { tokio::io::unix::AsyncFd::register(ring) }.map_err(io::Error::from)
}

/// Maps a perf event's ring buffer (`len` bytes: the control page plus a power-of-two
/// number of data pages) read-write, as perf does.
pub(crate) fn mmap_ring(fd: &OwnedFd, len: usize) -> io::Result<std::ptr::NonNull<u8>> {
    // SAFETY: a fresh shared mapping of the event's buffer; the kernel checks the size.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    std::ptr::NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Unmaps what [`mmap_ring`] mapped.
///
/// # Safety
/// `p` and `len` must come from one [`mmap_ring`] call, and nothing may use the
/// mapping afterwards.
unsafe fn munmap_ring(p: std::ptr::NonNull<u8>, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { libc::munmap(p.as_ptr().cast(), len) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn attr_layout_matches_uapi() {
        assert_eq!(size_of::<PerfEventAttr>(), PERF_ATTR_SIZE as usize);
        assert_eq!(offset_of!(PerfEventAttr, config1), 56); // VER0 = 64 ends after it
        assert_eq!(offset_of!(PerfEventAttr, branch_sample_type), 72);
        assert_eq!(offset_of!(PerfEventAttr, sample_regs_intr), 96);
        assert_eq!(offset_of!(PerfEventAttr, sig_data), 120);
    }

    /// The one place placements become `perf_event_open`'s numbers and flags.
    #[test]
    fn placements_are_the_kernels_pid_cpu_and_flags() {
        assert_eq!(Placement::Me.pid_cpu(), (0, -1));
        assert_eq!(Placement::Thread { tid: 42 }.pid_cpu(), (42, -1));
        assert_eq!(Placement::Cpu { cpu: 3 }.pid_cpu(), (-1, 3));
        let both = Placement::ThreadOnCpu { tid: 42, cpu: 3 };
        assert_eq!(both.pid_cpu(), (42, 3));
        assert_eq!(both.to_string(), "pid 42 on cpu 3");
        assert_eq!(Follow::Placed.flags(), 0);
        assert_eq!(Follow::Children.flags(), flag::INHERIT);
        assert_eq!(
            Follow::ChildrenFromExec.flags(),
            flag::INHERIT | flag::ENABLE_ON_EXEC
        );
    }

    #[test]
    fn ioctl_numbers_follow_the_ioc_encoding() {
        // _IOW(type, nr, size) = 1 << 30 | size << 16 | type << 8 | nr.
        let iow = |nr: libc::c_ulong, size: libc::c_ulong| {
            (1 << 30) | (size << 16) | ((b'$' as libc::c_ulong) << 8) | nr
        };
        assert_eq!(PERF_EVENT_IOC_PERIOD, iow(4, 8));
        assert_eq!(PERF_EVENT_IOC_SET_BPF, iow(8, 4));
        // _IOR: direction 2; _IO: none.
        assert_eq!(PERF_EVENT_IOC_ID, (2 << 30) | (8 << 16) | (0x24 << 8) | 7);
        assert_eq!(PERF_EVENT_IOC_SET_OUTPUT, (0x24 << 8) | 5);
    }
}
