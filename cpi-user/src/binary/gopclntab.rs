//! Function bounds and names of Go binaries from `.gopclntab`, the table the Go runtime
//! itself reads to name frames (runtime/symtab.go, debug/gosym): Go binaries are
//! shipped stripped (`go build -ldflags="-s -w"`: no `.symtab`, no DWARF) and carry no
//! `.eh_frame`, so without it every sample of one is in no function.
//!
//! Layouts read, by the header's magic (runtime/symtab.go's `pcHeader`):
//! - Go 1.18-1.19 (`0xfffffff0`) and 1.20+ (`0xfffffff1`): `nfunc`, `textStart`, then
//!   offsets of the function-name table and of the function table; each function-table
//!   entry is two `u32`s (entry offset from `textStart`, offset of its `_func`), and a
//!   `_func` starts with its entry offset and the offset of its name;
//! - Go 1.16-1.17 (`0xfffffffa`): the same with pointer-sized entries holding absolute
//!   addresses and no `textStart`;
//! - Go 1.2-1.15 (`0xfffffffb`): `nfunc`, then pointer-sized (entry, `_func` offset)
//!   pairs right after the header; names are offsets from the table's start.
//!
//! The table is the file's owner's bytes: every read is bounds-checked, the entries
//! kept are at most what the section can hold (8 bytes or more each), and the name
//! bytes scanned for their NUL are at most the section's size in all (a real table
//! holds each name once); past that the rest are left unnamed (`func_<addr>`) and the
//! cut is said and counted (`fsafe::budget::Reader::GoPclntab`). Cost is linear in the
//! section.

use std::borrow::Cow;

use super::tables::Cand;

/// Longest name read: Go's longest generic instantiations run to a few hundred bytes.
const MAX_NAME: usize = 4096;

/// Which header layout.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    Go12,
    Go116,
    Go118,
}

/// The functions `.gopclntab` (contents `tab`) lists, in table order: start, size and
/// name. Empty when it is not a table this reader knows or is malformed at its head;
/// a table cut short yields the functions before the cut. `text` is the `.text`
/// section's address: a position-independent binary's header holds 0 where its text
/// starts (the loader relocates it), as debug/gosym is told the text start by its caller.
/// The flag says the name budget ran out (the caller says so, naming the file).
pub(super) fn functions(tab: &[u8], text: u64) -> (Vec<Cand<'_>>, bool) {
    let read = read(tab, text);
    (read.0, read.1 == 0)
}

/// [`functions`], and the name bytes left unscanned of the budget.
fn read(tab: &[u8], text: u64) -> (Vec<Cand<'_>>, usize) {
    let none = (Vec::new(), 1);
    let (Some(magic), Some(&ptr)) = (u32_at(tab, 0), tab.get(7)) else {
        return none;
    };
    let layout = match magic {
        0xffff_fffb => Layout::Go12,
        0xffff_fffa => Layout::Go116,
        0xffff_fff0 | 0xffff_fff1 => Layout::Go118,
        _ => return none,
    };
    if ptr != 8 || tab.get(4..6) != Some(&[0, 0]) {
        return none;
    }
    let word = |i: usize| u64_at(tab, 8 + 8 * i);
    let Some(nfunc) = word(0) else {
        return none;
    };
    // (function table offset, entry size, name table offset, text start).
    let head = match layout {
        Layout::Go12 => Some((16, 16, 0, 0)),
        Layout::Go116 => word(6).zip(word(2)).map(|(t, n)| (t, 16, n, 0)),
        Layout::Go118 => word(7)
            .zip(word(3))
            .zip(word(2))
            .map(|((t, n), start)| (t, 8, n, if start == 0 { text } else { start })),
    };
    let Some((ftab, entry_size, names, text)) = head else {
        return none;
    };
    let (Ok(ftab), Ok(names)) = (usize::try_from(ftab), usize::try_from(names)) else {
        return none;
    };
    let room = tab.len().saturating_sub(ftab) / entry_size;
    let n = usize::try_from(nfunc)
        .unwrap_or(usize::MAX)
        .min(room.saturating_sub(1));
    let entry = |i: usize| -> Option<(u64, usize)> {
        let at = ftab.checked_add(i.checked_mul(entry_size)?)?;
        match layout {
            Layout::Go118 => Some((
                text.checked_add(u64::from(u32_at(tab, at)?))?,
                ftab.checked_add(u32_at(tab, at + 4)? as usize)?,
            )),
            Layout::Go116 => Some((
                u64_at(tab, at)?,
                ftab.checked_add(usize::try_from(u64_at(tab, at + 8)?).ok()?)?,
            )),
            Layout::Go12 => Some((
                u64_at(tab, at)?,
                usize::try_from(u64_at(tab, at + 8)?).ok()?,
            )),
        }
    };
    // A `_func`'s name offset follows its entry (4 bytes from 1.18 on, a pointer before).
    let name_field = if layout == Layout::Go118 { 4 } else { 8 };
    let mut scan_left = tab.len();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (Some((start, func)), Some((end, _))) = (
            entry(i),
            entry(i + 1).or_else(|| last_end(tab, ftab, n, layout, text)),
        ) else {
            break;
        };
        if end < start {
            break;
        }
        let name = u32_at(tab, func + name_field)
            .and_then(|off| names.checked_add(off as usize))
            .and_then(|at| name_at(tab, at, &mut scan_left));
        if end > start {
            out.push(Cand {
                start,
                size: end - start,
                name,
            });
        }
    }
    (out, scan_left)
}

/// The end of the last function where the table holds it as a lone entry.
fn last_end(tab: &[u8], ftab: usize, n: usize, layout: Layout, text: u64) -> Option<(u64, usize)> {
    match layout {
        Layout::Go118 => Some((text.checked_add(u64::from(u32_at(tab, ftab + n * 8)?))?, 0)),
        _ => Some((u64_at(tab, ftab + n * 16)?, 0)),
    }
}

/// The NUL-terminated UTF-8 name at `at`, scanning at most `left` bytes (taken from it).
fn name_at<'d>(tab: &'d [u8], at: usize, left: &mut usize) -> Option<Cow<'d, str>> {
    let bytes = tab.get(at..)?;
    let bytes = &bytes[..bytes.len().min(MAX_NAME).min(*left)];
    let len = bytes.iter().position(|&b| b == 0);
    *left -= len.map_or(bytes.len(), |l| l + 1);
    let name = std::str::from_utf8(&bytes[..len?]).ok()?;
    (!name.is_empty()).then_some(Cow::Borrowed(name))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Go 1.18 table of two functions at text + 0x10 and + 0x30, ending at + 0x48.
    fn table() -> Vec<u8> {
        let mut t = vec![0u8; 8 + 8 * 8];
        t[..4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        t[6] = 1;
        t[7] = 8;
        let names = t.len();
        t.extend_from_slice(b"main.main\0main.spinHot\0");
        let ftab = t.len();
        let words = [2u64, 0, 0x40_1000, names as u64, 0, 0, 0, ftab as u64];
        for (i, w) in words.iter().enumerate() {
            t[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        // functab: (entryoff, funcoff) ×2, then the end; then the two _funcs.
        for v in [0x10u32, 20, 0x30, 28, 0x48, 0x10, 0, 0x30, 10] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        t
    }

    #[test]
    fn a_go_118_table_names_and_bounds_its_functions() {
        let t = table();
        let (f, cut) = functions(&t, 0);
        assert!(!cut);
        let got: Vec<_> = f
            .iter()
            .map(|c| (c.start, c.size, c.name.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (0x40_1010, 0x20, Some("main.main")),
                (0x40_1030, 0x18, Some("main.spinHot"))
            ]
        );
    }

    #[test]
    fn cut_or_corrupted_tables_never_panic_and_stay_bounded() {
        let t = table();
        for n in 0..t.len() {
            let (f, _) = functions(&t[..n], 0x1000);
            assert!(f.len() <= 2);
        }
        for i in 0..t.len() {
            for b in [0x00, 0x7f, 0xff] {
                let mut c = t.clone();
                c[i] = b;
                let (f, _) = functions(&c, 0x1000);
                assert!(f.len() <= c.len() / 8);
            }
        }
    }
}
