//! The profile file: the versioned JSON form of a [`Profile`] (`--output FILE`), read
//! back by `cpi-bpf report`, plain or gzip'd (an agent's window, agent/store.rs). Reading never panics: a truncated, corrupt, foreign or
//! newer file is one [`ProfileFileError`]. What is read is bounded: at most
//! [`MAX_PROFILE_BYTES`] (`report /dev/zero` stops there), and JSON nesting by
//! serde_json's recursion limit (128), so no input grows memory without end.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::profile::model::{Profile, PROFILE_FORMAT_VERSION};

/// Why a profile file could not be written or read back; each is one line naming the
/// file (`origin`), which `cpi-bpf report` prints as is.
#[derive(Debug, thiserror::Error)]
pub enum ProfileFileError {
    /// Opening or reading the file (or stream) failed.
    // Not a `#[source]`: the message already carries the cause, once.
    #[error("reading profile {}: {error}", .path.display())]
    Io {
        /// The file, or the stream's name for [`read_stream`].
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The JSON ends early (e.g. a copy cut short).
    #[error("profile {origin} is truncated (ends at line {line}, column {column})")]
    Truncated {
        /// The file's name as given.
        origin: String,
        /// Where the text ends, 1-based.
        line: usize,
        /// Column of that end, 1-based.
        column: usize,
    },
    /// The bytes are not JSON at all.
    #[error("profile {origin} is not valid JSON: {detail}")]
    NotJson {
        /// The file's name as given.
        origin: String,
        /// serde_json's message (with its line and column).
        detail: String,
    },
    /// JSON without a `format_version`: some other program's file.
    #[error("{origin} is not a cpi-bpf profile (no format_version field)")]
    NotAProfile {
        /// The file's name as given.
        origin: String,
    },
    /// Written by a newer cpi-bpf: refused rather than misread.
    #[error(
        "profile {origin} has format version {found}, newer than this cpi-bpf reads \
         ({supported}); use a newer cpi-bpf"
    )]
    FutureVersion {
        /// The file's name as given.
        origin: String,
        /// The file's `format_version`.
        found: u64,
        /// The newest this build reads ([`PROFILE_FORMAT_VERSION`]).
        supported: u32,
    },
    /// A known version whose content does not fit the profile model.
    #[error("profile {origin} is corrupt: {detail}")]
    Corrupt {
        /// The file's name as given.
        origin: String,
        /// What does not fit (serde_json's message, or the bad version).
        detail: String,
    },
    /// Longer than [`MAX_PROFILE_BYTES`]; reading stopped there.
    #[error(
        "profile {origin} is larger than {} MiB: not a profile this cpi-bpf reads",
        MAX_PROFILE_BYTES >> 20
    )]
    TooLarge {
        /// The file's name as given.
        origin: String,
    },
    /// Writing: the profile cannot be serialised or would not read back ([`to_json`]).
    #[error("serialising the profile: {0}")]
    Serialise(String),
}

/// The file's text: pretty JSON with a trailing newline.
pub fn to_json(p: &Profile) -> Result<String, ProfileFileError> {
    // serde_json writes a non-finite f64 as `null`, which the reader would then
    // reject: refuse to write a file that cannot be read back.
    let text =
        serde_json::to_string_pretty(p).map_err(|e| ProfileFileError::Serialise(e.to_string()))?;
    let back: serde_json::Result<Profile> = serde_json::from_str(&text);
    if let Err(e) = back {
        return Err(ProfileFileError::Serialise(format!(
            "the profile does not survive a round trip (a non-finite number?): {e}"
        )));
    }
    Ok(text + "\n")
}

/// As perf keeps `perf.data.old`: an existing regular file at `path` is renamed
/// `path.old` (replacing an older one) before a new output is written there, so a run
/// never overwrites the last one. Devices, pipes and missing files are left alone.
fn keep_old(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => {
            let mut old = path.as_os_str().to_owned();
            old.push(".old");
            std::fs::rename(path, old)
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The largest profile file read (its parsed form takes a few times this in memory).
pub const MAX_PROFILE_BYTES: u64 = 256 << 20;

/// Reads a profile file.
pub fn read(path: &Path) -> Result<Profile, ProfileFileError> {
    let io = |error| ProfileFileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    read_from(f, &path.display().to_string()).map_err(|e| match e {
        ReadError::Io(error) => io(error),
        ReadError::Profile(e) => e,
    })
}

/// Reads a profile from `r` (standard input, a pipe), at most [`MAX_PROFILE_BYTES`];
/// `origin` names it in errors.
pub fn read_stream(r: impl Read, origin: &str) -> Result<Profile, ProfileFileError> {
    read_from(r, origin).map_err(|e| match e {
        ReadError::Io(error) => ProfileFileError::Io {
            path: origin.into(),
            error,
        },
        ReadError::Profile(e) => e,
    })
}

enum ReadError {
    Io(std::io::Error),
    Profile(ProfileFileError),
}

fn read_from(r: impl Read, origin: &str) -> Result<Profile, ReadError> {
    let too_large = || {
        ReadError::Profile(ProfileFileError::TooLarge {
            origin: origin.to_string(),
        })
    };
    let mut bytes = Vec::new();
    r.take(MAX_PROFILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > MAX_PROFILE_BYTES {
        return Err(too_large());
    }
    // A gzip'd profile (an agent's window, `w-….json.gz`): the same bound after
    // decompression.
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .take(MAX_PROFILE_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(ReadError::Io)?;
        if text.len() as u64 > MAX_PROFILE_BYTES {
            return Err(too_large());
        }
        bytes = text;
    }
    parse(&bytes, origin).map_err(ReadError::Profile)
}

/// Parses a profile file's bytes; `origin` names it in errors.
pub fn parse(bytes: &[u8], origin: &str) -> Result<Profile, ProfileFileError> {
    let origin = origin.to_string();
    // Two steps so the version is checked before the shape: a newer file must say
    // "newer", not "missing field".
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        if e.is_eof() {
            ProfileFileError::Truncated {
                origin: origin.clone(),
                line: e.line(),
                column: e.column(),
            }
        } else {
            ProfileFileError::NotJson {
                origin: origin.clone(),
                detail: e.to_string(),
            }
        }
    })?;
    let version = match value.get("format_version") {
        Some(v) => v.as_u64().ok_or_else(|| ProfileFileError::Corrupt {
            origin: origin.clone(),
            detail: format!("format_version is {v}, not a version number"),
        })?,
        None => return Err(ProfileFileError::NotAProfile { origin }),
    };
    if version > PROFILE_FORMAT_VERSION as u64 {
        return Err(ProfileFileError::FutureVersion {
            origin,
            found: version,
            supported: PROFILE_FORMAT_VERSION,
        });
    }
    if version == 0 {
        return Err(ProfileFileError::Corrupt {
            origin,
            detail: "format_version 0 was never written".into(),
        });
    }
    let p: Profile = serde_json::from_value(value).map_err(|e| ProfileFileError::Corrupt {
        origin: origin.clone(),
        detail: e.to_string(),
    })?;
    // Merging cuts blocks at their bounds (cpi-user/src/profile/merge.rs): a block that
    // ends before it starts is a corrupt file, found by fuzzing (tests/tests/it/fuzz.rs).
    let reversed = p
        .processes
        .iter()
        .flat_map(|x| &x.functions)
        .flat_map(|f| f.blocks.iter().map(move |b| (f, b)))
        .find(|(_, b)| b.end < b.start);
    if let Some((f, b)) = reversed {
        return Err(ProfileFileError::Corrupt {
            origin,
            detail: format!(
                "a block of {} ends at {:#x}, before its start {:#x}",
                f.name, b.end, b.start
            ),
        });
    }
    Ok(p)
}

impl Profile {
    /// Parses the JSON profile file format (see [`parse`]).
    pub fn from_json(bytes: &[u8]) -> Result<Profile, ProfileFileError> {
        parse(bytes, "(input)")
    }
}

/// Where [`write_output`] puts the bytes.
#[derive(Debug, PartialEq, Eq)]
enum Dest {
    /// A new file, temp + rename (cpi-user/src/fsafe/mod.rs): what was at the path, a
    /// planted link included, is replaced, never written through.
    Replace,
    /// An existing FIFO or character device (`/dev/null`, a terminal, a pipe through
    /// `/dev/stdout`), written in place.
    InPlace,
}

/// How `path` is written: through a link only when this user owns it (as the kernel's
/// `fs.protected_symlinks` rule: another user's link in a shared directory is never
/// followed); in place only for FIFOs and character devices; a directory or a block
/// device is refused.
fn destination(path: &Path) -> std::io::Result<Dest> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let refuse = |what: &str| Err(std::io::Error::other(format!("is a {what}")));
    let own_link = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Dest::Replace),
        Err(e) => return Err(e),
        // SAFETY: geteuid has no preconditions.
        Ok(m) if m.file_type().is_symlink() => m.uid() == unsafe { libc::geteuid() },
        Ok(_) => true,
    };
    if !own_link {
        return Ok(Dest::Replace);
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => refuse("directory"),
        Ok(m) if m.file_type().is_block_device() => refuse("block device"),
        Ok(m) if m.file_type().is_fifo() || m.file_type().is_char_device() => Ok(Dest::InPlace),
        Ok(_) => Ok(Dest::Replace),
        // A dangling link of our own: replaced.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Dest::Replace),
        Err(e) => Err(e),
    }
}

/// Opens an in-place destination for writing: no create, no controlling terminal, and
/// a FIFO without a reader is an error (`ENXIO`), not a wait.
fn open_in_place(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)?;
    // Blocking writes from here on (a reader is there).
    // SAFETY: F_SETFL on an fd we own.
    unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&f), libc::F_SETFL, 0) };
    Ok(f)
}

/// Checks, before any work, that [`write_output`] can write `path`: a probe file is
/// created and removed next to it (or the FIFO or device opened).
pub fn check_output(path: &Path) -> std::io::Result<()> {
    match destination(path)? {
        Dest::InPlace => open_in_place(path).map(drop),
        Dest::Replace => {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                return Err(std::io::Error::other(format!(
                    "folder {} does not exist",
                    dir.display()
                )));
            }
            let probe = dir.join(format!(".cpi-bpf-probe-{:016x}", rand::random::<u64>()));
            crate::fsafe::create_new(&probe)?;
            std::fs::remove_file(&probe)
        }
    }
}

/// Writes `bytes` to `path` (`--output`): a new file (mode 0600) made by temp + rename
/// (an existing regular file kept as `path.old` first), or an existing FIFO or character device written in place (see `destination`).
pub fn write_output(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    match destination(path)? {
        Dest::InPlace => open_in_place(path)?.write_all(bytes),
        Dest::Replace => {
            keep_old(path)?;
            crate::fsafe::replace(path, |f| f.write_all(bytes))
        }
    }
}
