//! A hostile host, round 3: root acting for a user must not act with root's rights on
//! what the user chose. A user's binary names the source files root reads
//! (`--annotate`), and a user may listen first on the loopback port the agent pushes
//! to: neither gets anything only root may have.

use std::io::{BufRead, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{cpi_bpf, labelled, output_ok, require_root, stderr, temp_dir, KillOnDrop};

/// The user who attacks: `nobody`.
const USER: u32 = 65534;

/// Lines of the root-only file the user's binary names as its source.
const SECRET: [&str; 6] = [
    "root-only line one: the database password is hunter2",
    "root-only line two: AKIAIOSFODNN7EXAMPLE",
    "root-only line three",
    "root-only line four",
    "root-only line five",
    "root-only line six",
];

/// `dir/prog`, built from C whose `hot_fn` the line table places on lines 1-6 of
/// `secret` (`#line`), owned by [`USER`]: what a user builds to make root print a file
/// it cannot read. `None` after saying why (no gcc).
fn program_naming(dir: &Path, secret: &Path) -> Option<std::path::PathBuf> {
    let src = dir.join("prog.c");
    std::fs::write(
        &src,
        format!(
            "#line 1 \"{}\"\n\
             __attribute__((noipa)) unsigned long hot_fn(unsigned long n) {{\n\
             unsigned long s = 0;\n\
             for (unsigned long i = 0; i < n; i++)\n\
             s += (i * i) ^ (s >> 3);\n\
             return s;\n\
             }}\n\
             #line 100 \"main.c\"\n\
             int main(void) {{ volatile unsigned long r; for (;;) r = hot_fn(1000000); }}\n",
            secret.display()
        ),
    )
    .unwrap();
    let exe = dir.join("prog");
    let built = Command::new("gcc")
        .args(["-O1", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        cpi_tests::skip(format_args!("gcc cannot build {}", src.display()));
        return None;
    }
    std::os::unix::fs::chown(&exe, Some(USER), Some(USER)).unwrap();
    Some(exe)
}

/// Row 1: a binary of uid 65534 whose DWARF says its hot code is lines 1-6 of a root-only
/// (0600) file. Root's `cpi-bpf -p PID --annotate hot_fn`, and root's `report
/// --annotate` of the profile it wrote and of the windows its agent kept with
/// `--source-lines`, show `file:line` and not one line of the file, and say once why; once the file is readable by all, the same report shows its lines
/// (so the test sees source text where there is some to see).
#[test]
fn a_users_binary_cannot_make_root_print_a_root_only_source() {
    if !require_root("profiling another user's process") {
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let dir = temp_dir("hostile-source");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.join("secret.c");
    std::fs::write(&secret, SECRET.join("\n") + "\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let Some(exe) = program_naming(&dir, &secret) else {
        return;
    };
    let prog = KillOnDrop(
        Command::new(&exe)
            .uid(USER)
            .gid(USER)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = prog.0.id().to_string();
    let root = |args: &[&str]| {
        output_ok(
            Command::new(cpi_bpf())
                .env_remove("SUDO_UID")
                .env_remove("SUDO_GID")
                .args(args),
        )
    };
    let one_shot = root(&["-p", &pid, "--duration", "2", "--annotate", "hot_fn"]);
    let json = dir.join("p.json");
    let json_arg = json.to_str().unwrap();
    root(&["-p", &pid, "--duration", "2", "--output", json_arg]);
    // The agent keeps file:line in its windows (`--source-lines`); root reads them.
    let store = dir.join("store");
    let mut agent = cpi_tests::agent(&store, &["--pid", &pid, "--source-lines"]);
    let t0 = Instant::now();
    while cpi_tests::store_windows(&store).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no windows in 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    cpi_tests::stop_agent(&mut agent);
    drop(prog);
    let refusal = format!(
        "cpi-bpf: warning: {}: not opened: uid 65534 cannot read it",
        secret.display()
    );
    let check = |what: &str, out: &std::process::Output| {
        let (text, err) = (String::from_utf8_lossy(&out.stdout), stderr(out));
        for line in SECRET {
            assert!(!text.contains(line), "{what}: {line:?} printed:\n{text}");
            assert!(!err.contains(line), "{what}: {line:?} said:\n{err}");
        }
        assert!(text.contains("hot_fn ["), "{what}: no annotation:\n{text}");
        assert!(text.contains("secret.c:"), "{what}: no file:line:\n{text}");
        let said = err.lines().filter(|l| l.starts_with(&refusal)).count();
        assert_eq!(said, 1, "{what}: the refusal said once:\n{err}");
    };
    check("one-shot", &one_shot);
    let report = || root(&["report", "--annotate", "hot_fn", json_arg]);
    check("report of root's profile", &report());
    let store_arg = store.to_str().unwrap();
    check(
        "report of the agent's store",
        &root(&["report", "--store", store_arg, "--annotate", "hot_fn"]),
    );
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let shown = report();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        SECRET.iter().any(|l| text.contains(l)),
        "a file anyone may read is shown:\n{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A loopback listener of [`USER`] on `port` that writes `CONNECTED` and every byte
/// it is sent to its stdout; started once it listens.
fn squatter(port: u16) -> KillOnDrop {
    let prog = "import socket, sys\n\
                s = socket.socket()\n\
                s.bind(('127.0.0.1', int(sys.argv[1])))\n\
                s.listen(16)\n\
                print('listening', flush=True)\n\
                while True:\n\
                \x20   c, _ = s.accept()\n\
                \x20   sys.stdout.write('CONNECTED\\n'); sys.stdout.flush()\n\
                \x20   c.settimeout(1)\n\
                \x20   try:\n\
                \x20       while True:\n\
                \x20           d = c.recv(65536)\n\
                \x20           if not d: break\n\
                \x20           sys.stdout.buffer.write(d); sys.stdout.flush()\n\
                \x20   except Exception: pass\n\
                \x20   c.close()\n";
    let mut child = KillOnDrop(
        // Debian's, by its path: a python3 found first on root's PATH (pyenv's shims
        // under /root) is not one uid 65534 may run.
        Command::new("/usr/bin/python3")
            .args(["-c", prog, &port.to_string()])
            .uid(USER)
            .gid(USER)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3"),
    );
    let mut said = String::new();
    let mut out = std::io::BufReader::new(child.0.stdout.take().unwrap());
    out.read_line(&mut said).unwrap();
    assert_eq!(said.trim(), "listening");
    child.0.stdout = Some(out.into_inner());
    child
}

/// The `cpi_bpf_push_total{result=...}` count the agent at `metrics` exports.
fn pushes(metrics: std::net::SocketAddr, result: &str) -> f64 {
    let (_, body) = cpi_tests::http_get(metrics, "/metrics").unwrap_or_default();
    labelled(&body, "cpi_bpf_push_total", "result", result).unwrap_or(0.0)
}

/// Root's agent pushing to `url` with `push` flags while uid 65534's [`squatter`]
/// listens on `port`, until `n` pushes did not deliver (refused, or timed out at the
/// user): the agent, the process it samples, its metrics address (its log is
/// `dir`/agent.log), and all the squatter was sent.
fn push_beside_a_squatter(
    dir: &Path,
    port: u16,
    push: &[&str],
    n: f64,
) -> (KillOnDrop, KillOnDrop, std::net::SocketAddr, String) {
    let mut squat = squatter(port);
    // Something to sample in every window, whatever else the host runs.
    let busy = KillOnDrop(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    );
    let busy_pid = busy.0.id().to_string();
    let mut args = vec!["--pid", &busy_pid, "--interval", "1", "--push-timeout", "1"];
    args.extend_from_slice(push);
    let (agent, metrics) = cpi_tests::agent_with_metrics(dir, &args);
    let t0 = Instant::now();
    while pushes(metrics, "refused") + pushes(metrics, "error") < n {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no push in 60 s: {}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = squat.0.kill();
    let _ = squat.0.wait();
    let mut got = String::new();
    let mut out = squat.0.stdout.take().unwrap();
    out.read_to_string(&mut got).unwrap();
    (agent, busy, metrics, got)
}

/// Row 2: uid 65534 listens first on the loopback port root's agent pushes to (OTLP,
/// a bearer token, a tenant). Over four windows it is sent nothing, not even a
/// connection; the refusals are counted and said once. Root's own listener on that port
/// then gets the windows with the token, so the refusal is the listener's owner's doing.
#[test]
fn a_user_listening_first_on_the_push_port_gets_nothing() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("hostile-push-port");
    let token = dir.join("token");
    std::fs::write(&token, "tok-very-secret\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = cpi_tests::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let (agent, busy, metrics, got) = push_beside_a_squatter(
        &dir,
        port,
        &[
            "--push-otlp",
            &url,
            "--push-token-file",
            token.to_str().unwrap(),
            "--push-tenant",
            "tenant-a",
        ],
        4.0,
    );
    assert!(
        !got.contains("CONNECTED") && !got.contains("tok-very-secret"),
        "the user's listener was sent: {got}"
    );
    assert_eq!(pushes(metrics, "ok"), 0.0);
    assert!(pushes(metrics, "refused") >= 4.0);
    // Root's listener on the same port: believed, and sent the windows and the token
    // (within the longest retry delay, 8 s, and a window).
    let root = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    root.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    let mut conn = loop {
        match root.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "root's listener got nothing"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = vec![0u8; 4096];
    let n = conn.read(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(
        head.starts_with("POST /v1development/profiles")
            && head.contains("Bearer tok-very-secret")
            && head.contains("tenant-a"),
        "{head}"
    );
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("push refused")).collect();
    assert_eq!(refusals.len(), 1, "said once: {log}");
    assert!(
        refusals[0].contains(&format!("port {port} is listened on by uid 65534")),
        "{log}"
    );
    assert!(!log.contains("tok-very-secret"), "{log}");
    drop(agent);
    drop(busy);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row 2, other spellings of loopback: `127.1` (inet_aton's, as the client resolves it)
/// names the port uid 65534 squats. No credentials are given, so before this was
/// "unproven" plain http and the user was sent every window and the tenant; now the
/// address is seen for what it is and nothing is sent.
#[test]
fn a_user_squatting_a_loopback_spelled_otherwise_gets_nothing() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("hostile-push-spelling");
    let port = cpi_tests::free_port();
    let url = format!("http://127.1:{port}");
    let (agent, busy, metrics, got) = push_beside_a_squatter(
        &dir,
        port,
        &["--push-pyroscope", &url, "--push-tenant", "tenant-b"],
        2.0,
    );
    assert!(
        !got.contains("CONNECTED"),
        "the user's listener was sent: {got}"
    );
    assert_eq!(pushes(metrics, "ok"), 0.0);
    assert!(pushes(metrics, "refused") >= 2.0);
    drop(agent);
    drop(busy);
    std::fs::remove_dir_all(&dir).unwrap();
}
