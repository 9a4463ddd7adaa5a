//! The always-on agent (`cpi-bpf agent`): the collector Session
//! (cpi-user/src/collect/session.rs) run without end and cut into windows aligned to the
//! wall clock (`--interval`). At each boundary the window's samples go over a bounded
//! channel to the analysis thread, which analyses them into a [`Window`] and hands it to
//! the sinks (`sink::Sink`) — the store ([`store`]), Prometheus ([`metrics`]) and the
//! Pyroscope and OTLP pushes ([`push`]) — while the session keeps collecting. After each
//! window the overhead governor (`governor`) may change the sampling frequency.
//!
//! State that outlives windows, all bounded:
//! - the symbolizer's binaries (cpi-user/src/binary/symbolize.rs), kept under
//!   `--cache-mib` by least-recent use;
//! - what the symbolizer holds per process, dropped when the collector, the one tracker
//!   of processes (by pid and start time), reports the pid reused (before the window is
//!   analysed) or the process gone (after its last window): `Collected::changes`.
//!
//! Narrowing: `--pid`, `--cgroup` and the pod selectors (`--pod`, `--namespace`,
//! `--container`: `pods`) filter in the kernel (system-wide events whose eBPF program
//! drops every other process's samples first thing, counted as `filtered_in_kernel`:
//! cpi-user/src/collect/filter.rs), so a filtered agent pays for what it keeps. The
//! selected pods' cgroups are found again at every kubelet refresh on a thread of their
//! own, and the collection loop hands them to the kernel filter within
//! `APPLY_PODS_WITHIN`. Each window's samples pass the same tests again in user space,
//! with `--comm` (a regular expression, user space only); a process whose cgroup can no
//! longer be read when its window ends is left out with `--cgroup`.
//!
//! Windows keep only the instructions with evidence (samples or execution counts) in
//! their per-instruction lines.
//!
//! Stopping: the first SIGTERM/SIGINT ends the current window early, which is analysed
//! and written like any other; the sinks get [`FLUSH_WITHIN`] to deliver; then the
//! agent returns. The first signal restores the default action, so a second one ends the
//! process at once — also when the analysis thread is stuck: the collection loop never
//! blocks on it (while a window waits for the analysis it drains into the next window for
//! one interval, then stops draining, so the kernel's buffers take the excess as counted
//! losses, not memory, but it still sees signals; it
//! logs a window late by two intervals, at least [`STALL_AFTER_MIN`]), and `/metrics` exports
//! `cpi_bpf_last_window_age_seconds` and `cpi_bpf_store_failures_total`.
//!
//! Messages go through the `log` facade, as the rest of the library's (the binary prints
//! them on stderr up to `--log-level`): an error is something that failed (a window not
//! stored, say) while the agent goes on; a warning, something the operator should know (a
//! sink falling behind); info, start, stop and governor changes; debug, every window.

pub mod config;
pub(crate) mod error;
pub(crate) mod governor;
pub mod kubelet;
pub mod metrics;
pub(crate) mod peer;
pub(crate) mod pods;
pub mod push;
pub mod sink;
pub mod store;
mod sys;

use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{
    channel, sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError,
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use error::AgentError;
pub use sys::clock_ticks_per_second;

use config::AgentConfig;
use cpi_user::binary::{Symbolizer, SymbolizerOptions};
use cpi_user::collect::events::Rate;
use cpi_user::collect::filter::CgroupV2;
use cpi_user::collect::{
    self, CollectError, CollectOptions, Collected, Session, StopReason, Target,
};
use cpi_user::procmap::CaptureCounts;
use cpi_user::profile::analyze::{analyze_with, LineDetail};
use cpi_user::profile::model::{Mode, Profile};
use cpi_user::profile::{AnalysisOptions, SampleSet};
use governor::{Decision, Governor, Usage};
use kubelet::Kubelet;
use metrics::{Metrics, MetricsLimits};
use pods::PodFilter;
use push::{PushConfig, Pusher};
use sink::Sink;
use store::{Store, StoreError};

/// How long the sinks get to deliver after the last window.
pub const FLUSH_WITHIN: Duration = Duration::from_secs(5);
/// A window's analysis is reported late after two intervals, and never before this.
pub const STALL_AFTER_MIN: Duration = Duration::from_secs(10);
/// The selected pods' new cgroups reach the kernel filter within this of being found.
pub(crate) const APPLY_PODS_WITHIN: Duration = Duration::from_secs(1);

/// The agent's own state after a window, as the metrics export it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentStatus {
    /// The collection mode (`cpi_bpf_mode`).
    pub mode: Mode,
    /// Windows completed since start.
    pub windows: u64,
    /// Analysis time of the last window.
    pub analysis_seconds: f64,
    /// Processes the agent holds state for: the larger of the collector's count
    /// (cpi-user/src/collect/drain.rs) and the analysis's (keyed by pid and start time).
    pub tracked_processes: usize,
    /// Bytes held by the symbolizer's caches (bounded by `--cache-mib`).
    pub cache_bytes: u64,
    /// Bytes of the store's window files.
    pub store_bytes: u64,
    /// Windows the store failed to write since start.
    pub store_failures: u64,
    /// The sampling frequency the governor runs at now.
    pub sampling_frequency_hz: u64,
    /// Cumulative in-kernel run time of the agent's BPF programs.
    pub bpf_run_seconds: f64,
    /// Evictions and reopens of the collector's captured binaries since start.
    pub captured_files: CaptureCounts,
    /// Requests to the kubelet since start; `None`: not on Kubernetes.
    pub kubelet_requests: Option<kubelet::Requests>,
}

/// One window of collection, analysed.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    /// Wall-clock start of the window (a multiple of `--interval`, but the first).
    pub start: std::time::SystemTime,
    /// Wall-clock end of the window.
    pub end: std::time::SystemTime,
    /// The window's samples, analysed.
    pub profile: Profile,
}

/// Why the agent could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A bad flag or config-file key or value.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The store directory cannot be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The metrics server or the push sink cannot start.
    #[error(transparent)]
    Sink(#[from] AgentError),
    /// Collection could not start (or failed).
    #[error(transparent)]
    Collect(#[from] CollectError),
    /// No thread for the analysis.
    #[error("cannot start the analysis thread: {0}")]
    Thread(std::io::Error),
}

/// `m`'s guard; a thread that panicked holding it left the state whole enough to go on
/// with (counters, caches, queues), so the agent does.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The sinks, checked and started (before collection starts), in the order they get
/// each window: the store (whose bytes and failures the metrics export), the pushes
/// (to Pyroscope, to an OTLP Collector, or both), the metrics.
struct Sinks(Vec<Box<dyn Sink>>);

/// A started agent: sinks up, collection running.
pub struct Agent {
    config: AgentConfig,
    session: Session,
    sinks: Sinks,
    started: SystemTime,
    /// The kubelet client, shared by the pod filter and the analysis.
    kubelet: Option<Arc<Mutex<Kubelet>>>,
    pods: Option<PodFilter>,
    /// The session starts at its rate.
    governor: Governor,
    /// The metrics server's CPU time, ns, which the governor leaves out ([`usage`]).
    serving: Option<Arc<AtomicU64>>,
}

/// The pod filter's newest set of cgroups, not yet handed to the kernel filter.
type DueCgroups = Arc<Mutex<Option<Vec<CgroupV2>>>>;

/// What [`Agent::run`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Windows analysed.
    pub windows: u64,
    /// Why collection stopped.
    pub stop: Option<StopReason>,
}

impl Sinks {
    /// The sinks, and the metrics server's CPU time ([`Metrics::serving_cpu`]).
    fn start(c: &AgentConfig) -> Result<(Sinks, Option<Arc<AtomicU64>>), StartError> {
        let store = Store::open(&c.store, c.retain, c.store_max_bytes, c.store_group)?;
        let mut metrics = c
            .metrics_addr
            .map(|addr| {
                Metrics::serve(
                    addr,
                    MetricsLimits {
                        top_comms: c.metrics_top_comms,
                        top_functions: c.metrics_top_functions,
                    },
                )
            })
            .transpose()?;
        let push = |url: &String| PushConfig {
            url: url.clone(),
            tenant: c.push_tenant.clone(),
            service_label: c.service_label,
            queue_windows: c.push_queue,
            timeout: c.push_timeout,
            ca_file: c.push_ca.clone(),
            password_file: c.push_password_file.clone(),
            token_file: c.push_token_file.clone(),
        };
        let mut pushers = Vec::new();
        if let Some(url) = &c.push_url {
            pushers.push(Pusher::new(push(url))?);
        }
        if let Some(url) = &c.otlp_url {
            pushers.push(Pusher::otlp(push(url))?);
        }
        if let Some(m) = &mut metrics {
            m.export_pushes(pushers.iter().map(Pusher::counts).collect());
        }
        let serving = metrics.as_ref().map(Metrics::serving_cpu);
        let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(store)];
        sinks.extend(pushers.into_iter().map(|p| Box::new(p) as Box<dyn Sink>));
        sinks.extend(metrics.map(|m| Box::new(m) as Box<dyn Sink>));
        Ok((Sinks(sinks), serving))
    }
}

/// Checks a configuration as far as it can be without collecting: the store is
/// writable, the metrics address can be bound, the push URL is valid. Nothing is left
/// running.
pub fn check(c: &AgentConfig) -> Result<(), StartError> {
    Sinks::start(c).map(drop)
}

fn collect_options(c: &AgentConfig, frequency: u64) -> CollectOptions {
    CollectOptions {
        target: if c.pids.is_empty() && c.cgroup.is_none() && c.pods.is_empty() {
            Target::SystemWide
        } else {
            Target::Filtered(collect::Filter {
                pids: c.pids.clone(),
                cgroup: c.cgroup.clone(),
                cgroups_later: !c.pods.is_empty(),
            })
        },
        duration: None,
        rate: Rate {
            frequency,
            period: None,
            core_hz: collect::events::nominal_core_hz(),
        },
        include_kernel: c.include_kernel,
        perturbation: cpi_common::policy::Perturbation::User,
        thinning: 1,
        // Fewer wake-ups than the one-shot command (each costs the agent more than
        // the work it does; BENCHMARKS.md, "Agent steady state"): periods re-drawn
        // within 200 ms of due, the ring read every 100 ms (short-lived processes are
        // explained by the side-band records).
        redraw_every: Duration::from_millis(200),
        ring_bytes: c.ring_bytes,
        window: None,
        cpu_time: true,
        drain_every: Duration::from_millis(100),
        stacks: c.stacks,
        stack_memory: c.stack_memory(),
    }
}

impl Agent {
    /// Starts the sinks (a problem with any of them is an error before anything
    /// collects), then the collector Session; the mode line and every later message go
    /// to the `log` facade.
    pub fn new(config: AgentConfig) -> Result<Agent, StartError> {
        sys::one_heap_arena();
        let (sinks, serving) = Sinks::start(&config)?;
        let cpus = collect::target::online_cpus().len();
        let governor = Governor::new(
            config.overhead_budget_pct,
            config.min_frequency,
            config.frequency,
            cpus,
        );
        let opts = collect_options(&config, governor.frequency());
        let mut session = Session::open(&opts, &mut |m| log::info!("{}", m.full))?;
        log::info!("{}", governor.start_line(cpus));
        let kubelet = config
            .kubelet_url
            .as_deref()
            .map(|u| Arc::new(Mutex::new(Kubelet::new(u))));
        // Checked by the config: selectors come with a kubelet and a cgroup2 mount.
        let mut pods = match (&kubelet, collect::filter::cgroup2_root()) {
            (Some(k), Some(root)) if !config.pods.is_empty() => Some(PodFilter::new(
                k.clone(),
                config.pods.clone(),
                root.to_path_buf(),
            )),
            _ => None,
        };
        if let Some(set) = pods.as_mut().and_then(|p| p.refresh()) {
            session.set_cgroups(set)?;
        }
        Ok(Agent {
            config,
            session,
            sinks,
            started: SystemTime::now(),
            kubelet,
            pods,
            governor,
            serving,
        })
    }

    /// The mode collection runs in (after the capability ladder).
    pub fn mode(&self) -> Mode {
        self.session.mode()
    }

    /// Collects window after window until SIGTERM/SIGINT (or the targets of `--pid`
    /// exit), then analyses and stores the last window and flushes the sinks.
    pub fn run(self) -> Result<Summary, StartError> {
        let Agent {
            config,
            mut session,
            sinks,
            started,
            kubelet,
            pods,
            mut governor,
            serving,
        } = self;
        let mode = session.mode();
        // One window waits while one is analysed: a slower analysis holds up draining,
        // and the ring buffer (counted losses) takes the excess, not memory.
        let (tx, rx) = sync_channel::<Job>(1);
        let analysis = {
            let config = config.clone();
            std::thread::Builder::new()
                .name("cpi-bpf-analysis".into())
                .spawn(move || analysis_loop(rx, sinks, &config, kubelet))
                .map_err(StartError::Thread)?
        };
        // Ends with the run (its sender dropped); never joined: a kubelet request in
        // flight must not hold up shutdown.
        let (_pods_stop, pods_due) = match pods {
            Some(p) => {
                let (stop, due) = spawn_pod_filter(p)?;
                (Some(stop), Some(due))
            }
            None => (None, None),
        };
        governor.observe(usage(&session, serving.as_deref()), Duration::ZERO);
        let mut start = started;
        let mut window_started = Instant::now();
        let mut windows = 0u64;
        // A window waiting for the analysis thread when a stop came.
        let mut pending = None;
        let stall_after = (config.interval * 2).max(STALL_AFTER_MIN);
        let stop = loop {
            let boundary = next_boundary(SystemTime::now(), config.interval);
            let until = Instant::now()
                + boundary
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
            let stop = collect_until(&mut session, until, pods_due.as_ref())?;
            if stop.is_some() {
                break stop;
            }
            let end = SystemTime::now();
            let collected = session.take_window();
            windows += 1;
            let wall = window_started.elapsed();
            window_started = Instant::now();
            if let Some(d) = governor.observe(usage(&session, serving.as_deref()), wall) {
                govern(&mut session, &mut governor, d, windows);
            }
            let job = Job {
                collected,
                start,
                end,
                windows,
                mode,
                frequency: governor.frequency(),
                bpf_seconds: bpf_seconds(&session),
            };
            start = end;
            let waiting = Waiting {
                windows,
                interval: config.interval,
                stall_after,
                pods_due: pods_due.as_ref(),
            };
            match hand_over(&tx, job, &mut session, &waiting)? {
                Handed::Sent => {}
                Handed::Disconnected => break None,
                Handed::Stopped(s, job) => {
                    pending = Some(*job);
                    break Some(s);
                }
            }
        };
        windows += 1;
        let frequency = governor.frequency();
        let last = |collected, bpf_seconds| Job {
            collected,
            start,
            end: SystemTime::now(),
            windows,
            mode,
            frequency,
            bpf_seconds,
        };
        finish(session, tx, pending, last, stop)?;
        if analysis.join().is_err() {
            log::error!("the analysis thread panicked");
        }
        Ok(Summary { windows, stop })
    }
}

/// What [`hand_over`] needs while it waits.
struct Waiting<'a> {
    windows: u64,
    interval: Duration,
    stall_after: Duration,
    pods_due: Option<&'a DueCgroups>,
}

/// How a window's hand-over to the analysis thread ended.
enum Handed {
    Sent,
    /// The analysis thread is gone.
    Disconnected,
    /// A stop came first: the window waits in the returned job.
    Stopped(StopReason, Box<Job>),
}

/// Hands the window over. While the analysis is still busy with the last one, go on
/// draining into the next window for up to one interval: a wait of a few hundred ms
/// overflowed the ring at 999 Hz on a build host (BENCHMARKS.md, "Agent memory: the ring
/// and the allocator"), and that window's stacks are bounded as any window's. Past that,
/// wait without draining (the kernel's buffers take the excess, counted: a stuck
/// analysis grew the agent's heap 12 MiB in 60 s when this drained without end), seeing
/// signals, and say so once it is late.
fn hand_over(
    tx: &SyncSender<Job>,
    mut job: Job,
    session: &mut Session,
    w: &Waiting<'_>,
) -> Result<Handed, StartError> {
    let waiting = Instant::now();
    let mut told = false;
    loop {
        match tx.try_send(job) {
            Ok(()) => return Ok(Handed::Sent),
            Err(TrySendError::Disconnected(_)) => return Ok(Handed::Disconnected),
            Err(TrySendError::Full(j)) => job = j,
        }
        if !told && waiting.elapsed() > w.stall_after {
            told = true;
            log::warn!(
                "window {}: the analysis of the previous window has not finished after {} s; \
                 this window waits (collection goes on, a second SIGTERM ends the agent)",
                w.windows,
                waiting.elapsed().as_secs()
            );
        }
        let tick = Instant::now() + Duration::from_millis(100);
        let stop = if waiting.elapsed() < w.interval {
            collect_until(session, tick, w.pods_due)?
        } else {
            session.wait_until(Some(tick))?
        };
        if let Some(s) = stop {
            return Ok(Handed::Stopped(s, Box::new(job)));
        }
    }
}

/// Ends collection after a stop: the window left waiting and the last one (`last`
/// makes its job of what collection still held and the BPF time) go to the analysis
/// thread, whose channel is then closed.
fn finish(
    session: Session,
    tx: SyncSender<Job>,
    pending: Option<Job>,
    last: impl FnOnce(Collected, f64) -> Job,
    stop: Option<StopReason>,
) -> Result<(), StartError> {
    // A second signal ends the process at once.
    for sig in [libc::SIGTERM, libc::SIGINT] {
        collect::sys::default_signal_action(sig);
    }
    if let Some(s) = stop {
        log::info!("stopping ({s}): analysing the last window, flushing the sinks");
    }
    let bpf = bpf_seconds(&session);
    let collected = session.finish()?;
    if let Some(job) = pending {
        let _ = tx.send(job);
    }
    let _ = tx.send(last(collected, bpf));
    Ok(())
}

/// Starts the thread that makes the pod filter again at every kubelet refresh; it
/// leaves each new set in the slot returned, and ends when the sender returned is
/// dropped.
fn spawn_pod_filter(
    mut pods: PodFilter,
) -> Result<(std::sync::mpsc::Sender<()>, DueCgroups), StartError> {
    let (stop, stopped) = channel::<()>();
    let due = DueCgroups::default();
    let slot = due.clone();
    std::thread::Builder::new()
        .name("cpi-bpf-pods".into())
        .spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(kubelet::REFRESH) {
                if let Some(set) = pods.refresh() {
                    *lock(&slot) = Some(set);
                }
            }
        })
        .map_err(StartError::Thread)?;
    Ok((stop, due))
}

/// Collects until `until` (or a stop), handing the pod filter's new cgroups, if any, to
/// the kernel filter within [`APPLY_PODS_WITHIN`] of their coming.
fn collect_until(
    session: &mut Session,
    until: Instant,
    due: Option<&DueCgroups>,
) -> Result<Option<StopReason>, CollectError> {
    let Some(due) = due else {
        return session.run_until(Some(until));
    };
    loop {
        let slice = until.min(Instant::now() + APPLY_PODS_WITHIN);
        if let Some(stop) = session.run_until(Some(slice))? {
            return Ok(Some(stop));
        }
        let set = lock(due).take();
        if let Some(set) = set {
            if let Err(e) = session.set_cgroups(set) {
                log::error!("the pods' cgroups: {e}");
            }
        }
        if Instant::now() >= until {
            return Ok(None);
        }
    }
}

/// One window on its way to analysis, with the collector's side of the status.
struct Job {
    collected: Collected,
    start: SystemTime,
    end: SystemTime,
    windows: u64,
    mode: Mode,
    frequency: u64,
    bpf_seconds: f64,
}

/// The next multiple of `interval` since the Unix epoch after `now`.
pub(crate) fn next_boundary(now: SystemTime, interval: Duration) -> SystemTime {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let step = interval.as_millis().max(1);
    let next = (since.as_millis() / step + 1) * step;
    UNIX_EPOCH + Duration::from_millis(next as u64)
}

/// Logs a window's overhead and applies the governor's change, if any (one line each).
fn govern(session: &mut Session, governor: &mut Governor, d: Decision, windows: u64) {
    log::debug!(
        "window {windows}: overhead {:.3} % of one CPU",
        d.overhead_pct
    );
    let Some(j) = d.judged else {
        return;
    };
    let Some((from, to)) = j.change() else {
        log::debug!("governor: {j}");
        return;
    };
    match session.set_frequency(to) {
        Ok(()) => log::info!("governor: {j}"),
        Err(e) => {
            governor.set_frequency(from);
            log::warn!("governor: cannot set {to} Hz: {e}");
        }
    }
}

fn bpf_seconds(s: &Session) -> f64 {
    s.bpf_run_time().map_or(0.0, |d| d.as_secs_f64())
}

/// What the governor counts: the agent's CPU time less what its metrics server spent
/// (`serving`, ns): a flood of scrapes must not move the sampling rate.
fn usage(s: &Session, serving: Option<&AtomicU64>) -> Usage {
    Usage {
        cpu_seconds: sampling_cpu_seconds(serving),
        bpf_seconds: bpf_seconds(s),
    }
}

/// This process's CPU time less `serving`'s (ns), seconds.
fn sampling_cpu_seconds(serving: Option<&AtomicU64>) -> f64 {
    let serving = serving.map_or(0, |ns| ns.load(std::sync::atomic::Ordering::Relaxed));
    (self_cpu_seconds().unwrap_or(0.0) - serving as f64 / 1e9).max(0.0)
}

/// User + system CPU time of this process, all threads, to the nanosecond
/// ([`sys::process_cpu_time`]).
pub(crate) fn self_cpu_seconds() -> Option<f64> {
    sys::process_cpu_time().map(|d| d.as_secs_f64())
}

/// The analysis thread: window → profile → sinks, until the channel closes; then
/// flushes the push queue.
fn analysis_loop(
    rx: Receiver<Job>,
    mut sinks: Sinks,
    c: &AgentConfig,
    kubelet: Option<Arc<Mutex<Kubelet>>>,
) {
    let opts = AnalysisOptions {
        lines: LineDetail::Evidence,
        source_lines: c.source_lines,
        ..AnalysisOptions::default()
    };
    let mut sym = Symbolizer::new(SymbolizerOptions::default());
    // Checked at start (the session's kernel filter): a cgroup removed since keeps
    // nothing in user space either.
    let cgroup_rel = c.cgroup.as_ref().map(|d| {
        collect::filter::CgroupV2::at(d).map_or_else(|_| d.display().to_string(), |g| g.path)
    });
    for job in rx {
        let began = Instant::now();
        let Collected {
            mut set,
            run,
            held_processes,
            changes,
            unwind_heap,
            captured,
            ..
        } = job.collected;
        // The collector tracks processes; the symbolizer drops what it has of a pid
        // given to a new process before analysis, of a process gone after it (and
        // knows it gone meanwhile).
        for &pid in &changes.reused {
            sym.forget_process(pid);
        }
        for &pid in &changes.left {
            sym.process_gone(pid);
        }
        keep_wanted(&mut set, c, cgroup_rel.as_deref(), kubelet.as_ref());
        let mut profile = analyze_with(&set, run, &opts, &mut sym);
        drop(set);
        if let Some(k) = &kubelet {
            let mut k = lock(k);
            for p in &mut profile.processes {
                k.fill(&mut p.identity);
            }
        }
        keep_evidence_lines(&mut profile);
        for &pid in &changes.left {
            sym.forget_process(pid);
        }
        sym.trim(symbolizer_bytes(c, unwind_heap.other));
        let analysis_seconds = began.elapsed().as_secs_f64();
        let window = Window {
            start: job.start,
            end: job.end,
            profile,
        };
        let status = AgentStatus {
            mode: job.mode,
            windows: job.windows,
            analysis_seconds,
            // The symbolizer holds processes the collector holds, and drops them with it.
            tracked_processes: held_processes,
            cache_bytes: sym.cache_bytes() + unwind_heap.total(),
            // The store's, filled in by the store (the first sink).
            store_bytes: 0,
            store_failures: 0,
            sampling_frequency_hz: job.frequency,
            bpf_run_seconds: job.bpf_seconds,
            // Read after analysis: its reopens of this window count now.
            captured_files: captured.counts(),
            kubelet_requests: kubelet.as_ref().map(|k| lock(k).requests()),
        };
        report(&mut sinks, window, status);
        sys::release_free_heap();
    }
    for s in &mut sinks.0 {
        s.flush(FLUSH_WITHIN);
    }
}

/// Leaves in `set` only the processes the agent's selectors want: `--pid`, `--comm`,
/// `--cgroup` (by the cgroup the collector read) and the pods, tested again here as
/// the kernel tested them (the only test on kernels without it: 5.10).
fn keep_wanted(
    set: &mut SampleSet,
    c: &AgentConfig,
    cgroup_rel: Option<&str>,
    kubelet: Option<&Arc<Mutex<Kubelet>>>,
) {
    if !c.pids.is_empty() {
        set.processes.retain(|pid, _| c.pids.contains(pid));
    }
    if let Some(re) = &c.comm {
        set.processes.retain(|_, p| re.is_match(&p.comm));
    }
    // The cgroup the collector read while the process lived (cpi-user/src/collect/
    // drain.rs), the same copy pods are selected on.
    if let Some(want) = cgroup_rel {
        set.processes.retain(|_, p| {
            (p.identity.as_ref().and_then(|i| i.cgroup.as_deref()))
                .is_some_and(|g| g == want || g.starts_with(&format!("{want}/")) || want == "/")
        });
    }
    if let (Some(k), false) = (kubelet, c.pods.is_empty()) {
        let chosen = lock(k).select(&c.pods);
        set.processes
            .retain(|_, p| p.identity.as_ref().is_some_and(|id| chosen.matches(id)));
    }
}

/// Hands an analysed window to the sinks, in order, logging what any of them failed to
/// take (with its causes), then the window.
fn report(sinks: &mut Sinks, window: Window, mut status: AgentStatus) {
    for s in &mut sinks.0 {
        if let Err(e) = s.report(&window, &mut status) {
            log::error!("{}", cpi_user::chain(&*e));
        }
    }
    log::debug!(
        "window {}: {} processes, analysed in {:.3} s, {} tracked, cache {} B, store {} B",
        status.windows,
        window.profile.processes.len(),
        status.analysis_seconds,
        status.tracked_processes,
        status.cache_bytes,
        status.store_bytes
    );
}

/// What the symbolizer may keep across windows: `--cache-mib` less what call stacks may
/// hold at once ([`AgentConfig::stack_memory`]: three windows' stacks — collecting,
/// queued, analysed — and the unwind sections, their resident pages and copies
/// together) and the rest of the unwinder's heap (`unwind_other`). Before, the
/// symbolizer alone could fill `--cache-mib` and the stacks came on top: 93–98 MiB
/// anonymous on a build host (BENCHMARKS.md, "Agent memory on a build host"). The copies
/// were once reserved twice, in the sections' bound and as heap: a user's own toolchain,
/// whose 15 MiB of sections are copied, left the symbolizer too little to keep
/// `librustc_driver`'s names, parsed again every window (BENCHMARKS.md, "A user's own
/// toolchain").
fn symbolizer_bytes(c: &AgentConfig, unwind_other: u64) -> u64 {
    let stacks = if c.stacks {
        let m = c.stack_memory();
        3 * m.window_bytes as u64 + m.unwind_bytes
    } else {
        0
    };
    c.cache_bytes
        .saturating_sub(stacks)
        .saturating_sub(unwind_other)
}

/// Drops the per-instruction lines without samples or counts: a window of a big
/// function (thousands of instructions, a few sampled) would otherwise carry every
/// instruction's disassembly into the store, each window. `--annotate` on stored windows
/// shows the sampled/executed instructions.
fn keep_evidence_lines(p: &mut Profile) {
    for f in p.processes.iter_mut().flat_map(|p| p.functions.iter_mut()) {
        f.lines.retain(|l| l.samples > 0 || l.count > 0.0);
    }
}

/// The agent's log lines, caught in tests.
#[cfg(test)]
pub(crate) mod test_log {
    use std::cell::RefCell;

    thread_local! {
        static LINES: RefCell<Option<Vec<(log::Level, String)>>> = const { RefCell::new(None) };
    }

    struct Capture;

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }

        fn log(&self, r: &log::Record<'_>) {
            // The agent's own lines, not those of the HTTP client it calls.
            if r.target()
                .starts_with(module_path!().trim_end_matches("::test_log"))
            {
                LINES.with(|l| {
                    if let Some(v) = l.borrow_mut().as_mut() {
                        v.push((r.level(), r.args().to_string()));
                    }
                });
            }
        }

        fn flush(&self) {}
    }

    static CAPTURE: Capture = Capture;

    /// Runs `f`; what it logged on this thread, with the levels.
    pub(crate) fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<(log::Level, String)>) {
        // Set once per test process; a second call finds it set.
        let _ = log::set_logger(&CAPTURE);
        log::set_max_level(log::LevelFilter::Trace);
        LINES.with(|l| *l.borrow_mut() = Some(Vec::new()));
        let out = f();
        (
            out,
            LINES.with(|l| l.borrow_mut().take()).unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_are_multiples_of_the_interval() {
        let t = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        let ten = Duration::from_secs(10);
        assert_eq!(
            next_boundary(t(1_700_000_003_250), ten),
            t(1_700_000_010_000)
        );
        assert_eq!(
            next_boundary(t(1_700_000_010_000), ten),
            t(1_700_000_020_000)
        );
        assert_eq!(next_boundary(t(999), Duration::from_secs(1)), t(1000));
    }
}
