//! Collection for real: the eBPF programs load and attach on `cpu-clock` (these machines
//! have no PMU), samples come home attributed to the right pid and hot function, the run
//! stops cleanly on duration, command exit and SIGINT, and bad input gets one clear line;
//! a process whose main thread exited before its worker is profiled through the worker.
//! Root only (BPF); each test prints why it skips otherwise.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use cpi_tests::{
    agent, assert_one_error_line, busy, busy_cpu, compile_c, cpi_bpf, cpu_heavy, cpu_seconds,
    exited_unreaped, output_ok, require_root, stdout_json, stop_agent, store_windows,
    symbol_address, temp_dir, KillOnDrop, Zombie,
};
use serde_json::Value;

/// Samples per CPU second the run asked for: 1 / mean period of its cpu-clock event
/// (base period + half the largest re-draw; `--frequency 999` by default).
fn rate(profile: &Value) -> f64 {
    let e = &profile["events"][0];
    assert_eq!(e["unit"], "ns", "{e:#}");
    let mean = e["period"].as_f64().unwrap() + e["jitter"].as_f64().unwrap() / 2.0;
    1e9 / mean
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
    let _serial = cpu_heavy();
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
    let profile = stdout_json(&out);
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
    let Some(exe) = busy("pid", &[]) else { return };
    pid_run(&exe, |f| assert_eq!(f["name"], "hot_spin", "{f:#}"));
}

#[test]
fn pid_on_a_stripped_binary_finds_the_hot_function_from_eh_frame() {
    if !require_root("cpi-bpf --pid") {
        return;
    }
    let Some(exe) = busy("stripped", &[]) else {
        return;
    };
    let hot = symbol_address(&exe, "hot_spin").expect("hot_spin in the unstripped build");
    let st = Command::new("strip").arg(&exe).status().expect("strip");
    assert!(st.success());
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
    let Some(exe) = busy("exit", &[]) else { return };
    let _serial = cpu_heavy();
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
    // Not reaped until now: the pid stopped the run as a zombie (its pidfd is readable
    // at exit; /proc/PID stays until the wait).
    let zombie = exited_unreaped(&child, false);
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(zombie, "busy had not exited when cpi-bpf stopped: {stderr}");
    assert!(stderr.contains("stopped (target exited)"), "{stderr}");
    let profile = stdout_json(&out);
    assert!(profile["duration_secs"].as_f64().unwrap() < 10.0);
    let p = process(&profile, pid);
    assert!(samples(p) > 0.0, "{p:#}");
    // Maps read while it ran resolve samples after it is gone.
    assert_eq!(hottest(p, &exe)["name"], "hot_spin");
    assert_eq!(p["comm"], "busy");
}

/// `--system-wide` sees a process started after it: samples ≈ rate × the CPU time
/// busy reports of itself at exit (it runs wholly inside the collection), within four
/// Poisson errors; its hot function by name.
#[test]
fn system_wide_sees_the_busy_process() {
    if !require_root("cpi-bpf --system-wide") {
        return;
    }
    let Some(exe) = busy("system", &[]) else {
        return;
    };
    let _serial = cpu_heavy();
    let mut child = None;
    let args: Vec<&OsStr> = ["--system-wide", "--duration", "4", "--format", "json"]
        .iter()
        .map(OsStr::new)
        .collect();
    let out = run_watching(&args, |line, _| {
        if line.starts_with("cpi-bpf: mode:") {
            // The events are open once the mode is said; the programs a moment later.
            std::thread::sleep(Duration::from_millis(300));
            let busy = Command::new(&exe).arg("1").stderr(Stdio::piped()).spawn();
            child = Some(busy.expect("start busy"));
        }
    });
    let child = child.expect("no mode line");
    let pid = child.id();
    let busy = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = stdout_json(&out);
    let p = process(&profile, pid);
    let (got, want) = (samples(p), rate(&profile) * busy_cpu(&busy));
    eprintln!("--system-wide: busy {got} samples, expected ≈ {want:.0}");
    assert!(
        (got - want).abs() <= 4.0 * want.sqrt() + 2.0,
        "--system-wide: busy {got} samples, not within four Poisson errors of {want:.0}"
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

#[test]
fn command_samples_follow_rate_and_hot_function() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let Some(exe) = busy("cmd", &[]) else { return };
    let _serial = cpu_heavy();
    let out = command_run(&exe, "2");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_mode_first(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("command exited with status 0"), "{stderr}");
    let profile = stdout_json(&out);
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
    let Some(exe) = busy("threads", &["-pthread"]) else {
        return;
    };
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["--format", "json", "--"])
            .arg(&exe)
            .args(["1", "2"]),
    );
    let profile = stdout_json(&out);
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
    let Some(exe) = busy("sigint", &[]) else {
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
    // A shell's status for Ctrl-C, in every mode (as with -a and -p).
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SIGINT received"), "{stderr}");
    let profile = stdout_json(&out);
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

#[test]
fn bad_input_gets_one_clear_line() {
    let bin = cpi_bpf();
    let run = |args: &[&str]| Command::new(bin).args(args).output().unwrap();
    assert_one_error_line(&run(&[]), "nothing to profile");
    assert_one_error_line(&run(&["--duration=0", "--system-wide"]), "--duration");
    if !require_root("the pid / command / privilege errors") {
        return;
    }
    // pid_max is at most 2^22: this pid cannot exist.
    assert_one_error_line(
        &run(&["--pid", "4194305", "--duration", "1"]),
        "no process with pid 4194305",
    );
    assert_one_error_line(
        &run(&["--", "no-such-command-cpi-bpf"]),
        "command not found: no-such-command-cpi-bpf",
    );
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin)
        .args(["--pid", "1", "--duration", "1"])
        .output();
    match nobody {
        // Without root, only one's own processes (tests/tests/it/noroot.rs).
        Ok(out) => assert_one_error_line(&out, "pid 1 belongs to uid 0"),
        Err(e) => cpi_tests::skip(format_args!("the not-root case needs setpriv ({e})")),
    }
}

/// A pid that has exited but is not reaped (a zombie: `/proc/PID` is still there, with
/// no threads or maps left) is refused at start like a wrong pid, by the one-shot
/// command and by the agent, instead of a run that collects nothing.
#[test]
fn an_exited_unreaped_pid_is_refused_at_start() {
    if !require_root("cpi-bpf --pid") {
        return;
    }
    let zombie = Zombie::spawn();
    let pid = zombie.pid().to_string();
    let want = format!("pid {pid} has exited");
    let run = |args: &[&str]| Command::new(cpi_bpf()).args(args).output().unwrap();
    assert_one_error_line(&run(&["--pid", &pid, "--duration", "30"]), &want);
    let store = temp_dir("zombie-agent").join("store");
    let s = store.to_str().unwrap();
    let agent = run(&[
        "agent",
        "--pid",
        &pid,
        "--metrics-addr",
        "off",
        "--store",
        s,
    ]);
    assert_one_error_line(&agent, &want);
    assert!(
        std::fs::read_dir(&store).map_or(true, |d| d.count() == 0),
        "the agent wrote windows"
    );
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
    let Some(exe) = busy("exec", &[]) else { return };
    let _serial = cpu_heavy();
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
    let profile = stdout_json(&out);
    let p = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|p| p["samples"].as_u64().unwrap())
        .expect("a process");
    assert_eq!(p["comm"], "busy", "{p:#}");
    assert_eq!(hottest(p, &exe)["name"], "hot_spin");
}

/// Runs cpi-bpf on `sh -c SCRIPT` and returns the JSON profile; asserts that fewer than
/// 5 % of its samples are unmapped.
fn profile_of_script(script: &str, args: &[&str]) -> Value {
    let out = Command::new(cpi_bpf())
        .args(args)
        .args(["--format", "json", "--", "sh", "-c", script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let profile = stdout_json(&out);
    let total: f64 = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(samples)
        .sum();
    let unmapped = profile["lost"]["unmapped_samples"].as_f64().unwrap();
    eprintln!("{script}: {total} samples, {unmapped} unmapped");
    assert!(total > 100.0, "{total} samples: {stderr}");
    assert!(
        unmapped < 0.05 * total,
        "{unmapped} of {total} unmapped: {stderr}"
    );
    profile
}

/// The function with the most samples across every process and binary.
fn hottest_name(profile: &Value) -> (String, String) {
    profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["functions"].as_array().unwrap().iter())
        .max_by_key(|f| f["samples"].as_u64().unwrap_or(0))
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["binary"].as_str().unwrap().to_string(),
            )
        })
        .expect("a function")
}

/// A program that spins, then execs another: its samples from before the exec resolve
/// through the mappings read then (kept where the new image does not overlap), not
/// through the new image's.
#[test]
fn samples_from_before_an_exec_keep_their_function() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let dir = temp_dir("before-exec");
    let Some(spin) = compile_c("spin_exec.c", &dir, "spin_exec", &[]) else {
        return;
    };
    let Some(busy) = compile_c("busy.c", &dir, "busy", &[]) else {
        return;
    };
    let profile = profile_of_script(
        &format!("exec {} 1.5 {} 0.5", spin.display(), busy.display()),
        &[],
    );
    let p = &profile["processes"].as_array().unwrap()[0];
    let names: Vec<&str> = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["samples"].as_u64().unwrap_or(0) > 50)
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(names.contains(&"spin_before_exec"), "{names:?}");
    assert!(names.contains(&"hot_spin"), "{names:?}");
}

/// A binary deleted while it runs, which exits before the run ends: it is analysed
/// from the file opened while it lived.
#[test]
fn a_binary_deleted_while_it_runs_still_names_its_function() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let dir = temp_dir("deleted-bin");
    let Some(busy) = compile_c("busy.c", &dir, "doomed", &[]) else {
        return;
    };
    let profile = profile_of_script(
        &format!(
            "{0} 1 2>/dev/null & sleep 0.3; rm -f {0}; wait; sleep 0.5",
            busy.display()
        ),
        &[],
    );
    assert!(!busy.exists());
    let (name, binary) = hottest_name(&profile);
    assert_eq!(name, "hot_spin", "{binary}");
    assert!(binary.ends_with("/doomed"), "{binary}");
}

/// A binary visible only in another mount namespace (a container's view): read through
/// the file opened while the process lived, not by its path on the host.
#[test]
fn a_binary_in_another_mount_namespace_names_its_function() {
    if !require_root("cpi-bpf -- unshare -m") {
        return;
    }
    let dir = temp_dir("mntns");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &[]) else {
        return;
    };
    let inner = dir.join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    let script = format!(
        "unshare -m --propagation private sh -c 'mount -t tmpfs none {0} && cp {1} {0}/ns_busy && exec {0}/ns_busy 1.5'",
        inner.display(),
        busy.display()
    );
    let profile = profile_of_script(&script, &[]);
    assert!(
        !inner.join("ns_busy").exists(),
        "the binary must not be visible from here"
    );
    let (name, binary) = hottest_name(&profile);
    assert_eq!(name, "hot_spin", "{binary}");
    assert!(binary.ends_with("/ns_busy"), "{binary}");
}

/// Short-lived children (`/bin/true` in a shell loop) are gone before `/proc/PID/maps`
/// can be read: their mappings come from the kernel's side-band records
/// (collect/sideband.rs), and every process has a name.
#[test]
fn short_lived_children_are_resolved_from_side_band_records() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    // A child's inherited cpu-clock event starts a fresh period, so at the default
    // 1 ms a child that runs 0.3 ms is seldom sampled: sample every 50 µs.
    let profile = profile_of_script(
        "i=0; while [ $i -lt 1500 ]; do /bin/true; i=$((i+1)); done",
        &["--frequency", "20000"],
    );
    let procs = profile["processes"].as_array().unwrap();
    assert!(procs
        .iter()
        .all(|p| !p["comm"].as_str().unwrap().is_empty()));
    let trues = procs.iter().filter(|p| p["comm"] == "true").count();
    assert!(trues > 10, "{trues} processes named true");
    // The dynamic loader's start reaches the root: Debian 12's ld.so has no CFI for
    // its `_start`, which ended these stacks as bad unwinds (`error`) before the entry
    // point counted as the root.
    let (mut through, mut complete) = (0, 0);
    for s in procs.iter().flat_map(|p| p["stacks"].as_array().unwrap()) {
        let frames = s["frames"].as_array().unwrap();
        let name = |frame: &Value| {
            let f = &profile["stack_frames"][frame.as_u64().unwrap() as usize];
            &profile["stack_functions"][f["function"].as_u64().unwrap() as usize]["name"]
        };
        if frames.iter().any(|f| name(f) == "_dl_start") {
            let n = s["samples"].as_u64().unwrap();
            through += n;
            complete += if s["end"] == "complete" { n } else { 0 };
        }
    }
    assert!(through > 20, "{through} samples in ld.so's start");
    assert!(
        complete * 10 >= through * 9,
        "{complete} of {through} stacks through _dl_start complete"
    );
}

/// `tests/programs/leader_exit.c` started for `seconds`, once its main thread has left
/// by `pthread_exit` (a zombie leader, the worker running): its `/proc/PID/maps` and
/// `map_files` read empty from then on.
fn start_leader_exited(exe: &Path, seconds: &str) -> KillOnDrop {
    let child = KillOnDrop(
        Command::new(exe)
            .arg(seconds)
            .stderr(Stdio::null())
            .spawn()
            .expect("start leader_exit"),
    );
    let pid = child.0.id();
    cpi_tests::wait_leader_exited(pid);
    child
}

/// The worker of a [`start_leader_exited`] process in `profile`: its function named, and
/// its samples' stacks complete through `worker` (its caller), but for those the
/// profile says it could not complete (`lost.stacks_*`). With the leader's empty maps,
/// the program's file was not captured, its unwind rules unknown: every stack ended at
/// `worker_spin` and was called complete.
fn assert_worker_named_with_stacks(profile: &Value, pid: u32, exe: &Path) {
    let p = process(profile, pid);
    assert_eq!(hottest(p, exe)["name"], "worker_spin", "{p:#}");
    let name = |frame: &Value| {
        let f = &profile["stack_frames"][frame.as_u64().unwrap() as usize];
        profile["stack_functions"][f["function"].as_u64().unwrap() as usize]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (mut spin, mut through) = (0, 0);
    for s in p["stacks"].as_array().expect("stacks") {
        // Leaf first.
        let names: Vec<String> = s["frames"].as_array().unwrap().iter().map(name).collect();
        let Some(i) = names.iter().position(|n| n == "worker_spin") else {
            continue;
        };
        let n = s["samples"].as_u64().unwrap();
        spin += n;
        if s["end"] == "complete" && names.get(i + 1).is_some_and(|n| n == "worker") {
            through += n;
        }
    }
    let lost = &profile["lost"];
    let incomplete: u64 = [
        "stacks_truncated",
        "stacks_unknown_code",
        "stacks_failed",
        "stacks_too_costly",
        "stacks_evicted",
    ]
    .iter()
    .map(|k| lost[k].as_u64().unwrap())
    .sum();
    eprintln!(
        "worker_spin: {spin} samples, {through} complete through worker, \
         {incomplete} stacks reported incomplete"
    );
    assert!(spin > 0, "{p:#}");
    assert!(
        spin - through <= incomplete,
        "{} of {spin} worker_spin stacks not through worker, {incomplete} said incomplete: {p:#}",
        spin - through
    );
}

/// A process whose main thread exited while its worker runs, profiled by pid: read
/// through the worker's own `/proc/TID` (cpi-user/src/procmap/mod.rs, `read_live`).
#[test]
fn a_process_whose_main_thread_exited_is_profiled_through_its_worker() {
    if !require_root("cpi-bpf --pid") {
        return;
    }
    let Some(exe) = compile_c(
        "leader_exit.c",
        &temp_dir("leader-exit"),
        "leader_exit",
        &[],
    ) else {
        return;
    };
    let _serial = cpu_heavy();
    // Built (on first use) before the program's time starts.
    let bin = cpi_bpf();
    let child = start_leader_exited(&exe, "20");
    let pid = child.0.id();
    let out = output_ok(Command::new(bin).args([
        "--pid",
        &pid.to_string(),
        "--duration",
        "2",
        "--format",
        "json",
    ]));
    drop(child);
    assert_worker_named_with_stacks(&stdout_json(&out), pid, &exe);
}

/// The agent, on the same process: its merged windows say the same.
#[test]
fn the_agent_profiles_a_process_whose_main_thread_exited() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("leader-exit-agent");
    let Some(exe) = compile_c("leader_exit.c", &dir, "leader_exit", &[]) else {
        return;
    };
    let _serial = cpu_heavy();
    // Built (on first use) before the program's time starts.
    cpi_bpf();
    let child = start_leader_exited(&exe, "60");
    let pid = child.0.id();
    let store = dir.join("store");
    let mut a = agent(&store, &["--pid", &pid.to_string()]);
    super::agent::wait_for_windows(&store, 1, std::time::Instant::now());
    let log = stop_agent(&mut a);
    drop(child);
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--format", "json", "--store"])
            .arg(&store),
    );
    assert!(store_windows(&store).len() >= 2, "{log}");
    assert_worker_named_with_stacks(&stdout_json(&out), pid, &exe);
}
