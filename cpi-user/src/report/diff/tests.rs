//! The diff's method on profiles built here: noise, changes, pairing, the table.

use super::*;
use crate::profile::model::{LossReport, Measures, PROFILE_FORMAT_VERSION};
use cpi_common::policy::Perturbation;

/// A function of `cycles` and `instructions` with the given relative errors.
fn func(name: &str, cycles: f64, instructions: f64, rel: f64) -> FunctionProfile {
    FunctionProfile {
        name: name.into(),
        mangled: None,
        binary: "/build/a/prog".into(),
        address: 0x1000,
        size: 0x40,
        samples: 1_000,
        share: 0.0,
        measures: Measures {
            time_ns: None,
            cycles: Some(cycles),
            instructions: Some(instructions),
            cycles_rel_error: Some(rel),
            instructions_rel_error: Some(rel),
            cpi: Some(crate::profile::model::Estimate {
                value: cycles / instructions,
                rel_error: rel * std::f64::consts::SQRT_2,
                samples: 1_000,
            }),
        },
        timed_cpi: None,
        cpi_disagree: false,
        bolt_name: None,
        source: None,
        blocks: vec![],
        edges: vec![],
        lines: vec![],
    }
}

/// One process `prog` (pid `pid`) of `functions`, its totals their sums, in `mode`.
fn profile(mode: Mode, pid: u32, functions: Vec<FunctionProfile>) -> Profile {
    let sum = |f: fn(&FunctionProfile) -> Option<f64>| {
        functions.iter().filter_map(f).reduce(|a, b| a + b)
    };
    let process = ProcessProfile {
        pid,
        comm: "prog".into(),
        identity: Default::default(),
        samples: functions.iter().map(|f| f.samples).sum(),
        branch_samples: 0,
        measures: Measures {
            time_ns: sum(|f| f.measures.time_ns),
            cycles: sum(|f| f.measures.cycles),
            instructions: sum(|f| f.measures.instructions),
            cycles_rel_error: functions.first().and_then(|f| f.measures.cycles_rel_error),
            instructions_rel_error: functions
                .first()
                .and_then(|f| f.measures.instructions_rel_error),
            cpi: functions.first().and_then(|f| f.measures.cpi),
        },
        functions,
        calls: vec![],
        stacks: vec![],
    };
    Profile {
        format_version: PROFILE_FORMAT_VERSION,
        tool_version: "test".into(),
        mode,
        mode_reason: String::new(),
        command: vec![],
        duration_secs: 1.0,
        events: vec![],
        perturbation: Perturbation::Both,
        range_window: 0,
        lost_samples: 0,
        lost: LossReport::default(),
        binaries: vec![],
        processes: vec![process],
        accuracy: None,
        recorded_on: None,
        cpi_withheld: None,
        unread: Vec::new(),
    }
}

/// alpha (2/3 of the work) and beta, at 1 % relative error; alpha × `more`.
fn two_functions(pid: u32, more: f64, wobble: f64) -> Profile {
    profile(
        Mode::Simulated,
        pid,
        vec![
            func("alpha", 2e9 * more * (1.0 + wobble), 1e9 * more, 0.01),
            func("beta", 1e9 * (1.0 - wobble), 5e8, 0.01),
        ],
    )
}

fn unit<'d>(d: &'d Diff, name: &str) -> &'d UnitDiff {
    d.units.iter().find(|u| u.name == name).expect(name)
}

#[test]
fn p_values_are_the_normal_tails() {
    assert!((p_value(0.0) - 1.0).abs() < 1e-7);
    assert!((p_value(1.959_964) - 0.05).abs() < 1e-6);
    assert!((p_value(-2.575_829) - 0.01).abs() < 1e-6);
    assert!((p_value(5.0) - 5.733e-7).abs() < 1e-9);
    assert_eq!(z_score(3.0, 1.5), 2.0);
    assert_eq!(z_score(0.0, 0.0), 0.0);
    assert_eq!(z_score(-1.0, 0.0), f64::NEG_INFINITY);
}

/// The step-up procedure: the largest k with p₍ₖ₎ ≤ kα/m, and all below it.
#[test]
fn benjamini_hochberg_steps_up() {
    let bh = |p: &[f64]| benjamini_hochberg(p, 0.05);
    // Thresholds 0.0125, 0.025, 0.0375, 0.05.
    assert_eq!(bh(&[0.5, 0.02, 0.001, 0.04]), [false, true, true, false]);
    // Each of three at 0.03 fails Bonferroni (0.0167) but all pass together.
    assert_eq!(bh(&[0.03, 0.03, 0.03]), [true, true, true]);
    // 0.04 is not under its own threshold (0.025) but under the third's (0.0375).
    assert_eq!(bh(&[0.04, 0.9, 0.01, 0.035]), [false, false, true, false]);
    assert_eq!(bh(&[0.04, 0.03, 0.01, 0.035]), [true, true, true, true]);
    assert!(bh(&[]).is_empty());
}

#[test]
fn the_same_profile_flags_nothing() {
    let p = two_functions(1, 1.0, 0.0);
    let d = diff(&p, &p, &DiffOptions::default()).unwrap();
    assert_eq!(d.significant, 0);
    assert!(d
        .units
        .iter()
        .flat_map(|u| u.changes.values())
        .all(|c| c.z == 0.0));
}

/// A 1σ wobble of each function between runs (pids differ) is noise.
#[test]
fn changes_within_the_errors_are_noise() {
    let d = diff(
        &two_functions(1, 1.0, 0.0),
        &two_functions(2, 1.0, 0.012),
        &DiffOptions::default(),
    )
    .unwrap();
    assert_eq!(d.significant, 0, "{}", render(&d, 20));
    // alpha: Δ = 2.4e7, σ = 2e7 × √2 · (≈1): z ≈ 0.85.
    let z = unit(&d, "alpha").changes["cycles"].z;
    let expect = 2.4e7 / (2e7f64.powi(2) + (2.024e7f64).powi(2)).sqrt();
    assert!((z - expect).abs() < 1e-9, "{z} {expect}");
    assert_eq!(d.units[0].kind, UnitKind::Process);
}

#[test]
fn thirty_percent_more_work_is_flagged_and_the_rest_is_not() {
    let d = diff(
        &two_functions(1, 1.0, 0.0),
        &two_functions(2, 1.3, 0.0),
        &DiffOptions::default(),
    )
    .unwrap();
    let (a, b) = (unit(&d, "alpha"), unit(&d, "beta"));
    assert!(a.significant && a.changes["cycles"].significant);
    assert!(a.changes["instructions"].significant);
    assert!(!a.changes["cpi"].significant, "CPI did not change");
    assert!((a.changes["cycles"].delta_rel.unwrap() - 0.3).abs() < 1e-9);
    assert!(!b.significant, "{b:?}");
    // beta's share fell, but shares are not the tested basis here...
    assert!(b.changes["cycles_share"].z < -5.0 && !b.changes["cycles_share"].tested);
    // ...and are when asked for: then beta is flagged too.
    let opts = DiffOptions {
        basis: Basis::Share,
        ..Default::default()
    };
    let d = diff(
        &two_functions(1, 1.0, 0.0),
        &two_functions(2, 1.3, 0.0),
        &opts,
    )
    .unwrap();
    assert!(unit(&d, "beta").changes["cycles_share"].significant);
    assert!(!unit(&d, "beta").changes["cycles"].tested);
    // Significant units sort first among functions.
    let first_fn = d
        .units
        .iter()
        .find(|u| u.kind == UnitKind::Function)
        .unwrap();
    assert!(first_fn.significant);
}

/// A time profile's error is Poisson: n samples of one period are ± √n periods.
#[test]
fn time_profiles_use_the_poisson_error_of_their_samples() {
    let timed = |name: &str, n: u64| FunctionProfile {
        samples: n,
        measures: Measures {
            time_ns: Some(n as f64 * 1e6),
            cycles: None,
            instructions: None,
            cycles_rel_error: None,
            instructions_rel_error: None,
            cpi: None,
        },
        ..func(name, 1.0, 1.0, 0.0)
    };
    let base = profile(
        Mode::TimeProfile,
        1,
        vec![timed("f", 1000), timed("g", 1000)],
    );
    let new = profile(
        Mode::TimeProfile,
        2,
        vec![timed("f", 1100), timed("g", 1000)],
    );
    let d = diff(&base, &new, &DiffOptions::default()).unwrap();
    let f = &unit(&d, "f").changes["time_ns"];
    assert!((f.z - 100.0 / 2100f64.sqrt()).abs() < 1e-9, "{f:?}");
    assert!(!unit(&d, "f").changes.contains_key("cpi"));
    // The share's error is binomial, √(s(1 − s)/N).
    let s = &unit(&d, "g").changes["time_ns_share"];
    assert!(
        (s.base_error - (0.25f64 / 2000.0).sqrt()).abs() < 1e-12,
        "{s:?}"
    );
    let cpi = two_functions(1, 1.0, 0.0);
    assert!(matches!(
        diff(&base, &cpi, &DiffOptions::default()),
        Err(DiffError::Incomparable { .. })
    ));
}

/// A function in one profile only is compared with 0 ± 0; processes of one comm sum.
#[test]
fn absent_functions_count_as_zero_and_processes_of_one_comm_sum() {
    let mut new = two_functions(2, 1.0, 0.0);
    new.processes[0]
        .functions
        .push(func("gamma", 1e9, 5e8, 0.01));
    let mut second = two_functions(3, 1.0, 0.0).processes.remove(0);
    second.functions.clear();
    second.measures.cycles = Some(1.0);
    new.processes.push(second);
    let d = diff(&two_functions(1, 1.0, 0.0), &new, &DiffOptions::default()).unwrap();
    let g = unit(&d, "gamma");
    assert!(g.significant && !g.in_base && g.in_new);
    assert_eq!(g.changes["cycles"].base, 0.0);
    assert!((g.changes["cycles"].z - 100.0).abs() < 1e-9);
    assert!(!g.changes.contains_key("cpi"));
    let p = unit(&d, "prog");
    assert_eq!(p.changes["cycles"].new, 3e9 + 1.0);
}

/// `two_functions` as the program `name` (comm and binary), with a libc function.
fn built_as(name: &str, pid: u32, more: f64) -> Profile {
    let mut p = two_functions(pid, more, 0.0);
    let pr = &mut p.processes[0];
    pr.comm = name.into();
    for f in &mut pr.functions {
        f.binary = format!("/build/{name}/{name}");
    }
    let mut libc = func("memcpy", 1e6, 5e5, 0.01);
    libc.binary = "/usr/lib/x86_64-linux-gnu/libc.so.6".into();
    pr.functions.push(libc);
    p
}

/// One program built twice under two names: its main processes are matched with
/// each other and their functions by name; `--match comm` finds nothing in common.
#[test]
fn two_builds_under_two_names_match_by_function() {
    let (base, new) = (built_as("slow_a", 1, 1.0), built_as("slow_b", 2, 1.3));
    let d = diff(&base, &new, &DiffOptions::default()).unwrap();
    let pairing = d.pairing.as_ref().expect("paired");
    assert_eq!(
        (pairing.base_comm.as_str(), pairing.new_comm.as_str()),
        ("slow_a", "slow_b")
    );
    assert_eq!(pairing.base_binaries, ["slow_a"]);
    assert_eq!(pairing.new_binaries, ["slow_b"]);
    let flagged: Vec<&str> = (d.units.iter())
        .filter(|u| u.kind == UnitKind::Function && u.significant)
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(flagged, ["alpha"], "{}", render(&d, 20));
    for name in ["alpha", "beta", "memcpy"] {
        let u = unit(&d, name);
        assert!(u.in_base && u.in_new, "{u:?}");
    }
    assert_eq!(unit(&d, "memcpy").binary.as_deref(), Some("libc.so.6"));
    assert_eq!(unit(&d, "slow_a → slow_b").kind, UnitKind::Process);
    let table = render(&d, 20);
    let words = table.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("slow_a (base) with slow_b (new)"), "{table}");
    assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
    // By comm only: nothing matches, as before.
    let by_comm = DiffOptions {
        matching: Matching::Comm,
        ..Default::default()
    };
    let d = diff(&base, &new, &by_comm).unwrap();
    assert!(d.pairing.is_none());
    let alphas = d.units.iter().filter(|u| u.name == "alpha");
    assert!(alphas
        .map(|u| (u.in_base, u.in_new))
        .eq([(false, true), (true, false)]));
    // One program under one name: nothing to pair.
    let d = diff(&base, &built_as("slow_a", 2, 1.3), &DiffOptions::default()).unwrap();
    assert!(d.pairing.is_none());
    assert!(unit(&d, "alpha").in_new);
}

/// A function with nothing in either profile is no row; σ under 0.1 % keeps a digit.
#[test]
fn the_table_leaves_out_what_is_zero_on_both_sides() {
    let mut base = two_functions(1, 1.0, 0.0);
    let mut idle = func("idle", 0.0, 0.0, 0.0);
    idle.measures.cpi = None;
    base.processes[0].functions.push(idle.clone());
    let mut new = two_functions(2, 1.3, 0.0);
    new.processes[0].functions.push(idle);
    let d = diff(&base, &new, &DiffOptions::default()).unwrap();
    assert!(unit(&d, "idle").is_empty());
    let t = render(&d, 20);
    assert!(!t.contains("idle"), "{t}");
    assert_eq!(
        render::delta_pm(&Change::new((1e9, 0.0), (1.3e9, 9e10))).1,
        "0.03%"
    );
    // A σ too small for two decimals is not printed as none.
    assert_eq!(
        render::delta_pm(&Change::new((1e9, 1e2), (1.3e9, 1e2))).1,
        "<0.01%"
    );
    // A new unit's σ is a percentage too: of its new value.
    assert_eq!(
        render::delta_pm(&Change::new((0.0, 0.0), (2e6, 4e10))),
        ("new".to_string(), "10.0%".to_string())
    );
}

#[test]
fn the_table_fits_80_columns() {
    let mut new = two_functions(2, 1.3, 0.0);
    new.processes[0].functions[0].name = format!("std::vector<{}>::push_back", "x".repeat(90));
    new.processes[0].functions[1].measures.cycles = Some(1e15);
    let d = diff(&two_functions(1, 1.0, 0.0), &new, &DiffOptions::default()).unwrap();
    let t = render(&d, 20);
    assert!(t.contains("* std::vector<"), "{t}");
    for line in t.lines() {
        assert!(
            line.chars().count() <= 80,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    assert!(diff(
        &new,
        &new,
        &DiffOptions {
            alpha: 1.0,
            ..Default::default()
        }
    )
    .is_err());
}
