//! The raw system calls of [`super`]: `openat` with explicit flags, `openat2` with
//! `RESOLVE_IN_ROOT`, `readlinkat`, `fstatfs`, `mkfifo`, `fcntl` (clearing `O_NONBLOCK`),
//! the `SIGBUS` handler's `sigaction`/`mmap`, the user and group databases (`getgrnam_r`,
//! `getpwuid_r`, `getgrouplist`), `poll`, and a thread's filesystem identity
//! (`setfsuid`, `setfsgid`, `setgroups`). Callers get owned fds and `io::Result`s. The
//! `SIGBUS` guard of mapped files is [`map`].

pub mod map;

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// Flags of every read-only open on another's behalf: a FIFO or a device opens without
/// waiting for a writer or becoming our terminal, and no child inherits the fd.
pub(crate) const READ_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `openat(dir, path, flags, mode)`; `dir` `None` is `AT_FDCWD`.
pub fn openat(
    dir: Option<&OwnedFd>,
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let p = cstr(path.as_os_str())?;
    let d = dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
    // SAFETY: a NUL-terminated path that outlives the call.
    owned(unsafe { libc::openat(d, p.as_ptr(), flags, libc::c_uint::from(mode)) }.into())
}

/// `openat2(dir, path, {flags, resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS})`:
/// `path` resolved as if `dir` were `/` (`..` and absolute symlinks stay inside it).
/// `ENOSYS` on kernels before 5.6.
pub(crate) fn openat2_in_root(
    dir: &OwnedFd,
    path: &Path,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: all-zero is a valid `open_how` (no flags, no mode, no resolve bits).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `how` and `p` outlive the call; the size is `how`'s own.
    owned(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            p.as_ptr(),
            &raw const how,
            size_of::<libc::open_how>(),
        )
    })
}

/// `readlinkat(dir, name)`.
pub(crate) fn readlinkat(dir: &OwnedFd, name: &OsStr) -> io::Result<OsString> {
    let p = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is writable for its length; `p` is NUL-terminated.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            p.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// `mkfifo(path, mode)`.
pub fn mkfifo(path: &Path, mode: libc::mode_t) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::mkfifo(p.as_ptr(), mode) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Clears `O_NONBLOCK` on `fd`: reads and writes wait from now on.
pub(crate) fn set_blocking(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: F_GETFL and F_SETFL take and return plain integers.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0
        || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fstat(fd)`.
pub(crate) fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is valid; the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live fd and a writable `stat`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &raw mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// The filesystem type of an open file (`fstatfs`'s `f_type`, a `*_MAGIC` of statfs(2)).
pub(crate) fn fs_type(fd: &impl AsRawFd) -> io::Result<i64> {
    // SAFETY: an all-zero `statfs` is valid; the kernel fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a live fd and a writable `statfs`.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &raw mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type)
}

/// Installs `handler` for `SIGBUS` (`SA_SIGINFO | SA_NODEFER | SA_ONSTACK`); returns the
/// action it replaces.
pub(crate) fn install_sigbus(
    handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
) -> io::Result<libc::sigaction> {
    // SAFETY: an all-zero `sigaction` is valid (empty mask, no flags) before being filled.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as `new`; the kernel fills it with the old disposition.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = handler as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
    // SAFETY: valid pointers to initialised `sigaction`s.
    if unsafe { libc::sigaction(libc::SIGBUS, &raw const new, &raw mut old) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

/// Maps zeros, read-only, over `len` bytes at `start` as one anonymous mapping
/// (async-signal-safe: one syscall).
pub(crate) fn zeros_over(start: usize, len: usize) -> bool {
    // SAFETY: `start` is page-aligned and `start..start + len` is a mapping this process
    // owns and reads only through the slice it registered (fsafe/sys/map.rs); MAP_FIXED
    // replaces exactly that range, so no other mapping is touched.
    let p = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// The effective user id: whose files count as this process's own.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The soft `RLIMIT_NOFILE` (1024 when it cannot be read).
pub fn soft_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: a valid, writable rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) };
    lim.rlim_cur
}

/// The page size (4096 on x86-64; asked once).
pub fn page_size() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *SIZE.get_or_init(|| unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize)
}

/// The gid of group `name` from the group database; `None` when there is no such group.
pub(crate) fn getgrnam(name: &str) -> io::Result<Option<u32>> {
    let c = cstr(OsStr::new(name))?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: an all-zero `group` is a valid value to be filled in.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated name, out-pointers and a buffer of its length.
        let r = unsafe {
            libc::getgrnam_r(
                c.as_ptr(),
                &raw mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &raw mut found,
            )
        };
        match r {
            0 if found.is_null() => return Ok(None),
            0 => return Ok(Some(grp.gr_gid)),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// `PIPEFS_MAGIC` (statfs(2)): an anonymous pipe (`|`, `<(…)`), not a FIFO with a name.
pub(crate) const PIPEFS_MAGIC: i64 = 0x5049_5045;

/// Waits at most `timeout_ms` for `fd` to be readable or hung up (`poll`); `false` when
/// the time ran out.
pub(crate) fn poll_readable(fd: &impl AsRawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid, writable pollfd.
        match unsafe { libc::poll(&raw mut p, 1, timeout_ms) } {
            n if n > 0 => return Ok(true),
            0 => return Ok(false),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// The primary group and every group of user `uid` from the user and group databases
/// (`getpwuid_r`, `getgrouplist`); `None` when no user has that uid.
pub(crate) fn groups_of(uid: u32) -> io::Result<Option<(u32, Vec<u32>)>> {
    let mut buf = vec![0u8; 4096];
    let (name, gid) = loop {
        // SAFETY: an all-zero `passwd` is a valid value to be filled in.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: valid out-pointers and a buffer of its length.
        let r = unsafe {
            libc::getpwuid_r(
                uid,
                &raw mut pw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &raw mut found,
            )
        };
        match r {
            0 if found.is_null() => return Ok(None),
            // SAFETY: `pw_name` points into `buf`, NUL-terminated, alive here.
            0 => {
                break (
                    unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }.to_owned(),
                    pw.pw_gid,
                )
            }
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    };
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: a NUL-terminated name and a writable array of `n` gids.
        let r = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &raw mut n) };
        if r >= 0 {
            groups.truncate(n.max(0) as usize);
            return Ok(Some((gid, groups)));
        }
        if groups.len() >= 1 << 16 {
            return Ok(Some((gid, vec![gid])));
        }
        groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
    }
}

/// `SECBIT_NO_SETUID_FIXUP`: when set, a filesystem uid leaving 0 keeps the capabilities
/// that bypass permission checks.
const SECBIT_NO_SETUID_FIXUP: libc::c_int = 1 << 2;

/// Runs `f` on a new thread whose filesystem identity is `uid`, `gid` and `groups`, so
/// every path it opens is checked by the kernel as for that user: mode bits along every
/// directory, ACLs, links, mounts, at the moment of the open (no check-then-open race).
/// Credentials are per thread in Linux: `setfsuid`/`setfsgid` and the raw `setgroups`
/// system call change this thread only (glibc's `setgroups` would change every thread),
/// and the thread ends with `f`. A filesystem uid leaving 0 drops `CAP_DAC_OVERRIDE` and
/// `CAP_DAC_READ_SEARCH` from the thread (capabilities(7)), unless
/// `SECBIT_NO_SETUID_FIXUP` says otherwise: then, or when a switch does not take (no
/// `CAP_SETUID`), `EPERM` and `f` is not run.
pub fn as_user<T: Send>(
    uid: u32,
    gid: u32,
    groups: &[u32],
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    let switch = || -> io::Result<()> {
        let denied = || io::Error::from_raw_os_error(libc::EPERM);
        // SAFETY: prctl with PR_GET_SECUREBITS takes no pointers.
        let bits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS) };
        if bits < 0 || bits & SECBIT_NO_SETUID_FIXUP != 0 {
            return Err(denied());
        }
        // SAFETY: a valid array of `groups.len()` gids; this thread's groups only.
        if unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: setfsgid/setfsuid take plain ids; -1 (invalid) only reads the current one.
        unsafe { libc::setfsgid(gid) };
        // SAFETY: as above.
        let fsgid = unsafe { libc::setfsgid(u32::MAX) };
        // SAFETY: as above.
        unsafe { libc::setfsuid(uid) };
        // SAFETY: as above.
        let fsuid = unsafe { libc::setfsuid(u32::MAX) };
        if fsgid as u32 != gid || fsuid as u32 != uid {
            return Err(denied());
        }
        Ok(())
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            switch()?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(io::Error::other(
                "a thread opening as another user panicked",
            ))
        })
    })
}
