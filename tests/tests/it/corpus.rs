//! The PMU model on programs nobody here wrote: Debian's sqlite3, python3, xz and bzip2,
//! and gcc's own cc1, each replayed from its exact trace and judged against that trace.
//!
//! The bounds are the ones a user is promised: instruction overlap ≥ 0.98 with the exact
//! counts, and every function with ≥ 2 % of the cycles within 4 of the errors the
//! profile states for it. The seed is fixed (one seed, one result), so a run is
//! repeatable; any seed is expected to pass, and a miss is a bias, not bad luck (the
//! stated error is a standard error: 4 of them is a 6·10⁻⁵ chance per function).
//!
//! Overlap is itself a sampled figure: with too few samples for a program's code
//! footprint, noise alone keeps it below 0.98 however unbiased the estimate. Measured on
//! main at 3daa6af: python3 here reads 0.977 at the default branch period (2003) and 0.991
//! at 211; cc1, whose run touches 5 489 functions, 0.897 at 2003, 0.969 at 211 and 0.990
//! at 53 — the loss shrinking as 1/√samples, so noise, not bias. Each program is therefore
//! sampled at a period that gives it enough samples for the bound to mean bias.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cpi_common::policy::PeriodPolicy;
use cpi_tests::tracer::{tool_dir, words_text};
use cpi_user::profile::model::Accuracy;
use cpi_user::sim::accuracy::CPI_SHARE_FLOOR;
use cpi_user::sim::pmu::PmuConfig;

/// How many of its own stated errors a function's CPI may miss the exact CPI by.
const K_ERRORS: f64 = 4.0;
/// The smallest instruction overlap with the exact counts.
const MIN_OVERLAP: f64 = 0.98;

/// The branch period of every program but cc1 (the default is 2003).
const BRANCH_PERIOD: u64 = 211;

/// Runs `cmd` under the PMU model with a branch period of `branch_period` (the default
/// jitter), the default cycle period and a fixed seed; `None` after [`cpi_tests::skip`]
/// when the tracer or the program is missing.
fn simulate(cmd: &[OsString], branch_period: u64) -> Option<(u64, Accuracy)> {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return None;
    }
    if !Path::new(&cmd[0]).exists() {
        cpi_tests::skip(format_args!(
            "{} is not installed",
            cmd[0].to_string_lossy()
        ));
        return None;
    }
    let cfg = PmuConfig {
        branch: PeriodPolicy {
            base: branch_period,
            jitter: branch_period >> PeriodPolicy::DEFAULT_JITTER_SHIFT,
        },
        ..PmuConfig::default()
    };
    let out = cpi_user::sim::simulate(&cfg, cmd, Stdio::null()).expect("the simulation runs");
    assert!(out.status.success(), "{cmd:?}: {}", out.status);
    Some((out.pmu.branch_samples, out.accuracy().clone()))
}

/// The promise, with every function's figures printed first so a failure shows them all.
fn assert_promise(what: &str, branch_samples: u64, acc: &Accuracy) {
    eprintln!(
        "{what}: {branch_samples} branch samples; overlap instruction {:.4} block {:.4} \
         function {:.4}; instructions exact {} estimated {:?}",
        acc.overlap_instruction,
        acc.overlap_block,
        acc.overlap_function,
        acc.instructions_true,
        acc.instructions_est
    );
    let checked: Vec<_> = acc
        .functions
        .iter()
        .filter(|f| f.share >= CPI_SHARE_FLOOR)
        .collect();
    let mut misses = Vec::new();
    for f in &checked {
        let z = match (f.cpi_est, f.cpi_true, f.cpi_rel_error) {
            (Some(est), Some(truth), Some(rel)) if rel > 0.0 => (est - truth).abs() / (rel * est),
            _ => f64::INFINITY,
        };
        eprintln!(
            "  {:6.2}% {:<40} CPI exact {:?} est {:?} ± {:?}: {z:.1} errors",
            f.share * 100.0,
            f.name,
            f.cpi_true,
            f.cpi_est,
            f.cpi_rel_error
        );
        if z > K_ERRORS {
            misses.push(format!("{} ({z:.1} errors)", f.name));
        }
    }
    assert!(
        !checked.is_empty(),
        "{what}: no function with ≥ 2 % of cycles"
    );
    assert!(
        acc.overlap_instruction >= MIN_OVERLAP,
        "{what}: instruction overlap {:.4} < {MIN_OVERLAP}",
        acc.overlap_instruction
    );
    assert!(
        misses.is_empty(),
        "{what}: CPI beyond {K_ERRORS} stated errors: {misses:?}"
    );
}

fn args(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

/// A scratch file of `bytes` of text, removed when dropped.
struct Input(PathBuf);

impl Input {
    fn words(tag: &str, bytes: usize) -> Input {
        let p = cpi_tests::temp_dir(tag).join("input.txt");
        std::fs::write(&p, words_text(bytes)).unwrap();
        Input(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The SQL Debian's sqlite3 runs here: an insert of 20 000 rows, an index, a scan and
/// a grouped sort (the HTML report's colour test runs it too).
pub(crate) const SQLITE_SQL: &str = "CREATE TABLE t(a INTEGER, b TEXT); \
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) \
        INSERT INTO t SELECT (x * 7919) % 10007, printf('row %d', x) FROM c; \
        CREATE INDEX ta ON t(a); \
        SELECT count(*), sum(a) FROM t WHERE b LIKE '%7%'; \
        SELECT a, count(*) FROM t GROUP BY a ORDER BY 2 DESC LIMIT 5;";

#[test]
fn debian_sqlite3() {
    let sql = SQLITE_SQL;
    let Some((n, acc)) = simulate(&args(&["/usr/bin/sqlite3", ":memory:", sql]), BRANCH_PERIOD)
    else {
        return;
    };
    assert_promise("sqlite3", n, &acc);
}

#[test]
fn debian_python3() {
    let script = "import json\n\
        d = [{'k': i, 'v': str(i) * 3, 'l': list(range(i % 7))} for i in range(6000)]\n\
        for _ in range(3):\n    d = json.loads(json.dumps(d))\n\
        print(sum(x['k'] for x in d))\n";
    // Through env(1), which the model follows: a fixed hash seed, one trace.
    let cmd = args(&[
        "/usr/bin/env",
        "PYTHONHASHSEED=0",
        "/usr/bin/python3",
        "-S",
        "-c",
        script,
    ]);
    let Some((n, acc)) = simulate(&cmd, BRANCH_PERIOD) else {
        return;
    };
    assert_promise("python3", n, &acc);
}

#[test]
fn debian_xz() {
    let input = Input::words("corpus-xz", 300_000);
    let Some((n, acc)) = simulate(
        &args(&["/usr/bin/xz", "-c", "-6", input.path()]),
        BRANCH_PERIOD,
    ) else {
        return;
    };
    assert_promise("xz", n, &acc);
}

#[test]
fn debian_bzip2() {
    let input = Input::words("corpus-bzip2", 400_000);
    let Some((n, acc)) = simulate(
        &args(&["/usr/bin/bzip2", "-c", "-9", input.path()]),
        BRANCH_PERIOD,
    ) else {
        return;
    };
    assert_promise("bzip2", n, &acc);
}

/// gcc's compiler proper on one of the test programs, preprocessed first so cc1 needs
/// no include paths.
#[test]
fn gcc_cc1() {
    let out = Command::new("gcc")
        .args(["-print-prog-name=cc1"])
        .output()
        .expect("gcc runs");
    let cc1 = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = cpi_tests::temp_dir("corpus-cc1");
    let source = cpi_tests::workspace_root().join("tests/programs/sim_mix.c");
    let pre = dir.join("sim_mix.i");
    cpi_tests::output_ok(
        Command::new("gcc")
            .args(["-E", "-o"])
            .arg(&pre)
            .arg(&source),
    );
    let cmd = args(&[
        &cc1,
        "-quiet",
        "-fpreprocessed",
        "-O2",
        pre.to_str().unwrap(),
        "-o",
        "/dev/null",
    ]);
    // 5 489 functions ran: a quarter of the period for enough samples (see the top).
    let r = simulate(&cmd, 53);
    let _ = std::fs::remove_dir_all(&dir);
    let Some((n, acc)) = r else { return };
    assert_promise("cc1", n, &acc);
}
