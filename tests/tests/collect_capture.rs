//! Samples of processes whose binary cannot be reopened by path at the end of the run
//! are still symbolised (issue 8 item 1): what symbolisation needs is captured while the
//! process lives (`cpi-user/src/procmap/capture.rs`). Each case names its hot function
//! and loses under 5 % of its samples as unmapped. Root only (BPF); each test prints
//! why it skips otherwise.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use cpi_tests::{compile_c, cpi_bpf, require_root, temp_dir};
use serde_json::Value;

/// One collection at a time: the cases measure shares of their own samples.
static SERIAL: Mutex<()> = Mutex::new(());

/// `cpi-bpf --format json -- CMD…`, checked to succeed.
fn record(cmd: &[&str]) -> Value {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(cpi_bpf())
        .args(["--format", "json", "--"])
        .args(cmd)
        .output()
        .expect("running cpi-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cpi-bpf failed: {stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}); stderr {stderr}"))
}

/// Samples of the functions named `name` in the whole profile.
fn function_samples(profile: &Value, name: &str) -> u64 {
    profile["processes"]
        .as_array()
        .expect("processes[]")
        .iter()
        .flat_map(|p| p["functions"].as_array().into_iter().flatten())
        .filter(|f| f["name"] == name)
        .map(|f| f["samples"].as_u64().unwrap_or(0))
        .sum()
}

/// Every process's samples.
fn total_samples(profile: &Value) -> u64 {
    profile["processes"]
        .as_array()
        .expect("processes[]")
        .iter()
        .map(|p| p["samples"].as_u64().unwrap_or(0))
        .sum()
}

/// `hot` holds at least `min_share` of the samples and under 5 % are unmapped; no
/// process is nameless.
fn check(profile: &Value, hot: &str, min_share: f64) {
    let total = total_samples(profile);
    let unmapped = profile["lost"]["unmapped_samples"]
        .as_u64()
        .expect("lost.unmapped_samples");
    let hot_samples = function_samples(profile, hot);
    eprintln!("{hot}: {hot_samples} of {total} samples, {unmapped} unmapped");
    assert!(
        total >= 200,
        "too few samples ({total}) to judge: {profile:#}"
    );
    assert!(
        (unmapped as f64) < 0.05 * total as f64,
        "{unmapped} of {total} samples unmapped"
    );
    assert!(
        hot_samples as f64 >= min_share * total as f64,
        "{hot} has {hot_samples} of {total} samples"
    );
    for p in profile["processes"].as_array().unwrap() {
        assert!(
            p["comm"].as_str().is_some_and(|c| !c.is_empty()),
            "nameless process {p:#}"
        );
    }
}

fn programs(tag: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let dir = temp_dir(tag);
    let busy = compile_c("busy.c", &dir, "busy", &["-pthread"])?;
    let spin = compile_c("spin_exec.c", &dir, "spin_exec", &[])?;
    Some((busy, spin))
}

/// A process spins in `pre_exec_spin`, then execs `busy` (`hot_spin`): the first image
/// is replaced long before the end, yet both halves are named.
#[test]
fn samples_from_before_an_exec_are_symbolised() {
    if !require_root("samples_from_before_an_exec_are_symbolised") {
        return;
    }
    let Some((busy, spin)) = programs("capture-exec") else {
        return;
    };
    let profile = record(&[spin.to_str().unwrap(), "1.5", busy.to_str().unwrap(), "1.5"]);
    check(&profile, "pre_exec_spin", 0.3);
    check(&profile, "hot_spin", 0.3);
}

/// `busy` is deleted while it runs and exits a second before the end of the run.
#[test]
fn a_deleted_binary_that_exited_is_symbolised() {
    if !require_root("a_deleted_binary_that_exited_is_symbolised") {
        return;
    }
    let Some((busy, _)) = programs("capture-deleted") else {
        return;
    };
    let script = format!(
        "{b} 1.5 & sleep 0.3; rm {b}; wait; sleep 1",
        b = busy.display()
    );
    let profile = record(&["sh", "-c", &script]);
    assert!(!busy.exists(), "the binary was deleted");
    check(&profile, "hot_spin", 0.6);
}

/// `busy` runs from a tmpfs mounted only inside a private mount namespace: its path
/// names nothing outside it, and the namespace is gone by the end.
#[test]
fn a_binary_in_another_mount_namespace_is_symbolised() {
    if !require_root("a_binary_in_another_mount_namespace_is_symbolised") {
        return;
    }
    let Some((busy, _)) = programs("capture-mntns") else {
        return;
    };
    let mnt = busy.parent().unwrap().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let script = format!(
        "mount -t tmpfs none {m} && cp {b} {m}/busy && exec {m}/busy 2",
        m = mnt.display(),
        b = busy.display()
    );
    let profile = record(&[
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]);
    assert!(
        !Path::new(&mnt).join("busy").exists(),
        "the binary is visible outside its namespace"
    );
    check(&profile, "hot_spin", 0.6);
}
