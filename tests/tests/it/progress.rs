//! Long work shows progress on a terminal only: `simulate` of a program that traces for
//! about 2 s, run in a pseudo-terminal by `script(1)`, draws its bar on standard error;
//! piped, or with `-q`, standard error has no bar.

use std::path::Path;
use std::process::Command;

use cpi_tests::tracer::{program, tool_dir};
use cpi_tests::{cpi_bpf, stderr, temp_dir};

/// Runs `cpi-bpf ARGS` (its standard output to /dev/null) in a pseudo-terminal made by
/// `script(1)` and returns what the terminal received.
fn on_a_terminal(args: &[&str], dir: &Path) -> String {
    let quoted: Vec<String> = std::iter::once(cpi_bpf().to_string_lossy().into_owned())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let typescript = dir.join("typescript");
    let out = Command::new("script")
        .args(["-q", "-e", "-f", "-c"])
        .arg(format!("{} >/dev/null", quoted.join(" ")))
        .arg(&typescript)
        // A terminal that can redraw a line, as every interactive one is.
        .env("TERM", "xterm")
        .output()
        .expect("script(1) (util-linux, on every Debian system)");
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned()
}

#[test]
fn simulate_shows_a_bar_on_a_terminal_and_none_when_piped_or_quiet() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let dir = temp_dir("progress");
    let exe = program("sim_mix").unwrap();
    let exe = exe.to_string_lossy();
    // Scale 4: about 2 s of tracing here (more under load), many bar redraws.
    let cmd = ["simulate", "--format", "json", "--", &exe, "4"];
    let tty = on_a_terminal(&cmd, &dir);
    // The tracing spinner counts branches as it goes, redrawn in place.
    let bar = tty
        .split(['\r', '\n'])
        .find(|l| l.contains("cpi-bpf: tracing") && l.contains(" branches, "));
    assert!(bar.is_some(), "no progress line on the terminal:\n{tty:?}");
    assert!(
        tty.contains("\u{1b}[2K"),
        "the bar is not redrawn in place:\n{tty:?}"
    );

    let quiet: Vec<&str> = cmd[..1]
        .iter()
        .chain(&["-q"])
        .chain(&cmd[1..])
        .copied()
        .collect();
    let tty = on_a_terminal(&quiet, &dir);
    assert!(
        !tty.contains("cpi-bpf: tracing"),
        "-q still draws:\n{tty:?}"
    );

    let piped = Command::new(cpi_bpf()).args(cmd).output().unwrap();
    assert!(piped.status.success(), "{}", stderr(&piped));
    let err = stderr(&piped);
    assert!(
        !err.contains("cpi-bpf: tracing") && !err.contains('\r') && !err.contains('\u{1b}'),
        "a bar into a pipe:\n{err:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
