//! What to profile: existing pids (all their threads), every CPU, or a command started
//! suspended so its events exist before its first instruction.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::CollectError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// These processes, every thread (existing ones, and new ones through `inherit`).
    Pids(Vec<u32>),
    /// Every CPU, every process.
    SystemWide,
    /// Start this command and follow it and its children.
    Command(Vec<String>),
}

/// The process (thread group) that thread `tid` belongs to (`Tgid:` in
/// `/proc/TID/status`; a process's own pid gives itself).
pub fn thread_group(tid: u32) -> Result<u32, CollectError> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .map_err(|_| CollectError::NoSuchProcess(tid))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(CollectError::NoSuchProcess(tid))
}

/// The processes behind `--pid` values, each once: a thread id stands for its process
/// (`notes` says so), and a process given twice, or with one of its threads, is
/// profiled once, so its samples are never counted twice.
pub fn resolve_pids(pids: &[u32]) -> Result<(Vec<u32>, Vec<String>), CollectError> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for &pid in pids {
        let tgid = thread_group(pid)?;
        if tgid != pid {
            notes.push(format!(
                "pid {pid} is a thread of process {tgid}: profiling process {tgid}"
            ));
        }
        if !out.contains(&tgid) {
            out.push(tgid);
        }
    }
    Ok((out, notes))
}

/// The thread ids of `pid` (`/proc/PID/task`).
pub fn threads(pid: u32) -> Result<Vec<u32>, CollectError> {
    let rd = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|_| CollectError::NoSuchProcess(pid))?;
    let mut tids: Vec<u32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// Online CPUs (`/sys/devices/system/cpu/online`, e.g. `0-3,6`).
pub fn online_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
            cpus.extend(a..=b);
        }
    }
    if cpus.is_empty() {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
        cpus.extend(0..n);
    }
    cpus
}

/// `/proc/PID/comm`, empty when the process is gone.
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// Resolves `cmd` like `execvp` does: a name with a `/` as given, else through `PATH`.
pub fn resolve_command(cmd: &str) -> Result<PathBuf, CollectError> {
    let executable = |p: &Path| {
        p.is_file()
            && CString::new(p.as_os_str().as_bytes())
                // SAFETY: valid C string.
                .map(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0)
                .unwrap_or(false)
    };
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return if executable(&p) {
            Ok(p)
        } else if p.exists() {
            Err(CollectError::NotExecutable(cmd.to_string()))
        } else {
            Err(CollectError::CommandNotFound(cmd.to_string()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| executable(p))
        .ok_or_else(|| CollectError::CommandNotFound(cmd.to_string()))
}

/// A forked child blocked before `exec` until [`Suspended::release`]. Dropped without
/// being released (any failure between the fork and the release), it is killed and
/// reaped: a failed start never leaves a child behind.
#[derive(Debug)]
pub struct Suspended {
    pub pid: u32,
    go: Option<OwnedFd>,
    exec_error: OwnedFd,
    name: String,
}

impl Drop for Suspended {
    fn drop(&mut self) {
        if self.go.is_some() {
            // SAFETY: signalling our own, never-released child.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
            reap(self.pid);
        }
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks `argv`; the child waits for [`Suspended::release`] and then execs. This is
/// what `perf record -- CMD` does: events are opened on the child's pid with
/// `enable_on_exec`, so counting starts exactly at `exec`.
pub fn spawn_suspended(argv: &[String]) -> Result<Suspended, CollectError> {
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
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    let (go_r, go_w) = pipe().map_err(spawn_err)?;
    let (err_r, err_w) = pipe().map_err(spawn_err)?;
    // SAFETY: the child only calls async-signal-safe functions (read, execv, write,
    // _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(spawn_err(io::Error::last_os_error()));
    }
    if pid == 0 {
        unsafe {
            // The child must not hold the pipes' other ends (or the release pipe never
            // reads EOF when the collector gives up), nor the collector's signal
            // handlers (SIGTERM must end it before exec; exec resets them anyway).
            libc::close(go_w.as_raw_fd());
            libc::close(err_r.as_raw_fd());
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            let mut b = 0u8;
            if libc::read(go_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1) != 1 {
                libc::_exit(127); // the collector gave up before releasing us
            }
            libc::execv(c_path.as_ptr(), c_argv.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err_w.as_raw_fd(), (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    drop((go_r, err_w));
    Ok(Suspended {
        pid: pid as u32,
        go: Some(go_w),
        exec_error: err_r,
        name,
    })
}

impl Suspended {
    /// Lets the child exec; `Err` when exec failed (its errno).
    pub fn release(mut self) -> Result<u32, CollectError> {
        let b = 1u8;
        let go = self.go.take().expect("released once");
        // SAFETY: writing one byte from a local.
        unsafe { libc::write(go.as_raw_fd(), (&b as *const u8).cast(), 1) };
        drop(go);
        let mut errno = 0i32;
        // EOF (0 bytes): the CLOEXEC pipe closed, exec succeeded.
        // SAFETY: reading at most 4 bytes into a local i32.
        let n = unsafe {
            libc::read(
                self.exec_error.as_raw_fd(),
                (&mut errno as *mut i32).cast(),
                4,
            )
        };
        if n == 4 {
            reap(self.pid);
            return Err(CollectError::Spawn {
                cmd: self.name.clone(),
                cause: io::Error::from_raw_os_error(errno),
            });
        }
        Ok(self.pid)
    }
}

/// Waits for our child `pid` and returns its exit status (as a shell shows it).
pub fn reap(pid: u32) -> Option<i32> {
    wait(pid, 0)
}

/// [`reap`] if our child `pid` has already exited, else `None` at once.
pub fn try_reap(pid: u32) -> Option<i32> {
    wait(pid, libc::WNOHANG)
}

fn wait(pid: u32, flags: i32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: plain waitpid on our own child.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, flags) };
    if r != pid as i32 {
        return None;
    }
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Some(128 + libc::WTERMSIG(status))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let pid = child.release().unwrap();
        assert_eq!(reap(pid), Some(0));
        assert!(marker.exists());
    }

    #[test]
    fn a_child_never_released_is_killed_and_reaped() {
        let child = spawn_suspended(&["sleep".into(), "100".into()]).unwrap();
        let pid = child.pid;
        drop(child);
        // Reaped: no zombie, no process left under that pid (the pid is not reused this
        // quickly in practice; a zombie would still have a /proc entry).
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} left behind"
        );
    }

    #[test]
    fn pids_are_deduplicated_and_threads_resolved_to_their_process() {
        let me = std::process::id();
        let worker = std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            std::thread::sleep(std::time::Duration::from_millis(200));
            tid
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let tids = threads(me).unwrap();
        let tid = *tids.iter().find(|&&t| t != me).expect("a second thread");
        let (pids, notes) = resolve_pids(&[me, me, tid]).unwrap();
        assert_eq!(pids, [me]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains(&format!("thread of process {me}")));
        worker.join().unwrap();
        assert!(matches!(
            resolve_pids(&[u32::MAX - 1]),
            Err(CollectError::NoSuchProcess(_))
        ));
    }

    #[test]
    fn a_file_that_is_not_executable_is_said_so() {
        assert!(matches!(
            resolve_command("/etc/passwd"),
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
