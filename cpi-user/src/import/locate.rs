//! Finding the binaries of a recording made on another machine: `--binary NAME=PATH`,
//! `--symfs DIR` (as perf), the recorded path itself, then build-id lookup in the
//! build-id caches (`~/.debug/.build-id/`, `/usr/lib/debug/.build-id/`) and among the
//! files given with `--binary PATH`. A file whose build-id differs from the recorded
//! one is refused, never analysed as if it were the recorded binary. Files are opened
//! with cpi-user/src/fsafe/mod.rs: a FIFO or device is skipped without blocking, and a
//! `--symfs` path is resolved inside that tree (its links cannot lead out of it); the
//! file found is returned with its identity, which the symbolizer checks when it opens
//! the path again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::binary::Binary;
use crate::fsafe::{self, FileId};

/// Why a recorded binary cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    /// The file found has another build-id than the recording names: a different build.
    #[error(
        "{recorded}: build-id mismatch: the recording has {want}, {found} has {got} \
         (give the recorded binary with --binary NAME=PATH or --symfs DIR)"
    )]
    BuildIdMismatch {
        /// The path in the recording.
        recorded: String,
        /// The build-id the recording has for it.
        want: String,
        /// The file found on this machine.
        found: String,
        /// That file's build-id.
        got: String,
    },
    /// As root, the recorded path is one the user the recording came from cannot read
    /// (cpi-user/src/fsafe/behalf.rs), and nothing else was found.
    #[error(transparent)]
    NotReadable(fsafe::OpenError),
}

/// Whether a file's build-id `got` is the recorded `want` (lowercase hex), as perf
/// decides (`dso__build_id_equal`, tools/perf/util/dso.c): equal, or -- for headers
/// written before perf recorded build-id sizes, which store every id as 20 bytes --
/// `got` followed by zeros (lld's 8-byte `--build-id=fast` ids).
pub(crate) fn same_build_id(want: &str, got: &str) -> bool {
    want == got
        || (want.len() == 40
            && got.len() < want.len()
            && want.starts_with(got)
            && want[got.len()..].bytes().all(|b| b == b'0'))
}

/// Where to look.
#[derive(Clone, Debug, Default)]
pub struct Locator {
    /// A root the recorded paths are taken relative to (perf's `--symfs`).
    pub symfs: Option<PathBuf>,
    /// Recorded path or file name → local file.
    pub overrides: Vec<(String, PathBuf)>,
    /// Files offered for build-id lookup.
    pub files: Vec<PathBuf>,
    /// Build-id caches (`<dir>/ab/cdef…` layout); [`Locator::default_caches`].
    pub caches: Vec<PathBuf>,
}

impl Locator {
    /// perf's build-id cache of the user and the distribution's debug files.
    pub(crate) fn default_caches() -> Vec<PathBuf> {
        let mut v = Vec::new();
        if let Some(home) = std::env::var_os("HOME") {
            v.push(Path::new(&home).join(".debug/.build-id"));
        }
        v.push(PathBuf::from("/usr/lib/debug/.build-id"));
        v
    }

    /// The local file for `recorded` (with its recorded build-id, when known) and its
    /// identity; `None` when nothing is found (the samples then count as unmapped).
    /// `ids` caches what each path held.
    pub(crate) fn locate(
        &self,
        recorded: &str,
        build_id: Option<&str>,
        ids: &mut BTreeMap<PathBuf, Option<(Option<String>, FileId)>>,
    ) -> Result<Option<(PathBuf, FileId)>, LocateError> {
        let symfs_path = self
            .symfs
            .as_ref()
            .map(|d| d.join(recorded.trim_start_matches('/')));
        let here = Path::new(recorded);
        let mut refused = None;
        let mut id_of = |p: &Path| -> Option<(Option<String>, FileId)> {
            if let Some(v) = ids.get(p) {
                return v.clone();
            }
            let f = match (&self.symfs, &symfs_path) {
                (Some(root), Some(s)) if s == p => fsafe::open_in_root(root, Path::new(recorded)),
                _ => fsafe::open(p),
            };
            let f = match f {
                Err(e @ fsafe::OpenError::NotReadable { .. }) if p == here => {
                    refused = Some(e);
                    None
                }
                f => f.ok(),
            };
            let got = f.and_then(|f| {
                let id = FileId::of(&f.metadata().ok()?);
                Some((Binary::from_file(&f, p).ok()?.build_id, id))
            });
            ids.insert(p.to_path_buf(), got.clone());
            got
        };
        let check = |found: &Path, got: Option<String>| match (build_id, got) {
            (Some(want), Some(got)) if !same_build_id(want, &got) => {
                Err(LocateError::BuildIdMismatch {
                    recorded: recorded.into(),
                    want: want.into(),
                    found: found.display().to_string(),
                    got,
                })
            }
            _ => Ok(()),
        };
        let file_name = Path::new(recorded)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        // Explicit choices: used if they are ELF, refused if their build-id differs.
        let explicit = self
            .overrides
            .iter()
            .find(|(n, _)| n == recorded || Some(n) == file_name.as_ref())
            .map(|(_, p)| p.clone())
            .into_iter()
            .chain(symfs_path.clone());
        for p in explicit {
            if let Some((got, id)) = id_of(&p) {
                check(&p, got)?;
                return Ok(Some((p, id)));
            }
        }
        // The recorded path: only if it is the recorded binary (or nothing says).
        let mut mismatch = None;
        if let Some((got, id)) = id_of(here) {
            match check(here, got) {
                Ok(()) => return Ok(Some((here.to_path_buf(), id))),
                Err(e) => mismatch = Some(e),
            }
        }
        if let Some(want) = build_id.filter(|w| w.len() > 2) {
            let (head, tail) = want.split_at(2);
            let cached = self.caches.iter().flat_map(|c| {
                let d = c.join(head);
                [
                    d.join(tail).join("elf"),
                    d.join(tail),
                    d.join(format!("{tail}.debug")),
                ]
            });
            for p in cached.chain(self.files.iter().cloned()) {
                if let Some((Some(got), id)) = id_of(&p) {
                    if same_build_id(want, &got) {
                        return Ok(Some((p, id)));
                    }
                }
            }
        }
        match (mismatch, refused) {
            (Some(e), _) => Err(e),
            (None, Some(e)) => Err(LocateError::NotReadable(e)),
            (None, None) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::same_build_id;

    #[test]
    fn build_ids_compare_as_perf_does() {
        // AutoFDO's propeller_sample_1.perfdata1 (Skylake, 2018 header) and its binary.
        assert!(same_build_id(
            "572ac72487ae1966000000000000000000000000",
            "572ac72487ae1966"
        ));
        assert!(same_build_id("572ac72487ae1966", "572ac72487ae1966"));
        // A sized record (or an MMAP2 build-id) is compared whole.
        assert!(!same_build_id("572ac72487ae1966", "572ac72487ae19"));
        assert!(!same_build_id(
            "572ac72487ae1966000000000000000000000001",
            "572ac72487ae1966"
        ));
        assert!(!same_build_id(
            "572ac72487ae1966000000000000000000000000",
            "672ac72487ae1966"
        ));
        let sha1 = "a05de3862b94ccc1cbffc5b3aabd1243691187e1";
        assert!(same_build_id(sha1, sha1));
        assert!(!same_build_id(sha1, &sha1[..16]));
    }
}
