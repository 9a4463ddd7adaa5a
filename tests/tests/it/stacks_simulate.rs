//! Call paths in `simulate`: the replay's exact shadow stacks give the
//! truth per call path on real programs (cpi-user/src/sim/shadow.rs), and the profile's
//! per-path figures are judged against it (cpi-user/src/sim/accuracy.rs).

use std::collections::HashMap;
use std::ffi::OsString;
use std::process::Stdio;

use cpi_tests::tracer::{program, tool_dir, words_text};
use cpi_user::sim::accuracy::{path_truth, Accuracy};
use cpi_user::sim::path_truth::PathTruth;
use cpi_user::sim::pmu::PmuConfig;
use cpi_user::sim::SimReport;

/// Runs `cmd` under the PMU model; `None` (after saying why) when the tracer is not
/// built — a failure under CI, which builds it with `cargo xtask setup`.
fn simulate(cfg: &PmuConfig, cmd: &[&str]) -> Option<SimReport> {
    if let Err(why) = tool_dir() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this test: {why}"
        );
        cpi_tests::skip(&why);
        return None;
    }
    let cmd: Vec<OsString> = cmd.iter().map(OsString::from).collect();
    let out = cpi_user::sim::simulate(cfg, &cmd, Stdio::null()).expect("simulation runs");
    assert!(out.status.success(), "{}", out.status);
    Some(out)
}

/// The truth's paths by their names (the small programs here have few).
fn named(t: &PathTruth) -> HashMap<Vec<String>, (u64, u64)> {
    t.iter()
        .map(|(k, v)| (k.into_iter().map(String::from).collect(), v))
        .collect()
}

fn show(paths: &HashMap<Vec<String>, (u64, u64)>) {
    let mut v: Vec<_> = paths.iter().collect();
    v.sort_by_key(|(_, t)| std::cmp::Reverse(t.1));
    for (k, (i, c)) in v.iter().take(25) {
        eprintln!("  {i:>10} instr {c:>11} cycles  {}", k.join(" <- "));
    }
}

/// The exact truth per call path of sim_mix is what its source says: the hot loops run
/// under `main`, `fib`'s recursion makes a path per depth, `qsort` in Debian's libc
/// (no frame pointers) calls back into `cmp` below `sort_lib`; and the paths hold every
/// instruction and cycle of the run's decoded code exactly once.
#[test]
fn exact_paths_of_sim_mix_follow_its_calls() {
    let exe = program("sim_mix").unwrap();
    let Some(out) = simulate(&PmuConfig::default(), &[exe.to_str().unwrap(), "1"]) else {
        return;
    };
    let paths = named(&path_truth(&out.truth));
    show(&paths);
    let (instructions, cycles) = out
        .truth
        .insns
        .values()
        .fold((0, 0), |(i, c), t| (i + t.count, c + t.cycles));
    let sum = paths.values().fold((0, 0), |(i, c), t| (i + t.0, c + t.1));
    assert_eq!(sum, (instructions, cycles));
    assert_eq!(out.truth.stats.context_overflows, 0);
    let is = |f: &str, name: &str| f == name || f.starts_with(&format!("{name}."));
    // Each hot leaf function runs under main only, so its one path holds all its
    // instructions (the function-level truth).
    for leaf in ["branchy", "dispatch", "divide"] {
        let under: Vec<_> = paths.iter().filter(|(k, _)| is(&k[0], leaf)).collect();
        assert_eq!(under.len(), 1, "{leaf}: {under:?}");
        let (k, t) = under[0];
        assert_eq!(k[1], "main", "{leaf}: {k:?}");
        let f = out
            .profile
            .accuracy
            .as_ref()
            .unwrap()
            .functions
            .iter()
            .find(|f| is(&f.name, leaf))
            .unwrap();
        assert_eq!(t.0, f.instructions_true, "{leaf}");
    }
    // Recursion: fib paths are runs of fib frames over main, many depths of them.
    let fib: Vec<usize> = paths
        .keys()
        .filter(|k| is(&k[0], "fib"))
        .map(|k| {
            let n = k.iter().take_while(|f| is(f, "fib")).count();
            assert_eq!(k[n], "main", "{k:?}");
            n
        })
        .collect();
    assert!(fib.iter().max() >= Some(&8), "fib depths {fib:?}");
    // qsort's callback: cmp <- (libc's sort frames) <- … <- sort_lib <- main.
    let cmp: Vec<_> = paths.keys().filter(|k| k[0] == "cmp").collect();
    assert!(!cmp.is_empty());
    for k in cmp {
        let at = k.iter().position(|f| is(f, "sort_lib"));
        assert!(at.is_some_and(|i| i >= 2 && k[i + 1] == "main"), "{k:?}");
    }
}

/// Signal handlers and threads: sim_threads raises SIGUSR1 20 times between calls of
/// `work` from `main`, then runs `work` in two threads. The handler runs above the
/// interrupted code (its path passes through `main`), the stack is whole again after
/// each handler returns (so `work` has exactly one path under `main`), and a thread's
/// `work` runs under `worker`.
#[test]
fn signal_handlers_and_threads_keep_exact_stacks() {
    let exe = program("sim_threads").unwrap();
    let Some(out) = simulate(&PmuConfig::default(), &[exe.to_str().unwrap()]) else {
        return;
    };
    assert_eq!(out.truth.stats.interrupts, 20, "one per raise()");
    let paths = named(&path_truth(&out.truth));
    show(&paths);
    let handler: Vec<_> = paths.keys().filter(|k| k[0] == "on_signal").collect();
    assert!(!handler.is_empty());
    for k in handler {
        assert!(k.len() > 2 && k.contains(&"main".to_string()), "{k:?}");
    }
    let work: Vec<_> = paths.keys().filter(|k| k[0] == "work").collect();
    assert_eq!(work.len(), 2, "{work:?}");
    assert!(work.iter().any(|k| k[1] == "main"), "{work:?}");
    assert!(work.iter().any(|k| k[1] == "worker"), "{work:?}");
}

/// How many reported standard errors the median path CPI error may be: half the
/// checked paths beyond 2 errors each has probability C(n, n/2)·0.054^(n/2) at most
/// (0.054: |t₃₁| > 2, the reported errors being estimated from 32 groups, cf.
/// simulate.rs), under 1 % for 3 or more paths.
const MEDIAN_ERRORS: f64 = 2.0;

/// The accuracy bound on CPI per call path.
fn assert_path_bounds(acc: &Accuracy, what: &str) {
    for p in acc.paths.iter().take(15) {
        eprintln!(
            "  {:6.2}% instr true {} est {:.0}; CPI true {:?} est {:?} ± {:?}  {}",
            p.share * 100.0,
            p.instructions_true,
            p.instructions_est,
            p.cpi_true,
            p.cpi_est,
            p.cpi_rel_error,
            p.frames.join(" <- ")
        );
    }
    eprintln!(
        "{what}: path overlap {:?}, CPI error median {:?} ({:?} reported errors) max {:?}, \
         {} without CPI",
        acc.overlap_path,
        acc.path_cpi_error_median,
        acc.path_cpi_errors_reported_median,
        acc.path_cpi_error_max,
        acc.paths_without_cpi
    );
    let overlap = acc.overlap_path.expect("the profile has call paths");
    assert!(overlap >= 0.98, "{what}: path overlap {overlap}");
    let z = acc
        .path_cpi_errors_reported_median
        .expect("paths with >= 2 % of the cycles have a CPI");
    assert!(
        z <= MEDIAN_ERRORS,
        "{what}: median path CPI error is {z:.2} reported errors"
    );
}

/// The per-path bound on sim_mix, whose glibc msort recurses two ways 11 deep: each range
/// goes to the stack it ran under, rebuilt from the typed branch entries
/// (cpi-user/src/profile/stack.rs `add_branch`; by-function attribution alone gave 0.765).
#[test]
fn per_path_accuracy_meets_the_bounds_on_sim_mix() {
    let exe = program("sim_mix").unwrap();
    let Some(out) = simulate(&PmuConfig::default(), &[exe.to_str().unwrap(), "20"]) else {
        return;
    };
    assert_path_bounds(out.accuracy(), "sim_mix");
}

/// The per-path bound on Debian gzip (by-function attribution alone gave 0.979).
#[test]
fn per_path_accuracy_meets_the_bounds_on_debian_gzip() {
    let input = std::env::temp_dir().join(format!("cpi-sim-paths-{}.txt", std::process::id()));
    std::fs::write(&input, words_text(700_000)).unwrap();
    let r = simulate(
        &PmuConfig::default(),
        &["/usr/bin/gzip", "-c", "-6", input.to_str().unwrap()],
    );
    let _ = std::fs::remove_file(&input);
    let Some(out) = r else { return };
    assert_path_bounds(out.accuracy(), "gzip");
}
