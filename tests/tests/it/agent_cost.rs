//! What the agent costs, counted by the agent as by the kernel: the
//! run time of its BPF programs in `cpi_bpf_bpf_run_seconds_total` against the kernel's
//! own `run_time_ns` for the same programs, read with `bpftool` (root).

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{agent_with_metrics, compile_c, http_get, metric, require_root, skip, temp_dir};
use serde_json::Value;

/// The ids of the BPF programs process `pid` holds open (`prog_id:` in the fdinfo of
/// its BPF program fds).
fn prog_ids(pid: u32) -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return HashSet::new();
    };
    fds.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// The kernel's `run_time_ns` summed over the programs `ids`, seconds
/// (`bpftool prog show -j`); None when bpftool cannot run.
fn kernel_run_time(ids: &HashSet<u64>) -> Option<f64> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let progs: Value = serde_json::from_slice(&out.stdout).expect("bpftool's JSON");
    let ns: u64 = progs
        .as_array()
        .expect("a list of programs")
        .iter()
        .filter(|p| p["id"].as_u64().is_some_and(|id| ids.contains(&id)))
        .map(|p| p["run_time_ns"].as_u64().unwrap_or(0))
        .sum();
    Some(ns as f64 / 1e9)
}

/// Scrapes `/metrics`: (windows, BPF run time seconds).
fn scrape(addr: std::net::SocketAddr) -> Option<(f64, f64)> {
    let (200, body) = http_get(addr, "/metrics").ok()? else {
        return None;
    };
    Some((
        metric(&body, "cpi_bpf_windows_total")?,
        metric(&body, "cpi_bpf_bpf_run_seconds_total")?,
    ))
}

/// The agent's BPF run time metric lies between two reads of the kernel's figure for
/// its programs, one taken before the window it was read at began and one after the
/// scrape. It read 0.0 while the kernel counted tens of milliseconds: the agent gave up
/// on the first of the object's programs not loaded in its mode.
#[test]
fn bpf_run_time_metric_matches_the_kernels() {
    if !require_root("the agent") {
        return;
    }
    if kernel_run_time(&HashSet::new()).is_none() {
        skip("bpftool not available; run `cargo xtask setup`");
        return;
    }
    let dir = temp_dir("agent-bpf-cost");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &[]) else {
        return;
    };
    // The agent first (its binary may still have to be built), then something to
    // sample, so the programs run.
    let (agent, metrics) = agent_with_metrics(&dir, &["--interval", "1"]);
    let _busy = cpi_tests::KillOnDrop(
        Command::new(&busy)
            .arg("90")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let t0 = Instant::now();
    let within = |what: &str| {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{what} after 90 s\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let until = |pred: &dyn Fn(f64) -> bool| loop {
        match scrape(metrics) {
            Some((w, bpf)) if pred(w) => break (w, bpf),
            _ => within("no window analysed"),
        }
    };
    let (first, _) = until(&|w| w >= 2.0);
    let ids = prog_ids(agent.0.id());
    assert!(!ids.is_empty(), "the agent holds no BPF program\n{}", log());
    let before = kernel_run_time(&ids).unwrap();
    // The collector reads the run time as each window ends and hands it to the
    // analysis: at most two windows wait behind the one last counted, so the third
    // after began after `before` was read.
    let (_, counted) = until(&|w| w >= first + 3.0);
    let after = kernel_run_time(&ids).unwrap();
    eprintln!(
        "programs {ids:?}: kernel {before:.6} s, then agent {counted:.6} s, then kernel \
         {after:.6} s"
    );
    assert!(before > 0.0, "the programs never ran\n{}", log());
    assert!(
        before <= counted && counted <= after,
        "agent {counted} s not between the kernel's {before} s and {after} s\n{}",
        log()
    );
}
