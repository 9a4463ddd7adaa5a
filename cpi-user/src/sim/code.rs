//! Guest code bytes by runtime address: the traced process's executable mappings (from
//! the trace's maps records) resolved to the mapped files on disk.

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;

use crate::procmap::{MappedObject, Mapping, ProcessMaps};

/// Code bytes of the traced process. Files are read once and kept.
#[derive(Default)]
pub(crate) struct CodeMap {
    /// Latest maps snapshot (what is mapped now).
    current: ProcessMaps,
    /// Every mapping ever seen, latest snapshot winning on overlap (for analysis of
    /// samples taken before an unmap).
    all: Vec<Mapping>,
    files: HashMap<PathBuf, Option<Rc<Vec<u8>>>>,
}

impl CodeMap {
    /// Takes a new snapshot of the maps.
    pub fn update(&mut self, maps: ProcessMaps) {
        for m in &maps.mappings {
            self.all
                .retain(|o| !(o.start < m.end && m.start < o.end) || o == m);
            if !self.all.contains(m) {
                self.all.push(m.clone());
            }
        }
        self.current = maps;
    }

    /// Every mapping seen during the run, sorted.
    pub(crate) fn all_maps(&self) -> ProcessMaps {
        let mut mappings = self.all.clone();
        mappings.sort_by_key(|m| m.start);
        ProcessMaps { mappings }
    }

    /// Bytes from `addr` to the end of its mapping (and of the file), if the mapping is
    /// a readable file.
    pub fn bytes(&mut self, addr: u64) -> Option<(Rc<Vec<u8>>, usize, usize)> {
        let m = self.current.find(addr)?;
        let MappedObject::File { path, deleted } = &m.object else {
            return None;
        };
        if *deleted {
            return None;
        }
        let (start, end, offset) = (m.start, m.end, m.offset);
        let data = self
            .files
            .entry(path.clone())
            .or_insert_with(|| std::fs::read(path).ok().map(Rc::new))
            .clone()?;
        let from = (addr - start + offset) as usize;
        let to = ((end - start + offset) as usize).min(data.len());
        (from < to).then_some((data, from, to))
    }
}
