//! The one way cpi-bpf opens files that other users control, and creates the files it
//! writes (DESIGN.md, "Trust boundaries").
//!
//! Reading on another's behalf ([`open`], `open_in_root`): `O_NONBLOCK|O_NOCTTY`, so a
//! FIFO or a device planted at a path never blocks the open or becomes our terminal;
//! `fstat` on the fd and regular files only, so nothing is read from a FIFO or device;
//! inside a process's root, resolution cannot leave it (`openat2` with
//! `RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS`, a checked walk on kernels without it); and
//! `check_identity` compares the file with what the mapping recorded (device, inode),
//! so a path now naming another file (a library replaced by rename, a symlink to a
//! root-only file) is refused instead of read as if it were the mapped one.
//!
//! Writing ([`create_new`], [`replace`], `create_fifo`): `O_CREAT|O_EXCL|O_NOFOLLOW`,
//! mode 0600, and a temp file renamed over the destination, so a symlink planted at a
//! name is replaced, never written through; a FIFO or device the user named is opened
//! in place without waiting for a reader (`open_in_place`). [`check_private_dir`]
//! refuses a directory another user owns or can write.
//!
//! Inputs the user names (`import-perf FILE`, `report FILE`): [`open_input`] reads a
//! pipe with a writer and gives up on a FIFO nobody writes within [`FIFO_WAIT`]. As root,
//! what a recording names is opened only as the user it came from could ([`behalf`]).
//!
//! What a reader refuses of a file that exceeds its budget is counted in [`budget`](mod@budget).
//! Mapped files cannot kill the process when truncated: `map::GuardedMap`. A mapping
//! shows every later write to its file, so bytes checked once and used afterwards are
//! copied first unless `only_root_can_change` (cpi-user/src/unwind/mod.rs). Text from
//! other processes is printed through [`escape`].

pub mod behalf;
pub mod budget;
pub use sys::map;
mod sys;

pub use sys::page_size;
mod text;

pub use sys::{euid, soft_nofile_limit};
pub use text::{budget, budget_in_place, escape, MAX_NAME_BYTES};

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// A file's identity: what `/proc/PID/maps` and `PERF_RECORD_MMAP2` record for a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// From a device's major and minor numbers and an inode.
    pub fn new(major: u32, minor: u32, ino: u64) -> FileId {
        FileId {
            dev: libc::makedev(major, minor),
            ino,
        }
    }

    /// An open file's identity.
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:x}:{:02x} inode {}",
            libc::major(self.dev),
            libc::minor(self.dev),
            self.ino
        )
    }
}

/// Why a file was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The system refused.
    // The cause is part of the message and not a `source()`, so that a chain prints it once;
    // this error is rendered alone (`{e}`) in many places.
    #[error("{}: {cause}", .path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        cause: io::Error,
    },
    /// A FIFO, device, socket or directory where a regular file was expected.
    #[error("{}: not a regular file ({kind}); not read", .path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Larger than the reader takes.
    #[error("{}: larger than {max} bytes; not read", .path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// The most read.
        max: u64,
    },
    /// The path names another file than the one mapped (replaced, or a link elsewhere).
    #[error("{}: not the mapped file (it is {found}, the mapping is {want}); not read", .path.display())]
    NotTheMappedFile {
        /// The path.
        path: PathBuf,
        /// The file the path names now.
        found: FileId,
        /// The file mapped.
        want: FileId,
    },
    /// As root, a path a recording names that the user it came from cannot read
    /// ([`behalf`]).
    #[error("{}: not opened: uid {uid} cannot read it ({why})", .path.display())]
    NotReadable {
        /// The path.
        path: PathBuf,
        /// The user whose access decided.
        uid: u32,
        /// Why that user (`recording owned by uid N`).
        why: String,
    },
    /// A FIFO no one wrote to within [`FIFO_WAIT`].
    #[error("{}: a FIFO with no writer (nothing within {} s); not read", .path.display(), .waited.as_secs())]
    NoWriter {
        /// The path.
        path: PathBuf,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// The mapped file, reopened, has changed since it was captured (size, build-id):
    /// rewritten in place (cpi-user/src/procmap/captured.rs).
    #[error("{}: not the captured file ({what}); not read", .path.display())]
    NotTheCapturedFile {
        /// The path.
        path: PathBuf,
        /// What differs.
        what: String,
    },
}

impl OpenError {
    fn io(path: &Path) -> impl FnOnce(io::Error) -> OpenError + '_ {
        move |cause| OpenError::Io {
            path: path.to_path_buf(),
            cause,
        }
    }
}

/// The file type in `st_mode`, by name.
fn kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        libc::S_IFLNK => "symbolic link",
        _ => "unknown file type",
    }
}

/// `fd` as a [`File`] when it is a regular file.
fn regular(fd: OwnedFd, path: &Path) -> Result<File, OpenError> {
    let st = sys::fstat(&fd).map_err(OpenError::io(path))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(OpenError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(st.st_mode),
        });
    }
    Ok(File::from(fd))
}

/// Opens `path` for reading on another's behalf: never blocks on a FIFO or device,
/// regular files only. Symbolic links are followed (callers check identity, or the
/// path was given by the user running cpi-bpf).
pub fn open(path: &Path) -> Result<File, OpenError> {
    open_with(path, sys::READ_FLAGS)
}

/// [`open`] for a file that another file names, `writer` having written that (a source
/// file a binary's line tables name): as root, opened as `writer` could
/// ([`behalf::Owner`]; unknown, as a profile written before owners were kept: as
/// anyone), so a user's binary naming `/root/secret` does not lead root to print it.
/// Where a [`behalf::Reader`] is set (the user a recording came from), or not root, as
/// [`open`].
pub fn open_named_by(path: &Path, writer: Option<behalf::Owner>) -> Result<File, OpenError> {
    if behalf::current().is_some() || sys::euid() != 0 {
        return open(path);
    }
    let (w, why) = match writer {
        Some(behalf::Owner::ANYONE) => (
            behalf::Owner::ANYONE,
            "named by a binary that anyone may have written".to_string(),
        ),
        Some(w) => (w, format!("named by a binary of uid {}", w.uid)),
        None => (
            behalf::Owner::ANYONE,
            "named by a binary whose owner the profile does not say".to_string(),
        ),
    };
    match behalf::Reader::writer(w, why) {
        None => open(path),
        Some(r) => regular(
            r.open(path, || sys::openat(None, path, sys::READ_FLAGS, 0))?,
            path,
        ),
    }
}

/// `open(path, flags)` as the [`behalf::Reader`], if one is set, would: a path the
/// command line trusts as root (inside a trusted tree, resolved there).
fn open_with(path: &Path, flags: libc::c_int) -> Result<File, OpenError> {
    let open = || sys::openat(None, path, flags, 0);
    let fd = match behalf::current().map(|r| (r, r.trust(path))) {
        None | Some((_, behalf::Trust::File)) => open().map_err(OpenError::io(path))?,
        Some((_, behalf::Trust::Inside(root, rest))) => return open_in_root(root, &rest),
        Some((r, behalf::Trust::No)) => r.open(path, open)?,
    };
    regular(fd, path)
}

/// How long [`open_input`] waits for a FIFO's writer.
pub const FIFO_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens an input the user named (a recording, a profile file) for reading: a regular
/// file, a device, or a pipe. Opening never waits (`O_NONBLOCK`); a FIFO with a name
/// must then become readable (a writer's bytes, or its close) within `wait`, else
/// [`OpenError::NoWriter`]: a FIFO nobody opens would otherwise hang the command. An
/// anonymous pipe (`<(zcat p.json.gz)`, `/dev/fd/N`) has its writer already, or none
/// ever (read then ends at once), so it is read however slow its writer. Reads wait
/// from then on (`O_NONBLOCK` cleared). `-` is standard input, as it is.
pub fn open_input(path: &Path, wait: std::time::Duration) -> Result<File, OpenError> {
    if path.as_os_str() == "-" {
        use std::os::fd::AsFd;
        let fd = io::stdin().as_fd().try_clone_to_owned();
        return fd.map(File::from).map_err(OpenError::io(path));
    }
    let fd = sys::openat(None, path, sys::READ_FLAGS, 0).map_err(OpenError::io(path))?;
    let st = sys::fstat(&fd).map_err(OpenError::io(path))?;
    let named_fifo = st.st_mode & libc::S_IFMT == libc::S_IFIFO
        && sys::fs_type(&fd).map_err(OpenError::io(path))? != sys::PIPEFS_MAGIC;
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    if named_fifo && !sys::poll_readable(&fd, ms).map_err(OpenError::io(path))? {
        return Err(OpenError::NoWriter {
            path: path.to_path_buf(),
            waited: wait,
        });
    }
    sys::set_blocking(&fd).map_err(OpenError::io(path))?;
    Ok(File::from(fd))
}

/// The whole of a small regular file opened with [`open`], at most `max` bytes (a larger
/// file is refused, not cut).
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, OpenError> {
    use std::io::Read;
    let mut out = Vec::new();
    open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(OpenError::io(path))?;
    if out.len() as u64 > max {
        return Err(OpenError::TooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(out)
}

/// [`open`] that refuses a symbolic link as the last component (`O_NOFOLLOW`): for
/// files at well-known names in shared directories (`/tmp/perf-PID.map`).
pub(crate) fn open_nofollow(path: &Path) -> Result<File, OpenError> {
    open_with(path, sys::READ_FLAGS | libc::O_NOFOLLOW)
}

/// Opens `path` (absolute or not) as seen by a process whose root directory is `root`
/// (`/proc/PID/root`, a `--symfs` tree): `..` and symbolic links, absolute or not, never
/// lead out of `root`; regular files only, never blocking.
pub(crate) fn open_in_root(root: &Path, path: &Path) -> Result<File, OpenError> {
    let shown = root.join(path.strip_prefix("/").unwrap_or(path));
    let open = || {
        let dir = sys::openat(
            None,
            root,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )?;
        match sys::openat2_in_root(&dir, path, sys::READ_FLAGS) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => walk_in_root(&dir, path),
            r => r,
        }
    };
    let fd = match behalf::current() {
        Some(r) if !r.trusts_root(root) => r.open(&shown, open)?,
        _ => open().map_err(OpenError::io(&shown))?,
    };
    regular(fd, &shown)
}

/// Symbolic links followed by one resolution (the kernel's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// [`open_in_root`] without `openat2` (kernels before 5.6): one component at a time,
/// each opened with `O_NOFOLLOW`; a link's target is spliced into the remaining path
/// (from `root` when absolute); `..` at `root` stays there.
fn walk_in_root(root: &OwnedFd, path: &Path) -> io::Result<OwnedFd> {
    let dup = |fd: &OwnedFd| fd.try_clone();
    let mut stack: Vec<OwnedFd> = vec![dup(root)?];
    let mut rest: Vec<std::ffi::OsString> = components(path);
    rest.reverse();
    let mut links = 0;
    while let Some(name) = rest.pop() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let cur = stack.last().expect("root stays");
        let comp = Path::new(&name);
        let fd = sys::openat(
            Some(cur),
            comp,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )?;
        let st = sys::fstat(&fd)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = sys::readlinkat(cur, &name)?;
                if Path::new(&target).is_absolute() {
                    stack.truncate(1);
                }
                let mut t = components(Path::new(&target));
                t.reverse();
                rest.extend(t);
            }
            libc::S_IFDIR if !rest.is_empty() => stack.push(fd),
            _ if rest.is_empty() => {
                return sys::openat(Some(cur), comp, sys::READ_FLAGS | libc::O_NOFOLLOW, 0);
            }
            _ => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }
    // The path named `root` itself (or a directory): not a file.
    dup(stack.last().expect("root stays"))
}

fn components(p: &Path) -> Vec<std::ffi::OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsStr::new("..").to_os_string()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// `file` (opened by `path`) is the file `want` names; `None` (nothing recorded, e.g. a
/// recording from another machine) accepts it.
pub(crate) fn check_identity(
    file: &File,
    path: &Path,
    want: Option<FileId>,
) -> Result<(), OpenError> {
    let Some(want) = want else { return Ok(()) };
    let found = FileId::of(&file.metadata().map_err(OpenError::io(path))?);
    if found != want {
        return Err(OpenError::NotTheMappedFile {
            path: path.to_path_buf(),
            found,
            want,
        });
    }
    Ok(())
}

/// Creates `path`, which must not exist (not even as a dangling link), mode 0600.
pub fn create_new(path: &Path) -> io::Result<File> {
    let fd = sys::openat(
        None,
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0o600,
    )?;
    Ok(File::from(fd))
}

/// Creates a FIFO at `path` (which must not exist), mode 0600.
pub(crate) fn create_fifo(path: &Path) -> io::Result<()> {
    sys::mkfifo(path, 0o600)
}

/// Opens an existing FIFO or character device for writing in place: no create, no
/// controlling terminal, and a FIFO without a reader is an error (`ENXIO`), not a wait.
/// Writes wait once it is open (a reader is there).
pub(crate) fn open_in_place(path: &Path) -> io::Result<File> {
    let fd = sys::openat(
        None,
        path,
        libc::O_WRONLY | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        0,
    )?;
    sys::set_blocking(&fd)?;
    Ok(File::from(fd))
}

/// Writes a new `path` through a temp file in its directory (created with [`create_new`]),
/// fsync'd and renamed over `path`: whatever was at `path` (a file, a planted link) is
/// replaced, never written through, and readers see the old file or the whole new one.
pub fn replace(path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut tmp;
    let mut tries = 0;
    let mut f = loop {
        tmp = dir.join(format!(
            ".{}.{:016x}.tmp",
            name.to_string_lossy(),
            rand::random::<u64>()
        ));
        match create_new(&tmp) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
            r => break r?,
        }
    };
    let r = write(&mut f)
        .and_then(|_| f.flush())
        .and_then(|_| f.sync_all())
        .and_then(|_| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// A group named by name or number (`--store-group`), as its gid.
pub fn group_id(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match sys::getgrnam(group) {
        Ok(Some(gid)) => Ok(gid),
        Ok(None) => Err(format!("no group named {group:?}")),
        Err(e) => Err(format!("cannot look up group {group:?}: {e}")),
    }
}

/// Why a directory is not private to this user.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// `lstat` failed.
    // The cause is in the message, not a `source()` (see [`OpenError::Io`]).
    #[error("{}: {cause}", .dir.display())]
    Io {
        /// The directory.
        dir: PathBuf,
        /// Why.
        cause: io::Error,
    },
    /// Not a directory.
    #[error("{} is not a directory ({kind}); refusing to use it", .dir.display())]
    NotDir {
        /// The path.
        dir: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Another user owns it.
    #[error("{} is owned by uid {owner}, not {me}; refusing to use it", .dir.display())]
    Owner {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// Group or others may write in it.
    #[error("{} is writable by group or others (mode {mode:04o}); refusing to use it (chmod 700 it)", .dir.display())]
    Writable {
        /// The directory.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Local filesystems whose files change only through this kernel (`f_type`, statfs(2)):
/// ext2/3/4, XFS, Btrfs, tmpfs, ramfs, overlayfs, squashfs, EROFS, F2FS, ZFS. On any
/// other (FUSE, NFS, CIFS, 9p, …) a daemon or another host decides what a read returns,
/// whoever owns the file.
const LOCAL_FILESYSTEMS: [i64; 10] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x8584_58F6,
    0x794C_7630,
    0x7371_7368,
    0xE0F5_E1E2,
    0xF2F5_2010,
    0x2FC1_2FC1,
];

/// Whether only root can change `file`'s bytes: owned by root, writable by neither group
/// nor others, on a local filesystem ([`LOCAL_FILESYSTEMS`]). Anything else — another
/// owner, who can write it in place while it is mapped, or a file whose status cannot be
/// read — is `false`.
pub(crate) fn only_root_can_change(file: &File) -> bool {
    let Ok(meta) = file.metadata() else {
        return false;
    };
    meta.uid() == 0
        && meta.mode() & 0o022 == 0
        && sys::fs_type(file).is_ok_and(|t| LOCAL_FILESYSTEMS.contains(&t))
}

/// Creates `dir` (mode 0700) if missing; refuses it unless it is a directory (a link is
/// followed: its target is checked) owned by this process's effective user that no one
/// else can write.
pub fn check_private_dir(dir: &Path) -> Result<(), DirError> {
    let io = |cause| DirError::Io {
        dir: dir.to_path_buf(),
        cause,
    };
    if let Err(e) = std::fs::symlink_metadata(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(io(e));
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    let meta = std::fs::metadata(dir).map_err(io)?;
    if !meta.is_dir() {
        return Err(DirError::NotDir {
            dir: dir.to_path_buf(),
            kind: kind(meta.mode()),
        });
    }
    let me = euid();
    if meta.uid() != me {
        return Err(DirError::Owner {
            dir: dir.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(DirError::Writable {
            dir: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cpi-fsafe-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn inputs_wait_for_a_fifos_writer_a_bounded_time_and_read_pipes() {
        use std::io::Read;
        let d = scratch("input");
        let p = d.join("p.json");
        create_fifo(&p).unwrap();
        let e = open_input(&p, std::time::Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, OpenError::NoWriter { .. }), "{e}");
        let writer = {
            let p = p.clone();
            std::thread::spawn(move || std::fs::write(p, b"profile").unwrap())
        };
        let mut text = String::new();
        open_input(&p, std::time::Duration::from_secs(60))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        writer.join().unwrap();
        assert_eq!(text, "profile");
        // An anonymous pipe (`<(…)`) is read whatever its writer's pace: no wait at all
        // here, and the first bytes come after the open.
        let (r, w) = std::io::pipe().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&r);
        let f = open_input(
            Path::new(&format!("/proc/self/fd/{fd}")),
            std::time::Duration::ZERO,
        )
        .unwrap();
        drop(r);
        let writer = std::thread::spawn(move || (&w).write_all(b"late").unwrap());
        text.clear();
        (&f).read_to_string(&mut text).unwrap();
        writer.join().unwrap();
        assert_eq!(text, "late");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = scratch("fifo");
        let p = d.join("lib.so");
        create_fifo(&p).unwrap();
        let e = open(&p).unwrap_err();
        assert!(
            matches!(e, OpenError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
        let e = open_in_root(&d, Path::new("/lib.so")).unwrap_err();
        assert!(matches!(e, OpenError::NotRegular { .. }), "{e}");
        let e = open(Path::new("/dev/null")).unwrap_err();
        assert!(matches!(e, OpenError::NotRegular { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fifo_is_written_in_place_only_with_a_reader_and_then_blocking() {
        let d = scratch("in-place");
        let p = d.join("out");
        create_fifo(&p).unwrap();
        assert_eq!(
            create_fifo(&p).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let e = open_in_place(&p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");
        let reader = sys::openat(None, &p, sys::READ_FLAGS, 0).unwrap();
        let w = open_in_place(&p).unwrap();
        // `flags:` in fdinfo is octal; O_NONBLOCK is 04000.
        let fdinfo = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            std::os::fd::AsRawFd::as_raw_fd(&w)
        ))
        .unwrap();
        let flags = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| i32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        assert_eq!(flags & libc::O_NONBLOCK, 0, "{fdinfo}");
        assert_eq!(flags & libc::O_ACCMODE, libc::O_WRONLY, "{fdinfo}");
        (&w).write_all(b"x").unwrap();
        drop((w, reader));
        open_in_place(Path::new("/dev/null"))
            .unwrap()
            .write_all(b"x")
            .unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn small_files_are_read_whole_and_large_ones_refused() {
        let d = scratch("bounded");
        let p = d.join("secret");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(read_bounded(&p, 5).unwrap(), b"12345");
        let e = read_bounded(&p, 4).unwrap_err();
        assert!(matches!(e, OpenError::TooLarge { max: 4, .. }), "{e}");
        let e = read_bounded(Path::new("/dev/zero"), 4).unwrap_err();
        assert!(matches!(e, OpenError::NotRegular { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn groups_by_name_or_number() {
        assert_eq!(group_id("root"), Ok(0));
        assert_eq!(group_id("4242"), Ok(4242));
        let e = group_id("no-such-group-cpi").unwrap_err();
        assert!(e.contains("no group named"), "{e}");
    }

    #[test]
    fn links_stay_inside_the_root_with_and_without_openat2() {
        let d = scratch("root");
        let root = d.join("root");
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(d.join("outside"), b"secret").unwrap();
        std::fs::write(root.join("lib/inside"), b"inside").unwrap();
        std::fs::write(root.join("outside"), b"root's own").unwrap();
        symlink("/outside", root.join("lib/abs")).unwrap();
        symlink("../../../../outside", root.join("lib/rel")).unwrap();
        symlink("inside", root.join("lib/ok")).unwrap();
        let read = |f: File| std::io::read_to_string(f).unwrap();
        for walk in [false, true] {
            let open = |p: &str| -> io::Result<File> {
                if walk {
                    let dir = sys::openat(
                        None,
                        &root,
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                        0,
                    )?;
                    walk_in_root(&dir, Path::new(p)).map(File::from)
                } else {
                    open_in_root(&root, Path::new(p)).map_err(io::Error::other)
                }
            };
            assert_eq!(read(open("/lib/ok").unwrap()), "inside", "walk {walk}");
            assert_eq!(read(open("/lib/abs").unwrap()), "root's own", "walk {walk}");
            assert_eq!(read(open("lib/rel").unwrap()), "root's own", "walk {walk}");
            assert_eq!(read(open("/../../outside").unwrap()), "root's own");
            assert!(open("/lib/missing").is_err());
        }
        symlink("loop", root.join("loop")).unwrap();
        let dir = sys::openat(None, &root, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
        let e = walk_in_root(&dir, Path::new("/loop")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn identity_is_checked() {
        let d = scratch("id");
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let want = FileId::of(&std::fs::metadata(&a).unwrap());
        check_identity(&open(&a).unwrap(), &a, Some(want)).unwrap();
        check_identity(&open(&b).unwrap(), &b, None).unwrap();
        let e = check_identity(&open(&b).unwrap(), &b, Some(want)).unwrap_err();
        assert!(matches!(e, OpenError::NotTheMappedFile { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn writes_replace_links_instead_of_following_them() {
        let d = scratch("write");
        let victim = d.join("victim");
        std::fs::write(&victim, b"root only").unwrap();
        let out = d.join("out");
        symlink(&victim, &out).unwrap();
        assert!(create_new(&out).is_err(), "O_EXCL|O_NOFOLLOW");
        replace(&out, |f| f.write_all(b"profile")).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"root only");
        let m = std::fs::symlink_metadata(&out).unwrap();
        assert!(m.is_file());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&out).unwrap(), b"profile");
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            2,
            "no temp file left"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_roots_files_on_local_filesystems_are_roots_alone() {
        let d = scratch("owner");
        let f = d.join("lib.so");
        std::fs::write(&f, b"ELF").unwrap();
        let open = || File::open(&f).unwrap();
        let local = sys::fs_type(&open()).is_ok_and(|t| LOCAL_FILESYSTEMS.contains(&t));
        // The file is its creator's: root's when the tests run as root.
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(only_root_can_change(&open()), local && euid() == 0);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o664)).unwrap();
        assert!(!only_root_can_change(&open()), "group-writable");
        if euid() == 0 {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            assert!(!only_root_can_change(&open()), "another owner");
        }
        assert!(
            only_root_can_change(&File::open("/usr/bin/true").unwrap()),
            "Debian's /usr/bin/true, root's on a local filesystem"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_private_directories_are_used() {
        let d = scratch("dir");
        let s = d.join("store");
        check_private_dir(&s).unwrap();
        let m = std::fs::metadata(&s).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_private_dir(&s).unwrap_err();
        assert!(matches!(e, DirError::Writable { .. }), "{e}");
        let f = d.join("file");
        std::fs::write(&f, b"").unwrap();
        assert!(matches!(
            check_private_dir(&f),
            Err(DirError::NotDir { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
