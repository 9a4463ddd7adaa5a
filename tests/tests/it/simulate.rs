//! The PMU model end to end: exact traces of real runs replayed through the production
//! perturbation policy and the production analysis, measured against the exact truth.

use std::ffi::OsString;
use std::process::{Command, Stdio};

use cpi_common::policy::{PeriodPolicy, Perturbation};
use cpi_tests::tracer::{program, tool_dir, words_text};
use cpi_tests::{cpi_bpf, output_ok};
use cpi_user::profile::model::{FunctionAccuracy, Profile};
use cpi_user::profile::StackWeighting;
use cpi_user::sim::accuracy::{Accuracy, CPI_SHARE_FLOOR};
use cpi_user::sim::pmu::{BranchEvent, PmuConfig};
use cpi_user::sim::SimReport;

fn fixed(period: u64) -> PeriodPolicy {
    PeriodPolicy {
        base: period,
        jitter: period >> PeriodPolicy::DEFAULT_JITTER_SHIFT,
    }
}

fn simulate(cfg: &PmuConfig, cmd: &[&str]) -> Option<(SimReport, Profile, Accuracy)> {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return None;
    }
    let cmd: Vec<OsString> = cmd.iter().map(OsString::from).collect();
    let out = cpi_user::sim::simulate(cfg, &cmd, Stdio::null()).expect("simulation runs");
    assert!(out.status.success(), "{}", out.status);
    let profile = out.profile.clone();
    let acc = out.accuracy().clone();
    eprintln!(
        "{:?}: {} branch samples, {} cycle samples; overlap instr {:.4} block {:.4} \
         function {:.4} edge {:.4}; CPI error median {:?} max {:?}",
        cmd,
        out.pmu.branch_samples,
        out.pmu.ip_samples,
        acc.overlap_instruction,
        acc.overlap_block,
        acc.overlap_function,
        acc.overlap_edge,
        acc.cpi_error_median,
        acc.cpi_error_max
    );
    for f in acc.functions.iter().filter(|f| f.share >= 0.02) {
        eprintln!(
            "  {:6.2}% {:<28} CPI true {:?} est {:?} error {:?} reported ± {:?}",
            f.share * 100.0,
            f.name,
            f.cpi_true,
            f.cpi_est,
            f.cpi_error,
            f.cpi_rel_error
        );
    }
    Some((out, profile, acc))
}

/// How many reported standard errors a sampled CPI may be from the truth. The reported
/// error is itself estimated (cpi-user/src/profile/error.rs: 32 interleaved groups of
/// samples), so error / reported error follows Student's t with 31 degrees of freedom at
/// worst: P(|t₃₁| > 5) ≈ 2·10⁻⁵ per function, under 10⁻³ for the ≈ 40 functions the
/// tests of this file check together — a statistically normal run essentially never
/// fails — while a 10 % bias is 5 to 30 reported errors on the functions with ≥ 2 % of
/// the cycles here.
const K_ERRORS: f64 = 5.0;

/// Every function with ≥ `CPI_SHARE_FLOOR` of the cycles has a CPI within
/// [`K_ERRORS`] reported standard errors of the exact one.
fn assert_cpi_within_reported_errors(acc: &Accuracy, what: &str) {
    assert_eq!(acc.functions_without_cpi, 0, "{what}: {acc:?}");
    let checked: Vec<_> = acc
        .functions
        .iter()
        .filter(|f| f.share >= CPI_SHARE_FLOOR)
        .collect();
    assert!(!checked.is_empty(), "{what}: no function to check");
    for f in checked {
        let (Some(est), Some(truth), Some(rel)) = (f.cpi_est, f.cpi_true, f.cpi_rel_error) else {
            panic!("{what}: {} has no CPI estimate: {f:?}", f.name);
        };
        let z = (est - truth).abs() / (rel * est);
        assert!(
            z <= K_ERRORS,
            "{what}: {} CPI {est:.4} vs exact {truth:.4}: {z:.1} reported errors (± {:.2} %)",
            f.name,
            rel * 100.0
        );
    }
}

/// The accuracy bounds at default periods (overlap with the truth per
/// instruction, block, function and edge); CPI judged by its reported error.
fn assert_bounds(acc: &Accuracy, branch_samples: u64) {
    assert!(branch_samples >= 5000, "{branch_samples} branch samples");
    assert!(acc.overlap_instruction >= 0.95, "{acc:?}");
    assert!(acc.overlap_block >= 0.97, "{acc:?}");
    assert!(acc.overlap_function >= 0.99, "{acc:?}");
    assert!(acc.overlap_edge >= 0.95, "{acc:?}");
    assert_cpi_within_reported_errors(acc, "default periods");
}

/// Every taken branch sampled and every cycle sampled: the estimate is the truth, up to
/// what the range algorithm cannot see by design — the first `window` ranges of each
/// thread (no sample has that many entries yet) and ranges that cross a function
/// boundary (dropped as invalid). Both are bounded here.
#[test]
fn period_one_reproduces_exact_counts() {
    let exe = program("sim_mix").unwrap();
    let cfg = PmuConfig {
        branch: fixed(1),
        cycles: fixed(1),
        depth: 4,
        perturbation: Perturbation::None,
        ..PmuConfig::default()
    };
    let Some((out, profile, acc)) = simulate(&cfg, &[exe.to_str().unwrap(), "1"]) else {
        return;
    };
    let lost = &profile.lost;
    eprintln!(
        "short samples {}, invalid ranges {}",
        lost.short_samples, lost.invalid_ranges
    );
    assert!(
        lost.short_samples <= 3,
        "only a thread's first samples are short"
    );
    let ranges = out.truth.stats.ranges;
    assert!(
        (lost.invalid_ranges as f64) < 0.002 * ranges as f64 * 3.0,
        "{} invalid of {} ranges × window 3",
        lost.invalid_ranges,
        ranges
    );
    assert!(acc.overlap_instruction >= 0.998, "{acc:?}");
    assert!(acc.overlap_block >= 0.998, "{acc:?}");
    assert!(acc.overlap_function >= 0.998, "{acc:?}");
    assert!(acc.overlap_edge >= 0.998, "{acc:?}");
    // Cycles are exact (every cycle sampled), instructions nearly: CPI within 0.5 %.
    assert!(acc.cpi_error_max.unwrap() <= 0.005, "{acc:?}");
    let main = acc
        .functions
        .iter()
        .find(|f| f.name.starts_with("branchy"))
        .unwrap();
    assert_eq!(main.instructions_est.round() as u64, main.instructions_true);
}

#[test]
fn default_periods_meet_the_bounds_on_a_test_program() {
    // Data-dependent branches, a jump table, recursion, qsort in libc with a callback.
    let exe = program("sim_mix").unwrap();
    let Some((out, _, acc)) = simulate(&PmuConfig::default(), &[exe.to_str().unwrap(), "20"])
    else {
        return;
    };
    assert_bounds(&acc, out.pmu.branch_samples);
    let names: Vec<&str> = acc
        .functions
        .iter()
        .filter(|f| f.share >= 0.02)
        .map(|f| f.name.as_str())
        .collect();
    for want in ["branchy", "dispatch", "divide", "cmp", "fib"] {
        assert!(
            names.iter().any(|n| n.starts_with(want)),
            "{want} in {names:?}"
        );
    }
}

/// libc's strcasecmp and strncasecmp run off their end into the `_l` variants (no jump
/// joins them), and hardware records the ranges that span both. With every taken branch
/// sampled the estimate is exact, function by function; at default periods the
/// instruction overlap holds. Before such ranges were counted, they were dropped as
/// invalid: 601 occurrences at default periods, overlap 0.91, and the entry points'
/// 60 000 instructions counted 0.
#[test]
fn ranges_running_into_the_next_libc_function_are_counted() {
    let exe = program("str_loop").unwrap();
    let exe_name = exe.to_str().unwrap();
    let cfg = PmuConfig {
        branch: fixed(1),
        cycles: fixed(1),
        depth: 4,
        perturbation: Perturbation::None,
        ..PmuConfig::default()
    };
    let Some((_, _, acc)) = simulate(&cfg, &[exe.to_str().unwrap(), "300"]) else {
        return;
    };
    // libc's and the program's functions; ld.so's relocation has shapes of its own.
    let own = |f: &&FunctionAccuracy| f.binary.ends_with("libc.so.6") || f.binary == exe_name;
    for f in acc
        .functions
        .iter()
        .filter(own)
        .filter(|f| f.instructions_true >= 1000)
    {
        assert_eq!(
            f.instructions_est.round() as u64,
            f.instructions_true,
            "{}: {}",
            f.name,
            brief(&acc)
        );
    }
    assert!(
        acc.functions
            .iter()
            .any(|f| f.name.contains("casecmp") && !f.name.contains("_l")),
        "a strcasecmp entry point ran: {acc:?}"
    );
    let Some((_, profile_d, acc_d)) =
        simulate(&PmuConfig::default(), &[exe.to_str().unwrap(), "20000"])
    else {
        return;
    };
    assert_eq!(profile_d.lost.invalid_ranges, 0, "{:?}", profile_d.lost);
    assert!(acc_d.overlap_instruction >= 0.95, "{}", brief(&acc_d));
}

#[test]
fn default_periods_meet_the_bounds_on_debian_gzip() {
    let input = std::env::temp_dir().join(format!("cpi-sim-gzip-{}.txt", std::process::id()));
    std::fs::write(&input, words_text(700_000)).unwrap();
    let r = simulate(
        &PmuConfig::default(),
        &["/usr/bin/gzip", "-c", "-6", input.to_str().unwrap()],
    );
    let _ = std::fs::remove_file(&input);
    let Some((out, _, acc)) = r else { return };
    assert_bounds(&acc, out.pmu.branch_samples);
}

/// Seed 000's reason for S2. The iteration cost C of sim_sync's loop (exact, from the
/// truth: the instructions that ran once per iteration) divides a fixed cycle period:
/// every cycle sample lands on the same instruction. Measured per layer.
#[test]
fn synchronised_loop_is_fixed_by_the_user_layer() {
    let exe = program("sim_sync").unwrap();
    let exe = exe.to_str().unwrap();
    let iterations = 1_000_003u64;
    let Some((out, _, _)) = simulate(&PmuConfig::default(), &[exe]) else {
        return;
    };
    let per_iter: u64 = out
        .truth
        .insns
        .values()
        .filter(|t| t.count == iterations)
        .map(|t| t.cycles)
        .sum::<u64>()
        / iterations;
    assert!(per_iter > 10, "loop cost {per_iter}");
    let k = PmuConfig::default().thinning as u64;
    // A multiple of C, also after the kernel layer divides it by K.
    let period = per_iter * k * 2003u64.div_ceil(per_iter * k);
    eprintln!("loop cost {per_iter} cycles; fixed cycle period {period}");
    let mut errors = Vec::new();
    for p in [
        Perturbation::None,
        Perturbation::Kernel,
        Perturbation::User,
        Perturbation::Both,
    ] {
        let cfg = PmuConfig {
            cycles: fixed(period),
            perturbation: p,
            ..PmuConfig::default()
        };
        let (_, _, acc) = simulate(&cfg, &[exe]).unwrap();
        // Misattribution: half the L1 distance between true and estimated cycle
        // shares of the functions.
        let tc = acc.cycles_true as f64;
        let te: f64 = acc.functions.iter().map(|f| f.cycles_est).sum();
        let mis: f64 = acc
            .functions
            .iter()
            .map(|f| (f.cycles_true as f64 / tc - f.cycles_est / te).abs())
            .sum::<f64>()
            / 2.0;
        eprintln!(
            "perturb {p:?}: cycles misattributed {:.1}%, CPI error max {:?}",
            mis * 100.0,
            acc.cpi_error_max
        );
        errors.push((p, mis, acc));
    }
    let (none, kernel, user, both) = (&errors[0], &errors[1], &errors[2], &errors[3]);
    assert!(
        none.1 > 0.2,
        "a fixed period misattributes widely: {:.3}",
        none.1
    );
    assert!(
        kernel.1 > 0.2,
        "thinning alone keeps the phase: {:.3}",
        kernel.1
    );
    // `both` keeps a quarter of the records (thinning 4): its reported errors are about
    // twice the full-rate ones, and the CPI is judged by them. Misattribution (the phase)
    // is held alike.
    for (p, mis, acc) in [(user.0, user.1, &user.2), (both.0, both.1, &both.2)] {
        assert!(mis < 0.02, "{p:?}: {mis:.3}");
        assert_cpi_within_reported_errors(acc, &format!("perturbation {p:?}"));
    }
}

#[test]
fn simulate_command_writes_accuracy_json() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let bin = cpi_bpf();
    let exe = program("sim_mix").unwrap();
    let out = output_ok(
        Command::new(bin)
            .args(["simulate", "--format", "json", "--"])
            .arg(&exe)
            .arg("1"),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "simulated");
    let a = &v["accuracy"];
    for k in [
        "overlap_instruction",
        "overlap_block",
        "overlap_function",
        "overlap_edge",
        "cpi_error_median",
        "cpi_error_max",
    ] {
        assert!(a[k].as_f64().is_some(), "accuracy.{k} in {a}");
    }
    let f = &a["functions"][0];
    for k in [
        "name",
        "instructions_true",
        "instructions_est",
        "cpi_true",
        "cpi_est",
    ] {
        assert!(!f[k].is_null(), "functions[0].{k} in {f}");
    }
    // The profile part reads back as a profile file.
    let p = Profile::from_json(&out.stdout).unwrap();
    assert!(!p.processes.is_empty());
    // The accuracy is part of the profile: `report` keeps it and shows it.
    let acc = p.accuracy.clone().expect("accuracy in the profile");
    let dir = cpi_tests::temp_dir("simulate_report");
    let file = dir.join("sim.json");
    std::fs::write(&file, &out.stdout).unwrap();
    let again = output_ok(
        Command::new(bin)
            .arg("report")
            .arg(&file)
            .args(["--format", "json"]),
    );
    let q = Profile::from_json(&again.stdout).unwrap();
    assert_eq!(q.accuracy.as_ref(), Some(&acc));
    let table = output_ok(Command::new(bin).arg("report").arg(&file));
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("accuracy against the exact trace"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "overlap: instruction {:.4}",
            acc.overlap_instruction
        )),
        "{table}"
    );
    // The program's own output went to standard error, not into the JSON.
    assert!(String::from_utf8_lossy(&out.stderr).contains('\n'));
}

/// The overlaps and CPI errors of `acc`, for assertion messages.
fn brief(acc: &Accuracy) -> String {
    format!(
        "overlap instr {:.4} block {:.4} function {:.4} edge {:.4}; CPI error median {:?}",
        acc.overlap_instruction,
        acc.overlap_block,
        acc.overlap_function,
        acc.overlap_edge,
        acc.cpi_error_median
    )
}

/// Branch stacks sampled on cycles (`perf record -b`'s default) at the
/// same number of stacks as taken-branch sampling. Weighted per window they over-weight
/// ranges ahead of slow code (measured: instruction overlap 0.927 on sim_mix, 0.948 on
/// gzip, against ≥ 0.99 on taken branches); weighted by the cycles each window spans
/// they come back to ≥ 0.985 (function overlap ≥ 0.987) with absolute instruction counts (docs/METHOD.md,
/// "Cycle-sampled branch stacks"). The bounds below leave headroom under those figures.
#[test]
fn cycle_sampled_stacks_are_corrected_by_the_cycles_they_span() {
    let mix = program("sim_mix").unwrap();
    let input = std::env::temp_dir().join(format!("cpi-sim-bias-{}.txt", std::process::id()));
    std::fs::write(&input, words_text(700_000)).unwrap();
    let cases: [(&str, Vec<&str>); 2] = [
        ("sim_mix", vec![mix.to_str().unwrap(), "20"]),
        (
            "gzip",
            vec!["/usr/bin/gzip", "-c", "-6", input.to_str().unwrap()],
        ),
    ];
    for (name, cmd) in &cases {
        let Some((on_branches, _, acc_b)) = simulate(&PmuConfig::default(), cmd) else {
            let _ = std::fs::remove_file(&input);
            return;
        };
        // The cycle period that gives as many stacks as the taken-branch period did.
        let mut period = acc_b.cycles_true / on_branches.pmu.branch_samples;
        while !cpi_common::policy::is_prime(period) {
            period += 1;
        }
        let on_cycles = |weighting| PmuConfig {
            branch_event: BranchEvent::Cycles,
            cycles: fixed(period),
            stack_weighting: weighting,
            ..PmuConfig::default()
        };
        let (raw, raw_profile, acc_w) =
            simulate(&on_cycles(Some(StackWeighting::Window)), cmd).unwrap();
        let (fixed_run, _, acc_c) = simulate(&on_cycles(None), cmd).unwrap();
        eprintln!(
            "{name}: cycle period {period}; stacks {} on branches, {} on cycles; instruction \
             overlap {:.4} / {:.4} / {:.4} corrected",
            on_branches.pmu.branch_samples,
            raw.pmu.branch_samples,
            acc_b.overlap_instruction,
            acc_w.overlap_instruction,
            acc_c.overlap_instruction
        );
        let ratio = raw.pmu.branch_samples as f64 / on_branches.pmu.branch_samples as f64;
        assert!(
            (0.9..1.1).contains(&ratio),
            "{name}: same sample count: {ratio}"
        );
        assert_eq!(raw.pmu.branch_samples, fixed_run.pmu.branch_samples);
        // Uncorrected: biased, relative, no CPI.
        assert!(
            acc_w.overlap_instruction < acc_c.overlap_instruction - 0.02,
            "{name}: {}",
            brief(&acc_w)
        );
        assert!(acc_w.cpi_error_median.is_none() && acc_w.functions_without_cpi > 0);
        assert!(raw_profile
            .mode_reason
            .contains("relative instruction profile"));
        // Corrected: most of the bias gone, absolute counts, CPI.
        assert!(
            1.0 - acc_c.overlap_instruction <= 0.4 * (1.0 - acc_w.overlap_instruction),
            "{name}: bias {:.4} corrected vs {:.4}",
            1.0 - acc_c.overlap_instruction,
            1.0 - acc_w.overlap_instruction
        );
        assert!(
            acc_c.overlap_instruction >= 0.975,
            "{name}: {}",
            brief(&acc_c)
        );
        assert!(acc_c.overlap_block >= 0.975, "{name}: {}", brief(&acc_c));
        assert!(acc_c.overlap_function >= 0.98, "{name}: {}", brief(&acc_c));
        assert!(acc_c.overlap_edge >= 0.975, "{name}: {}", brief(&acc_c));
        let scale = acc_c.instructions_est.unwrap() / acc_c.instructions_true as f64;
        assert!((0.99..1.01).contains(&scale), "{name}: {scale}");
        assert!(
            acc_c.cpi_error_median.unwrap() <= 0.05,
            "{name}: {}",
            brief(&acc_c)
        );
    }
    let _ = std::fs::remove_file(&input);
}

/// The calls-only call graph on a program whose call counts are known
/// by construction (`tests/programs/sim_calls.c`: main → outer N times, outer → inner
/// 3N, outer → leaf N). The estimates (Σ period / window over the sampled call records)
/// are within 10 % of the truth (≥ 1 400 call records each here: ≤ 2.7 % standard
/// error); the table and `go tool pprof -peek` show the same edges.
#[test]
fn call_graph_estimates_known_call_counts() {
    let exe = program("sim_calls").unwrap();
    let n = 100_000u64;
    let nstr = n.to_string();
    let cmd = [exe.to_str().unwrap(), nstr.as_str()];
    let Some((_, profile, _)) = simulate(&PmuConfig::default(), &cmd) else {
        return;
    };
    let calls = &profile.processes[0].calls;
    for (caller, callee, want) in [
        ("main", "outer", n),
        ("outer", "inner", 3 * n),
        ("outer", "leaf", n),
    ] {
        let e = calls
            .iter()
            .find(|c| c.caller == caller && c.callee == callee)
            .unwrap_or_else(|| panic!("no {caller} → {callee} in {calls:?}"));
        let err = (e.count - want as f64).abs() / want as f64;
        eprintln!(
            "{caller} → {callee}: {:.0} estimated from {} records, {want} true ({:.1} %)",
            e.count,
            e.samples,
            err * 100.0
        );
        assert!(err < 0.10, "{caller} → {callee}: {} vs {want}", e.count);
        assert!(e.samples >= 100, "{} records", e.samples);
    }
    assert!(
        !calls
            .iter()
            .any(|c| c.caller == "inner" || c.caller == "leaf"),
        "inner and leaf call nothing: {calls:?}"
    );

    // The table view.
    let dir = cpi_tests::temp_dir("sim-calls");
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--callgraph", "--annotate", "inner", "--"])
            .args(cmd),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("call graph (calls only"), "{text}");
    assert!(text.contains("← outer"), "{text}");
    // pprof: `-peek inner` on the `calls` sample type names outer as its caller.
    let pb = dir.join("calls.pb.gz");
    output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--format", "pprof", "--output"])
            .arg(&pb)
            .arg("--")
            .args(cmd),
    );
    if !crate::report_fixture::have("go", "version") {
        cpi_tests::skip(format_args!(
            "the pprof check: `go` not installed (cargo xtask setup installs it)"
        ));
        return;
    }
    // `go tool pprof -peek ^FUNC$` on the calls: its lines and the focus line's index
    // (callers are printed above it, callees below).
    let peek = |func: &str| {
        let out = output_ok(
            Command::new("go")
                .args(["tool", "pprof", "-sample_index=calls", "-peek"])
                .arg(format!("^{func}$"))
                .arg(&pb)
                .env("PPROF_BINARY_PATH", "/nonexistent")
                .env("HOME", std::env::temp_dir()),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("{text}");
        let focus = text
            .lines()
            .position(|l| l.split_whitespace().last() == Some(func) && l.contains('|'))
            .unwrap_or_else(|| panic!("no {func} line: {text}"));
        (text, focus)
    };
    let (text, focus) = peek("inner");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[..focus]
            .iter()
            .any(|l| l.trim_end().ends_with("outer")),
        "outer above inner: {text}"
    );
    let (text, focus) = peek("outer");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[..focus]
            .iter()
            .any(|l| l.trim_end().ends_with("main")),
        "{text}"
    );
    for callee in ["inner", "leaf"] {
        assert!(
            lines[focus + 1..]
                .iter()
                .any(|l| l.trim_end().ends_with(callee)),
            "{callee} below outer: {text}"
        );
    }
}

/// The reported errors are calibrated. One trace of sim_mix replayed
/// with 8 seeds; every function's and block's estimate judged against the exact answer
/// (`cpi_user::sim::calibrate`). A standard error covers the truth at ±1 for 68.3 % and
/// at ±2 for 95.4 % of normal estimates (Student's t₃₁, what 32 groups give at worst:
/// 67.5 % and 94.6 %). The tolerance is 4 binomial standard errors of the share over
/// the units checked (≈ 3·10⁻⁵ per bound to fail by chance) plus that t margin.
/// Checked: no estimate's error is too small (±2 coverage, what every test judging by
/// reported errors relies on: a 10 % bias in any of them fails here), timed CPI's
/// included, and where the model is exact (block CPI) not too large either (±1
/// coverage within the band). Function-level errors are conservative (interleaved
/// replicates, profile/error.rs: ≈ 80–90 % within ±1, docs/METHOD.md, "Error bars").
/// Block timed CPI has few units (only blocks that ranges time alone and whose timing
/// varies: docs/METHOD.md, "Two CPI estimators"), so its band is wide.
#[test]
fn reported_errors_cover_the_truth() {
    use cpi_user::sim::calibrate::calibrate;
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let exe = program("sim_mix").unwrap();
    let cmd: Vec<OsString> = [exe.as_os_str(), "10".as_ref()]
        .iter()
        .map(|s| s.to_os_string())
        .collect();
    let c = calibrate(&PmuConfig::default(), 8, &cmd, Stdio::null()).expect("calibration runs");
    assert!(c.status.success(), "{}", c.status);
    let band = |p: f64, n: u64| 4.0 * (p * (1.0 - p) / n as f64).sqrt() + 0.01;
    for r in &c.rows {
        let (one, two) = r.shares();
        eprintln!(
            "{:<24} {:>6} units: {:5.1} % within ±1, {:5.1} % within ±2",
            r.estimate,
            r.units,
            one * 100.0,
            two * 100.0
        );
        let least = match r.estimate {
            "block timed CPI" => 5,
            "function timed CPI" => 40, // 7 functions above the floor
            _ => 50,
        };
        assert!(r.units >= least, "{}: {} units", r.estimate, r.units);
        for (k, share, target) in [(2, two, 0.954), (1, one, 0.683)] {
            assert!(
                share >= target - band(target, r.units),
                "{}: errors too small: {:.1} % within ±{k} of {} units",
                r.estimate,
                share * 100.0,
                r.units
            );
        }
        if r.estimate == "block CPI" {
            assert!(
                one <= 0.683 + band(0.683, r.units),
                "{}: errors too large: {:.1} % within ±1 of {} units",
                r.estimate,
                one * 100.0,
                r.units
            );
        }
    }
    // The command prints the table.
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--calibrate", "2", "--"])
            .arg(&exe)
            .arg("1"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("over 2 seeds"), "{text}");
    assert!(text.contains("block CPI"), "{text}");
}
