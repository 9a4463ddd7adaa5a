//! A hostile host: a process in a window (or a profile file) listing more functions or
//! call paths than a process may costs that process only. `report` says it in one
//! line, reads the other processes and windows, and its memory follows the bound, not
//! the list.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use cpi_agent::store::{self, Store};
use cpi_tests::{cpi_bpf, stderr, temp_dir, workspace_root};
use cpi_user::report::file::PROCESS_BOUNDS;

use crate::report_fixture::time_profile;

/// The golden time profile (process 777, `xz`) with a second process, 666 `hog`,
/// listing `functions` functions and `paths` call paths, as JSON.
fn with_a_hog(functions: usize, paths: usize) -> Vec<u8> {
    let golden = std::fs::read(workspace_root().join("tests/golden/time_profile.json")).unwrap();
    let mut p: serde_json::Value = serde_json::from_slice(&golden).unwrap();
    let mut hog = p["processes"][0].clone();
    hog["pid"] = 666.into();
    hog["comm"] = "hog".into();
    let f = serde_json::json!({"name": "f", "binary": "/usr/bin/x", "address": 16,
        "size": 1, "samples": 0, "share": 0.0});
    hog["functions"] = vec![f; functions].into();
    let s = serde_json::json!({"frames": [{"function": "f", "binary": "/usr/bin/x",
        "address": 16}], "end": "complete", "samples": 1, "time_ns": 1.0});
    hog["stacks"] = vec![s; paths].into();
    p["processes"].as_array_mut().unwrap().insert(0, hog);
    serde_json::to_vec(&p).unwrap()
}

/// `cpi-bpf ARGS` under GNU time: its output (time's line taken off stderr) and its
/// peak resident memory in KiB.
fn report(args: &[&std::ffi::OsStr]) -> (Output, u64) {
    let mut r = Command::new("/usr/bin/time")
        .args(["-f", "peak-kib %M"])
        .arg(cpi_bpf())
        .args(args)
        .output()
        .unwrap();
    let err = stderr(&r);
    let (rest, peak) = err.trim_end().rsplit_once('\n').unwrap_or(("", &err));
    let peak = peak
        .trim()
        .strip_prefix("peak-kib ")
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("no peak from /usr/bin/time: {err}"));
    r.stderr = format!("{rest}\n").into_bytes();
    (r, peak)
}

/// The warnings of `r`: one line, naming the hog and `what` it listed too many of.
fn assert_one_warning_on_the_hog(r: &Output, what: &str) {
    let err = stderr(r);
    assert!(r.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("process 666 (hog) not read: more than") && warnings[0].contains(what),
        "{err}"
    );
    // The other process is read.
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(out.contains("lzma_mf_bt4_find"), "{out}");
}

/// A profile file whose one process lists more functions than a process may: that
/// process is left out with one line, the other read, in memory the bound sets.
#[test]
fn a_process_over_its_function_bound_is_left_out_of_a_file() {
    let dir = temp_dir("hostile-bounds-file");
    let file = dir.join("p.json");
    std::fs::write(&file, with_a_hog(PROCESS_BOUNDS.functions + 1000, 0)).unwrap();
    let (r, peak_kib) = report(&["report".as_ref(), file.as_os_str()]);
    eprintln!("peak RSS {peak_kib} KiB");
    assert_one_warning_on_the_hog(&r, "functions");
    assert!(peak_kib < 512 << 10, "peak RSS {peak_kib} KiB");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A store window whose hog lists more call paths than a process may: `report --store`
/// merges the window's other process and the other window, and says what it left out.
#[test]
fn a_process_over_its_path_bound_costs_its_window_nothing_else() {
    let dir = temp_dir("hostile-bounds-store");
    let s = dir.join("store");
    let mut st = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None).unwrap();
    let t = |secs: u64| std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
    st.write(&cpi_agent::Window {
        start: t(0),
        end: t(10),
        profile: time_profile(),
    })
    .unwrap();
    let window = s.join("w-1700000010000-1700000020000.json.gz");
    write_gz(&window, &with_a_hog(1, PROCESS_BOUNDS.paths + 1000));
    let (r, peak_kib) = report(&["report".as_ref(), "--store".as_ref(), s.as_os_str()]);
    eprintln!("peak RSS {peak_kib} KiB");
    assert_one_warning_on_the_hog(&r, "call paths");
    assert!(
        stderr(&r).contains("2 windows from"),
        "both windows merged: {}",
        stderr(&r)
    );
    assert!(peak_kib < 512 << 10, "peak RSS {peak_kib} KiB");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bytes` gzip'd into a store window at `path` (mode 0600, as the agent writes).
fn write_gz(path: &Path, bytes: &[u8]) {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&gz.finish().unwrap()).unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
}
