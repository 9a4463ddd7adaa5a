//! A local stand-in for Pyroscope's ingestion endpoint (no Pyroscope server is
//! installable from Debian's archive on these machines). It enforces the public contract of the Connect
//! procedure `push.v1.PusherService/Push` with the JSON codec, as the agent uses it
//! (cpi-user/src/agent/push.rs): method, path, content type, the protojson shape of
//! `PushRequest` (no unknown fields: `series[].labels[].{name,value}`,
//! `series[].samples[].{ID,rawProfile}`), valid label names, `__name__` and
//! `service_name`, no per-process series labels, a UUID per sample, standard base64 of a
//! gzip'd pprof that decodes with consistent ids. A conforming request gets `200 {}`; a
//! violation gets Connect's `400 {"code":"invalid_argument",...}` and is recorded.
//!
//! It can answer late ([`Receiver::set_delay`]) and be stopped and restarted on the same
//! port, to test a slow or dead receiver.

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
    delay: Option<Duration>,
}

pub struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on `addr` (`127.0.0.1:0` for a free port; a stopped receiver's address to
    /// bring it back).
    pub fn start(addr: SocketAddr) -> std::io::Result<Receiver> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            while !sp.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (st, sp) = (st.clone(), sp.clone());
                        std::thread::spawn(move || handle(conn, &st, &sp));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            // The listener is dropped here: the port refuses connections.
        });
        Ok(Receiver {
            addr,
            state,
            stop,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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

fn handle(mut conn: TcpStream, state: &Mutex<State>, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Some((head, body)) = read_request(&mut conn) else {
        return;
    };
    let delay = {
        let mut s = state.lock().unwrap();
        s.requests += 1;
        s.delay
    };
    if let Some(d) = delay {
        // Answer late (or never, if the receiver stops first): the client must have
        // given up by then, so nothing is recorded.
        let until = Instant::now() + d;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = respond(
            &mut conn,
            "503 Service Unavailable",
            r#"{"code":"unavailable"}"#,
        );
        return;
    }
    match check(&head, &body) {
        Ok(push) => {
            state.lock().unwrap().accepted.push(push);
            let _ = respond(&mut conn, "200 OK", "{}");
        }
        Err(why) => {
            state.lock().unwrap().violations.push(why.clone());
            let msg = serde_json::json!({"code": "invalid_argument", "message": why});
            let _ = respond(&mut conn, "400 Bad Request", &msg.to_string());
        }
    }
}

fn respond(conn: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Head (request line and headers) and a body of Content-Length bytes.
fn read_request(conn: &mut TcpStream) -> Option<(String, Vec<u8>)> {
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

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
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
