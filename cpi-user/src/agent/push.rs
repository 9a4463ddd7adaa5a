//! Push to Pyroscope (`--push-pyroscope URL`): each window, one request to Pyroscope's
//! Connect ingestion API, `POST URL/push.v1.PusherService/Push` with
//! `Content-Type: application/json`:
//!
//! ```json
//! {"series":[{"labels":[{"name":"__name__","value":"cpi_bpf"},
//!                       {"name":"service_name","value":"<comm or cgroup>"}],
//!             "samples":[{"ID":"<uuid v4>","rawProfile":"<base64 of the gzip'd pprof>"}]}]}
//! ```
//!
//! One series per service (`service_name` = the comm, or the cgroup v2 path with
//! `--service-label cgroup`), its pprof holding that service's processes only, encoded
//! by cpi-user/src/report/pprof.rs (same sample types as `--format pprof`; pid and comm
//! are pprof sample labels, not series labels). `X-Scope-OrgID` carries `--push-tenant`.
//!
//! Never in the way of collection: [`Pusher::submit`] encodes the window and queues it
//! without waiting; one worker thread sends. The queue holds at most `queue_windows`
//! windows: when full, the oldest is dropped (counted). A failed request (connection
//! refused, timeout, 408/429/5xx) is retried with exponential backoff up to
//! [`MAX_ATTEMPTS`] times, then dropped (counted); any other answer than 2xx is a
//! rejection, dropped at once (counted). Every connect, write and read shares one
//! deadline of `timeout`, so a slow receiver costs at most that per attempt. Plain
//! `http://` only (a TLS-terminating proxy on loopback serves an `https` endpoint).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;

use super::{AgentError, Window};
use crate::profile::model::ProcessProfile;
use crate::report::pprof;

/// The Connect procedure, appended to the URL.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// The `__name__` series label of every pushed profile.
pub const PROFILE_NAME: &str = "cpi_bpf";
/// Attempts per window before it is dropped.
pub const MAX_ATTEMPTS: u32 = 5;
/// First retry delay; doubled per attempt up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Longest retry delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// `service_name` of a process whose cgroup cannot be read.
pub const UNKNOWN_SERVICE: &str = "unknown";
/// Response bytes read (status line and headers; the body is only logged).
const MAX_RESPONSE: usize = 16 * 1024;

/// What `service_name` is (`--service-label`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceLabel {
    /// The process's comm.
    Comm,
    /// The process's cgroup v2 path, [`UNKNOWN_SERVICE`] when it cannot be read.
    Cgroup,
}

/// What [`Pusher::new`] needs (from the agent's `--push-*` settings).
#[derive(Clone, Debug, PartialEq)]
pub struct PushConfig {
    /// `http://host[:port][/prefix]`; [`PUSH_PATH`] is appended.
    pub url: String,
    /// `X-Scope-OrgID` (multi-tenant Pyroscope).
    pub tenant: Option<String>,
    /// What each series is named by.
    pub service_label: ServiceLabel,
    /// Windows waiting at most (at least 1).
    pub queue_windows: usize,
    /// Deadline of one request: connect, send and answer.
    pub timeout: Duration,
}

/// Cumulative counts since start (exported by cpi-user/src/agent/metrics.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushStats {
    /// Requests answered 2xx.
    pub ok: u64,
    /// Requests that failed and may be retried (connection, timeout, 408/429/5xx).
    pub errors: u64,
    /// Requests answered with another status (not retried).
    pub rejected: u64,
    /// Windows never delivered: queue full, retries exhausted or rejected.
    pub dropped_windows: u64,
    /// Windows waiting now (including one being sent).
    pub queued: usize,
}

/// Where requests go, parsed once at start.
#[derive(Clone, Debug, PartialEq)]
struct Endpoint {
    host: String,
    port: u16,
    /// Host header value.
    authority: String,
    path: String,
}

fn parse_url(url: &str) -> Result<Endpoint, AgentError> {
    let bad = |reason: &str| AgentError::PushUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("not a URL (expected http://host[:port][/path])"))?;
    match scheme.to_ascii_lowercase().as_str() {
        "http" => {}
        "https" => {
            return Err(bad(
                "https is not supported: use plain http (e.g. a TLS proxy on loopback)",
            ))
        }
        _ => return Err(bad("scheme must be http")),
    }
    if rest.contains(['?', '#']) {
        return Err(bad("no query or fragment allowed"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("unclosed '[' in host"))?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(bad("missing or invalid host"));
    }
    let port = match port {
        None => 80,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| bad("invalid port"))?,
    };
    if path.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(bad("invalid path"));
    }
    Ok(Endpoint {
        host: host.to_string(),
        port,
        authority: authority.to_string(),
        path: format!("{}{PUSH_PATH}", path.trim_end_matches('/')),
    })
}

/// The cgroup v2 path of a process (`0::/system.slice/x.service` → that path).
fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
}

fn nanos_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
}

/// The Push request body of a window, or None when it has no process.
pub fn request_body(window: &Window, label: ServiceLabel) -> std::io::Result<Option<Vec<u8>>> {
    let p = &window.profile;
    let cgroups: HashMap<u32, String> = match label {
        ServiceLabel::Comm => HashMap::new(),
        ServiceLabel::Cgroup => p
            .processes
            .iter()
            .map(|pr| {
                let name = cgroup_of(pr.pid).unwrap_or_else(|| UNKNOWN_SERVICE.to_string());
                (pr.pid, name)
            })
            .collect(),
    };
    let service = |pr: &ProcessProfile| -> String {
        match label {
            ServiceLabel::Comm => pr.comm.clone(),
            ServiceLabel::Cgroup => cgroups[&pr.pid].clone(),
        }
    };
    let services: BTreeMap<String, ()> = p.processes.iter().map(|pr| (service(pr), ())).collect();
    if services.is_empty() {
        return Ok(None);
    }
    let start = nanos_since_epoch(window.start);
    let duration = (nanos_since_epoch(window.end) - start).max(0);
    let mut series = Vec::with_capacity(services.len());
    for name in services.keys() {
        let mut msg = pprof::build_processes(p, &|pr| service(pr) == *name);
        msg.time_nanos = start;
        msg.duration_nanos = duration;
        let raw = pprof::gzip(&msg)?;
        let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        series.push(serde_json::json!({
            "labels": [
                {"name": "__name__", "value": PROFILE_NAME},
                {"name": "service_name", "value": name},
            ],
            "samples": [{
                "ID": id.to_string(),
                "rawProfile": base64::engine::general_purpose::STANDARD.encode(raw),
            }],
        }));
    }
    Ok(Some(
        serde_json::to_vec(&serde_json::json!({ "series": series }))
            .map_err(std::io::Error::other)?,
    ))
}

/// How one request ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Delivered,
    /// Worth retrying: no connection, timeout, 408/429/5xx.
    Failed(String),
    /// The receiver refused the request itself.
    Rejected(String),
}

/// One HTTP/1.1 request under one deadline.
fn send(ep: &Endpoint, tenant: Option<&str>, body: &[u8], timeout: Duration) -> Outcome {
    match try_send(ep, tenant, body, timeout) {
        Ok((code, text)) => match code {
            200..=299 => Outcome::Delivered,
            408 | 429 | 500..=599 => Outcome::Failed(format!("HTTP {code}: {text}")),
            _ => Outcome::Rejected(format!("HTTP {code}: {text}")),
        },
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn try_send(
    ep: &Endpoint,
    tenant: Option<&str>,
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    use std::io::{Error, ErrorKind};
    let deadline = Instant::now() + timeout;
    let left = || {
        let d = deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            Err(Error::new(ErrorKind::TimedOut, "timed out"))
        } else {
            Ok(d)
        }
    };
    let mut last = Error::new(ErrorKind::NotFound, "host resolves to no address");
    let mut stream = None;
    for addr in (ep.host.as_str(), ep.port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, left()?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut s = stream.ok_or(last)?;
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Connect-Protocol-Version: 1\r\nUser-Agent: cpi-bpf/{}\r\nContent-Length: {}\r\n",
        ep.path,
        ep.authority,
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    if let Some(t) = tenant {
        head.push_str(&format!("X-Scope-OrgID: {t}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    for chunk in [head.as_bytes(), body] {
        for piece in chunk.chunks(64 * 1024) {
            s.set_write_timeout(Some(left()?))?;
            s.write_all(piece)?;
        }
    }
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        s.set_read_timeout(Some(left()?))?;
        let n = s.read(&mut tmp)?;
        buf.extend_from_slice(&tmp[..n]);
        if n == 0 || buf.len() >= MAX_RESPONSE {
            break;
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let code = text
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| Error::new(ErrorKind::InvalidData, "no HTTP status line"))?;
    let message = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim().chars().take(200).collect())
        .unwrap_or_default();
    Ok((code, message))
}

struct Queue {
    /// (id, request body), oldest first; the front is the one being sent.
    windows: VecDeque<(u64, Arc<Vec<u8>>)>,
    next_id: u64,
    /// Id of the request on the wire.
    in_flight: Option<u64>,
    /// The request on the wire was pushed out of the queue by newer windows: the
    /// worker counts it as dropped unless it is delivered.
    abandoned: bool,
    stats: PushStats,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The push sink. Dropping it stops the worker after its current request.
pub struct Pusher {
    shared: Arc<Shared>,
    service_label: ServiceLabel,
    capacity: usize,
}

impl Pusher {
    /// Checks the URL and tenant and starts the worker thread.
    pub fn new(cfg: PushConfig) -> Result<Pusher, AgentError> {
        let ep = parse_url(&cfg.url)?;
        if let Some(t) = &cfg.tenant {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(AgentError::PushTenant {
                    tenant: t.clone(),
                    reason: "must be non-empty printable ASCII without spaces".into(),
                });
            }
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                windows: VecDeque::new(),
                next_id: 0,
                in_flight: None,
                abandoned: false,
                stats: PushStats::default(),
                stop: false,
            }),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        let (tenant, timeout) = (cfg.tenant.clone(), cfg.timeout);
        std::thread::Builder::new()
            .name("cpi-bpf-push".into())
            .spawn(move || work(&worker, &ep, tenant.as_deref(), timeout))
            .map_err(|source| AgentError::Thread {
                what: "push",
                source,
            })?;
        Ok(Pusher {
            shared,
            service_label: cfg.service_label,
            capacity: cfg.queue_windows.max(1),
        })
    }

    /// Encodes the window and queues it; never waits for the network. A full queue
    /// drops its oldest window.
    pub fn submit(&self, window: &Window) {
        let body = match request_body(window, self.service_label) {
            Ok(Some(b)) => Arc::new(b),
            Ok(None) => return,
            Err(e) => {
                log::warn!("push: cannot encode the window: {e}");
                let mut q = self.shared.lock();
                q.stats.dropped_windows += 1;
                return;
            }
        };
        let mut q = self.shared.lock();
        while q.windows.len() >= self.capacity {
            let Some((id, _)) = q.windows.pop_front() else {
                break;
            };
            if q.in_flight == Some(id) {
                q.abandoned = true;
            } else {
                q.stats.dropped_windows += 1;
            }
        }
        let id = q.next_id;
        q.next_id += 1;
        q.windows.push_back((id, body));
        q.stats.queued = q.windows.len();
        self.shared.changed.notify_all();
    }

    /// The counts so far.
    pub fn stats(&self) -> PushStats {
        self.shared.lock().stats
    }

    /// Waits until every queued window is delivered or dropped, at most `within`.
    pub fn flush(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut q = self.shared.lock();
        while !q.windows.is_empty() || q.in_flight.is_some() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            q = self
                .shared
                .changed
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
    }
}

/// The worker: sends the oldest window until it is delivered, rejected, out of
/// attempts or pushed out of the queue.
fn work(shared: &Shared, ep: &Endpoint, tenant: Option<&str>, timeout: Duration) {
    let mut attempts: (u64, u32) = (u64::MAX, 0);
    let mut failing = false;
    loop {
        let (id, body) = {
            let mut q = shared.lock();
            while q.windows.is_empty() && !q.stop {
                q = shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.stop {
                return;
            }
            let (id, body) = q.windows.front().cloned().expect("queue is not empty");
            q.in_flight = Some(id);
            (id, body)
        };
        if attempts.0 != id {
            attempts = (id, 0);
        }
        attempts.1 += 1;
        let outcome = send(ep, tenant, &body, timeout);
        drop(body);
        let mut q = shared.lock();
        q.in_flight = None;
        let abandoned = std::mem::take(&mut q.abandoned);
        let mut backoff = None;
        match &outcome {
            Outcome::Delivered => {
                q.stats.ok += 1;
                if failing {
                    log::info!("push: {}:{} accepts again", ep.host, ep.port);
                    failing = false;
                }
            }
            Outcome::Failed(why) => {
                q.stats.errors += 1;
                if !failing {
                    log::warn!("push: {}:{}: {why} (retrying)", ep.host, ep.port);
                    failing = true;
                }
                if abandoned || attempts.1 >= MAX_ATTEMPTS {
                    q.stats.dropped_windows += 1;
                } else {
                    backoff = Some(
                        FIRST_BACKOFF
                            .saturating_mul(1 << (attempts.1 - 1).min(16))
                            .min(MAX_BACKOFF),
                    );
                }
            }
            Outcome::Rejected(why) => {
                q.stats.rejected += 1;
                q.stats.dropped_windows += 1;
                log::warn!("push: {}:{} rejected a window: {why}", ep.host, ep.port);
            }
        }
        if !abandoned && backoff.is_none() {
            q.windows.pop_front();
        }
        q.stats.queued = q.windows.len();
        shared.changed.notify_all();
        if let Some(wait) = backoff {
            // Interrupted by stop only; newer windows wait behind this one.
            let until = Instant::now() + wait;
            while !q.stop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                q = shared
                    .changed
                    .wait_timeout(q, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let ep = parse_url("http://pyro.example:4040").unwrap();
        assert_eq!(
            (ep.host.as_str(), ep.port, ep.path.as_str()),
            ("pyro.example", 4040, PUSH_PATH)
        );
        let ep = parse_url("HTTP://10.0.0.1/prefix/").unwrap();
        assert_eq!(
            (ep.port, ep.path.as_str()),
            (80, "/prefix/push.v1.PusherService/Push")
        );
        let ep = parse_url("http://[::1]:9/").unwrap();
        assert_eq!(
            (ep.host.as_str(), ep.port, ep.authority.as_str()),
            ("::1", 9, "[::1]:9")
        );
        for bad in [
            "pyro:4040",
            "https://pyro",
            "ftp://pyro",
            "http://",
            "http://:80",
            "http://h:0",
            "http://h:99999",
            "http://u:p@h",
            "http://h/x?y",
            "http://[::1",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(e.starts_with("--push-pyroscope"), "{bad}: {e}");
        }
    }

    #[test]
    fn body_has_one_series_per_service() {
        use crate::agent::metrics::tests::{function, profile};
        use crate::profile::model::Mode;
        use prost::Message;
        use std::io::Read;
        let mut p = profile(
            Mode::Cpi,
            &[(1, "app", 10.0), (2, "db", 5.0), (3, "app", 1.0)],
        );
        for pr in &mut p.processes {
            pr.functions = vec![function(&format!("f{}", pr.pid), 10.0, 5.0)];
        }
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let w = Window {
            start,
            end: start + Duration::from_secs(10),
            profile: p,
        };
        let body = request_body(&w, ServiceLabel::Comm).unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let series = v["series"].as_array().unwrap();
        assert_eq!(series.len(), 2);
        for (s, (service, pids)) in series.iter().zip([("app", vec![1, 3]), ("db", vec![2])]) {
            assert_eq!(
                s["labels"],
                serde_json::json!([
                    {"name": "__name__", "value": "cpi_bpf"},
                    {"name": "service_name", "value": service},
                ])
            );
            let sample = &s["samples"][0];
            assert_eq!(sample["ID"].as_str().unwrap().len(), 36);
            let gz = base64::engine::general_purpose::STANDARD
                .decode(sample["rawProfile"].as_str().unwrap())
                .unwrap();
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(&gz[..])
                .read_to_end(&mut raw)
                .unwrap();
            let m = pprof::PprofProfile::decode(&raw[..]).unwrap();
            assert_eq!(
                (m.time_nanos, m.duration_nanos),
                (1_000_000_000_000, 10_000_000_000)
            );
            let pid_key = m.string_table.iter().position(|s| s == "pid").unwrap() as i64;
            let mut got: Vec<i64> = m
                .sample
                .iter()
                .flat_map(|s| s.label.iter().filter(|l| l.key == pid_key).map(|l| l.num))
                .collect();
            got.dedup();
            assert_eq!(got, pids);
        }
        let empty = Window {
            profile: profile(Mode::Cpi, &[]),
            ..w
        };
        assert_eq!(request_body(&empty, ServiceLabel::Comm).unwrap(), None);
    }

    #[test]
    fn tenant_must_be_a_header_value() {
        let cfg = |t: &str| PushConfig {
            url: "http://127.0.0.1:1".into(),
            tenant: Some(t.into()),
            service_label: ServiceLabel::Comm,
            queue_windows: 1,
            timeout: Duration::from_millis(10),
        };
        assert!(Pusher::new(cfg("team-a")).is_ok());
        for bad in ["", "a b", "a\r\nX-Evil: 1"] {
            assert!(matches!(
                Pusher::new(cfg(bad)),
                Err(AgentError::PushTenant { .. })
            ));
        }
    }
}
