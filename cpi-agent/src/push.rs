//! Push to Pyroscope (`--push-pyroscope URL`): each window, one request to Pyroscope's
//! Connect ingestion API, `POST URL/push.v1.PusherService/Push` with
//! `Content-Type: application/json`:
//!
//! ```json
//! {"series":[{"labels":[{"name":"__name__","value":"cpi_bpf"},
//!                       {"name":"service_name","value":"<comm, cgroup, pod, …>"},
//!                       {"name":"pod","value":"…"}, …],
//!             "samples":[{"ID":"<uuid v4>","rawProfile":"<base64 of the gzip'd pprof>"}]}]}
//! ```
//!
//! One series per service (`service_name` = the comm by default; `--service-label`
//! `cgroup`, `pod`, `namespace` or `container` names it by that field of the process's
//! identity, cpi-user/src/procmap/cgroup.rs) and container: the series also carries the
//! known `container_id`, `pod_uid`, `qos`, `pod`, `namespace` and `container`. Its pprof
//! holds those processes only, encoded by cpi-user/src/report/pprof.rs (same sample
//! types as `--format pprof`; pid, comm and the cgroup path are pprof sample labels, not
//! series labels). `X-Scope-OrgID` carries `--push-tenant`.
//!
//! Push to an OpenTelemetry Collector (`--push-otlp URL`): each window, one OTLP/HTTP
//! request, `POST URL/v1development/profiles` with `Content-Type: application/x-protobuf`
//! and `Content-Encoding: gzip`, the body an `ExportProfilesServiceRequest` of
//! cpi-user/src/report/otlp.rs (opentelemetry-proto v1.11.0): one resource per process,
//! `service.name` by `--service-label` as above. `X-Scope-OrgID` carries `--push-tenant`
//! (Pyroscope's OTLP ingestion reads it; a Collector ignores it). Both pushes share what
//! follows: queue, retries, timeouts, TLS and credentials.
//!
//! Never in the way of collection: [`Pusher::submit`] encodes the window and queues it
//! without waiting; one worker thread sends. The queue holds at most `queue_windows`
//! windows: when full, the oldest is dropped (counted). A failed request (connection
//! refused or reset, timeout, TLS failure, an answer beyond the bounds below,
//! 408/429/5xx) is retried with exponential backoff up to [`MAX_ATTEMPTS`] times, then
//! dropped (counted); any other answer than 2xx is a rejection, dropped at once
//! (counted). One line is logged when pushes start failing, one when they succeed
//! again.
//!
//! The transport is `ureq` over rustls: `http://` or `https://`, trusting the system's CA
//! store plus `--push-ca FILE`. Credentials come from files, never from the command line:
//! basic auth for the URL's user (`https://USER@host`) with `--push-password-file`, or a
//! bearer token with `--push-token-file` (read through cpi-user/src/fsafe/mod.rs, sent
//! only over https or to loopback, never logged). Plain http to loopback proves nothing
//! of who listens, and any user may listen first on a free port: before each request
//! there, the sockets listening for it must be root's or the agent's
//! (cpi-agent/src/peer.rs, the kubelet's rule), else nothing is sent (no window, no
//! credentials, no tenant), the request counts as refused and is retried like a failed
//! one. Redirects are refused (a 3xx is a
//! rejection). The receiver is untrusted: one deadline of `timeout` covers connect, TLS,
//! send and the whole answer, headers are read up to `MAX_HEAD` bytes and the body up
//! to `MAX_BODY`, and 1xx answers are skipped without being kept, so no receiver can
//! make the agent wait longer or hold more.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use ureq::http::{HeaderValue, Uri};
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use super::peer::Peer;
use super::sink::{Sink, SinkError};
use super::{AgentError, AgentStatus, Window};
use cpi_user::profile::model::ProcessProfile;
use cpi_user::report::{otlp, pprof};

/// The Connect procedure, appended to the URL.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// The `__name__` series label of every pushed profile.
pub(crate) const PROFILE_NAME: &str = "cpi_bpf";
/// Attempts per window before it is dropped.
pub const MAX_ATTEMPTS: u32 = 5;
/// First retry delay; doubled per attempt up to [`MAX_BACKOFF`].
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Longest retry delay.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// `service_name` of a process whose cgroup cannot be read.
pub(crate) const UNKNOWN_SERVICE: &str = "unknown";
/// Bytes of an answer's status line and headers read at most.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// Bytes of an answer's body read at most (Pyroscope answers `{}`, or a short error).
pub(crate) const MAX_BODY: u64 = 64 * 1024;
/// Bytes of a password or token file read at most.
const MAX_SECRET_FILE: u64 = 16 * 1024;
/// Bytes of a `--push-ca` file read at most (Debian's whole bundle is about 220 KB).
const MAX_CA_FILE: u64 = 4 << 20;
/// Characters of an error answer's body logged.
const LOGGED_BODY_CHARS: usize = 200;

/// Where a pusher sends, and so its path, body and headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// Pyroscope's Connect Push API, JSON.
    Pyroscope,
    /// OTLP/HTTP, protobuf.
    Otlp,
}

impl Protocol {
    /// The flag that names the URL, for messages.
    fn flag(self) -> &'static str {
        match self {
            Protocol::Pyroscope => "--push-pyroscope",
            Protocol::Otlp => "--push-otlp",
        }
    }

    /// What is appended to the URL.
    fn path(self) -> &'static str {
        match self {
            Protocol::Pyroscope => PUSH_PATH,
            Protocol::Otlp => otlp::EXPORT_PATH,
        }
    }
}

/// What `service_name` is (`--service-label`); `UNKNOWN_SERVICE` where the process's
/// field is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceLabel {
    /// The process's comm.
    Comm,
    /// The process's cgroup path.
    Cgroup,
    /// Its Kubernetes pod's name.
    Pod,
    /// Its pod's namespace.
    Namespace,
    /// Its container's name in the pod.
    Container,
}

impl ServiceLabel {
    /// The `--service-label` values, as written there.
    pub(crate) const NAMES: [&'static str; 5] = ["comm", "cgroup", "pod", "namespace", "container"];

    /// The label for a `--service-label` value.
    pub fn parse(s: &str) -> Option<ServiceLabel> {
        Some(match s {
            "comm" => ServiceLabel::Comm,
            "cgroup" => ServiceLabel::Cgroup,
            "pod" => ServiceLabel::Pod,
            "namespace" => ServiceLabel::Namespace,
            "container" => ServiceLabel::Container,
            _ => return None,
        })
    }

    /// `service_name` of process `pr`.
    fn of(self, pr: &ProcessProfile) -> String {
        let id = &pr.identity;
        let field = match self {
            ServiceLabel::Comm => return pr.comm.clone(),
            ServiceLabel::Cgroup => &id.cgroup,
            ServiceLabel::Pod => &id.pod,
            ServiceLabel::Namespace => &id.namespace,
            ServiceLabel::Container => &id.container,
        };
        field.clone().unwrap_or_else(|| UNKNOWN_SERVICE.to_string())
    }
}

/// What [`Pusher::new`] needs (from the agent's `--push-*` settings).
#[derive(Clone, Debug, PartialEq)]
pub struct PushConfig {
    /// `http[s]://[USER@]host[:port][/prefix]`; [`PUSH_PATH`] is appended.
    pub url: String,
    /// `X-Scope-OrgID` (multi-tenant Pyroscope).
    pub tenant: Option<String>,
    /// What each series is named by.
    pub service_label: ServiceLabel,
    /// Windows waiting at most (at least 1).
    pub queue_windows: usize,
    /// Deadline of one request: connect, send and answer.
    pub timeout: Duration,
    /// PEM certificates trusted beside the system's CA store (`--push-ca`).
    pub ca_file: Option<PathBuf>,
    /// The password of the URL's user, basic auth (`--push-password-file`).
    pub password_file: Option<PathBuf>,
    /// A bearer token (`--push-token-file`).
    pub token_file: Option<PathBuf>,
}

/// Cumulative counts since start (exported by cpi-agent/src/metrics.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushStats {
    /// Requests answered 2xx.
    pub ok: u64,
    /// Requests that failed and may be retried (connection, timeout, TLS, an answer out
    /// of bounds, 408/429/5xx).
    pub errors: u64,
    /// Requests answered with another status (not retried).
    pub rejected: u64,
    /// Requests not sent: plain http to a loopback port someone else listens on
    /// (retried like failures).
    pub refused: u64,
    /// Windows never delivered: queue full, retries exhausted or rejected.
    pub dropped_windows: u64,
    /// Windows waiting now (including one being sent).
    pub queued: usize,
}

impl PushStats {
    /// The counts of every pusher together (the metrics count pushes to Pyroscope and
    /// OTLP as one).
    pub fn total(pushers: &[PushCounts]) -> PushStats {
        pushers
            .iter()
            .map(PushCounts::get)
            .fold(PushStats::default(), |a, s| PushStats {
                ok: a.ok + s.ok,
                errors: a.errors + s.errors,
                rejected: a.rejected + s.rejected,
                refused: a.refused + s.refused,
                dropped_windows: a.dropped_windows + s.dropped_windows,
                queued: a.queued + s.queued,
            })
    }
}

/// Where requests go, parsed once at start.
#[derive(Clone, Debug, PartialEq)]
struct Endpoint {
    /// The request URL, without credentials.
    url: String,
    /// `host:port`, for log lines.
    shown: String,
    /// Who answers there, and how that is proved.
    peer: Peer,
    /// The URL's user (basic auth).
    user: Option<String>,
}

/// `url` without the password of its user info, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{}", &rest[end..])
        }
        None => url.to_string(),
    }
}

fn parse_url(url: &str, protocol: Protocol) -> Result<Endpoint, AgentError> {
    let bad = |reason: &str| AgentError::PushUrl {
        flag: protocol.flag(),
        url: redact(url),
        reason: reason.to_string(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|_| bad("not a URL (expected http[s]://[USER@]host[:port][/path])"))?;
    let https = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
        Some("http") => false,
        Some("https") => true,
        Some(_) => return Err(bad("scheme must be http or https")),
        None => {
            return Err(bad(
                "not a URL (expected http[s]://[USER@]host[:port][/path])",
            ))
        }
    };
    if uri.query().is_some() || url.contains('#') {
        return Err(bad("no query or fragment allowed"));
    }
    let authority = uri.authority().ok_or_else(|| bad("missing host"))?;
    let host = authority.host();
    if host.is_empty() || host == "[]" {
        return Err(bad("missing or invalid host"));
    }
    let user = match authority.as_str().rsplit_once('@') {
        Some((info, _)) if info.contains(':') => {
            return Err(bad(
                "no password in the URL: put it in a file given to --push-password-file",
            ))
        }
        Some(("", _)) => return Err(bad("empty user before '@'")),
        Some((info, _)) => Some(info.to_string()),
        None => None,
    };
    // `Authority::port` hides a port that is not a u16: read it from the text.
    let host_port = authority
        .as_str()
        .rsplit_once('@')
        .map_or(authority.as_str(), |(_, h)| h);
    let port = match host_port.strip_prefix(host).map(|p| p.strip_prefix(':')) {
        Some(None) => {
            if https {
                443
            } else {
                80
            }
        }
        Some(Some(p)) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| bad("invalid port"))?,
        None => return Err(bad("missing or invalid host")),
    };
    let scheme = if https { "https" } else { "http" };
    let path = uri.path().trim_end_matches('/');
    Ok(Endpoint {
        url: format!("{scheme}://{host}:{port}{path}{}", protocol.path()),
        shown: format!("{host}:{port}"),
        peer: Peer::of(&format!("{scheme}://{host}:{port}")),
        user,
    })
}

/// The `Authorization` header value; marked sensitive, so it is never printed.
fn authorization(ep: &Endpoint, cfg: &PushConfig) -> Result<Option<HeaderValue>, AgentError> {
    let bad = |reason: String| AgentError::PushCredentials { reason };
    let value = match (&ep.user, &cfg.password_file, &cfg.token_file) {
        (None, None, None) => return Ok(None),
        (_, Some(_), Some(_)) | (Some(_), None, Some(_)) => {
            return Err(bad(
                "basic auth (a user in the URL, --push-password-file) and a bearer token \
                 (--push-token-file) exclude each other"
                    .into(),
            ))
        }
        (Some(_), None, None) => {
            return Err(bad(format!(
                "the URL names user {:?}: give its password with --push-password-file",
                ep.user.as_deref().unwrap_or_default()
            )))
        }
        (None, Some(_), None) => {
            return Err(bad(
                "--push-password-file needs a user in the URL (https://USER@host)".into(),
            ))
        }
        (Some(user), Some(file), None) => {
            let password = read_secret(file, "--push-password-file")?;
            let pair = [user.as_bytes(), b":", &password].concat();
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        }
        (None, None, Some(file)) => {
            let token = read_secret(file, "--push-token-file")?;
            if !token.iter().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!(
                    "--push-token-file {}: a token is printable ASCII without spaces",
                    file.display()
                )));
            }
            format!("Bearer {}", String::from_utf8_lossy(&token))
        }
    };
    if matches!(ep.peer, Peer::Unproven(_)) {
        return Err(bad(
            "credentials are sent over https only (or to a loopback address)".into(),
        ));
    }
    let mut v = HeaderValue::from_str(&value).map_err(|_| {
        bad("the credentials cannot be sent in an HTTP header (control characters)".into())
    })?;
    v.set_sensitive(true);
    Ok(Some(v))
}

/// A bounded regular file (cpi-user/src/fsafe/mod.rs), for `--push-*` files.
fn read_file(path: &Path, flag: &'static str, max: u64) -> Result<Vec<u8>, AgentError> {
    cpi_user::fsafe::read_bounded(path, max).map_err(|e| AgentError::PushFile {
        flag,
        detail: e.to_string(),
    })
}

/// A password or token: the file's content less its trailing line end.
fn read_secret(path: &Path, flag: &'static str) -> Result<Vec<u8>, AgentError> {
    let mut v = read_file(path, flag, MAX_SECRET_FILE)?;
    while v.last().is_some_and(|&b| b == b'\n' || b == b'\r') {
        v.pop();
    }
    if v.is_empty() {
        return Err(AgentError::PushFile {
            flag,
            detail: format!("{} is empty", path.display()),
        });
    }
    Ok(v)
}

/// The system's CA certificates plus those of `ca_file`.
pub(super) fn root_certs(ca_file: Option<&Path>) -> Result<RootCerts, AgentError> {
    let mut certs: Vec<Certificate<'static>> = rustls_native_certs::load_native_certs()
        .certs
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    if let Some(path) = ca_file {
        let pem = read_file(path, "--push-ca", MAX_CA_FILE)?;
        let before = certs.len();
        for item in ureq::tls::parse_pem(&pem) {
            match item {
                Ok(PemItem::Certificate(c)) => certs.push(c),
                Ok(_) => {}
                Err(e) => {
                    return Err(AgentError::PushFile {
                        flag: "--push-ca",
                        detail: format!("{}: {e}", path.display()),
                    })
                }
            }
        }
        if certs.len() == before {
            return Err(AgentError::PushFile {
                flag: "--push-ca",
                detail: format!("{}: no PEM certificate in it", path.display()),
            });
        }
    }
    Ok(RootCerts::Specific(Arc::new(certs)))
}

/// The HTTP client: one deadline per request, no redirects, no proxy, bounded answers.
fn client(cfg: &PushConfig, ep: &Endpoint) -> Result<ureq::Agent, AgentError> {
    let mut b = ureq::Agent::config_builder()
        .timeout_global(Some(cfg.timeout))
        .max_redirects(0)
        .http_status_as_error(false)
        .max_response_header_size(MAX_HEAD)
        .proxy(None)
        .user_agent(concat!("cpi-bpf/", env!("CARGO_PKG_VERSION")));
    if ep.peer == Peer::Tls {
        b = b.tls_config(
            TlsConfig::builder()
                .root_certs(root_certs(cfg.ca_file.as_deref())?)
                .build(),
        );
    } else if cfg.ca_file.is_some() {
        return Err(AgentError::PushFile {
            flag: "--push-ca",
            detail: "only used with an https:// URL".into(),
        });
    }
    Ok(ep.peer.client(b.build()))
}

fn nanos_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
}

/// One series' labels beside `__name__`: `service_name`, and the container and pod of
/// its processes where known (cpi-user/src/procmap/cgroup.rs, the cgroup path aside: it
/// is in each sample's pprof labels).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesLabels {
    service: String,
    identity: Vec<(&'static str, String)>,
}

/// The OTLP request body of a window (gzip'd), or None when it has no sample.
fn otlp_body(window: &Window, label: ServiceLabel) -> std::io::Result<Option<Vec<u8>>> {
    let start = nanos_since_epoch(window.start);
    let ctx = otlp::Context {
        start_unix_nanos: start as u64,
        duration_nanos: (nanos_since_epoch(window.end) - start).max(0) as u64,
        service: &|pr| label.of(pr),
    };
    otlp::build(&window.profile, &ctx)
        .map(|m| pprof::gzip(&m))
        .transpose()
}

/// The Push request body of a window, or None when it has no process.
pub(crate) fn request_body(
    window: &Window,
    label: ServiceLabel,
) -> std::io::Result<Option<Vec<u8>>> {
    let p = &window.profile;
    let series_of = |pr: &ProcessProfile| SeriesLabels {
        service: label.of(pr),
        identity: pr
            .identity
            .fields()
            .filter(|(k, _)| *k != "cgroup")
            .map(|(k, v)| (k, v.to_string()))
            .collect(),
    };
    let services: BTreeSet<SeriesLabels> = p.processes.iter().map(series_of).collect();
    if services.is_empty() {
        return Ok(None);
    }
    let start = nanos_since_epoch(window.start);
    let duration = (nanos_since_epoch(window.end) - start).max(0);
    let mut series = Vec::with_capacity(services.len());
    for name in &services {
        let mut msg = pprof::build_processes(p, &|pr| series_of(pr) == *name);
        if msg.sample.is_empty() {
            // Processes seen in the window without a sample of their own: Pyroscope
            // takes no profile without samples.
            continue;
        }
        msg.time_nanos = start;
        msg.duration_nanos = duration;
        let raw = pprof::gzip(&msg)?;
        let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        let mut labels = vec![
            serde_json::json!({"name": "__name__", "value": PROFILE_NAME}),
            serde_json::json!({"name": "service_name", "value": name.service}),
        ];
        for (k, v) in &name.identity {
            labels.push(serde_json::json!({"name": k, "value": v}));
        }
        series.push(serde_json::json!({
            "labels": labels,
            "samples": [{
                "ID": id.to_string(),
                "rawProfile": base64::engine::general_purpose::STANDARD.encode(raw),
            }],
        }));
    }
    if series.is_empty() {
        return Ok(None);
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
    /// Not sent: the peer did not prove itself (retried like a failure).
    Refused(String),
}

/// Everything a request needs, fixed at start.
struct Transport {
    protocol: Protocol,
    http: ureq::Agent,
    ep: Endpoint,
    tenant: Option<String>,
    authorization: Option<HeaderValue>,
}

impl Transport {
    /// One request under one deadline; the answer read within [`MAX_HEAD`] and
    /// [`MAX_BODY`].
    fn send(&self, body: &[u8]) -> Outcome {
        match self.ep.peer.distrusted_now() {
            Some((why, true)) => return Outcome::Refused(why),
            Some((why, false)) => return Outcome::Failed(why),
            None => {}
        }
        let req = self.http.post(&self.ep.url);
        let mut req = match self.protocol {
            Protocol::Pyroscope => req
                .header("Content-Type", "application/json")
                .header("Connect-Protocol-Version", "1"),
            Protocol::Otlp => req
                .header("Content-Type", otlp::CONTENT_TYPE)
                .header("Content-Encoding", "gzip"),
        };
        if let Some(t) = &self.tenant {
            req = req.header("X-Scope-OrgID", t);
        }
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a.clone());
        }
        let mut answer = match req.send(body) {
            Ok(a) => a,
            Err(e) => return Outcome::Failed(describe(&e)),
        };
        let code = answer.status().as_u16();
        let text = match answer
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
        {
            Ok(b) => b,
            Err(e) => return Outcome::Failed(format!("HTTP {code}, then {}", describe(&e))),
        };
        let text: String = String::from_utf8_lossy(&text)
            .trim()
            .chars()
            .take(LOGGED_BODY_CHARS)
            .collect();
        match code {
            200..=299 => Outcome::Delivered,
            300..=399 => Outcome::Rejected(format!("HTTP {code}: redirects are not followed")),
            408 | 429 | 500..=599 => Outcome::Failed(format!("HTTP {code}: {text}")),
            _ => Outcome::Rejected(format!("HTTP {code}: {text}")),
        }
    }
}

/// A transport error in words (ureq's own; none carries a header or the body).
fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::BodyExceedsLimit(n) => format!("an answer body over {n} bytes"),
        ureq::Error::Timeout(_) => "no complete answer within --push-timeout".into(),
        e => e.to_string(),
    }
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
        super::lock(&self.queue)
    }
}

/// The push sink. Dropping it stops the worker after its current request.
pub struct Pusher {
    shared: Arc<Shared>,
    protocol: Protocol,
    service_label: ServiceLabel,
    capacity: usize,
}

impl Pusher {
    /// A pusher to Pyroscope (`--push-pyroscope`): `Pusher::start`.
    pub fn new(cfg: PushConfig) -> Result<Pusher, AgentError> {
        Pusher::start(cfg, Protocol::Pyroscope)
    }

    /// A pusher to an OpenTelemetry Collector (`--push-otlp`): `Pusher::start`.
    pub fn otlp(cfg: PushConfig) -> Result<Pusher, AgentError> {
        Pusher::start(cfg, Protocol::Otlp)
    }

    /// Checks the URL, tenant and credentials, reads the CA and secret files, and starts
    /// the worker thread.
    fn start(cfg: PushConfig, protocol: Protocol) -> Result<Pusher, AgentError> {
        let ep = parse_url(&cfg.url, protocol)?;
        if let Some(t) = &cfg.tenant {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(AgentError::PushTenant {
                    tenant: t.clone(),
                    reason: "must be non-empty printable ASCII without spaces".into(),
                });
            }
        }
        let transport = Transport {
            protocol,
            http: client(&cfg, &ep)?,
            authorization: authorization(&ep, &cfg)?,
            tenant: cfg.tenant.clone(),
            ep,
        };
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
        std::thread::Builder::new()
            .name("cpi-bpf-push".into())
            .spawn(move || work(&worker, &transport))
            .map_err(|cause| AgentError::Thread {
                what: "push",
                cause,
            })?;
        Ok(Pusher {
            shared,
            protocol,
            service_label: cfg.service_label,
            capacity: cfg.queue_windows.max(1),
        })
    }

    /// Encodes the window and queues it; never waits for the network. A full queue
    /// drops its oldest window.
    pub fn submit(&self, window: &Window) {
        let body = match self.protocol {
            Protocol::Pyroscope => request_body(window, self.service_label),
            Protocol::Otlp => otlp_body(window, self.service_label),
        };
        let body = match body {
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

    /// A reader of [`Pusher::stats`] for another sink (the metrics).
    pub fn counts(&self) -> PushCounts {
        PushCounts(self.shared.clone())
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

/// A pusher's counts, read where the pusher is not (the metrics export them).
#[derive(Clone)]
pub struct PushCounts(Arc<Shared>);

impl PushCounts {
    /// The counts so far.
    pub fn get(&self) -> PushStats {
        self.0.lock().stats
    }
}

impl Sink for Pusher {
    fn report(&mut self, window: &Window, _: &mut AgentStatus) -> Result<(), SinkError> {
        self.submit(window);
        Ok(())
    }

    fn flush(&mut self, within: Duration) {
        Pusher::flush(self, within);
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
    }
}

/// What the worker has said of failing requests since the last delivery.
#[derive(Default)]
struct Said {
    /// Requests failed, rejected or refused since the last delivery: only the first
    /// is logged, ...
    failing: u64,
    /// ... and the first refusal, whatever came before it (a squatter on the port
    /// after the receiver went away is worth its own line).
    refused: bool,
}

impl Said {
    /// Logs `outcome` of a request to `host` if it is the first of its kind.
    fn say(&mut self, outcome: &Outcome, host: &str) {
        let (what, why, first) = match outcome {
            Outcome::Delivered => {
                if self.failing > 0 {
                    let n = self.failing;
                    log::info!("push: {host} accepts again (after {n} failed requests)");
                }
                *self = Said::default();
                return;
            }
            Outcome::Failed(why) => (
                "push failed (retrying, then dropping windows)",
                why,
                self.failing == 0,
            ),
            Outcome::Rejected(why) => ("push rejected (windows dropped)", why, self.failing == 0),
            Outcome::Refused(why) => (
                "push refused, nothing sent (retrying, then dropping windows)",
                why,
                !std::mem::replace(&mut self.refused, true),
            ),
        };
        if first {
            log::warn!("{what}: {host}: {why}; said once until a push succeeds");
        } else {
            log::debug!("{what}: {host}: {why}");
        }
        self.failing += 1;
    }
}

/// The worker: sends the oldest window until it is delivered, rejected, out of
/// attempts or pushed out of the queue.
fn work(shared: &Shared, t: &Transport) {
    let mut attempts: (u64, u32) = (u64::MAX, 0);
    let mut said = Said::default();
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
        let outcome = t.send(&body);
        drop(body);
        let mut q = shared.lock();
        q.in_flight = None;
        let abandoned = std::mem::take(&mut q.abandoned);
        let mut backoff = None;
        let host = &t.ep.shown;
        match &outcome {
            Outcome::Delivered => q.stats.ok += 1,
            Outcome::Failed(_) | Outcome::Refused(_) => {
                if matches!(outcome, Outcome::Refused(_)) {
                    q.stats.refused += 1;
                } else {
                    q.stats.errors += 1;
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
            Outcome::Rejected(_) => {
                q.stats.rejected += 1;
                q.stats.dropped_windows += 1;
            }
        }
        said.say(&outcome, host);
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
        let ep = parse_url("http://pyro.example:4040", Protocol::Pyroscope).unwrap();
        assert_eq!(
            (ep.url.as_str(), ep.shown.as_str(), &ep.peer),
            (
                "http://pyro.example:4040/push.v1.PusherService/Push",
                "pyro.example:4040",
                &Peer::Unproven(vec![])
            )
        );
        let ep = parse_url("HTTP://10.0.0.1/prefix/", Protocol::Pyroscope).unwrap();
        assert_eq!(
            ep.url,
            "http://10.0.0.1:80/prefix/push.v1.PusherService/Push"
        );
        let ep = parse_url("http://[::1]:9/", Protocol::Pyroscope).unwrap();
        let at = |s: &str| s.parse().unwrap();
        assert_eq!(
            (ep.shown.as_str(), ep.peer),
            ("[::1]:9", Peer::Loopback(vec![at("[::1]:9")]))
        );
        let ep = parse_url("http://localhost:4040", Protocol::Otlp).unwrap();
        assert_eq!(
            ep.peer,
            Peer::Loopback(vec![at("127.0.0.1:4040"), at("[::1]:4040")])
        );
        let ep = parse_url("https://12345@profiles.example.net", Protocol::Pyroscope).unwrap();
        assert_eq!(
            (ep.url.as_str(), &ep.peer, ep.user.as_deref()),
            (
                "https://profiles.example.net:443/push.v1.PusherService/Push",
                &Peer::Tls,
                Some("12345")
            )
        );
        for bad in [
            "pyro:4040",
            "ftp://pyro",
            "http://",
            "http://:80",
            "http://h:0",
            "http://h:99999",
            "https://u:hunter2@h",
            "http://@h",
            "http://h/x?y",
            "http://h/x#y",
            "http://[::1",
            "http://h /x",
        ] {
            let e = parse_url(bad, Protocol::Pyroscope)
                .expect_err(bad)
                .to_string();
            assert!(e.starts_with("--push-pyroscope"), "{bad}: {e}");
            assert!(!e.contains("hunter2"), "the password is shown: {e}");
        }
        let ep = parse_url("http://collector:4318/", Protocol::Otlp).unwrap();
        assert_eq!(ep.url, "http://collector:4318/v1development/profiles");
        let e = parse_url("ftp://collector", Protocol::Otlp).unwrap_err();
        assert!(e.to_string().starts_with("--push-otlp "), "{e}");
    }

    fn config(url: &str) -> PushConfig {
        PushConfig {
            url: url.into(),
            tenant: None,
            service_label: ServiceLabel::Comm,
            queue_windows: 1,
            timeout: Duration::from_millis(10),
            ca_file: None,
            password_file: None,
            token_file: None,
        }
    }

    #[test]
    fn credentials_come_from_files_and_fit_the_url() {
        let dir = std::env::temp_dir().join(format!("cpi-push-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pw = dir.join("password");
        std::fs::write(&pw, "s3cret\n").unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "tok-123\r\n").unwrap();
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let spaced = dir.join("spaced");
        std::fs::write(&spaced, "a b").unwrap();
        let auth = |url: &str, pw: Option<&Path>, token: Option<&Path>| {
            let cfg = PushConfig {
                password_file: pw.map(Path::to_path_buf),
                token_file: token.map(Path::to_path_buf),
                ..config(url)
            };
            authorization(&parse_url(url, Protocol::Pyroscope).unwrap(), &cfg)
        };
        let basic = auth("https://user@h", Some(&pw), None).unwrap().unwrap();
        assert_eq!(
            basic.to_str().unwrap(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("user:s3cret")
            )
        );
        assert!(basic.is_sensitive());
        let bearer = auth("https://h", None, Some(&token)).unwrap().unwrap();
        assert_eq!(bearer.to_str().unwrap(), "Bearer tok-123");
        assert!(auth("http://127.0.0.1:1", None, Some(&token)).is_ok());
        assert!(auth("https://h", None, None).unwrap().is_none());
        for (url, pw, token, want) in [
            ("https://user@h", None, None, "--push-password-file"),
            ("https://h", Some(&pw), None, "needs a user"),
            (
                "https://user@h",
                Some(&pw),
                Some(&token),
                "exclude each other",
            ),
            ("http://pyro.example", None, Some(&token), "https only"),
            ("https://h", None, Some(&empty), "is empty"),
            ("https://h", None, Some(&spaced), "printable ASCII"),
            (
                "https://h",
                None,
                Some(&dir.join("none")),
                "--push-token-file",
            ),
        ] {
            let e = auth(url, pw.map(PathBuf::as_path), token.map(PathBuf::as_path))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{url}: {e}");
            assert!(!e.contains("s3cret") && !e.contains("tok-123"), "{e}");
        }
        let ca = PushConfig {
            ca_file: Some(pw.clone()),
            ..config("https://h")
        };
        let e = Pusher::new(ca).err().unwrap().to_string();
        assert!(
            e.starts_with("--push-ca") && e.contains("no PEM certificate"),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn body_has_one_series_per_service() {
        use crate::metrics::tests::{function, profile};
        use cpi_user::profile::model::Mode;
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
            tenant: Some(t.into()),
            ..config("http://127.0.0.1:1")
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
