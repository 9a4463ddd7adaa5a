//! The agent's kernel filter for real (root, BPF): two busy processes, one agent filtered
//! to one of them (`--pid`, or `--cgroup` of a cgroup v2 directory the test creates and
//! moves it into) and one unfiltered agent, side by side over the same wall-clock
//! windows. The filtered windows hold that process only, the other's samples are
//! counted as `filtered_in_kernel` (dropped in the eBPF program), and the time the
//! filtered agent gives the process agrees with the unfiltered agent's within their
//! sampling error (cpi-user/src/collect/filter.rs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{
    agent, compile_c, cpu_heavy, require_root, stop_agent, store_windows, temp_dir, KillOnDrop,
};
use serde_json::Value;

/// Windows each agent must have stored (the first and last are partial and left out).
const WINDOWS: usize = 8;

/// `pid`'s (samples, cpu-clock ns) in a window.
fn of(w: &Value, pid: u32) -> (f64, f64) {
    w["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .map_or((0.0, 0.0), |p| {
            (
                p["samples"].as_f64().unwrap(),
                p["time_ns"].as_f64().unwrap_or(0.0),
            )
        })
}

/// Runs a filtered and an unfiltered agent side by side while `kept` and another busy
/// process run, and checks the filtered windows against the unfiltered ones.
fn filtered_equals_unfiltered_restricted(dir: &Path, filter: &[&str], kept: u32, other: u32) {
    let (fs, us) = (dir.join("filtered"), dir.join("unfiltered"));
    // Every sample counts for the comparison: no governor, no stacks to slow it.
    let quiet = ["--overhead-budget", "100", "--no-stacks"];
    // Killed on drop: an agent that fails to stop cleanly leaves no other running.
    let mut f = KillOnDrop(agent(&fs, &[&quiet[..], filter].concat()));
    let mut u = KillOnDrop(agent(&us, &quiet));
    let t0 = Instant::now();
    while (std::fs::read_dir(&fs).map_or(0, Iterator::count) < WINDOWS
        || std::fs::read_dir(&us).map_or(0, Iterator::count) < WINDOWS)
        && t0.elapsed() < Duration::from_secs(90)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop_agent(&mut f.0);
    stop_agent(&mut u.0);
    let (fw, uw) = (store_windows(&fs), store_windows(&us));
    assert!(fw.len() >= WINDOWS && uw.len() >= WINDOWS, "{fw:?} {uw:?}");
    let mut filtered = 0u64;
    for (_, _, w) in &fw {
        let pids: Vec<u64> = w["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect();
        assert!(
            pids.iter().all(|&p| p == kept as u64),
            "{pids:?}, kept {kept}"
        );
        filtered += w["lost"]["filtered_in_kernel"].as_u64().unwrap();
        // Filtered samples are not a loss.
        assert_eq!(w["lost_samples"], 0);
    }
    assert!(filtered > 0, "nothing dropped in the kernel");
    // The same span for both: from the first to the last window end the two agents cut
    // at (nearly) the same time. A window whose analysis was late ends late, so not
    // every end is shared; the windows between two shared ends tile that span.
    let near = |a: u64, b: u64| a.abs_diff(b) <= 50;
    let shared: Vec<(u64, u64)> = fw
        .iter()
        .filter_map(|f| uw.iter().find(|u| near(f.1, u.1)).map(|u| (f.1, u.1)))
        .collect();
    assert!(shared.len() >= 2, "no shared span: {shared:?}");
    let ((sf, su), (ef, eu)) = (shared[0], shared[shared.len() - 1]);
    let sum = |ws: &[(u64, u64, Value)], s: u64, e: u64, pid: u32| {
        ws.iter()
            .filter(|w| w.0 >= s && w.1 <= e)
            .map(|w| of(&w.2, pid))
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    let (fsum, usum) = (sum(&fw, sf, ef, kept), sum(&uw, su, eu, kept));
    assert!(
        uw.iter().any(|w| of(&w.2, other).0 > 0.0),
        "the unfiltered agent never saw the other process {other}"
    );
    // The spans differ at each end by the cut times' difference, during which the
    // process (one thread) ran at most that long.
    let edges = (sf.abs_diff(su) + ef.abs_diff(eu)) as f64 * 1e6;
    // Each agent's time is its sample count times the period: one standard error is
    // the count's √N periods (the error model of cpi-user/src/profile/error.rs for a
    // count); the two agents sample independently, so their difference has the
    // quadrature sum, and 4 of those bound it.
    let (period_f, period_u) = (fsum.1 / fsum.0, usum.1 / usum.0);
    let sigma = ((fsum.0 * period_f * period_f) + (usum.0 * period_u * period_u)).sqrt();
    eprintln!(
        "kept {kept}: filtered {:.3} s in {} samples, unfiltered {:.3} s in {} samples, \
         1 σ {:.3} s, edges {:.3} s; {filtered} samples filtered in the kernel",
        fsum.1 / 1e9,
        fsum.0,
        usum.1 / 1e9,
        usum.0,
        sigma / 1e9,
        edges / 1e9
    );
    assert!(
        fsum.0 > 100.0,
        "too few samples to compare: {fsum:?} over {shared:?}"
    );
    assert!(
        (fsum.1 - usum.1).abs() <= 4.0 * sigma + edges,
        "filtered {fsum:?} vs unfiltered {usum:?}, σ {sigma}, edges {edges} ns"
    );
}

fn busy(dir: &Path) -> Option<PathBuf> {
    compile_c("busy.c", dir, "busy", &["-lpthread"])
}

/// `b 120`: busy for 120 s. The agent binary is built first (on first use, minutes after
/// a change of its sources), so none of those seconds goes by before the agents start.
fn spawn(b: &Path) -> Child {
    cpi_tests::cpi_bpf();
    Command::new(b)
        .arg("120")
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", b.display()))
}

#[test]
fn pid_filter_keeps_one_process_in_the_kernel() {
    if !require_root("the agent's kernel filter") {
        return;
    }
    let _cpu = cpu_heavy();
    let dir = temp_dir("agent-filter-pid");
    let Some(b) = busy(&dir) else {
        return;
    };
    let (mut kept, mut other) = (spawn(&b), spawn(&b));
    let pid = kept.id().to_string();
    filtered_equals_unfiltered_restricted(&dir, &["--pid", &pid], kept.id(), other.id());
    for c in [&mut kept, &mut other] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cgroup v2 directory made for the test, removed (its processes gone) on drop.
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn cgroup_filter_keeps_the_cgroup_in_the_kernel() {
    if !require_root("the agent's kernel filter") {
        return;
    }
    let Some(root) = cpi_user::collect::filter::cgroup2_root() else {
        cpi_tests::skip("no cgroup2 mount (machines of this kind have one)");
        return;
    };
    let _cpu = cpu_heavy();
    let dir = temp_dir("agent-filter-cgroup");
    let Some(b) = busy(&dir) else {
        return;
    };
    let cg = TestCgroup(root.join(format!("cpi-test-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let (mut kept, mut other) = (spawn(&b), spawn(&b));
    std::fs::write(cg.0.join("cgroup.procs"), kept.id().to_string()).unwrap();
    filtered_equals_unfiltered_restricted(
        &dir,
        &["--cgroup", cg.0.to_str().unwrap()],
        kept.id(),
        other.id(),
    );
    for c in [&mut kept, &mut other] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
