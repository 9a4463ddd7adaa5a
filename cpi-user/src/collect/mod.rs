//! Collection: brings wire samples home from the kernel.
//!
//! probe ([`caps`]) → choose the events of the mode ([`events`]) → load the eBPF
//! programs → open every event with our own `perf_event_open` and attach with
//! `PERF_EVENT_IOC_SET_BPF` ([`sys`]) → enable → drain the BPF ring buffer with tokio
//! into a per-pid [`SampleSet`] ([`drain`]) while re-drawing periods on a timer → stop on
//! duration, target exit or SIGINT/SIGTERM → disable, drain to the end, report losses.

pub mod caps;
pub mod drain;
pub mod events;
pub mod sys;
pub mod target;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::PerfEvent;
use aya::Ebpf;
use cpi_common::policy::{self, KernelConfig, Perturbation, RedrawSchedule, Rng};
use cpi_common::wire::{Counter, COUNTERS};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{signal, SignalKind};

use crate::profile::model::{EventInfo, LossReport};
use crate::profile::{Mode, RunInfo, SampleSet};
use caps::Capabilities;
use drain::Drain;
use events::{EventSpec, Rate};
pub use target::Target;

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cpi-ebpf"));

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("{0}")]
    NotPrivileged(String),
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    #[error("command not found: {0}")]
    CommandNotFound(String),
    #[error("not executable: {0}")]
    NotExecutable(String),
    #[error("starting {cmd}: {cause}")]
    Spawn { cmd: String, cause: io::Error },
    #[error("nothing to profile: give --pid PID, --system-wide or -- CMD")]
    NoTarget,
    #[error(
        "this cpi-bpf was built with AYA_BUILD_SKIP=1 and holds no eBPF object; rebuild without it"
    )]
    NoObject,
    // Causes are part of the one-line message, not `source()`: callers print `{:#}`
    // chains, which would repeat them.
    #[error("loading the eBPF programs{hint}: {cause}")]
    Load {
        hint: &'static str,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("opening {event} on {on}: {cause}")]
    Open {
        event: String,
        on: String,
        cause: io::Error,
    },
    #[error("attaching the BPF program to {event}: {cause}")]
    Attach { event: String, cause: io::Error },
    #[error(
        "too few file descriptors: the limit is {limit} (ulimit -n) and this run needs at \
         least {needed}"
    )]
    OpenFilesLimit { limit: u64, needed: u64 },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// File descriptors a run needs besides its events: the BPF object's maps and programs,
/// the ring buffer, tokio's signal and timer plumbing, pidfds, `/proc` reads.
const FDS_BESIDES_EVENTS: u64 = 64;

/// Raises the open-files limit as far as allowed and checks it covers `events` events
/// plus what a run needs besides (one line instead of a failure half-way).
fn check_open_files(events: u64) -> Result<(), CollectError> {
    let needed = events + FDS_BESIDES_EVENTS;
    let limit = sys::raise_open_files_limit()?;
    if limit < needed {
        return Err(CollectError::OpenFilesLimit { limit, needed });
    }
    Ok(())
}

/// How to collect.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    pub target: Target,
    /// Stop after this long (else on target exit or a signal).
    pub duration: Option<Duration>,
    pub rate: Rate,
    /// Sample kernel-mode IPs and branches too.
    pub include_kernel: bool,
    pub perturbation: Perturbation,
    /// In-kernel thinning factor (1 = off) when the kernel layer runs.
    pub thinning: u32,
    /// BPF ring buffer size (a power of two ≥ the page size).
    pub ring_bytes: u32,
    /// Ranges per branch sample (seed 001's CBT window); `None`: the branch-record depth
    /// − 1 ([`cpi_common::policy::range_window`]).
    pub window: Option<usize>,
}

/// Why collection stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Duration,
    TargetExit,
    Signal(&'static str),
}

/// What a run brought home.
#[derive(Debug)]
pub struct Collected {
    pub set: SampleSet,
    pub run: RunInfo,
    pub stop: StopReason,
    /// Exit status of the command cpi-bpf started.
    pub command_status: Option<i32>,
}

/// An open event: the fd keeps the program attached; closing it detaches.
struct OpenEvent {
    fd: OwnedFd,
    spec_index: usize,
    /// Where it counts: a thread (`pid` > 0, any CPU) or a CPU (`cpu` ≥ 0, every thread).
    pid: i32,
    cpu: i32,
    /// Records seen from it at its last period re-draw, and how many more the
    /// [`RedrawSchedule`] waits for.
    seen_at_redraw: u64,
    redraw_after: u64,
}

/// Loads the eBPF object with its ring buffer sized and its config written.
pub fn load(ring_bytes: u32, config: KernelConfig, btf: bool) -> Result<Ebpf, CollectError> {
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
        .load(EBPF_OBJECT)
        .map_err(|e| load_err(e.into()))?;
    for name in [
        "branch_sample",
        "ip_cycles",
        "ip_instructions",
        "ip_cpu_clock",
    ] {
        let prog: &mut PerfEvent = bpf
            .program_mut(name)
            .ok_or_else(|| load_err(format!("program {name} missing from the object").into()))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| load_err(e.into()))?;
        prog.load().map_err(|e| load_err(e.into()))?;
    }
    let mut cfg: Array<_, KernelConfig> = Array::try_from(
        bpf.map_mut("CONFIG")
            .ok_or_else(|| load_err("map CONFIG missing".into()))?,
    )
    .map_err(|e| load_err(e.into()))?;
    cfg.set(0, config, 0).map_err(|e| load_err(e.into()))?;
    Ok(bpf)
}

fn program_fd(bpf: &Ebpf, name: &str) -> Result<i32, CollectError> {
    let p: &PerfEvent = bpf
        .program(name)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| CollectError::Load {
            hint: "",
            cause: format!("program {name} missing").into(),
        })?;
    let fd = p.fd().map_err(|e| CollectError::Load {
        hint: "",
        cause: e.into(),
    })?;
    Ok(std::os::fd::AsFd::as_fd(fd).as_raw_fd())
}

/// Where events are opened: (pid, cpu) pairs and extra attr flags.
fn placements(target: &Target, child: Option<u32>) -> Result<(Vec<(i32, i32)>, u64), CollectError> {
    match target {
        Target::SystemWide => Ok((
            target::online_cpus()
                .into_iter()
                .map(|c| (-1, c as i32))
                .collect(),
            0,
        )),
        Target::Pids(pids) => {
            let mut v = Vec::new();
            for &pid in pids {
                v.extend(target::threads(pid)?.into_iter().map(|t| (t as i32, -1)));
            }
            Ok((v, sys::flag::INHERIT))
        }
        Target::Command(_) => {
            let pid = child.ok_or(CollectError::NoTarget)? as i32;
            Ok((
                vec![(pid, -1)],
                sys::flag::INHERIT | sys::flag::ENABLE_ON_EXEC,
            ))
        }
    }
}

/// Opens every event of `specs` at every placement and attaches its program.
///
/// All events — branch stacks, cycles and cpu-clock alike — go through our own
/// `perf_event_open` + `PERF_EVENT_IOC_SET_BPF` rather than aya's `PerfEvent::attach`:
/// aya cannot request branch stacks, and the period re-draws need each event's fd for
/// `PERF_EVENT_IOC_PERIOD`. One code path for every mode.
fn open_events(
    bpf: &Ebpf,
    specs: &[EventSpec],
    places: &[(i32, i32)],
    extra_flags: u64,
) -> Result<Vec<OpenEvent>, CollectError> {
    let mut open = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        for &(pid, cpu) in places {
            match open_attached(bpf, spec, extra_flags, pid, cpu) {
                Ok(fd) => open.push(OpenEvent {
                    fd,
                    spec_index: i,
                    pid,
                    cpu,
                    seen_at_redraw: 0,
                    redraw_after: 0,
                }),
                // A thread that exited since /proc/PID/task was listed.
                Err(CollectError::Open { cause, .. })
                    if cause.raw_os_error() == Some(libc::ESRCH) && pid > 0 => {}
                Err(e) => return Err(e),
            }
        }
    }
    match places.first() {
        // Every thread of every target exited before its events were opened.
        Some(&(pid, _)) if open.is_empty() && pid > 0 => {
            Err(CollectError::NoSuchProcess(pid as u32))
        }
        _ => Ok(open),
    }
}

/// Opens `spec` (plus `extra_flags`) on `pid`/`cpu` as `perf_event_open` takes them and
/// attaches the spec's program. The fd keeps the program attached.
pub fn open_attached(
    bpf: &Ebpf,
    spec: &EventSpec,
    extra_flags: u64,
    pid: i32,
    cpu: i32,
) -> Result<OwnedFd, CollectError> {
    let mut attr = spec.attr;
    attr.flags |= extra_flags;
    let fd = sys::perf_event_open(&attr, pid, cpu).map_err(|cause| CollectError::Open {
        event: spec.name.clone(),
        on: match (pid, cpu) {
            (0, -1) => "this process".to_string(),
            (p, -1) => format!("pid {p}"),
            (-1, c) => format!("cpu {c}"),
            (p, c) => format!("pid {p} on cpu {c}"),
        },
        cause,
    })?;
    sys::set_bpf(&fd, program_fd(bpf, spec.program)?).map_err(|cause| CollectError::Attach {
        event: spec.name.clone(),
        cause,
    })?;
    Ok(fd)
}

/// Collects until the duration ends, the target exits or SIGINT/SIGTERM, then drains
/// everything. `notify` receives one-line status messages (mode, downgrades) as they
/// happen, before any report.
pub fn collect(
    opts: &CollectOptions,
    notify: &mut dyn FnMut(&str),
) -> Result<Collected, CollectError> {
    let caps = Capabilities::probe();
    caps.check_privileges()
        .map_err(CollectError::NotPrivileged)?;
    let mut target = opts.target.clone();
    if let Target::Pids(pids) = &target {
        if pids.is_empty() {
            return Err(CollectError::NoTarget);
        }
        let (pids, notes) = target::resolve_pids(pids)?;
        for n in notes {
            notify(&format!("note: {n}"));
        }
        target = Target::Pids(pids);
    }
    if let Target::Command(argv) = &target {
        target::resolve_command(argv.first().ok_or(CollectError::NoTarget)?)?;
    }
    check_open_files(0)?;
    if !caps.btf {
        notify("note: no kernel BTF (/sys/kernel/btf/vmlinux missing); trying to load without it");
    }
    let thinning = opts.perturbation.thinning(opts.thinning);
    let bpf_cfg = KernelConfig {
        thinning,
        include_kernel: opts.include_kernel as u32,
        _pad: 0,
    };
    let mut bpf = load(opts.ring_bytes, bpf_cfg, caps.btf)?;

    // Signals are caught from here on, so a SIGINT during set-up still reports.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut sigint, mut sigterm) = rt.block_on(async {
        Ok::<_, io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;

    // From here until its release, an error drops `child`, which kills and reaps it.
    let child = match &target {
        Target::Command(argv) => Some(target::spawn_suspended(argv)?),
        _ => None,
    };
    let (places, extra) = placements(&target, child.as_ref().map(|c| c.pid))?;
    // Two events per placement in the cpi and ip-sampling modes.
    check_open_files(2 * places.len() as u64)?;

    // The ladder: step down (and say why) while the mode's events cannot be opened.
    let (mut mode, mut reason) = caps.mode();
    notify(&format!("mode: {} — {reason}", mode_name(mode)));
    let (specs, mut open) = loop {
        let specs = events::plan(mode, caps.vendor, &opts.rate, opts.include_kernel);
        match open_events(&bpf, &specs, &places, extra) {
            Ok(open) => break (specs, open),
            Err(CollectError::Open {
                event,
                cause: source,
                ..
            }) if events::step_down(mode).is_some() => {
                mode = events::step_down(mode).unwrap_or(Mode::TimeProfile);
                reason = format!(
                    "{event} cannot be opened here ({source}); stepped down to {}: {}",
                    mode_name(mode),
                    match mode {
                        Mode::IpSampling => {
                            "cycles and instructions IP samples, CPI per unit is imprecise"
                        }
                        _ => "cpu-clock time profile, no cycles, no instructions, no CPI",
                    }
                );
                notify(&format!("mode: {} — {reason}", mode_name(mode)));
            }
            Err(e) => return Err(e),
        }
    };

    if let Some(p) = opts
        .rate
        .period
        .filter(|&p| p < events::MIN_CLOCK_PERIOD_NS)
    {
        if specs.iter().any(|s| s.unit == "ns") {
            notify(&format!(
                "note: cpu-clock fires at most every {} ns: period {p} ns raised to that",
                events::MIN_CLOCK_PERIOD_NS
            ));
        }
    }
    let started = Instant::now();
    let command_pid = match child {
        Some(c) => Some(c.release()?),
        None => {
            for e in &open {
                sys::enable(&e.fd)?;
            }
            None
        }
    };
    let watch: Vec<u32> = match (&target, command_pid) {
        (_, Some(pid)) => vec![pid],
        (Target::Pids(pids), None) => pids.clone(),
        _ => Vec::new(),
    };

    let ring = RingBuf::try_from(bpf.take_map("SAMPLES").ok_or_else(|| CollectError::Load {
        hint: "",
        cause: "map SAMPLES missing".into(),
    })?)
    .map_err(|e| CollectError::Load {
        hint: "",
        cause: e.into(),
    })?;
    let window = opts.window.unwrap_or(match caps.lbr_depth {
        Some(depth) => policy::range_window(depth as usize),
        None => policy::FALLBACK_RANGE_WINDOW,
    });
    let mut drain = Drain::new(window);
    let stop = match rt.block_on(run(
        opts,
        &specs,
        &mut open,
        ring,
        &mut drain,
        &watch,
        &mut sigint,
        &mut sigterm,
    )) {
        Ok(stop) => stop,
        Err(e) => {
            if let Some(pid) = command_pid {
                finish_child(pid, StopReason::Signal("error"), notify);
            }
            return Err(e);
        }
    };
    let duration_secs = started.elapsed().as_secs_f64();

    let counters = read_counters(&bpf);
    let command_status = command_pid.map(|pid| finish_child(pid, stop, notify));
    drop(open); // detaches the programs

    let events = specs
        .iter()
        .map(|s| EventInfo {
            role: s.role_name().to_string(),
            name: s.name.clone(),
            period: s.policy.base,
            jitter: if opts.perturbation.user() {
                s.policy.jitter
            } else {
                0
            },
            thinning: thinning.keep_one_in,
            unit: s.unit.to_string(),
            samples: drain.received.get(&s.role).copied().unwrap_or(0),
        })
        .collect();
    let lost = LossReport {
        ring_full: counters[Counter::RingFull as usize],
        branch_errors: counters[Counter::BranchError as usize],
        malformed: drain.malformed,
        thinned: counters[Counter::Thinned as usize],
        ..Default::default()
    };
    let run = RunInfo {
        mode,
        mode_reason: reason,
        command: match &target {
            Target::Command(argv) => argv.clone(),
            _ => Vec::new(),
        },
        duration_secs,
        events,
        perturbation: opts.perturbation.name().to_string(),
        lost,
    };
    Ok(Collected {
        set: drain.set,
        run,
        stop,
        command_status,
    })
}

#[allow(clippy::too_many_arguments)]
async fn run(
    opts: &CollectOptions,
    specs: &[EventSpec],
    open: &mut [OpenEvent],
    ring: RingBuf<MapData>,
    drain: &mut Drain,
    watch: &[u32],
    sigint: &mut tokio::signal::unix::Signal,
    sigterm: &mut tokio::signal::unix::Signal,
) -> Result<StopReason, CollectError> {
    // SAFETY: the ring buffer and pidfds own their fds, which stay open as long as
    // the AsyncFd that wraps them.
    let mut ring = unsafe { AsyncFd::register(ring) }.map_err(io::Error::from)?;
    let mut pidfds = Vec::new();
    for &pid in watch {
        // A pid that is already gone has exited: nothing to wait for.
        if let Ok(fd) = sys::pidfd_open(pid as i32) {
            pidfds.push(unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?);
        }
    }
    let all_exited = async {
        for fd in &pidfds {
            let _ = fd.readable().await;
        }
    };
    tokio::pin!(all_exited);
    let watching = !watch.is_empty();
    let deadline = tokio::time::sleep(opts.duration.unwrap_or_default());
    tokio::pin!(deadline);
    // The kernel side wakes us only when the ring is a quarter full: drain on a timer.
    let mut poll = tokio::time::interval(DRAIN_EVERY);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rng = Rng::new(seed());
    let redraws = opts.perturbation.user();
    let keep_one_in = u64::from(opts.perturbation.thinning(opts.thinning).keep_one_in.max(1));
    for e in open.iter_mut() {
        e.redraw_after = RedrawSchedule::next(&mut rng);
    }
    let stop = loop {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                drain_all(guard.get_inner_mut(), drain);
                guard.clear_ready();
                if redraws {
                    redraw_due(specs, open, drain, keep_one_in, &mut rng);
                }
            }
            _ = poll.tick() => {
                drain_all(ring.get_mut(), drain);
                if redraws {
                    redraw_due(specs, open, drain, keep_one_in, &mut rng);
                }
            }
            _ = &mut deadline, if opts.duration.is_some() => break StopReason::Duration,
            _ = &mut all_exited, if watching => break StopReason::TargetExit,
            _ = sigint.recv() => break StopReason::Signal("SIGINT"),
            _ = sigterm.recv() => break StopReason::Signal("SIGTERM"),
        }
    };
    // Shutdown: no new samples, then everything already written.
    for e in open {
        let _ = sys::disable(&e.fd);
    }
    drain_all(ring.get_mut(), drain);
    // A program that was mid-run on another CPU commits within microseconds.
    tokio::time::sleep(Duration::from_millis(20)).await;
    drain_all(ring.get_mut(), drain);
    Ok(stop)
}

/// Period re-draws per drain pass at most (≈ 4.3 µs each), so a process with thousands
/// of threads does not turn re-draws into a CPU hog; the rest wait for the next pass.
const REDRAWS_PER_PASS: usize = 64;

/// Re-draws the period of every event that has fired as often as [`RedrawSchedule`]
/// asks since its last re-draw (records × the thinning factor ≈ overflows). Events the
/// kernel created by `inherit` (threads started later) have no fd here and keep the
/// period they were born with.
fn redraw_due(
    specs: &[EventSpec],
    open: &mut [OpenEvent],
    drain: &mut Drain,
    keep_one_in: u64,
    rng: &mut Rng,
) {
    let mut done = 0;
    for e in open.iter_mut() {
        let role = specs[e.spec_index].role;
        let seen = if e.cpu >= 0 {
            drain.by_cpu.get(&(role, e.cpu as u32))
        } else {
            drain.by_thread.get(&(role, e.pid as u32))
        }
        .copied()
        .unwrap_or(0);
        if (seen - e.seen_at_redraw) * keep_one_in < e.redraw_after {
            continue;
        }
        // A failure (e.g. the event's thread exited) only means that event keeps its
        // previous period.
        let spec = &specs[e.spec_index];
        let period = spec.policy.draw(rng);
        if sys::set_period(&e.fd, period).is_ok() && spec.attr.type_ == sys::PERF_TYPE_SOFTWARE {
            // Records already in the ring but drained after this get the new period:
            // at most one per re-draw, ≤ 1/16 off.
            let periods = if e.cpu >= 0 {
                &mut drain.clock_period_by_cpu
            } else {
                &mut drain.clock_period_by_thread
            };
            let key = (spec.role, if e.cpu >= 0 { e.cpu } else { e.pid } as u32);
            periods.insert(key, (period, spec.policy.base));
        }
        e.seen_at_redraw = seen;
        e.redraw_after = RedrawSchedule::next(rng);
        done += 1;
        if done == REDRAWS_PER_PASS {
            break;
        }
    }
}

/// How often the collector drains the ring buffer without a wake-up.
const DRAIN_EVERY: Duration = Duration::from_millis(25);

fn drain_all(ring: &mut RingBuf<MapData>, drain: &mut Drain) {
    while let Some(item) = ring.next() {
        drain.add(&item);
    }
}

/// Kernel counters summed over CPUs, indexed by [`Counter`].
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

/// How long a started command gets to exit after SIGTERM before it is killed.
const CHILD_TERM_GRACE: Duration = Duration::from_secs(2);

/// Ends the command cpi-bpf started when collection stopped before it did, and reaps
/// it: SIGTERM, then SIGKILL (said) if it is still there after [`CHILD_TERM_GRACE`].
fn finish_child(pid: u32, stop: StopReason, notify: &mut dyn FnMut(&str)) -> i32 {
    if stop == StopReason::TargetExit {
        return target::reap(pid).unwrap_or(-1);
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + CHILD_TERM_GRACE;
    loop {
        if let Some(status) = target::try_reap(pid) {
            return status;
        }
        if Instant::now() >= deadline {
            notify(&format!(
                "note: the command (pid {pid}) did not exit within {} s of SIGTERM: killing it",
                CHILD_TERM_GRACE.as_secs()
            ));
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return target::reap(pid).unwrap_or(-1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    t ^ ((std::process::id() as u64) << 32)
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Cpi => "cpi",
        Mode::IpSampling => "ip-sampling",
        Mode::TimeProfile => "time-profile",
        Mode::Simulated => "simulated",
    }
}

/// Opens `spec` on the calling process (disabled) and, given a loaded object, attaches
/// its program: what `cpi-bpf doctor` uses to tell what this machine can sample.
pub fn try_event(spec: &EventSpec, bpf: Option<&Ebpf>) -> Result<(), CollectError> {
    match bpf {
        Some(bpf) => open_attached(bpf, spec, 0, 0, -1).map(drop),
        None => sys::perf_event_open(&spec.attr, 0, -1)
            .map(drop)
            .map_err(|cause| CollectError::Open {
                event: spec.name.clone(),
                on: "this process".to_string(),
                cause,
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_follow_the_target() {
        let me = std::process::id();
        let (places, flags) = placements(&Target::Pids(vec![me]), None).unwrap();
        assert!(
            places.contains(&(me as i32, -1)),
            "one event per thread, any CPU"
        );
        assert!(places.iter().all(|&(_, cpu)| cpu == -1));
        assert_eq!(flags, sys::flag::INHERIT, "threads created later follow");

        let (places, flags) = placements(&Target::SystemWide, None).unwrap();
        assert_eq!(places.len(), target::online_cpus().len());
        assert!(places.iter().all(|&(pid, cpu)| pid == -1 && cpu >= 0));
        assert_eq!(flags, 0);

        let cmd = Target::Command(vec!["true".into()]);
        let (places, flags) = placements(&cmd, Some(4242)).unwrap();
        assert_eq!(places, [(4242, -1)]);
        assert_eq!(flags, sys::flag::INHERIT | sys::flag::ENABLE_ON_EXEC);

        assert!(matches!(
            placements(&Target::Pids(vec![u32::MAX - 1]), None),
            Err(CollectError::NoSuchProcess(_))
        ));
    }
}
