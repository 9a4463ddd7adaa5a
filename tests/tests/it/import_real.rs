//! `cpi-bpf import-perf` on recordings made by others on real Intel machines
//! (tests/data/README.md says where each came from), checked against tools that do not
//! come from this project: `perf report` (cycles per function) and `llvm-profgen-19`
//! (the ranges between branch records). Both are installed by `cargo xtask setup`; a
//! machine without them fails these tests rather than skipping them.

use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::{cpi_bpf, output_ok, temp_dir, workspace_root};
use cpi_user::binary::Binary;
use cpi_user::profile::model::{Mode, Profile};

/// The path `propeller_sample_1.perfdata1` recorded its binary under.
const SKYLAKE_BIN: &str = "/build/work/11ef31a2a8be9640fa8d4c917e76f0db3923/google3/blaze-out/\
                           k8-opt/genfiles/devtools/crosstool/autofdo/testdata/propeller_sample_1.bin.gen";

fn data(name: &str) -> PathBuf {
    workspace_root().join("tests/data/autofdo").join(name)
}

/// `tool --version` runs, or the test fails saying how to install it.
fn require(tool: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{tool} is needed to check imports of real recordings: `cargo xtask setup` installs it"
    );
}

fn import_json(args: &[&str], file: &Path) -> (Profile, String) {
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["import-perf", "--format", "json"])
            .args(args)
            .arg(file),
    );
    (
        Profile::from_json(&out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// AutoFDO's Skylake-SP recording (`perf record -e cycles -b`, freq mode, timed LBR):
/// its header stores lld's 8-byte build-id zero-padded, which perf accepts and so must
/// we; cycle shares per function equal `perf report --no-branch-stack`; the per-
/// instruction counts from its `perf script` text equal llvm-profgen's range counts.
#[test]
fn skylake_recording_agrees_with_perf_report_and_llvm_profgen() {
    require("perf");
    require("llvm-profgen-19");
    let dir = temp_dir("real-skylake");
    let symfs = dir.join("symfs");
    let at = symfs.join(SKYLAKE_BIN.trim_start_matches('/'));
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::fs::copy(data("propeller_sample_1.bin"), &at).unwrap();
    let recording = data("propeller_sample_1.perfdata1");

    // perf.data: the symfs copy is checked against the padded recorded build-id.
    let symfs_arg = symfs.display().to_string();
    let (p, _) = import_json(&["--symfs", &symfs_arg], &recording);
    assert_eq!(p.mode, Mode::Cpi, "{}", p.mode_reason);
    assert!(p.mode_reason.contains("timed LBR"), "{}", p.mode_reason);
    let perf = output_ok(
        Command::new("perf")
            .args(["report", "--no-branch-stack", "--stdio", "-q"])
            .args(["--no-children", "--sort", "sym", "--symfs"])
            .arg(&symfs)
            .arg("-i")
            .arg(&recording),
    );
    let perf = String::from_utf8_lossy(&perf.stdout).into_owned();
    let perf_share = |name: &str| -> f64 {
        perf.lines()
            .find(|l| l.trim_end().ends_with(&format!("] {name}")))
            .and_then(|l| l.trim().split('%').next()?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in perf report:\n{perf}"))
    };
    let funcs = &p.processes[0].functions;
    for name in ["main", "compute_flag"] {
        let f = funcs.iter().find(|f| f.name == name).unwrap();
        let (ours, theirs) = (100.0 * f.share, perf_share(name));
        // perf prints two decimals.
        assert!(
            (ours - theirs).abs() <= 0.005 + 1e-9,
            "{name}: {ours:.4} % of cycles, perf report {theirs} %"
        );
    }

    // Text: every range of each 32-entry stack (window 31), each sample weighing 1,
    // so an instruction's count × 31 is the number of ranges holding it.
    let script = |fields: &str, out: &Path| {
        let o = output_ok(
            Command::new("perf")
                .args(["script", "-F", fields, "--show-mmap-events", "--symfs"])
                .arg(&symfs)
                .arg("-i")
                .arg(&recording),
        );
        std::fs::write(out, o.stdout).unwrap();
    };
    let ours_txt = dir.join("ours.txt");
    let theirs_txt = dir.join("profgen.txt");
    script("pid,tid,ip,brstack", &ours_txt);
    script("ip,brstack", &theirs_txt);
    let binary_arg = format!("{SKYLAKE_BIN}={}", at.display());
    let (t, _) = import_json(
        &[
            "--binary",
            &binary_arg,
            "--event",
            "other",
            "--window",
            "31",
        ],
        &ours_txt,
    );
    // llvm-profgen finds the binary by the mmap events' file name.
    let named = dir.join("propeller_sample_1.bin.gen");
    std::fs::copy(&at, &named).unwrap();
    let ranges = cpi_tests::profgen::ranges(&theirs_txt, &named, &dir.join("profgen.out"));
    assert!(ranges.len() > 5, "llvm-profgen: {ranges:?}");
    // Its offsets count from the executable segment's page.
    let bin = Binary::open(&at).unwrap();
    let base = bin.segments.iter().find(|s| s.executable).unwrap().vaddr & !0xfff;
    let mut compared = 0;
    for f in &t.processes[0].functions {
        for line in &f.lines {
            let theirs = cpi_tests::profgen::count_at(&ranges, base, line.address);
            assert!(
                (line.count * 31.0 - theirs).abs() < 1e-6 * theirs.max(1.0),
                "{} {:#x}: ours {} × 31, llvm-profgen {theirs}",
                f.name,
                line.address,
                line.count
            );
            compared += 1;
        }
    }
    assert!(compared >= 80, "{compared} instructions compared");
}

/// A Haswell-E recording written by a perf newer than this machine's (136-byte event
/// attributes, which perf 6.1 refuses): read; the recorded ld.so is another build
/// than this machine's file at that path, so that file is not used and the import
/// says so rather than failing; the test's two loop functions carry the cycles.
#[test]
fn newer_perf_recording_with_another_build_of_a_library() {
    let bin = data("hierarchical_discriminator_test.x86_64");
    let bin_arg = format!("hierarchical_discriminator_test={}", bin.display());
    let (p, notes) = import_json(
        &["--binary", &bin_arg],
        &data("hierarchical_discriminator_test.x86_64.perf.data"),
    );
    assert_eq!(p.mode, Mode::Cpi, "{}", p.mode_reason);
    assert!(p.mode_reason.contains("cycles:P"), "{}", p.mode_reason);
    let ld = Path::new("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
    let recorded_ld = "da07864eb4c1b06504b8688d25d7e84759fe708d";
    if Binary::open(ld).is_ok_and(|b| b.build_id.as_deref() != Some(recorded_ld)) {
        assert!(notes.contains("another build"), "{notes}");
        assert!(p
            .processes
            .iter()
            .flat_map(|p| &p.functions)
            .all(|f| !f.binary.contains("ld-linux") || f.binary.contains("another build")));
    }
    let top: Vec<&str> = p.processes[0].functions[..2]
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(top, ["test_vector_loop", "test_unroll"]);
    let cycles: f64 = p.processes[0].functions[..2].iter().map(|f| f.share).sum();
    assert!(cycles > 0.85, "the loops hold {cycles} of the cycles");
}
