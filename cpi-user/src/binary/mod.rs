//! ELF binaries: build-id, file offset ↔ virtual address, function bounds, and (in
//! [`cfg`](mod@cfg)) disassembly, basic blocks and the control-flow graph of one function.
//!
//! Function bounds come from `.symtab` when present; otherwise (stripped binaries, as
//! Debian ships them) from `.eh_frame` FDE starts, named from `.dynsym` where a dynamic
//! symbol starts at the same address and `func_<hexaddr>` elsewhere. PLT sections are
//! pseudo-functions (`name@plt`-less: `[.plt]`, `[.plt.sec]`) so calls through them stay
//! inside a function.
//!
//! A [`Binary`] keeps only its executable segments' bytes. Bad ELF is an error, never a
//! panic.

pub mod cfg;
mod ehframe;
pub mod symbolize;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, SymbolKind};

pub use cfg::{BasicBlock, Cfg, CfgEdge, FlowKind, Instruction};
pub use symbolize::{CodeObject, Resolved, SymbolizeError, Symbolizer, SymbolizerOptions};

/// ELF `PF_X`.
const PF_X: u32 = 1;

/// Why a binary could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an ELF file ({reason})")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path}: not an x86-64 ELF file ({arch})")]
    UnsupportedArch { path: PathBuf, arch: String },
    #[error("{path}: malformed ELF: {what}")]
    Malformed { path: PathBuf, what: String },
    #[error("{path}: unusable, not retried until the file changes: {reason}")]
    Unusable { path: PathBuf, reason: String },
    #[error("{path}: no code at {vaddr:#x}..{end:#x} (function {function})")]
    NoCode {
        path: PathBuf,
        function: String,
        vaddr: u64,
        end: u64,
    },
}

/// A function's bounds in the binary's own address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    pub start: u64,
    pub size: u64,
}

impl Function {
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }

    pub fn contains(&self, vaddr: u64) -> bool {
        (self.start..self.end()).contains(&vaddr)
    }
}

/// A `PT_LOAD` segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
    pub executable: bool,
}

/// Where function bounds came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundsSource {
    /// `.symtab` (not stripped).
    SymbolTable,
    /// `.eh_frame` FDEs + `.dynsym` (stripped).
    EhFrame,
}

/// One ELF file, parsed once.
#[derive(Debug)]
pub struct Binary {
    pub path: PathBuf,
    /// GNU build-id, lowercase hex.
    pub build_id: Option<String>,
    /// `ET_DYN` (PIE or shared library): loaded at a base chosen at run time.
    pub dynamic: bool,
    pub bounds: BoundsSource,
    pub segments: Vec<LoadSegment>,
    /// Sorted by start, non-overlapping.
    functions: Vec<Function>,
    /// Executable segments: (vaddr, file bytes).
    code: Vec<(u64, Vec<u8>)>,
    /// (name, address) of each local symbol in `.symtab` → BOLT's name for it.
    bolt_local_names: HashMap<(String, u64), String>,
}

impl Binary {
    /// Reads and parses `path`.
    pub fn open(path: &Path) -> Result<Binary, BinaryError> {
        let data = std::fs::read(path).map_err(|source| BinaryError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Binary::parse(path, &data)
    }

    /// Parses ELF bytes; `path` is only used for naming and errors.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Binary, BinaryError> {
        let p = || path.to_path_buf();
        if !data.starts_with(b"\x7fELF") {
            return Err(BinaryError::NotElf {
                path: p(),
                reason: "no ELF magic".into(),
            });
        }
        let file = object::File::parse(data).map_err(|e| BinaryError::NotElf {
            path: p(),
            reason: e.to_string(),
        })?;
        if file.architecture() != object::Architecture::X86_64 {
            return Err(BinaryError::UnsupportedArch {
                path: p(),
                arch: format!("{:?}", file.architecture()),
            });
        }
        let malformed = |what: String| BinaryError::Malformed { path: p(), what };
        let build_id = file
            .build_id()
            .map_err(|e| malformed(format!("build-id note: {e}")))?
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect());

        let mut segments = Vec::new();
        let mut code = Vec::new();
        for seg in file.segments() {
            let (offset, filesz) = seg.file_range();
            let executable =
                matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0);
            if executable {
                let bytes = seg
                    .data()
                    .map_err(|e| malformed(format!("segment at {:#x}: {e}", seg.address())))?;
                code.push((seg.address(), bytes.to_vec()));
            }
            segments.push(LoadSegment {
                vaddr: seg.address(),
                memsz: seg.size(),
                offset,
                filesz,
                executable,
            });
        }

        let in_code = |a: u64| {
            code.iter()
                .any(|(v, b)| (*v..*v + b.len() as u64).contains(&a))
        };
        let bolt_local_names = file
            .symbol_table()
            .map(|t| bolt_local_names(t.symbols()))
            .unwrap_or_default();
        let symtab_funcs: Vec<Function> = match file.symbol_table() {
            Some(t) => collect_symbols(t.symbols()),
            None => Vec::new(),
        };
        let dyn_funcs = collect_symbols(file.dynamic_symbols());
        let (bounds, mut funcs) = if !symtab_funcs.is_empty() {
            let mut f = symtab_funcs;
            f.extend(dyn_funcs);
            (BoundsSource::SymbolTable, f)
        } else {
            let dyn_names: HashMap<u64, &Function> =
                dyn_funcs.iter().map(|f| (f.start, f)).collect();
            let mut f = Vec::new();
            if let Some(sec) = file.section_by_name(".eh_frame") {
                let d = sec
                    .data()
                    .map_err(|e| malformed(format!(".eh_frame: {e}")))?;
                // A broken .eh_frame leaves .dynsym bounds only; say so, don't fail.
                match ehframe::fde_ranges(d, sec.address()) {
                    Ok(r) => f.extend(r.into_iter().map(|(start, size)| {
                        Function {
                            name: dyn_names
                                .get(&start)
                                .map(|d| d.name.clone())
                                .unwrap_or_else(|| format!("func_{start:x}")),
                            start,
                            size,
                        }
                    })),
                    Err(e) => log::warn!("{}: {e}; using .dynsym bounds only", path.display()),
                }
            }
            f.extend(dyn_funcs);
            (BoundsSource::EhFrame, f)
        };
        // PLT sections first: they win over the linker's FDE at the same start.
        let mut plt = Vec::new();
        for name in [".plt", ".plt.sec", ".plt.got"] {
            if let Some(sec) = file.section_by_name(name) {
                if sec.size() > 0 {
                    plt.push(Function {
                        name: format!("[{name}]"),
                        start: sec.address(),
                        size: sec.size(),
                    });
                }
            }
        }
        plt.append(&mut funcs);
        let mut funcs = plt;
        funcs.retain(|f| f.size > 0 && in_code(f.start));
        Ok(Binary {
            path: p(),
            build_id,
            dynamic: file.kind() == object::ObjectKind::Dynamic,
            bounds,
            segments,
            functions: normalise(funcs),
            code,
            bolt_local_names,
        })
    }

    /// The name BOLT gives `func` when its symbol is local (`static`): `name/N`, N
    /// counting the local symbols of that name in address order (BOLT's
    /// `NameResolver::uniquify`). `None` for a global or unknown symbol.
    pub fn bolt_local_name(&self, func: &Function) -> Option<&str> {
        self.bolt_local_names
            .get(&(func.name.clone(), func.start))
            .map(String::as_str)
    }

    pub fn stripped(&self) -> bool {
        self.bounds == BoundsSource::EhFrame
    }

    /// Functions sorted by start address.
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// The function containing `vaddr`.
    pub fn function_at(&self, vaddr: u64) -> Option<&Function> {
        self.function_index(vaddr).map(|i| &self.functions[i])
    }

    /// Index into [`Binary::functions`] of the function containing `vaddr`.
    pub fn function_index(&self, vaddr: u64) -> Option<usize> {
        let i = self.functions.partition_point(|f| f.start <= vaddr);
        let i = i.checked_sub(1)?;
        self.functions[i].contains(vaddr).then_some(i)
    }

    /// The first function called `name`.
    pub fn function_by_name(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Virtual address of a file offset (through the `PT_LOAD` that maps it).
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| (s.offset..s.offset + s.filesz).contains(&offset))
            .map(|s| offset - s.offset + s.vaddr)
    }

    /// File offset of a virtual address.
    pub fn offset_of_vaddr(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| (s.vaddr..s.vaddr + s.filesz).contains(&vaddr))
            .map(|s| vaddr - s.vaddr + s.offset)
    }

    /// The code bytes of `[start, end)`, when they lie in one executable segment.
    pub fn code(&self, start: u64, end: u64) -> Option<&[u8]> {
        self.code.iter().find_map(|(v, b)| {
            let lo = usize::try_from(start.checked_sub(*v)?).ok()?;
            let hi = usize::try_from(end.checked_sub(*v)?).ok()?;
            b.get(lo..hi)
        })
    }

    /// Disassembles `func` into basic blocks and its CFG. `extra_leaders` are addresses
    /// that must start a block (targets seen in branch records); ones that are not
    /// instruction boundaries of the function are ignored. Exact-count oracles use this
    /// with the block starts of a profile to compare block by block.
    pub fn cfg(&self, func: &Function, extra_leaders: &[u64]) -> Result<Cfg, BinaryError> {
        Ok(Cfg::from_instructions(
            func,
            self.decode(func)?.into(),
            extra_leaders,
        ))
    }

    /// `func`'s instructions (linear sweep), for [`Cfg::from_instructions`].
    pub fn decode(&self, func: &Function) -> Result<Vec<Instruction>, BinaryError> {
        let bytes = self
            .code(func.start, func.end())
            .ok_or_else(|| BinaryError::NoCode {
                path: self.path.clone(),
                function: func.name.clone(),
                vaddr: func.start,
                end: func.end(),
            })?;
        Ok(cfg::decode(func, bytes))
    }
}

/// BOLT's names of local text and data symbols, keyed by (name, address).
fn bolt_local_names<'d, S: ObjectSymbol<'d>>(
    syms: impl Iterator<Item = S>,
) -> HashMap<(String, u64), String> {
    let mut locals: Vec<(u64, String)> = syms
        .filter(|s| s.is_local() && matches!(s.kind(), SymbolKind::Text | SymbolKind::Data))
        .filter_map(|s| Some((s.address(), s.name().ok()?.to_string())))
        .filter(|(_, n)| !n.is_empty())
        .collect();
    locals.sort();
    let mut seen: HashMap<String, u32> = HashMap::new();
    locals
        .into_iter()
        .map(|(addr, name)| {
            let n = seen.entry(name.clone()).or_default();
            *n += 1;
            let bolt = format!("{name}/{n}");
            ((name, addr), bolt)
        })
        .collect()
}

/// Text symbols with an address, one per start address.
fn collect_symbols<'d, S: ObjectSymbol<'d>>(syms: impl Iterator<Item = S>) -> Vec<Function> {
    let mut out: Vec<(bool, Function)> = syms
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0 && !s.is_undefined())
        .filter_map(|s| {
            let name = s.name().ok()?.to_string();
            Some((
                s.is_global() && !s.is_weak(),
                Function {
                    name,
                    start: s.address(),
                    size: s.size(),
                },
            ))
        })
        .collect();
    // Aliases at one address: prefer the strong global name, then the sized one.
    out.sort_by(|a, b| {
        (a.1.start, !a.0, a.1.size == 0, &a.1.name).cmp(&(
            b.1.start,
            !b.0,
            b.1.size == 0,
            &b.1.name,
        ))
    });
    out.dedup_by_key(|f| f.1.start);
    out.into_iter().map(|(_, f)| f).collect()
}

/// Sorts, drops duplicate starts (first wins: callers put the better source first) and
/// trims overlaps so lookups are unambiguous.
fn normalise(mut funcs: Vec<Function>) -> Vec<Function> {
    // Stable sort keeps the caller's preference order among equal starts.
    funcs.sort_by_key(|f| f.start);
    funcs.dedup_by_key(|f| f.start);
    for i in 1..funcs.len() {
        let next = funcs[i].start;
        let prev = &mut funcs[i - 1];
        if prev.end() > next {
            prev.size = next - prev.start;
        }
    }
    funcs
}

/// Binaries opened so far, keyed by the file's identity (device + inode, so the same
/// file reached through `/proc/PID/map_files/…` of many processes is parsed once) and
/// stamped with size + mtime so a replaced file is reopened.
#[derive(Default)]
pub struct BinaryCache {
    entries: HashMap<FileId, (FileStamp, Result<Arc<Binary>, String>)>,
}

/// (device, inode).
type FileId = (u64, u64);
type FileStamp = (u64, Option<SystemTime>);

impl BinaryCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The parsed binary at `path`, opened on first use. A failure is remembered (and
    /// returned again) until the file changes, so a bad file is read once.
    pub fn get(&mut self, path: &Path) -> Result<Arc<Binary>, BinaryError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|source| BinaryError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let stamp = (meta.len(), meta.modified().ok());
        let key = (meta.dev(), meta.ino());
        let entry = match self.entries.get(&key) {
            Some((s, r)) if *s == stamp => r.clone(),
            _ => {
                let r = Binary::open(path).map(Arc::new);
                let cached = r.as_ref().map(Arc::clone).map_err(|e| e.to_string());
                self.entries.insert(key, (stamp, cached));
                return r;
            }
        };
        entry.map_err(|reason| BinaryError::Unusable {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Drops every cached entry holding `bin`.
    pub fn evict(&mut self, bin: &Arc<Binary>) {
        self.entries
            .retain(|_, (_, r)| !r.as_ref().is_ok_and(|b| Arc::ptr_eq(b, bin)));
    }

    /// The binaries held.
    pub fn binaries(&self) -> impl Iterator<Item = &Arc<Binary>> {
        self.entries.values().filter_map(|(_, r)| r.as_ref().ok())
    }
}

impl Binary {
    /// Heap bytes held (code, function names and bounds): what a cache counts.
    pub fn heap_bytes(&self) -> u64 {
        let code: usize = self.code.iter().map(|(_, b)| b.len()).sum();
        let funcs: usize = self
            .functions
            .iter()
            .map(|f| size_of::<Function>() + f.name.len())
            .sum();
        (code + funcs + self.segments.len() * size_of::<LoadSegment>()) as u64
    }
}

#[cfg(test)]
pub(crate) mod testbin;

#[cfg(test)]
mod tests {
    use super::*;
    use testbin::TestProgram;

    #[test]
    fn not_elf_and_truncated_elf_are_errors() {
        let e = Binary::parse(Path::new("x"), b"hello").unwrap_err();
        assert!(matches!(e, BinaryError::NotElf { .. }), "{e}");
        let e = Binary::parse(Path::new("x"), b"\x7fELF\x02\x01\x01").unwrap_err();
        assert!(matches!(e, BinaryError::NotElf { .. }), "{e}");
        let e = Binary::open(Path::new("/nonexistent/bin")).unwrap_err();
        assert!(matches!(e, BinaryError::Io { .. }), "{e}");
    }

    #[test]
    fn every_truncation_of_a_real_binary_is_handled() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let data = std::fs::read(&t.plain).unwrap();
        // Cut at many points: must return Ok or Err, never panic.
        for cut in (0..data.len()).step_by(97) {
            let _ = Binary::parse(Path::new("cut"), &data[..cut]);
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let data = std::fs::read(&t.stripped).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut parsed, mut decoded) = (0, 0);
        for _ in 0..300 {
            let mut d = data.clone();
            // A few random bytes anywhere (headers, .eh_frame, code, section table).
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..d.len());
                d[i] = rng.gen();
            }
            if let Ok(b) = Binary::parse(Path::new("corrupt"), &d) {
                parsed += 1;
                for f in b.functions() {
                    if b.cfg(f, &[f.start + 1]).is_ok() {
                        decoded += 1;
                    }
                }
            }
        }
        assert!(
            parsed > 0 && decoded > 0,
            "{parsed} parsed, {decoded} decoded"
        );
    }

    #[test]
    fn symbols_build_id_and_offsets() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let b = Binary::open(&t.plain).unwrap();
        assert_eq!(b.bounds, BoundsSource::SymbolTable);
        let id = b.build_id.as_deref().expect("gcc links with a build-id");
        assert!(id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()));
        let f = b.function_by_name("sum_loop").expect("sum_loop");
        assert_eq!(b.function_at(f.start + 1).unwrap().name, "sum_loop");
        assert!(b.function_at(f.end()).is_none_or(|g| g.name != "sum_loop"));
        let off = b.offset_of_vaddr(f.start).unwrap();
        assert_eq!(b.vaddr_of_offset(off), Some(f.start));
        // nm agrees on the address.
        assert_eq!(t.nm("sum_loop"), Some(f.start));
    }

    #[test]
    fn stripped_bounds_match_the_symbol_table() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        for (plain, stripped) in [(&t.plain, &t.stripped), (&t.pie, &t.pie_stripped)] {
            let full = Binary::open(plain).unwrap();
            let s = Binary::open(stripped).unwrap();
            assert!(s.stripped() && !full.stripped());
            assert_eq!(s.build_id, full.build_id, "strip keeps the build-id");
            for name in ["sum_loop", "classify", "fib", "main"] {
                let f = full.function_by_name(name).unwrap();
                let g = s.function_at(f.start).unwrap();
                assert_eq!(
                    (g.start, g.size),
                    (f.start, f.size),
                    "{name} in {stripped:?}"
                );
                assert_eq!(g.name, format!("func_{:x}", f.start));
            }
            // The PLT is one pseudo-function, named, not func_<addr>.
            let plt = full
                .functions()
                .iter()
                .find(|f| f.name.starts_with("[.plt"))
                .unwrap();
            assert_eq!(s.function_at(plt.start).unwrap().name, plt.name);
            // An exported function keeps its .dynsym name.
            let e = full.function_by_name("exported_entry").unwrap();
            assert_eq!(s.function_at(e.start).unwrap().name, "exported_entry");
        }
    }

    #[test]
    fn cache_reuses_and_reopens_on_change() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("cpi-bincache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bin");
        std::fs::copy(&t.plain, &p).unwrap();
        let mut c = BinaryCache::new();
        let a = c.get(&p).unwrap();
        assert!(Arc::ptr_eq(&a, &c.get(&p).unwrap()));
        std::fs::copy(&t.stripped, &p).unwrap();
        let b = c.get(&p).unwrap();
        assert!(b.stripped(), "a replaced file is reopened");
        std::fs::write(&p, b"junk").unwrap();
        assert!(c.get(&p).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod debian_tests {
    use super::*;

    /// Debian's stripped libraries: every exported function's FDE bounds (what a
    /// stripped binary gives us) equal its `.dynsym` bounds, and the code decodes.
    #[test]
    fn stripped_debian_library_bounds_match_dynsym() {
        let mut seen = 0;
        for p in [
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0",
            "/usr/bin/bzip2",
        ] {
            let path = Path::new(p);
            if !path.exists() {
                eprintln!("skipped: {p} not installed");
                continue;
            }
            seen += 1;
            let data = std::fs::read(path).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let b = Binary::parse(path, &data).unwrap();
            assert!(b.stripped(), "{p}");
            let fdes = {
                let s = file.section_by_name(".eh_frame").unwrap();
                ehframe::fde_ranges(s.data().unwrap(), s.address()).unwrap()
            };
            let fde: HashMap<u64, u64> = fdes.iter().copied().collect();
            let dyn_funcs = collect_symbols(file.dynamic_symbols());
            let sized: Vec<&Function> = dyn_funcs.iter().filter(|f| f.size > 0).collect();
            let same = sized
                .iter()
                .filter(|f| fde.get(&f.start) == Some(&f.size))
                .count();
            eprintln!(
                "{p}: {} functions, {} FDEs, {}/{} exported functions with equal FDE bounds",
                b.functions().len(),
                fdes.len(),
                same,
                sized.len()
            );
            assert!(
                same * 100 >= sized.len() * 98,
                "{p}: {same}/{}",
                sized.len()
            );
            for f in sized.iter().take(200) {
                let g = b.function_at(f.start).unwrap();
                assert_eq!(g.name, f.name);
                let cfg = b.cfg(g, &[]).unwrap();
                assert!(
                    cfg.instructions.iter().all(|i| i.text != "(bad)"),
                    "{}",
                    f.name
                );
            }
        }
        if seen == 0 {
            eprintln!("skipped: no Debian library to check");
        }
    }
}
