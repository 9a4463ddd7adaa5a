//! Helpers for the tracer / PMU-model tests: building test programs, finding the
//! tracer tool, running callgrind as the independent oracle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The built tool folder, found as `cpi-bpf simulate` finds it
/// ([`cpi_user::sim::run::find_tool_dir`]), or why not: the caller prints the reason and
/// skips.
pub fn tool_dir() -> Result<PathBuf, String> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        return Err("valgrind is not installed".into());
    }
    cpi_user::sim::run::find_tool_dir().map_err(|e| e.to_string())
}

/// A copy of the tracer's tool folder that also holds callgrind, so tracer and
/// callgrind runs see the same `VALGRIND_LIB` and preload paths.
pub fn shared_tool_dir(tool_dir: &Path, scratch: &Path) -> Result<PathBuf, String> {
    let dir = scratch.join("cpi-tracer");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut links: Vec<(PathBuf, PathBuf)> = std::fs::read_dir(tool_dir)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| {
            let p = e.path();
            (
                std::fs::canonicalize(&p).unwrap_or(p),
                dir.join(e.file_name()),
            )
        })
        .collect();
    links.push((
        "/usr/libexec/valgrind/callgrind-amd64-linux".into(),
        dir.join("callgrind-amd64-linux"),
    ));
    for (from, to) in links {
        if !to.exists() {
            std::os::unix::fs::symlink(&from, &to).map_err(|e| e.to_string())?;
        }
    }
    Ok(dir)
}

/// `tests/programs/<name>.c` built with gcc `-O2 -g -lm -pthread` ([`crate::programs`]).
pub fn program(name: &str) -> Result<PathBuf, String> {
    crate::programs::compile(&format!("{name}.c"), &["-O2", "-g", "-lm", "-pthread"])
        .ok_or_else(|| format!("cannot build {name}.c: gcc is not available"))
}

/// An instruction: (object path, ELF virtual address), callgrind's address space.
pub type InsnKey = (PathBuf, u64);

/// Exact per-instruction execution counts (the output file goes to `cwd`) from
/// `valgrind --tool=callgrind --dump-instr=yes --skip-plt=no`, with the same
/// chase/freeres settings the tracer uses.
///
/// `tool_dir` is the tracer's tool folder: callgrind runs from a copy of it (links) so
/// both runs see byte-identical environments (`VALGRIND_LIB`, the preload path in
/// `LD_PRELOAD`), without which ld.so's start-up work differs between the two.
/// Callgrind names code outside any debuginfo text range (PLT, `.init`) object `???`
/// with a runtime address: those come back as `("???", runtime address)`.
pub fn callgrind_counts(
    tool_dir: &Path,
    cmd: &[&str],
    cwd: &Path,
) -> Result<HashMap<InsnKey, u64>, String> {
    let out = cwd.join(format!("callgrind.out.{}", std::process::id()));
    let status = Command::new("valgrind")
        .env("VALGRIND_LIB", tool_dir)
        .args([
            "-q",
            "--tool=callgrind",
            "--dump-instr=yes",
            "--skip-plt=no",
            "--vex-guest-chase=no",
            "--run-libc-freeres=no",
            "--run-cxx-freeres=no",
        ])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args(cmd)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("valgrind: {e}"))?;
    if !status.success() {
        return Err(format!("callgrind failed: {status}"));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    parse_callgrind(&text)
}

/// Parses callgrind's output format (positions: `instr` first, maybe `line`; first
/// event: `Ir`): cost lines are `ADDR [LINE] IR` with each position absolute (`0x…`),
/// relative (`+N`/`-N`) or `*` (same). The line after `calls=` is the call's inclusive
/// cost: skipped. Addresses are per object (`ob=`), ELF virtual addresses.
pub fn parse_callgrind(text: &str) -> Result<HashMap<InsnKey, u64>, String> {
    let mut counts = HashMap::new();
    let mut objects: HashMap<String, PathBuf> = HashMap::new();
    let mut ob = PathBuf::new();
    let mut last = 0u64;
    let mut skip_next = false;
    let mut positions = 1;
    for line in text.lines() {
        if let Some(p) = line.strip_prefix("positions:") {
            positions = p.split_whitespace().count();
            continue;
        }
        let first = line.as_bytes().first().copied();
        let is_cost = matches!(first, Some(b'0'..=b'9' | b'+' | b'-' | b'*'));
        if !is_cost {
            // `ob=(N) /path` defines N, `ob=(N)` refers to it; `cob=` (a call's
            // target object) may define names too.
            let (def, current) = match (line.strip_prefix("ob="), line.strip_prefix("cob=")) {
                (Some(r), _) => (Some(r), true),
                (_, Some(r)) => (Some(r), false),
                _ => (None, false),
            };
            if let Some(rest) = def {
                let (id, name) = rest.split_once(' ').unwrap_or((rest, ""));
                if !name.is_empty() {
                    let p = std::fs::canonicalize(name).unwrap_or_else(|_| name.into());
                    objects.insert(id.to_string(), p);
                }
                if current {
                    ob = objects.get(id).cloned().unwrap_or_default();
                }
            }
            if line.starts_with("calls=") {
                skip_next = true;
            }
            continue;
        }
        let mut f = line.split_whitespace();
        let pos = f.next().ok_or("empty cost line")?;
        let addr = if pos == "*" {
            last
        } else if let Some(d) = pos.strip_prefix('+') {
            last + parse_num(d)?
        } else if let Some(d) = pos.strip_prefix('-') {
            last - parse_num(d)?
        } else {
            parse_num(pos)?
        };
        last = addr;
        if skip_next {
            skip_next = false;
            continue;
        }
        let mut f = f.skip(positions - 1);
        let ir = f.next().map(parse_num).transpose()?.unwrap_or(0);
        *counts.entry((ob.clone(), addr)).or_insert(0) += ir;
    }
    Ok(counts)
}

fn parse_num(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|_| format!("bad number {s:?} in callgrind output"))
}

/// `bytes` of pseudo-random words separated by spaces: compressible input for the
/// gzip/bzip2 runs, the same on every machine.
pub fn words_text(bytes: usize) -> String {
    let words = [
        "profile", "branch", "cycle", "sample", "the", "of", "and", "record", "edge",
    ];
    let mut s = String::with_capacity(bytes + 16);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    while s.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(words[(x % words.len() as u64) as usize]);
        s.push(' ');
    }
    s
}
