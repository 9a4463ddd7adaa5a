//! Unwind rules that would cost more to evaluate than any compiler's output does, found
//! once when a file's unwind sections are read (cpi-user/src/unwind/mod.rs
//! `Sections::read`), so that no sample's unwind evaluates them.
//!
//! On every rule-cache miss framehop evaluates a frame's FDE (after its CIE's initial
//! instructions) with gimli, which copies a whole row for each `DW_CFA_remember_state`
//! and runs a DWARF expression's `DW_OP_skip`/`DW_OP_bra` with no bound on iterations. A
//! local user's binary padded with remember/restore pairs made one unwind cost
//! milliseconds (tests/programs/wide_unwind.c built with `-DCOSTLY`), and one backward
//! `DW_OP_skip` would never end: the root agent, busy unwinding, is blinded for every
//! process. So each entry framehop can reach — those `.eh_frame_hdr` lists, with their
//! CIEs, or every entry of `.eh_frame` without it — is decoded (not evaluated) once per
//! file and checked against bounds no compiler output reaches (BENCHMARKS.md, "Unwind rules that cost too
//! much"). The decode is linear in the section: each entry's instructions once, each CIE
//! once, and a table listing entries again is stopped by a bound on the bytes decoded.

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CallFrameInstruction, CieOrFde, EhFrame, EhFrameHdr, Encoding, LittleEndian,
    Operation, Reader, UnwindSection,
};

/// Largest CIE or FDE whose rules are evaluated, in bytes (its length field). The
/// largest seen: 33,676 bytes in the nightly's `librustc_driver`, 2,884 in its
/// `libLLVM`, 376 in Debian's `python3.11`, 192 in its libc.
pub const MAX_ENTRY_BYTES: u64 = 64 << 10;

/// Most `DW_CFA_remember_state` in one CIE or FDE (each a row copy when evaluated). The
/// most seen: 16 in `python3.11`, 9 in `librustc_driver` and `libLLVM`, 8 in libc and
/// libstdc++.
pub const MAX_REMEMBERS: u32 = 256;

/// Why a file's unwind rules are not evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Costly {
    /// An entry longer than [`MAX_ENTRY_BYTES`].
    Long,
    /// An entry with more than [`MAX_REMEMBERS`] `DW_CFA_remember_state`.
    Remembers,
    /// A DWARF expression that branches (`DW_OP_skip`, `DW_OP_bra`): it may loop.
    Branches,
    /// `.eh_frame_hdr` lists entries more than once (more bytes to decode than twice
    /// the section).
    Repeats,
}

/// The unwind sections of one file as framehop reads them, with their addresses.
pub struct UnwindSections<'a> {
    pub eh_frame: (&'a [u8], u64),
    pub eh_frame_hdr: Option<(&'a [u8], u64)>,
    pub text: Option<u64>,
    pub got: Option<u64>,
}

/// The first bound the entries framehop can reach break, if any. Entries that do not
/// parse are skipped: framehop fails on them before evaluating anything.
pub fn check(s: &UnwindSections<'_>) -> Option<Costly> {
    scan(s).0
}

/// [`check`], and the entry bytes it decoded.
fn scan(s: &UnwindSections<'_>) -> (Option<Costly>, u64) {
    let (eh, eh_svma) = s.eh_frame;
    let mut bases = BaseAddresses::default().set_eh_frame(eh_svma);
    if let Some(t) = s.text {
        bases = bases.set_text(t);
    }
    if let Some(g) = s.got {
        bases = bases.set_got(g);
    }
    let mut section = EhFrame::new(eh, LittleEndian);
    section.set_address_size(8);
    let budget = (eh.len() as u64).saturating_mul(2);
    let mut c = Checker {
        section,
        bases: bases.clone(),
        cies: HashMap::new(),
        budget,
    };
    let verdict = match s.eh_frame_hdr {
        Some((hdr, hdr_svma)) => {
            let bases = bases.set_eh_frame_hdr(hdr_svma);
            c.bases = bases.clone();
            // framehop finds FDEs through this table only; unparsable, it finds none.
            let parsed = EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8).ok();
            let mut verdict = None;
            if let Some(table) = parsed.as_ref().and_then(|p| p.table()) {
                let mut entries = table.iter(&bases);
                while let Ok(Some((_, fde))) = entries.next() {
                    if let Ok(offset) = table.pointer_to_offset(fde) {
                        verdict = c.fde(offset.0);
                        if verdict.is_some() {
                            break;
                        }
                    }
                }
            }
            verdict
        }
        None => {
            // framehop indexes every entry, and none at all if one fails to parse.
            let mut entries = c.section.entries(&c.bases);
            let mut fdes = Vec::new();
            while let Ok(Some(e)) = entries.next() {
                if let CieOrFde::Fde(f) = e {
                    fdes.push(f.offset());
                }
            }
            fdes.into_iter().find_map(|o| c.fde(o))
        }
    };
    (verdict, budget - c.budget)
}

struct Checker<'a> {
    section: EhFrame<gimli::EndianSlice<'a, LittleEndian>>,
    bases: BaseAddresses,
    /// Verdicts on the CIEs decoded, by offset.
    cies: HashMap<usize, Option<Costly>>,
    /// Instruction bytes left to decode.
    budget: u64,
}

impl Checker<'_> {
    /// The verdict on the FDE at `offset` and its CIE; `Some` breaks the check.
    fn fde(&mut self, offset: usize) -> Option<Costly> {
        let fde = self
            .section
            .partial_fde_from_offset(&self.bases, offset.into())
            .and_then(|p| p.parse(EhFrame::cie_from_offset))
            .ok()?;
        let cie = fde.cie();
        let encoding = cie.encoding();
        let (section, bases) = (self.section, &self.bases);
        let budget = &mut self.budget;
        let cie_verdict = *self.cies.entry(cie.offset()).or_insert_with(|| {
            let instructions = cie.instructions(&section, bases);
            entry(
                cie.entry_len() as u64,
                instructions,
                encoding,
                &section,
                budget,
            )
        });
        cie_verdict.or_else(|| {
            let instructions = fde.instructions(&section, bases);
            entry(
                fde.entry_len() as u64,
                instructions,
                encoding,
                &section,
                budget,
            )
        })
    }
}

/// The verdict on one entry of `len` bytes whose instructions are `instructions`:
/// decoded up to the first that does not parse (framehop's evaluation stops there), its
/// length taken from `budget`.
fn entry<R: Reader<Offset = usize>>(
    len: u64,
    mut instructions: gimli::CallFrameInstructionIter<'_, R>,
    encoding: Encoding,
    section: &EhFrame<R>,
    budget: &mut u64,
) -> Option<Costly> {
    if len > MAX_ENTRY_BYTES {
        return Some(Costly::Long);
    }
    *budget = match budget.checked_sub(len) {
        Some(b) => b,
        None => return Some(Costly::Repeats),
    };
    let mut remembers = 0u32;
    while let Ok(Some(i)) = instructions.next() {
        let expression = match i {
            CallFrameInstruction::RememberState => {
                remembers += 1;
                if remembers > MAX_REMEMBERS {
                    return Some(Costly::Remembers);
                }
                continue;
            }
            CallFrameInstruction::DefCfaExpression { expression }
            | CallFrameInstruction::Expression { expression, .. }
            | CallFrameInstruction::ValExpression { expression, .. } => expression,
            _ => continue,
        };
        let Ok(mut ops) = expression.get(section).map(|e| e.0) else {
            continue;
        };
        while !ops.is_empty() {
            match Operation::parse(&mut ops, encoding) {
                Ok(Operation::Skip { .. } | Operation::Bra { .. }) => {
                    return Some(Costly::Branches)
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An `.eh_frame` of one CIE and one FDE for [0x1000, 0x1100) whose instructions
    /// are `fde_ops` (padded to a multiple of 8 bytes with `DW_CFA_nop`), at address 0.
    pub(crate) fn eh_frame(fde_ops: &[u8]) -> Vec<u8> {
        let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b];
        // DW_CFA_def_cfa rsp+8; DW_CFA_offset rip, cfa-8.
        cie.extend([0x0c, 7, 8, 0x90, 1]);
        let mut out = Vec::new();
        push_entry(&mut out, &cie);
        let at = out.len();
        let mut fde = Vec::new();
        fde.extend(((at + 4) as u32).to_le_bytes());
        // pc_begin, pcrel sdata4: relative to its own position (at + 8).
        fde.extend((0x1000 - (at as i64 + 8)).to_le_bytes()[..4].iter());
        fde.extend(0x100u32.to_le_bytes());
        fde.push(0);
        fde.extend(fde_ops);
        push_entry(&mut out, &fde);
        out.extend([0, 0, 0, 0]);
        out
    }

    fn push_entry(out: &mut Vec<u8>, body: &[u8]) {
        let mut body = body.to_vec();
        while !(body.len() + 4).is_multiple_of(8) {
            body.push(0);
        }
        out.extend((body.len() as u32).to_le_bytes());
        out.extend(body);
    }

    fn verdict(fde_ops: &[u8]) -> Option<Costly> {
        let eh = eh_frame(fde_ops);
        check(&UnwindSections {
            eh_frame: (&eh, 0),
            eh_frame_hdr: None,
            text: None,
            got: None,
        })
    }

    /// `n` remember/restore pairs.
    fn pairs(n: usize) -> Vec<u8> {
        [0x0a, 0x0b].repeat(n)
    }

    #[test]
    fn remembers_up_to_the_bound_pass_one_more_is_costly() {
        assert_eq!(verdict(&pairs(MAX_REMEMBERS as usize)), None);
        assert_eq!(
            verdict(&pairs(MAX_REMEMBERS as usize + 1)),
            Some(Costly::Remembers)
        );
    }

    #[test]
    fn entries_up_to_the_byte_bound_pass_one_longer_is_costly() {
        // DW_CFA_nop fills the entry. Its length field counts the 13 bytes of CIE
        // pointer, address range and augmentation, and the instructions, padded so
        // that the entry with the field is a multiple of 8: MAX_ENTRY_BYTES - 4 is the
        // longest within the bound, one instruction more pads it to MAX_ENTRY_BYTES + 4.
        let longest = MAX_ENTRY_BYTES as usize - 4 - 13;
        assert_eq!(verdict(&vec![0; longest]), None);
        assert_eq!(verdict(&vec![0; longest + 1]), Some(Costly::Long));
    }

    #[test]
    fn a_branching_expression_is_costly_a_straight_one_is_not() {
        // DW_CFA_def_cfa_expression, 3 bytes: DW_OP_skip -3 (back to itself).
        assert_eq!(
            verdict(&[0x0f, 3, 0x2f, 0xfd, 0xff]),
            Some(Costly::Branches)
        );
        // glibc's PLT rule: DW_OP_breg7 8; DW_OP_breg16 0; lit15; and; lit11; ge;
        // lit3; shl; plus.
        let plt = [
            0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(verdict(&plt), None);
    }

    /// Debian's own binaries and libraries pass (the figures in the bounds' comments),
    /// every entry decoded through `.eh_frame_hdr`'s table.
    #[test]
    fn real_libraries_pass() {
        for path in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/usr/bin/python3.11",
        ] {
            let bytes = std::fs::read(path).expect("Debian 12's own");
            let f = object::File::parse(&*bytes).unwrap();
            use object::{Object, ObjectSection};
            let sec = |n: &str| {
                let s = f.section_by_name(n)?;
                Some((s.data().ok()?, s.address()))
            };
            let s = UnwindSections {
                eh_frame: sec(".eh_frame").unwrap(),
                eh_frame_hdr: sec(".eh_frame_hdr"),
                text: sec(".text").map(|s| s.1),
                got: sec(".got").map(|s| s.1),
            };
            let (verdict, decoded) = scan(&s);
            assert_eq!(verdict, None, "{path}");
            // All but the section's CIEs and terminator.
            assert!(
                decoded > s.eh_frame.0.len() as u64 * 9 / 10,
                "{path}: {decoded}"
            );
        }
    }
}
