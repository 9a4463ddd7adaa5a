//! Collection: brings wire samples home from the kernel, as a [`Session`]:
//!
//! open: validate the target ([`target`]), probe ([`caps`]), load the eBPF programs,
//! walk the mode ladder ([`ladder`]: the mode's events ([`events`]) opened with our own
//! `perf_event_open` and attached with `PERF_EVENT_IOC_SET_BPF`, through [`sys`]),
//! enable → run: drain the BPF ring buffer with tokio into a per-pid [`SampleSet`]
//! ([`drain`]) while re-drawing periods, handing out windows → stop on duration, target
//! exit or SIGINT/SIGTERM → finish: disable, drain to the end, end the command, losses.

pub mod caps;
pub mod diagnose;
pub mod drain;
pub mod events;
pub mod filter;
pub mod ladder;
pub(crate) mod perf_ring;
pub(crate) mod processes;
pub mod record;
pub(crate) mod session;
pub(crate) mod sideband;
pub(crate) mod stack_caps;
pub mod sys;
pub mod target;

use std::io;
use std::time::Duration;

use aya::maps::{Array, PerCpuArray};
use aya::programs::{PerfEvent, RawTracePoint};
use aya::Ebpf;
use cpi_common::policy::{KernelConfig, Perturbation};
use cpi_common::wire::{StackMode, COUNTERS};

use crate::profile::{RunInfo, SampleSet};
use events::{EventSpec, Rate};
pub use filter::Filter;
pub use processes::ProcessChanges;
pub use record::{record, RecordOptions, Recorded};
pub use session::{collect, Session};
pub use target::Target;

/// A status line for the user (the mode line, step-downs, notes), as `notify` callbacks
/// get it: `brief` fits an 80-column terminal, `full` says why too (`-v`, the agent's
/// log). Shown as `full`.
#[derive(Clone, Copy, Debug)]
pub struct Notice<'a> {
    /// The line on its own.
    pub brief: &'a str,
    /// The line with its reasons.
    pub full: &'a str,
}

impl<'a> Notice<'a> {
    /// A line with nothing more to say.
    pub fn plain(line: &'a str) -> Self {
        Notice {
            brief: line,
            full: line,
        }
    }
}

impl std::fmt::Display for Notice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.full)
    }
}

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cpi-ebpf"));

/// The eBPF object [`load`] loads, byte for byte (an ELF file; empty when built with
/// `AYA_BUILD_SKIP=1`): for harnesses that run the shipped programs elsewhere
/// (tests/src/bpf_vm.rs runs them in an interpreter on real branch stacks).
pub fn bpf_object() -> &'static [u8] {
    EBPF_OBJECT
}

/// Why collection could not start or go on; each prints as one line.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// Not allowed to open perf events or load BPF; the text says what is missing
    /// ([`caps`]).
    #[error("{0}")]
    NotPrivileged(String),
    /// `--pid` names no process.
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    /// `--pid` names a process that has exited but is not reaped (a zombie): no thread
    /// left to sample.
    #[error("pid {pid} has exited: a zombie its parent (pid {parent}) has not reaped; nothing to profile")]
    Exited {
        /// The process.
        pid: u32,
        /// Its parent, which has not waited for it.
        parent: u32,
    },
    /// `--cgroup` names no cgroup v2 directory (filter.rs).
    #[error("{} is not a cgroup v2 directory", .0.display())]
    NotCgroup(std::path::PathBuf),
    /// The command to start is not on `PATH` or not a file.
    #[error("command not found: {0}")]
    CommandNotFound(String),
    /// The command to start exists but cannot be executed.
    #[error("not executable: {0}")]
    NotExecutable(String),
    /// Forking or exec'ing the command failed.
    #[error("starting {cmd}: {cause}")]
    Spawn {
        /// The command as given.
        cmd: String,
        /// What the OS said.
        cause: io::Error,
    },
    /// No pid, no `--system-wide` and no command.
    #[error("nothing to profile: give --pid PID, --system-wide or -- CMD")]
    NoTarget,
    /// The binary was built without the eBPF object (`build.rs`).
    #[error(
        "this cpi-bpf was built with AYA_BUILD_SKIP=1 and holds no eBPF object; rebuild without it"
    )]
    NoObject,
    // Causes are part of the one-line message, not `source()`: callers print `{:#}`
    // chains, which would repeat them.
    /// The kernel lacks a BPF feature every mode needs (`caps::KernelFeatures`).
    #[error("{0}")]
    Kernel(String),
    /// The kernel's verifier refused a program ([`load`]): its last words in the line,
    /// the whole log in a file named there.
    #[error("the kernel's verifier refused BPF program {program} ({cause}): {last}; {log}")]
    Verifier {
        /// The program's name in the object.
        program: &'static str,
        /// What `BPF_PROG_LOAD` returned.
        cause: io::Error,
        /// The log's last line that says what is wrong.
        last: String,
        /// Where the full log went, or why it could not be written.
        log: String,
    },
    /// The loader refused the eBPF object ([`load`]).
    #[error("loading the eBPF programs{hint}: {cause}")]
    Load {
        /// A likely reason, such as missing kernel BTF, or empty.
        hint: &'static str,
        /// What aya said.
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `perf_event_open` failed for an event the mode needs ([`ladder`]).
    #[error("opening {event} on {on}: {cause}")]
    Open {
        /// The event's name ([`events::EventSpec`]).
        event: String,
        /// Where: the pid or CPU it was opened on.
        on: String,
        /// The errno; the ladder steps down on the ones a missing PMU gives.
        cause: io::Error,
    },
    /// `PERF_EVENT_IOC_SET_BPF` failed.
    #[error("attaching the BPF program to {event}: {cause}")]
    Attach {
        /// The event's name ([`events::EventSpec`]).
        event: String,
        /// The errno.
        cause: io::Error,
    },
    /// A sampling rate or period out of range ([`events`]).
    #[error("{0}")]
    Range(String),
    /// `RLIMIT_NOFILE` is below what one event per CPU and kind needs, even raised to
    /// the hard limit.
    #[error(
        "too few open files allowed: about {need} needed, the limit is {limit} (raise `ulimit -n`)"
    )]
    TooFewFiles {
        /// File descriptors the session would open.
        need: u64,
        /// The soft limit after raising it as far as allowed.
        limit: u64,
    },
    /// Any other I/O failure (ring buffer, `/proc`, signals).
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Samples per second per busy CPU when none is asked for (a prime-ish odd rate, so
/// it does not beat with 1 kHz timer ticks).
pub const DEFAULT_FREQUENCY: u64 = 999;

/// How to collect.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    /// What to profile.
    pub target: Target,
    /// Stop after this long (else on target exit or a signal).
    pub duration: Option<Duration>,
    /// Samples per second per busy CPU, or a fixed period ([`events::Rate`]).
    pub rate: Rate,
    /// Sample kernel-mode IPs and branches too.
    pub include_kernel: bool,
    /// Which layers of the period policy run ([`cpi_common::policy`]).
    pub perturbation: Perturbation,
    /// In-kernel thinning factor (1 = off) when the kernel layer runs.
    pub thinning: u32,
    /// How often the user layer checks which events are due a re-draw
    /// ([`cpi_common::policy::PeriodPolicy::redraw_after`]).
    pub redraw_every: Duration,
    /// BPF ring buffer size (a power of two ≥ the page size).
    pub ring_bytes: u32,
    /// Ranges per branch sample (the range window); `None`: the branch-record depth
    /// − 1 ([`cpi_common::policy::range_window`]).
    pub window: Option<usize>,
    /// Sample `cpu-clock` too in the hardware modes ([`events::plan`]): CPU seconds in
    /// every mode, for the agent's `cpi_bpf_cpu_seconds_total`.
    pub cpu_time: bool,
    /// How often the ring buffer is drained without a wake-up (the kernel side wakes us
    /// only when it is a quarter full): sooner reads a short-lived process's `/proc`
    /// while it lives; later wakes the collector less ([`DRAIN_EVERY`]).
    pub drain_every: Duration,
    /// Take each sample's call stack (kernel frames, and the user stack copied for
    /// unwinding: cpi-user/src/unwind/); off, records stay leaf-only and cheaper.
    pub stacks: bool,
    /// What the stacks may hold in memory.
    pub stack_memory: StackMemory,
}

/// Memory bounds of call stacks ([`CollectOptions::stacks`]); past each, least recently
/// used out, and nothing silent (evicted stacks' samples are counted as
/// `stacks_evicted` and kept in a `[dropped]` path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackMemory {
    /// The stacks of one window, all processes together
    /// ([`crate::profile::SampleSet::stack_bytes`]).
    pub window_bytes: usize,
    /// The unwind sections of the files being unwound (cpi-user/src/unwind/).
    pub unwind_bytes: u64,
}

impl Default for StackMemory {
    fn default() -> Self {
        StackMemory {
            window_bytes: crate::profile::stack::DEFAULT_STACK_BYTES,
            unwind_bytes: crate::unwind::DEFAULT_BYTE_BOUND,
        }
    }
}

/// The one-shot command's drain interval: a process living 25 ms is read while it lives.
pub const DRAIN_EVERY: Duration = Duration::from_millis(25);

/// The most ring-buffer space one sample takes: the longest fixed record (a branch sample
/// with every entry, 824 bytes), its stack header, every kernel frame and the whole user
/// stack copy (cpi-common/src/wire.rs), plus the ring's 8-byte record header: 9,568 bytes.
/// The mean is lower (4.2–8.3 KB measured with stacks: BENCHMARKS.md, "Why records are
/// built in a scratch buffer"); sizing with the most keeps [`ring_holds`] a lower bound.
pub(crate) const MAX_RECORD_BYTES: u64 = (std::mem::size_of::<cpi_common::wire::BranchSample>()
    + std::mem::size_of::<cpi_common::wire::StackHeader>()
    + cpi_common::wire::MAX_KERNEL_FRAMES * 8
    + cpi_common::wire::MAX_STACK_BYTES
    + 8) as u64;

/// How long a ring of `ring_bytes` takes to fill when `cpus` CPUs each send `frequency`
/// samples a second of `MAX_RECORD_BYTES`: the longest the collector may leave it
/// undrained without losing a sample. A drain interval (or a wake-up latency) must stay
/// well under it; the default rings are sized from it ([`default_ring_mib`]).
pub fn ring_holds(ring_bytes: u64, frequency: u64, cpus: u64) -> Duration {
    let per_second = MAX_RECORD_BYTES * frequency.max(1) * cpus.max(1);
    Duration::from_secs_f64(ring_bytes as f64 / per_second as f64)
}

/// Largest default ring buffer, MiB (`--ring-buffer-mib` sets more).
pub const MAX_DEFAULT_RING_MIB: u32 = 16;

/// What the one-shot command's default ring holds ([`default_ring_mib`]): 8 MiB on 2
/// CPUs at 999 Hz, 16 on 4 or more. It drains every [`DRAIN_EVERY`], but it unwinds
/// each record as it drains and shares the CPUs with what it profiles at the full rate
/// (the agent's governor lowers its rate; the one-shot's does not change): system-wide
/// at 999 Hz beside other builds (load 9 on 2 vCPUs), 4 MiB (220 ms) lost 194 and 431
/// of 19,000 samples in 10 s, 8 MiB (440 ms) none in eight runs (BENCHMARKS.md, "The
/// one-shot's ring").
pub const ONE_SHOT_RING_HOLDS: Duration = Duration::from_millis(400);

/// A default `--ring-buffer-mib`: the smallest power of two, 1 to
/// [`MAX_DEFAULT_RING_MIB`], whose ring [`ring_holds`] `holds` of samples at `frequency`
/// on `cpus` CPUs. The one-shot command holds [`ONE_SHOT_RING_HOLDS`], the agent
/// `RING_HOLDS` (cpi-agent/src/config.rs).
pub fn default_ring_mib(holds: Duration, frequency: u64, cpus: u64) -> u32 {
    let mut mib = 1u32;
    while mib < MAX_DEFAULT_RING_MIB && ring_holds(u64::from(mib) << 20, frequency, cpus) < holds {
        mib *= 2;
    }
    mib
}

/// Largest `--ring-buffer-mib`: 1 GiB, whose byte count still fits
/// [`CollectOptions::ring_bytes`].
pub(crate) const MAX_RING_MIB: u32 = 1024;

/// A `--ring-buffer-mib` the kernel would refuse (BPF ring buffers are a power of two of
/// pages) or larger than `MAX_RING_MIB`.
#[derive(Debug, thiserror::Error)]
#[error("must be a power of two between 1 and {MAX_RING_MIB}")]
pub struct RingSizeError;

/// The ring's size in bytes for `mib` MiB (`--ring-buffer-mib` of the one-shot command
/// and the agent), or why the size is refused.
pub fn ring_bytes(mib: u32) -> Result<u32, RingSizeError> {
    if mib.is_power_of_two() && mib <= MAX_RING_MIB {
        Ok(mib << 20)
    } else {
        Err(RingSizeError)
    }
}

/// Why collection stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `--duration` elapsed.
    Duration,
    /// Every target process exited.
    TargetExit,
    /// SIGINT or SIGTERM, by name.
    Signal(&'static str),
    /// The caller finished the session before any other stop condition.
    Finished,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Duration => f.write_str("duration reached"),
            StopReason::TargetExit => f.write_str("target exited"),
            StopReason::Signal(name) => write!(f, "{name} received"),
            StopReason::Finished => f.write_str("finished"),
        }
    }
}

/// What a window (or a whole one-shot run) brought home.
#[derive(Debug)]
pub struct Collected {
    /// The window's samples, per process.
    pub set: SampleSet,
    /// Event sample counts, losses and duration of this window only.
    pub run: RunInfo,
    /// `None` for a window cut by [`Session::run_until`]'s deadline.
    pub stop: Option<StopReason>,
    /// Exit status of the command cpi-bpf started (in the last window).
    pub command_status: Option<i32>,
    /// Processes the collector still holds state for (name, maps, open files) after
    /// this window: those of this window and the live ones of earlier windows.
    pub held_processes: usize,
    /// Processes this window ended or replaced (the collector is their one tracker).
    pub changes: ProcessChanges,
    /// What the collector's unwinder holds on the heap for later windows (its copies of
    /// unwind sections within [`StackMemory::unwind_bytes`]).
    pub unwind_heap: crate::unwind::UnwindHeap,
    /// Evictions and reopens of the collector's captured files since start
    /// (cpi-user/src/procmap/captured.rs), read after analysis.
    pub captured: crate::procmap::CaptureCounter,
}

/// Loads the eBPF object with its ring buffer sized and its config written, and of its
/// programs only `programs` (`ladder::programs_from`): a kernel that lacks a helper one
/// program calls still runs the modes that do not need it.
pub fn load(
    ring_bytes: u32,
    config: KernelConfig,
    stacks: StackMode,
    cgroup_ancestors: bool,
    btf: bool,
    programs: &[&'static str],
) -> Result<Ebpf, CollectError> {
    if EBPF_OBJECT.is_empty() {
        return Err(CollectError::NoObject);
    }
    let hint = if btf {
        ""
    } else {
        " (no kernel BTF: /sys/kernel/btf/vmlinux missing)"
    };
    let load_err =
        |e: Box<dyn std::error::Error + Send + Sync>| CollectError::Load { hint, cause: e };
    let mut bpf = aya::EbpfLoader::new()
        .map_max_entries("SAMPLES", ring_bytes)
        .override_global("STACK_MODE", &(stacks as u32), true)
        .override_global("CGROUP_ANCESTORS", &(cgroup_ancestors as u32), true)
        .load(EBPF_OBJECT)
        .map_err(|e| load_err(e.into()))?;
    for &name in programs {
        let prog: &mut PerfEvent = bpf
            .program_mut(name)
            .ok_or_else(|| load_err(format!("program {name} missing from the object").into()))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| load_err(e.into()))?;
        prog.load().map_err(|e| match e {
            aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            } => verifier_error(name, io_error, &verifier_log.to_string()),
            e => load_err(e.into()),
        })?;
    }
    let mut cfg: Array<_, KernelConfig> = Array::try_from(
        bpf.map_mut("CONFIG")
            .ok_or_else(|| load_err("map CONFIG missing".into()))?,
    )
    .map_err(|e| load_err(e.into()))?;
    cfg.set(0, config, 0).map_err(|e| load_err(e.into()))?;
    Ok(bpf)
}

/// A verifier refusal as one line: the log's verdict (its last line other than the
/// statistics the kernel appends), and the whole log written to a new file in the temp
/// directory, never to the screen (screens of it hid the one line that mattered).
fn verifier_error(program: &'static str, cause: io::Error, log: &str) -> CollectError {
    let last = log
        .lines()
        .map(str::trim)
        .rfind(|l| {
            !l.is_empty()
                && !l.starts_with("processed ")
                && !l.starts_with("verification time")
                && !l.starts_with("stack depth")
        })
        .unwrap_or("the verifier gave no log")
        .to_string();
    let path = std::env::temp_dir().join(format!(
        "cpi-bpf-verifier-{}-{program}.log",
        std::process::id()
    ));
    // create_new: never through a link or over a file someone left there.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, log.as_bytes()));
    let log = match written {
        Ok(()) => format!("the full log is in {}", path.display()),
        Err(e) => format!(
            "the full log could not be written to {}: {e}",
            path.display()
        ),
    };
    CollectError::Verifier {
        program,
        cause,
        last,
        log,
    }
}

/// The raw tracepoints through which the eBPF program follows a process tree
/// (`FILTER_FOLLOW`), by program name.
const FOLLOW_PROGRAMS: [(&str, &str); 2] = [
    ("follow_fork", "task_newtask"),
    ("follow_exit", "sched_process_exit"),
];

/// Loads and attaches the programs that follow the filter's process tree in the kernel
/// (cpi-ebpf `follow_fork`, `follow_exit`): attached before the target's events open
/// and before a command starts, so no fork of the target goes unseen. They stay
/// attached as long as `bpf` lives.
pub(crate) fn follow_forks(bpf: &mut Ebpf) -> Result<(), CollectError> {
    for (name, tracepoint) in FOLLOW_PROGRAMS {
        let load_err = |cause: Box<dyn std::error::Error + Send + Sync>| CollectError::Load {
            hint: "",
            cause: format!("{name} on raw tracepoint {tracepoint}: {cause}").into(),
        };
        let prog: &mut RawTracePoint = bpf
            .program_mut(name)
            .ok_or_else(|| load_err("missing from the object".into()))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| load_err(e.into()))?;
        prog.load().map_err(|e| match e {
            aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            } => verifier_error(name, io_error, &verifier_log.to_string()),
            e => load_err(e.into()),
        })?;
        prog.attach(tracepoint).map_err(|e| load_err(e.into()))?;
    }
    Ok(())
}

/// Kernel counters summed over CPUs, indexed by [`cpi_common::wire::Counter`].
pub fn read_counters(bpf: &Ebpf) -> [u64; COUNTERS as usize] {
    let mut out = [0u64; COUNTERS as usize];
    let Some(map) = bpf.map("COUNTERS") else {
        return out;
    };
    let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else {
        return out;
    };
    for (i, slot) in out.iter_mut().enumerate() {
        if let Ok(v) = arr.get(&(i as u32), 0) {
            *slot = v.iter().sum();
        }
    }
    out
}

/// Opens `spec` on the calling process (disabled) and, given a loaded object, attaches
/// its program: what `cpi-bpf doctor` uses to tell what this machine can sample.
pub(crate) fn try_event(spec: &EventSpec, bpf: Option<&Ebpf>) -> Result<(), CollectError> {
    let attach = |name: &'static str| match bpf {
        Some(bpf) => ladder::program_fd(bpf, name),
        None => Ok(None),
    };
    ladder::open_attached(
        &sys::Linux,
        spec,
        (sys::Placement::Me, sys::Follow::Placed),
        &attach,
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rings_are_the_smallest_power_of_two_that_holds_long_enough() {
        assert_eq!(MAX_RECORD_BYTES, 9_568);
        // The one-shot, 2 CPUs at 999 Hz: 9,568 B × 999 /s × 2 × 0.4 s = 7.3 MiB.
        let one_shot = |hz, cpus| default_ring_mib(ONE_SHOT_RING_HOLDS, hz, cpus);
        assert_eq!(one_shot(999, 2), 8);
        assert_eq!(one_shot(1999, 2), 16);
        assert_eq!(one_shot(99, 2), 1);
        assert_eq!(one_shot(999, 64), MAX_DEFAULT_RING_MIB);
        for holds in [ONE_SHOT_RING_HOLDS, Duration::from_millis(200)] {
            for (hz, cpus) in [(999, 1), (999, 2), (499, 3), (999, 8), (19, 2)] {
                let mib = default_ring_mib(holds, hz, cpus);
                let held = |m: u32| ring_holds(u64::from(m) << 20, hz, cpus);
                let case = format!("{holds:?} at {hz} Hz × {cpus}: {mib} MiB");
                assert!(mib == MAX_DEFAULT_RING_MIB || held(mib) >= holds, "{case}");
                assert!(mib == 1 || held(mib / 2) < holds, "{case}");
            }
        }
    }

    #[test]
    fn ring_sizes_are_powers_of_two_up_to_a_gib() {
        assert_eq!(ring_bytes(1).unwrap(), 1 << 20);
        assert_eq!(ring_bytes(MAX_RING_MIB).unwrap(), 1 << 30);
        for bad in [0, 3, 24, 2 * MAX_RING_MIB, u32::MAX] {
            let e = ring_bytes(bad).unwrap_err().to_string();
            assert_eq!(e, "must be a power of two between 1 and 1024", "{bad}");
        }
    }

    #[test]
    fn a_verifier_refusal_is_one_line_and_the_log_goes_to_a_file() {
        let log = "0: (85) call unknown#176\ninvalid func unknown#176\n\
                   processed 112 insns (limit 1000000)\n";
        let err = verifier_error(
            "branch_sample_test",
            io::Error::from_raw_os_error(libc::EINVAL),
            log,
        );
        let line = err.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("the kernel's verifier refused BPF program branch_sample_test (")
                && line.contains("): invalid func unknown#176; the full log is in "),
            "{line}"
        );
        let path = line.rsplit("the full log is in ").next().unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), log);
        // A second refusal in the same process finds the file there: never overwritten.
        let again = verifier_error("branch_sample_test", io::Error::other("x"), "other");
        assert!(
            again.to_string().contains("could not be written"),
            "{again}"
        );
        assert_eq!(std::fs::read_to_string(path).unwrap(), log);
        std::fs::remove_file(path).unwrap();
    }
}
