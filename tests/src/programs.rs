//! The one place test programs are built: sources in `tests/programs/` compiled by their
//! language's compiler (C: gcc, C++: g++, Rust: rustc) (and stripped copies), cached
//! under `target/test-programs/`.
//!
//! Used by the integration tests (`tests/src/lib.rs` exports it) and by cpi-user's unit
//! tests (`cpi-user/src/binary/testbin.rs` includes this file), so it needs only `std`.
//! An executable keeps its source's name (`busy.c` → `busy`, the process name tests look
//! for) in a folder named after a hash of the gcc flags; it is rebuilt only when the
//! source is newer. Outputs are written under a temporary name and renamed, so threads
//! and processes running tests at once never see a half-written file.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Builds run one at a time in a process: tests on parallel threads often want the same
/// program.
static BUILDING: Mutex<()> = Mutex::new(());

fn workspace_root() -> PathBuf {
    // CARGO_MANIFEST_DIR is `tests/` or `cpi-user/`: both sit in the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("a workspace member has a parent")
        .to_path_buf()
}

fn mtime(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// A test (or part of one) that cannot run here: prints why, and under CI (`CI` set, as
/// `.ci/run` does, where `cargo xtask setup` installed everything and the tests run as
/// root) fails instead, so nothing passes there by skipping.
pub fn skip(why: impl std::fmt::Display) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("cannot run under CI: {why}");
    }
    eprintln!("skipped: {why}");
}

/// Runs `cmd` writing `out` through a temporary file. `None` after printing why when
/// the tool is missing; panics when it fails (a broken test program is a bug).
fn produce(cmd: &mut Command, out: &Path) -> Option<()> {
    let tmp = PathBuf::from(format!("{}.tmp{}", out.display(), std::process::id()));
    let tool = cmd.get_program().to_string_lossy().into_owned();
    match cmd.arg(&tmp).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("{cmd:?} failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            skip(format_args!(
                "{tool} not available ({e}); run `cargo xtask setup`"
            ));
            return None;
        }
    }
    std::fs::rename(&tmp, out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    Some(())
}

/// `tests/programs/SOURCE` compiled with `gcc FLAGS` (`g++` for `.cpp`, `rustc` for
/// `.rs`): the cached executable, or `None` after printing why (the compiler is missing).
pub fn compile(source: &str, flags: &[&str]) -> Option<PathBuf> {
    let compiler = match Path::new(source).extension().and_then(|e| e.to_str()) {
        Some("cpp") => "g++",
        Some("rs") => "rustc",
        _ => "gcc",
    };
    compile_by(compiler, source, flags)
}

/// `tests/programs/SOURCE` compiled by `compiler FLAGS` (`clang-19` beside gcc, for the
/// code shapes each compiler makes); as [`compile`].
pub fn compile_by(compiler: &str, source: &str, flags: &[&str]) -> Option<PathBuf> {
    let root = workspace_root();
    let src = root.join("tests/programs").join(source);
    let mut h = DefaultHasher::new();
    flags.hash(&mut h);
    // gcc's builds keep their folders; another compiler gets its own.
    if !["gcc", "g++", "rustc"].contains(&compiler) {
        compiler.hash(&mut h);
    }
    let dir = root
        .join("target/test-programs")
        .join(format!("{:016x}", h.finish()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let stem = Path::new(source).file_stem().expect("a source file name");
    let exe = dir.join(stem);
    let _one_at_a_time = BUILDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let src_time = mtime(&src).unwrap_or_else(|| panic!("{}: missing", src.display()));
    if mtime(&exe).is_some_and(|t| t >= src_time) {
        return Some(exe);
    }
    produce(Command::new(compiler).args(flags).arg(&src).arg("-o"), &exe)?;
    Some(exe)
}

/// A stripped copy of `exe` (which [`compile`] built) next to it, or `None` after
/// printing why (strip is missing).
pub fn stripped(exe: &Path) -> Option<PathBuf> {
    let out = PathBuf::from(format!("{}.stripped", exe.display()));
    let _one_at_a_time = BUILDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if mtime(&out).is_some_and(|t| Some(t) >= mtime(exe)) {
        return Some(out);
    }
    produce(Command::new("strip").arg(exe).arg("-o"), &out)?;
    Some(out)
}
