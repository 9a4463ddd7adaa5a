//! Prometheus metrics of the agent: `/metrics` on `--metrics-addr` (default
//! `crate::config::DEFAULT_METRICS_ADDR`, loopback), in the OpenMetrics text format written by the
//! `prometheus-client` crate. The names are a contract (README "Always-on"; dashboards and alerts query them):
//!
//! - per comm: `cpi_bpf_cycles_total`, `cpi_bpf_instructions_total` (modes with a PMU),
//!   `cpi_bpf_cpu_seconds_total` (sampled cpu-clock time, whenever the profile has it);
//! - `cpi_bpf_function_cpi{comm,binary,function}`: the last window's CPI of its top
//!   functions by cycles (cpi mode only; series of earlier windows are removed);
//! - health: samples per event, losses per reason (every field of
//!   [`LossReport`]), windows, analysis time, tracked processes, cache and store bytes,
//!   pushes, sampling frequency, in-kernel BPF time, mode, and the standard
//!   `process_cpu_seconds_total` / `process_resident_memory_bytes`.
//!
//! **Comm cardinality.** At most `top_comms` comms have their own series at any time, the
//! rest add to `comm="other"`; slots go by recent CPU, never first come (`slots`).
//!
//! The server runs on its own thread, a single-threaded tokio runtime serving every
//! client at once: one request per connection, each connection cut off after
//! [`CLIENT_TIMEOUT`] in all, at most `MAX_CLIENTS` open (a new one closes the oldest),
//! so idle or slow local clients cannot hold up a scrape (tested with 200 idle
//! connections and 20 one-byte-a-second clients). The exposition text is rendered under
//! a lock and written after it is released, so no client holds up
//! [`Metrics::observe`] for longer than the rendering. The server thread's CPU time is published (`Metrics::serving_cpu`)
//! so the governor leaves it out: scrapes are not sampling's cost, and 900 idle
//! connections churning through the `MAX_CLIENTS` slots made the governor cut sampling
//! from 76 to 19 Hz.
//!
//! Label values (comm, binary, function) come from other processes: they are escaped
//! for the terminal (cpi-user/src/fsafe/text.rs) and then for the exposition format
//! (`\\`, `\"`), which `prometheus-client` 0.24 does not do itself.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

mod slots;

use super::kubelet::Requests;
use super::push::{PushCounts, PushStats};
use super::sink::{Sink, SinkError};
use super::{lock, AgentError, AgentStatus, Window};
use cpi_user::binary::work::{binary_work, BinaryWork};
use cpi_user::procmap::CaptureCounts;
use cpi_user::profile::model::{LossReport, Mode, Profile};
use slots::{comm_totals, CommSlots, SlotChanges};

/// Longest a client may take to send its request or take the response.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// The label value that collects the comms without their own series.
pub(crate) const OTHER_COMM: &str = "other";
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const MAX_REQUEST: usize = 8192;
/// Connections served at once; the oldest is closed to admit a new one.
pub(crate) const MAX_CLIENTS: usize = 64;

/// `--metrics-top-comms` and `--metrics-top-functions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsLimits {
    /// Comms with series of their own; the rest are `comm="other"`.
    pub top_comms: usize,
    /// Functions in `cpi_bpf_function_cpi`, by cycles.
    pub top_functions: usize,
}

impl Default for MetricsLimits {
    fn default() -> Self {
        MetricsLimits {
            top_comms: 20,
            top_functions: 20,
        }
    }
}

type Labels = Vec<(&'static str, String)>;
type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// The exported metrics and the server answering `/metrics`. Dropping it stops the server.
pub struct Metrics {
    state: Arc<Mutex<State>>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// The pushers whose counts are exported, as a sink ([`Metrics::export_pushes`]).
    pushes: Vec<PushCounts>,
    /// CPU time of the server's thread so far, ns ([`Metrics::serving_cpu`]).
    serving_ns: Arc<AtomicU64>,
}

impl Metrics {
    /// Binds `addr` now (a port in use is an error here, not later) and serves
    /// `/metrics` on its own thread.
    pub fn serve(addr: SocketAddr, limits: MetricsLimits) -> Result<Metrics, AgentError> {
        let bind_err = |cause| AgentError::MetricsBind { addr, cause };
        let listener = TcpListener::bind(addr).map_err(bind_err)?;
        let bound = listener.local_addr().map_err(bind_err)?;
        let state = Arc::new(Mutex::new(State::new(limits)));
        let stop = Arc::new(AtomicBool::new(false));
        let serving_ns = Arc::new(AtomicU64::new(0));
        let (s, st, ns) = (state.clone(), stop.clone(), serving_ns.clone());
        std::thread::Builder::new()
            .name("cpi-bpf-metrics".into())
            .spawn(move || serve_loop(listener, s, &st, &ns))
            .map_err(|cause| AgentError::Thread {
                what: "metrics server",
                cause,
            })?;
        Ok(Metrics {
            state,
            addr: bound,
            stop,
            pushes: Vec::new(),
            serving_ns,
        })
    }

    /// The CPU time the server's thread has spent so far (accepting, reading requests,
    /// rendering, writing), ns, as of its last connection accepted or answered.
    pub(crate) fn serving_cpu(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.serving_ns)
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Adds a window's profile and the agent's state after it.
    pub fn observe(&self, window: &Window, status: &AgentStatus) {
        let mut s = lock(&self.state);
        s.add_profile(&window.profile);
        s.set_status(status);
    }

    /// The pusher's cumulative counts (cpi-agent/src/push.rs).
    pub fn set_push_stats(&self, stats: &PushStats) {
        lock(&self.state).set_push(stats);
    }

    /// As a sink, exports these pushers' counts with every window and after their flush.
    pub(crate) fn export_pushes(&mut self, pushes: Vec<PushCounts>) {
        self.pushes = pushes;
    }

    fn update_pushes(&self) {
        if !self.pushes.is_empty() {
            self.set_push_stats(&PushStats::total(&self.pushes));
        }
    }

    /// The exposition text a scrape gets now.
    pub fn render(&self) -> String {
        lock(&self.state).render()
    }
}

/// The last sink: it exports the status the store filled in and the pushers' counts
/// after their queueing.
impl Sink for Metrics {
    fn report(&mut self, window: &Window, status: &mut AgentStatus) -> Result<(), SinkError> {
        self.observe(window, status);
        self.update_pushes();
        Ok(())
    }

    fn flush(&mut self, _: Duration) {
        self.update_pushes();
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag and closes the socket.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// Publishes the calling thread's CPU time into `ns` (the server runs on one thread, its
/// connections' tasks included).
fn note_cpu(ns: &AtomicU64) {
    if let Some(t) = crate::sys::thread_cpu_time() {
        ns.store(t.as_nanos() as u64, Ordering::Relaxed);
    }
}

fn serve_loop(
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    stop: &AtomicBool,
    serving_ns: &Arc<AtomicU64>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("metrics: no runtime: {e}");
            return;
        }
    };
    rt.block_on(async {
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|_| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                log::error!("metrics: {e}");
                return;
            }
        };
        let mut open: std::collections::VecDeque<tokio::task::AbortHandle> =
            std::collections::VecDeque::new();
        loop {
            let conn = listener.accept().await;
            note_cpu(serving_ns);
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let stream = match conn {
                Ok((stream, _)) => stream,
                Err(e) => {
                    log::warn!("metrics: accept: {e}");
                    // EMFILE and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            open.retain(|h| !h.is_finished());
            if open.len() >= MAX_CLIENTS {
                if let Some(oldest) = open.pop_front() {
                    oldest.abort();
                }
            }
            let (state, ns) = (Arc::clone(&state), Arc::clone(serving_ns));
            let task = tokio::spawn(async move {
                match tokio::time::timeout(CLIENT_TIMEOUT, answer(stream, &state)).await {
                    Ok(Err(e)) => log::debug!("metrics: client: {e}"),
                    Err(_) => log::debug!("metrics: client too slow, cut off"),
                    Ok(Ok(())) => {}
                }
                note_cpu(&ns);
            });
            open.push_back(task.abort_handle());
        }
    });
}

/// Reads one request (headers only, bounded in size) and answers it.
async fn answer(mut stream: tokio::net::TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > MAX_REQUEST {
            return Err(std::io::Error::other("request too large"));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", CONTENT_TYPE, lock(state).render()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "cpi-bpf agent: metrics are at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    stream.shutdown().await
}

/// A label value from another process: terminal-escaped, then escaped for the
/// exposition format (module documentation).
fn label(s: &str) -> String {
    cpi_user::fsafe::escape(s)
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
}

/// The `mode` label value (the profile file's spelling).
fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Cpi => "cpi",
        Mode::IpSampling => "ip-sampling",
        Mode::TimeProfile => "time-profile",
        Mode::Simulated => "simulated",
        Mode::Instructions => "instructions",
    }
}

/// Every loss reason of the profile file, by its field name ([`LossReport::counts`]).
/// Samples filtered in the kernel are not wanted data,
/// not a loss: they have their own counter, `cpi_bpf_samples_filtered_total`.
fn loss_reasons(l: &LossReport) -> impl Iterator<Item = (&'static str, u64)> {
    l.counts()
        .into_iter()
        .filter(|&(name, _)| name != LossReport::FILTERED)
}

/// `process_cpu_seconds_total` (the CPU clock of the process, to the nanosecond) and
/// `process_resident_memory_bytes` (/proc/self/statm), read at each scrape;
/// `cpi_bpf_agent_cpu_seconds_total`, the same CPU time plus the BPF programs' run time
/// at the last window (the figure the governor budgets); `cpi_bpf_last_window_age_seconds`,
/// the time since the last window was completed (or since start), so a stalled analysis
/// shows while `/metrics` still answers.
#[derive(Debug)]
struct ProcessCollector {
    /// Unix milliseconds of the last completed window (start, before the first).
    last_window_ms: Arc<AtomicU64>,
    /// The BPF programs' run time at the last window, seconds (`f64` bits).
    bpf_seconds: Arc<AtomicU64>,
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// (CPU seconds, resident bytes) of this process.
fn self_usage() -> Option<(f64, f64)> {
    let rss = cpi_user::procmap::own_resident()?.total;
    Some((super::self_cpu_seconds()?, rss as f64))
}

/// `cpi_bpf_refused_total{reader}`: files of other users' that a reader refused or cut
/// for exceeding its budget (cpi-user/src/fsafe/budget.rs), every reader listed.
fn encode_refusals(encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "cpi_bpf_refused",
        "Files of other users refused or cut by a reader for exceeding its budget \
         (mapped_file: faulted while read; dwarf_lines: file names too large; debug_link: \
         over the CRC budget; perf_map: cut to its tail; kubelet: a peer that did not prove \
         who it is; recorded_path: the recording's user could not read it).",
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (reader, n) in cpi_user::fsafe::budget::refusals() {
        let labels = [("reader", reader.name())];
        ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let age_ms = unix_ms_now().saturating_sub(self.last_window_ms.load(Ordering::Relaxed));
        let a = ConstGauge::new(age_ms as f64 / 1e3);
        a.encode(encoder.encode_descriptor(
            "cpi_bpf_last_window_age_seconds",
            "Seconds since the last window was completed (since start before the first).",
            None,
            a.metric_type(),
        )?)?;
        encode_refusals(&mut encoder)?;
        let Some((cpu, rss)) = self_usage() else {
            return Ok(());
        };
        let c = ConstCounter::new(cpu);
        c.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            c.metric_type(),
        )?)?;
        let bpf = f64::from_bits(self.bpf_seconds.load(Ordering::Relaxed));
        let c = ConstCounter::new(cpu + bpf);
        c.encode(encoder.encode_descriptor(
            "cpi_bpf_agent_cpu_seconds",
            "The agent's whole CPU cost, the figure its governor budgets: user and system \
             time of its threads plus its BPF programs' run time (as of the last window).",
            None,
            c.metric_type(),
        )?)?;
        let g = ConstGauge::new(rss);
        g.encode(encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            None,
            g.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Everything behind the lock: the registry, handles on its metrics, and what is needed
/// to turn cumulative inputs into counter increments.
struct State {
    registry: Registry,
    limits: MetricsLimits,
    slots: CommSlots,
    comm_overflow: Counter,
    cycles: Family<Labels, FloatCounter>,
    instructions: Family<Labels, FloatCounter>,
    cpu_seconds: Family<Labels, FloatCounter>,
    function_cpi: Family<Labels, FloatGauge>,
    samples: Family<Labels, Counter>,
    lost: Family<Labels, Counter>,
    filtered: Counter,
    windows: Counter,
    last_window_ms: Arc<AtomicU64>,
    /// The BPF run time counted so far, seconds (`f64` bits), shared with
    /// [`ProcessCollector`].
    seen_bpf: Arc<AtomicU64>,
    store_failures: Counter,
    analysis: FloatGauge,
    tracked: Gauge,
    cache_bytes: Gauge,
    store_bytes: Gauge,
    push: Family<Labels, Counter>,
    push_dropped: Counter,
    frequency: Gauge,
    bpf_run: FloatCounter,
    mode: Family<Labels, Gauge>,
    captured: Family<Labels, Counter>,
    kubelet: Family<Labels, Counter>,
    parsed: Family<Labels, Counter>,
    binary_opens: Counter,
    /// Cumulative inputs already counted.
    seen_windows: u64,
    seen_captured: CaptureCounts,
    seen_work: BinaryWork,
    seen_store_failures: u64,
    seen_push: PushStats,
    seen_kubelet: Requests,
}

fn comm(c: &str) -> Labels {
    vec![("comm", label(c))]
}

impl State {
    fn new(limits: MetricsLimits) -> State {
        let mut r = Registry::default();
        let s = State {
            registry: Registry::default(),
            limits,
            slots: CommSlots::new(limits.top_comms),
            comm_overflow: Counter::default(),
            cycles: Family::default(),
            instructions: Family::default(),
            cpu_seconds: Family::default(),
            function_cpi: Family::default(),
            samples: Family::default(),
            lost: Family::default(),
            filtered: Counter::default(),
            windows: Counter::default(),
            last_window_ms: Arc::new(AtomicU64::new(unix_ms_now())),
            store_failures: Counter::default(),
            analysis: FloatGauge::default(),
            tracked: Gauge::default(),
            cache_bytes: Gauge::default(),
            store_bytes: Gauge::default(),
            push: Family::default(),
            push_dropped: Counter::default(),
            frequency: Gauge::default(),
            bpf_run: FloatCounter::default(),
            mode: Family::default(),
            captured: Family::default(),
            kubelet: Family::default(),
            parsed: Family::default(),
            binary_opens: Counter::default(),
            seen_windows: 0,
            seen_captured: CaptureCounts::default(),
            seen_work: BinaryWork::default(),
            seen_store_failures: 0,
            seen_bpf: Arc::new(AtomicU64::new(0f64.to_bits())),
            seen_push: PushStats::default(),
            seen_kubelet: Requests::default(),
        };
        s.register_sample_series(&mut r);
        s.register_agent_series(&mut r);
        r.register_collector(Box::new(ProcessCollector {
            last_window_ms: Arc::clone(&s.last_window_ms),
            bpf_seconds: Arc::clone(&s.seen_bpf),
        }));
        for (reason, _) in loss_reasons(&LossReport::default()) {
            s.lost
                .get_or_create(&vec![("reason", reason.to_string())])
                .get();
        }
        State { registry: r, ..s }
    }

    /// The per-comm and per-event series: what the samples say, registered in the order
    /// /metrics lists them.
    fn register_sample_series(&self, r: &mut Registry) {
        r.register(
            "cpi_bpf_cycles",
            "Sampled cycles per comm (top comms, the rest as comm=\"other\").",
            self.cycles.clone(),
        );
        r.register(
            "cpi_bpf_comm_overflow_samples",
            "Samples counted in comm=\"other\" because their comm had no series of its own \
             (more busy comms than --metrics-top-comms).",
            self.comm_overflow.clone(),
        );
        r.register(
            "cpi_bpf_instructions",
            "Instructions per comm (cpi and ip-sampling modes).",
            self.instructions.clone(),
        );
        r.register(
            "cpi_bpf_cpu_seconds",
            "Sampled CPU time per comm (cpu-clock samples times their period).",
            self.cpu_seconds.clone(),
        );
        r.register(
            "cpi_bpf_function_cpi",
            "CPI over the last window of its top functions by cycles (cpi mode).",
            self.function_cpi.clone(),
        );
        r.register(
            "cpi_bpf_samples",
            "Samples received per event.",
            self.samples.clone(),
        );
        r.register(
            "cpi_bpf_samples_lost",
            "Samples lost per reason (the profile file's loss report).",
            self.lost.clone(),
        );
        r.register(
            "cpi_bpf_samples_filtered",
            "Samples of processes the agent's process or cgroup filter does not want, dropped in the kernel (not a loss).",
            self.filtered.clone(),
        );
    }

    /// The agent's own health: windows, analysis, caches, store, pushes, the kubelet.
    fn register_agent_series(&self, r: &mut Registry) {
        r.register("cpi_bpf_windows", "Windows analysed.", self.windows.clone());
        r.register(
            "cpi_bpf_window_analysis_seconds",
            "Analysis time of the last window.",
            self.analysis.clone(),
        );
        r.register(
            "cpi_bpf_tracked_processes",
            "Processes the agent tracks.",
            self.tracked.clone(),
        );
        r.register(
            "cpi_bpf_cache_bytes",
            "Bytes held by the agent's caches.",
            self.cache_bytes.clone(),
        );
        r.register(
            "cpi_bpf_store_bytes",
            "Bytes of the local profile store.",
            self.store_bytes.clone(),
        );
        r.register(
            "cpi_bpf_push",
            "Push requests by result (ok; error: failed, retried; rejected by the receiver; \
             refused: not sent, plain http to a loopback port another user listens on).",
            self.push.clone(),
        );
        r.register(
            "cpi_bpf_push_dropped_windows",
            "Windows never delivered to Pyroscope (queue full, retries exhausted, rejected).",
            self.push_dropped.clone(),
        );
        r.register(
            "cpi_bpf_sampling_frequency_hz",
            "Current base sampling frequency.",
            self.frequency.clone(),
        );
        r.register(
            "cpi_bpf_bpf_run_seconds",
            "In-kernel run time of the agent's BPF programs (BPF_ENABLE_STATS).",
            self.bpf_run.clone(),
        );
        r.register(
            "cpi_bpf_mode",
            "Collection mode: 1 for the current one.",
            self.mode.clone(),
        );
        r.register(
            "cpi_bpf_store_failures",
            "Windows the store could not write (full disk, permissions, descriptors).",
            self.store_failures.clone(),
        );
        r.register(
            "cpi_bpf_captured_files",
            "Captured binaries whose descriptor the LRU closed (evicted), then reopened by \
             their checked path (reopened) or not (reopen_failed: gone, or not the same file).",
            self.captured.clone(),
        );
        r.register(
            "cpi_bpf_binaries_parsed",
            "Binaries parsed by table (symbols, unwind): once per file (device, inode) while \
             cached, not per process.",
            self.parsed.clone(),
        );
        r.register(
            "cpi_bpf_binary_opens",
            "Files of processes' mappings opened (captured, or by their checked path).",
            self.binary_opens.clone(),
        );
        r.register(
            "cpi_bpf_kubelet_requests",
            "Requests for the kubelet's pod list by result (ok, failed: no answer, not \
             HTTP 200, or not a pod list, refused: not believed, as from a loopback port \
             a user other than root listens on); only on Kubernetes.",
            self.kubelet.clone(),
        );
    }

    fn add_profile(&mut self, p: &Profile) {
        let totals = comm_totals(p);
        let changes = self.slots.update(&totals);
        self.move_comm_series(changes);
        let pmu = p.mode.has_cpi();
        for (c, t) in &totals {
            let name = self.slots.label(c);
            if name == OTHER_COMM && c != OTHER_COMM {
                self.comm_overflow.inc_by(t.samples);
            }
            let l = comm(name);
            if let (true, Some(v)) = (pmu, t.cycles) {
                self.cycles.get_or_create(&l).inc_by(v);
            }
            if let (true, Some(v)) = (pmu, t.instructions) {
                self.instructions.get_or_create(&l).inc_by(v);
            }
            if let Some(ns) = t.cpu_ns {
                self.cpu_seconds.get_or_create(&l).inc_by(ns / 1e9);
            }
        }
        self.set_function_cpi(p);
        for e in &p.events {
            self.samples
                .get_or_create(&vec![(
                    "event",
                    cpi_user::profile::model::role_name(e.role).to_string(),
                )])
                .inc_by(e.samples);
        }
        for (reason, n) in loss_reasons(&p.lost) {
            self.lost
                .get_or_create(&vec![("reason", reason.to_string())])
                .inc_by(n);
        }
        self.filtered.inc_by(p.lost.filtered_in_kernel);
    }

    /// Removes the series of comms that lost their slot, keeping their values, and
    /// recreates those of comms that got one at the values kept, so a comm that drops
    /// out and comes back resumes where it was (a counter never goes down; only a comm
    /// forgotten by the bounded ranking restarts at 0, a reset `rate()` handles).
    fn move_comm_series(&mut self, changes: SlotChanges) {
        let families = [&self.cycles, &self.instructions, &self.cpu_seconds];
        for c in &changes.lost {
            let l = comm(c);
            let values = families.map(|f| f.get(&l).map(|m| m.get()));
            for f in families {
                f.remove(&l);
            }
            self.slots.keep(c, values);
        }
        for c in &changes.gained {
            let l = comm(c);
            for (f, v) in families.iter().zip(self.slots.kept(c)) {
                if let Some(v) = v {
                    f.get_or_create(&l).inc_by(v);
                }
            }
        }
    }

    /// Replaces the function gauges with this window's top functions by cycles; only
    /// functions whose CPI passed the analysis' sample floor (`cpi` is set) count.
    fn set_function_cpi(&mut self, p: &Profile) {
        self.function_cpi.clear();
        if p.mode != Mode::Cpi {
            return;
        }
        let mut by: HashMap<(&str, &str, &str), (f64, f64)> = HashMap::new();
        for proc in &p.processes {
            for f in &proc.functions {
                if let (Some(_), Some(c), Some(i)) =
                    (f.measures.cpi, f.measures.cycles, f.measures.instructions)
                {
                    let e = by
                        .entry((proc.comm.as_str(), f.binary.as_str(), f.name.as_str()))
                        .or_default();
                    e.0 += c;
                    e.1 += i;
                }
            }
        }
        let mut v: Vec<_> = by.into_iter().filter(|(_, (_, i))| *i > 0.0).collect();
        v.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.0.cmp(&b.0)));
        let mut seen = HashSet::new();
        for ((c, b, f), (cyc, ins)) in v.into_iter().take(self.limits.top_functions) {
            let l: Labels = vec![
                ("comm", label(c)),
                ("binary", label(b)),
                ("function", label(f)),
            ];
            if seen.insert(l.clone()) {
                self.function_cpi.get_or_create(&l).set(cyc / ins);
            }
        }
    }

    fn set_status(&mut self, s: &AgentStatus) {
        if s.windows > self.seen_windows {
            self.windows.inc_by(s.windows - self.seen_windows);
            self.seen_windows = s.windows;
            self.last_window_ms.store(unix_ms_now(), Ordering::Relaxed);
        }
        if s.store_failures > self.seen_store_failures {
            self.store_failures
                .inc_by(s.store_failures - self.seen_store_failures);
            self.seen_store_failures = s.store_failures;
        }
        let (now, seen) = (&s.captured_files, &self.seen_captured);
        for (event, n, was) in [
            ("evicted", now.evicted, seen.evicted),
            ("reopened", now.reopened, seen.reopened),
            ("reopen_failed", now.reopen_failed, seen.reopen_failed),
        ] {
            self.captured
                .get_or_create(&vec![("event", event.to_string())])
                .inc_by(n.saturating_sub(was));
        }
        self.seen_captured = s.captured_files;
        let (now, seen) = (binary_work(), self.seen_work);
        for (table, n, was) in [
            ("symbols", now.symbol_tables, seen.symbol_tables),
            ("unwind", now.unwind_tables, seen.unwind_tables),
        ] {
            self.parsed
                .get_or_create(&vec![("table", table.to_string())])
                .inc_by(n.saturating_sub(was));
        }
        self.binary_opens
            .inc_by(now.opens.saturating_sub(seen.opens));
        self.seen_work = now;
        if let Some(now) = s.kubelet_requests {
            let seen = self.seen_kubelet;
            for (result, n, before) in [
                ("ok", now.ok, seen.ok),
                ("failed", now.failed, seen.failed),
                ("refused", now.refused, seen.refused),
            ] {
                self.kubelet
                    .get_or_create(&vec![("result", result.to_string())])
                    .inc_by(n.saturating_sub(before));
            }
            self.seen_kubelet = now;
        }
        let seen_bpf = f64::from_bits(self.seen_bpf.load(Ordering::Relaxed));
        if s.bpf_run_seconds > seen_bpf {
            self.bpf_run.inc_by(s.bpf_run_seconds - seen_bpf);
            self.seen_bpf
                .store(s.bpf_run_seconds.to_bits(), Ordering::Relaxed);
        }
        self.analysis.set(s.analysis_seconds);
        self.tracked.set(s.tracked_processes as i64);
        self.cache_bytes.set(s.cache_bytes as i64);
        self.store_bytes.set(s.store_bytes as i64);
        self.frequency.set(s.sampling_frequency_hz as i64);
        for m in [Mode::Cpi, Mode::IpSampling, Mode::TimeProfile, s.mode] {
            self.mode
                .get_or_create(&vec![("mode", mode_name(m).to_string())])
                .set(i64::from(m == s.mode));
        }
    }

    fn set_push(&mut self, s: &PushStats) {
        let seen = self.seen_push;
        for (result, now, before) in [
            ("ok", s.ok, seen.ok),
            ("error", s.errors, seen.errors),
            ("rejected", s.rejected, seen.rejected),
            ("refused", s.refused, seen.refused),
        ] {
            self.push
                .get_or_create(&vec![("result", result.to_string())])
                .inc_by(now.saturating_sub(before));
        }
        self.push_dropped
            .inc_by(s.dropped_windows.saturating_sub(seen.dropped_windows));
        self.seen_push = *s;
    }

    fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cpi_user::profile::model::{
        Estimate, EventInfo, FunctionProfile, Measures, ProcessProfile, PROFILE_FORMAT_VERSION,
    };
    use std::io::{Read, Write};
    use std::time::Instant;

    pub(crate) fn function(name: &str, cycles: f64, instructions: f64) -> FunctionProfile {
        FunctionProfile {
            name: name.into(),
            mangled: None,
            binary: "/usr/bin/app".into(),
            address: 0x1000,
            size: 64,
            samples: 100,
            share: 0.5,
            measures: Measures {
                time_ns: None,
                cycles: Some(cycles),
                instructions: Some(instructions),
                cycles_rel_error: None,
                instructions_rel_error: None,
                cpi: Some(Estimate {
                    value: cycles / instructions,
                    rel_error: 0.1,
                    samples: 100,
                }),
            },
            timed_cpi: None,
            cpi_disagree: false,
            blocks: Vec::new(),
            edges: Vec::new(),
            lines: Vec::new(),
            bolt_name: None,
            source: None,
        }
    }

    /// A profile of (pid, comm, weight) processes: cpu-clock ns in a time profile,
    /// cycles (and half as many instructions) in cpi mode.
    pub(crate) fn profile(mode: Mode, procs: &[(u32, &str, f64)]) -> Profile {
        let time = mode == Mode::TimeProfile;
        Profile {
            format_version: PROFILE_FORMAT_VERSION,
            tool_version: "test".into(),
            mode,
            mode_reason: "test".into(),
            command: Vec::new(),
            duration_secs: 1.0,
            events: vec![EventInfo {
                role: if time {
                    cpi_common::wire::EventRole::CpuClock
                } else {
                    cpi_common::wire::EventRole::Cycles
                },
                name: "x".into(),
                period: 1_000_003,
                jitter: 0,
                thinning: 1,
                unit: cpi_user::profile::model::EventUnit::Events,
                samples: 10,
                also: Vec::new(),
            }],
            perturbation: cpi_common::policy::Perturbation::None,
            range_window: 0,
            lost_samples: 3,
            lost: LossReport {
                ring_full: 3,
                ..LossReport::default()
            },
            binaries: Vec::new(),
            processes: procs
                .iter()
                .map(|&(pid, comm, w)| ProcessProfile {
                    pid,
                    comm: comm.into(),
                    identity: Default::default(),
                    samples: 10,
                    branch_samples: 0,
                    measures: Measures {
                        time_ns: time.then_some(w),
                        cycles: (!time).then_some(w),
                        instructions: (!time).then_some(w / 2.0),
                        cycles_rel_error: None,
                        instructions_rel_error: None,
                        cpi: None,
                    },
                    functions: Vec::new(),
                    calls: Vec::new(),
                    stacks: Vec::new(),
                })
                .collect(),
            accuracy: None,
            recorded_on: None,
            cpi_withheld: None,
            unread: Vec::new(),
        }
    }

    fn window(p: Profile, end_secs: u64) -> Window {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(end_secs);
        Window {
            start: end - Duration::from_secs(1),
            end,
            profile: p,
        }
    }

    fn status(windows: u64) -> AgentStatus {
        AgentStatus {
            mode: Mode::TimeProfile,
            windows,
            analysis_seconds: 0.25,
            tracked_processes: 7,
            cache_bytes: 1024,
            store_bytes: 4096,
            store_failures: 0,
            sampling_frequency_hz: 999,
            bpf_run_seconds: 0.5 * windows as f64,
            captured_files: CaptureCounts {
                evicted: 3 * windows,
                reopened: 2 * windows,
                reopen_failed: windows,
            },
            kubelet_requests: Some(Requests {
                ok: 4 * windows,
                failed: windows,
                refused: 2 * windows,
            }),
        }
    }

    fn state(top_comms: usize, top_functions: usize) -> State {
        State::new(MetricsLimits {
            top_comms,
            top_functions,
        })
    }

    fn lines(s: &State, prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = s
            .render()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn top_comms_and_other() {
        let mut s = state(2, 20);
        let p = profile(
            Mode::TimeProfile,
            &[
                (1, "a", 3e9),
                (2, "b", 2e9),
                (3, "a", 1e9),
                (4, "c", 0.5e9),
                (5, "d", 0.25e9),
            ],
        );
        s.add_profile(&p);
        assert_eq!(
            lines(&s, "cpi_bpf_cpu_seconds_total"),
            [
                "cpi_bpf_cpu_seconds_total{comm=\"a\"} 4.0",
                "cpi_bpf_cpu_seconds_total{comm=\"b\"} 2.0",
                "cpi_bpf_cpu_seconds_total{comm=\"other\"} 0.75",
            ]
        );
        // No cycles or instructions in a time profile; no pid anywhere.
        assert!(lines(&s, "cpi_bpf_cycles_total").is_empty());
        assert!(lines(&s, "cpi_bpf_instructions_total").is_empty());
        assert!(!s.render().contains("pid"));
    }

    /// A comm takes a slot from a labelled one only when it has clearly more recent CPU:
    /// one window a little heavier is not enough (labels do not flap), far heavier is.
    #[test]
    fn slots_follow_recent_cpu_with_hysteresis() {
        let mut s = state(2, 20);
        let mut add = |procs: &[(u32, &str, f64)]| s.add_profile(&profile(Mode::Cpi, procs));
        add(&[(1, "a", 10.0), (2, "b", 8.0)]);
        add(&[(1, "a", 10.0), (2, "b", 8.0), (3, "c", 12.0)]);
        assert_eq!(
            lines(&s, "cpi_bpf_cycles_total"),
            [
                "cpi_bpf_cycles_total{comm=\"a\"} 20.0",
                "cpi_bpf_cycles_total{comm=\"b\"} 16.0",
                "cpi_bpf_cycles_total{comm=\"other\"} 12.0",
            ]
        );
        // c now far outweighs b: it takes b's slot, and b's cycles go to other.
        s.add_profile(&profile(
            Mode::Cpi,
            &[(1, "a", 10.0), (2, "b", 8.0), (3, "c", 100.0)],
        ));
        assert_eq!(
            lines(&s, "cpi_bpf_cycles_total"),
            [
                "cpi_bpf_cycles_total{comm=\"a\"} 30.0",
                "cpi_bpf_cycles_total{comm=\"c\"} 100.0",
                "cpi_bpf_cycles_total{comm=\"other\"} 20.0",
            ]
        );
        assert_eq!(
            lines(&s, "cpi_bpf_instructions_total{comm=\"c\"}"),
            ["cpi_bpf_instructions_total{comm=\"c\"} 50.0"]
        );
    }

    /// Feeds a window of (pid, comm, cpu-clock ns) processes to `s`.
    fn feed(s: &mut State, procs: &[(u32, &str, f64)]) {
        s.add_profile(&profile(Mode::TimeProfile, procs));
    }

    /// The value of `cpi_bpf_cpu_seconds_total{comm}`, if the series is exported.
    fn cpu(s: &State, comm: &str) -> Option<f64> {
        let l = lines(s, &format!("cpi_bpf_cpu_seconds_total{{comm=\"{comm}\"}} "));
        l.first()
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
    }

    fn overflow(s: &State) -> String {
        lines(s, "cpi_bpf_comm_overflow_samples_total ").concat()
    }

    /// Hostile host: an unprivileged user starts 25 cheap `junkNN` processes before root's
    /// `victimsvc`. The junk keeps running (1 ms of CPU a window each); victimsvc (two
    /// processes, 1 s each a window) has its own series from its first window, and the
    /// junk that no longer fits goes to `other`, its samples counted as overflow.
    #[test]
    fn cheap_early_comms_cannot_squat_the_slots_of_a_busy_one() {
        let mut s = state(20, 20);
        let names: Vec<String> = (0..25).map(|i| format!("junk{i:02}")).collect();
        let mut procs: Vec<(u32, &str, f64)> = names
            .iter()
            .zip(100..)
            .map(|(c, pid)| (pid, c.as_str(), 1e6))
            .collect();
        for _ in 0..3 {
            feed(&mut s, &procs);
        }
        procs.extend([(1, "victimsvc", 1e9), (2, "victimsvc", 1e9)]);
        for w in 3..6 {
            feed(&mut s, &procs);
            assert_eq!(
                cpu(&s, "victimsvc"),
                Some(2.0 * (w - 2) as f64),
                "window {w}"
            );
        }
        let junk = lines(&s, "cpi_bpf_cpu_seconds_total{comm=\"junk").len();
        assert_eq!(junk, 19);
        // Windows 0-2: 5 junk comms × 10 samples over the bound; then 6 each window.
        assert_eq!(overflow(&s), "cpi_bpf_comm_overflow_samples_total 330");
        // The junk exits; two windows later 19 new services start: each has its own
        // series in its first window, in the junk's slots (not an hour later).
        feed(&mut s, &[(1, "victimsvc", 1e9)]);
        feed(&mut s, &[(1, "victimsvc", 1e9)]);
        let fresh: Vec<String> = (0..19).map(|i| format!("svc{i:02}")).collect();
        let mut procs: Vec<(u32, &str, f64)> = fresh
            .iter()
            .zip(200..)
            .map(|(c, pid)| (pid, c.as_str(), 1e8))
            .collect();
        procs.push((1, "victimsvc", 1e9));
        feed(&mut s, &procs);
        for c in &fresh {
            assert_eq!(cpu(&s, c), Some(0.1), "{c}");
        }
        assert!(lines(&s, "cpi_bpf_cpu_seconds_total{comm=\"junk").is_empty());
        assert_eq!(cpu(&s, "victimsvc"), Some(9.0));
    }

    /// 100 000 distinct comms (10 000 a window) keep the candidate table within its
    /// bound, the exposition within top_comms + other, and a busy comm still gets its
    /// series in its first window.
    #[test]
    fn a_flood_of_distinct_comms_stays_bounded() {
        let mut s = state(20, 20);
        for w in 0..11 {
            let names: Vec<String> = (0..10_000).map(|i| format!("x{w}_{i}")).collect();
            let mut procs: Vec<(u32, &str, f64)> = names
                .iter()
                .zip(1000..)
                .map(|(c, pid)| (pid, c.as_str(), 1e6))
                .collect();
            if w == 10 {
                procs.push((1, "victimsvc", 1e9));
            }
            feed(&mut s, &procs);
            assert!(
                s.slots.tracked() <= slots::candidate_cap(20),
                "{}",
                s.slots.tracked()
            );
        }
        assert_eq!(cpu(&s, "victimsvc"), Some(1.0));
        assert_eq!(lines(&s, "cpi_bpf_cpu_seconds_total{").len(), 21);
    }

    /// A comm that loses its slot (by going idle, or to heavier comms) and comes back
    /// resumes its series from the value it had: the counter never goes down.
    #[test]
    fn a_comm_that_drops_out_and_returns_stays_monotonic() {
        let mut s = state(2, 20);
        let w: [&[(u32, &str, f64)]; 5] = [
            &[(1, "victimsvc", 1e9), (2, "hog", 1e9)],
            &[(2, "hog", 1e9)],
            &[(1, "victimsvc", 0.5e9), (2, "hog", 1e9)],
            &[(1, "victimsvc", 1e9), (3, "big1", 1e12), (4, "big2", 1e12)],
            &[(1, "victimsvc", 1e13), (3, "big1", 1e12), (4, "big2", 1e12)],
        ];
        // Busy, then idle for six windows, back, pushed out by two far heavier comms,
        // back again heavier than they are.
        let mut seen = Vec::new();
        for (procs, n) in [(w[0], 1), (w[1], 6), (w[2], 1), (w[3], 1), (w[4], 1)] {
            for _ in 0..n {
                feed(&mut s, procs);
                seen.push(cpu(&s, "victimsvc"));
            }
        }
        let values: Vec<f64> = seen.iter().flatten().copied().collect();
        assert!(values.windows(2).all(|v| v[0] <= v[1]), "{seen:?}");
        assert_eq!(seen[8], None, "{seen:?}");
        assert_eq!(seen.last(), Some(&Some(1.0 + 0.5 + 10_000.0)), "{seen:?}");
    }

    #[test]
    fn function_cpi_is_the_last_windows_top_functions() {
        let mut s = state(20, 2);
        let mut p = profile(Mode::Cpi, &[(1, "app", 100.0), (2, "app", 100.0)]);
        p.processes[0].functions =
            vec![function("hot", 300.0, 100.0), function("warm", 50.0, 100.0)];
        p.processes[1].functions =
            vec![function("hot", 100.0, 100.0), function("cold", 10.0, 10.0)];
        p.processes[1].functions[1].measures.cpi = None; // below the sample floor: not exported
        s.add_profile(&p);
        assert_eq!(
            lines(&s, "cpi_bpf_function_cpi"),
            [
                "cpi_bpf_function_cpi{comm=\"app\",binary=\"/usr/bin/app\",function=\"hot\"} 2.0",
                "cpi_bpf_function_cpi{comm=\"app\",binary=\"/usr/bin/app\",function=\"warm\"} 0.5",
            ]
        );
        p.processes[0].functions = vec![function("new", 10.0, 20.0)];
        p.processes[1].functions.clear();
        s.add_profile(&p);
        assert_eq!(
            lines(&s, "cpi_bpf_function_cpi"),
            ["cpi_bpf_function_cpi{comm=\"app\",binary=\"/usr/bin/app\",function=\"new\"} 0.5"]
        );
        // Not in a time profile.
        s.add_profile(&profile(Mode::TimeProfile, &[(1, "app", 1.0)]));
        assert!(lines(&s, "cpi_bpf_function_cpi{").is_empty());
    }

    #[test]
    fn health_metrics() {
        let m = Metrics::serve("127.0.0.1:0".parse().unwrap(), MetricsLimits::default()).unwrap();
        let text = m.render();
        // Every loss reason exists before the first window.
        for (reason, _) in loss_reasons(&LossReport::default()) {
            assert!(
                text.contains(&format!(
                    "cpi_bpf_samples_lost_total{{reason=\"{reason}\"}} 0\n"
                )),
                "{reason}"
            );
        }
        for w in 1..=2 {
            m.observe(
                &window(profile(Mode::TimeProfile, &[(1, "a", 1e9)]), w),
                &status(w),
            );
        }
        m.set_push_stats(&PushStats {
            ok: 3,
            errors: 2,
            rejected: 1,
            refused: 1,
            dropped_windows: 4,
            queued: 1,
        });
        m.set_push_stats(&PushStats {
            ok: 5,
            errors: 2,
            rejected: 1,
            refused: 3,
            dropped_windows: 6,
            queued: 0,
        });
        // Burn a clock tick of CPU so process_cpu_seconds_total has something to show.
        let t0 = Instant::now();
        while self_usage().unwrap().0 == 0.0 && t0.elapsed() < Duration::from_secs(10) {
            std::hint::black_box((0..10_000u64).sum::<u64>());
        }
        let s = lock(&m.state);
        let want = [
            "cpi_bpf_samples_total{event=\"cpu-clock\"} 20",
            "cpi_bpf_samples_lost_total{reason=\"ring_full\"} 6",
            "cpi_bpf_windows_total 2",
            "cpi_bpf_window_analysis_seconds 0.25",
            "cpi_bpf_tracked_processes 7",
            "cpi_bpf_cache_bytes 1024",
            "cpi_bpf_store_bytes 4096",
            "cpi_bpf_push_total{result=\"ok\"} 5",
            "cpi_bpf_push_total{result=\"error\"} 2",
            "cpi_bpf_push_total{result=\"rejected\"} 1",
            "cpi_bpf_push_total{result=\"refused\"} 3",
            "cpi_bpf_push_dropped_windows_total 6",
            "cpi_bpf_sampling_frequency_hz 999",
            "cpi_bpf_bpf_run_seconds_total 1.0",
            "cpi_bpf_captured_files_total{event=\"evicted\"} 6",
            "cpi_bpf_captured_files_total{event=\"reopened\"} 4",
            "cpi_bpf_captured_files_total{event=\"reopen_failed\"} 2",
            "cpi_bpf_kubelet_requests_total{result=\"ok\"} 8",
            "cpi_bpf_kubelet_requests_total{result=\"failed\"} 2",
            "cpi_bpf_kubelet_requests_total{result=\"refused\"} 4",
            "cpi_bpf_mode{mode=\"time-profile\"} 1",
            "cpi_bpf_mode{mode=\"cpi\"} 0",
            "cpi_bpf_mode{mode=\"ip-sampling\"} 0",
        ];
        let text = s.render();
        for w in want {
            assert!(text.lines().any(|l| l == w), "missing {w:?} in\n{text}");
        }
        let value = |name: &str| -> f64 {
            let l = text.lines().find(|l| l.starts_with(name)).unwrap();
            l.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("process_cpu_seconds_total ") > 0.0);
        // Its own CPU time plus the BPF run time (1 s here).
        let (agent, own) = (
            value("cpi_bpf_agent_cpu_seconds_total "),
            value("process_cpu_seconds_total "),
        );
        assert!(
            (agent - own - 1.0).abs() < 1e-6,
            "{agent} against {own} + 1"
        );
        assert!(value("process_resident_memory_bytes ") > 1e6);
        // Refusals: every reader has its series; counts are process-wide (other tests may
        // add to them), so this one's refusal shows as at least 1.
        drop(s);
        cpi_user::fsafe::budget::refused(cpi_user::fsafe::budget::Reader::DebugLink);
        let text = lock(&m.state).render();
        for r in cpi_user::fsafe::budget::Reader::ALL {
            let series = format!("cpi_bpf_refused_total{{reader=\"{}\"}} ", r.name());
            let n: f64 = (text.lines().find_map(|l| l.strip_prefix(&series)))
                .unwrap_or_else(|| panic!("missing {series:?} in\n{text}"))
                .parse()
                .unwrap();
            assert!(
                r != cpi_user::fsafe::budget::Reader::DebugLink || n >= 1.0,
                "{n}"
            );
        }
        assert!(text.contains("# TYPE cpi_bpf_cpu_seconds counter\n"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn port_in_use_is_an_error() {
        let m = Metrics::serve("127.0.0.1:0".parse().unwrap(), MetricsLimits::default()).unwrap();
        let e = Metrics::serve(m.local_addr(), MetricsLimits::default())
            .err()
            .unwrap();
        assert!(
            e.to_string().starts_with("--metrics-addr 127.0.0.1:"),
            "{e}"
        );
    }

    fn scrape(addr: SocketAddr) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    /// Hostile host: 200 idle connections and 20 clients sending a byte at a time do not
    /// hold up a scrape past a few seconds (CLIENT_TIMEOUT bounds what one client can
    /// take; they are served at once, not one after another).
    #[test]
    fn idle_and_slow_clients_do_not_stall_a_scrape() {
        let m = Metrics::serve("127.0.0.1:0".parse().unwrap(), MetricsLimits::default()).unwrap();
        let addr = m.local_addr();
        let idle: Vec<TcpStream> = (0..200)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let slow: Vec<_> = (0..20)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut c = TcpStream::connect(addr).unwrap();
                    for b in b"GET /metrics HTTP/1.1\r\n" {
                        if c.write_all(&[*b]).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(500));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let out = scrape(addr);
        let took = t0.elapsed();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(took < CLIENT_TIMEOUT + Duration::from_secs(1), "{took:?}");
        drop(idle);
        for t in slow {
            t.join().unwrap();
        }
    }

    /// CPU time of this process's threads named `cpi-bpf-metrics` (every server of the
    /// tests running beside this one), seconds, as the scheduler counts it.
    fn servers_cpu() -> f64 {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "cpi-bpf-metrics")
            })
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .sum::<f64>()
            / 1e9
    }

    /// A flood of connections (idle ones reopened as the server closes the oldest) costs
    /// the server's thread CPU, and the server publishes that thread's time for the
    /// governor to leave out: more than nothing, and no more than the scheduler counted
    /// for the servers' threads (the whole process's time would be more).
    #[test]
    fn a_flood_of_connections_is_published_as_the_servers_cpu() {
        let m = Metrics::serve("127.0.0.1:0".parse().unwrap(), MetricsLimits::default()).unwrap();
        let (addr, serving) = (m.local_addr(), m.serving_cpu());
        let stop = Arc::new(AtomicBool::new(false));
        let flood: Vec<_> = (0..4)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut open = std::collections::VecDeque::new();
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(c) = TcpStream::connect(addr) {
                            open.push_back(c);
                        }
                        if open.len() > 200 {
                            open.pop_front();
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        for t in flood {
            t.join().unwrap();
        }
        // A scrape after the flood: the server publishes as it answers.
        assert!(scrape(addr).starts_with("HTTP/1.1 200 OK"));
        let published = serving.load(Ordering::Relaxed) as f64 / 1e9;
        let counted = servers_cpu();
        assert!(published > 0.0, "nothing published");
        assert!(
            published <= counted + 0.001,
            "published {published} s, the servers' threads ran {counted} s"
        );
    }

    #[test]
    fn label_values_from_other_processes_cannot_forge_series() {
        assert_eq!(label("python3"), "python3");
        assert_eq!(
            label("x\"} 1\nfake_total{a=\"\x1b"),
            r#"x\"} 1\\nfake_total{a=\"\\x1b"#
        );
    }

    #[test]
    fn serves_metrics_and_survives_a_silent_client() {
        let m = Metrics::serve("127.0.0.1:0".parse().unwrap(), MetricsLimits::default()).unwrap();
        // A client that connects and says nothing is cut off after CLIENT_TIMEOUT ...
        let _silent = TcpStream::connect(m.local_addr()).unwrap();
        // ... and the next one is answered.
        let mut c = TcpStream::connect(m.local_addr()).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains(CONTENT_TYPE));
        assert!(out.contains("cpi_bpf_windows_total 0\n"));
        let mut c = TcpStream::connect(m.local_addr()).unwrap();
        c.write_all(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    }
}
