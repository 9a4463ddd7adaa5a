//! Collection's failure cases, each written to fail on the collector as it was: a child
//! left hanging after a failure past the fork, a target that ignores SIGINT/SIGTERM,
//! repeated and overlapping `--pid`s counted again, low rates that lost every sample to
//! the period re-draws, one loss account, numbers out of range. Root only where BPF is
//! needed; each test prints why it skips otherwise.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{
    assert_one_error_line, busy, busy_cpu, cpi_bpf, cpu_heavy, require_root, stderr, stdout_json,
};
use serde_json::Value;

/// Runs `cmd`, killing it (and failing) when it is not done within `limit`.
fn output_within(cmd: &mut Command, limit: Duration) -> (Output, Duration) {
    let t = Instant::now();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    (wait_or_kill(child, limit), t.elapsed())
}

/// Waits for `child` while reading its output (a full pipe must not stall it); kills
/// it and fails when it is not done within `limit`.
fn wait_or_kill(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("waiting for the child"),
        Err(_) => {
            // SAFETY: signalling our own child, not yet reaped (its waiter is blocked).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let out = rx.recv().unwrap().unwrap();
            panic!("still running after {limit:?}: {}", stderr(&out));
        }
    }
}

#[test]
fn out_of_range_numbers_get_one_line() {
    let run = |args: &[&str]| {
        output_within(Command::new(cpi_bpf()).args(args), Duration::from_secs(20)).0
    };
    for bad in ["0", "18446744073709551615", "9223372036854775807"] {
        assert_one_error_line(&run(&["--period", bad, "--", "true"]), "--period");
    }
    assert_one_error_line(&run(&["--duration=1e20", "--system-wide"]), "--duration");
    assert_one_error_line(&run(&["--duration=nan", "--system-wide"]), "--duration");
    assert_one_error_line(
        &run(&["--frequency", "10", "--period", "1000", "--", "true"]),
        "cannot be used with",
    );
    assert_one_error_line(&run(&["--frequency", "0", "--", "true"]), "--frequency");
}

#[test]
fn a_file_that_is_not_executable_is_said_so() {
    if !require_root("the command checks (after the privilege check)") {
        return;
    }
    let out = Command::new(cpi_bpf())
        .args(["--", "/etc/passwd"])
        .output()
        .unwrap();
    assert_one_error_line(&out, "not executable: /etc/passwd");
}

#[test]
fn too_few_open_files_is_one_line_not_a_panic() {
    if !require_root("collection") {
        return;
    }
    let cmd = format!(
        "ulimit -n 16 && exec {} --system-wide --duration 1",
        cpi_bpf().display()
    );
    let (out, _) = output_within(
        Command::new("sh").args(["-c", &cmd]),
        Duration::from_secs(20),
    );
    assert_one_error_line(&out, "too few open files");
}

/// A repro: the period used to fail after the fork, and the child,
/// blocked on the release pipe it held itself, kept `| cat` open forever.
#[test]
fn a_failing_start_leaves_no_child_holding_the_pipe() {
    if !require_root("collection") {
        return;
    }
    let Some(exe) = busy("hang", &[]) else { return };
    let cmd = format!(
        "{} --period=9223372036854775807 -- {} 0.5 2>&1 | cat",
        cpi_bpf().display(),
        exe.display()
    );
    let (out, took) = output_within(
        Command::new("sh").args(["-c", &cmd]),
        Duration::from_secs(20),
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--period"), "{text}");
}

/// After SIGINT, a command that ignores SIGINT and SIGTERM is killed after a bound, and
/// cpi-bpf says so; the collection is still reported.
#[test]
fn a_command_ignoring_sigterm_is_killed_after_sigint() {
    if !require_root("collection") {
        return;
    }
    let _serial = cpu_heavy();
    let child = Command::new(cpi_bpf())
        .args(["--format", "json", "--", "sh", "-c"])
        .arg("trap '' INT TERM; while :; do :; done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t = Instant::now();
    let out = wait_or_kill(child, Duration::from_secs(15));
    let took = t.elapsed();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "Ctrl-C's status: {err}");
    assert!(took < Duration::from_secs(8), "took {took:?} after SIGINT");
    assert!(err.contains("SIGINT received"), "{err}");
    assert!(
        err.contains("did not end within 2 s of SIGTERM: killed it (SIGKILL)"),
        "{err}"
    );
    let profile = stdout_json(&out);
    assert!(
        profile["events"][0]["samples"].as_u64().unwrap() > 0,
        "the collection is reported: {profile:#}"
    );
}

/// utime + stime of `pid` in seconds, read from `/proc/PID/stat`.
fn cpu_of(pid: u32) -> f64 {
    cpi_tests::cpu_seconds(pid).expect("process still there")
}

/// Profiles a running two-thread busy for 2 s with `args` (the pids) and returns the
/// profile, cpi-bpf's stderr, the CPU the process used while collection ran, its pid.
fn profile_pids(
    exe: &Path,
    pid_args: impl Fn(u32, u32) -> Vec<String>,
) -> (Value, String, f64, u32) {
    let mut target = Command::new(exe)
        .args(["30", "2"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id();
    std::thread::sleep(Duration::from_millis(300));
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&t| t != pid)
        .expect("busy runs a second thread");
    let cpu0 = cpu_of(pid);
    let out = Command::new(cpi_bpf())
        .args(pid_args(pid, tid))
        .args(["--duration", "2", "--format", "json"])
        .output()
        .unwrap();
    let cpu = cpu_of(pid) - cpu0;
    let _ = target.kill();
    let _ = target.wait();
    assert!(out.status.success(), "{}", stderr(&out));
    (stdout_json(&out), stderr(&out), cpu, pid)
}

fn time_of(profile: &Value, pid: u32) -> f64 {
    let procs = profile["processes"].as_array().unwrap();
    let mine: Vec<&Value> = procs.iter().filter(|p| p["pid"] == pid).collect();
    assert_eq!(mine.len(), 1, "pid {pid} once in {procs:#?}");
    mine[0]["time_ns"].as_f64().unwrap() / 1e9
}

/// Sampled CPU time is within 10 % of what the process used — not 3× it. The CPU is
/// read around the whole cpi-bpf run (set-up and analysis included), so the sampled
/// time may only fall short of it, by the set-up's share.
fn assert_cpu_once(sampled: f64, used: f64, what: &str) {
    eprintln!("{what}: sampled {sampled:.3} s of CPU, the process used {used:.3} s");
    assert!(
        sampled <= used * 1.10 && sampled >= used * 0.6,
        "{what}: sampled {sampled:.3} s, used {used:.3} s"
    );
}

#[test]
fn repeated_and_overlapping_pids_are_counted_once() {
    if !require_root("collection") {
        return;
    }
    let Some(exe) = busy("dup", &[]) else { return };
    let _serial = cpu_heavy();
    let pid_flags = |ids: &[u32]| {
        ids.iter()
            .flat_map(|i| ["--pid".to_string(), i.to_string()])
            .collect::<Vec<_>>()
    };

    let (p, err, cpu, pid) = profile_pids(&exe, |pid, _| pid_flags(&[pid, pid, pid]));
    assert_cpu_once(time_of(&p, pid), cpu, "--pid P ×3");
    assert!(err.contains("given more than once"), "{err}");

    let (p, err, cpu, pid) = profile_pids(&exe, |pid, tid| pid_flags(&[pid, tid]));
    assert_cpu_once(time_of(&p, pid), cpu, "--pid P --pid TID");
    assert!(err.contains("is a thread of process"), "{err}");

    // A thread that is not the group leader: its process is profiled, and said so,
    // instead of "target exited" with nothing.
    let (p, err, cpu, pid) = profile_pids(&exe, |_, tid| pid_flags(&[tid]));
    assert!(err.contains("is a thread of process"), "{err}");
    assert!(err.contains("stopped (duration reached)"), "{err}");
    assert_cpu_once(time_of(&p, pid), cpu, "--pid TID");
}

/// One loss account: the `N samples lost` warning on stderr (none when none are lost) is the profile's `lost_samples`
/// (ring full, branch errors, malformed), here with samples that cannot be mapped (the
/// binary is gone by the end of the run): those are their own count, not losses.
#[test]
fn stderr_and_profile_count_the_same_losses() {
    if !require_root("collection") {
        return;
    }
    let Some(exe) = busy("loss", &[]) else { return };
    let _serial = cpu_heavy();
    let gone = exe.with_file_name("busy-deleted");
    cpi_tests::copy_program(&exe, &gone);
    let script = format!("{0} 0.7; rm -f {0}", gone.display());
    let out = Command::new(cpi_bpf())
        .args(["--format", "json", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let profile = stdout_json(&out);
    let said: u64 = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("cpi-bpf: warning: ")?
                .split_once(" samples lost")?
                .0
                .parse()
                .ok()
        })
        // None lost is said by the table and the JSON only.
        .unwrap_or(0);
    eprintln!("{err}");
    assert_eq!(said, profile["lost_samples"].as_u64().unwrap(), "{err}");
}

/// Samples per CPU-second of the target follow the rate at every rate and with every
/// perturbation: the user layer's re-draws (which restart the count) no longer throw
/// away the progress of slow events. Compared with the target's own CPU time (busy's
/// rusage), not wall time, so a loaded machine does not move the expectation.
#[test]
fn every_rate_and_perturbation_samples_the_cpu_time() {
    if !require_root("collection") {
        return;
    }
    let Some(exe) = busy("rates", &[]) else {
        return;
    };
    let _serial = cpu_heavy();
    let cpus = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    let mut failures = Vec::new();
    // Low rates need a longer run for the count to mean something.
    for (hz, secs) in [(10, "4"), (100, "2"), (1000, "1"), (10_000, "1")] {
        for perturbation in ["none", "user", "kernel", "both"] {
            let out = Command::new(cpi_bpf())
                .args([
                    "--frequency",
                    &hz.to_string(),
                    "--perturbation",
                    perturbation,
                ])
                .args(["--format", "json", "--"])
                .arg(&exe)
                .arg(secs)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
            let cpu = busy_cpu(&out);
            let profile = stdout_json(&out);
            let e = &profile["events"][0];
            let (period, jitter, thinning) = (
                e["period"].as_f64().unwrap(),
                e["jitter"].as_f64().unwrap(),
                e["thinning"].as_f64().unwrap(),
            );
            let samples = e["samples"].as_f64().unwrap();
            let sampled = profile["processes"][0]["time_ns"].as_f64().unwrap_or(0.0) / 1e9;
            // Records: one per overflow (mean period: base + half the re-draw band),
            // thinned 1 in K by the kernel layer.
            let expected = cpu * 1e9 / (period + jitter / 2.0) / thinning;
            // 12 %: the sampling interrupts themselves (timer, BPF program) run on the
            // target's CPU time, unsampled, and a VM's late timer loses more; a fresh
            // machine under load once saw 0.941 s sampled of 1.053 s at 10 kHz, and a
            // quiet full suite 0.972 s of 1.084 s at 1 kHz. cpu-clock is a timer, not a
            // statistical sampler: no reported error to judge by, so the bound is set to
            // catch wrong weights (a thinning factor K, a unit) beyond the VM's timer
            // losses. Plus what cannot be counted at the edges: the period in progress
            // at the end, and with thinning the up to 2(K-1) overflows whose period is
            // still pending in the kernel — per CPU, since the thinning state is per CPU
            // and the target migrates (a loaded 2-CPU machine once left 1.8 s of 2.78 s
            // sampled at 10 Hz with K = 4: 9.75 periods pending, over one CPU's 6).
            // As root `-- CMD` counts per CPU: each CPU's timer fires on that CPU's time,
            // whoever runs, and the target gets the ticks that find it running. On a
            // CPU other processes share, its count is a binomial draw, √N ticks its
            // standard error (two CPU hogs beside it: 33 ticks at 10 Hz where 27.9 were
            // expected), judged at 4 of them.
            let tolerance = 0.12;
            let slack_s = (cpus * 2.0 * (thinning - 1.0) + 1.5) * (period + jitter) / 1e9;
            let draw = 4.0 * samples.max(expected).sqrt();
            let tick_s = (period + jitter / 2.0) * thinning / 1e9;
            let ok_time = (sampled - cpu).abs() <= tolerance * cpu + slack_s + draw * tick_s;
            let ok_samples = (samples - expected).abs() <= tolerance * expected + 1.5 + draw;
            eprintln!(
                "{hz:>6} Hz {perturbation:<6}: {samples} records (expected {expected:.1}), \
                 {sampled:.3} s sampled of {cpu:.3} s CPU {}",
                if ok_time && ok_samples { "ok" } else { "FAIL" }
            );
            if !(ok_time && (ok_samples || thinning > 1.0)) {
                failures.push(format!("{hz} Hz {perturbation}"));
            }
        }
    }
    assert!(failures.is_empty(), "off the rate: {failures:?}");
}

/// At a rate cpu-clock cannot fire at, samples are weighted with the period the kernel
/// really uses, said on stderr: the sampled time is the CPU time's order, not 1/100 of it.
#[test]
fn an_impossible_rate_is_clamped_and_weighted_with_the_real_period() {
    if !require_root("collection") {
        return;
    }
    let Some(exe) = busy("fast", &[]) else { return };
    let _serial = cpu_heavy();
    let out = Command::new(cpi_bpf())
        .args(["--frequency", "10000000", "--format", "json", "--"])
        .arg(&exe)
        .arg("1")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("period 100 ns raised to"), "{err}");
    let cpu = busy_cpu(&out);
    let profile = stdout_json(&out);
    assert!(profile["events"][0]["period"].as_u64().unwrap() >= 10_000);
    let sampled = profile["processes"][0]["time_ns"].as_f64().unwrap() / 1e9;
    eprintln!("10 MHz asked: {sampled:.3} s sampled of {cpu:.3} s CPU");
    // A VM's timer fires late at these rates, more so on a loaded machine, and the
    // kernel drops the missed ticks (hrtimer_forward_now), so some time goes unsampled
    // (measured here: 65-70 %; 22 % with two CPU hogs on both CPUs); weighting with
    // the asked 101 ns gave about 1 %.
    assert!(
        sampled <= cpu * 1.05 && sampled >= cpu * 0.1,
        "{sampled:.3} s sampled of {cpu:.3} s"
    );
}

/// The Session as the agent drives it: windows cut while collection goes on add up to
/// the target's CPU time (no sample in two windows or none), a rate change takes effect
/// without re-opening, the BPF run time is measured, finish gives the last window.
#[test]
fn session_windows_add_up_and_the_rate_changes_live() {
    use cpi_common::policy::Perturbation;
    use cpi_common::wire::EventRole;
    use cpi_user::collect::events::{nominal_core_hz, Rate};
    use cpi_user::collect::{CollectOptions, Session, Target};

    if !require_root("a collection session") {
        return;
    }
    let Some(exe) = busy("session", &[]) else {
        return;
    };
    let _serial = cpu_heavy();
    let mut target = Command::new(&exe)
        .arg("30")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id();
    let opts = CollectOptions {
        target: Target::Pids(vec![pid]),
        duration: None,
        rate: Rate {
            frequency: 999,
            period: None,
            core_hz: nominal_core_hz(),
        },
        include_kernel: false,
        perturbation: Perturbation::User,
        thinning: 1,
        redraw_every: Duration::from_millis(50),
        ring_bytes: 1 << 20,
        window: None,
        cpu_time: false,
        drain_every: cpi_user::collect::DRAIN_EVERY,
        stacks: true,
        stack_memory: cpi_user::collect::StackMemory::default(),
    };
    let mut notes = Vec::new();
    let mut session = Session::open(&opts, &mut |m| notes.push(m.to_string())).expect("open");
    assert!(notes[0].starts_with("mode: "), "{notes:?}");
    let cpu0 = cpu_of(pid);
    let mut windows = Vec::new();
    for i in 0..4 {
        if i == 2 {
            session.set_frequency(199).unwrap();
            assert_eq!(session.rate().frequency, 199);
        }
        let stop = session
            .run_until(Some(Instant::now() + Duration::from_millis(500)))
            .unwrap();
        assert_eq!(stop, None, "the deadline cut the window, nothing stopped");
        let w = session.take_window();
        assert_eq!(w.stop, None);
        windows.push(w);
    }
    let run_time = session.bpf_run_time();
    let _ = target.kill();
    let last = session.finish().unwrap();
    let cpu = cpu_of_reaped(&mut target, pid, cpu0);
    let time = |w: &cpi_user::collect::Collected| {
        w.set
            .processes
            .get(&pid)
            .and_then(|p| p.ips.get(&EventRole::CpuClock))
            .map_or(0, |a| a.weight) as f64
            / 1e9
    };
    let sampled: f64 = windows.iter().map(time).sum::<f64>() + time(&last);
    eprintln!(
        "windows {:?} s sampled, {sampled:.3} s in all of {cpu:.3} s CPU; BPF run time {run_time:?}",
        windows.iter().map(time).collect::<Vec<_>>()
    );
    for w in &windows {
        assert!(time(w) > 0.0, "every window has samples");
        assert!(
            (0.4..0.8).contains(&w.run.duration_secs),
            "{}",
            w.run.duration_secs
        );
        assert!(
            w.set.processes[&pid].maps.is_some(),
            "maps known in every window"
        );
    }
    // The rate change shows in the windows' events and sample counts (≈ 5× fewer).
    let per_sec =
        |w: &cpi_user::collect::Collected| w.run.events[0].samples as f64 / time(w).max(1e-3);
    assert!(per_sec(&windows[1]) > 3.0 * per_sec(&windows[3]));
    assert!(windows[3].run.events[0].period > 4 * windows[1].run.events[0].period);
    assert!(
        (sampled - cpu).abs() <= 0.1 * cpu + 0.02,
        "{sampled:.3} s sampled of {cpu:.3} s"
    );
    if let Some(t) = run_time {
        assert!(t > Duration::ZERO, "our programs ran");
    } else {
        eprintln!("note: BPF_ENABLE_STATS unavailable here: no run time measured");
    }
}

/// CPU time of `pid` since `cpu0`, read just before it is reaped.
fn cpu_of_reaped(target: &mut Child, pid: u32, cpu0: f64) -> f64 {
    // Killed above; its /proc entry stays until it is reaped.
    let cpu = cpi_tests::cpu_seconds(pid).unwrap_or(cpu0) - cpu0;
    let _ = target.wait();
    cpu
}

/// What can be checked before a collection is checked before it starts: a bad
/// `--output` or `--annotate` with a non-table format fails within a second, not after
/// a 30 s run whose profile is then thrown away.
#[test]
fn output_problems_are_found_before_collecting() {
    let dir = cpi_tests::temp_dir("bad-output");
    let missing = dir.join("no/such/folder/p.json");
    let cases: [(&[&str], &str); 4] = [
        (&["--output", "/proc/x"], "--output /proc/x"),
        (&["--output", dir.to_str().unwrap()], "is a directory"),
        (&["--output", missing.to_str().unwrap()], "does not exist"),
        (
            &["--annotate", "hot_spin", "--format", "json"],
            "--annotate",
        ),
    ];
    for (args, needle) in cases {
        let t0 = std::time::Instant::now();
        let out = Command::new(cpi_bpf())
            .args(["--system-wide", "--duration", "30"])
            .args(args)
            .output()
            .unwrap();
        let took = t0.elapsed();
        assert_one_error_line(&out, needle);
        assert!(took < Duration::from_secs(1), "{args:?} took {took:?}");
    }
}

/// An unknown `--annotate` name still prints the profile, with the nearest names.
#[test]
fn an_unknown_annotate_name_keeps_the_profile() {
    if !require_root("cpi-bpf -- CMD") {
        return;
    }
    let Some(exe) = busy("annotate", &[]) else {
        return;
    };
    let out = Command::new(cpi_bpf())
        .args(["--annotate", "hot_spn", "--"])
        .arg(&exe)
        .arg("0.5")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(err.contains("hot_spin"), "nearest names listed: {err}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("hot_spin"),
        "the profile is still printed: {table}"
    );
}

/// `report` reads at most a bounded amount: `/dev/zero` is one line, quickly, within
/// 1 GiB of address space (it grew past 5 GiB and never ended).
#[test]
fn report_of_an_endless_file_is_bounded() {
    let t0 = std::time::Instant::now();
    let out = Command::new("prlimit")
        .arg("--as=1073741824")
        .arg(cpi_bpf())
        .args(["report", "/dev/zero"])
        .output()
        .unwrap();
    assert_one_error_line(&out, "/dev/zero");
    // A hang guard, not a speed claim: it reads 256 MiB and stops (about a second on an
    // idle machine); only a reader that never stops comes near this on a busy one.
    assert!(
        t0.elapsed() < Duration::from_secs(300),
        "{:?}",
        t0.elapsed()
    );
}

/// pprof is binary: refused on a terminal without `--output` (as gzip does), before
/// anything is collected. `script` gives the command a terminal.
#[test]
fn pprof_is_not_written_to_a_terminal() {
    let cmd = format!(
        "{} --system-wide --duration 30 --format pprof",
        cpi_bpf().display()
    );
    let out = match Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            cpi_tests::skip(format_args!("needs script(1) for a terminal ({e})"));
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("refusing to write it to a terminal"),
        "{text}"
    );
}
