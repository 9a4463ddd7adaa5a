//! Whose eyes a recording's paths are opened with. As root, `import-perf` and `report`
//! read files a recording names (its binaries, their debug files, the sources a profile
//! names); a user who hands root a recording must not lead it to files only root may
//! read (DESIGN.md, "Trust boundaries"). So, once a [`Reader`] is set ([`read_as`]),
//! [`super::open`], `super::open_nofollow` and `super::open_in_root` open as that
//! user would: on a short-lived thread whose filesystem identity is the user's
//! (`sys::as_user`), so the kernel itself decides (every directory's search bit,
//! ACLs, links, at the moment of the open) rather than a re-implementation of its
//! rules checked before an open a rename could outrun. What the user named on the
//! command line (`--symfs DIR`, resolved inside DIR; `--binary PATH`) is opened as
//! root.
//!
//! The same holds for what a binary names: the source files its line tables name are
//! chosen by whoever could write the binary ([`Owner`]), so as root they are opened as
//! that user ([`super::open_named_by`]), in one-shots and `report` alike.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::{sys, OpenError};

/// Who could have written a file, and so chose what it says: its owner, or anyone
/// ([`Owner::ANYONE`]) when others than its owner may write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// The owner's uid.
    pub uid: u32,
    /// The file's group.
    pub gid: u32,
}

impl Owner {
    /// Anyone: read as `nobody` (65534, the kernel's overflow uid and gid), who may read
    /// only what everyone may.
    pub const ANYONE: Owner = Owner {
        uid: 65534,
        gid: 65534,
    };

    /// Who could have written the file of `meta`.
    pub fn of(meta: &std::fs::Metadata) -> Owner {
        if meta.mode() & 0o022 != 0 {
            return Owner::ANYONE;
        }
        Owner {
            uid: meta.uid(),
            gid: meta.gid(),
        }
    }

    /// Who could have written what two files say together (a binary and its debug
    /// file): the one not root's when the other is, else, when they differ, anyone.
    pub fn and(self, other: Owner) -> Owner {
        match (self, other) {
            (a, b) if a == b || b.uid == 0 => a,
            (a, b) if a.uid == 0 => b,
            _ => Owner::ANYONE,
        }
    }

    /// [`Owner::and`] of two that may be unknown (`None`), unknown when either is.
    pub fn both(a: Option<Owner>, b: Option<Owner>) -> Option<Owner> {
        Some(a?.and(b?))
    }
}

/// The user whose access decides what is opened, and what the command line trusts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reader {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    /// Why this user: said with each refusal.
    why: String,
    /// Directories opened as root, paths resolved inside them (`--symfs`).
    trusted_dirs: Vec<PathBuf>,
    /// Files opened as root (`--binary PATH`).
    trusted_files: Vec<PathBuf>,
}

impl Reader {
    /// Whose access decides for a process with effective uid `euid` reading a recording
    /// owned by `owner` (uid, gid), run through sudo by `sudo` (`SUDO_UID`, `SUDO_GID`):
    /// the sudo user, else the recording's owner. `None` when nobody else's: not root
    /// (the kernel already checks as this process's user), or root's own recording.
    pub fn of(euid: u32, sudo: Option<(u32, u32)>, owner: (u32, u32)) -> Option<Reader> {
        if euid != 0 {
            return None;
        }
        let (uid, gid, why) = match sudo {
            Some((uid, gid)) => (uid, Some(gid), format!("run through sudo by uid {uid}")),
            None => (owner.0, None, format!("recording owned by uid {}", owner.0)),
        };
        Reader::user(uid, gid, owner.1, why)
    }

    /// Whose access decides for a file that `writer`'s file names (a source file a
    /// binary's line tables name), `why` said with each refusal; `None` for root.
    pub(super) fn writer(writer: Owner, why: String) -> Option<Reader> {
        Reader::user(writer.uid, None, writer.gid, why)
    }

    /// User `uid` with group `gid` (else its primary group) and its other groups, from
    /// the user database; a uid no user has (a container's) has `file_gid` alone.
    /// `None` for root.
    fn user(uid: u32, gid: Option<u32>, file_gid: u32, why: String) -> Option<Reader> {
        if uid == 0 {
            return None;
        }
        let (primary, groups) = sys::groups_of(uid)
            .ok()
            .flatten()
            .unwrap_or((gid.unwrap_or(file_gid), Vec::new()));
        let gid = gid.unwrap_or(primary);
        let mut groups = groups;
        if !groups.contains(&gid) {
            groups.push(gid);
        }
        Some(Reader {
            uid,
            gid,
            groups,
            why,
            trusted_dirs: Vec::new(),
            trusted_files: Vec::new(),
        })
    }

    /// Opens `trusted_dirs` (paths resolved inside them) and `trusted_files` as root.
    pub fn trusting(mut self, trusted_dirs: Vec<PathBuf>, trusted_files: Vec<PathBuf>) -> Self {
        self.trusted_dirs = trusted_dirs;
        self.trusted_files = trusted_files;
        self
    }

    /// Runs `open` (of `path`) as this user; refused access is [`OpenError::NotReadable`].
    pub(super) fn open(
        &self,
        path: &Path,
        open: impl FnOnce() -> io::Result<OwnedFd> + Send,
    ) -> Result<OwnedFd, OpenError> {
        sys::as_user(self.uid, self.gid, &self.groups, open).map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => {
                super::budget::refused(super::budget::Reader::RecordedPath);
                OpenError::NotReadable {
                    path: path.to_path_buf(),
                    uid: self.uid,
                    why: self.why.clone(),
                }
            }
            _ => OpenError::Io {
                path: path.to_path_buf(),
                cause: e,
            },
        })
    }

    /// Whether the command line named `root` as a tree to look in (`--symfs`).
    pub(super) fn trusts_root(&self, root: &Path) -> bool {
        self.trusted_dirs.iter().any(|d| d == root)
    }

    /// How the command line trusts `path`.
    pub(super) fn trust(&self, path: &Path) -> Trust<'_> {
        if self.trusted_files.iter().any(|f| f == path) {
            return Trust::File;
        }
        self.trusted_dirs
            .iter()
            .find_map(|d| Some(Trust::Inside(d, path.strip_prefix(d).ok()?.to_path_buf())))
            .unwrap_or(Trust::No)
    }
}

/// How the command line trusts a path.
pub(super) enum Trust<'a> {
    /// Named itself (`--binary PATH`).
    File,
    /// Below a named tree: resolved inside it, so no link or `..` leads out.
    Inside(&'a Path, PathBuf),
    /// Not at all: opened as the [`Reader`].
    No,
}

static READER: OnceLock<Reader> = OnceLock::new();

/// From now on this process opens what recordings name as `reader` would. Once per
/// process (a command reads one recording); a later call is ignored.
pub fn read_as(reader: Reader) {
    let _ = READER.set(reader);
}

/// The [`Reader`] for `recording` (an input opened by [`super::open_input`]) as this
/// process runs: root through sudo (`SUDO_UID`/`SUDO_GID`), or root handed another
/// user's file. `None`: nobody else's access to honour.
pub fn reader_for(recording: &File) -> io::Result<Option<Reader>> {
    let meta = recording.metadata()?;
    let id = |name| std::env::var(name).ok()?.parse::<u32>().ok();
    let sudo = id("SUDO_UID").zip(id("SUDO_GID"));
    Ok(Reader::of(sys::euid(), sudo, (meta.uid(), meta.gid())))
}

/// The [`Reader`] set with [`read_as`], if any.
pub(super) fn current() -> Option<&'static Reader> {
    READER.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn whose_access_decides() {
        assert_eq!(Reader::of(1000, None, (65534, 65534)), None, "not root");
        assert_eq!(Reader::of(0, None, (0, 0)), None, "root's own recording");
        assert_eq!(
            Reader::of(0, Some((0, 0)), (65534, 65534)),
            None,
            "sudo to root by root"
        );
        let r = Reader::of(0, None, (65534, 4242)).unwrap();
        assert_eq!(
            (r.uid, r.why.as_str()),
            (65534, "recording owned by uid 65534")
        );
        assert!(r.groups.contains(&r.gid));
        let r = Reader::of(0, Some((1000, 1001)), (0, 0)).unwrap();
        assert_eq!((r.uid, r.gid), (1000, 1001), "the sudo user, not the owner");
        assert_eq!(r.why, "run through sudo by uid 1000");
        let r = Reader::of(0, None, (3_000_000, 4242)).unwrap();
        assert_eq!(
            (r.gid, r.groups.as_slice()),
            (4242, &[4242][..]),
            "no such user"
        );
    }

    #[test]
    fn who_could_have_written_a_file() {
        let d = std::env::temp_dir().join(format!("cpi-fsafe-owner-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("bin");
        std::fs::write(&f, b"x").unwrap();
        let owner = |mode: u32| {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            Owner::of(&std::fs::metadata(&f).unwrap())
        };
        let me = Owner {
            uid: sys::euid(),
            gid: std::fs::metadata(&f).unwrap().gid(),
        };
        assert_eq!(owner(0o755), me);
        assert_eq!(owner(0o775), Owner::ANYONE, "its group may write it");
        assert_eq!(owner(0o757), Owner::ANYONE, "anyone may write it");
        std::fs::remove_dir_all(&d).unwrap();
        let (root, user) = (
            Owner { uid: 0, gid: 0 },
            Owner {
                uid: 1000,
                gid: 1000,
            },
        );
        let other = Owner {
            uid: 1001,
            gid: 1001,
        };
        assert_eq!(root.and(root), root);
        assert_eq!(root.and(user), user);
        assert_eq!(user.and(root), user);
        assert_eq!(user.and(other), Owner::ANYONE);
        assert_eq!(Owner::both(Some(user), None), None, "unknown stays unknown");
        assert_eq!(Owner::both(Some(root), Some(user)), Some(user));
    }

    #[test]
    fn a_file_named_by_a_users_binary_is_opened_as_that_user() {
        if sys::euid() != 0 {
            assert!(std::env::var_os("CI").is_none(), "CI runs as root");
            eprintln!("skipped: needs root to act as uid 65534");
            return;
        }
        let d = std::env::temp_dir().join(format!("cpi-fsafe-named-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = d.join("secret.c");
        std::fs::write(&secret, b"root only").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let nobody = Owner::ANYONE;
        let e = super::super::open_named_by(&secret, Some(nobody)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: not opened: uid 65534 cannot read it (named by a binary that anyone may \
                 have written)",
                secret.display()
            )
        );
        let e = super::super::open_named_by(&secret, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("whose owner the profile does not say"),
            "{e}"
        );
        let root = Owner { uid: 0, gid: 0 };
        assert!(super::super::open_named_by(&secret, Some(root)).is_ok());
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(super::super::open_named_by(&secret, Some(nobody)).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_path_only_root_may_read_is_refused_and_a_public_one_opened() {
        if sys::euid() != 0 {
            eprintln!("skipped: needs root to act as uid 65534");
            return;
        }
        let d = std::env::temp_dir().join(format!("cpi-fsafe-behalf-{}", std::process::id()));
        let private = d.join("private");
        std::fs::create_dir_all(&private).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let secret = private.join("secret");
        let public = d.join("public");
        std::fs::write(&secret, b"root only").unwrap();
        std::fs::write(&public, b"anyone").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
        let nobody = Reader::of(0, None, (65534, 65534)).unwrap();
        let open = |p: &Path| nobody.open(p, || sys::openat(None, p, sys::READ_FLAGS, 0));
        let e = open(&secret).unwrap_err();
        assert!(
            matches!(e, OpenError::NotReadable { uid: 65534, .. }),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "{}: not opened: uid 65534 cannot read it (recording owned by uid 65534)",
                secret.display()
            )
        );
        let read = |fd: OwnedFd| std::io::read_to_string(File::from(fd)).unwrap();
        assert_eq!(read(open(&public).unwrap()), "anyone");
        // The thread that opened as uid 65534 is gone: this one is still root.
        assert_eq!(std::fs::read(&secret).unwrap(), b"root only");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
