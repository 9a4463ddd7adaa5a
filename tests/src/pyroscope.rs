//! A local stand-in for Pyroscope's ingestion endpoint (no Pyroscope server is
//! installable from Debian's archive on these machines). It enforces the public contract of the Connect
//! procedure `push.v1.PusherService/Push` with the JSON codec, as the agent uses it
//! (cpi-agent/src/push.rs): method, path, content type, the protojson shape of
//! `PushRequest` (no unknown fields: `series[].labels[].{name,value}`,
//! `series[].samples[].{ID,rawProfile}`), valid label names, `__name__` and
//! `service_name`, no per-process series labels, a UUID per sample, standard base64 of a
//! gzip'd pprof that decodes with consistent ids. A conforming request gets `200 {}`; a
//! violation gets Connect's `400 {"code":"invalid_argument",...}` and is recorded.
//!
//! It can answer late ([`Receiver::set_delay`]) and be stopped and restarted on the same
//! port, to test a slow or dead receiver. [`Receiver::start_with`] serves https (a
//! certificate of tests/src/tls.rs), demands credentials (a request without the right
//! `Authorization` gets `401 {"code":"unauthenticated"}`, counted, not a violation), or
//! misbehaves in one of the ways of [`Behaviour`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use cpi_user::report::pprof::PprofProfile;
use prost::Message;

pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";

/// One series of an accepted request.
#[derive(Clone, Debug)]
pub struct Series {
    pub labels: Vec<(String, String)>,
    pub service: String,
    pub id: String,
    /// The decoded `rawProfile`: gzip'd pprof bytes, as `go tool pprof` reads them.
    pub raw_profile: Vec<u8>,
    pub profile: PprofProfile,
}

/// One accepted request.
#[derive(Clone, Debug)]
pub struct Push {
    pub tenant: Option<String>,
    pub series: Vec<Series>,
}

#[derive(Default)]
struct State {
    accepted: Vec<Push>,
    violations: Vec<String>,
    /// Requests received, conforming or not, answered in time or not.
    requests: u64,
    /// Requests refused for their credentials.
    unauthorized: u64,
    delay: Option<Duration>,
}

/// How a receiver answers a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Behaviour {
    /// By the contract.
    #[default]
    Conform,
    /// `HTTP/1.1 100 Continue` lines, without end.
    EndlessContinue,
    /// The connection reset (RST) once the request's head is read.
    Reset,
    /// `200 OK` announcing a body of 1 GiB, sent as fast as the client reads.
    HugeBody,
    /// A status line and one header, a byte every 100 ms, never ending.
    SlowDrip,
    /// Header lines without end.
    EndlessHeaders,
}

/// What [`Receiver::start_with`] serves.
#[derive(Clone, Default)]
pub struct Options {
    /// https with this server configuration; `None`: plain http.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The `Authorization` header value every request must carry.
    pub authorization: Option<String>,
    pub behaviour: Behaviour,
}

pub struct Receiver {
    addr: SocketAddr,
    https: bool,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on `addr` (`127.0.0.1:0` for a free port; a stopped receiver's address to
    /// bring it back).
    pub fn start(addr: SocketAddr) -> std::io::Result<Receiver> {
        Receiver::start_with(addr, Options::default())
    }

    /// [`Receiver::start`] serving `options`.
    pub fn start_with(addr: SocketAddr, options: Options) -> std::io::Result<Receiver> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let https = options.tls.is_some();
        let accept = std::thread::spawn(move || {
            while !sp.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (st, sp, o) = (st.clone(), sp.clone(), options.clone());
                        std::thread::spawn(move || serve(conn, &o, &st, &sp));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            // The listener is dropped here: the port refuses connections.
        });
        Ok(Receiver {
            addr,
            https,
            state,
            stop,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, or `https://ADDR` when serving TLS.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Answer every request only after `delay` (None: at once).
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.state.lock().unwrap().delay = delay;
    }

    pub fn accepted(&self) -> Vec<Push> {
        self.state.lock().unwrap().accepted.clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }

    pub fn requests(&self) -> u64 {
        self.state.lock().unwrap().requests
    }

    /// Requests refused for their credentials.
    pub fn unauthorized(&self) -> u64 {
        self.state.lock().unwrap().unauthorized
    }

    /// Closes the port (connections are refused from now on).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A plain or TLS connection (the OTLP receiver, tests/src/otlp.rs, reads plain ones).
pub trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

fn serve(conn: TcpStream, o: &Options, state: &Mutex<State>, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    if o.behaviour == Behaviour::Reset {
        let mut head = [0u8; 1024];
        let _ = (&conn).read(&mut head);
        state.lock().unwrap().requests += 1;
        reset(&conn);
        return;
    }
    let mut c: Box<dyn Conn> = match &o.tls {
        Some(cfg) => match rustls::ServerConnection::new(cfg.clone()) {
            Ok(tls) => Box::new(rustls::StreamOwned::new(tls, conn)),
            Err(_) => return,
        },
        None => Box::new(conn),
    };
    // A TLS handshake the client refused ends in the first read.
    let Some((head, body)) = read_request(&mut c) else {
        return;
    };
    let _ = match o.behaviour {
        Behaviour::Conform => handle(&mut c, &head, &body, o, state, stop),
        b => misbehave(&mut c, b, state, stop),
    };
    let _ = c.flush();
}

/// Closes with a TCP reset: `SO_LINGER` of zero seconds, then close.
fn reset(conn: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a `linger` of its size.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Writes what a [`Behaviour`] writes until the client gives up or the receiver stops.
fn misbehave(
    c: &mut dyn Conn,
    b: Behaviour,
    state: &Mutex<State>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    state.lock().unwrap().requests += 1;
    let chunk = |line: &[u8]| line.repeat(4096 / line.len());
    let (first, repeat, pause): (&[u8], Vec<u8>, Duration) = match b {
        Behaviour::EndlessContinue => (
            b"",
            chunk(b"HTTP/1.1 100 Continue\r\n\r\n"),
            Duration::from_millis(1),
        ),
        Behaviour::EndlessHeaders => (
            b"HTTP/1.1 200 OK\r\n",
            chunk(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"),
            Duration::from_millis(1),
        ),
        Behaviour::HugeBody => (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n",
            vec![b' '; 64 * 1024],
            Duration::ZERO,
        ),
        Behaviour::SlowDrip => (b"", b"HTTP/1.1 200 OK\r\nX-Drip: ".to_vec(), Duration::ZERO),
        Behaviour::Conform | Behaviour::Reset => unreachable!("not a stream"),
    };
    c.write_all(first)?;
    let mut sent = 0u64;
    while !stop.load(Ordering::SeqCst) {
        match b {
            Behaviour::SlowDrip => {
                let i = (sent as usize).min(repeat.len());
                c.write_all(repeat.get(i..i + 1).unwrap_or(b"a"))?;
                c.flush()?;
                sent += 1;
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Behaviour::HugeBody if sent >= 1 << 30 => return Ok(()),
            _ => {}
        }
        c.write_all(&repeat)?;
        sent += repeat.len() as u64;
        std::thread::sleep(pause);
    }
    Ok(())
}

/// Answers a request by the contract (after the credentials and any delay).
fn handle(
    conn: &mut dyn Conn,
    head: &str,
    body: &[u8],
    o: &Options,
    state: &Mutex<State>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let delay = {
        let mut s = state.lock().unwrap();
        s.requests += 1;
        s.delay
    };
    if let Some(want) = &o.authorization {
        if header(head, "authorization") != Some(want.as_str()) {
            state.lock().unwrap().unauthorized += 1;
            let msg = r#"{"code":"unauthenticated","message":"bad credentials"}"#;
            return respond(conn, "401 Unauthorized", msg);
        }
    }
    if let Some(d) = delay {
        // Answer late (or never, if the receiver stops first): the client must have
        // given up by then, so nothing is recorded.
        let until = Instant::now() + d;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        return respond(conn, "503 Service Unavailable", r#"{"code":"unavailable"}"#);
    }
    match check(head, body) {
        Ok(push) => {
            state.lock().unwrap().accepted.push(push);
            respond(conn, "200 OK", "{}")
        }
        Err(why) => {
            state.lock().unwrap().violations.push(why.clone());
            let msg = serde_json::json!({"code": "invalid_argument", "message": why});
            respond(conn, "400 Bad Request", &msg.to_string())
        }
    }
}

fn respond(conn: &mut dyn Conn, status: &str, body: &str) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Head (request line and headers) and a body of Content-Length bytes.
pub fn read_request(conn: &mut dyn Conn) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = conn.read(&mut tmp).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let len: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[end + 4..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut tmp).ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some((head, body))
}

pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn only_keys(v: &serde_json::Value, allowed: &[&str], what: &str) -> Result<(), String> {
    let obj = v.as_object().ok_or(format!("{what} is not an object"))?;
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!("{what}: unknown field {k:?}")),
        None => Ok(()),
    }
}

fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn is_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The whole contract; the first violation is the error.
fn check(head: &str, body: &[u8]) -> Result<Push, String> {
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path, version) = (first.next(), first.next(), first.next());
    if method != Some("POST") {
        return Err(format!("method {method:?}, want POST"));
    }
    if path != Some(PUSH_PATH) {
        return Err(format!("path {path:?}, want {PUSH_PATH}"));
    }
    if !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(format!("version {version:?}"));
    }
    let ct = header(head, "content-type").unwrap_or("");
    if ct.split(';').next().map(str::trim) != Some("application/json") {
        return Err(format!("content type {ct:?}, want application/json"));
    }
    if let Some(v) = header(head, "connect-protocol-version") {
        if v != "1" {
            return Err(format!("Connect-Protocol-Version {v:?}"));
        }
    }
    if header(head, "content-length").and_then(|v| v.parse::<usize>().ok()) != Some(body.len()) {
        return Err("Content-Length missing or wrong".into());
    }
    let tenant = header(head, "x-scope-orgid").map(String::from);
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    only_keys(&v, &["series"], "request")?;
    let series = v["series"].as_array().ok_or("series is not an array")?;
    if series.is_empty() {
        return Err("no series".into());
    }
    let mut out = Vec::new();
    for s in series {
        only_keys(s, &["labels", "samples"], "series")?;
        let mut labels = Vec::new();
        for l in s["labels"].as_array().ok_or("labels is not an array")? {
            only_keys(l, &["name", "value"], "label")?;
            let (Some(n), Some(v)) = (l["name"].as_str(), l["value"].as_str()) else {
                return Err(format!("label {l} has a non-string name or value"));
            };
            if !is_label_name(n) {
                return Err(format!("invalid label name {n:?}"));
            }
            if labels.iter().any(|(k, _): &(String, String)| k == n) {
                return Err(format!("duplicate label {n:?}"));
            }
            if ["pid", "tid", "comm"].contains(&n) {
                return Err(format!("per-process label {n:?} on a series"));
            }
            labels.push((n.to_string(), v.to_string()));
        }
        let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        if get("__name__").as_deref() != Some("cpi_bpf") {
            return Err(format!("__name__ is {:?}, want cpi_bpf", get("__name__")));
        }
        let service = get("service_name")
            .filter(|s| !s.is_empty())
            .ok_or("no service_name")?;
        let samples = s["samples"].as_array().ok_or("samples is not an array")?;
        if samples.is_empty() {
            return Err("a series without samples".into());
        }
        for x in samples {
            only_keys(x, &["ID", "rawProfile"], "sample")?;
            let id = x["ID"].as_str().ok_or("sample ID missing")?;
            if !is_uuid(id) {
                return Err(format!("sample ID {id:?} is not a UUID"));
            }
            let b64 = x["rawProfile"].as_str().ok_or("rawProfile missing")?;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("rawProfile is not standard base64: {e}"))?;
            let profile = pprof(&raw)?;
            out.push(Series {
                labels: labels.clone(),
                service: service.clone(),
                id: id.to_string(),
                raw_profile: raw,
                profile,
            });
        }
    }
    Ok(Push {
        tenant,
        series: out,
    })
}

/// Gunzips and decodes a pprof, checking what readers rely on.
fn pprof(gz: &[u8]) -> Result<PprofProfile, String> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .map_err(|e| format!("rawProfile is not gzip: {e}"))?;
    let p = PprofProfile::decode(raw.as_slice()).map_err(|e| format!("not a pprof: {e}"))?;
    let strings = p.string_table.len() as i64;
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err("pprof string table does not start with \"\"".into());
    }
    if p.sample_type.is_empty() || p.sample.is_empty() {
        return Err("pprof without sample types or samples".into());
    }
    let key = |name: &str| {
        p.string_table
            .iter()
            .position(|s| s == name)
            .map(|i| i as i64)
    };
    for s in &p.sample {
        if s.value.len() != p.sample_type.len() {
            return Err("pprof sample with the wrong number of values".into());
        }
        if s.location_id
            .iter()
            .any(|&id| !p.location.iter().any(|l| l.id == id))
        {
            return Err("pprof sample at an unknown location".into());
        }
        for name in ["pid", "comm"] {
            if !s.label.iter().any(|l| Some(l.key) == key(name)) {
                return Err(format!("pprof sample without the {name} label"));
            }
        }
        if s.label.iter().any(|l| l.key >= strings || l.str >= strings) {
            return Err("pprof label outside the string table".into());
        }
    }
    for l in &p.location {
        if !p.mapping.iter().any(|m| m.id == l.mapping_id) {
            return Err("pprof location in an unknown mapping".into());
        }
        if l.line
            .iter()
            .any(|x| !p.function.iter().any(|f| f.id == x.function_id))
        {
            return Err("pprof line of an unknown function".into());
        }
    }
    if p.time_nanos <= 0 {
        return Err("pprof without time_nanos (the window's start)".into());
    }
    Ok(p)
}
