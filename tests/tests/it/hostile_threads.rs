//! A hostile host: a user's process whose main thread exited
//! (`pthread_exit`), in a mount namespace of its own, mapping more files than a
//! profiler under `ulimit -n 1024` keeps descriptors for. Its samples are attributed
//! all the same: an evicted file is reopened through a running thread's `/proc/TID`
//! (cpi-user/src/procmap/captured.rs, `open_mapped_file`). Root only.

use std::path::Path;
use std::process::{Command, Stdio};

use cpi_tests::{compile_c, cpi_bpf, cpu_heavy, output_ok, require_root, temp_dir, KillOnDrop};
use serde_json::Value;

/// The unprivileged user the target runs as (nobody).
const USER: &str = "65534";
/// Copies of tests/programs/worklib.c the target loads: more than the 256 descriptors
/// (a quarter of 1024) the profiler keeps.
const LIBS: usize = 400;

/// `leader_exit_libs LIB DIR` of [`USER`] in a mount namespace where DIR is a tmpfs of
/// its own (so the copies' paths name nothing on the host), once its main thread has
/// exited and its worker runs the copies.
fn start_in_namespace(prog: &Path, lib: &Path, dir: &Path) -> KillOnDrop {
    // unshare, sh and setpriv each exec the next: the child is the program itself.
    let script = "mount -t tmpfs -o mode=1777 cpi-test \"$3\" && \
                  exec setpriv --reuid=\"$USER_ID\" --regid=\"$USER_ID\" --clear-groups \"$@\"";
    let mut child = KillOnDrop(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
            .args([prog, lib, dir])
            .args([&LIBS.to_string(), "60"])
            .env("USER_ID", USER)
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare"),
    );
    let mut said = String::new();
    let mut err = std::io::BufReader::new(child.0.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut err, &mut said).unwrap();
    assert_eq!(said.trim(), format!("loaded {LIBS}"), "leader_exit_libs");
    let pid = child.0.id();
    cpi_tests::wait_leader_exited(pid);
    child
}

/// The row: 1 741 of 1 742 samples were unmapped, for the reopen of an evicted
/// file went through the zombie leader's `/proc/PID/map_files` and `/proc/PID/root`,
/// and the path as mapped names nothing on the host. Now most are in lib_work, and
/// those that are not are counted.
#[test]
fn an_exited_leader_in_a_mount_namespace_with_many_files_is_attributed() {
    if !require_root("cpi-bpf --pid, unshare -m") {
        return;
    }
    let dir = temp_dir("leader-exit-libs");
    let Some(prog) = compile_c("leader_exit_libs.c", &dir, "leader_exit_libs", &["-ldl"]) else {
        return;
    };
    let lib = compile_c("worklib.c", &dir, "worklib.so", &["-shared", "-fPIC"])
        .expect("gcc built leader_exit_libs.c");
    let mount = dir.join("libs");
    std::fs::create_dir(&mount).unwrap();
    // The target (nobody) reads its program and library from here.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _serial = cpu_heavy();
    // Built (on first use) before the program's time starts.
    let bin = cpi_bpf();
    let target = start_in_namespace(&prog, &lib, &mount);
    let pid = target.0.id();
    let out = dir.join("profile.json");
    let run =
        format!("ulimit -n 1024 && exec \"$0\" --pid {pid} --duration 3 --format json -o \"$1\"");
    output_ok(Command::new("sh").args(["-c", &run]).arg(bin).arg(&out));
    drop(target);
    let profile: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let p = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {profile:#}"));
    let total = p["samples"].as_u64().unwrap();
    let in_libs: u64 = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"] == "lib_work")
        .map(|f| f["samples"].as_u64().unwrap())
        .sum();
    let unmapped = profile["lost"]["unmapped_samples"].as_u64().unwrap();
    eprintln!("{total} samples, {in_libs} in lib_work, {unmapped} unmapped");
    assert!(total > 500, "{total} samples");
    assert!(
        in_libs * 10 >= total * 9,
        "{in_libs} of {total} samples in lib_work, {unmapped} unmapped"
    );
    // What is not attributed is counted.
    assert!(total - in_libs <= unmapped + total / 20, "{p:#}");
    let _ = std::fs::remove_dir_all(&dir);
}
