//! Stripped Go binaries (`go build -ldflags="-s -w"`, as container images ship them: no
//! `.symtab`, no DWARF, no `.eh_frame`): their functions are named from `.gopclntab`,
//! checked against Go's own reader of that table (`go tool addr2line`) on a binary
//! nobody here wrote (Debian's `compile`), and a stripped Go program's time profile
//! carries its samples in its own functions, not "unmapped".

use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::{cpi_bpf, cpu_heavy, output_ok, require_root, temp_dir, workspace_root};
use cpi_user::binary::Binary;
use cpi_user::profile::model::Profile;

/// Debian's Go compiler: built stripped by Go's own release process.
const DEBIAN_COMPILE: &str = "/usr/lib/go-1.19/pkg/tool/linux_amd64/compile";

/// `go` runs, or the test is skipped saying how to install it (a failure under CI).
fn have_go() -> bool {
    let ok = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        cpi_tests::skip("`go` not installed (Debian golang-go; cargo xtask setup installs it)");
    }
    ok
}

/// tests/programs/go_spin.go built stripped in `dir`.
fn go_spin(dir: &Path) -> PathBuf {
    let out = dir.join("go_spin");
    output_ok(
        Command::new("go")
            .args(["build", "-ldflags=-s -w", "-o"])
            .arg(&out)
            .arg(workspace_root().join("tests/programs/go_spin.go"))
            .env("GOCACHE", dir.join("gocache"))
            .env("HOME", dir)
            .env("CGO_ENABLED", "0"),
    );
    out
}

/// The section names `readelf -SW` lists for `bin`.
fn sections(bin: &Path) -> String {
    let out = output_ok(Command::new("readelf").arg("-SW").arg(bin));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Function of each address as `go tool addr2line` (Go's debug/gosym) names it.
fn go_addr2line(bin: &Path, addrs: &[u64]) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new("go")
        .args(["tool", "addr2line"])
        .arg(bin)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .env("HOME", std::env::temp_dir())
        .spawn()
        .unwrap();
    let mut input = String::new();
    for a in addrs {
        input += &format!("{a:#x}\n");
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "go tool addr2line failed");
    // Two lines per address: the function, then file:line.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Debian's stripped `compile` has no symbol table and no `.eh_frame`; every function
/// this project reads from its `.gopclntab` has the name and bounds Go's own reader
/// gives its first and last byte.
#[test]
fn stripped_go_functions_match_go_tool_addr2line() {
    if !have_go() {
        return;
    }
    let bin_path = Path::new(DEBIAN_COMPILE);
    let s = sections(bin_path);
    assert!(
        s.contains(".gopclntab") && !s.contains(".symtab") && !s.contains(".eh_frame"),
        "{DEBIAN_COMPILE} is expected stripped, with .gopclntab only:\n{s}"
    );
    let bin = Binary::open(bin_path).unwrap();
    let funcs: Vec<_> = bin.functions().collect();
    assert!(funcs.len() > 10_000, "{} functions", funcs.len());
    // Every 97th function, both ends.
    let picked: Vec<_> = funcs.iter().step_by(97).collect();
    let addrs: Vec<u64> = picked
        .iter()
        .flat_map(|f| [f.start, f.start + f.size - 1])
        .collect();
    let theirs = go_addr2line(bin_path, &addrs);
    assert_eq!(theirs.len(), addrs.len());
    for (f, names) in picked.iter().zip(theirs.chunks(2)) {
        assert_eq!(
            names,
            [f.name.as_str(), f.name.as_str()],
            "{:#x}+{:#x}",
            f.start,
            f.size
        );
    }
    let main = bin.function_by_name("main.main").expect("main.main named");
    assert_eq!(go_addr2line(bin_path, &[main.start]), ["main.main"]);
}

/// `cpi-bpf -- ./go_spin` of a stripped Go program: its samples are in its own
/// functions (main.spinHot under runtime.main), in the table, the call paths and the
/// header, which no longer says that a user-space loop ran in the kernel.
#[test]
fn a_stripped_go_program_is_profiled_in_its_own_functions() {
    if !require_root("profiling a Go program") || !have_go() {
        return;
    }
    let dir = temp_dir("go-stripped");
    let prog = go_spin(&dir);
    let s = sections(&prog);
    assert!(!s.contains(".symtab") && !s.contains(".eh_frame"), "{s}");
    let _cpu = cpu_heavy();
    let json = dir.join("p.json");
    let out = output_ok(
        Command::new(cpi_bpf())
            .arg("-o")
            .arg(&json)
            .arg("--")
            .arg(&prog)
            .arg("1.5"),
    );
    let p = Profile::from_json(&std::fs::read(&json).unwrap())
        .unwrap_or_else(|e| panic!("{e}: {}", cpi_tests::stderr(&out)));
    let pr = p
        .processes
        .iter()
        .find(|pr| pr.comm == "go_spin")
        .expect("the program's process");
    let top = pr.functions.first().expect("functions");
    assert_eq!(
        (top.name.as_str(), top.binary.as_str()),
        ("main.spinHot", prog.to_str().unwrap()),
        "{:?}",
        pr.functions
            .iter()
            .take(5)
            .map(|f| &f.name)
            .collect::<Vec<_>>()
    );
    // Every sample of the program's code found its function: Go's table covers all of it.
    assert_eq!(p.lost.unmapped_samples, 0, "{:?}", p.lost);
    let hot_path = pr
        .stacks
        .iter()
        .find(|s| {
            s.frames
                .first()
                .is_some_and(|f| f.function == "main.spinHot")
        })
        .expect("a call path ending in main.spinHot");
    // The path reaches the goroutine's root through named Go frames. Its caller
    // main.main is not asserted: spinHot is a leaf Go compiles without a frame, and a
    // frame-pointer walk (no .eh_frame in a stripped Go binary) skips a frameless leaf's
    // caller; unwinding it needs .gopclntab's pcsp table, not read yet.
    assert!(
        hot_path.frames.iter().any(|f| f.function == "runtime.main"),
        "{:?}",
        hot_path.frames
    );
    // The table's header: the kernel's share is of all samples.
    let table = output_ok(Command::new(cpi_bpf()).arg("report").arg(&json));
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        !table.contains("100.0% in the kernel"),
        "{}",
        table.lines().take(6).collect::<Vec<_>>().join("\n")
    );
}
