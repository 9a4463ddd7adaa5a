//! Parsing an ELF file's tables once, when a [`Binary`](super::Binary) is opened: load
//! segments, function bounds and names (the symbol table, `.dynsym`, `.eh_frame` FDEs,
//! PLT stubs named by their GOT slots) and BOLT's local-name ordinals. Names borrow the
//! mapped file's bytes; only what no file holds is copied.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::Path;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, SymbolKind};

use super::{
    ehframe, gopclntab, BinaryError, BoundsSource, CodeRange, FnEntry, LoadSegment,
    MAX_MAPPED_NAME, NAME_OWNED, NAME_SYNTH, PF_X,
};

/// A function while the table is built: its name borrows the file's bytes, or is made
/// here (`memcmp@plt`); `None`: `func_<addr>`.
#[derive(Clone, Debug)]
pub(super) struct Cand<'d> {
    pub(super) start: u64,
    pub(super) size: u64,
    pub(super) name: Option<Cow<'d, str>>,
}

/// What parsing finds.
pub(super) struct Tables {
    pub(super) build_id: Option<String>,
    pub(super) dynamic: bool,
    pub(super) bounds: BoundsSource,
    pub(super) segments: Vec<LoadSegment>,
    pub(super) functions: Vec<FnEntry>,
    pub(super) owned_names: Vec<Box<str>>,
    pub(super) code: Vec<CodeRange>,
}

/// The symbol table names come from: the file's own, else its separate debug file's.
pub(super) fn symtab_of<'d, 'f>(
    file: &'f object::File<'d>,
    debug: Option<&'f object::File<'d>>,
) -> Option<object::SymbolTable<'d, 'f>> {
    file.symbol_table().or_else(|| debug?.symbol_table())
}

impl Tables {
    /// Parses `data`; the symbol table comes from `debug` (a separate debug file's bytes)
    /// when `data` has none. `release` drops the pages read so far from the resident
    /// set; it is called as the symbol tables are walked.
    pub(super) fn parse(
        path: &Path,
        data: &[u8],
        debug: Option<&[u8]>,
        release: &dyn Fn(),
    ) -> Result<Tables, BinaryError> {
        let file = open_x86_64(path, data)?;
        let malformed = |what: String| BinaryError::Malformed {
            path: path.to_path_buf(),
            what,
        };
        let build_id = file
            .build_id()
            .map_err(|e| malformed(format!("build-id note: {e}")))?
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect());
        let (segments, code) = load_segments(&file, data, &malformed)?;
        let in_code = |a: u64| {
            code.iter()
                .any(|c| (c.vaddr..c.vaddr + c.len as u64).contains(&a))
        };
        let debug_file = debug.and_then(|d| object::File::parse(d).ok());
        let (bounds, mut funcs) =
            function_candidates(path, &file, debug_file.as_ref(), &malformed, release)?;
        // PLT stubs first: they win over the linker's FDE at the same start. (Moved in
        // place: a new vector beside this one held both at once.)
        let plt = plt_stubs(&file, &funcs);
        funcs.splice(0..0, plt);
        funcs.retain(|f| in_code(f.start));
        let funcs = normalise(funcs, &code);
        let (functions, owned_names) = function_entries(&funcs, data, debug);
        Ok(Tables {
            build_id,
            dynamic: file.kind() == object::ObjectKind::Dynamic,
            bounds,
            segments,
            functions,
            owned_names,
            code,
        })
    }
}

/// `data` parsed as an x86-64 ELF file, or why it is not one.
fn open_x86_64<'d>(path: &Path, data: &'d [u8]) -> Result<object::File<'d>, BinaryError> {
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
    Ok(file)
}

/// The loadable segments, and where in `data` the executable ones lie.
fn load_segments(
    file: &object::File<'_>,
    data: &[u8],
    malformed: &dyn Fn(String) -> BinaryError,
) -> Result<(Vec<LoadSegment>, Vec<CodeRange>), BinaryError> {
    let mut segments = Vec::new();
    let mut code = Vec::new();
    for seg in file.segments() {
        let (offset, filesz) = seg.file_range();
        let executable =
            matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0);
        if executable {
            // Checks the range lies in the file.
            let bytes = seg
                .data()
                .map_err(|e| malformed(format!("segment at {:#x}: {e}", seg.address())))?;
            code.push(CodeRange {
                vaddr: seg.address(),
                offset: offset_in(data, bytes).unwrap_or(0),
                len: bytes.len(),
            });
        }
        segments.push(LoadSegment {
            vaddr: seg.address(),
            memsz: seg.size(),
            offset,
            filesz,
            executable,
        });
    }
    Ok((segments, code))
}

/// The functions' bounds and names: from the symbol table (the file's or `debug_file`'s)
/// with `.dynsym`, or, stripped, from `.eh_frame`'s FDEs named by `.dynsym`.
fn function_candidates<'d>(
    path: &Path,
    file: &object::File<'d>,
    debug_file: Option<&object::File<'d>>,
    malformed: &dyn Fn(String) -> BinaryError,
    release: &dyn Fn(),
) -> Result<(BoundsSource, Vec<Cand<'d>>), BinaryError> {
    let symtab = symtab_of(file, debug_file);
    let symtab_funcs = match &symtab {
        Some(t) => collect_symbols(t, release),
        None => Vec::new(),
    };
    let dyn_funcs = (file.dynamic_symbol_table())
        .map(|t| collect_symbols(&t, release))
        .unwrap_or_default();
    if !symtab_funcs.is_empty() {
        let mut f = symtab_funcs;
        f.extend(dyn_funcs);
        return Ok((BoundsSource::SymbolTable, f));
    }
    let dyn_names: HashMap<u64, Cow<str>> = dyn_funcs
        .iter()
        .filter_map(|f| Some((f.start, f.name.clone()?)))
        .collect();
    // A Go binary's own table names its functions (and wins over an FDE at the same
    // start: `normalise` keeps the first given).
    let mut f = go_functions(path, file);
    if let Some(sec) = file.section_by_name(".eh_frame") {
        let d = sec
            .data()
            .map_err(|e| malformed(format!(".eh_frame: {e}")))?;
        // A broken .eh_frame leaves .dynsym bounds only; say so, don't fail.
        match ehframe::fde_ranges(d, sec.address()) {
            Ok(r) => f.extend(r.into_iter().map(|(start, size)| Cand {
                name: dyn_names.get(&start).cloned(),
                start,
                size,
            })),
            Err(e) => log::warn!("{}: {e}; using .dynsym bounds only", path.display()),
        }
    }
    f.extend(dyn_funcs);
    Ok((BoundsSource::EhFrame, f))
}

/// The functions `.gopclntab` lists (Go binaries, stripped or not); none elsewhere.
fn go_functions<'d>(path: &Path, file: &object::File<'d>) -> Vec<Cand<'d>> {
    let Some(data) = [".gopclntab", ".data.rel.ro.gopclntab"]
        .into_iter()
        .find_map(|n| file.section_by_name(n)?.data().ok())
    else {
        return Vec::new();
    };
    let text = file.section_by_name(".text").map_or(0, |s| s.address());
    let (funcs, cut) = gopclntab::functions(data, text);
    if cut {
        log::warn!(
            "{}: .gopclntab names more bytes than it holds; later functions unnamed",
            crate::fsafe::escape(&path.to_string_lossy())
        );
        crate::fsafe::budget::refused(crate::fsafe::budget::Reader::GoPclntab);
    }
    funcs
}

/// The function table: each name an offset into the mapped file (or past it, into
/// `debug`), or copied into the owned names when it lies in neither or is too long.
fn function_entries(
    funcs: &[Cand<'_>],
    data: &[u8],
    debug: Option<&[u8]>,
) -> (Vec<FnEntry>, Vec<Box<str>>) {
    let mut owned_names: Vec<Box<str>> = Vec::new();
    let mut functions = Vec::with_capacity(funcs.len());
    for f in funcs {
        let name = match &f.name {
            None => NAME_SYNTH,
            Some(n) => {
                let at = offset_in(data, n.as_bytes())
                    .or_else(|| Some(data.len() + offset_in(debug?, n.as_bytes())?));
                match at.and_then(|o| u32::try_from(o).ok()) {
                    Some(off) if off < NAME_OWNED && n.len() <= MAX_MAPPED_NAME => off,
                    _ => {
                        owned_names.push(copied_utf8(n.as_bytes()).into());
                        NAME_OWNED | (owned_names.len() - 1) as u32
                    }
                }
            }
        };
        functions.push(FnEntry {
            start: f.start,
            size: u32::try_from(f.size).unwrap_or(u32::MAX),
            name,
        });
    }
    (functions, owned_names)
}

/// `bytes` of the mapping as a `String`, copied first and checked after: its owner can
/// rewrite the file at any time, so bytes checked in place (`from_utf8_lossy` then
/// `into_owned`) could be invalid UTF-8 by the time they are copied, and a `String`
/// that is not UTF-8 is undefined behaviour wherever its chars are read.
pub(super) fn copied_utf8(bytes: &[u8]) -> String {
    owned_utf8(bytes.to_vec())
}

/// `bytes` (a copy) as a `String`, invalid UTF-8 replaced.
pub(super) fn owned_utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Offset of `part` in `whole` when `part` is a slice of it (names and section data
/// `object` returns borrow the file's bytes).
pub(super) fn offset_in(whole: &[u8], part: &[u8]) -> Option<usize> {
    let off = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    (off.checked_add(part.len())? <= whole.len()).then_some(off)
}

/// BOLT's ordinal of each of `functions` (in address order) among the local text and
/// data symbols of `table` of its name, in address order (BOLT's `name/N`,
/// `NameResolver::uniquify`); 0 where no local symbol of that name starts there. Of two
/// locals of one name at one address, the later. `name` gives a function's name (empty
/// for none).
///
/// Names are compared by a 64-bit hash (a seed per call: a collision among a library's
/// 200 000 names has odds of about 1 in 10⁹ and cannot be aimed at), so that every name
/// is read once and in the order it lies in the file, the locals' in table order and
/// the functions' by offset: read in address order, the names of a 200 MB library were
/// resident all at once between two releases, a fault mapping up to 2 MiB of it each
/// (BENCHMARKS.md, "Agent memory on a build host"). The locals are sorted by (hash,
/// address), 16 bytes each, and merged with the functions sorted alike.
pub(super) fn bolt_ordinals<'a>(
    table: &object::SymbolTable<'_, '_>,
    functions: &[FnEntry],
    name: &dyn Fn(FnEntry) -> &'a [u8],
    release: &dyn Fn(),
) -> Vec<u32> {
    let state = foldhash::fast::RandomState::default();
    let hash = |n: &[u8]| state.hash_one(n);
    // (hash, start, index) of each function, names read in file order (`FnEntry::name`
    // orders mapped names by offset, then the others).
    let mut order: Vec<u32> = (0..functions.len() as u32).collect();
    order.sort_unstable_by_key(|&i| functions[i as usize].name);
    let mut keyed: Vec<(u64, u64, u32)> = Vec::with_capacity(functions.len());
    for (k, &i) in order.iter().enumerate() {
        released_every(k, release);
        let e = functions[i as usize];
        keyed.push((hash(name(e)), e.start, i));
    }
    drop(order);
    keyed.sort_unstable();
    let mut locals: Vec<(u64, u64)> = (table.symbols())
        .inspect(|s| released_every(s.index().0, release))
        .filter(|s| s.is_local() && matches!(s.kind(), SymbolKind::Text | SymbolKind::Data))
        .filter_map(|s| Some((s.name_bytes().ok()?, s.address())))
        .filter(|(n, _)| !n.is_empty())
        .map(|(n, addr)| (hash(n), addr))
        .collect();
    locals.sort_unstable();
    // One merge: `l` runs past the locals up to each key, `first` is where the name of
    // the last one passed begins.
    let mut out = vec![0; functions.len()];
    let (mut l, mut first) = (0, 0);
    for &(h, start, i) in &keyed {
        while l < locals.len() && locals[l] <= (h, start) {
            if l == 0 || locals[l].0 != locals[l - 1].0 {
                first = l;
            }
            l += 1;
        }
        if l > 0 && locals[l - 1] == (h, start) {
            out[i as usize] = (l - first) as u32;
        }
    }
    out
}

/// Symbols read between two calls of the release hook while a symbol table is walked
/// ([`collect_symbols`], [`bolt_ordinals`]); fewer in tests, whose own executable (the
/// binary they parse) has about 20 000.
const SYMBOLS_PER_RELEASE: usize = if cfg!(test) { 1_024 } else { 16_384 };

/// Text symbols with an address, one per start address, in symbol-table order. Sorted
/// as (start, index) pairs, 16 bytes a symbol, and ranked only where symbols share a
/// start: sorting every symbol with its rank and name took 80 bytes a symbol at once
/// (Rust's libLLVM 22 has 258 000 symbols). The names are then read in table order,
/// which is how the linker laid them out, calling `release` every
/// [`SYMBOLS_PER_RELEASE`]: read in address order, libLLVM 22's 17 MiB of names were
/// resident at once until the parse ended (BENCHMARKS.md, "Agent memory on a build
/// host").
pub(super) fn collect_symbols<'d>(
    table: &object::SymbolTable<'d, '_>,
    release: &dyn Fn(),
) -> Vec<Cand<'d>> {
    let mut at: Vec<(u64, usize)> = (table.symbols())
        .inspect(|s| released_every(s.index().0, release))
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0 && !s.is_undefined())
        .map(|s| (s.address(), s.index().0))
        .collect();
    at.sort_unstable();
    // The symbol each start keeps, as (index, start), put in table order.
    let mut kept: Vec<(usize, u64)> = (at.chunk_by(|a, b| a.0 == b.0))
        .filter_map(|same| match same {
            [(start, i)] => Some((*i, *start)),
            _ => Some((best_of(table, same)?, same[0].0)),
        })
        .collect();
    drop(at);
    kept.sort_unstable();
    let mut out = Vec::with_capacity(kept.len());
    for (n, &(i, start)) in kept.iter().enumerate() {
        released_every(n, release);
        let Ok(s) = table.symbol_by_index(object::SymbolIndex(i)) else {
            continue;
        };
        if let Ok(name) = s.name() {
            out.push(Cand {
                name: Some(Cow::Borrowed(name)),
                start,
                size: s.size(),
            });
        }
    }
    out
}

/// Calls `release` on every [`SYMBOLS_PER_RELEASE`]th `n` after the first.
fn released_every(n: usize, release: &dyn Fn()) {
    if n > 0 && n.is_multiple_of(SYMBOLS_PER_RELEASE) {
        release();
    }
}

/// The index of the best-ranked of symbols `same` (pairs of one start), if any has a
/// name.
fn best_of(table: &object::SymbolTable<'_, '_>, same: &[(u64, usize)]) -> Option<usize> {
    (same.iter())
        .filter_map(|&(_, i)| {
            let s = table.symbol_by_index(object::SymbolIndex(i)).ok()?;
            let name = s.name().ok()?;
            Some((AliasRank::of(&s, name), i))
        })
        .min_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, i)| i)
}

/// Which of several names at one address is shown: perf's `choose_best_symbol`
/// (tools/perf/util/symbol.c) — a sized symbol, then a strong one over a weak one, a
/// global over a local, fewer leading underscores, the longer name (then A to Z, so
/// the choice never depends on table order). Smaller is better.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct AliasRank<'d> {
    no_size: bool,
    weak: bool,
    local: bool,
    underscores: usize,
    shorter: std::cmp::Reverse<usize>,
    name: &'d str,
}

impl<'d> AliasRank<'d> {
    fn of<S: ObjectSymbol<'d>>(s: &S, name: &'d str) -> Self {
        AliasRank {
            no_size: s.size() == 0,
            weak: s.is_weak(),
            local: !s.is_global(),
            underscores: name.len() - name.trim_start_matches('_').len(),
            shorter: std::cmp::Reverse(name.len()),
            name,
        }
    }
}

/// PLT stubs as functions named by their target, as perf names them (`memcmp@plt`): each
/// stub's `jmp *slot(%rip)` reads a GOT slot whose dynamic relocation names the symbol
/// (robust to .plt/.plt.sec/.plt.got layouts and to relocation order). Stubs that jump
/// through no named slot (PLT0, the lazy-binding stubs beside `.plt.sec`) stay one
/// `[.plt]`-style pseudo-function per run, so calls through them are still seen.
/// An IRELATIVE slot (an ifunc, `*ABS*+0x…` to objdump) is named after the function at
/// its resolver's address, as perf's `get_ifunc_name` does.
fn plt_stubs<'d>(file: &object::File<'d>, funcs: &[Cand<'d>]) -> Vec<Cand<'d>> {
    let sections: Vec<StubSection> = [".plt", ".plt.sec", ".plt.got"]
        .into_iter()
        .filter_map(|name| StubSection::read(file, name))
        .collect();
    let slots = slot_names(file, funcs, &sections);
    let mut out = Vec::new();
    for sec in &sections {
        let pseudo = |start: u64, end: u64| Cand {
            name: Some(Cow::Owned(format!("[{}]", sec.name))),
            start,
            size: end - start,
        };
        let mut unnamed: Option<u64> = None;
        for &(at, len, slot) in &sec.stubs {
            match slot.and_then(|slot| slots.get(&slot)) {
                Some(name) => {
                    if let Some(s) = unnamed.take() {
                        out.push(pseudo(s, at));
                    }
                    out.push(Cand {
                        name: Some(Cow::Owned(format!("{name}@plt"))),
                        start: at,
                        size: len,
                    });
                }
                None => {
                    unnamed.get_or_insert(at);
                }
            }
        }
        if let Some(s) = unnamed {
            out.push(pseudo(s, sec.end));
        }
    }
    out
}

/// One PLT section's stubs: (address, length, the GOT slot it jumps through).
struct StubSection {
    name: &'static str,
    end: u64,
    stubs: Vec<(u64, u64, Option<u64>)>,
}

impl StubSection {
    fn read(file: &object::File<'_>, name: &'static str) -> Option<StubSection> {
        let sec = file.section_by_name(name)?;
        let bytes = sec.data().ok().filter(|b| !b.is_empty())?;
        // x86-64 stubs are 16 bytes, but .plt.got's are 8 without IBT (no endbr64).
        let entry = if name == ".plt.got" && !bytes.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
            8
        } else {
            16
        };
        let stubs = (bytes.chunks(entry).enumerate())
            .map(|(i, stub)| {
                let at = sec.address() + (i * entry) as u64;
                (at, stub.len() as u64, stub_target(stub, at))
            })
            .collect();
        Some(StubSection {
            name,
            end: sec.address() + bytes.len() as u64,
            stubs,
        })
    }
}

/// The symbol each GOT slot a stub jumps through is relocated to. Only those slots: a
/// large C++ library has a `R_X86_64_RELATIVE` for every vtable entry, and naming each
/// one that points at a function took a `String` apiece, beside a map of every function
/// (BENCHMARKS.md, "Agent memory on a build host").
fn slot_names(
    file: &object::File<'_>,
    funcs: &[Cand<'_>],
    sections: &[StubSection],
) -> HashMap<u64, String> {
    let wanted: std::collections::HashSet<u64> = (sections.iter())
        .flat_map(|s| s.stubs.iter().filter_map(|&(_, _, slot)| slot))
        .collect();
    let mut slots = HashMap::new();
    let Some(relocs) = file.dynamic_relocations().filter(|_| !wanted.is_empty()) else {
        return slots;
    };
    let dynsym = file.dynamic_symbol_table();
    // Made at the first slot relocated to an address (an ifunc's IRELATIVE).
    let mut named_at: Option<HashMap<u64, &str>> = None;
    for (offset, r) in relocs.filter(|(offset, _)| wanted.contains(offset)) {
        let name = match r.target() {
            object::RelocationTarget::Symbol(i) => dynsym
                .as_ref()
                .and_then(|t| t.symbol_by_index(i).ok())
                .and_then(|s| s.name().ok())
                .filter(|n| !n.is_empty())
                .map(str::to_string),
            object::RelocationTarget::Absolute => {
                let named_at = named_at.get_or_insert_with(|| {
                    (funcs.iter())
                        .filter_map(|f| Some((f.start, f.name.as_deref()?)))
                        .collect()
                });
                (u64::try_from(r.addend()).ok())
                    .and_then(|a| named_at.get(&a))
                    .map(|n| n.to_string())
            }
            _ => None,
        };
        if let Some(name) = name {
            slots.insert(offset, name);
        }
    }
    slots
}

/// The GOT slot a PLT stub at `at` jumps through (`jmp qword ptr [rip+disp]`), if any.
fn stub_target(stub: &[u8], at: u64) -> Option<u64> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    let mut d = Decoder::with_ip(64, stub, at, DecoderOptions::NONE);
    while d.can_decode() {
        let ins = d.decode();
        if ins.mnemonic() == Mnemonic::Jmp
            && ins.op0_kind() == OpKind::Memory
            && ins.memory_base() == Register::RIP
        {
            return Some(ins.ip_rel_memory_address());
        }
    }
    None
}

/// Sorts, drops duplicate starts (a sized one first, then the first given: callers put
/// the better source first), sizes symbols that have none and trims overlaps so lookups
/// are unambiguous.
fn normalise<'d>(mut funcs: Vec<Cand<'d>>, code: &[CodeRange]) -> Vec<Cand<'d>> {
    // Stable sort keeps the caller's preference order among equal starts.
    funcs.sort_by_key(|f| (f.start, f.size == 0));
    funcs.dedup_by_key(|f| f.start);
    size_unsized(&mut funcs, code);
    for i in 1..funcs.len() {
        let next = funcs[i].start;
        let prev = &mut funcs[i - 1];
        if prev.start.saturating_add(prev.size) > next {
            prev.size = next - prev.start;
        }
    }
    funcs
}

/// A symbol without a size (crtstuff's `frame_dummy`, assembly without `.size`) runs to
/// the next start or the end of its code, as perf sizes it (`symbols__fixup_end`) and
/// llvm-bolt names it; one inside a sized function is a label in it and is dropped.
/// `funcs` is sorted by start, one per start.
fn size_unsized(funcs: &mut Vec<Cand<'_>>, code: &[CodeRange]) {
    let mut covered = 0;
    for i in 0..funcs.len() {
        let start = funcs[i].start;
        if funcs[i].size == 0 && start >= covered {
            let next = funcs.get(i + 1).map_or(u64::MAX, |f| f.start);
            let end = (code.iter())
                .map(|c| c.vaddr..c.vaddr + c.len as u64)
                .find(|c| c.contains(&start))
                .map_or(start, |c| c.end);
            funcs[i].size = next.min(end) - start;
        }
        covered = covered.max(start.saturating_add(funcs[i].size));
    }
    funcs.retain(|f| f.size > 0);
}
