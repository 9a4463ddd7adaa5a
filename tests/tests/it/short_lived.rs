//! Work in threads and processes shorter than a sampling period (tests/programs/short_lived.c),
//! profiled as root with `-- CMD` and `-p`: the events count per CPU and the eBPF
//! program follows the target's process tree, so samples follow CPU time whatever a
//! thread's life. Counted per thread (an inherited counter restarts its period in each
//! new thread, as perf's), a 0.5 ms thread at 1 kHz is never sampled: 1 sample for 1 s
//! of CPU. Each test compares the time sampled with the CPU time the program reports
//! (getrusage), within 4 of the profile's own errors (a time of N samples is known to
//! 1/√N), plus the period each CPU has in progress at each end.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use cpi_tests::{compile_c, cpi_bpf, cpu_heavy, require_root, stderr, stdout_json, temp_dir};
use serde_json::Value;

fn short_lived(tag: &str) -> Option<PathBuf> {
    // Static: a process's exec then costs the least, so the shell loop's are short.
    compile_c(
        "short_lived.c",
        &temp_dir(tag),
        "short_lived",
        &["-static", "-lpthread"],
    )
}

/// `key=VALUE` of the first line of `text` that has it.
fn field(text: &str, key: &str) -> Option<f64> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Time sampled (seconds) and samples of the processes whose pid `keep` accepts.
fn sampled(profile: &Value, keep: &dyn Fn(u64) -> bool) -> (f64, f64) {
    let procs = profile["processes"].as_array().expect("processes");
    procs
        .iter()
        .filter(|p| keep(p["pid"].as_u64().unwrap()))
        .fold((0.0, 0.0), |(t, n), p| {
            (
                t + p["time_ns"].as_f64().unwrap_or(0.0) / 1e9,
                n + p["samples"].as_f64().unwrap(),
            )
        })
}

/// Asserts `time` s sampled in `samples` samples agrees with `cpu` s of CPU time:
/// within 4 errors of √samples periods, plus one period per CPU at each end.
fn assert_agrees(what: &str, profile: &Value, (time, samples): (f64, f64), cpu: f64) {
    let period = profile["events"][0]["period"].as_f64().unwrap() / 1e9;
    let cpus = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    let error = samples.max(1.0).sqrt() * period;
    let bound = 4.0 * error + 2.0 * cpus * period;
    eprintln!(
        "{what}: {time:.3} s sampled in {samples} samples, {cpu:.3} s of CPU \
         (bound ±{bound:.3} s)"
    );
    assert!(
        (time - cpu).abs() <= bound,
        "{what}: {time:.3} s sampled in {samples} samples for {cpu:.3} s of CPU: off by more \
         than 4 errors ({error:.4} s each) and the periods in progress"
    );
}

#[test]
fn a_command_whose_work_runs_in_half_millisecond_threads_is_sampled_for_its_cpu_time() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let Some(exe) = short_lived("threads") else {
        return;
    };
    let _serial = cpu_heavy();
    let out = Command::new(cpi_bpf())
        .args(["--format", "json", "--"])
        .arg(&exe)
        .args(["threads", "1", "500"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let cpu = field(&err, "cpu_seconds").expect("cpu_seconds=");
    let threads = field(&err, "threads").expect("threads=");
    assert!(threads > 1000.0, "the work ran in {threads} threads");
    let profile = stdout_json(&out);
    assert_agrees(
        "1 s in 0.5 ms threads",
        &profile,
        sampled(&profile, &|_| true),
        cpu,
    );
}

#[test]
fn a_shell_loop_of_short_processes_is_sampled_for_their_cpu_time() {
    if !require_root("cpi-bpf -- sh -c") {
        return;
    }
    let Some(exe) = short_lived("loop") else {
        return;
    };
    let _serial = cpu_heavy();
    // 200 Hz: a 5 ms period, longer than each process's whole life here (≈ 1 ms,
    // exec included), so that counted per process none would ever be sampled.
    let script = format!("for i in $(seq 600); do '{}' proc 0.3; done", exe.display());
    let out = Command::new(cpi_bpf())
        .args([
            "--frequency",
            "200",
            "--format",
            "json",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Each process's own CPU time, by pid.
    let cpu: BTreeMap<u64, f64> = stderr(&out)
        .lines()
        .filter_map(|l| Some((field(l, "pid")? as u64, field(l, "cpu_seconds")?)))
        .collect();
    assert_eq!(cpu.len(), 600, "{}", stderr(&out));
    let profile = stdout_json(&out);
    let got = sampled(&profile, &|pid| cpu.contains_key(&pid));
    assert_agrees("600 processes of ≈ 1 ms", &profile, got, cpu.values().sum());
}

/// Reads `lines` until one starts with `prefix`; every line read, for the failure.
fn read_until(lines: &mut dyn Iterator<Item = std::io::Result<String>>, prefix: &str) -> String {
    let mut seen = String::new();
    for l in lines.map_while(Result::ok) {
        seen.push_str(&l);
        seen.push('\n');
        if l.starts_with(prefix) {
            return seen;
        }
    }
    panic!("no line starting {prefix:?} in:\n{seen}");
}

#[test]
fn a_pid_is_followed_into_the_children_it_forks_after_attach() {
    if !require_root("cpi-bpf -p") {
        return;
    }
    let Some(exe) = short_lived("tree") else {
        return;
    };
    let _serial = cpu_heavy();
    let bin = cpi_bpf();
    let mut target = Command::new(&exe)
        .args(["tree", "20", "30"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = target.id();
    let mut profiler = Command::new(bin)
        .args(["--format", "json", "-p", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(profiler.stderr.take().unwrap()).lines();
    let mut said = read_until(&mut lines, "cpi-bpf: mode:");
    // Attached: the children are forked from here on.
    target.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut truth = String::new();
    std::io::Read::read_to_string(&mut target.stderr.take().unwrap(), &mut truth).unwrap();
    assert!(target.wait().unwrap().success(), "{truth}");
    // The profiler stops at its target's exit: its profile, then the rest it said.
    let mut json = Vec::new();
    std::io::Read::read_to_end(&mut profiler.stdout.take().unwrap(), &mut json).unwrap();
    lines
        .map_while(Result::ok)
        .for_each(|l| said.push_str(&(l + "\n")));
    assert!(profiler.wait().unwrap().success(), "{said}");
    let profile: Value = serde_json::from_slice(&json).unwrap_or_else(|e| panic!("{e}: {said}"));
    let cpu = field(&truth, "cpu_seconds").expect("cpu_seconds=");
    let children = profile["processes"].as_array().unwrap().iter();
    let children: Vec<u64> = children
        .filter(|p| p["pid"].as_u64() != Some(u64::from(pid)) && p["samples"].as_u64() > Some(0))
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(
        children.len() >= 10,
        "children sampled: {children:?}\n{said}"
    );
    assert_agrees(
        "20 children of 30 ms in 0.5 ms threads",
        &profile,
        sampled(&profile, &|_| true),
        cpu,
    );
}
