//! Helpers shared by the integration tests: test programs (built by [`programs`]), the
//! `cpi-bpf` binary, and skips that print their reason.

pub mod bpf_vm;
pub mod browser;
pub mod diff_pair;
pub mod otlp;
pub mod perf_data;
pub mod profgen;
pub mod programs;
pub mod pyroscope;
pub mod tls;
pub mod tracer;
pub use programs::skip;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A fresh directory under the system temp dir, named after `tag` and unique to this
/// call: two tests of one process that pick the same tag and run at once must not share
/// (and wipe) one directory, as two churn tests' stores once did.
pub fn temp_dir(tag: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("cpi-tests-{}-{n}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

/// A private copy, `dir/OUT`, of the `-O2 -g` build of `tests/programs/SOURCE` plus
/// `extra` gcc flags (compiled once and cached by [`programs`]): the test may strip,
/// delete or run it by its own name. `None` after printing why (gcc is missing).
pub fn compile_c(source: &str, dir: &Path, out: &str, extra: &[&str]) -> Option<PathBuf> {
    let flags: Vec<&str> = ["-O2", "-g"].iter().chain(extra).copied().collect();
    let built = programs::compile(source, &flags)?;
    let exe = dir.join(out);
    copy_program(&built, &exe);
    Some(exe)
}

/// Copies a program that a test will run. `cp` does the writing: a write descriptor
/// open in this multi-threaded process would be inherited by any child another test
/// forks meanwhile, and exec of the copy fails with ETXTBSY until that child execs.
pub fn copy_program(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(to)
        .status()
        .unwrap_or_else(|e| panic!("cp: {e}"));
    assert!(
        status.success(),
        "cp {} {}: {status}",
        from.display(),
        to.display()
    );
}

/// True when running as root; otherwise prints why the test is skipped (and fails under
/// CI, [`skip`]).
pub fn require_root(what: &str) -> bool {
    if cpi_user::fsafe::euid() == 0 {
        return true;
    }
    skip(format_args!(
        "{what} needs root (BPF and perf events); CI runs as root"
    ));
    false
}

/// The `cpi-bpf` binary of the profile this test was built with, built on first use
/// (cargo builds binaries only for the package under test, and this is another one).
pub fn cpi_bpf() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile>/deps/<test>-<hash> → target/<profile>
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps");
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let target_dir = profile_dir.parent().expect("target dir");
        let mut cmd = cargo();
        cmd.args([
            "build",
            "--quiet",
            "--package",
            "cpi-bpf",
            "--bin",
            "cpi-bpf",
        ])
        .arg("--target-dir")
        .arg(target_dir);
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("running cargo build for cpi-bpf");
        assert!(st.success(), "building cpi-bpf failed: {st}");
        profile_dir.join("cpi-bpf")
    })
}

/// `cargo` in the workspace, for a build of the workspace's own. Build scripts (ring's)
/// rerun when the `CARGO_PKG_*`, `CARGO_MANIFEST_*` and `OUT_DIR` this test was given
/// differ from the outer build's, which would rebuild the whole chain here and again in
/// the next `cargo test`: they are not passed on.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_") || k.starts_with("CARGO_MANIFEST_") || k == "OUT_DIR" {
            cmd.env_remove(&*k);
        }
    }
    cmd.current_dir(workspace_root());
    cmd
}

/// `systemd-analyze verify` of `unit` (the text of dist/cpi-bpf.service, which names the
/// installed binary and config) with those replaced by `binary` and `config`, written
/// into `dir`; `None` after saying why it was skipped (systemd-analyze is missing).
pub fn verify_unit(unit: &str, binary: &Path, config: &Path, dir: &Path) -> Option<Output> {
    let local = dir.join("cpi-bpf.service");
    std::fs::write(
        &local,
        unit.replace("/usr/bin/cpi-bpf", binary.to_str().unwrap())
            .replace("/etc/cpi-bpf/agent.toml", config.to_str().unwrap()),
    )
    .unwrap();
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&local)
        .output()
    {
        Ok(o) => Some(o),
        Err(e) => {
            skip(format_args!("systemd-analyze not available ({e})"));
            None
        }
    }
}

/// `nm`-style address of `symbol` in an unstripped ELF file (its own address space).
pub fn symbol_address(elf: &Path, symbol: &str) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(elf).ok()?;
    let file = object::File::parse(&*data).ok()?;
    file.symbols()
        .find(|s| s.name() == Ok(symbol))
        .map(|s| s.address())
}

/// CPU time process `pid` has had (its live threads), in seconds, `None` once it is
/// gone: the scheduler's exact `sum_exec_runtime` of each thread
/// (`/proc/PID/task/TID/schedstat`, ns), else utime + stime from `/proc/PID/stat`
/// (tick-sampled, coarse under contention).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        let ns: Option<f64> = tasks
            .filter_map(Result::ok)
            .map(|t| {
                let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
                s.split_whitespace().next()?.parse::<f64>().ok()
            })
            .sum();
        if let Some(ns) = ns {
            return Some(ns / 1e9);
        }
    }
    let ticks = cpi_user::procmap::ProcStat::of(pid)?.cpu_ticks as f64;
    Some(ticks / cpi_agent::clock_ticks_per_second())
}

/// Runs a command to completion, asserting it succeeded (its stderr is the message).
pub fn output_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("running the command");
    assert!(
        out.status.success(),
        "{:?} failed ({}): {}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Held by every test whose expectations follow the CPU a target got (rates, CPU time):
/// two of them at once would share the CPUs and compete with the collector. One lock
/// for the whole test binary, so tests of different modules do not overlap either.
pub fn cpu_heavy() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A private copy of `tests/programs/busy.c` (`-O2 -g` plus `extra`) in a fresh temp
/// dir named after `tag`; `None` after printing why (gcc is missing).
pub fn busy(tag: &str, extra: &[&str]) -> Option<PathBuf> {
    compile_c("busy.c", &temp_dir(tag), "busy", extra)
}

/// The CPU time busy (`tests/programs/busy.c`) reports on stderr at exit as
/// `cpu_seconds=S`: its own, all threads.
pub fn busy_cpu(out: &Output) -> f64 {
    stderr(out)
        .lines()
        .find_map(|l| l.strip_prefix("cpu_seconds="))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("busy did not report its CPU time: {}", stderr(out)))
}

/// A command's stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A command's stdout parsed as JSON; fails showing both streams when it is not.
pub fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

/// cpi-bpf refused: a non-zero exit, exactly one line on stderr, `cpi-bpf: error: …`
/// containing `needle`, no panic or backtrace, and nothing on stdout.
pub fn assert_one_error_line(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(!out.status.success(), "succeeded: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("cpi-bpf: error: "), "{err}");
    assert!(lines[0].contains(needle), "{err} lacks {needle:?}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout when nothing was collected: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A child process killed and reaped when the guard drops, so a failing assertion does
/// not leave an agent or a load program running behind the test.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free a moment ago (for a server the test starts as another process).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A GET over plain HTTP/1.1: (status code, body).
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    Ok((code, body.unwrap_or_default()))
}

/// A kubelet's `/pods` answer listing these (uid, name, namespace, container id), each
/// with one container named `app`.
pub fn pod_list(pods: &[(&str, &str, &str, &str)]) -> String {
    let items: Vec<String> = pods
        .iter()
        .map(|(uid, name, ns, id)| {
            format!(
                r#"{{"metadata":{{"name":"{name}","namespace":"{ns}","uid":"{uid}"}},
                   "status":{{"containerStatuses":[{{"name":"app","containerID":"containerd://{id}"}}]}}}}"#
            )
        })
        .collect();
    format!(r#"{{"kind":"PodList","items":[{}]}}"#, items.join(","))
}

/// `cpi-bpf agent` cutting 1 s windows into `store`, without a metrics endpoint, with
/// `extra` flags; its stderr piped.
pub fn agent(store: &Path, extra: &[&str]) -> std::process::Child {
    Command::new(cpi_bpf())
        .args([
            "agent",
            "--interval",
            "1",
            "--metrics-addr",
            "off",
            "--store",
        ])
        .arg(store)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting cpi-bpf agent")
}

/// The store's windows as (start ms, end ms, profile), in time order (their file names
/// `w-<start ms>-<end ms>.json.gz`: cpi-agent/src/store.rs).
pub fn store_windows(store: &Path) -> Vec<(u64, u64, serde_json::Value)> {
    use std::io::Read;
    let mut out = Vec::new();
    for e in std::fs::read_dir(store).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((start, end)) = name
            .strip_prefix("w-")
            .and_then(|n| n.strip_suffix(".json.gz"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(s, e)| Some((s.parse::<u64>().ok()?, e.parse::<u64>().ok()?)))
        else {
            continue;
        };
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(e.path()).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        out.push((start, end, serde_json::from_str(&text).unwrap()));
    }
    out.sort_by_key(|w| w.0);
    out
}

/// Ends an agent started by [`agent`] with SIGTERM, checks it exits 0, and returns its
/// stderr.
pub fn stop_agent(a: &mut std::process::Child) -> String {
    use std::io::Read;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(a.id() as i32, libc::SIGTERM) };
    let mut log = String::new();
    if let Some(mut e) = a.stderr.take() {
        let _ = e.read_to_string(&mut log);
    }
    let status = a.wait().unwrap();
    assert!(status.success(), "agent exit {status}: {log}");
    log
}

/// `cpi-bpf agent ARGS` serving metrics on a free loopback port (returned), with its
/// store and its log (`agent.log`) in `dir`; killed on drop.
pub fn agent_with_metrics(dir: &Path, args: &[&str]) -> (KillOnDrop, std::net::SocketAddr) {
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = Command::new(cpi_bpf())
        .arg("agent")
        .args(args)
        .arg("--metrics-addr")
        .arg(metrics.to_string())
        .arg("--store")
        .arg(dir.join("store"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("agent.log")).unwrap())
        .spawn()
        .expect("starting cpi-bpf agent");
    (KillOnDrop(child), metrics)
}

/// The value of an unlabelled series in a `/metrics` body.
pub fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The value of a series with one label in a `/metrics` body.
pub fn labelled(body: &str, name: &str, label: &str, value: &str) -> Option<f64> {
    metric(body, &format!("{name}{{{label}=\"{value}\"}}"))
}

/// Resident anonymous memory of a process, bytes (`RssAnon`): the agent's own heap.
/// Not `VmRSS` ([`vm_rss`]), which also counts the page cache of the binaries it maps to
/// read their symbols and unwind tables, and the ring buffers' fixed pages.
pub fn rss(pid: u32) -> u64 {
    rss_anon(pid).unwrap_or_else(|| panic!("RssAnon of {pid}"))
}

/// [`rss`], `None` once the process has exited (a zombie has no `RssAnon`).
pub fn rss_anon(pid: u32) -> Option<u64> {
    status_bytes(pid, "RssAnon:")
}

/// A process's whole resident set, bytes (`VmRSS`): what `top`, `ps` and systemd show
/// an operator. `None` once it has exited.
pub fn vm_rss(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// A process's peak resident set, bytes (`VmHWM`). `None` once it has exited.
pub fn vm_hwm(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Whether our child has exited, without reaping it (`waitid` with `WNOWAIT`): until
/// someone waits for it, it is a zombie, its `/proc/PID` still there. With `block`,
/// waits for it to exit.
pub fn exited_unreaped(child: &std::process::Child, block: bool) -> bool {
    let flags = libc::WEXITED | libc::WNOWAIT | if block { 0 } else { libc::WNOHANG };
    // SAFETY: all zeroes is a valid siginfo_t.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waiting on our own child, into a local.
    let r = unsafe { libc::waitid(libc::P_PID, child.id(), &raw mut info, flags) };
    assert_eq!(r, 0, "waitid: {}", std::io::Error::last_os_error());
    // SAFETY: waitid filled in a SIGCHLD siginfo (si_pid 0: not exited yet).
    unsafe { info.si_pid() != 0 }
}

/// A child that has exited and is not reaped (a zombie); reaped when dropped.
pub struct Zombie(std::process::Child);

impl Zombie {
    /// Runs `true` and waits for its exit, leaving it unreaped.
    pub fn spawn() -> Zombie {
        let child = Command::new("true").spawn().expect("spawn true");
        assert!(exited_unreaped(&child, true));
        Zombie(child)
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Zombie {
    fn drop(&mut self) {
        let _ = self.0.wait();
    }
}

/// Waits (at most 30 s, a hang guard) until process `pid`'s leader has exited
/// (`pthread_exit`: a zombie leader) while its one worker runs.
pub fn wait_leader_exited(pid: u32) {
    use cpi_user::procmap::ProcStat;
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    while !ProcStat::of(pid).is_some_and(|s| s.state == 'Z' && s.threads == 2) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{:?}",
            ProcStat::of(pid)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
