//! Source lines from DWARF (cpi-user/src/binary/lines.rs): a program built with `-g` and
//! profiled (a time profile works without a PMU) gets file:line and the source text in
//! `report --annotate`, and its pprof export lets `go tool pprof -list` show the source.

use std::path::Path;
use std::process::Command;

use cpi_tests::{cpi_bpf, output_ok, programs, require_root};

use crate::report_fixture::{have, scratch};

/// `twofunc.c`'s line defining `alpha_work`, where its loop's instructions come from
/// (the loop is a macro expanded on that line).
const ALPHA_LINE: &str =
    "__attribute__((noinline)) void alpha_work(unsigned long n) { WORK(2 * n); }";

fn profiled(dir: &Path) -> Option<std::path::PathBuf> {
    if !require_root("profiling twofunc") {
        return None;
    }
    let exe = programs::compile("twofunc.c", &["-O2", "-g"]).expect("gcc (cargo xtask setup)");
    let json = dir.join("twofunc.json");
    output_ok(
        Command::new(cpi_bpf())
            .args(["--duration", "10", "--format", "json", "--output"])
            .arg(&json)
            .arg("--")
            .arg(&exe)
            .arg("1"),
    );
    Some(json)
}

#[test]
fn annotate_and_pprof_show_source_lines() {
    let dir = scratch("source-lines");
    let Some(json) = profiled(&dir) else {
        return;
    };
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/twofunc.c"))
            .unwrap();
    let line = src.lines().position(|l| l == ALPHA_LINE).unwrap() + 1;

    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--annotate", "alpha_work"])
            .arg(&json),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("twofunc.c:{line}  {ALPHA_LINE}")),
        "no source line {line} in:\n{text}"
    );
    // The header names the function's source file in full.
    assert!(text.contains("/tests/programs/twofunc.c:"), "{text}");

    if !have("go", "version") {
        assert!(
            std::env::var_os("CI").is_none(),
            "`go` not installed (Debian golang-go; cargo xtask setup installs it)"
        );
        cpi_tests::skip(format_args!(
            "`go` not installed (cargo xtask setup installs it)"
        ));
        return;
    }
    let pb = dir.join("twofunc.pb.gz");
    output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--format", "pprof", "--output"])
            .arg(&pb)
            .arg(&json),
    );
    let out = output_ok(
        Command::new("go")
            .args(["tool", "pprof", "-list", "alpha_work"])
            .arg(&pb)
            .env("PPROF_BINARY_PATH", "/nonexistent")
            .env("HOME", std::env::temp_dir()),
    );
    let list = String::from_utf8_lossy(&out.stdout);
    // pprof prints the listed file's lines with their numbers; the binary's bytes
    // (ELF magic) never.
    assert!(list.contains("twofunc.c"), "{list}");
    assert!(
        list.lines()
            .any(|l| l.contains(ALPHA_LINE) && l.contains(&format!(" {line}:"))),
        "no source line {line} in:\n{list}"
    );
    assert!(!list.contains("ELF"), "{list}");
}
