//! pid → mappings → (object, file offset). Read from `/proc/PID/maps` when a pid is
//! first seen (and again on a miss); kept after the pid exits so late samples still
//! resolve. The PMU model fills the same type from the guest's maps.
//!
//! While a process is alive, [`capture::Tracker`] also captures what symbolisation needs
//! later: each executable file mapping becomes [`MappedObject::Captured`], holding the file
//! open (opened through `/proc/PID/map_files` or `/proc/PID/root`) so that a process that
//! exec'd, exited, ran a since-deleted binary or lived in another mount namespace is still
//! analysed from what it really ran.

pub mod capture;

use std::path::{Path, PathBuf};

pub use capture::{CapturedFile, ObjectId, Tracker};

/// Why maps could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcMapError {
    #[error("reading /proc/{pid}/maps: {source}")]
    Read { pid: u32, source: std::io::Error },
    #[error("line {line} of a maps file is malformed: {text:?}")]
    Malformed { line: usize, text: String },
}

/// What a mapping maps.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MappedObject {
    /// A file; `deleted` when the kernel marks it `(deleted)`.
    File { path: PathBuf, deleted: bool },
    /// A file captured while the process was alive: held open, keyed by device + inode
    /// ([`capture::Tracker`]).
    Captured(CapturedFile),
    /// Anonymous memory (JIT code lands here).
    Anon,
    /// `[vdso]`, `[heap]`, `[stack]`, …
    Special(String),
}

impl MappedObject {
    /// The name reports use for the object.
    pub fn display_name(&self) -> String {
        match self {
            MappedObject::File { path, .. } => path.display().to_string(),
            MappedObject::Captured(c) => c.path.display().to_string(),
            MappedObject::Anon => "[anon]".to_string(),
            MappedObject::Special(s) => s.clone(),
        }
    }

    /// The mapped path and whether the kernel marked it deleted, for file objects.
    pub fn file(&self) -> Option<(&Path, bool)> {
        match self {
            MappedObject::File { path, deleted } => Some((path, *deleted)),
            MappedObject::Captured(c) => Some((&c.path, c.deleted)),
            MappedObject::Anon | MappedObject::Special(_) => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub executable: bool,
    pub object: MappedObject,
}

impl Mapping {
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }

    /// File offset of a runtime address inside this mapping.
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// A process's mappings, sorted by start address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessMaps {
    pub mappings: Vec<Mapping>,
}

impl ProcessMaps {
    pub fn read(pid: u32) -> Result<Self, ProcMapError> {
        let path = format!("/proc/{pid}/maps");
        let text =
            std::fs::read_to_string(path).map_err(|source| ProcMapError::Read { pid, source })?;
        Self::parse(&text)
    }

    /// Parses the `/proc/PID/maps` text format.
    pub fn parse(text: &str) -> Result<Self, ProcMapError> {
        let mappings = parse_lines(text)?.into_iter().map(|(m, _)| m).collect();
        Ok(ProcessMaps { mappings })
    }

    /// Adds the mappings of `older` (read before an exec or munmap) that overlap none of
    /// these, so addresses sampled before the change still resolve. An address in a
    /// range that was reused resolves to the newer mapping.
    pub fn keep_older(&mut self, older: &ProcessMaps) {
        let kept: Vec<Mapping> = older
            .mappings
            .iter()
            .filter(|o| {
                let i = self.mappings.partition_point(|m| m.end <= o.start);
                self.mappings.get(i).is_none_or(|m| m.start >= o.end)
            })
            .cloned()
            .collect();
        if !kept.is_empty() {
            self.mappings.extend(kept);
            self.mappings.sort_by_key(|m| m.start);
        }
    }
}

/// Mappings of a maps text with the device + inode of each line, sorted by start.
fn parse_lines(text: &str) -> Result<Vec<(Mapping, ObjectId)>, ProcMapError> {
    let mut mappings = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || ProcMapError::Malformed {
            line: i + 1,
            text: line.to_string(),
        };
        let mut f = line.splitn(6, ' ').filter(|s| !s.is_empty());
        let range = f.next().ok_or_else(bad)?;
        let perms = f.next().ok_or_else(bad)?;
        let offset = f.next().ok_or_else(bad)?;
        let dev = f.next().ok_or_else(bad)?;
        let inode = f.next().ok_or_else(bad)?;
        let name = f.next().map(str::trim).unwrap_or("");
        let (s, e) = range.split_once('-').ok_or_else(bad)?;
        let hex = |t: &str| u64::from_str_radix(t, 16).map_err(|_| bad());
        let object = if name.is_empty() {
            MappedObject::Anon
        } else if name.starts_with('[') {
            MappedObject::Special(name.to_string())
        } else if let Some(p) = name.strip_suffix(" (deleted)") {
            MappedObject::File {
                path: PathBuf::from(p),
                deleted: true,
            }
        } else {
            MappedObject::File {
                path: PathBuf::from(name),
                deleted: false,
            }
        };
        let (major, minor) = dev.split_once(':').ok_or_else(bad)?;
        let id = ObjectId {
            major: u32::from_str_radix(major, 16).map_err(|_| bad())?,
            minor: u32::from_str_radix(minor, 16).map_err(|_| bad())?,
            inode: inode.parse().map_err(|_| bad())?,
        };
        mappings.push((
            Mapping {
                start: hex(s)?,
                end: hex(e)?,
                offset: hex(offset)?,
                executable: perms.as_bytes().get(2) == Some(&b'x'),
                object,
            },
            id,
        ));
    }
    mappings.sort_by_key(|(m, _)| m.start);
    Ok(mappings)
}

impl ProcessMaps {
    /// The mapping holding `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        m.contains(addr).then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c6a00000-55d0c6a02000 r--p 00000000 fd:01 123 /usr/bin/cat
55d0c6a02000-55d0c6a07000 r-xp 00002000 fd:01 123 /usr/bin/cat
7f0000000000-7f0000001000 rwxp 00000000 00:00 0
7f0000100000-7f0000200000 r-xp 00010000 fd:01 9 /tmp/a.out (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_and_finds() {
        let m = ProcessMaps::parse(MAPS).unwrap();
        assert_eq!(m.mappings.len(), 5);
        let text = m.find(0x55d0c6a03000).unwrap();
        assert!(text.executable);
        assert_eq!(text.file_offset(0x55d0c6a03000), 0x3000);
        assert_eq!(m.find(0x7f0000000010).unwrap().object, MappedObject::Anon);
        assert_eq!(
            m.find(0x7f0000100000).unwrap().object,
            MappedObject::File {
                path: "/tmp/a.out".into(),
                deleted: true
            }
        );
        assert_eq!(
            m.find(0x7ffd00000000).unwrap().object.display_name(),
            "[stack]"
        );
        assert!(m.find(0x1000).is_none());
        assert!(m.find(0x55d0c6a07000).is_none(), "end is exclusive");
    }

    #[test]
    fn malformed_line_is_an_error_with_its_number() {
        let err = ProcessMaps::parse("zz-yy r-xp\n").unwrap_err();
        assert!(
            matches!(err, ProcMapError::Malformed { line: 1, .. }),
            "{err}"
        );
    }
}
