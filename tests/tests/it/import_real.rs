//! `cpi-bpf import-perf` on recordings made by others on real Intel machines
//! (tests/data/README.md says where each came from), checked against tools that do not
//! come from this project: `perf report` (cycles per function) and `llvm-profgen-19`
//! (the ranges between branch records). Both are installed by `cargo xtask setup`; a
//! machine without them fails these tests rather than skipping them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::{cpi_bpf, output_ok, temp_dir, workspace_root};
use cpi_user::binary::Binary;
use cpi_user::profile::model::{Mode, Profile};

/// The path `propeller_sample_1.perfdata1` recorded its binary under.
pub(crate) const SKYLAKE_BIN: &str = "/build/work/11ef31a2a8be9640fa8d4c917e76f0db3923/google3/blaze-out/\
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

/// A real recording and what it is checked on.
struct Recording<'a> {
    /// perf.data as perf 6.1 reads it (`recording` itself, or a copy in its layout).
    perf_input: &'a Path,
    /// The recording as published.
    recording: &'a Path,
    /// The recorded path of the main binary, and the binary.
    binary: (&'a str, PathBuf),
    /// Functions whose cycle shares are compared.
    functions: &'a [&'a str],
    /// Entries of its branch stacks (LBR depth).
    depth: usize,
    dir: PathBuf,
}

/// Imports `r` and checks it against perf 6.1 and llvm-profgen-19: cycle shares per
/// function equal `perf report --no-branch-stack`'s; from its `perf script` text, every
/// range of each stack (window depth − 1), each sample weighing 1, makes an
/// instruction's count × (depth − 1) the number of ranges holding it, which is what
/// llvm-profgen counts. Returns the perf.data import and the instructions compared.
fn check_against_perf_and_profgen(r: &Recording) -> (Profile, String, usize) {
    require("perf");
    require("llvm-profgen-19");
    let symfs = r.dir.join("symfs");
    let at = symfs.join(r.binary.0.trim_start_matches('/'));
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::fs::copy(&r.binary.1, &at).unwrap();
    // perf.data: the symfs copy is checked against the recorded build-id.
    let symfs_arg = symfs.display().to_string();
    let (p, notes) = import_json(&["--symfs", &symfs_arg], r.recording);
    let perf = output_ok(
        Command::new("perf")
            .args(["report", "--no-branch-stack", "--stdio", "-q"])
            .args(["--no-children", "--sort", "sym", "--symfs"])
            .arg(&symfs)
            .arg("-i")
            .arg(r.perf_input),
    );
    let perf = String::from_utf8_lossy(&perf.stdout).into_owned();
    for name in r.functions {
        let theirs: f64 = perf
            .lines()
            .find(|l| l.trim_end().ends_with(&format!("] {name}")))
            .and_then(|l| l.trim().split('%').next()?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in perf report:\n{perf}"));
        let f = p.processes[0]
            .functions
            .iter()
            .find(|f| f.name == *name)
            .unwrap();
        // perf prints two decimals.
        assert!(
            (100.0 * f.share - theirs).abs() <= 0.005 + 1e-9,
            "{name}: {:.4} % of cycles, perf report {theirs} %",
            100.0 * f.share
        );
    }

    let script = |fields: &str, out: &Path| {
        let o = output_ok(
            Command::new("perf")
                .args(["script", "-F", fields, "--show-mmap-events", "--symfs"])
                .arg(&symfs)
                .arg("-i")
                .arg(r.perf_input),
        );
        std::fs::write(out, o.stdout).unwrap();
    };
    let ours_txt = r.dir.join("ours.txt");
    let theirs_txt = r.dir.join("profgen.txt");
    script("pid,tid,ip,brstack", &ours_txt);
    script("ip,brstack", &theirs_txt);
    let window = (r.depth - 1).to_string();
    let (t, _) = import_json(
        &[
            "--symfs", &symfs_arg, "--event", "other", "--window", &window,
        ],
        &ours_txt,
    );
    // llvm-profgen finds the binary by the mmap events' file name.
    let named = r.dir.join(Path::new(r.binary.0).file_name().unwrap());
    std::fs::copy(&at, &named).unwrap();
    let ranges = cpi_tests::profgen::ranges(&theirs_txt, &named, &r.dir.join("profgen.out"));
    assert!(ranges.len() > 5, "llvm-profgen: {ranges:?}");
    // Its offsets count from the executable segment's page.
    let bin = Binary::open(&at).unwrap();
    let base = bin.segments.iter().find(|s| s.executable).unwrap().vaddr & !0xfff;
    let mut compared = 0;
    // llvm-profgen disassembles the sections' symbols only, so not `.plt` (whose stubs
    // we name `memcpy@plt`): ranges there count nothing in its output.
    for f in t.processes.iter().flat_map(|p| &p.functions) {
        if f.name.ends_with("@plt") {
            continue;
        }
        for line in &f.lines {
            let theirs = cpi_tests::profgen::count_at(&ranges, base, line.address);
            assert!(
                (line.count * (r.depth - 1) as f64 - theirs).abs() < 1e-6 * theirs.max(1.0),
                "{} {:#x}: ours {} × {window}, llvm-profgen {theirs}",
                f.name,
                line.address,
                line.count
            );
            compared += 1;
        }
    }
    (p, notes, compared)
}

/// AutoFDO's Skylake-SP recording (`perf record -e cycles -b`, freq mode, timed LBR):
/// its header stores lld's 8-byte build-id zero-padded, which perf accepts and so must
/// we (the symfs copy would otherwise be refused as another build).
#[test]
fn skylake_recording_agrees_with_perf_report_and_llvm_profgen() {
    let recording = data("propeller_sample_1.perfdata1");
    let (p, _, compared) = check_against_perf_and_profgen(&Recording {
        perf_input: &recording,
        recording: &recording,
        binary: (SKYLAKE_BIN, data("propeller_sample_1.bin")),
        functions: &["main", "compute_flag"],
        depth: 32,
        dir: temp_dir("real-skylake"),
    });
    assert_eq!(p.mode, Mode::Cpi, "{}", p.mode_reason);
    assert!(p.mode_reason.contains("timed LBR"), "{}", p.mode_reason);
    assert!(compared >= 80, "{compared} instructions compared");
    // The two CPI estimators agree within 3 combined errors once each
    // timed occurrence weighs what its range count does (unweighted, cycle-sampled
    // windows favour slow executions: main 0.54 vs 0.56, compute_flag 1.28 vs 1.38).
    for name in ["main", "compute_flag"] {
        let f = p
            .processes
            .iter()
            .flat_map(|pr| &pr.functions)
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} in the profile"));
        let (cpi, timed) = (
            f.measures.cpi.expect("CPI"),
            f.timed_cpi.expect("timed CPI"),
        );
        assert!(
            !f.cpi_disagree,
            "{name}: CPI {:.3} ± {:.1} % vs timed {:.3} ± {:.1} %",
            cpi.value,
            cpi.rel_error * 100.0,
            timed.value,
            timed.rel_error * 100.0
        );
    }
}

/// A copy of perf.data `src` whose event attributes are perf 6.1's 128-byte struct:
/// files from perf 6.3+ carry 136 (`config3`), which perf 6.1 refuses ("unsupported
/// ABI"). Only done where the extra bytes are zero, so the events are unchanged.
pub(crate) fn with_128_byte_attrs(src: &Path, dst: &Path) {
    let mut b = std::fs::read(src).unwrap();
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (entry, off, size) = (
        u64_at(&b, 16) as usize,
        u64_at(&b, 24) as usize,
        u64_at(&b, 32) as usize,
    );
    let attr = entry - 16;
    let mut packed = Vec::new();
    for e in b[off..off + size].chunks(entry) {
        assert!(e[128..attr].iter().all(|&x| x == 0), "config3 is set");
        let mut a = e[..128].to_vec();
        a[4..8].copy_from_slice(&128u32.to_le_bytes());
        packed.extend(a);
        packed.extend(&e[attr..]);
    }
    b[off..off + packed.len()].copy_from_slice(&packed);
    b[16..24].copy_from_slice(&(128u64 + 16).to_le_bytes());
    b[32..40].copy_from_slice(&(packed.len() as u64).to_le_bytes());
    std::fs::write(dst, b).unwrap();
}

/// A Haswell-E recording (`perf record -e cycles:P -b`, 16-entry LBR) written by a perf
/// newer than this machine's: read as published, and checked against perf 6.1 on a
/// copy in perf 6.1's attribute layout. The recorded ld.so is another build than this
/// machine's file at that path: not used, and said, rather than failing the import.
#[test]
fn haswell_recording_agrees_with_perf_report_and_llvm_profgen() {
    let dir = temp_dir("real-haswell");
    let recording = data("hierarchical_discriminator_test.x86_64.perf.data");
    let for_perf = dir.join("attrs128.data");
    with_128_byte_attrs(&recording, &for_perf);
    let (p, notes, compared) = check_against_perf_and_profgen(&Recording {
        perf_input: &for_perf,
        recording: &recording,
        binary: (
            "/local/home/kvivekananda/hierarchical_discriminator_test",
            data("hierarchical_discriminator_test.x86_64"),
        ),
        functions: &["test_vector_loop", "test_unroll"],
        depth: 16,
        dir,
    });
    assert_eq!(p.mode, Mode::Cpi, "{}", p.mode_reason);
    assert!(p.mode_reason.contains("cycles:P"), "{}", p.mode_reason);
    assert!(compared >= 50, "{compared} instructions compared");
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
}

/// A Westmere-EP recording on a taken-branch event (`perf record -c 500000 -b -e
/// br_inst_exec:taken`, perf 3.3, Linux 2.6.34, 16-entry LBR without cycles): every
/// instruction's range count equals llvm-profgen's; the process is named by its exec's
/// COMM (which kernels before 3.16 do not flag as an exec) and holds the samples and
/// events `perf script` and `perf report` count. No function shares are compared: the
/// profile has no cycles, and perf's per-function shares are of the samples' IPs.
#[test]
fn westmere_taken_branch_recording_agrees_with_perf_and_llvm_profgen() {
    let recording = data("test.lbr");
    let (p, _, compared) = check_against_perf_and_profgen(&Recording {
        perf_input: &recording,
        recording: &recording,
        binary: ("/export/hda3/tmp/test.binary", data("test.binary")),
        functions: &[],
        depth: 16,
        dir: temp_dir("real-westmere"),
    });
    assert_eq!(p.mode, Mode::Instructions, "{}", p.mode_reason);
    assert!(
        p.mode_reason.contains("executed, not retired"),
        "{}",
        p.mode_reason
    );
    // The event as the recording names it (`perf evlist`), its code after it.
    assert!(
        p.mode_reason.contains(
            "branch stacks on br_inst_exec:taken (0x534088; period 500000; the code read as \
             counted on its CPU, GenuineIntel,6,44,2)"
        ),
        "{}",
        p.mode_reason
    );
    let evlist = output_ok(Command::new("perf").args(["evlist", "-i"]).arg(&recording));
    assert_eq!(
        String::from_utf8_lossy(&evlist.stdout).trim(),
        "br_inst_exec:taken"
    );
    eprintln!("{compared} instructions compared with llvm-profgen");
    assert!(compared >= 2500, "{compared} instructions compared");
    let script = output_ok(
        Command::new("perf")
            .args(["script", "-F", "comm,pid", "-i"])
            .arg(&recording),
    );
    let mut theirs = std::collections::BTreeMap::new();
    for l in String::from_utf8_lossy(&script.stdout).lines() {
        let mut w = l.split_whitespace();
        let (comm, pid) = (w.next().unwrap(), w.next().unwrap().parse::<u32>().unwrap());
        *theirs.entry((pid, comm.to_string())).or_insert(0u64) += 1;
    }
    let ours: std::collections::BTreeMap<_, _> = p
        .processes
        .iter()
        .map(|q| ((q.pid, q.comm.clone()), q.branch_samples))
        .collect();
    assert_eq!(ours, theirs, "samples per process: ours, perf script's");
    let report = output_ok(
        Command::new("perf")
            .args(["report", "--no-branch-stack", "--stdio", "-i"])
            .arg(&recording),
    );
    let report = String::from_utf8_lossy(&report.stdout).into_owned();
    let count: u64 = report
        .lines()
        .find_map(|l| l.strip_prefix("# Event count (approx.): "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no event count in perf report:\n{report}"));
    let ev = &p.events[0];
    assert_eq!(
        ev.samples * ev.period,
        count,
        "taken branches: ours, perf report's"
    );
}

/// The Haswell recording with its header rewritten to say aarch64 (synthesised by
/// `cpi_tests::perf_data::with_arch`: the x86-64 samples stand in for another machine's):
/// the architecture is named, nothing is decoded as x86 (the x86-64 binary given for it
/// is not opened), its cycles are still given per mapped file, and stderr is one line.
/// The original names its architecture too, and its two binaries that are not here
/// give one warning line, each named with its reason only with -v.
#[test]
fn another_architectures_recording_is_named_and_not_decoded() {
    let dir = temp_dir("real-aarch64");
    let recording = data("hierarchical_discriminator_test.x86_64.perf.data");
    let arm = dir.join("aarch64.data");
    cpi_tests::perf_data::with_arch(&recording, &arm, "aarch64");
    let given = format!(
        "/local/home/kvivekananda/hierarchical_discriminator_test={}",
        data("hierarchical_discriminator_test.x86_64").display()
    );
    let (p, stderr) = import_json(&["--binary", &given], &arm);
    assert!(
        p.mode_reason.contains("recorded on aarch64"),
        "{}",
        p.mode_reason
    );
    assert_eq!(p.mode, Mode::IpSampling, "{}", p.mode_reason);
    assert_eq!(p.recorded_on.as_deref(), Some("aarch64"));
    // The terminal's mode line names it too, without -v.
    let table = output_ok(
        Command::new(cpi_bpf())
            .args(["import-perf", "--binary", &given])
            .arg(&arm)
            .env("COLUMNS", "200"),
    );
    let table = String::from_utf8_lossy(&table.stdout);
    let mode = table.lines().find(|l| l.starts_with("mode: "));
    assert!(
        mode.is_some_and(|l| l.ends_with("recorded on aarch64")),
        "{table}"
    );
    let funcs: Vec<_> = p.processes.iter().flat_map(|p| &p.functions).collect();
    assert!(
        funcs.iter().all(|f| f.measures.instructions.is_none()
            && f.blocks.is_empty()
            && f.lines.is_empty()),
        "something was decoded: {funcs:#?}"
    );
    assert!(
        funcs.iter().any(|f| f
            .name
            .contains("hierarchical_discriminator_test: aarch64 code")
            && f.measures.cycles.is_some_and(|c| c > 0.0)),
        "{funcs:#?}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].contains("recorded on aarch64"),
        "{stderr}"
    );

    let (p, stderr) = import_json(&[], &recording);
    assert!(
        p.mode_reason.contains("recorded on x86_64"),
        "{}",
        p.mode_reason
    );
    let lines: Vec<&str> = stderr.lines().collect();
    // Its ld.so is another build than this machine's (Debian 12's) or missing: two files.
    assert!(
        lines.len() == 1 && lines[0].contains("2 recorded binaries not usable here"),
        "{stderr}"
    );
    let (_, verbose) = import_json(&["-v"], &recording);
    assert!(
        verbose.contains("hierarchical_discriminator_test: not found on this machine")
            && verbose.contains("ld-linux-x86-64.so.2: "),
        "{verbose}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each event of a recording as `perf script` counts it: its name in `perf evlist`, its
/// samples, and the first and last sample's time (s).
pub(crate) fn perf_events(perf_input: &Path) -> (Vec<String>, BTreeMap<String, u64>, (f64, f64)) {
    let evlist = output_ok(Command::new("perf").args(["evlist", "-i"]).arg(perf_input));
    let names = String::from_utf8_lossy(&evlist.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let script = output_ok(
        Command::new("perf")
            .args(["script", "-F", "time,event", "-i"])
            .arg(perf_input),
    );
    let (mut counts, mut span) = (BTreeMap::new(), (f64::MAX, f64::MIN));
    for l in String::from_utf8_lossy(&script.stdout).lines() {
        // `914937.301029: cycles:u: `
        let mut w = l.split(": ");
        let t: f64 = w.next().unwrap().trim().parse().unwrap();
        let event = w.next().unwrap().trim().to_string();
        *counts.entry(event).or_insert(0u64) += 1;
        span = (span.0.min(t), span.1.max(t));
    }
    (names, counts, span)
}

/// `n` with a comma between each three digits, as the terminal writes counts.
fn thousands(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Every real recording's events are listed once each with the samples `perf script`
/// gives it, and the duration is its samples' span: a cycles event whose samples carry
/// branch stacks (Skylake's, Haswell's) serves both roles from one set of records,
/// and is one event of `perf evlist`, not two (it was listed twice, "7,480 samples
/// (cycles:u, cycles:u)" for perf's 3,740, and "0.00 s" for 0.93 s).
#[test]
fn recordings_list_each_event_once_with_perfs_samples_and_span() {
    require("perf");
    let dir = temp_dir("real-events");
    let haswell = data("hierarchical_discriminator_test.x86_64.perf.data");
    let haswell_128 = dir.join("attrs128.data");
    with_128_byte_attrs(&haswell, &haswell_128);
    let skylake = data("propeller_sample_1.perfdata1");
    let westmere = data("test.lbr");
    for (recording, perf_input) in [
        (&skylake, &skylake),
        (&haswell, &haswell_128),
        (&westmere, &westmere),
    ] {
        let (names, counts, (first, last)) = perf_events(perf_input);
        let (p, _) = import_json(&[], recording);
        let mut seen = Vec::new();
        for e in &p.events {
            let of: Vec<&String> = names
                .iter()
                .filter(|n| e.name == **n || e.name.starts_with(&format!("{n} (")))
                .collect();
            assert_eq!(of.len(), 1, "{}: perf evlist {names:?}", e.name);
            assert!(
                !seen.contains(of[0]),
                "{} listed twice: {:?}",
                of[0],
                p.events
            );
            seen.push(of[0].clone());
            assert_eq!(
                e.samples, counts[of[0]],
                "{}: samples, ours and perf script's",
                e.name
            );
        }
        // perf script prints µs: each end within 1 µs.
        assert!(
            (p.duration_secs - (last - first)).abs() <= 2e-6,
            "{}: {} s, perf script's samples span {} s",
            recording.display(),
            p.duration_secs,
            last - first
        );
        let total: u64 = seen.iter().map(|n| counts[n]).sum();
        let table = output_ok(Command::new(cpi_bpf()).arg("import-perf").arg(recording));
        let table = String::from_utf8_lossy(&table.stdout);
        let line = format!("{:.2} s, {} samples (", last - first, thousands(total));
        assert!(table.contains(&line), "no {line:?} in:\n{table}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
