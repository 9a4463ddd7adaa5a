//! The kernel's text symbols (`/proc/kallsyms`), to name `[kernel]` functions.
//!
//! The table is compact, as [`super::Binary`]'s is: one 16-byte entry per symbol (start,
//! and where its name lies in one buffer), no `String` per symbol, a padding symbol's
//! name (`__pfx_f`) not stored apart from its function's; on a 6.18 kernel (122 k text
//! symbols) that is 3.4 MB, where a `Vec<Function>` and the file's text held ~14 MB at
//! once (4.9 MB with padding names stored). The file is read line by line, never whole.
//!
//! The kernel formats `/proc/kallsyms` line by line as it is read, which took 0.4 s of
//! wall time on a busy 2-CPU machine (BENCHMARKS.md, "One-shot on a 100 MB library"): a
//! one-shot run starts reading it on a thread while it collects ([`Kallsyms::read_ahead`]),
//! so the report does not wait for it after the program stops.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::symbolize::KERNEL_START;
use super::Function;

/// Kernel text symbols, sorted by address, each extending to the next one (the last one
/// byte long).
#[derive(Default)]
pub struct KernelSymbols {
    /// Sorted by start; one per address.
    entries: Vec<Entry>,
    /// Every name, one after the other.
    names: String,
}

/// A symbol: its start and where its name lies in [`KernelSymbols::names`].
struct Entry {
    start: u64,
    name: u32,
    /// With [`PADDING`] set: the name is [`PADDING_PREFIX`] followed by this one.
    len: u32,
}

/// Of [`Entry::len`]: the symbol is the padding before the function named there.
const PADDING: u32 = 1 << 31;
/// The padding before each function (`CONFIG_FUNCTION_PADDING_CFI`, Linux 6.2+): on a
/// 6.18 kernel 57 836 of 122 059 text symbols, 1.56 of 2.97 MB of names. Each is named
/// from the function after it, not stored twice.
const PADDING_PREFIX: &str = "__pfx_";

impl KernelSymbols {
    /// The text symbols of a kallsyms file; empty when unreadable or when addresses are
    /// hidden (kptr_restrict: all zero).
    pub fn read(path: &Path) -> Self {
        std::fs::File::open(path)
            .map(|f| Self::parse(std::io::BufReader::with_capacity(64 << 10, f)))
            .unwrap_or_default()
    }

    /// Parses `ADDRESS TYPE NAME [MODULE]` lines: text symbols (`T t W w`) at kernel
    /// addresses are kept; other lines, and lines that do not parse, are skipped. Of
    /// symbols at one address the first in the file names it.
    fn parse(mut r: impl BufRead) -> Self {
        let mut t = KernelSymbols::default();
        let mut line = Vec::new();
        // A padding symbol waiting for the function it pads: its start, that name.
        let (mut padding, mut padded) = (None, String::new());
        // A read error ends the table where it stopped: what was read is still right.
        while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if let Some((start, name)) = text_symbol(&line) {
                if !t.push_padding(padding.take(), &padded, (start, name)) {
                    break;
                }
                match name.strip_prefix(PADDING_PREFIX).filter(|f| !f.is_empty()) {
                    Some(f) => {
                        padding = Some(start);
                        padded.clear();
                        padded.push_str(f);
                    }
                    None if !t.push(start, name) => break,
                    None => {}
                }
            }
            line.clear();
        }
        t.push_padding(padding, &padded, (0, ""));
        // kallsyms lists the kernel's symbols in address order, then each module's; of
        // one start, name offsets are in file order (a padding symbol's is the next
        // name's), so an unstable sort keeps the first in the file first, without a
        // stable sort's buffer of half the table.
        t.entries.sort_unstable_by_key(|e| (e.start, e.name));
        t.entries.dedup_by_key(|e| e.start);
        t.entries.shrink_to_fit();
        t.names.shrink_to_fit();
        t
    }

    /// Adds a symbol; false when the names outgrow 32-bit offsets.
    fn push(&mut self, start: u64, name: &str) -> bool {
        let Some((at, len)) = self.room_for(name) else {
            return false;
        };
        self.names.push_str(name);
        self.entries.push(Entry {
            start,
            name: at,
            len,
        });
        true
    }

    /// Where `name` would go in [`KernelSymbols::names`], and its length, when both fit
    /// an [`Entry`].
    fn room_for(&self, name: &str) -> Option<(u32, u32)> {
        let at = u32::try_from(self.names.len()).ok()?;
        let len = u32::try_from(name.len()).ok().filter(|&l| l < PADDING)?;
        at.checked_add(len).map(|_| (at, len))
    }

    /// Adds the padding symbol at `start` that pads `padded`, if any, before the symbol
    /// `next` is added: named from `next`'s name when `next` is the function it pads
    /// (named with its own otherwise). False when the names outgrow 32-bit offsets.
    fn push_padding(&mut self, start: Option<u64>, padded: &str, next: (u64, &str)) -> bool {
        let Some(start) = start else {
            return true;
        };
        let pads_next = next.1 == padded && start < next.0;
        // A function whose own name starts so waits to be named itself (not stored).
        if !pads_next || next.1.starts_with(PADDING_PREFIX) {
            return self.push(start, &format!("{PADDING_PREFIX}{padded}"));
        }
        // `next` is added right after, where `room_for` says.
        let Some((at, len)) = self.room_for(padded) else {
            return false;
        };
        self.entries.push(Entry {
            start,
            name: at,
            len: len | PADDING,
        });
        true
    }

    /// The symbol holding `addr`.
    pub fn lookup(&self, addr: u64) -> Option<Function> {
        let i = self
            .entries
            .partition_point(|e| e.start <= addr)
            .checked_sub(1)?;
        let e = &self.entries[i];
        let end = self.entries.get(i + 1).map_or(e.start + 1, |n| n.start);
        let len = e.len & !PADDING;
        let name = &self.names[e.name as usize..(e.name + len) as usize];
        (addr < end).then(|| Function {
            name: match e.len & PADDING {
                0 => name.to_string(),
                _ => format!("{PADDING_PREFIX}{name}"),
            },
            start: e.start,
            size: end - e.start,
        })
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> u64 {
        (self.entries.capacity() * size_of::<Entry>() + self.names.capacity()) as u64
    }
}

/// `(start, name)` of a kallsyms line naming kernel text.
fn text_symbol(line: &[u8]) -> Option<(u64, &str)> {
    let mut f = std::str::from_utf8(line).ok()?.split_ascii_whitespace();
    let start = u64::from_str_radix(f.next()?, 16).ok()?;
    let kind = f.next()?;
    let name = f.next()?;
    (start >= KERNEL_START && matches!(kind, "T" | "t" | "W" | "w")).then_some((start, name))
}

/// Where kernel symbols come from, and the table once read: clones share it, so a table
/// read ahead serves the symbolizer that later needs it.
#[derive(Clone)]
pub struct Kallsyms {
    path: PathBuf,
    table: Arc<OnceLock<KernelSymbols>>,
}

impl std::fmt::Debug for Kallsyms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kallsyms")
            .field("path", &self.path)
            .field("read", &self.table.get().is_some())
            .finish()
    }
}

impl Kallsyms {
    /// Symbols to be read from `path` when first needed.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Kallsyms {
            path: path.into(),
            table: Arc::default(),
        }
    }

    /// Starts reading the table on a thread; [`Kallsyms::table`] waits for it if it is
    /// not done yet.
    pub(crate) fn read_ahead(&self) {
        let k = self.clone();
        // Without a thread the table is read when first needed, as without read-ahead.
        let _ = std::thread::Builder::new()
            .name("kallsyms".into())
            .spawn(move || {
                k.table();
            });
    }

    /// The table, read now unless it was already (or is being read ahead).
    pub fn table(&self) -> &KernelSymbols {
        self.table.get_or_init(|| KernelSymbols::read(&self.path))
    }

    /// The table if it has been read.
    pub(crate) fn table_if_read(&self) -> Option<&KernelSymbols> {
        self.table.get()
    }
}

/// `NT_GNU_BUILD_ID`, the note type of a build-id.
const NT_GNU_BUILD_ID: u32 = 3;

/// The running kernel's build-id (lowercase hex), from its ELF notes
/// (`/sys/kernel/notes`, the kernel's own file); `None` when unreadable or absent.
pub(crate) fn running_build_id() -> Option<String> {
    // The kernel's notes are a few hundred bytes; more is not a notes file.
    let mut notes = Vec::new();
    std::fs::File::open("/sys/kernel/notes")
        .ok()?
        .take(64 << 10)
        .read_to_end(&mut notes)
        .ok()?;
    build_id_note(&notes)
}

/// The GNU build-id in a sequence of ELF notes (`namesz`, `descsz`, `type`, then the
/// name and the descriptor, each padded to 4 bytes).
fn build_id_note(mut b: &[u8]) -> Option<String> {
    let word = |b: &[u8], at: usize| Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let padded = |n: u32| (n as usize).div_ceil(4) * 4;
    while b.len() >= 12 {
        let (namesz, descsz, kind) = (word(b, 0)?, word(b, 4)?, word(b, 8)?);
        let name = b.get(12..12 + namesz as usize)?;
        let at = 12 + padded(namesz);
        let desc = b.get(at..at + descsz as usize)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc.iter().map(|x| format!("{x:02x}")).collect());
        }
        b = b.get(at + padded(descsz)..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_id_is_the_gnu_note_among_others() {
        let note = |name: &[u8], kind: u32, desc: &[u8]| {
            let mut v = Vec::new();
            for w in [name.len() as u32, desc.len() as u32, kind] {
                v.extend(w.to_ne_bytes());
            }
            for part in [name, desc] {
                v.extend(part);
                v.resize(v.len().div_ceil(4) * 4, 0);
            }
            v
        };
        let mut notes = note(b"Xen\0", 6, &[1, 2, 3]);
        notes.extend(note(b"GNU\0", 1, &[9; 5]));
        notes.extend(note(b"GNU\0", NT_GNU_BUILD_ID, &[0xab, 0x01, 0xff]));
        assert_eq!(build_id_note(&notes).as_deref(), Some("ab01ff"));
        assert_eq!(build_id_note(&notes[..notes.len() - 4]), None, "cut short");
        assert_eq!(build_id_note(&note(b"GNU\0", 1, &[9; 5])), None);
        // This kernel's: what `perf buildid-list -k` prints.
        let perf = std::process::Command::new("perf")
            .args(["buildid-list", "-k"])
            .output()
            .expect("perf (cargo xtask setup installs it)");
        let perf = String::from_utf8_lossy(&perf.stdout).trim().to_string();
        assert_eq!(running_build_id(), (!perf.is_empty()).then_some(perf));
    }

    #[test]
    fn lookup_bounds_duplicates_order_and_bad_lines() {
        // Modules after the kernel (out of address order), data and absolute symbols,
        // a symbol at a user address, two names at one address, corrupt lines, a name
        // that is not UTF-8 and a last line without its newline.
        let mut text = b"0000000000000000 A fixed_percpu_data\n\
             ffffffff81000000 T _stext\n\
             ffffffff81000100 t do_syscall_64\n\
             ffffffff81000100 T do_syscall_alias\n\
             ffffffff81000180 D some_data\n\
             ffffffff81000200 W entry_SYSCALL_64\n\
             ffffffffc0001000 t nf_hook\t[nf_tables]\n\
             ffffffff81000300 w weak_fn\n\
             00007f0000000000 T user_text\n\
             ffffffffzz000400 T bad_hex\n\
             ffffffff81000400 T\n\
             garbage\n\
             \n\
             ffffffff81000600 T bad_utf8_"
            .to_vec();
        text.extend_from_slice(b"\xff\nffffffff81000700 T last_kernel_fn");
        // Padding symbols: before their function (named from it); before another one,
        // and last (named as listed).
        text.extend_from_slice(
            b"\nffffffff810007f0 t __pfx_padded\n\
              ffffffff81000800 T padded\n\
              ffffffff810008f0 T __pfx_gone\n\
              ffffffff81000900 T other\n\
              ffffffff810009f0 T __pfx_\n\
              ffffffff81000a00 T __pfx_tail",
        );
        let t = KernelSymbols::parse(&text[..]);
        let at = |a| t.lookup(a).map(|f| (f.name, f.start, f.size));
        let name = |a| at(a).map(|f| f.0);
        assert_eq!(
            at(0xffff_ffff_8100_0000),
            Some(("_stext".into(), 0xffff_ffff_8100_0000, 0x100))
        );
        // The last address of a symbol, and the first of the next; of two names at one
        // address, the first in the file; a data symbol does not end a function.
        assert_eq!(name(0xffff_ffff_8100_00ff).unwrap(), "_stext");
        assert_eq!(
            at(0xffff_ffff_8100_0100),
            Some(("do_syscall_64".into(), 0xffff_ffff_8100_0100, 0x100))
        );
        assert_eq!(name(0xffff_ffff_8100_01ff).unwrap(), "do_syscall_64");
        assert_eq!(name(0xffff_ffff_8100_0200).unwrap(), "entry_SYSCALL_64");
        // Lines that do not parse are skipped: weak_fn runs to the next good symbol.
        assert_eq!(
            at(0xffff_ffff_8100_0650),
            Some(("weak_fn".into(), 0xffff_ffff_8100_0300, 0x400))
        );
        assert_eq!(name(0xffff_ffff_8100_0700).unwrap(), "last_kernel_fn");
        assert_eq!(
            at(0xffff_ffff_8100_07f0),
            Some(("__pfx_padded".into(), 0xffff_ffff_8100_07f0, 0x10))
        );
        assert_eq!(name(0xffff_ffff_8100_0800).unwrap(), "padded");
        assert_eq!(name(0xffff_ffff_8100_08f0).unwrap(), "__pfx_gone");
        assert_eq!(name(0xffff_ffff_8100_0900).unwrap(), "other");
        assert_eq!(name(0xffff_ffff_8100_09f0).unwrap(), "__pfx_");
        // Named from the next name, so not stored twice.
        assert_eq!(t.names.matches("padded").count(), 1, "{}", t.names);
        // A module's symbol, listed before lower addresses, sorts in place; the last
        // symbol is one byte long.
        assert_eq!(name(0xffff_ffff_c000_0fff).unwrap(), "__pfx_tail");
        assert_eq!(
            at(0xffff_ffff_c000_1000),
            Some(("nf_hook".into(), 0xffff_ffff_c000_1000, 1))
        );
        assert_eq!(at(0xffff_ffff_c000_1001), None);
        // Below the first symbol, and user addresses: nothing.
        assert_eq!(at(0xffff_ffff_80ff_ffff), None);
        assert_eq!(at(0x7f00_0000_0000), None);
        assert_eq!(at(0), None);
    }

    /// The running kernel's symbols, each named as `/proc/kallsyms` lists it (the first
    /// listed at an address), padding symbols named from their functions. Needs root
    /// (addresses are zero to others).
    #[test]
    fn the_running_kernels_symbols_are_named_as_listed() {
        // One read for both sides: a module loaded between two reads would differ.
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let t = KernelSymbols::parse(text.as_bytes());
        let mut seen = std::collections::HashSet::new();
        let (mut named, mut padding) = (0, 0);
        for l in text.lines() {
            let Some((start, name)) = text_symbol(l.as_bytes()) else {
                continue;
            };
            if seen.insert(start) {
                assert_eq!(t.lookup(start).unwrap().name, name, "{l}");
                named += 1;
                padding += usize::from(name.starts_with(PADDING_PREFIX));
            }
        }
        assert!(named > 10_000, "{named} symbols: is this root?");
        let stored = t.entries.iter().filter(|e| e.len & PADDING != 0).count();
        eprintln!(
            "{named} symbols, {padding} padding, {stored} named from their function; {} bytes",
            t.heap_bytes()
        );
        assert!(
            padding == 0 || stored > padding / 2,
            "{stored} of {padding}"
        );
    }

    #[test]
    fn hidden_or_missing_is_empty_and_read_ahead_is_shared() {
        // kptr_restrict shows every address as zero.
        let hidden =
            KernelSymbols::parse(&b"0000000000000000 T _stext\n0000000000000000 t f\n"[..]);
        assert_eq!(hidden.lookup(0), None);
        assert_eq!(hidden.heap_bytes(), 0);
        let k = Kallsyms::new("/nonexistent/kallsyms");
        assert_eq!(k.table().lookup(KERNEL_START), None);

        let path = std::env::temp_dir().join(format!("cpi-kallsyms-{}", std::process::id()));
        std::fs::write(
            &path,
            "ffffffff81000000 T _stext\nffffffff81000100 T next\n",
        )
        .unwrap();
        let k = Kallsyms::new(&path);
        let clone = k.clone();
        k.read_ahead();
        // The clone gets the table the thread reads (or reads it, if first).
        let f = clone.table().lookup(0xffff_ffff_8100_0010).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!((f.name.as_str(), f.size), ("_stext", 0x100));
        assert!(std::ptr::eq(k.table(), clone.table()));
    }
}
