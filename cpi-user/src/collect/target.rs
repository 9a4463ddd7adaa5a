//! What to profile: existing pids (all their threads), every CPU, or a command started
//! suspended so its events exist before its first instruction.

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::sys::process as sys;
use super::CollectError;
use crate::procmap::{self, ProcStat};

/// What a session profiles (`--pid`, `--system-wide` or `-- CMD`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// These processes, every thread, and the processes they fork from then on: as
    /// root counted per CPU, the tree followed by the kernel filter; without root,
    /// per thread through `inherit`.
    Pids(Vec<u32>),
    /// Every CPU, every process.
    SystemWide,
    /// Start this command and follow it and its children (counted as [`Target::Pids`]).
    Command(Vec<String>),
    /// Every CPU, every process, for as long as this command runs (perf's `-a -- CMD`).
    SystemWideWhile(Vec<String>),
    /// Every CPU, only what the filter keeps, dropped in the kernel (the agent's `--pid`
    /// and `--cgroup`: cpi-user/src/collect/filter.rs). With pids, ends when they exit.
    Filtered(super::Filter),
}

impl Target {
    /// The command cpi-bpf starts, if any.
    pub fn command(&self) -> Option<&[String]> {
        match self {
            Target::Command(argv) | Target::SystemWideWhile(argv) => Some(argv),
            Target::Pids(_) | Target::SystemWide | Target::Filtered(_) => None,
        }
    }
}

/// The thread ids of `pid` ([`procmap::threads`]).
pub fn threads(pid: u32) -> Result<Vec<u32>, CollectError> {
    procmap::threads(pid).map_err(|_| CollectError::NoSuchProcess(pid))
}

/// Online CPUs (`/sys/devices/system/cpu/online`, e.g. `0-3,6`).
pub fn online_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = parse_cpu_list(&text);
    if cpus.is_empty() {
        cpus.extend(0..sys::online_cpu_count());
    }
    cpus
}

/// A kernel CPU list (`0-3,6`, as sysfs `online` and a PMU's `cpus` write it); parts
/// that do not parse are left out.
pub(crate) fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
            // Bounded: a CPU list names at most a few thousand CPUs.
            cpus.extend(a..=b.min(a.saturating_add(65_535)));
        }
    }
    cpus
}

/// `/proc/PID/comm`, empty when the process is gone.
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// Start time of a live process ([`ProcStat::start`]): with the pid, what identifies a
/// process across pid reuse. `None` once it has exited, reaped or not.
pub fn process_start(pid: u32) -> Option<u64> {
    comm_and_start(pid).map(|(_, start)| start)
}

/// Name and start time of a live process from one read of `/proc/PID/stat`: a process
/// seen for the first time costs one `/proc` read for both. `None` once it has exited
/// ([`ProcStat::exited`]).
pub(crate) fn comm_and_start(pid: u32) -> Option<(String, u64)> {
    let stat = ProcStat::of(pid).filter(|s| !s.exited())?;
    Some((stat.comm, stat.start))
}

/// Resolves `cmd` like `execvp` does: a name with a `/` as given, else through `PATH`.
/// A file that exists but cannot be executed (or a directory) is
/// [`CollectError::NotExecutable`], not "not found".
pub fn resolve_command(cmd: &str) -> Result<PathBuf, CollectError> {
    let executable = |p: &Path| {
        p.is_file() && CString::new(p.as_os_str().as_bytes()).is_ok_and(|c| sys::can_execute(&c))
    };
    let not_executable = || CollectError::NotExecutable(cmd.to_string());
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return if executable(&p) {
            Ok(p)
        } else if p.exists() {
            Err(not_executable())
        } else {
            Err(CollectError::CommandNotFound(cmd.to_string()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let candidates: Vec<PathBuf> = std::env::split_paths(&path).map(|d| d.join(cmd)).collect();
    if let Some(p) = candidates.iter().find(|p| executable(p)) {
        return Ok(p.clone());
    }
    if candidates.iter().any(|p| p.is_file()) {
        return Err(not_executable());
    }
    Err(CollectError::CommandNotFound(cmd.to_string()))
}

/// The process (thread group) `tid` belongs to, from `/proc/TID/status`; `None` when
/// there is no such task.
pub(crate) fn process_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The processes to profile for `--pid` arguments: each thread id resolved to its
/// process (said in `notes`), each process once, in the order given. A pid with no
/// task is [`CollectError::NoSuchProcess`]; one whose process has exited but is not
/// reaped, [`CollectError::Exited`].
pub(crate) fn resolve_pids(pids: &[u32]) -> Result<(Vec<u32>, Vec<String>), CollectError> {
    let (mut out, mut notes) = (Vec::new(), Vec::new());
    for &pid in pids {
        let tgid = process_of(pid).ok_or(CollectError::NoSuchProcess(pid))?;
        match ProcStat::of(tgid) {
            None => return Err(CollectError::NoSuchProcess(pid)),
            Some(s) if s.exited() => {
                return Err(CollectError::Exited {
                    pid: tgid,
                    parent: s.parent,
                })
            }
            Some(_) => {}
        }
        if tgid != pid {
            notes.push(format!(
                "pid {pid} is a thread of process {tgid}: profiling process {tgid}, all its threads"
            ));
        }
        if out.contains(&tgid) {
            if tgid == pid {
                notes.push(format!("pid {pid} given more than once: profiled once"));
            }
        } else {
            out.push(tgid);
        }
    }
    Ok((out, notes))
}

/// A child cpi-bpf started: killed (SIGKILL) and reaped when dropped before it was
/// waited for, so no failure path leaves it running.
#[derive(Debug)]
pub struct Child {
    pid: u32,
    reaped: bool,
}

impl Child {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the child to exit; its status as a shell shows it.
    pub fn wait(mut self) -> Option<i32> {
        self.reaped = true;
        reap(self.pid)
    }

    /// Asks the child to end (SIGTERM), waits up to `grace`, then kills it (SIGKILL).
    /// Returns its status and whether it had to be killed.
    pub(crate) fn terminate(mut self, grace: Duration) -> (Option<i32>, bool) {
        self.reaped = true;
        // Our own child, not yet reaped: the pid is still its.
        let _ = sys::kill(self.pid, libc::SIGTERM);
        let until = Instant::now() + grace;
        loop {
            if let Some(status) = try_reap(self.pid) {
                return (status, false);
            }
            if Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = sys::kill(self.pid, libc::SIGKILL);
        (reap(self.pid), true)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = sys::kill(self.pid, libc::SIGKILL);
            reap(self.pid);
        }
    }
}

/// A forked child blocked before `exec` until [`Suspended::release`]; killed and reaped
/// when dropped unreleased.
#[derive(Debug)]
pub(crate) struct Suspended {
    child: Child,
    go: OwnedFd,
    exec_error: OwnedFd,
    name: String,
}

/// Forks `argv`; the child waits for [`Suspended::release`] and then execs. This is
/// what `perf record -- CMD` does: events are opened on the child's pid with
/// `enable_on_exec`, so counting starts exactly at `exec`.
pub(crate) fn spawn_suspended(argv: &[String]) -> Result<Suspended, CollectError> {
    let name = argv.first().ok_or(CollectError::NoTarget)?.clone();
    let path = resolve_command(&name)?;
    let spawn_err = |cause| CollectError::Spawn {
        cmd: name.clone(),
        cause,
    };
    let nul = |s: &[u8]| CString::new(s).map_err(|_| spawn_err(io::ErrorKind::InvalidInput.into()));
    let c_path = nul(path.as_os_str().as_bytes())?;
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| nul(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let (go_r, go_w) = sys::pipe().map_err(spawn_err)?;
    let (err_r, err_w) = sys::pipe().map_err(spawn_err)?;
    let ends = sys::ChildEnds {
        go: go_r,
        exec_error: err_w,
    };
    let pid = sys::fork_waiting_exec(&c_path, &c_args, ends, [&go_w, &err_r]).map_err(spawn_err)?;
    Ok(Suspended {
        child: Child { pid, reaped: false },
        go: go_w,
        exec_error: err_r,
        name,
    })
}

impl Suspended {
    /// The suspended child's process id, to open its events on before it runs.
    pub fn pid(&self) -> u32 {
        self.child.pid
    }

    /// Lets the child exec; `Err` when exec failed (its errno).
    pub fn release(self) -> Result<Child, CollectError> {
        // A child already gone reads end-of-file below, as after a successful exec.
        let _ = sys::write_byte(&self.go, 1);
        drop(self.go);
        // End-of-file: the CLOEXEC pipe closed, exec succeeded.
        if let Some(errno) = sys::read_i32(&self.exec_error) {
            self.child.wait();
            return Err(CollectError::Spawn {
                cmd: self.name,
                cause: io::Error::from_raw_os_error(errno),
            });
        }
        Ok(self.child)
    }
}

fn exit_status(status: i32) -> Option<i32> {
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Some(128 + libc::WTERMSIG(status))
    } else {
        None
    }
}

/// Waits for our child `pid` and returns its exit status (as a shell shows it).
pub fn reap(pid: u32) -> Option<i32> {
    exit_status(sys::waitpid(pid, true).ok()??)
}

/// `Some(status)` when our child `pid` has exited (and is now reaped), `None` while it
/// runs.
fn try_reap(pid: u32) -> Option<Option<i32>> {
    match sys::waitpid(pid, false) {
        Ok(None) => None,
        Ok(Some(status)) => Some(exit_status(status)),
        Err(_) => Some(None), // not our child any more (already reaped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procmap::alive;

    #[test]
    fn resolves_through_path_and_rejects_missing() {
        assert!(resolve_command("sh").unwrap().is_absolute());
        assert!(matches!(
            resolve_command("no-such-command-cpi-bpf"),
            Err(CollectError::CommandNotFound(_))
        ));
        assert!(matches!(
            resolve_command("/nonexistent/bin/x"),
            Err(CollectError::CommandNotFound(_))
        ));
    }

    #[test]
    fn suspended_child_runs_only_after_release() {
        let dir = std::env::temp_dir().join(format!("cpi-spawn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("ran");
        let child = spawn_suspended(&[
            "sh".into(),
            "-c".into(),
            format!("touch {}", marker.display()),
        ])
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!marker.exists(), "child ran before release");
        let child = child.release().unwrap();
        assert_eq!(child.wait(), Some(0));
        assert!(marker.exists());
    }

    #[test]
    fn unreleased_child_is_killed_and_reaped_when_dropped() {
        // Every failure after the fork (an event that does not open, a ring that does not
        // register) drops the Suspended child: it must not be left blocked, holding our
        // stdout, reparented to init.
        let child = spawn_suspended(&["sleep".into(), "100".into()]).unwrap();
        let pid = child.pid();
        assert!(alive(pid));
        drop(child);
        assert!(!alive(pid), "child {pid} still there after drop");
    }

    #[test]
    fn released_child_is_killed_and_reaped_when_dropped() {
        let child = spawn_suspended(&["sleep".into(), "100".into()])
            .unwrap()
            .release()
            .unwrap();
        let pid = child.pid();
        drop(child);
        assert!(!alive(pid), "child {pid} still there after drop");
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
        let child = spawn_suspended(&[
            "sh".into(),
            "-c".into(),
            "trap '' TERM INT; while :; do sleep 0.01; done".into(),
        ])
        .unwrap()
        .release()
        .unwrap();
        std::thread::sleep(Duration::from_millis(100)); // let sh install its traps
        let t = Instant::now();
        let (status, killed) = child.terminate(Duration::from_millis(300));
        assert!(killed, "sh ignoring SIGTERM ended by itself?");
        assert_eq!(status, Some(128 + libc::SIGKILL));
        assert!(t.elapsed() < Duration::from_secs(3));
        let child = spawn_suspended(&["sleep".into(), "100".into()])
            .unwrap()
            .release()
            .unwrap();
        let (status, killed) = child.terminate(Duration::from_secs(5));
        assert_eq!((status, killed), (Some(128 + libc::SIGTERM), false));
    }

    #[test]
    fn threads_resolve_to_their_process_and_duplicates_go() {
        let me = std::process::id();
        let t = std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            std::thread::sleep(Duration::from_millis(300));
            tid
        });
        std::thread::sleep(Duration::from_millis(50));
        let tid = threads(me).unwrap().into_iter().find(|&t| t != me).unwrap();
        let (pids, notes) = resolve_pids(&[me, me, tid]).unwrap();
        assert_eq!(pids, [me]);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("more than once"), "{notes:?}");
        assert!(
            notes[1].contains(&format!("thread of process {me}")),
            "{notes:?}"
        );
        t.join().unwrap();
        assert!(matches!(
            resolve_pids(&[u32::MAX - 1]),
            Err(CollectError::NoSuchProcess(_))
        ));
        let zombie = cpi_tests::Zombie::spawn();
        let r = resolve_pids(&[zombie.pid()]);
        assert!(
            matches!(r, Err(CollectError::Exited { pid, parent }) if pid == zombie.pid() && parent == me),
            "an exited, unreaped process is profiled: {r:?}"
        );
    }

    #[test]
    fn existing_files_that_cannot_run_are_not_executable() {
        assert!(matches!(
            resolve_command("/etc/passwd"),
            Err(CollectError::NotExecutable(_))
        ));
        assert!(matches!(
            resolve_command("/etc"),
            Err(CollectError::NotExecutable(_))
        ));
    }

    #[test]
    fn threads_and_cpus() {
        let me = std::process::id();
        assert!(threads(me).unwrap().contains(&me));
        assert!(matches!(
            threads(u32::MAX - 1),
            Err(CollectError::NoSuchProcess(_))
        ));
        assert!(!online_cpus().is_empty());
    }
}
