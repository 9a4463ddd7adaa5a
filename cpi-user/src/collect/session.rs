//! The collector [`Session`]: open (validate, probe, load, walk the ladder, enable) →
//! run until a deadline or a stop condition, handing out windows of samples while
//! collection goes on → finish (disable, drain, end the command). The one-shot command
//! is one window ([`collect`]); the always-on agent cuts many.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use aya::Ebpf;
use cpi_common::policy::{self, KernelConfig, Rng, Thinning};
use cpi_common::wire::{Counter, EventRole, SampleHeader, COUNTERS, MAX_FILTER_TGIDS};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::caps::{Capabilities, KernelFeatures, Processor};
use super::drain::Drain;
use super::events::{self, EventSpec, Rate};
use super::filter::KernelFilter;
use super::ladder::{self, OpenEvent};
use super::perf_ring::SampleRings;
use super::sideband::SidebandReader;
use super::sys::{
    self, BpfFilterMaps, BpfStackCaps, Follow, Linux, PerfSys, Placement, Placements,
};
use super::target::{self, Child, Target};
use super::Notice;
use super::{load, read_counters, CollectError, CollectOptions, Collected, StopReason};
use crate::profile::model::{EventInfo, EventUnit, LossReport};
use crate::profile::{Mode, RunInfo};

mod redraw;
mod unprivileged;

use redraw::Redraw;

/// How long a started command gets to end after SIGTERM before it is killed.
pub(crate) const KILL_AFTER: Duration = Duration::from_secs(2);

/// The longest the ring goes undrained without a wake-up ([`Live::poll_every`]): a
/// process living a second is still read from `/proc` while it lives.
const MAX_DRAIN_EVERY: Duration = Duration::from_secs(1);

/// An open collection. Fields drop in order: everything registered with the runtime
/// goes before it.
///
/// Profiling a command in one-second windows, each analysed while the next collects
/// (needs root or `CAP_BPF` + `CAP_PERFMON`, hence `no_run`):
///
/// ```no_run
/// use std::time::{Duration, Instant};
///
/// use cpi_user::collect::events::{nominal_core_hz, Rate};
/// use cpi_user::collect::{CollectOptions, Session, StackMemory, Target, DEFAULT_FREQUENCY};
/// use cpi_user::profile::{analyze, AnalysisOptions};
/// use cpi_common::policy::{DEFAULT_PERTURBATION, DEFAULT_THINNING};
///
/// let opts = CollectOptions {
///     target: Target::Command(vec!["gzip".into(), "-9".into(), "big.tar".into()]),
///     duration: Some(Duration::from_secs(10)),
///     rate: Rate { frequency: DEFAULT_FREQUENCY, period: None, core_hz: nominal_core_hz() },
///     include_kernel: false,
///     perturbation: DEFAULT_PERTURBATION,
///     thinning: DEFAULT_THINNING,
///     redraw_every: Duration::from_millis(10),
///     ring_bytes: 8 << 20,
///     window: None,
///     cpu_time: false,
///     drain_every: Duration::from_millis(25),
///     stacks: true,
///     stack_memory: StackMemory::default(),
/// };
/// let mut session = Session::open(&opts, &mut |line| eprintln!("{line}"))?;
/// println!("mode: {} ({})", session.mode().name(), session.mode_reason());
/// let mut next = Instant::now();
/// loop {
///     next += Duration::from_secs(1);
///     let stop = session.run_until(Some(next))?;
///     let window = session.take_window();
///     let profile = analyze(&window.set, window.run, &AnalysisOptions::default());
///     println!("{} processes this window", profile.processes.len());
///     if stop.is_some() {
///         break;
///     }
/// }
/// let last = session.finish()?;
/// println!("stopped: {:?}, exit status {:?}", last.stop, last.command_status);
/// # Ok::<(), cpi_user::collect::CollectError>(())
/// ```
pub struct Session {
    live: Live,
    rt: tokio::runtime::Runtime,
}

struct Live {
    opts: CollectOptions,
    /// What the events were planned for, to plan them again at a new rate.
    cpu: Processor,
    mode: Mode,
    reason: String,
    thinning: Thinning,
    specs: Vec<EventSpec>,
    open: Vec<OpenEvent>,
    redraw: Redraw,
    /// The sampling frequency the session opened at ([`Live::poll_every`]).
    opened_hz: u64,
    /// The side-band buffers' fds (and without root, the sample buffers'), readable
    /// once one is a quarter full.
    sideband_ready: Vec<AsyncFd<OwnedFd>>,
    /// Exit watches of the targets still running, by pid (empty: system-wide).
    pidfds: Vec<(u32, AsyncFd<OwnedFd>)>,
    /// The kernel filter's allow-lists (empty for a system-wide target).
    filter: KernelFilter,
    /// When a following filter last took the processes gone out of its map.
    swept: Instant,
    watching: bool,
    sigint: Signal,
    sigterm: Signal,
    drain: Drain,
    child: Option<Child>,
    deadline: Option<Instant>,
    window_started: Instant,
    counters_seen: [u64; COUNTERS as usize],
    stop: Option<StopReason>,
    /// Events disabled and the ring drained to its end.
    shut: bool,
    /// Side-band records (mmap, comm) of the targets.
    sideband: SidebandReader,
    source: Source,
}

/// Where the samples come from.
enum Source {
    /// The eBPF programs' ring buffer.
    Bpf {
        ring: AsyncFd<RingBuf<MapData>>,
        /// Run-time accounting of the programs, while open.
        stats: Option<OwnedFd>,
        bpf: Box<Ebpf>,
    },
    /// The kernel's own ring buffers of each event, without root
    /// (cpi-user/src/collect/perf_ring.rs).
    Perf(SampleRings),
}

/// Checks the target names something to profile, its pids resolved (threads to their
/// processes); the notes to say after the mode line.
fn resolve_target(opts: &mut CollectOptions) -> Result<Vec<String>, CollectError> {
    let mut pid_notes = Vec::new();
    match &opts.target {
        Target::Pids(pids) if pids.is_empty() => return Err(CollectError::NoTarget),
        Target::Pids(pids) => {
            let (pids, notes) = target::resolve_pids(pids)?;
            pid_notes = notes;
            opts.target = Target::Pids(pids);
        }
        Target::Command(argv) | Target::SystemWideWhile(argv) => {
            target::resolve_command(argv.first().ok_or(CollectError::NoTarget)?)?;
        }
        Target::Filtered(f) if !f.pids.is_empty() => {
            let (pids, notes) = target::resolve_pids(&f.pids)?;
            pid_notes = notes;
            opts.target = Target::Filtered(super::Filter { pids, ..f.clone() });
        }
        Target::SystemWide | Target::Filtered(_) => {}
    }
    Ok(pid_notes)
}

/// Where events are opened, and what they follow. `per_cpu`: the pids and the command
/// are counted per CPU, the kernel filter following their process tree
/// ([`KernelFilter::following`]), instead of per thread.
fn placements(
    target: &Target,
    child: Option<u32>,
    per_cpu: bool,
) -> Result<Placements, CollectError> {
    let every_cpu = || Placements {
        at: target::online_cpus()
            .into_iter()
            .map(|cpu| Placement::Cpu { cpu })
            .collect(),
        follow: Follow::Placed,
    };
    match target {
        Target::SystemWide | Target::SystemWideWhile(_) | Target::Filtered(_) => Ok(every_cpu()),
        Target::Pids(_) | Target::Command(_) if per_cpu => Ok(every_cpu()),
        Target::Pids(pids) => {
            let mut at = Vec::new();
            for &pid in pids {
                at.extend(
                    target::threads(pid)?
                        .into_iter()
                        .map(|tid| Placement::Thread { tid }),
                );
            }
            Ok(Placements {
                at,
                follow: Follow::Children,
            })
        }
        Target::Command(_) => Ok(Placements {
            at: vec![Placement::Thread {
                tid: child.ok_or(CollectError::NoTarget)?,
            }],
            follow: Follow::ChildrenFromExec,
        }),
    }
}

/// Makes sure the process may open what the session needs (`per_place` events per
/// thread or CPU at most, the BPF object's maps and programs, the runtime's own few),
/// raising the soft limit when it can: running out half-way would end in the runtime's
/// panic.
fn check_fd_room(target: &Target, per_place: u64, per_cpu: bool) -> Result<(), CollectError> {
    let places = match target {
        Target::SystemWide | Target::SystemWideWhile(_) | Target::Filtered(_) => {
            target::online_cpus().len()
        }
        Target::Pids(_) | Target::Command(_) if per_cpu => target::online_cpus().len(),
        Target::Pids(pids) => pids
            .iter()
            .map(|&p| target::threads(p).map_or(1, |t| t.len()))
            .sum(),
        Target::Command(_) => 1,
    } as u64;
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count) as u64;
    // The events, plus the object (≈ 12 fds), the ring, the runtime (epoll, eventfd,
    // signal pipe), pidfds and the re-exec pipes.
    let need = open_now + per_place * places + 32;
    let limit = sys::raise_fd_limit(need)?;
    if limit < need {
        return Err(CollectError::TooFewFiles { need, limit });
    }
    Ok(())
}

/// The events of `mode` at `rate`, with the cpu-clock floor applied
/// ([`events::plan`]); branch records without their types when there are no stacks to
/// attribute ranges to.
fn plan(mode: Mode, cpu: &Processor, opts: &CollectOptions, rate: &Rate) -> Vec<EventSpec> {
    let mut specs = events::plan(mode, cpu, rate, opts.include_kernel, opts.cpu_time);
    if !opts.stacks {
        specs.iter_mut().for_each(EventSpec::without_branch_types);
    }
    specs
}

/// Where the kernel's mmap/comm records are read: on the processes themselves (one
/// event per process and CPU: threads and children write into it), and what those
/// events follow. A filter naming pids needs its processes' only, as `--pid` does (a
/// cgroup beside them only narrows them): the host's others would be parsed for nothing.
/// Followed processes are read the same way, whether their samples come from events
/// per thread or per CPU. `command` is the started command's pid; `places` the
/// sampling events'.
fn sideband_places(
    target: &Target,
    command: Option<u32>,
    cpus: &[u32],
    places: &Placements,
) -> Placements {
    let on_cpus = |tid: u32| {
        cpus.iter()
            .map(move |&cpu| Placement::ThreadOnCpu { tid, cpu })
    };
    let (at, follow) = match target {
        Target::Pids(pids) => (
            pids.iter().flat_map(|&p| on_cpus(p)).collect(),
            Follow::Children,
        ),
        Target::Filtered(f) if !f.pids.is_empty() => (
            f.pids.iter().flat_map(|&p| on_cpus(p)).collect(),
            Follow::Children,
        ),
        Target::Command(_) => match command {
            Some(pid) => (on_cpus(pid).collect(), Follow::ChildrenFromExec),
            None => (
                cpus.iter().map(|&cpu| Placement::Cpu { cpu }).collect(),
                places.follow,
            ),
        },
        Target::SystemWide | Target::SystemWideWhile(_) | Target::Filtered(_) => {
            (places.at.clone(), places.follow)
        }
    };
    Placements { at, follow }
}

/// Loads the programs every rung from `start` down may attach, configured for `opts`
/// (thinning, kernel samples, the filter's bits), after checking that the start rung's
/// events fit in the descriptors left.
fn load_programs(
    opts: &CollectOptions,
    (caps, features): (&Capabilities, &KernelFeatures),
    start: Mode,
    filter: &KernelFilter,
    thinning: Thinning,
) -> Result<Ebpf, CollectError> {
    let (filter_bits, cgroup_levels) = filter.config();
    let bpf_cfg = KernelConfig {
        thinning,
        include_kernel: opts.include_kernel as u32,
        filter: filter_bits,
        cgroup_levels,
        _pad: 0,
    };
    // The start rung plans the most events (one set per core PMU on hybrid parts).
    let cpu = caps.processor();
    let per_place = plan(start, &cpu, opts, &opts.rate).len();
    check_fd_room(&opts.target, per_place as u64, filter.follows())?;
    let programs = ladder::programs_from(start, &|m| plan(m, &cpu, opts, &opts.rate));
    load(
        opts.ring_bytes,
        bpf_cfg,
        features.stack_mode(opts.stacks),
        features.ancestor_cgroup_id,
        caps.btf,
        &programs,
    )
}

/// What is said after the mode line: the targets' notes and, where the ladder settled
/// on cpu-clock, the rate's floor.
fn tell_notes(
    say: &mut dyn FnMut(Notice<'_>),
    pid_notes: &[String],
    rung: &ladder::Rung,
    rate: &events::Rate,
) {
    for n in pid_notes {
        say(Notice::plain(n));
    }
    if rung.specs.iter().any(|s| s.role == EventRole::CpuClock) {
        if let Some(note) = events::cpu_clock_floor_note(rate) {
            say(Notice::plain(&note));
        }
    }
}

/// The ranges of each branch sample analysis uses: `--window`, else what the LBR's
/// depth gives.
fn range_window(opts: &CollectOptions, caps: &Capabilities) -> usize {
    opts.window.unwrap_or(match caps.lbr_depth() {
        Some(depth) => policy::range_window(depth as usize),
        None => policy::FALLBACK_RANGE_WINDOW,
    })
}

/// The programs' ring buffer, registered with the runtime.
fn take_ring(bpf: &mut Ebpf) -> Result<AsyncFd<RingBuf<MapData>>, CollectError> {
    let load_err =
        |cause: Box<dyn std::error::Error + Send + Sync>| CollectError::Load { hint: "", cause };
    let ring = RingBuf::try_from(
        bpf.take_map("SAMPLES")
            .ok_or_else(|| load_err("map SAMPLES missing".into()))?,
    )
    .map_err(|e| load_err(e.into()))?;
    Ok(sys::watch_ring(ring)?)
}

impl Session {
    /// Validates the target, probes capabilities, walks the mode ladder, loads and
    /// attaches the programs, enables the events (or releases the started command).
    /// `notify` gets one-line status messages (mode line, step-downs, warnings). Every
    /// failure after the command was forked kills and reaps it.
    pub fn open(
        opts: &CollectOptions,
        notify: &mut dyn FnMut(Notice<'_>),
    ) -> Result<Session, CollectError> {
        let caps = Capabilities::probe();
        if caps.check_privileges().is_err() {
            // Without BPF: the kernel's own perf buffers, where the user may use them.
            return unprivileged::open(opts, &caps, notify);
        }
        let features = KernelFeatures::probe();
        features
            .check_floor(&caps.kernel)
            .map_err(CollectError::Kernel)?;
        // The rung the PMU allows, lowered to what this kernel's helpers allow.
        let start = features.limit(caps.mode());
        let mut opts = opts.clone();
        // Said after the mode line, which comes first.
        let mut pid_notes = resolve_target(&mut opts)?;
        // As root, pids and commands are counted per CPU, filtered in the kernel to
        // their process tree: an inherited per-thread counter restarts its period in
        // each new thread, and never samples one shorter than a period
        // (docs/METHOD.md, "Short-lived threads").
        let mut filter = match &opts.target {
            Target::Filtered(f) => KernelFilter::new(f)?,
            Target::Pids(pids) => KernelFilter::following(pids)?,
            Target::Command(_) => KernelFilter::following(&[])?,
            Target::SystemWide | Target::SystemWideWhile(_) => KernelFilter::default(),
        };
        if !features.ancestor_cgroup_id {
            pid_notes.extend(filter.cgroup_in_user_space());
        }
        events::check_rate(&opts.rate)?;
        if !caps.btf {
            notify(Notice::plain(
                "note: no kernel BTF (/sys/kernel/btf/vmlinux missing); trying to load without it",
            ));
        }
        let thinning = opts.perturbation.thinning(opts.thinning);
        let cpu = caps.processor();
        let mut bpf = load_programs(&opts, (&caps, &features), start.0, &filter, thinning)?;
        filter.install(&mut BpfFilterMaps(&mut bpf))?;
        if filter.follows() {
            if let Err(e) = super::follow_forks(&mut bpf) {
                notify(Notice::plain(&format!(
                    "note: the kernel cannot follow the target's processes ({e}): counting \
                     per thread, which never samples a thread that runs less than one period"
                )));
                filter.unfollow(&mut BpfFilterMaps(&mut bpf))?;
            }
        }

        // Signals are caught from here on, so a SIGINT during set-up still reports.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let entered = rt.enter();
        let sigint = signal(SignalKind::interrupt())?;
        let sigterm = signal(SignalKind::terminate())?;

        // From the fork on, dropping `suspended` (any `?` below) kills and reaps it.
        let suspended = match opts.target.command() {
            Some(argv) => Some(target::spawn_suspended(argv)?),
            None => None,
        };
        let command = suspended.as_ref().map(target::Suspended::pid);
        if let Some(pid) = command.filter(|_| filter.follows()) {
            filter.allow(&mut BpfFilterMaps(&mut bpf), pid)?;
        }
        let places = placements(&opts.target, command, filter.follows())?;
        let sys = Linux;
        let attach = |name: &'static str| ladder::program_fd(&bpf, name);
        let rung = ladder::walk(
            &sys,
            start,
            &|m| plan(m, &cpu, &opts, &opts.rate),
            &places,
            &attach,
            notify,
        )?;
        tell_notes(notify, &pid_notes, &rung, &opts.rate);

        let ring = take_ring(&mut bpf)?;
        let window = range_window(&opts, &caps);
        let cpus = target::online_cpus();
        let sideband_places = sideband_places(&opts.target, command, &cpus, &places);
        let sideband = SidebandReader::open(&sys, &sideband_places)?;
        let sideband_ready = sideband
            .fds()
            .map(sys::watch_copy)
            .collect::<Result<Vec<_>, _>>()?;
        // Run-time accounting of our programs, for as long as the session lives.
        let stats = sys.enable_bpf_stats().ok();

        let live = assemble(Parts {
            opts,
            cpu,
            rung,
            thinning,
            window,
            cpus: cpus.len(),
            sideband,
            sideband_ready,
            filter,
            signals: (sigint, sigterm),
            suspended,
            source: Source::Bpf {
                ring,
                stats,
                bpf: Box::new(bpf),
            },
        })?;
        drop(entered);
        Ok(Session { live, rt })
    }

    /// The mode the ladder settled on ([`super::ladder`]).
    pub fn mode(&self) -> Mode {
        self.live.mode
    }

    /// Why that mode and not a higher one, as printed at start.
    pub fn mode_reason(&self) -> &str {
        &self.live.reason
    }

    /// Collects until `until` (None: no deadline) or a stop condition (duration in opts,
    /// target exit, SIGINT/SIGTERM). `Ok(None)`: `until` was reached, collection
    /// continues. Once stopped, every call returns the same stop at once.
    pub fn run_until(
        &mut self,
        until: Option<Instant>,
    ) -> Result<Option<StopReason>, CollectError> {
        self.run(until, Draining::Yes)
    }

    /// As [`Session::run_until`], but nothing is drained meanwhile: the kernel's buffers
    /// take what comes, and what they cannot hold is counted as lost (`ring_full`,
    /// `sideband_lost`), so memory stays bounded while the caller cannot take more
    /// (the agent, while its analysis is behind). Stop conditions are still seen.
    pub fn wait_until(
        &mut self,
        until: Option<Instant>,
    ) -> Result<Option<StopReason>, CollectError> {
        self.run(until, Draining::No)
    }

    fn run(
        &mut self,
        until: Option<Instant>,
        drain: Draining,
    ) -> Result<Option<StopReason>, CollectError> {
        if let Some(stop) = self.live.stop {
            return Ok(Some(stop));
        }
        let stop = self.rt.block_on(self.live.run(until, drain))?;
        if let Some(stop) = stop {
            self.live.stop = Some(stop);
            self.rt.block_on(self.live.shut_down());
        }
        Ok(stop)
    }

    /// Everything drained since the previous call, as one window: its SampleSet (with
    /// the processes' comm/maps captured so far) and a RunInfo whose event sample
    /// counts, losses and duration are those of this window only. Collection goes on; no
    /// sample is in two windows or in none.
    pub fn take_window(&mut self) -> Collected {
        self.live.take_window()
    }

    /// The base sampling rate now.
    pub fn rate(&self) -> &Rate {
        &self.live.opts.rate
    }

    /// Changes the base sampling rate (the agent's overhead governor): re-opens nothing,
    /// sets the new period on every open event. Events the kernel created by `inherit`
    /// keep theirs.
    pub fn set_frequency(&mut self, hz: u64) -> Result<(), CollectError> {
        if hz == 0 {
            return Err(CollectError::Range(
                "the sampling frequency must be at least 1 Hz".into(),
            ));
        }
        let l = &mut self.live;
        let rate = Rate {
            frequency: hz,
            period: None,
            ..l.opts.rate
        };
        let specs = plan(l.mode, &l.cpu, &l.opts, &rate);
        let sys = Linux;
        for e in &l.open {
            let spec = &specs[e.spec_index];
            // A thread that exited keeps nothing to set.
            if sys.set_period(&e.fd, spec.policy.base).is_ok() && spec.role == EventRole::CpuClock {
                l.drain.cpu_clock.set(e.place, spec.policy.base);
            }
        }
        l.specs = specs;
        l.opts.rate = rate;
        l.redraw.restart(&sys, &l.specs, &l.open);
        Ok(())
    }

    /// Replaces the cgroups a [`Target::Filtered`] session made with
    /// `cgroups_later` keeps (cpi-user/src/collect/filter.rs): the agent's pods as they
    /// come and go.
    pub fn set_cgroups(&mut self, set: Vec<super::filter::CgroupV2>) -> Result<(), CollectError> {
        let l = &mut self.live;
        match &mut l.source {
            Source::Bpf { bpf, .. } => l.filter.set_cgroups(&mut BpfFilterMaps(bpf), set),
            // Filters need the BPF program: refused before a session opens without it.
            Source::Perf(_) => Ok(()),
        }
    }

    /// Cumulative in-kernel run time of our BPF programs, from BPF_ENABLE_STATS
    /// (enabled for the Session's lifetime when the kernel allows), None when
    /// unavailable.
    pub fn bpf_run_time(&self) -> Option<Duration> {
        let Source::Bpf {
            stats: Some(_),
            bpf,
            ..
        } = &self.live.source
        else {
            return None;
        };
        let mut total = Duration::ZERO;
        for (_, prog) in bpf.programs() {
            match prog.info() {
                Ok(info) => total += info.run_time(),
                // The object holds every mode's programs; only the ladder's are
                // loaded. Counting one of the others as a failure once made the
                // whole figure 0 (`cpi_bpf_bpf_run_seconds_total` read 0).
                Err(aya::programs::ProgramError::NotLoaded) => {}
                Err(_) => return None,
            }
        }
        Some(total)
    }

    /// Disables the events, drains to the end, reaps/kills the started command; the last
    /// window.
    pub fn finish(self) -> Result<Collected, CollectError> {
        self.finish_with(&mut |_| {})
    }

    /// [`Session::finish`], saying on `notify` when the command had to be killed.
    pub(crate) fn finish_with(
        mut self,
        notify: &mut dyn FnMut(Notice<'_>),
    ) -> Result<Collected, CollectError> {
        let stop = *self.live.stop.get_or_insert(StopReason::Finished);
        self.rt.block_on(self.live.shut_down());
        let command_status = self.live.child.take().and_then(|child| {
            if stop == StopReason::TargetExit {
                return child.wait();
            }
            let (status, killed) = child.terminate(KILL_AFTER);
            if killed {
                notify(Notice::plain(&format!(
                    "the command did not end within {} s of SIGTERM: killed it (SIGKILL)",
                    KILL_AFTER.as_secs()
                )));
            }
            status
        });
        if let Source::Bpf { bpf, .. } = &self.live.source {
            let unfollowed = super::read_counters(bpf)[Counter::Unfollowed as usize];
            if unfollowed > 0 {
                notify(Notice::plain(&format!(
                    "warning: {unfollowed} processes the target forked were not followed \
                     (the kernel filter holds {MAX_FILTER_TGIDS}): their samples are missing"
                )));
            }
        }
        let mut last = self.live.take_window();
        last.command_status = command_status;
        Ok(last)
    }
}

/// What an opened session is made of, its events open, its command (if any) not yet
/// released.
struct Parts {
    opts: CollectOptions,
    cpu: Processor,
    rung: ladder::Rung,
    thinning: Thinning,
    /// Ranges per branch sample.
    window: usize,
    /// Online CPUs.
    cpus: usize,
    sideband: SidebandReader,
    sideband_ready: Vec<AsyncFd<OwnedFd>>,
    filter: KernelFilter,
    signals: (Signal, Signal),
    suspended: Option<target::Suspended>,
    source: Source,
}

/// Enables the events (or releases the command, whose events start at its exec),
/// watches the targets' exits, and starts the clock: the running session. In the
/// runtime's context.
fn assemble(p: Parts) -> Result<Live, CollectError> {
    let Parts {
        opts,
        cpu,
        rung,
        thinning,
        window,
        cpus,
        sideband,
        sideband_ready,
        filter,
        signals: (sigint, sigterm),
        suspended,
        source,
    } = p;
    let started = Instant::now();
    // A command's own events start at its exec; every other target's now, per-CPU
    // events of a command included (the filter keeps only the command, which waits).
    let command = matches!(opts.target, Target::Command(_));
    if !command {
        sideband.enable(&Linux)?;
    }
    if !command || filter.follows() {
        for e in &rung.open {
            Linux.enable(&e.fd)?;
        }
    }
    let child = suspended.map(target::Suspended::release).transpose()?;
    let watch: Vec<u32> = match (&opts.target, &child) {
        (_, Some(c)) => vec![c.pid()],
        (Target::Pids(pids), None) => pids.clone(),
        (Target::Filtered(_), None) => filter.tgids().collect(),
        _ => Vec::new(),
    };
    let mut pidfds = Vec::new();
    for &pid in &watch {
        // A pid that is already gone has exited: nothing to wait for.
        if let Ok(fd) = Linux.pidfd_open(pid) {
            pidfds.push((pid, sys::watch(fd)?));
        }
    }
    let redraw = Redraw::new(
        Instant::now(),
        Rng::new(seed()),
        opts.redraw_every.max(Duration::from_millis(1)),
        cpus as u64,
        &rung.specs,
        &rung.open,
    );
    let mut drain = Drain::new(window, opts.stack_memory);
    if let Some(clock) = rung.specs.iter().find(|s| s.role == EventRole::CpuClock) {
        drain.cpu_clock.opened = clock.policy.base;
    }
    Ok(Live {
        cpu,
        mode: rung.mode,
        reason: rung.reason,
        thinning,
        specs: rung.specs,
        open: rung.open,
        redraw,
        opened_hz: opts.rate.frequency,
        sideband_ready,
        pidfds,
        filter,
        swept: started,
        watching: !watch.is_empty(),
        sigint,
        sigterm,
        drain,
        child,
        deadline: opts.duration.and_then(|d| started.checked_add(d)),
        window_started: started,
        counters_seen: [0; COUNTERS as usize],
        stop: None,
        shut: false,
        sideband,
        source,
        opts,
    })
}

/// How often a following filter looks for processes gone: a shell loop starts hundreds
/// a second, and the map holds [`MAX_FILTER_TGIDS`].
const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// Takes the processes gone out of a following filter's map, at most every
/// [`SWEEP_EVERY`].
fn sweep(filter: &mut KernelFilter, source: &mut Source, swept: &mut Instant) {
    if !filter.follows() || swept.elapsed() < SWEEP_EVERY {
        return;
    }
    *swept = Instant::now();
    if let Source::Bpf { bpf, .. } = source {
        // A map the kernel will not list stays as it is: the next sweep tries again.
        let _ = filter.sweep(&mut BpfFilterMaps(bpf), &crate::procmap::alive);
    }
}

/// Whether [`Live::run`] drains the ring buffer and the side-band buffers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Draining {
    Yes,
    No,
}

impl Live {
    async fn run(
        &mut self,
        until: Option<Instant>,
        drain_mode: Draining,
    ) -> Result<Option<StopReason>, CollectError> {
        let draining = drain_mode == Draining::Yes;
        let far = || tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        let deadline = self
            .deadline
            .map_or_else(far, tokio::time::Instant::from_std);
        let until_at = until.map_or_else(far, tokio::time::Instant::from_std);
        let redraw_in = |r: &Redraw| {
            r.due()
                .map(|due| due.saturating_duration_since(Instant::now()))
        };
        // Kernel timers, not tokio's (`sys::Timer`): one wake-up per drain and re-draw.
        let every = self.poll_every();
        let poll = sys::Timer::new()?;
        poll.set(Some(Duration::ZERO), Some(every))?; // at once, as a tokio interval
        let redraw_timer = sys::Timer::new()?;
        let redrawing = self.opts.perturbation.user() && !self.open.is_empty();
        let Live {
            source,
            drain,
            pidfds,
            sigint,
            sigterm,
            redraw: schedule,
            specs,
            open,
            watching,
            sideband,
            sideband_ready,
            filter,
            swept,
            ..
        } = self;
        if redrawing {
            redraw_timer.set(redraw_in(schedule), None)?;
        }
        // Made once, not at each turn of the loop: a tokio timer made anew lands in its
        // wheel's coarser levels and costs a wake-up to move down.
        let deadline_sleep = tokio::time::sleep_until(deadline);
        let until_sleep = tokio::time::sleep_until(until_at);
        tokio::pin!(deadline_sleep, until_sleep);
        let stop = loop {
            tokio::select! {
                ready = bpf_ring_ready(source), if draining => {
                    ready?;
                    drain_all(sideband, source, drain);
                }
                ticked = poll.expired(), if draining => {
                    ticked?;
                    drain_all(sideband, source, drain);
                    sweep(filter, source, swept);
                }
                () = any_ready(sideband_ready), if draining && !sideband_ready.is_empty() => {
                    drain_all(sideband, source, drain);
                }
                ticked = redraw_timer.expired(), if redrawing => {
                    ticked?;
                    schedule.tick(Instant::now(), &Linux, specs, open, &mut drain.cpu_clock);
                    redraw_timer.set(redraw_in(schedule), None)?;
                }
                () = &mut deadline_sleep, if self.deadline.is_some() => {
                    break Some(StopReason::Duration)
                }
                () = &mut until_sleep, if until.is_some() => break None,
                i = next_exit(pidfds), if !pidfds.is_empty() => {
                    let (pid, _) = pidfds.swap_remove(i);
                    // Only an entry that is already gone can fail to go: nothing to undo.
                    if let Source::Bpf { bpf, .. } = source {
                        let _ = filter.exited(&mut BpfFilterMaps(bpf), pid);
                    }
                }
                () = std::future::ready(()), if *watching && pidfds.is_empty() => {
                    break Some(StopReason::TargetExit)
                }
                _ = sigint.recv() => break Some(StopReason::Signal("SIGINT")),
                _ = sigterm.recv() => break Some(StopReason::Signal("SIGTERM")),
            }
        };
        if draining {
            drain_all(sideband, source, drain);
        }
        Ok(stop)
    }

    /// How often the ring is drained without a wake-up: [`CollectOptions::drain_every`]
    /// at the frequency the session opened at, longer in proportion as the rate is
    /// lowered (the agent's governor), so a pass finds about as many records at any
    /// rate, up to [`MAX_DRAIN_EVERY`]. Nothing fills meanwhile: at the agent's 999 Hz,
    /// two CPUs and records of at most ≈ 9 KB (an 8 KiB stack copy), a 100 ms pass
    /// finds ≤ 1.8 MB, and the BPF program wakes the collector whenever the ring (the
    /// agent's holds 200 ms of records at its rate, cpi-agent/src/config.rs) is a
    /// quarter full, as the side-band buffers do; what a longer wait
    /// costs is only that a process living less than it is read from its side-band
    /// records, not `/proc`.
    fn poll_every(&self) -> Duration {
        let every = self.opts.drain_every.max(Duration::from_millis(1));
        let now_hz = self.opts.rate.frequency.max(1);
        if self.opts.rate.period.is_some() || now_hz >= self.opened_hz {
            return every;
        }
        let stretched = every.as_secs_f64() * self.opened_hz as f64 / now_hz as f64;
        every.max(Duration::from_secs_f64(
            stretched.min(MAX_DRAIN_EVERY.as_secs_f64()),
        ))
    }

    /// No new samples, then everything already written (once).
    async fn shut_down(&mut self) {
        if self.shut {
            return;
        }
        self.shut = true;
        for e in &self.open {
            let _ = Linux.disable(&e.fd);
        }
        drain_all(&mut self.sideband, &mut self.source, &mut self.drain);
        // A program that was mid-run on another CPU commits within microseconds.
        tokio::time::sleep(Duration::from_millis(20)).await;
        drain_all(&mut self.sideband, &mut self.source, &mut self.drain);
    }

    fn take_window(&mut self) -> Collected {
        let w = self.drain.take_window();
        let (counters, (ring_lost, throttled, bad)) = match &mut self.source {
            Source::Bpf { bpf, .. } => (read_counters(bpf), (0, 0, 0)),
            Source::Perf(rings) => ([0; COUNTERS as usize], rings.take_losses()),
        };
        let delta =
            |c: Counter| counters[c as usize].saturating_sub(self.counters_seen[c as usize]);
        let lost = LossReport {
            ring_full: delta(Counter::RingFull) + ring_lost,
            branch_errors: delta(Counter::BranchError),
            malformed: w.malformed + bad,
            throttled,
            thinned: delta(Counter::Thinned),
            filtered_in_kernel: delta(Counter::Filtered),
            sideband_lost: w.sideband_lost,
            stacks_truncated: w.stack_counts.truncated,
            stacks_unknown_code: w.stack_counts.unknown_code,
            stacks_failed: w.stack_counts.failed,
            stacks_too_costly: w.stack_counts.too_costly,
            stacks_evicted: w.set.stacks_evicted(),
            ..Default::default()
        };
        self.counters_seen = counters;
        let now = Instant::now();
        let duration_secs = now.duration_since(self.window_started).as_secs_f64();
        self.window_started = now;
        let events = self
            .specs
            .iter()
            .map(|s| EventInfo {
                role: s.role,
                name: s.name.clone(),
                period: s.policy.base,
                jitter: if self.opts.perturbation.user() {
                    s.policy.jitter
                } else {
                    0
                },
                thinning: self.thinning.keep_one_in,
                unit: EventUnit::of_role(s.role),
                samples: w.received.get(&s.role).copied().unwrap_or(0),
                also: Vec::new(),
            })
            .collect();
        let run = RunInfo {
            mode: self.mode,
            mode_reason: self.reason.clone(),
            command: self
                .opts
                .target
                .command()
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            duration_secs,
            events,
            perturbation: self.opts.perturbation,
            lost,
        };
        Collected {
            set: w.set,
            run,
            stop: self.stop,
            command_status: None,
            held_processes: self.drain.held_processes(),
            changes: w.changes,
            unwind_heap: w.unwind_heap,
            captured: self.drain.capture_counter(),
        }
    }
}

/// The index of a watched process that has exited (its pidfd is readable).
fn next_exit(pidfds: &[(u32, AsyncFd<OwnedFd>)]) -> impl std::future::Future<Output = usize> + '_ {
    std::future::poll_fn(move |cx| {
        for (i, (_, fd)) in pidfds.iter().enumerate() {
            if fd.poll_read_ready(cx).is_ready() {
                return std::task::Poll::Ready(i);
            }
        }
        std::task::Poll::Pending
    })
}

/// Readiness of any of `fds` (each cleared: the kernel says again at its next
/// watermark).
fn any_ready(fds: &[AsyncFd<OwnedFd>]) -> impl std::future::Future<Output = ()> + '_ {
    std::future::poll_fn(move |cx| {
        let mut any = false;
        for fd in fds {
            if let std::task::Poll::Ready(Ok(mut g)) = fd.poll_read_ready(cx) {
                g.clear_ready();
                any = true;
            }
        }
        if any {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
}

/// One pass: side-band records first (they explain the samples), then the samples.
fn drain_all(sideband: &mut SidebandReader, source: &mut Source, drain: &mut Drain) {
    drain.start_pass();
    let mut read_at = sys::monotonic_ns();
    sideband.read(|s| drain.observe(s));
    match source {
        Source::Bpf { ring, bpf, .. } => {
            let ring = ring.get_mut();
            while let Some(item) = ring.next() {
                // A sample taken after the side-band read may be explained only by
                // records written since (a child that exec'd and exited meanwhile would
                // meet its parent's mappings alone): they are read first. Both clocks
                // are CLOCK_MONOTONIC (bpf_ktime_get_ns).
                let time = sys::read_plain::<SampleHeader>(&item).map(|h| h.time_ns);
                if time.is_some_and(|t| t > read_at) {
                    read_at = sys::monotonic_ns();
                    sideband.read(|s| drain.observe(s));
                }
                drain.add(&item);
            }
            drain.stack_caps.apply(&mut BpfStackCaps(bpf));
        }
        Source::Perf(rings) => {
            rings.read(drain);
            drain.stack_caps.discard();
        }
    }
}

/// The BPF ring buffer's readiness (cleared: the drain that follows reads it all);
/// never, for the perf buffers, whose fds are polled with the side-band ones.
async fn bpf_ring_ready(source: &mut Source) -> io::Result<()> {
    match source {
        Source::Bpf { ring, .. } => {
            ring.readable_mut().await?.clear_ready();
            Ok(())
        }
        Source::Perf(_) => std::future::pending().await,
    }
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    t ^ ((std::process::id() as u64) << 32)
}

/// The one-shot command: one window, from open to a stop condition.
pub fn collect(
    opts: &CollectOptions,
    notify: &mut dyn FnMut(Notice<'_>),
) -> Result<Collected, CollectError> {
    let mut session = Session::open(opts, notify)?;
    session.run_until(None)?;
    session.finish_with(notify)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::caps::Vendor;
    use crate::collect::drain::CpuClockPeriods;
    use crate::collect::sys::fake::{Call, FakeSys};
    use std::os::fd::AsRawFd;

    #[test]
    fn placements_follow_the_target() {
        let me = std::process::id();
        let places = placements(&Target::Pids(vec![me]), None, false).unwrap();
        assert!(
            places.at.contains(&Placement::Thread { tid: me }),
            "one event per thread, any CPU"
        );
        assert!(places.at.iter().all(|p| p.cpu().is_none()));
        assert_eq!(
            places.follow,
            Follow::Children,
            "threads created later follow"
        );

        let places = placements(&Target::SystemWide, None, false).unwrap();
        assert_eq!(places.at.len(), target::online_cpus().len());
        assert!(places.at.iter().all(|p| matches!(p, Placement::Cpu { .. })));
        assert_eq!(places.follow, Follow::Placed);

        let cmd = Target::Command(vec!["true".into()]);
        let places = placements(&cmd, Some(4242), false).unwrap();
        assert_eq!(places.at, [Placement::Thread { tid: 4242 }]);
        assert_eq!(places.follow, Follow::ChildrenFromExec);

        assert!(matches!(
            placements(&Target::Pids(vec![u32::MAX - 1]), None, false),
            Err(CollectError::NoSuchProcess(_))
        ));

        // Followed in the kernel: one event per CPU for pids and commands alike, so a
        // period runs on across the threads and processes a CPU runs.
        for t in [Target::Pids(vec![me]), cmd] {
            let places = placements(&t, Some(4242), true).unwrap();
            assert_eq!(places.at.len(), target::online_cpus().len());
            assert!(places.at.iter().all(|p| matches!(p, Placement::Cpu { .. })));
            assert_eq!(places.follow, Follow::Placed);
        }
    }

    /// Branch records ask for their types only when there are stacks to attribute
    /// ranges to (the types cost Intel's LBR a decode per entry in the interrupt).
    #[test]
    fn branch_types_only_with_stacks() {
        let rate = Rate {
            frequency: 999,
            period: None,
            core_hz: 2_000_000_000,
        };
        let opts = |stacks| CollectOptions {
            target: Target::SystemWide,
            duration: None,
            rate,
            include_kernel: false,
            perturbation: policy::DEFAULT_PERTURBATION,
            thinning: 1,
            redraw_every: Duration::from_millis(10),
            ring_bytes: 1 << 20,
            window: None,
            cpu_time: false,
            drain_every: super::super::DRAIN_EVERY,
            stacks,
            stack_memory: super::super::StackMemory::default(),
        };
        let typed = |cpu: &Processor, stacks| {
            plan(Mode::Cpi, cpu, &opts(stacks), &rate)
                .iter()
                .map(EventSpec::saves_branch_types)
                .collect::<Vec<_>>()
        };
        let intel = Processor::of(Vendor::Intel);
        assert_eq!(typed(&intel, true), [true, false], "branches, cycles");
        assert_eq!(typed(&intel, false), [false, false]);
        // BRS refuses the types: not asked for, also when `set_frequency` plans again
        // from what the session kept.
        let brs = Processor {
            brs: true,
            ..Processor::of(Vendor::Amd)
        };
        assert_eq!(typed(&brs, true), [false, false]);
    }

    /// Time-profile events at `hz`, opened on `places` under the fake.
    fn time_events(hz: u64, places: &[Placement]) -> (FakeSys, Vec<EventSpec>, Vec<OpenEvent>) {
        let rate = Rate {
            frequency: hz,
            period: None,
            core_hz: 2_000_000_000,
        };
        let specs = events::plan(
            Mode::TimeProfile,
            &Processor::of(Vendor::Other),
            &rate,
            false,
            false,
        );
        let sys = FakeSys::new(|_, _| None);
        let attach = |_: &'static str| Ok(None);
        let places = Placements {
            at: places.to_vec(),
            follow: Follow::Placed,
        };
        let open = ladder::open_events(&sys, &specs, &places, &attach)
            .unwrap()
            .open;
        (sys, specs, open)
    }

    #[test]
    fn redraws_follow_the_count_not_the_clock() {
        let (sys, specs, open) = time_events(
            10,
            &[Placement::Thread { tid: 1 }, Placement::Thread { tid: 2 }],
        );
        // Read at every tick: as if the count could grow without bound (as many CPUs as
        // nanoseconds), so no time has to pass first.
        let mut r = Redraw::new(
            Instant::now(),
            Rng::new(7),
            Duration::ZERO,
            u64::MAX,
            &specs,
            &open,
        );
        let now = Instant::now() + Duration::from_secs(3600);
        let base = specs[0].policy.base;
        let sets = || sys.calls_where(|c| matches!(c, Call::SetPeriod(..))).len();
        // However many ticks pass, an event that has counted fewer than 48 periods is
        // never re-drawn (each re-draw restarts its count).
        sys.count.set(47 * base);
        let mut periods = CpuClockPeriods::default();
        for _ in 0..100 {
            r.tick(now, &sys, &specs, &open, &mut periods);
        }
        assert_eq!(sets(), 0);
        assert!(periods.by_tid.is_empty());
        // Past 112 periods every event is due, once.
        sys.count.set(112 * base);
        r.tick(now, &sys, &specs, &open, &mut periods);
        r.tick(now, &sys, &specs, &open, &mut periods);
        assert_eq!(sets(), 2);
        // The drain learns each event's new period, by thread.
        assert_eq!(periods.by_tid.len(), 2);
        for c in sys.calls_where(|c| matches!(c, Call::SetPeriod(..))) {
            let Call::SetPeriod(_, p) = c else {
                unreachable!()
            };
            assert!(
                p >= base && p <= base + base / 8,
                "{p} outside the band of {base}"
            );
        }
        // The next re-draw is again 48..=112 periods further on.
        sys.count.set(112 * base + 47 * base);
        r.tick(now, &sys, &specs, &open, &mut periods);
        r.tick(now, &sys, &specs, &open, &mut periods);
        assert_eq!(sets(), 2);
    }

    /// A `cpu-clock` event is not read before its count can have reached its re-draw:
    /// the same re-draws (same counts, same periods) with a read per re-draw, not one
    /// per tick.
    #[test]
    fn time_events_are_read_only_when_they_can_be_due() {
        // One event per CPU, each counting wall time (a busy CPU): 10 ms ticks for 60 s.
        let run = |skip: bool| {
            let (sys, mut specs, open) =
                time_events(19, &[Placement::Cpu { cpu: 0 }, Placement::Cpu { cpu: 1 }]);
            if !skip {
                // The same policy on an event whose count is not time: read every tick.
                specs[0].role = EventRole::Cycles;
            }
            let start = Instant::now();
            let every = Duration::from_millis(10);
            let mut r = Redraw::new(start, Rng::new(42), every, 2, &specs, &open);
            let mut periods = CpuClockPeriods::default();
            let mut redraws = Vec::new();
            for t in 1..=6000u64 {
                let now = start + every * t as u32;
                sys.count.set(now.duration_since(start).as_nanos() as u64);
                let before = sys.calls.borrow().len();
                r.tick(now, &sys, &specs, &open, &mut periods);
                for c in &sys.calls.borrow()[before..] {
                    if let Call::SetPeriod(fd, p) = c {
                        let event = open.iter().position(|e| e.fd.as_raw_fd() == *fd);
                        redraws.push((event, sys.count.get(), *p));
                    }
                }
            }
            let reads = sys.calls_where(|c| matches!(c, Call::Read(_))).len();
            (reads, redraws)
        };
        let (all_reads, all_redraws) = run(false);
        let (reads, redraws) = run(true);
        assert_eq!(all_reads, 12_000, "two events read at each tick");
        // 60 s at 19 Hz: a re-draw every 48..=112 periods (2.5..5.9 s) per event.
        assert!(
            (20..=50).contains(&redraws.len()),
            "{} re-draws",
            redraws.len()
        );
        assert_eq!(
            redraws, all_redraws,
            "the same re-draws, at the same counts"
        );
        assert!(
            reads <= 2 * redraws.len() + 4,
            "{reads} reads for {} re-draws",
            redraws.len()
        );
    }
}
