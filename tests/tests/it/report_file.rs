//! The profile file: round trip, the clear errors for bad files, a fuzz-style property
//! test of the parser, and `cpi-bpf report` reproducing the views offline.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;

use crate::report_fixture::{cpi_profile, golden, scratch, time_profile};
use cpi_tests::{cpi_bpf, output_ok};
use cpi_user::profile::model::{Profile, PROFILE_FORMAT_VERSION};
use cpi_user::report::file::{parse, read, to_json, write_json, write_output, ProfileFileError};
use cpi_user::report::table::{render, TableOptions};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[test]
fn json_round_trips_both_modes() {
    for p in [cpi_profile(), time_profile()] {
        let text = to_json(&p).unwrap();
        assert_eq!(parse(text.as_bytes(), "t").unwrap(), p);
        assert_eq!(Profile::from_json(text.as_bytes()).unwrap(), p);
    }
}

/// The file format itself is pinned: a change shows up here and needs
/// PROFILE_FORMAT_VERSION's consideration. These files also serve `cpi-bpf report` demos.
#[test]
fn file_format_is_stable() {
    golden("cpi_profile.json", &to_json(&cpi_profile()).unwrap());
    golden("time_profile.json", &to_json(&time_profile()).unwrap());
    // And what was written before reads back as the same profile.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden");
    assert_eq!(read(&dir.join("cpi_profile.json")).unwrap(), cpi_profile());
}

/// The profile is serialised as it is written, so what would not read back (serde_json
/// writes NaN as `null`) is refused before a byte goes out: the file already there stays
/// whole, not renamed to `.old`.
#[test]
fn a_profile_that_would_not_read_back_is_not_written() {
    let mut p = time_profile();
    p.processes[0].functions[0].share = f64::NAN;
    let e = to_json(&p).unwrap_err().to_string();
    assert!(e.contains("NaN"), "{e}");
    let dir = scratch("report-file-nan");
    let file = dir.join("p.json");
    std::fs::write(&file, "earlier run\n").unwrap();
    let e = write_output(&file, |w| write_json(&p, w)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "earlier run\n");
    assert!(!dir.join("p.json.old").exists());
    // A profile that reads back is written, and the earlier file kept as `.old`.
    write_output(&file, |w| write_json(&time_profile(), w)).unwrap();
    assert_eq!(read(&file).unwrap(), time_profile());
    let old = std::fs::read_to_string(dir.join("p.json.old")).unwrap();
    assert_eq!(old, "earlier run\n");
}

#[test]
fn bad_files_give_typed_errors() {
    let text = to_json(&cpi_profile()).unwrap();
    let e = parse(&text.as_bytes()[..text.len() / 2], "half.json").unwrap_err();
    assert!(matches!(e, ProfileFileError::Truncated { .. }), "{e}");
    assert!(
        e.to_string().starts_with("profile half.json is truncated"),
        "{e}"
    );

    let future = text.replacen("\"format_version\": 2", "\"format_version\": 99", 1);
    let e = parse(future.as_bytes(), "f.json").unwrap_err();
    assert!(
        matches!(
            e,
            ProfileFileError::FutureVersion {
                found: 99,
                supported: 2,
                ..
            }
        ),
        "{e}"
    );

    let e = parse(b"{\"hello\": 1}", "x.json").unwrap_err();
    assert!(matches!(e, ProfileFileError::NotAProfile { .. }), "{e}");

    let e = parse(b"\x89PNG\r\n", "x.png").unwrap_err();
    assert!(matches!(e, ProfileFileError::NotJson { .. }), "{e}");

    let wrong = text.replacen("\"mode\": \"cpi\"", "\"mode\": \"telepathy\"", 1);
    let e = parse(wrong.as_bytes(), "m.json").unwrap_err();
    assert!(matches!(e, ProfileFileError::Corrupt { .. }), "{e}");

    // Opened by the opener of inputs (fsafe::open_input: FIFOs and pipes), whose
    // error names the path and the cause.
    let e = read(std::path::Path::new("/nonexistent/p.json")).unwrap_err();
    assert!(matches!(e, ProfileFileError::Open(_)), "{e}");
    assert!(
        e.to_string().contains("/nonexistent/p.json: No such file"),
        "{e}"
    );
}

/// Every truncation and thousands of random byte flips, insertions and deletions of a
/// real profile: the parser never panics, and what it accepts is a profile that renders.
#[test]
fn parser_survives_truncation_and_corruption() {
    let text = to_json(&cpi_profile()).unwrap().into_bytes();
    let check = |bytes: &[u8]| {
        let r = catch_unwind(AssertUnwindSafe(|| parse(bytes, "fuzz")));
        match r {
            Err(_) => panic!("parser panicked on {:?}", String::from_utf8_lossy(bytes)),
            Ok(Ok(p)) => {
                // Accepted input must be usable by every view.
                render(&p, &TableOptions::default()).unwrap();
                true
            }
            Ok(Err(e)) => {
                assert!(!e.to_string().is_empty());
                false
            }
        }
    };
    let mut truncated_ok = 0;
    // Cutting only the trailing newline leaves a whole file.
    let body = text.trim_ascii_end().len();
    for len in 0..body {
        if check(&text[..len]) {
            truncated_ok += 1;
        }
    }
    assert_eq!(
        truncated_ok, 0,
        "a strict prefix of the file is never a whole profile"
    );

    let mut rng = StdRng::seed_from_u64(0x5eed);
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..3000 {
        let mut b = text.clone();
        for _ in 0..rng.gen_range(1..4) {
            let i = rng.gen_range(0..b.len());
            match rng.gen_range(0..3) {
                0 => b[i] = rng.gen(),
                1 => b.insert(i, rng.gen()),
                _ => {
                    b.remove(i);
                }
            }
        }
        if check(&b) {
            accepted += 1;
        } else {
            rejected += 1;
        }
    }
    // Both outcomes occur (e.g. a flipped digit still parses): the test sees both paths.
    assert!(
        accepted > 0 && rejected > 0,
        "accepted {accepted}, rejected {rejected}"
    );
}

#[test]
fn report_command_reproduces_views_offline_and_rejects_bad_files() {
    let bin = cpi_bpf();
    let dir = scratch("report-file");
    let p = cpi_profile();
    let file = dir.join("p.json");
    std::fs::write(&file, to_json(&p).unwrap()).unwrap();

    let run = |args: &[&str]| Command::new(bin).args(args).output().unwrap();
    let f = file.to_str().unwrap();
    let out = run(&["report", f, "--top", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let opts = TableOptions {
        top: 5,
        ..TableOptions::default()
    };
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        render(&p, &opts).unwrap()
    );

    let out = run(&["report", f, "--annotate", "crc_update"]);
    assert!(out.status.success());
    let opts = TableOptions {
        annotate: Some("crc_update".into()),
        ..TableOptions::default()
    };
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        render(&p, &opts).unwrap()
    );

    // JSON out of `report` is the same file again.
    let out = run(&["report", f, "--format", "json"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), to_json(&p).unwrap());

    let text = std::fs::read(&file).unwrap();
    std::fs::write(dir.join("cut.json"), &text[..text.len() - 40]).unwrap();
    for (name, want) in [
        ("cut.json", "is truncated"),
        ("missing.json", "No such file"),
    ] {
        let out = run(&["report", dir.join(name).to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(want) && !err.contains("panicked"), "{err}");
    }
    // A cause the message already says is not said again (the store's errors carry
    // their io::Error as source and in their text).
    let out = run(&["report", "--store", dir.join("no-store").to_str().unwrap()]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        (out.status.code(), err.matches("No such file").count()),
        (Some(1), 1),
        "{err}"
    );
    let out = run(&["report", f, "--annotate", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no function named \"nope\""));
}

/// `report` reads one window of an agent's store as it is written (`w-….json.gz`).
#[test]
fn report_reads_a_single_gzipped_agent_window() {
    use std::io::Write;
    let dir = scratch("report-gz");
    let p = time_profile();
    let file = dir.join("w-1700000000-10.json.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(to_json(&p).unwrap().as_bytes()).unwrap();
    std::fs::write(&file, gz.finish().unwrap()).unwrap();
    assert_eq!(read(&file).unwrap(), p);
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--format", "json"])
            .arg(&file),
    );
    assert_eq!(parse(&out.stdout, "stdout").unwrap(), p);
}

/// tests/golden/format1_stacks.json is a real file of format 1, the format before the
/// frame table: written by main's `cpi-bpf` at ccf284a, `cpi-bpf --format json -o F --
/// stacks chain 300` (tests/programs/stacks.c) on a no-PMU VM, a time profile whose four
/// call paths share most of their frames.
fn format1_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/format1_stacks.json")
}

/// A format-1 file still reads, frames as written; rewritten in the current format (each
/// distinct frame once, paths as numbers) it reads back to the same profile, and
/// `report` gives the same table, folded text, pprof and JSON from either file.
#[test]
fn a_format_1_file_reads_and_the_current_format_gives_the_same() {
    let old_file = format1_file();
    let old_text = std::fs::read(&old_file).unwrap();
    let v1: serde_json::Value = serde_json::from_slice(&old_text).unwrap();
    assert_eq!(v1["format_version"], 1);
    let old = read(&old_file).unwrap();
    assert_eq!(old.format_version, PROFILE_FORMAT_VERSION);
    let written = v1["processes"][0]["stacks"].as_array().unwrap();
    let stacks = &old.processes[0].stacks;
    assert_eq!(stacks.len(), 4);
    for (s, w) in stacks.iter().zip(written) {
        let w = w["frames"].as_array().unwrap();
        assert_eq!(s.frames.len(), w.len());
        for (f, w) in s.frames.iter().zip(w) {
            assert_eq!(
                (f.function.as_str(), f.binary.as_str(), f.address),
                (
                    w["function"].as_str().unwrap(),
                    w["binary"].as_str().unwrap(),
                    w["address"].as_u64().unwrap()
                )
            );
        }
    }
    let chain: Vec<&str> = stacks[0].frames[..4]
        .iter()
        .map(|f| f.function.as_str())
        .collect();
    assert_eq!(chain, ["leaf", "path_b", "path_a", "main"]);

    let text = to_json(&old).unwrap();
    let v2: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v2["format_version"], PROFILE_FORMAT_VERSION);
    let numbers: Vec<u64> = v2["processes"][0]["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap().clone())
        .map(|n| n.as_u64().expect("a frame number"))
        .collect();
    let distinct: std::collections::BTreeSet<u64> = numbers.iter().copied().collect();
    let table = v2["stack_frames"].as_array().unwrap();
    assert_eq!(distinct.len(), table.len());
    assert!(table.len() < numbers.len(), "the paths share frames");
    assert!(text.len() < old_text.len(), "{} bytes", text.len());
    assert_eq!(parse(text.as_bytes(), "format 2").unwrap(), old);

    let dir = scratch("report-format1");
    let new_file = dir.join("format2.json");
    std::fs::write(&new_file, &text).unwrap();
    for format in ["table", "folded", "pprof", "json"] {
        let out = |f: &std::path::Path| {
            output_ok(
                Command::new(cpi_bpf())
                    .args(["report", "--format", format])
                    .arg(f),
            )
            .stdout
        };
        assert!(
            out(&old_file) == out(&new_file),
            "--format {format} differs"
        );
    }
}

/// An agent's store after an upgrade holds windows of both formats: merged, they give
/// what the same windows give merged in memory.
#[test]
fn a_store_of_both_formats_merges_as_one() {
    use cpi_agent::store::{read_range, RangeQuery, Store};
    use cpi_agent::Window;
    use cpi_user::profile::merge::merge;
    use std::io::Write;
    use std::time::{Duration, UNIX_EPOCH};
    let dir = scratch("report-store-formats");
    let old = read(&format1_file()).unwrap();
    let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut store = Store::open(&dir, Duration::from_secs(1 << 40), 1 << 30, None).unwrap();
    store
        .write(&Window {
            start,
            end: start + Duration::from_secs(10),
            profile: old.clone(),
        })
        .unwrap();
    // The format-1 window as the agent before this format wrote it: the file gzip'd.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&std::fs::read(format1_file()).unwrap())
        .unwrap();
    std::fs::write(
        dir.join("w-1700000010000-1700000020000.json.gz"),
        gz.finish().unwrap(),
    )
    .unwrap();
    let merged = read_range(&dir, &RangeQuery::default()).unwrap();
    assert_eq!(merged.windows, 2);
    assert!(merged.skipped.is_empty(), "{:?}", merged.skipped);
    assert_eq!(merged.profile, merge(&[old.clone(), old]).unwrap());
}

/// A frame table that does not fit its paths is a corrupt file, one error, nothing
/// read; one long name named by every frame is cut, not refused.
#[test]
fn a_bad_frame_table_is_refused() {
    let old = read(&format1_file()).unwrap();
    let good: serde_json::Value = serde_json::from_str(&to_json(&old).unwrap()).unwrap();
    let refused = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        edit(&mut v);
        parse(&serde_json::to_vec(&v).unwrap(), "t.json").unwrap_err()
    };
    let e = refused(&|v| v["processes"][0]["stacks"][0]["frames"][0] = 1_000_000.into());
    assert!(matches!(e, ProfileFileError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("frame 1000000 of"), "{e}");
    let e = refused(&|v| v["stack_frames"][0]["function"] = 1_000_000.into());
    assert!(e.to_string().contains("function 1000000 of"), "{e}");
    let e = refused(&|v| v["stack_functions"] = "none".into());
    assert!(e.to_string().contains("stack_functions"), "{e}");
    // One 1 MiB name named 300 times by each path: cut to its budget as it is read
    // (cpi-user/src/fsafe/text.rs), so the file reads instead of writing out 300 MiB.
    let mut v = good.clone();
    v["stack_functions"][0]["name"] = "x".repeat(1 << 20).into();
    let n = v["processes"][0]["stacks"][0]["frames"][0].clone();
    for s in v["processes"][0]["stacks"].as_array_mut().unwrap() {
        s["frames"] = vec![n.clone(); 300].into();
    }
    let p = parse(&serde_json::to_vec(&v).unwrap(), "t.json").unwrap();
    let f = &p.processes[0].stacks[0].frames[0].function;
    assert!(f.len() <= cpi_user::fsafe::MAX_NAME_BYTES, "{}", f.len());
    assert!(f.ends_with(" bytes]"), "{}", &f[f.len() - 30..]);
}

/// Hostile host, `cpi-bpf -p FIFO-reader -o FIFO`: the early check of `--output`
/// opened the FIFO and closed it, so its reader (`cat FIFO`) saw end of file and left,
/// and the profile written at the end found no reader ("No such device or address").
/// The FIFO opened by the check is now the one written: the reader gets the profile.
/// (`report` alone does not show it: its write follows the check too closely for the
/// reader to have seen the end.)
#[test]
fn output_to_a_fifo_reaches_the_reader_that_was_there_at_the_check() {
    if !cpi_tests::require_root("a one-shot profile") {
        return;
    }
    let dir = scratch("report-file-fifo");
    let fifo = dir.join("out.fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = Command::new("cat")
        .arg(&fifo)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The check must find `cat` there: wait until it is blocked in openat(2) (syscall
    // 257 on x86_64), as a reader started before cpi-bpf would be.
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(format!("/proc/{}/syscall", reader.id()))
        .is_ok_and(|s| s.starts_with("257 "))
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "cat never opened the FIFO"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = Command::new(cpi_bpf())
        .args(["--format", "json", "-o"])
        .arg(&fifo)
        .args(["--", "sleep", "1"])
        .output()
        .unwrap();
    let got = reader.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", cpi_tests::stderr(&out));
    let text = String::from_utf8(got.stdout).unwrap();
    parse(text.as_bytes(), "fifo").expect("the profile, whole, through the FIFO");
}
