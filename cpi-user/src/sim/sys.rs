//! The simulator's calls into the C library, for running the tracer
//! (cpi-user/src/sim/run.rs): `F_SETPIPE_SZ` and `kill`.

use std::io;
use std::os::fd::AsRawFd;

/// Asks for a pipe buffer of `bytes` (`F_SETPIPE_SZ`; refused above
/// `/proc/sys/fs/pipe-max-size` for users without `CAP_SYS_RESOURCE`).
pub(crate) fn set_pipe_size(pipe: &impl AsRawFd, bytes: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl with an integer argument on a descriptor the caller holds.
    if unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `SIGKILL` to process `pid`.
pub fn kill(pid: u32) {
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
}
