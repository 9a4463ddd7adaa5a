//! Collection for real: the eBPF programs load and attach on `cpu-clock` (these machines
//! have no PMU), samples come home attributed to the right pid and hot function, the run
//! stops cleanly on duration, command exit and SIGINT, and bad input gets one clear line.
//! Root only (BPF); each test prints why it skips otherwise.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use cpi_tests::{compile_c, cpi_bpf, cpu_seconds, output_ok, require_root, symbol_address};
use serde_json::Value;

/// Samples per CPU second the run asked for: 1 / mean period of its cpu-clock event
/// (base period + half the largest re-draw; `--frequency 999` by default).
fn rate(profile: &Value) -> f64 {
    let e = &profile["events"][0];
    assert_eq!(e["unit"], "ns", "{e:#}");
    let mean = e["period"].as_f64().unwrap() + e["jitter"].as_f64().unwrap() / 2.0;
    1e9 / mean
}

fn busy(extra: &[&str]) -> Option<PathBuf> {
    compile_c("busy.c", extra)
}

fn json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {stdout:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn process(profile: &Value, pid: u32) -> &Value {
    profile["processes"]
        .as_array()
        .expect("processes[]")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {profile:#}"))
}

fn samples(p: &Value) -> f64 {
    p["samples"].as_u64().expect("samples") as f64
}

/// The hottest function of `p`, checked to be in `binary`.
fn hottest<'a>(p: &'a Value, binary: &Path) -> &'a Value {
    let f = &p["functions"][0];
    assert_eq!(
        f["binary"].as_str(),
        Some(binary.to_str().unwrap()),
        "hottest function {f:#} is not in {}",
        binary.display()
    );
    f
}

fn assert_within(got: f64, expected: f64, what: &str) {
    eprintln!("{what}: {got} samples, expected ≈ {expected:.0}");
    assert!(
        (got - expected).abs() <= 0.25 * expected,
        "{what}: {got} samples is not within ±25 % of {expected:.0}"
    );
}

/// Mode line first: the reason is printed before anything else.
fn assert_mode_first(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or("");
    assert!(
        first.starts_with("cpi-bpf: mode: "),
        "first line is not the mode: {stderr}"
    );
}

fn start_busy(exe: &Path, seconds: &str) -> Child {
    let child = Command::new(exe)
        .arg(seconds)
        .stderr(Stdio::null())
        .spawn()
        .expect("start busy");
    std::thread::sleep(Duration::from_millis(200));
    child
}

/// Rate checks run one at a time: parallel busy programs would share the 2 CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs cpi-bpf with `args`, calling `on_line(line, cpi_bpf_pid)` for each line of its
/// stderr as it comes.
fn run_watching(args: &[&OsStr], mut on_line: impl FnMut(&str, u32)) -> Output {
    use std::io::{BufRead, BufReader, Read};
    let mut child = Command::new(cpi_bpf())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        stdout.read_to_end(&mut v).unwrap();
        v
    });
    let mut err = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        on_line(&line, child.id());
        err.extend_from_slice(line.as_bytes());
        err.push(b'\n');
    }
    let status = child.wait().unwrap();
    Output {
        status,
        stdout: reader.join().unwrap(),
        stderr: err,
    }
}

/// Runs cpi-bpf with `args` on the running process `pid`; returns its output and the
/// CPU seconds `pid` got between the mode line (events about to be enabled) and the stop
/// line (events disabled): what a time profile's samples should add up to.
fn run_on_pid(pid: u32, args: &[&str]) -> (Output, f64) {
    let (mut cpu0, mut cpu1) = (None, None);
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let out = run_watching(&args, |line, _| {
        if line.starts_with("cpi-bpf: mode:") {
            cpu0 = cpu_seconds(pid);
        } else if line.starts_with("cpi-bpf: stopped") {
            cpu1 = cpu_seconds(pid);
        }
    });
    let cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => b - a,
        _ => panic!(
            "no mode/stop lines: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    (out, cpu)
}

/// `--pid` on a busy child for 2 s: samples ≈ rate × the CPU time the child got while
/// collection ran (= rate × duration on an idle machine), hot function by name.
fn pid_run(exe: &Path, expect_function: impl Fn(&Value)) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = start_busy(exe, "20");
    let pid = child.id();
    let (out, cpu) = run_on_pid(
        pid,
        &[
            "--pid",
            &pid.to_string(),
            "--duration",
            "2",
            "--format",
            "json",
        ],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_mode_first(&out);
    let profile = json(&out);
    assert_eq!(profile["mode"], "time-profile");
    let duration = profile["duration_secs"].as_f64().unwrap();
    assert!((1.9..3.0).contains(&duration), "duration {duration}");
    let p = process(&profile, pid);
    assert_within(
        samples(p),
        rate(&profile) * cpu,
        &format!("--pid {pid}, {duration:.2} s, child CPU {cpu:.2} s"),
    );
    expect_function(hottest(p, exe));
    assert_eq!(profile["lost_samples"], 0);
}

#[test]
fn pid_samples_follow_rate_and_hot_function() {
    if !require_root("cpi-bpf --pid") {
        return;
    }
    let Some(exe) = busy(&[]) else { return };
    pid_run(&exe, |f| assert_eq!(f["name"], "hot_spin", "{f:#}"));
}

#[test]
fn pid_on_a_stripped_binary_finds_the_hot_function_from_eh_frame() {
    if !require_root("cpi-bpf --pid") {
        return;
    }
    let Some(exe) = busy(&[]) else {
        return;
    };
    let hot = symbol_address(&exe, "hot_spin").expect("hot_spin in the unstripped build");
    let Some(exe) = cpi_tests::programs::stripped(&exe) else {
        return;
    };
    assert_eq!(
        symbol_address(&exe, "hot_spin"),
        None,
        "strip left the symbol"
    );
    pid_run(&exe, |f| {
        assert_eq!(
            f["address"].as_u64(),
            Some(hot),
            "hot function {f:#} is not hot_spin"
        );
    });
}

#[test]
fn pid_exiting_mid_run_is_reported_with_its_functions() {
    if !require_root("cpi-bpf --pid") {
        return;
    }
    let Some(exe) = busy(&[]) else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = start_busy(&exe, "4");
    let pid = child.id();
    let out = Command::new(cpi_bpf())
        .args([
            "--pid",
            &pid.to_string(),
            "--duration",
            "30",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stopped (target exited)"), "{stderr}");
    let profile = json(&out);
    assert!(profile["duration_secs"].as_f64().unwrap() < 10.0);
    let p = process(&profile, pid);
    assert!(samples(p) > 0.0, "{p:#}");
    // Maps read while it ran resolve samples after it is gone.
    assert_eq!(hottest(p, &exe)["name"], "hot_spin");
    assert_eq!(p["comm"], "busy");
}

#[test]
fn system_wide_sees_the_busy_process() {
    if !require_root("cpi-bpf --system-wide") {
        return;
    }
    let Some(exe) = busy(&[]) else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = start_busy(&exe, "20");
    let pid = child.id();
    let (out, cpu) = run_on_pid(
        pid,
        &["--system-wide", "--duration", "1", "--format", "json"],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = json(&out);
    let p = process(&profile, pid);
    assert_within(
        samples(p),
        rate(&profile) * cpu,
        &format!("--system-wide, busy pid {pid}, CPU {cpu:.2} s"),
    );
    assert_eq!(hottest(p, &exe)["name"], "hot_spin");
}

/// Runs cpi-bpf on `busy SECONDS` as a command.
fn command_run(exe: &Path, seconds: &str) -> Output {
    Command::new(cpi_bpf())
        .args(["--format", "json", "--"])
        .arg(exe)
        .arg(seconds)
        .output()
        .unwrap()
}

/// busy prints `cpu_seconds=S` (its own CPU time) on stderr at exit.
fn busy_cpu(out: &Output) -> f64 {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("cpu_seconds="))
        .and_then(|s| s.parse().ok())
        .expect("busy reported its CPU time")
}

#[test]
fn command_samples_follow_rate_and_hot_function() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let Some(exe) = busy(&[]) else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = command_run(&exe, "2");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_mode_first(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("command exited with status 0"), "{stderr}");
    let profile = json(&out);
    assert_eq!(profile["command"][0], exe.to_str().unwrap());
    let procs = profile["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "only the command was sampled: {profile:#}");
    let p = &procs[0];
    assert_eq!(p["comm"], "busy");
    // Events are enabled at exec, so the samples cover the command's whole CPU time.
    assert_within(samples(p), rate(&profile) * busy_cpu(&out), "-- busy 2");
    let hot = hottest(p, &exe);
    assert_eq!(hot["name"], "hot_spin");
    // Time profiles keep samples per instruction (annotate): every sample of the
    // function lands on one of its decoded instructions.
    let lines = hot["lines"].as_array().expect("lines for annotate");
    let on_lines: u64 = lines.iter().map(|l| l["samples"].as_u64().unwrap()).sum();
    assert!(
        !lines.is_empty()
            && lines
                .iter()
                .all(|l| !l["text"].as_str().unwrap().is_empty())
    );
    assert_eq!(on_lines, hot["samples"].as_u64().unwrap(), "{hot:#}");
}

#[test]
fn command_threads_are_followed() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let Some(exe) = busy(&["-pthread"]) else {
        return;
    };
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["--format", "json", "--"])
            .arg(&exe)
            .args(["1", "2"]),
    );
    let profile = json(&out);
    let p = &profile["processes"][0];
    // Both threads' CPU time (threads created after exec inherit the event).
    assert_within(
        samples(p),
        rate(&profile) * busy_cpu(&out),
        "-- busy 1 2 (two threads)",
    );
}

#[test]
fn sigint_mid_run_still_reports_everything() {
    if !require_root("cpi-bpf SIGINT") {
        return;
    }
    let Some(exe) = busy(&[]) else {
        return;
    };
    // SIGINT one second after collection started (the mode line), from another thread.
    let args = [
        OsStr::new("--format"),
        OsStr::new("json"),
        OsStr::new("--"),
        exe.as_os_str(),
        OsStr::new("30"),
    ];
    let out = run_watching(&args, |line, pid| {
        if line.starts_with("cpi-bpf: mode:") {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(1));
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid as i32, libc::SIGINT) };
            });
        }
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SIGINT received"), "{stderr}");
    let profile = json(&out);
    let p = &profile["processes"][0];
    let duration = profile["duration_secs"].as_f64().unwrap();
    assert!(
        duration < 10.0,
        "stopped at SIGINT, not at exit: {duration}"
    );
    // cpi-bpf ends the command with SIGTERM after disabling the events; busy then
    // prints the CPU time it had, a few ms more than was sampled.
    assert_within(
        samples(p),
        rate(&profile) * busy_cpu(&out),
        "SIGINT after 1 s",
    );
    assert_eq!(hottest(p, &exe)["name"], "hot_spin");
}

/// One line on stderr, `cpi-bpf: error: …`, non-zero exit, no panic or backtrace.
fn assert_one_clear_line(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr}");
    assert!(lines[0].starts_with("cpi-bpf: error: "), "{stderr}");
    assert!(lines[0].contains(needle), "{stderr} lacks {needle:?}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"));
    assert!(
        out.stdout.is_empty(),
        "no report when nothing was collected"
    );
}

#[test]
fn bad_input_gets_one_clear_line() {
    let bin = cpi_bpf();
    let run = |args: &[&str]| Command::new(bin).args(args).output().unwrap();
    assert_one_clear_line(&run(&[]), "nothing to profile");
    assert_one_clear_line(&run(&["--duration=0", "--system-wide"]), "--duration");
    if !require_root("the pid / command / privilege errors") {
        return;
    }
    // pid_max is at most 2^22: this pid cannot exist.
    assert_one_clear_line(
        &run(&["--pid", "4194305", "--duration", "1"]),
        "no process with pid 4194305",
    );
    assert_one_clear_line(
        &run(&["--", "no-such-command-cpi-bpf"]),
        "command not found: no-such-command-cpi-bpf",
    );
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin)
        .args(["--pid", "1", "--duration", "1"])
        .output();
    match nobody {
        Ok(out) => assert_one_clear_line(&out, "not root"),
        Err(e) => eprintln!("skipped: the not-root case needs setpriv ({e})"),
    }
}

#[test]
fn doctor_prints_every_probe_and_the_mode() {
    if !require_root("cpi-bpf doctor") {
        return;
    }
    let out = Command::new(cpi_bpf()).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for probe in [
        "kernel",
        "privileges",
        "perf_event_paranoid",
        "PMU devices",
        "core PMU",
        "branch records",
        "BTF",
        "BPF load",
        "branch-stack event",
        "cycles event",
        "cpu-clock event",
        "mode",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(probe)),
            "no {probe} line in:\n{text}"
        );
    }
    assert!(out.status.success(), "{text}");
    assert!(text.contains("cpu-clock opens, BPF attaches"), "{text}");
    // The ladder's rung matches the hardware: no core PMU → time profile.
    if !Path::new("/sys/bus/event_source/devices/cpu").exists() {
        assert!(
            text.contains("mode                   time-profile — no PMU"),
            "{text}"
        );
    }
}

#[test]
fn a_command_that_execs_is_named_after_what_it_became() {
    if !require_root("cpi-bpf -- sh -c 'exec busy'") {
        return;
    }
    let Some(exe) = busy(&[]) else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The shell spins first, so it is sampled as "sh"; exec then replaces its image
    // and name.
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["--format", "json", "--", "sh", "-c"])
            .arg(format!(
                "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; exec {} 1",
                exe.display()
            )),
    );
    let profile = json(&out);
    let p = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|p| p["samples"].as_u64().unwrap())
        .expect("a process");
    assert_eq!(p["comm"], "busy", "{p:#}");
    assert_eq!(hottest(p, &exe)["name"], "hot_spin");
}

/// Runs `cmd` to its end on a helper thread; `None` when it is still running after
/// `limit` (then it is killed). Output pipes close only when every process holding them
/// has exited, so a child left behind holding them shows up as a time-out.
fn output_within(mut cmd: Command, limit: Duration) -> Option<Output> {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => Some(out.unwrap()),
        Err(_) => {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            None
        }
    }
}

#[test]
fn out_of_range_numbers_get_one_clear_line() {
    let bin = cpi_bpf();
    let run = |args: &[&str]| Command::new(bin).args(args).output().unwrap();
    assert_one_clear_line(&run(&["--period", "0", "--system-wide"]), "--period");
    assert_one_clear_line(
        &run(&["--period", "18446744073709551615", "--system-wide"]),
        "--period",
    );
    assert_one_clear_line(
        &run(&["--frequency", "10000000", "--system-wide"]),
        "--frequency",
    );
    assert_one_clear_line(&run(&["--duration=1e20", "--system-wide"]), "--duration");
    assert_one_clear_line(
        &run(&["--frequency", "100", "--period", "1000003", "--system-wide"]),
        "cannot be used with",
    );
    if !require_root("the not-executable and open-files cases") {
        return;
    }
    assert_one_clear_line(&run(&["--", "/etc/passwd"]), "not executable: /etc/passwd");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 16 && exec {} --system-wide --duration 1",
            bin.display()
        ))
        .output()
        .unwrap();
    assert_one_clear_line(&out, "too few file descriptors");
}

/// The repro: the period was accepted, the event failed to open after the fork,
/// and the forked child blocked forever holding the output pipe. Now it is refused
/// before anything starts, and a child is killed and reaped on any failure after the
/// fork (`Suspended`'s drop, unit-tested in collect/target.rs).
#[test]
fn a_failed_start_leaves_no_child_holding_the_pipe() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let Some(exe) = busy(&[]) else {
        return;
    };
    let mut cmd = Command::new(cpi_bpf());
    cmd.arg("--period=9223372036854775807")
        .arg("--")
        .arg(&exe)
        .arg("0.5");
    let out = output_within(cmd, Duration::from_secs(20)).expect("cpi-bpf returned");
    assert!(!out.status.success());
}

/// `--pid P --pid P --pid <a thread of P>` profiles P once: its sampled CPU time is what
/// it used, not three times that.
#[test]
fn repeated_and_thread_pids_are_profiled_once() {
    if !require_root("cpi-bpf --pid") {
        return;
    }
    let Some(exe) = busy(&[]) else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = Command::new(&exe)
        .args(["20", "2"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(300));
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&t| t != pid)
        .expect("busy runs worker threads");
    let (out, cpu) = run_on_pid(
        pid,
        &[
            "--pid",
            &pid.to_string(),
            "--pid",
            &pid.to_string(),
            "--pid",
            &tid.to_string(),
            "--duration",
            "2",
            "--format",
            "json",
        ],
    );
    let _ = child.kill();
    let _ = child.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {tid} is a thread of process {pid}")),
        "{stderr}"
    );
    let profile = json(&out);
    let entries = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == pid)
        .count();
    assert_eq!(entries, 1);
    let sampled = process(&profile, pid)["time_ns"].as_f64().unwrap() / 1e9;
    eprintln!("sampled {sampled:.3} s of CPU, process used {cpu:.3} s while cpi-bpf ran");
    // `cpu` brackets the sampling window (it is read at the mode and stop lines), so the
    // sampled time is at most that, and far from three times it.
    assert!(
        sampled <= 1.1 * cpu,
        "counted more than once: {sampled} > {cpu}"
    );
    assert!(sampled >= 0.5 * cpu, "{sampled} vs {cpu}");
}

/// After SIGINT, a command that ignores SIGTERM is killed after a bound, and said so.
#[test]
fn a_command_ignoring_sigterm_is_killed_after_a_bound() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let args = [
        OsStr::new("--format"),
        OsStr::new("json"),
        OsStr::new("--"),
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new("trap '' INT TERM; while :; do :; done"),
    ];
    // The bound is timed from the SIGINT to the line saying the command was killed, not
    // over the whole run: start-up and analysis take what a loaded machine gives them.
    let sent = std::sync::Arc::new(std::sync::Mutex::new(None));
    let mut killed_after = None;
    let out = run_watching(&args, |line, pid| {
        if line.starts_with("cpi-bpf: mode:") {
            let sent = sent.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                *sent.lock().unwrap() = Some(std::time::Instant::now());
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid as i32, libc::SIGINT) };
            });
        } else if line.contains("did not exit within 2 s of SIGTERM") {
            killed_after = sent.lock().unwrap().map(|t| t.elapsed());
        }
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let killed_after =
        killed_after.unwrap_or_else(|| panic!("no kill line after SIGINT: {stderr}"));
    assert!(
        killed_after < Duration::from_secs(15),
        "killed {killed_after:?} after SIGINT"
    );
    assert_eq!(json(&out)["processes"][0]["comm"], "sh");
}

/// Every rate from 10 Hz to 10 kHz, with every perturbation: the records match the
/// rate per CPU-second the command really had (its own figure, so a loaded machine does
/// not matter), and the sampled time matches that CPU time. Re-drawing on a timer
/// shorter than the period used to restart the count before it ever overflowed (0
/// samples at 10 Hz).
#[test]
fn every_rate_and_perturbation_samples_what_the_target_ran() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let Some(exe) = busy(&[]) else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for perturbation in ["none", "user", "kernel", "both"] {
        for (hz, seconds) in [(10, "3"), (100, "1"), (1000, "1"), (10000, "1")] {
            let out = Command::new(cpi_bpf())
                .args(["--format", "json", "--perturbation", perturbation])
                .args(["--frequency", &hz.to_string(), "--"])
                .arg(&exe)
                .arg(seconds)
                .output()
                .unwrap();
            let what = format!("{perturbation} at {hz} Hz");
            assert!(
                out.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let profile = json(&out);
            let cpu = busy_cpu(&out);
            let e = &profile["events"][0];
            let period = e["period"].as_f64().unwrap();
            let thin = e["thinning"].as_f64().unwrap();
            let overflows = cpu * rate(&profile);
            let expected = overflows / thin;
            let p = &profile["processes"][0];
            let got = samples(p);
            let sampled = p["time_ns"].as_f64().unwrap() / 1e9;
            eprintln!(
                "{what}: {got} records, expected ≈ {expected:.1}; sampled {sampled:.3} s of \
                 {cpu:.3} s CPU"
            );
            // Without thinning the count is deterministic but for the period cut at
            // each end and at each re-draw; thinning keeps one record per K overflows
            // at random, so its count varies like a binomial's.
            let slack = if thin > 1.0 {
                4.0 * expected.sqrt() + 1.0
            } else {
                1.5
            };
            assert!(
                (got - expected).abs() <= 0.04 * expected + slack,
                "{what}: {got} records, expected ≈ {expected:.1}"
            );
            // Thinned records carry the periods they stand for; what follows the last
            // one (K overflows on average) is not carried.
            let tail = period / 1e9 * if thin > 1.0 { 10.0 * thin } else { 1.5 };
            assert!(
                (sampled - cpu).abs() <= 0.04 * cpu + tail,
                "{what}: sampled {sampled:.3} s of {cpu:.3} s CPU"
            );
        }
    }
}
