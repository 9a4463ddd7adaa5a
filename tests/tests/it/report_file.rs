//! The profile file: round trip, the clear errors for bad files, a fuzz-style property
//! test of the parser, and `cpi-bpf report` reproducing the views offline.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;

use crate::report_fixture::{cpi_profile, golden, scratch, time_profile};
use cpi_tests::{cpi_bpf, output_ok};
use cpi_user::profile::model::Profile;
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

    let future = text.replacen("\"format_version\": 1", "\"format_version\": 99", 1);
    let e = parse(future.as_bytes(), "f.json").unwrap_err();
    assert!(
        matches!(
            e,
            ProfileFileError::FutureVersion {
                found: 99,
                supported: 1,
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

    let e = read(std::path::Path::new("/nonexistent/p.json")).unwrap_err();
    assert!(matches!(e, ProfileFileError::Io { .. }), "{e}");
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
