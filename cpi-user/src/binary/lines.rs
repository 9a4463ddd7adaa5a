//! Source lines from a binary's DWARF line tables (`.debug_line` and the units that
//! point to it), read from the mapping [`Binary`] already holds: nothing is read again
//! from disk. A binary without DWARF (or with compressed debug sections, which this
//! build does not inflate) has no source lines; that is not an error.

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
            file: loc.file?.to_string(),
            line: loc.line.filter(|&l| l > 0)?,
        })
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
