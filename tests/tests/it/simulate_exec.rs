//! `simulate` follows exec and says what it does not follow (cpi-user/src/sim/run.rs):
//! a wrapper that execs the program is profiled as the program, and a shell's forked
//! children are counted, not traced.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cpi_common::policy::{PeriodPolicy, Perturbation};
use cpi_tests::tracer::tool_dir;
use cpi_tests::{compile_c, copy_program, cpi_bpf, output_ok};
use cpi_user::profile::model::FunctionAccuracy;
use cpi_user::sim::pmu::PmuConfig;
use cpi_user::sim::SimReport;

/// The functions of tests/programs/sim_calls.c.
const FUNCTIONS: [&str; 4] = ["main", "outer", "inner", "leaf"];

/// A private copy of sim_calls and a `#!/bin/sh` script beside it that execs it.
fn program_and_wrapper(tag: &str) -> Option<(PathBuf, PathBuf)> {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return None;
    }
    let dir = cpi_tests::temp_dir(tag);
    let exe = compile_c("sim_calls.c", &dir, "sim_calls", &[])?;
    // Written under another name and copied by `cp`, as copy_program explains.
    let text = dir.join("wrapper.txt");
    std::fs::write(&text, format!("#!/bin/sh\nexec {} \"$@\"\n", exe.display())).unwrap();
    std::fs::set_permissions(&text, std::fs::Permissions::from_mode(0o755)).unwrap();
    let wrapper = dir.join("wrapper.sh");
    copy_program(&text, &wrapper);
    Some((exe, wrapper))
}

/// Every branch and every cycle sampled, no perturbation: a deterministic replay whose
/// estimates are (nearly) the exact counts.
fn every_event() -> PmuConfig {
    let one = PeriodPolicy { base: 1, jitter: 0 };
    PmuConfig {
        branch: one,
        cycles: one,
        depth: 4,
        perturbation: Perturbation::None,
        ..PmuConfig::default()
    }
}

fn simulate(cmd: &[&Path]) -> SimReport {
    let cmd: Vec<OsString> = cmd.iter().map(|p| p.as_os_str().to_owned()).collect();
    let out = cpi_user::sim::simulate(&every_event(), &cmd, Stdio::null()).expect("simulates");
    assert!(out.status.success(), "{:?}: {}", cmd, out.status);
    out
}

fn function<'a>(r: &'a SimReport, name: &str) -> &'a FunctionAccuracy {
    r.accuracy()
        .functions
        .iter()
        .find(|f| f.name == name && f.binary.ends_with("/sim_calls"))
        .unwrap_or_else(|| panic!("{name} of sim_calls not in {:?}", r.accuracy().functions))
}

#[test]
fn a_wrapper_that_execs_is_profiled_as_the_program() {
    let Some((exe, wrapper)) = program_and_wrapper("simulate_exec_wrapper") else {
        return;
    };
    let n = Path::new("3000");
    let direct = simulate(&[&exe, n]);
    let wrapped = simulate(&[&wrapper, n]);
    assert!(
        direct.truth.replaced.is_empty(),
        "{:?}",
        direct.truth.replaced
    );
    // The truth and the profile are of the program the script exec'd...
    assert_eq!(wrapped.truth.program, exe.display().to_string());
    let pids: Vec<_> = wrapped.profile.processes.iter().map(|p| &p.comm).collect();
    assert_eq!(pids, ["sim_calls"]);
    for name in FUNCTIONS {
        let (d, w) = (function(&direct, name), function(&wrapped, name));
        assert!(d.instructions_true > 0, "{name}");
        assert_eq!(
            w.instructions_true, d.instructions_true,
            "{name}: exact counts"
        );
        assert_eq!(
            w.instructions_est, d.instructions_est,
            "{name}: the same samples as the direct run"
        );
    }
    // ...and what ran before the exec is named and counted, not profiled.
    let before = &wrapped.truth.replaced;
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0].path, wrapper.display().to_string());
    assert!(before[0].instructions > 10_000, "{before:?}");
    assert!(!wrapped
        .profile
        .binaries
        .iter()
        .any(|b| b.path == "/bin/dash" || b.path == "/usr/bin/dash"));
    let reason = &wrapped.profile.mode_reason;
    assert!(
        reason.contains(&format!(
            "the command exec'd: {} (a script for /bin/sh, {} instructions) → {}",
            wrapper.display(),
            before[0].instructions,
            exe.display()
        )),
        "{reason}"
    );
}

#[test]
fn a_shells_forked_children_are_counted_not_traced() {
    let Some((exe, wrapper)) = program_and_wrapper("simulate_exec_fork") else {
        return;
    };
    let bin = cpi_bpf();
    // Each child prints its result: both ran (natively) although neither is traced.
    let script = format!("{0} 2000; {0} 3000", exe.display());
    let out = output_ok(
        Command::new(bin)
            .args(["simulate", "--format", "json", "--", "/bin/sh", "-c"])
            .arg(&script),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let results = stderr
        .lines()
        .filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
        .count();
    assert_eq!(results, 2, "{stderr}");
    let notes: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("cpi-bpf: note:"))
        .collect();
    assert_eq!(
        notes,
        ["cpi-bpf: note: 2 child processes created, not traced (simulate follows exec, not fork)"],
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // --calibrate says the same before its table.
    let cal = output_ok(
        Command::new(bin)
            .args(["simulate", "--calibrate", "2", "--", "/bin/sh", "-c"])
            .arg(&script),
    );
    let cal_err = String::from_utf8_lossy(&cal.stderr);
    assert!(cal_err.lines().any(|l| l == notes[0]), "{cal_err}");
    assert!(
        String::from_utf8_lossy(&cal.stdout).contains("function CPI"),
        "{}",
        String::from_utf8_lossy(&cal.stdout)
    );
    assert_eq!(v["processes"][0]["comm"], "sh", "{}", v["processes"]);
    let binaries = v["binaries"].to_string();
    assert!(!binaries.contains("sim_calls"), "{binaries}");
    assert!(
        v["mode_reason"]
            .as_str()
            .unwrap()
            .ends_with("; 2 child processes created, not traced (simulate follows exec, not fork)"),
        "{}",
        v["mode_reason"]
    );

    // A script as the command: said before tracing, and its exec followed.
    let out = output_ok(
        Command::new(bin)
            .args(["simulate", "--format", "json", "--"])
            .arg(&wrapper)
            .arg("1000"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        format!(
            "cpi-bpf: note: {} is a script: Valgrind traces its interpreter, /bin/sh, and \
             follows its exec",
            wrapper.display()
        ),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["processes"][0]["comm"], "sim_calls", "{}", v["processes"]);
}
