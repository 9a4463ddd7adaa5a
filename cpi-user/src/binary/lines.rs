//! Source lines from a binary's DWARF line tables (`.debug_line` and the units that
//! point to it), read from the mapping [`Binary`] already holds: nothing is read again
//! from disk. A binary without DWARF (or with compressed debug sections, which this
//! build does not inflate) has no source lines; that is not an error.
//!
//! addr2line renders every file name of a unit's line table (the unit's `comp_dir`
//! joined to each entry) when the unit is first asked about, and units may share one
//! table: a 102 KB binary of 4 units sharing 4 096 entries under a 64 KiB `comp_dir`
//! cost 1.13 GB of memory. So before building a context, the names it could render are
//! added up ([`names_within_bound`]), stopping at the bound: linear in the tables'
//! entries, and a binary whose names would exceed [`NAME_BYTES_PER_DEBUG_BYTE`] × its
//! DWARF bytes (at least [`NAME_BYTES_FLOOR`]) has no source lines, said once.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

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
            ctx: context(bin.data(), bin).or_else(|| context(bin.debug_data()?, bin)),
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
/// record` of the agent, BENCHMARKS.md "Agent CPU: source lines and BOLT names").
#[derive(Debug, Default)]
pub(super) struct LineCache {
    lines: Mutex<HashMap<u64, Option<SourceLine>>>,
    /// Decided once per binary: `Some(bytes)` when its file names are over the bound.
    refused: OnceLock<Option<u64>>,
}

/// Addresses one binary's [`LineCache`] holds; past it the cache starts over.
const MAX_CACHED_LINES: usize = 8192;

impl LineCache {
    /// Estimated heap bytes (an entry, its file name and table slack).
    pub(super) fn heap_bytes(&self) -> u64 {
        let n = self.lines.lock().expect("not poisoned").len() as u64;
        n * 128
    }
}

impl Binary {
    /// The source line of `vaddr`, from the binary's cache or, on a miss, from `ctx`
    /// (built on first need, so a window of known addresses builds none).
    pub(crate) fn source_line<'a>(
        &'a self,
        vaddr: u64,
        ctx: &mut Option<SourceLines<'a>>,
    ) -> Option<SourceLine> {
        let cache = &self.lines.lines;
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

/// Rendered file names may take this many bytes per byte of DWARF (paths are stored
/// once and rendered joined to their unit's directories: about 5× in the binaries we
/// have looked at), ...
const NAME_BYTES_PER_DEBUG_BYTE: u64 = 16;
/// ... and at least this many, whatever the DWARF's size.
const NAME_BYTES_FLOOR: u64 = 16 << 20;
/// Heap bytes of one rendered name besides its text (a `String` and allocator slack).
const NAME_OVERHEAD: u64 = 32;

type Reader<'d> = EndianSlice<'d, RunTimeEndian>;

/// The line context of an ELF file's DWARF (`data`, `bin`'s or its debug file's), or
/// `None` when it has none or its file names are over the bound (decided once per
/// binary, and said then).
fn context<'d>(data: &'d [u8], bin: &Binary) -> Option<addr2line::Context<Reader<'d>>> {
    let file = object::File::parse(data).ok()?;
    file.section_by_name(".debug_line")?;
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let section = |id: gimli::SectionId| -> Result<Reader<'d>, gimli::Error> {
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
    let refused = bin.lines.refused.get_or_init(|| {
        let dwarf_bytes = debug_bytes(&file);
        let bound = (dwarf_bytes * NAME_BYTES_PER_DEBUG_BYTE).max(NAME_BYTES_FLOOR);
        let refused = names_within_bound(&dwarf, bound).err();
        if let Some(n) = refused {
            crate::fsafe::budget::refused(crate::fsafe::budget::Reader::DwarfLines);
            log::warn!(
                "{}: no source lines: its line tables name over {n} bytes of file names, more than the bound for its {dwarf_bytes} bytes of DWARF",
                crate::fsafe::escape(&bin.path.to_string_lossy()),
            );
        }
        refused
    });
    if refused.is_some() {
        return None;
    }
    addr2line::Context::from_dwarf(dwarf).ok()
}

/// Bytes of an ELF file's `.debug_*` sections.
fn debug_bytes(file: &object::File<'_>) -> u64 {
    file.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
        .map(|s| s.size())
        .sum()
}

/// Adds up what addr2line would render for every file entry of every unit (its
/// `comp_dir`, directory and name, as `render_file` joins them), stopping past `bound`:
/// each entry adds at least [`NAME_OVERHEAD`], so the count reads at most
/// `bound / NAME_OVERHEAD` entries however many units share a table.
fn names_within_bound(dwarf: &gimli::Dwarf<Reader<'_>>, bound: u64) -> Result<(), u64> {
    let len = |s: Option<Reader<'_>>| s.map_or(0, |s| s.len() as u64);
    let mut total = 0u64;
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let Some(program) = &unit.line_program else {
            continue;
        };
        let h = program.header();
        // Parsing the header read its directories: they count too, so units sharing a
        // table of directories and no files cannot make this count itself costly.
        total += h.include_directories().len() as u64 * NAME_OVERHEAD;
        let comp_dir = len(unit.comp_dir);
        for f in h.file_names() {
            let dir = f
                .directory(h)
                .filter(|_| f.directory_index() != 0)
                .and_then(|d| dwarf.attr_string(&unit, d).ok());
            let name = dwarf.attr_string(&unit, f.path_name()).ok();
            total += comp_dir + len(dir) + len(name) + 2 + NAME_OVERHEAD;
            if total > bound {
                return Err(total);
            }
        }
    }
    Ok(())
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

    /// An executable (gas, linked with gcc) whose `units` compile units share one line
    /// table of `files` entries, each unit's `comp_dir` `dir_len` bytes long.
    fn shared_line_table(units: usize, files: usize, dir_len: usize) -> Option<std::path::PathBuf> {
        use std::fmt::Write;
        let mut a = String::from(
            ".text\n.globl _start\n.type _start,@function\n_start:\nnop\nret\n.size _start,.-_start\n\
             .section .debug_abbrev,\"\",@progbits\n\
             .uleb128 1\n.uleb128 0x11\n.byte 0\n\
             .uleb128 0x10\n.uleb128 0x17\n.uleb128 0x1b\n.uleb128 0x0e\n\
             .uleb128 0x11\n.uleb128 0x01\n.uleb128 0x12\n.uleb128 0x07\n.byte 0,0\n.byte 0\n\
             .section .debug_info,\"\",@progbits\n",
        );
        for i in 0..units {
            // version 4, abbrevs at 0, 8-byte addresses; stmt_list 0, comp_dir at 0.
            writeln!(
                a,
                ".4byte .Le{i}-.Ls{i}\n.Ls{i}:\n.2byte 4\n.4byte 0\n.byte 8\n.uleb128 1\n\
                 .4byte 0\n.4byte 0\n.8byte _start\n.8byte 2\n.Le{i}:"
            )
            .unwrap();
        }
        writeln!(
            a,
            ".section .debug_str,\"\",@progbits\n.fill {dir_len},1,0x61\n.byte 0"
        )
        .unwrap();
        a.push_str(
            ".section .debug_line,\"\",@progbits\n.4byte .Lle-.Lls\n.Lls:\n.2byte 4\n\
             .4byte .Lhe-.Lhs\n.Lhs:\n.byte 1,1,1,0xfb,14,13\n.byte 0,1,1,1,1,0,0,0,1,0,0,1\n.byte 0\n",
        );
        for j in 0..files {
            writeln!(a, ".asciz \"f{j}.c\"\n.byte 0,0,0").unwrap();
        }
        a.push_str(
            ".byte 0\n.Lhe:\n.byte 0,9,2\n.8byte _start\n.byte 1\n.byte 2,2\n.byte 0,1,1\n.Lle:\n",
        );
        let dir = std::env::temp_dir().join(format!("cpi-lines-{}-{units}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.s"), a).unwrap();
        let out = std::process::Command::new("gcc")
            .args(["-nostdlib", "-static", "-o"])
            .arg(dir.join("t"))
            .arg(dir.join("t.s"))
            .output();
        match out {
            Ok(o) if o.status.success() => Some(dir.join("t")),
            other => {
                assert!(std::env::var_os("CI").is_none(), "gcc: {other:?}");
                eprintln!("skipped: gcc cannot build the test binary: {other:?}");
                None
            }
        }
    }

    /// Row "N compile units sharing one `.debug_line` of 4 096 file entries, `comp_dir`
    /// a 64 KiB string" of the hostile-host attacks: addr2line would render 256 MiB of names per unit
    /// asked; the binary is refused source lines instead. The same table under one unit
    /// and a short directory is within the bound and gives its line.
    #[test]
    fn line_tables_that_would_render_gigabytes_are_refused() {
        let Some(attack) = shared_line_table(16, 4096, 64 << 10) else {
            return;
        };
        let bin = Binary::open(&attack).unwrap();
        let at = bin.function_by_name("_start").unwrap().start;
        let line = SourceLines::new(&bin).at(at);
        assert!(
            line.is_none(),
            "a line from the attack's tables: {} bytes of name",
            line.map_or(0, |l| l.file.len())
        );
        let counted = bin.lines.refused.get().copied().flatten();
        assert!(counted.is_some_and(|n| n > NAME_BYTES_FLOOR), "{counted:?}");
        let honest = shared_line_table(1, 4096, 16).unwrap();
        let bin = Binary::open(&honest).unwrap();
        let at = bin.function_by_name("_start").unwrap().start;
        let line = SourceLines::new(&bin)
            .at(at)
            .expect("a line within the bound");
        assert_eq!(line.line, 1);
        assert_eq!(bin.lines.refused.get(), Some(&None));
        for p in [attack, honest] {
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
    }
}
