//! Running a command under Valgrind with the `cpitrace` tool.
//!
//! The tool is built by `cargo xtask setup` into `target/cpi-tracer/` (a Valgrind tool
//! folder: the tool plus links to the installed preload files) and packaged by `cargo
//! xtask package` into `/usr/lib/cpi-bpf/`; [`find_tool_dir`] says where it is looked for.
//! The trace streams through a FIFO
//! so it is never stored: a large run produces gigabytes of records.
//!
//! What is traced: the command's process, through every program it execs (Valgrind's
//! `--trace-children=yes` starts the tool again in the new program, which appends to the
//! same trace), as `perf record` follows exec. Child processes it forks are not traced:
//! the tool marks each fork in the trace and lets the child's own exec run natively.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use super::{sys, SimError};

/// Valgrind's name of the tool.
pub const TOOL: &str = "cpitrace";
const TOOL_FILE: &str = "cpitrace-amd64-linux";

/// Where the Debian package (`cargo xtask package`) puts the tool.
pub const PACKAGED_DIR: &str = "/usr/lib/cpi-bpf";

/// The folders the tool is looked for in, in order: `$CPI_TRACER_DIR`; `cpi-tracer/` in
/// the build tree the running executable sits in (`target/<profile>/cpi-bpf`,
/// `target/<profile>/deps/test-…`); `lib/cpi-bpf/` of the prefix it is installed under
/// (`/usr/bin/cpi-bpf` → `/usr/lib/cpi-bpf`; an extracted package finds its own copy);
/// and [`PACKAGED_DIR`], for a binary installed elsewhere (`cargo install`) beside the
/// package.
pub fn tool_dir_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("CPI_TRACER_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        dirs.extend(
            exe.ancestors()
                .skip(1)
                .take(3)
                .map(|up| up.join("cpi-tracer")),
        );
        if let Some(prefix) = exe.parent().and_then(Path::parent) {
            dirs.push(prefix.join("lib/cpi-bpf"));
        }
    }
    dirs.push(PathBuf::from(PACKAGED_DIR));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// `dirs` for a message, comma-separated, each escaped for a terminal.
pub(crate) fn display_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| crate::fsafe::escape(&d.to_string_lossy()).into_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first of [`tool_dir_candidates`] that holds the built tool.
pub fn find_tool_dir() -> Result<PathBuf, SimError> {
    let tried = tool_dir_candidates();
    tried
        .iter()
        .find(|d| d.join(TOOL_FILE).is_file())
        .cloned()
        .ok_or(SimError::ToolNotFound { tried })
}

/// Valgrind options every traced run uses (each avoids a measured trap): no chasing
/// (VEX would speculate across branches), no libc/C++ freeres at exit (code the
/// program itself never runs); exec followed (the tool keeps forked children out).
pub(crate) fn valgrind_command(tool_dir: &Path, trace: &Path, cmd: &[OsString]) -> Command {
    let mut c = Command::new("valgrind");
    c.env("VALGRIND_LIB", tool_dir)
        .arg("-q")
        .arg(format!("--tool={TOOL}"))
        .arg(format!("--cpi-out={}", trace.display()))
        .arg("--vex-guest-chase=no")
        .arg("--run-libc-freeres=no")
        .arg("--run-cxx-freeres=no")
        .arg("--trace-children=yes")
        .arg("--")
        .args(cmd);
    c
}

fn check_cmd(cmd: &[OsString]) -> Result<(), SimError> {
    if cmd.is_empty() {
        return Err(SimError::NoCommand);
    }
    Ok(())
}

/// Runs `cmd` under the tracer writing the trace to the file `out` (created or
/// emptied here: the tool appends, once per program the process runs).
pub fn record_trace(
    tool_dir: &Path,
    cmd: &[OsString],
    out: &Path,
    stdout: Stdio,
) -> Result<ExitStatus, SimError> {
    check_cmd(cmd)?;
    File::create(out).map_err(|e| SimError::TraceFile(out.to_path_buf(), e))?;
    valgrind_command(tool_dir, out, cmd)
        .stdout(stdout)
        .status()
        .map_err(SimError::Spawn)
}

/// A private temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, SimError> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "cpi-sim-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&p).map_err(|e| SimError::Fifo(p.clone(), e))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `cmd` under the tracer and hands the live trace to `consume` while it runs.
/// Returns what `consume` returned and the command's exit status.
pub(crate) fn run_streaming<T>(
    tool_dir: &Path,
    cmd: &[OsString],
    stdout: Stdio,
    consume: impl FnOnce(File) -> Result<T, SimError>,
) -> Result<(T, ExitStatus), SimError> {
    check_cmd(cmd)?;
    let dir = TempDir::new()?;
    let fifo = dir.0.join("trace.fifo");
    crate::fsafe::create_fifo(&fifo).map_err(|e| SimError::Fifo(fifo.clone(), e))?;
    // A write end held until Valgrind is gone: between the programs of an exec the
    // FIFO has no other writer, and the reader must not take that for the end. Opened
    // read-write, which never blocks on a FIFO; close-on-exec, so Valgrind lacks it.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .map_err(|e| SimError::Fifo(fifo.clone(), e))?;
    let mut child = valgrind_command(tool_dir, &fifo, cmd)
        .stdout(stdout)
        .spawn()
        .map_err(SimError::Spawn)?;
    let pid = child.id();
    let watcher = std::thread::spawn(move || {
        let status = child.wait();
        drop(held);
        status
    });
    let result = File::open(&fifo)
        .inspect(|f| {
            // The tool writes 1 MiB blocks: a pipe that holds one lets both sides run
            // instead of trading 64 KiB turns. Best effort (capped by pipe-max-size).
            let _ = sys::set_pipe_size(f, 1 << 20);
        })
        .map_err(|e| SimError::Fifo(fifo.clone(), e))
        .and_then(consume);
    if result.is_err() {
        // Stop a tracer that would block on a FIFO nobody reads any more.
        sys::kill(pid);
    }
    let status = watcher
        .join()
        .map_err(|_| SimError::Spawn(std::io::Error::other("watcher thread panicked")))?
        .map_err(SimError::Spawn)?;
    match result {
        Ok(t) => Ok((t, status)),
        // A trace cut short because Valgrind failed: the failure is the news.
        Err(SimError::Trace(_)) if !status.success() => Err(SimError::Valgrind(status)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An installed binary finds the tool under its own prefix, then at the packaged
    /// path; the build tree's folders come first.
    #[test]
    fn candidates_cover_the_install_prefix_and_the_package() {
        let exe = std::env::current_exe().unwrap();
        let dirs = tool_dir_candidates();
        let prefix = exe.parent().and_then(Path::parent).unwrap();
        let own = dirs.iter().position(|d| *d == prefix.join("lib/cpi-bpf"));
        let build = dirs.iter().position(|d| *d == prefix.join("cpi-tracer"));
        assert!(build < own && own.is_some(), "{dirs:?}");
        assert_eq!(dirs.last().unwrap(), Path::new(PACKAGED_DIR));
    }
}
