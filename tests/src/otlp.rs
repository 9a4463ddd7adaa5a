//! OTLP profiles as their official reader sees them: [`decode`] runs tests/otlp_decode.py,
//! which parses with PyPI's `opentelemetry-proto` (the venv `cargo xtask setup` makes at
//! `target/otlp-proto/`), not with the project's own message types.
//!
//! [`Receiver`] is a local receiver, not an OpenTelemetry Collector (none is installable
//! from Debian's archive on these machines): it enforces OTLP/HTTP's wire contract for
//! profiles as opentelemetry-proto v1.11.0's specification states it — `POST
//! /v1development/profiles`, `Content-Type: application/x-protobuf`, a gzip body only with
//! `Content-Encoding: gzip`, a right `Content-Length`, a body that [`decode`] accepts —
//! and answers `200` with an empty `ExportProfilesServiceResponse`, or `400` with the
//! violation, which it records.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::pyroscope::{header, read_request};

/// The venv's Python, `None` after [`crate::skip`] when `cargo xtask setup` has not made it.
fn python() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"));
    let py = target.join("otlp-proto/bin/python");
    if py.is_file() {
        return Some(py);
    }
    crate::skip(format_args!(
        "{} missing (the official opentelemetry-proto package; cargo xtask setup installs it)",
        py.display()
    ));
    None
}

/// What the official package reads in `body` (tests/otlp_decode.py's JSON): `Ok(None)`
/// when it cannot run here (skipped), `Err` with its reason when it refuses the body.
pub fn decode(body: &[u8]) -> Result<Option<serde_json::Value>, String> {
    let Some(py) = python() else {
        return Ok(None);
    };
    let script = crate::workspace_root().join("tests/otlp_decode.py");
    let mut child = Command::new(py)
        .arg(script)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("python: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped");
    let body = body.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let _ = writer.join();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    serde_json::from_slice(&out.stdout)
        .map(Some)
        .map_err(|e| format!("decoder output: {e}"))
}

#[derive(Default)]
struct State {
    /// Each accepted request as [`decode`] read it (`Null` where decoding was skipped).
    accepted: Vec<serde_json::Value>,
    violations: Vec<String>,
}

/// The local receiver (module doc).
pub struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on a free loopback port.
    pub fn start() -> std::io::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            while !sp.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => serve(conn, &st),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Receiver {
            addr,
            state,
            stop,
            accept: Some(accept),
        })
    }

    /// `http://ADDR`, what `--push-otlp` takes.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn accepted(&self) -> Vec<serde_json::Value> {
        self.state.lock().unwrap().accepted.clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Some((head, body)) = read_request(&mut conn) else {
        return;
    };
    let (status, answer) = match check(&head, &body) {
        Ok(v) => {
            state.lock().unwrap().accepted.push(v);
            ("200 OK", String::new())
        }
        Err(why) => {
            state.lock().unwrap().violations.push(why.clone());
            ("400 Bad Request", why)
        }
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{answer}",
        answer.len()
    );
}

/// The contract; the first violation is the error.
fn check(head: &str, body: &[u8]) -> Result<serde_json::Value, String> {
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (first.next(), first.next());
    if method != Some("POST") {
        return Err(format!("method {method:?}, want POST"));
    }
    if path != Some("/v1development/profiles") {
        return Err(format!("path {path:?}, want /v1development/profiles"));
    }
    let ct = header(head, "content-type").unwrap_or("");
    if ct != "application/x-protobuf" {
        return Err(format!("content type {ct:?}, want application/x-protobuf"));
    }
    if header(head, "content-length").and_then(|v| v.parse::<usize>().ok()) != Some(body.len()) {
        return Err("Content-Length missing or wrong".into());
    }
    let raw = match header(head, "content-encoding") {
        None => body.to_vec(),
        Some("gzip") => {
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut raw)
                .map_err(|e| format!("Content-Encoding gzip, but the body is not gzip: {e}"))?;
            raw
        }
        Some(e) => return Err(format!("Content-Encoding {e:?}")),
    };
    Ok(decode(&raw)?.unwrap_or(serde_json::Value::Null))
}
