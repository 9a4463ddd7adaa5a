//! The system calls that start, signal and reap the command a one-shot profiles, and
//! the facts of the running system the collector asks for (online CPUs when sysfs has
//! none, `uname -r`). Callers get owned fds, `io::Result`s and plain values.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `sysconf(_SC_NPROCESSORS_ONLN)`, at least 1.
pub(crate) fn online_cpu_count() -> u32 {
    // SAFETY: sysconf only reads constants of the running system.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32
}

/// `uname -r`; "unknown" when uname fails.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data (zeroed is a valid value); uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a local utsname.
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return "unknown".to_string();
    }
    // SAFETY: the kernel NUL-terminates release within its array.
    unsafe { CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Whether this process may execute `path` (`access(X_OK)`).
pub(crate) fn can_execute(path: &CStr) -> bool {
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

/// Sends `sig` to process `pid`; errors (it is gone) are the caller's to ignore.
pub fn kill(pid: u32, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill has no memory effects.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The pipes of a child forked by [`fork_waiting_exec`], the child's ends.
pub(crate) struct ChildEnds {
    /// Read until one byte comes (exec) or end-of-file (the parent gave up: exit 127).
    pub go: OwnedFd,
    /// Where an exec failure's errno is written (closed on a successful exec).
    pub exec_error: OwnedFd,
}

/// Forks; the child closes `parent_ends` (with them open, the parent's exit would never
/// reach its read as end-of-file), waits for a byte on `ends.go`, then execs `path`
/// with `argv`, writing errno to `ends.exec_error` if exec fails. Returns the child's
/// pid to the parent.
pub(crate) fn fork_waiting_exec(
    path: &CString,
    argv: &[CString],
    ends: ChildEnds,
    parent_ends: [&OwnedFd; 2],
) -> io::Result<u32> {
    // Everything the child touches is prepared before the fork.
    let mut c_argv: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    let close = parent_ends.map(|f| f.as_raw_fd());
    let (go, err) = (ends.go.as_raw_fd(), ends.exec_error.as_raw_fd());
    // SAFETY: the child only calls async-signal-safe functions (close, read, execv,
    // write, _exit) on memory prepared before the fork, and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: as above; c_argv is NULL-terminated, its strings live in `argv`.
        unsafe {
            libc::close(close[0]);
            libc::close(close[1]);
            let mut b = 0u8;
            if libc::read(go, (&raw mut b).cast(), 1) != 1 {
                libc::_exit(127); // the collector gave up before releasing us
            }
            libc::execv(path.as_ptr(), c_argv.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err, (&raw const errno).cast(), 4);
            libc::_exit(127);
        }
    }
    Ok(pid as u32)
}

/// Writes one byte to `fd`.
pub(crate) fn write_byte(fd: &OwnedFd, b: u8) -> io::Result<()> {
    // SAFETY: writing one byte from a local.
    if unsafe { libc::write(fd.as_raw_fd(), (&raw const b).cast(), 1) } != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads a native-endian `i32` from `fd`; `None` at end-of-file or on a short read.
pub(crate) fn read_i32(fd: &OwnedFd) -> Option<i32> {
    let mut v = 0i32;
    // SAFETY: reading at most 4 bytes into a local i32.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 4) };
    (n == 4).then_some(v)
}

/// `waitpid` on our child `pid` (`WNOHANG` when `block` is false): `Ok(None)` while it
/// runs, else its raw wait status.
pub fn waitpid(pid: u32, block: bool) -> io::Result<Option<i32>> {
    let mut status = 0;
    let flags = if block { 0 } else { libc::WNOHANG };
    // SAFETY: a valid pointer to a local status.
    match unsafe { libc::waitpid(pid as i32, &raw mut status, flags) } {
        0 => Ok(None),
        r if r == pid as i32 => Ok(Some(status)),
        _ => Err(io::Error::last_os_error()),
    }
}
