//! A hostile host, round 3: files a user hands root's `report` (a profile, a store
//! window) with a call path of 100 000 frames, times no clock can reach, and escape
//! sequences in every field the header prints. Each is read within the bound, without a
//! panic, and prints nothing that acts on root's terminal.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

use cpi_agent::store::{self, Store};
use cpi_tests::{assert_one_error_line, cpi_bpf, stderr, temp_dir};
use cpi_user::profile::model::{StackFrame, StackProfile};
use cpi_user::profile::stack::StackEnd;
use cpi_user::profile::Profile;

use crate::report_fixture::time_profile;

/// Longest a hostile file may hold up `report`, wall time: generous, as the suite runs
/// beside other work; what a command costs is bounded by its CPU time instead.
const BOUND: Duration = Duration::from_secs(120);

/// `cpi-bpf ARGS` run as root, to completion within [`BOUND`] (killed and failed
/// past it), and the CPU seconds it took (user and system, from GNU time, whose line
/// is taken off its stderr).
fn report(args: &[&str]) -> (Output, f64) {
    let child = Command::new("/usr/bin/time")
        .args(["-f", "cpu-seconds %U %S"])
        .arg(cpi_bpf())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t0 = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if t0.elapsed() > BOUND {
            // SAFETY: our own child (GNU time); cpi-bpf, its child, is killed with it
            // when the test process ends.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = waiter.join();
            panic!("cpi-bpf {args:?} ran for more than {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = waiter.join().unwrap();
    let err = stderr(&out);
    let (rest, time) = err
        .trim_end()
        .rsplit_once('\n')
        .unwrap_or(("", err.trim_end()));
    let cpu: f64 = time
        .strip_prefix("cpu-seconds ")
        .unwrap_or_else(|| panic!("no CPU time from GNU time: {err}"))
        .split(' ')
        .map(|v| v.parse::<f64>().unwrap())
        .sum();
    // GNU time's own line for a command that failed goes too.
    let rest: Vec<&str> = rest
        .lines()
        .filter(|l| !l.starts_with("Command exited with non-zero status"))
        .collect();
    out.stderr = rest
        .iter()
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .into_bytes();
    (out, cpu)
}

/// `p` written as a profile file at `path`, owned by uid 65534 (handed to root).
fn handed(p: &Profile, path: &Path) {
    let f = std::fs::File::create(path).unwrap();
    cpi_user::report::file::write_json(p, f).unwrap();
    std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
}

/// Row 5: one call path of 100 000 frames, each a different function. `report --format
/// html`, `--callers` and the tables take at most 10 s of CPU each (the recursion
/// folding searched the path once per frame: 125 s for the page; the table measured the
/// whole path once per word of it).
#[test]
fn a_call_path_of_a_hundred_thousand_frames_is_read_in_linear_time() {
    let dir = temp_dir("hostile-deep-path");
    let mut p = time_profile();
    let pr = &mut p.processes[0];
    let frames: Vec<StackFrame> = (0..100_000u64)
        .map(|i| StackFrame {
            function: format!("f{i}"),
            binary: "/usr/bin/xz".into(),
            address: 0x10000 + i,
        })
        .collect();
    pr.stacks.push(StackProfile {
        frames,
        end: StackEnd::Complete,
        samples: pr.samples,
        branch_samples: 0,
        time_ns: pr.measures.time_ns,
        cycles: None,
        instructions: None,
        cpi: None,
        cycles_rel_error: None,
        instructions_rel_error: None,
        range_hits: 0,
    });
    let json = dir.join("deep.json");
    handed(&p, &json);
    let json = json.to_str().unwrap();
    let html = dir.join("deep.html");
    // CPU seconds each may take: the search per frame took 125 s for the page.
    let most = 10.0;
    let html_arg = html.to_str().unwrap();
    for args in [
        vec!["report", "--format", "html", "-o", html_arg, json],
        vec!["report", "--callers", "f0", json],
        vec!["report", "--format", "table", json],
    ] {
        let (out, cpu) = report(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(cpu <= most, "{args:?}: {cpu} s of CPU");
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("f99999") && page.contains("lzma_mf_bt4_find"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row 7: `--since @18446744073709551615` and a store window named for the year 10000.
/// The first is one error line; the window is read and its times written `@SECS`
/// (RFC 3339 stops at 9999), in the summary line, the HTML's chart and the error of a
/// range past it. No panic anywhere.
#[test]
fn no_time_makes_report_panic() {
    let dir = temp_dir("hostile-times");
    let s = dir.join("store");
    let mut st = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None).unwrap();
    let store_arg = s.to_str().unwrap();
    let (out, _) = report(&[
        "report",
        "--store",
        store_arg,
        "--since",
        "@18446744073709551615",
    ]);
    assert_one_error_line(&out, "@18446744073709551615");
    // Two windows, so the HTML draws its chart over them, with their times.
    let far = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
    for i in 0..2 {
        st.write(&cpi_agent::Window {
            start: far + Duration::from_secs(10 * i),
            end: far + Duration::from_secs(10 * i + 10),
            profile: time_profile(),
        })
        .unwrap();
    }
    let (out, _) = report(&["report", "--store", store_arg]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("2 windows from @253402300800 to @253402300820 merged"),
        "{err}"
    );
    let html = dir.join("far.html");
    let (out, _) = report(&["report", "--store", store_arg, "-o", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("@253402300800"));
    for since in ["@253402300900", "@9223372036854775807"] {
        let (out, _) = report(&["report", "--store", store_arg, "--since", since]);
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{since}: {err}");
        assert_eq!(err.lines().count(), 1, "{since}: {err}");
        assert!(err.starts_with("cpi-bpf: error: "), "{since}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row 8: a profile handed to root whose mode reason, event names, recorded-on
/// architecture, tool version, instruction text and mangled name hold `ESC]0;…BEL` (set
/// the terminal's title) and `ESC[2J` (clear it). `report -v` and `--annotate` print
/// them escaped: not one escape or BEL byte reaches root's terminal.
#[test]
fn every_field_of_a_handed_profile_is_escaped_on_the_terminal() {
    let dir = temp_dir("hostile-header");
    let evil = "\x1b]0;owned\x07\x1b[2J";
    let mut p = time_profile();
    p.mode_reason = format!("no PMU {evil}");
    p.tool_version = format!("0.1.0{evil}");
    p.recorded_on = Some(format!("x86_64{evil}"));
    for e in &mut p.events {
        e.name = format!("cpu-clock{evil}");
    }
    let f = &mut p.processes[0].functions[0];
    f.mangled = Some(format!("_Z4hot{evil}"));
    for l in &mut f.lines {
        l.text = format!("nop {evil}");
    }
    let json = dir.join("evil.json");
    handed(&p, &json);
    let json = json.to_str().unwrap();
    for args in [
        vec!["report", "-v", json],
        vec!["report", "-v", "--annotate", "lzma_mf_bt4_find", json],
    ] {
        let (out, _) = report(&args);
        let (text, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(
            !text.contains(['\x1b', '\x07']) && !err.contains(['\x1b', '\x07']),
            "{args:?}: raw escapes: {text:?} {err:?}"
        );
        assert!(
            text.contains("\\x1b]0;owned\\x07\\x1b[2J"),
            "{args:?}: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
