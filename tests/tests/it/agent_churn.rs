//! The agent under process churn: a new process of a binary
//! already seen costs no file open, symbol-table parse or unwind-table read, and the
//! agent's memory stays bounded. Checked per binary from the agent's debug log (each
//! open, capture and parse names its file), not from a rate or a CPU figure, which a
//! loaded 2-CPU host makes noise of.

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{
    agent_with_metrics, compile_c, http_get, labelled, metric, require_root, store_windows,
    temp_dir, vm_hwm,
};

/// Distinct binaries (copies of one program: a distinct inode each) and processes.
const COPIES: usize = 12;
const PROCESSES: usize = 240;

/// How many times each copy's path is named after `what` in the agent's log.
fn named(log: &str, what: &str, copies: &[String]) -> HashMap<String, usize> {
    let mut n = HashMap::new();
    for line in log.lines() {
        let Some(rest) = line.split_once(what).map(|(_, r)| r) else {
            continue;
        };
        let path = rest.split(' ').next().unwrap_or("");
        if copies.iter().any(|c| c == path) {
            *n.entry(path.to_string()).or_default() += 1;
        }
    }
    n
}

/// Processes of `COPIES` binaries come and go (`PROCESSES` of them, each spinning 20 ms):
/// every binary is opened, captured and parsed for symbols at most once, however many
/// of its processes were sampled (its unwind tables: see below); the agent's peak resident set
/// stays bounded: within 256 MiB at this fixed 999 Hz (124.6 MiB seen on a loaded 2-CPU
/// host; per-process state that never left would pass it; the 64 MiB target at default
/// settings is not met: BENCHMARKS.md, "Agent under churn").
#[test]
fn a_binarys_later_processes_cost_no_opens_or_parses() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("agent-churn");
    let Some(churn) = compile_c("churn.c", &dir, "churn", &[]) else {
        return;
    };
    let copies: Vec<String> = (0..COPIES)
        .map(|i| {
            let to = dir.join(format!("churn-{i:03}"));
            std::fs::copy(&churn, &to).unwrap();
            to.display().to_string()
        })
        .collect();
    // A fixed 999 Hz (the governor's budget out of reach), so most processes are sampled.
    let (agent, metrics) = agent_with_metrics(
        &dir,
        &[
            "--interval",
            "1",
            "--overhead-budget",
            "50",
            "--log-level",
            "debug",
        ],
    );
    let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let scrape = || match http_get(metrics, "/metrics") {
        Ok((200, body)) => Some(body),
        _ => None,
    };
    let t0 = Instant::now();
    let windows = |body: &str| metric(body, "cpi_bpf_windows_total").unwrap_or(0.0);
    let wait_windows = |n: f64| loop {
        if let Some(body) = scrape().filter(|b| windows(b) >= n) {
            break body;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "no window\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let before = windows(&wait_windows(1.0));
    // 40 processes a second, each binary's every 0.3 s.
    let out = Command::new(&churn)
        .args([&PROCESSES.to_string(), "40", "20", &COPIES.to_string()])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(out.success());
    let body = wait_windows(before + 9.0);
    let hwm = vm_hwm(agent.0.id()).expect("VmHWM");
    let log = log();
    // Processes of the copies the profiles hold, by binary.
    let mut pids: HashMap<String, HashSet<u64>> = HashMap::new();
    for (_, _, w) in store_windows(&dir.join("store")) {
        for p in w["processes"].as_array().into_iter().flatten() {
            let comm = p["comm"].as_str().unwrap_or("");
            if comm.starts_with("churn-") {
                let pid = p["pid"].as_u64().unwrap();
                pids.entry(comm.to_string()).or_default().insert(pid);
            }
        }
    }
    let repeated = pids.values().filter(|p| p.len() >= 3).count();
    eprintln!(
        "processes sampled per binary: {:?}; VmHWM {:.1} MiB; parsed symbols {:?}, unwind \
         {:?}, opens {:?}",
        pids.values().map(HashSet::len).collect::<Vec<_>>(),
        hwm as f64 / (1 << 20) as f64,
        labelled(&body, "cpi_bpf_binaries_parsed_total", "table", "symbols"),
        labelled(&body, "cpi_bpf_binaries_parsed_total", "table", "unwind"),
        metric(&body, "cpi_bpf_binary_opens_total"),
    );
    assert!(
        repeated >= COPIES / 2,
        "too few binaries with 3 or more processes sampled to say anything ({repeated})"
    );
    // Not the unwind tables: the unwinder keeps the sections of files no live process
    // uses under a bound shared with every process on the host, least recently used out
    // first, so under the suite's other processes a copy whose processes are gone is read
    // again (2–7 times per copy in one suite run): eviction, not per-process cost.
    for (what, counts) in [
        (
            "symbols: parsing ",
            named(&log, "symbols: parsing ", &copies),
        ),
        ("captured ", named(&log, "captured ", &copies)),
        (
            "symbols: opening ",
            named(&log, "symbols: opening ", &copies),
        ),
    ] {
        let again: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
        assert!(
            again.is_empty(),
            "{what}more than once per binary: {again:?}"
        );
    }
    let parsed = named(&log, "symbols: parsing ", &copies).len();
    assert!(parsed >= COPIES / 2, "only {parsed} binaries parsed at all");
    assert!(
        hwm <= 256 << 20,
        "VmHWM {:.1} MiB",
        hwm as f64 / (1 << 20) as f64
    );
}
