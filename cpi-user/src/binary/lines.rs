//! Source lines from a binary's DWARF line tables (`.debug_line` and the units that
//! point to it), read from the mapping [`Binary`] already holds: nothing is read again
//! from disk. A binary without DWARF (or with compressed debug sections, which this
//! build does not inflate) has no source lines; that is not an error.

use std::collections::HashMap;
use std::sync::Mutex;

use addr2line::gimli::{self, EndianSlice, RunTimeEndian};
use object::{Object, ObjectSection};
use serde::{Deserialize, Serialize};

use super::Binary;

/// Where an instruction came from: a source file and a 1-based line.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SourceLine {
    /// The file as the compiler recorded it (absolute, or joined to the unit's
    /// compilation directory).
    pub file: String,
    /// Line in `file`.
    pub line: u32,
}

/// The line tables of one binary, parsed lazily unit by unit as addresses are asked.
pub struct SourceLines<'a> {
    ctx: Option<addr2line::Context<EndianSlice<'a, RunTimeEndian>>>,
}

impl<'a> SourceLines<'a> {
    /// The tables of `bin`, or of its separate debug file
    /// (cpi-user/src/binary/debugfile.rs); empty when neither has usable DWARF.
    pub fn new(bin: &'a Binary) -> SourceLines<'a> {
        SourceLines {
            ctx: context(bin.data()).or_else(|| context(bin.debug_data()?)),
        }
    }

    /// The source line of the instruction at `vaddr` (the binary's own address space).
    pub fn at(&self, vaddr: u64) -> Option<SourceLine> {
        let loc = self.ctx.as_ref()?.find_location(vaddr).ok()??;
        Some(SourceLine {
            // addr2line checks a name's bytes in the mapping, then copies them: a file
            // rewritten meanwhile leaves its string invalid UTF-8 (module documentation
            // of cpi-user/src/binary/mod.rs), so it is checked again, after the copy.
            file: super::copied_utf8(loc.file?.as_bytes()),
            line: loc.line.filter(|&l| l > 0)?,
        })
    }
}

/// Source lines already looked up in one binary, kept with it ([`Binary`]) across
/// analyses: an always-on agent asks for the same hot addresses every window, and
/// building the line context again each time for them took 16 % of its CPU (`perf
/// record` of the agent, BENCHMARKS.md "A hostile host: before and after").
#[derive(Debug, Default)]
pub(super) struct LineCache(Mutex<HashMap<u64, Option<SourceLine>>>);

/// Addresses one binary's [`LineCache`] holds; past it the cache starts over.
const MAX_CACHED_LINES: usize = 8192;

impl LineCache {
    /// Estimated heap bytes (an entry, its file name and table slack).
    pub(super) fn heap_bytes(&self) -> u64 {
        let n = self.0.lock().expect("not poisoned").len() as u64;
        n * 128
    }
}

impl Binary {
    /// The source line of `vaddr`, from the binary's cache or, on a miss, from `ctx`
    /// (built on first need, so a window of known addresses builds none).
    pub fn source_line<'a>(
        &'a self,
        vaddr: u64,
        ctx: &mut Option<SourceLines<'a>>,
    ) -> Option<SourceLine> {
        let cache = &self.lines.0;
        if let Some(hit) = cache.lock().expect("not poisoned").get(&vaddr) {
            return hit.clone();
        }
        let found = ctx.get_or_insert_with(|| SourceLines::new(self)).at(vaddr);
        let mut cache = cache.lock().expect("not poisoned");
        if cache.len() >= MAX_CACHED_LINES {
            cache.clear();
        }
        cache.insert(vaddr, found.clone());
        found
    }
}

fn context(data: &[u8]) -> Option<addr2line::Context<EndianSlice<'_, RunTimeEndian>>> {
    let file = object::File::parse(data).ok()?;
    file.section_by_name(".debug_line")?;
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let section = |id: gimli::SectionId| -> Result<EndianSlice<'_, RunTimeEndian>, gimli::Error> {
        let bytes = match file.section_by_name(id.name()) {
            // Compressed sections would need inflating: treated as absent.
            Some(s) => match s.compressed_data() {
                Ok(c) if c.format == object::CompressionFormat::None => c.data,
                _ => &[],
            },
            None => &[],
        };
        Ok(EndianSlice::new(bytes, endian))
    };
    let dwarf = gimli::Dwarf::load(section).ok()?;
    addr2line::Context::from_dwarf(dwarf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::testbin::{debug_build, Scratch};

    /// A source file name rewritten while a line is looked up is still UTF-8
    /// ([`Scratch::flipping`]).
    #[test]
    fn file_names_rewritten_while_read_are_utf8() {
        let Some(exe) = debug_build("analysis_loops") else {
            return;
        };
        let s = Scratch::copy(&exe, "lines-utf8", 0);
        let bin = Binary::open(&s.path).unwrap();
        let at = bin.function_by_name("main").unwrap().start;
        let data = std::fs::read(&s.path).unwrap();
        let name = b"analysis_loops.c\0";
        // Every copy of it: the unit's name, the line table's, the symbol table's.
        let offs: Vec<u64> = (0..data.len() - name.len())
            .filter(|&i| data[i..].starts_with(name))
            .map(|i| i as u64)
            .collect();
        assert!(!offs.is_empty(), "the unit's file name");
        let (found, invalid) = s.flipping(&offs, || {
            let lines: Vec<SourceLine> = (0..20_000)
                .filter_map(|_| SourceLines::new(&bin).at(at))
                .collect();
            let invalid = lines
                .iter()
                .filter(|l| std::str::from_utf8(l.file.as_bytes()).is_err())
                .count();
            (lines.len(), invalid)
        });
        assert!(found > 0, "no source line for main");
        assert_eq!(invalid, 0, "file names that are not UTF-8, of {found}");
    }
}
