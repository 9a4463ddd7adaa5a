//! `cpi-bpf agent` for real (root, BPF; skips with its reason otherwise): windows land in
//! the store on the wall-clock interval, `report --store` merges them and names the hot
//! function of a two-function busy program with its share, SIGKILL while writing never
//! leaves an unreadable window, SIGTERM exits 0 after the last window, so does the exit
//! of its `--pid` (also one its parent leaves unreaped); and every bad input is one line
//! at start with a non-zero exit (no root needed).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{
    agent, compile_c, cpi_bpf, cpu_heavy, exited_unreaped, output_ok, require_root, temp_dir,
};
use serde_json::Value;

fn windows(store: &Path) -> usize {
    std::fs::read_dir(store)
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("w-"))
            })
            .count()
        })
        .unwrap_or(0)
}

/// Waits until `store` holds more than `n` windows or 60 s have passed since `t0`.
pub(crate) fn wait_for_windows(store: &Path, n: usize, t0: Instant) {
    while windows(store) <= n && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sigterm(child: &Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

#[test]
fn store_fills_per_interval_and_report_merges_the_hot_function() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("agent-store");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &["-lpthread"]) else {
        return;
    };
    let store = dir.join("store");
    let mut prog = Command::new(&busy)
        .arg("30")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // --pid keeps the test's analysis small on a machine busy with other work; the
    // system-wide path is the same Session and analysis.
    let pid = prog.id().to_string();
    let a = agent(&store, &["--pid", &pid]);
    // N + 1 seconds after the agent's first window boundary: at least N windows.
    let n = 5;
    let t0 = Instant::now();
    wait_for_windows(&store, 0, t0);
    assert!(windows(&store) > 0, "no window within 60 s");
    // The windows' names give their wall-clock spans (`w-<start ms>-<end ms>`): they
    // tile the time without gap or overlap, and each ends at an interval boundary. How
    // many there are in a given wall time is not checked: on a loaded machine a late
    // analysis makes the next window longer (a window waits for the one before it).
    wait_for_windows(&store, n as usize, t0);
    let mut spans: Vec<(u64, u64)> = std::fs::read_dir(&store)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            let (s, e) = name
                .strip_prefix("w-")?
                .strip_suffix(".json.gz")?
                .split_once('-')?;
            Some((s.parse().ok()?, e.parse().ok()?))
        })
        .collect();
    spans.sort_unstable();
    eprintln!("windows: {spans:?}");
    assert!(spans.len() as u64 > n, "{} windows in 60 s", spans.len());
    for w in spans.windows(2) {
        assert_eq!(w[0].1, w[1].0, "windows tile the time: {spans:?}");
    }
    // Boundaries are whole seconds (interval 1 s), cut when the collector wakes there
    // (late by a loaded scheduler's wake-up, well under a second).
    for &(_, end) in &spans {
        assert!(end % 1000 < 900, "a window ends at a boundary: {spans:?}");
    }
    sigterm(&a);
    let out = a.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "agent exit {}: {stderr}", out.status);
    assert!(
        stderr
            .lines()
            .next()
            .unwrap_or("")
            .starts_with("cpi-bpf: mode: "),
        "{stderr}"
    );
    let _ = prog.kill();
    let _ = prog.wait();

    let comm = "busy";
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--store"])
            .arg(&store)
            .args(["--since", "5m", "--comm", comm, "--format", "json"]),
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    let procs = p["processes"].as_array().unwrap();
    assert!(!procs.is_empty(), "no {comm} process in {p:#}");
    assert!(procs.iter().all(|x| x["comm"] == comm));
    let proc = &procs[0];
    let f = &proc["functions"][0];
    assert_eq!(f["name"], "hot_spin", "{proc:#}");
    // busy.c's known split: hot_spin runs 2 000 000 iterations per 20 000 of cold_spin
    // (a multiply-add against three shifts/xors): well above 90 % of its time.
    let share = f["share"].as_f64().unwrap();
    eprintln!("hot_spin share {share:.3} over {} samples", proc["samples"]);
    assert!(share > 0.9, "hot_spin share {share}");
    // The merge adds up: the process's samples are the sum over its functions and
    // unmapped ones, its shares sum to 1.
    let total: f64 = proc["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["share"].as_f64().unwrap())
        .sum();
    assert!((total - 1.0).abs() < 1e-6, "shares sum to {total}");
    // Every view renders from the store.
    for fmt in [
        &["--format", "table"][..],
        &["--format", "pprof", "--output"],
    ] {
        let mut cmd = Command::new(cpi_bpf());
        cmd.args(["report", "--store"]).arg(&store).args(fmt);
        if fmt.len() == 3 {
            cmd.arg(dir.join("p.pb.gz"));
        }
        output_ok(&mut cmd);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--pid` of a process that exits while its parent does not reap it (a zombie, whose
/// `/proc/PID` stays): the agent stops as for a reaped one, with its last window.
#[test]
fn agent_stops_when_its_pid_exits_unreaped() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("agent-zombie");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &["-lpthread"]) else {
        return;
    };
    let store = dir.join("store");
    let mut prog = Command::new(&busy)
        .arg("300")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = prog.id();
    let mut a = agent(&store, &["--pid", &pid.to_string()]);
    let t0 = Instant::now();
    wait_for_windows(&store, 0, t0);
    // busy ends on SIGTERM; nobody waits for it until the agent has stopped.
    sigterm(&prog);
    let t1 = Instant::now();
    // A hang guard, not a speed claim: an agent that missed the exit runs until killed.
    while a.try_wait().unwrap().is_none() && t1.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let zombie = exited_unreaped(&prog, false);
    let _ = a.kill();
    let out = a.wait_with_output().unwrap();
    let _ = prog.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("agent stopped {:?} after busy's SIGTERM", t1.elapsed());
    assert!(zombie, "busy had not exited: {stderr}");
    assert!(out.status.success(), "agent exit {}: {stderr}", out.status);
    assert!(stderr.contains("stopping (target exited)"), "{stderr}");
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--store"])
            .arg(&store)
            .args(["--format", "json"]),
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    let procs = p["processes"].as_array().unwrap();
    assert!(procs.iter().any(|x| x["pid"] == pid), "busy not in {p:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_while_writing_never_leaves_an_unreadable_window() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("agent-kill");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &["-lpthread"]) else {
        return;
    };
    let store = dir.join("store");
    let mut prog = Command::new(&busy)
        .arg("60")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = prog.id().to_string();
    let mut rng = 0x9e3779b97f4a7c15u64;
    for round in 0..8 {
        let mut a = agent(&store, &["--pid", &pid]);
        // Kill at varying points of the second (the write happens just after a
        // boundary).
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let ms = 1500 + rng % 2000;
        std::thread::sleep(Duration::from_millis(ms));
        a.kill().unwrap();
        a.wait().unwrap();
        eprintln!(
            "round {round}: killed after {ms} ms, {} windows",
            windows(&store)
        );
    }
    let _ = prog.kill();
    let _ = prog.wait();
    assert!(windows(&store) > 0, "no window written at all");
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--store"])
            .arg(&store)
            .args(["--format", "json"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("skipped"), "unreadable windows: {stderr}");
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(p["duration_secs"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `cpi-bpf agent ARGS` expecting a one-line error containing `want`, fast.
fn bad(args: &[&str], want: &str) {
    // Built first (the first call builds it): the guard below times the agent only.
    let bin = cpi_bpf();
    let t = Instant::now();
    let out = Command::new(bin)
        .arg("agent")
        .args(args)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.contains(want), "{args:?}: {stderr:?} lacks {want:?}");
    // A hang guard, not a speed claim (13 s was seen with both CPUs loaded): an agent
    // that got past its checks would collect until signalled and never return here.
    assert!(
        t.elapsed() < Duration::from_secs(120),
        "{args:?} took {:?}",
        t.elapsed()
    );
}

#[test]
fn bad_input_is_one_line_at_start() {
    let dir = temp_dir("agent-bad");
    let store = dir.join("s");
    let s = store.to_str().unwrap();
    bad(
        &["--store", "/proc/cpi-bpf", "--check-config"],
        "store /proc/cpi-bpf",
    );
    bad(
        &["--store", s, "--overhead-budget", "0"],
        "overhead-budget: must be",
    );
    bad(
        &["--store", s, "--overhead-budget", "101"],
        "overhead-budget: must be",
    );
    bad(
        &[
            "--store",
            s,
            "--push-pyroscope",
            "ftp://x",
            "--check-config",
        ],
        "--push-pyroscope",
    );
    bad(
        &[
            "--store",
            s,
            "--push-pyroscope",
            "https://u:hunter2@x",
            "--check-config",
        ],
        "--push-pyroscope \"https://u:***@x\": no password in the URL",
    );
    bad(
        &[
            "--store",
            s,
            "--push-pyroscope",
            "https://u@x",
            "--check-config",
        ],
        "push credentials: the URL names user \"u\": give its password with --push-password-file",
    );
    bad(
        &[
            "--store",
            s,
            "--store-group",
            "no-such-group-cpi",
            "--check-config",
        ],
        "store-group: no group named",
    );
    let conf = dir.join("a.toml");
    std::fs::write(&conf, "interval = 5\nno-such-key = 1\n").unwrap();
    bad(
        &["--config", conf.to_str().unwrap(), "--check-config"],
        "line 2: unknown field `no-such-key`",
    );
    // A port in use: hold it, then ask the agent to serve on it.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    bad(
        &["--store", s, "--metrics-addr", &addr, "--check-config"],
        "--metrics-addr",
    );
    if require_root("the port-in-use case of a starting agent") {
        bad(&["--store", s, "--metrics-addr", &addr], "--metrics-addr");
    }
    // And a good config checks out.
    std::fs::write(&conf, "interval = 5\nmetrics-addr = \"off\"\n").unwrap();
    output_ok(
        Command::new(cpi_bpf())
            .args(["agent", "--check-config", "--store", s, "--config"])
            .arg(&conf),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn systemd_unit_verifies() {
    let unit = cpi_tests::workspace_root().join("dist/cpi-bpf.service");
    let conf = cpi_tests::workspace_root().join("dist/agent.toml");
    let text = std::fs::read_to_string(&unit).unwrap();
    // The unit names the installed paths; verify it against this build's binary.
    let dir = temp_dir("agent-unit");
    // The example config checks out (its store and port replaced by free ones).
    output_ok(
        Command::new(cpi_bpf())
            .args([
                "agent",
                "--check-config",
                "--metrics-addr",
                "127.0.0.1:0",
                "--config",
            ])
            .arg(&conf)
            .arg("--store")
            .arg(dir.join("store")),
    );
    let Some(out) = cpi_tests::verify_unit(&text, cpi_bpf(), &conf, &dir) else {
        return;
    };
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM finishes the last window and gives the sinks up to
/// `cpi_agent::FLUSH_WITHIN` (5 s) to deliver; a second signal during that flush
/// ends the agent at once. The push receiver here accepts and never answers, so the
/// flush would wait its whole bound.
#[test]
fn second_signal_exits_at_once() {
    use std::os::unix::process::ExitStatusExt;
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("agent-2nd-signal");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &["-lpthread"]) else {
        return;
    };
    // Not beside the suite's other agent-heavy tests (nine agents at once in
    // agent_sinks): under that, this agent's start alone outlived busy's 30 s.
    let _serial = cpu_heavy();
    // Accepts connections and holds them open without a byte of answer.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().flatten() {
            held.push(s);
        }
    });
    let store = dir.join("store");
    // Long enough to outlive a slow agent start on a loaded machine; killed below.
    let mut prog = Command::new(&busy)
        .arg("300")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = prog.id().to_string();
    let mut a = agent(
        &store,
        &[
            "--pid",
            &pid,
            "--push-pyroscope",
            &url,
            "--push-timeout",
            "30",
        ],
    );
    let t0 = Instant::now();
    wait_for_windows(&store, 1, t0);
    if windows(&store) < 2 {
        let _ = a.kill();
        let out = a.wait_with_output().unwrap();
        panic!(
            "{} windows within 60 s; the agent said: {}",
            windows(&store),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    sigterm(&a);
    // Still flushing to the silent receiver 2 s later: the first signal does not kill.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        a.try_wait().unwrap().is_none(),
        "the agent should still be flushing after the first signal"
    );
    sigterm(&a);
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        // A hang guard: the exit is immediate, the flush bound is 5 s.
        assert!(
            t1.elapsed() < Duration::from_secs(20),
            "still running after the second signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = prog.kill();
    let _ = prog.wait();
    eprintln!(
        "exit after the second signal in {:?}: {status:?}",
        t1.elapsed()
    );
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    // What was written stays readable.
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--format", "json", "--store"])
            .arg(&store),
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(p["processes"].as_array().is_some_and(|a| !a.is_empty()));
}

/// The agent takes call stacks as the one-shot command does: qsort in
/// Debian's libc (no frame pointers) calling back into a program built without them.
/// The stored windows, merged by `report --store --format folded`, have at least 90 % of
/// the program's samples under `main;sort_all;…qsort…;…;by_value`, and the windows
/// pushed to the local Pyroscope receiver (tests/src/pyroscope.rs: the Push API contract)
/// carry the same multi-frame chains.
#[test]
fn agent_stacks_reach_the_store_and_pyroscope() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("agent-stacks");
    let Some(exe) = compile_c("stacks.c", &dir, "stacks", &[]) else {
        return;
    };
    let _serial = cpu_heavy();
    let rx = cpi_tests::pyroscope::Receiver::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let store = dir.join("store");
    // Runs until killed below (about 1 s per 10 000 rounds here).
    let mut prog = Command::new(&exe)
        .args(["qsort", "100000000"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = prog.id().to_string();
    let a = agent(&store, &["--pid", &pid, "--push-pyroscope", &rx.url()]);
    let t0 = Instant::now();
    while windows(&store) < 3 && t0.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(100));
    }
    sigterm(&a);
    let out = a.wait_with_output().unwrap();
    let _ = prog.kill();
    let _ = prog.wait();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(windows(&store) >= 3, "{} windows: {said}", windows(&store));
    let folded = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--format", "folded", "--store"])
            .arg(&store),
    );
    let folded = String::from_utf8(folded.stdout).unwrap();
    let (mut total, mut through) = (0u64, 0u64);
    for line in folded.lines().filter(|l| l.starts_with("stacks;")) {
        let (path, n) = line.rsplit_once(' ').expect("`path count`");
        let n: u64 = n.parse().expect("a count");
        total += n;
        // From main on (what runs before main differs between libc builds).
        let from_main: Vec<&str> = path.split(';').skip_while(|f| *f != "main").collect();
        if from_main.get(1) == Some(&"sort_all")
            && from_main.get(2).is_some_and(|f| f.contains("qsort"))
            && from_main.contains(&"by_value")
        {
            through += n;
        }
    }
    eprintln!("agent stacks: {through} of {total} samples under main;sort_all;qsort;…;by_value");
    assert!(total >= 100, "{total} samples of stacks:\n{folded}");
    assert!(
        through as f64 >= 0.9 * total as f64,
        "{through} of {total} under main;sort_all;qsort;…;by_value:\n{folded}"
    );
    // Pushed: the receiver checked every push against the contract, and the chains are
    // there, leaf first in pprof.
    assert!(rx.violations().is_empty(), "{:?}", rx.violations());
    let pushes = rx.accepted();
    let chain = pushes
        .iter()
        .flat_map(|p| &p.series)
        .filter(|s| s.service == "stacks")
        .find_map(|s| {
            let prof = &s.profile;
            let name = |id: &u64| {
                let l = prof.location.iter().find(|l| l.id == *id)?;
                let function_id = l.line.first()?.function_id;
                let f = prof.function.iter().find(|f| f.id == function_id)?;
                Some(prof.string_table[f.name as usize].clone())
            };
            prof.sample.iter().find_map(|smp| {
                let names: Vec<String> = smp.location_id.iter().filter_map(name).collect();
                (names.iter().any(|n| n == "by_value")
                    && names.iter().any(|n| n == "sort_all")
                    && names.iter().any(|n| n == "main"))
                .then_some(names)
            })
        });
    assert!(
        chain.is_some(),
        "no pushed sample of stacks has by_value ← … ← sort_all ← … ← main ({} pushes)",
        pushes.len()
    );
    rx.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Source lines cost the agent CPU on hosts running binaries with debug information
/// (BENCHMARKS.md, "Agent CPU: source lines"), so its windows carry them only with
/// `--source-lines`: two agents on one `-g` program, one with the flag, one without.
#[test]
fn agent_source_lines_only_when_asked() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("agent-lines");
    let exe =
        cpi_tests::programs::compile("twofunc.c", &["-O2", "-g"]).expect("gcc (cargo xtask setup)");
    let _serial = cpu_heavy();
    // Runs until killed below.
    let mut prog = Command::new(&exe)
        .arg("600")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = prog.id().to_string();
    let (with, without) = (dir.join("with"), dir.join("without"));
    let agents = [
        agent(&with, &["--pid", &pid, "--no-stacks", "--source-lines"]),
        agent(&without, &["--pid", &pid, "--no-stacks"]),
    ];
    let t0 = Instant::now();
    while (windows(&with) < 2 || windows(&without) < 2) && t0.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let counts = (windows(&with), windows(&without));
    for a in &agents {
        sigterm(a);
    }
    for a in agents {
        let out = a.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "windows {counts:?}: {said}");
    }
    let _ = prog.kill();
    let _ = prog.wait();
    assert!(
        counts.0 >= 2 && counts.1 >= 2,
        "windows {counts:?} within 90 s"
    );
    // The merged store's alpha_work: its source line, or none.
    let alpha_source = |store: &Path| -> Value {
        let out = output_ok(
            Command::new(cpi_bpf())
                .args(["report", "--format", "json", "--store"])
                .arg(store),
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let f = v["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["functions"].as_array().into_iter().flatten())
            .find(|f| f["name"] == "alpha_work")
            .unwrap_or_else(|| panic!("no alpha_work in {}", store.display()))
            .clone();
        f["source"].clone()
    };
    let src = alpha_source(&with);
    assert!(
        src["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("twofunc.c")),
        "with --source-lines: alpha_work's source is {src}"
    );
    let src = alpha_source(&without);
    assert!(
        src.is_null(),
        "without --source-lines: alpha_work's source is {src}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
