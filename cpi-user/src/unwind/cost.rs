//! Unwind rules that would cost more to evaluate than any compiler's output does, found
//! once when a file's unwind sections are read (cpi-user/src/unwind/mod.rs
//! `Sections::read`), so that no sample's unwind evaluates them.
//!
//! On every rule-cache miss framehop evaluates a frame's FDE (after its CIE's initial
//! instructions) with gimli, which copies a whole row for each `DW_CFA_remember_state`,
//! searches the row for each register rule set, and runs a DWARF expression's
//! `DW_OP_skip`/`DW_OP_bra` with no bound on iterations. A local user's binary padded
//! with remember/restore pairs made one evaluation cost milliseconds
//! (tests/programs/wide_unwind.c built with `-DCOSTLY`), and one backward `DW_OP_skip`
//! would never end: the root agent, busy unwinding, is blinded for every process. So
//! each entry framehop can reach — those `.eh_frame_hdr` lists, with their CIEs, or
//! every entry of `.eh_frame` without it — is decoded (not evaluated) once per file,
//! what evaluating it costs counted ([`MAX_COST`]: a wide margin over what real
//! compilers write, valgrind's and gcc's included), and checked against bounds
//! (BENCHMARKS.md, "Unwind rules that cost too much"). The decode is linear in the
//! section: each entry's instructions once, each CIE once, and a table listing entries
//! again is stopped by a bound on the bytes decoded.

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CallFrameInstruction, CieOrFde, EhFrame, EhFrameHdr, Encoding, LittleEndian,
    Operation, Reader, Register, UnwindSection,
};

/// Largest CIE or FDE whose rules are evaluated, in bytes (its length field). The
/// largest seen: 33,676 bytes in the nightly's `librustc_driver`, 2,884 in its
/// `libLLVM`, 376 in Debian's `python3.11`, 192 in its libc.
pub(crate) const MAX_ENTRY_BYTES: u64 = 64 << 10;

/// What evaluating an entry costs, in units of about a nanosecond on the 2-vCPU VM
/// (`figures::evaluation_cost_figures` below measures them): framehop evaluates, on each
/// rule-cache miss, the CIE's instructions and the FDE's up to the frame's address —
/// all of them, at its end. Each instruction decoded costs [`INSTRUCTION_COST`]; each
/// `DW_CFA_remember_state` copies the row (gimli moves its 192 slots, whatever it
/// holds) for [`REMEMBER_COST`]; and each rule the row holds costs [`RULE_COST`] per
/// remember (copied) and per instruction that sets or restores a register's rule (a
/// linear search of the row). The rules in a row are bounded by the distinct registers
/// the entry's instructions name, and by gimli's 192.
pub(crate) const INSTRUCTION_COST: u64 = 10;
/// See [`INSTRUCTION_COST`].
pub(crate) const REMEMBER_COST: u64 = 200;
/// See [`INSTRUCTION_COST`].
pub(crate) const RULE_COST: u64 = 2;
/// Most rules gimli holds in a row.
const MAX_RULES: u64 = 192;

/// Highest cost ([`INSTRUCTION_COST`]) of one entry whose rules are evaluated: about 2 ms
/// per evaluation on the 2-vCPU VM (0.8–1.4 ns a unit measured). The costliest entries
/// seen, evaluated to their end: 269,148 (≈ 260 µs) in valgrind's
/// `memcheck-amd64-linux`, 1,067 remembers in a 6,420-byte FDE; 204,718 in the
/// nightly's `librustc_driver`; 159,484 in `libepoxy`; 134,080 in gcc's `cc1` and
/// `cc1plus` (442 remembers); 115,832 in `node`. The attack of
/// tests/programs/wide_unwind.c `-DCOSTLY` costs 6,660,314 (≈ 6.3 ms).
pub(crate) const MAX_COST: u64 = 2_000_000;

/// Why a file's unwind rules are not evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Costly {
    /// An entry longer than [`MAX_ENTRY_BYTES`].
    Long,
    /// An entry costing more than [`MAX_COST`] to evaluate.
    Costs,
    /// A DWARF expression that branches (`DW_OP_skip`, `DW_OP_bra`): it may loop.
    Branches,
    /// `.eh_frame_hdr` lists entries more than once (more bytes to decode than twice
    /// the section).
    Repeats,
}

/// The unwind sections of one file as framehop reads them, with their addresses.
pub(crate) struct UnwindSections<'a> {
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

/// Verdicts of [`check`] kept at most: a few KiB each thousand.
const MAX_VERDICTS: usize = 4096;

/// Heap bytes of one kept verdict (digest, verdict, use, and the map's own).
const VERDICT_BYTES: u64 = 64;

/// [`check`]'s verdicts by the digest of what it checked, so that sections read again
/// — a file evicted and mapped again by its next process, or copied again — are not
/// decoded again: `librustc_driver`'s and `libLLVM`'s `.eh_frame` take 69 and 41 ms to
/// check, and BLAKE3 was 1.2 % of the agent's samples beside builds (BENCHMARKS.md, "A
/// user's own toolchain"). Keyed by content, not by the file's identity and change
/// time: a write through a shared writable mapping changes no time stamp while its
/// page stays dirty (on tmpfs, ever), so a file whose (device, inode, size, ctime) is
/// unchanged may still hold other bytes than were checked. BLAKE3, because the bytes may be a local user's, who must not find other
/// sections with the digest of checked ones.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    kept: HashMap<[u8; 32], (Option<Costly>, u64)>,
    tick: u64,
}

impl Verdicts {
    /// [`check`], or the verdict on the same sections checked before.
    pub fn check(&mut self, s: &UnwindSections<'_>) -> Option<Costly> {
        let digest = digest(s);
        self.tick += 1;
        if let Some((verdict, used)) = self.kept.get_mut(&digest) {
            *used = self.tick;
            return *verdict;
        }
        let verdict = check(s);
        if self.kept.len() >= MAX_VERDICTS {
            // The least recently used out: one scan per insert when full, beside a check.
            if let Some(oldest) = self.kept.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| *k) {
                self.kept.remove(&oldest);
            }
        }
        self.kept.insert(digest, (verdict, self.tick));
        verdict
    }

    /// Heap bytes the kept verdicts take.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.kept.len() as u64 * VERDICT_BYTES
    }
}

/// Everything [`check`] reads, each part with its length or presence, so no two inputs
/// hash the same bytes.
fn digest(s: &UnwindSections<'_>) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let mut part = |bytes: Option<(&[u8], u64)>| match bytes {
        Some((b, address)) => {
            h.update(&[1]);
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
            h.update(&address.to_le_bytes());
        }
        None => {
            h.update(&[0]);
        }
    };
    part(Some(s.eh_frame));
    part(s.eh_frame_hdr);
    part(s.text.map(|a| (&[][..], a)));
    part(s.got.map(|a| (&[][..], a)));
    *h.finalize().as_bytes()
}

/// [`check`], and the entry bytes it decoded.
fn scan(s: &UnwindSections<'_>) -> (Option<Costly>, u64) {
    let mut c = Checker::new(s);
    let budget = c.bounds.bytes;
    let mut verdict = None;
    c.reachable(s, |c, offset| {
        verdict = c.fde(offset);
        verdict.is_some()
    });
    (verdict, budget - c.bounds.bytes)
}

struct Checker<'a> {
    section: EhFrame<gimli::EndianSlice<'a, LittleEndian>>,
    bases: BaseAddresses,
    /// What the CIEs decoded cost, by offset.
    cies: HashMap<usize, Result<Cie, Costly>>,
    bounds: Bounds,
    /// The registers named in the entry being decoded.
    named: Named,
}

/// What the decode of a file's entries may still do.
struct Bounds {
    /// Instruction bytes left to decode.
    bytes: u64,
    /// Highest cost of an entry not refused: [`MAX_COST`] (the figures below lift it).
    cost: u64,
}

/// A CIE's cost, and the registers its instructions name: each FDE's evaluation begins
/// with them.
struct Cie {
    cost: u64,
    registers: Vec<u16>,
}

impl<'a> Checker<'a> {
    /// A checker of `s`'s entries, to decode at most twice its `.eh_frame`.
    fn new(s: &UnwindSections<'a>) -> Self {
        let (eh, eh_svma) = s.eh_frame;
        let mut bases = BaseAddresses::default().set_eh_frame(eh_svma);
        if let Some(t) = s.text {
            bases = bases.set_text(t);
        }
        if let Some(g) = s.got {
            bases = bases.set_got(g);
        }
        if let Some((_, hdr_svma)) = s.eh_frame_hdr {
            bases = bases.set_eh_frame_hdr(hdr_svma);
        }
        let mut section = EhFrame::new(eh, LittleEndian);
        section.set_address_size(8);
        Checker {
            section,
            bases,
            cies: HashMap::new(),
            bounds: Bounds {
                bytes: (eh.len() as u64).saturating_mul(2),
                cost: MAX_COST,
            },
            named: Named::default(),
        }
    }

    /// Calls `visit` with the offset of each FDE framehop can reach in `s` until it
    /// returns true.
    fn reachable(
        &mut self,
        s: &UnwindSections<'_>,
        mut visit: impl FnMut(&mut Self, usize) -> bool,
    ) {
        let Some((hdr, _)) = s.eh_frame_hdr else {
            // framehop indexes every entry, and none at all if one fails to parse.
            let mut entries = self.section.entries(&self.bases);
            let mut fdes = Vec::new();
            while let Ok(Some(e)) = entries.next() {
                if let CieOrFde::Fde(f) = e {
                    fdes.push(f.offset());
                }
            }
            for o in fdes {
                if visit(self, o) {
                    return;
                }
            }
            return;
        };
        // framehop finds FDEs through this table only; unparsable, it finds none.
        let bases = self.bases.clone();
        let parsed = EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8).ok();
        let Some(table) = parsed.as_ref().and_then(|p| p.table()) else {
            return;
        };
        let mut entries = table.iter(&bases);
        while let Ok(Some((_, fde))) = entries.next() {
            if let Ok(offset) = table.pointer_to_offset(fde) {
                if visit(self, offset.0) {
                    return;
                }
            }
        }
    }

    /// The verdict on the FDE at `offset` and its CIE; `Some` breaks the check.
    fn fde(&mut self, offset: usize) -> Option<Costly> {
        self.fde_cost(offset)?.err()
    }

    /// The cost of evaluating the FDE at `offset` (its CIE's instructions, then its
    /// own); `None` if it does not parse.
    fn fde_cost(&mut self, offset: usize) -> Option<Result<u64, Costly>> {
        let fde = self
            .section
            .partial_fde_from_offset(&self.bases, offset.into())
            .and_then(|p| p.parse(EhFrame::cie_from_offset))
            .ok()?;
        let cie = fde.cie();
        let encoding = cie.encoding();
        let Checker {
            section,
            bases,
            cies,
            bounds,
            named,
        } = self;
        let verdict = cies.entry(cie.offset()).or_insert_with(|| {
            named.clear();
            let instructions = cie.instructions(section, bases);
            let cost = entry(
                cie.entry_len() as u64,
                instructions,
                encoding,
                section,
                bounds,
                named,
                0,
            )?;
            // Its rules are kept aside as the initial ones: one more row copy.
            let rules = (named.list.len() as u64).min(MAX_RULES);
            Ok(Cie {
                cost: cost + REMEMBER_COST + RULE_COST * rules,
                registers: named.list.clone(),
            })
        });
        let cie = match verdict {
            Ok(cie) => cie,
            Err(e) => return Some(Err(*e)),
        };
        named.clear();
        for &r in &cie.registers {
            named.add(Register(r));
        }
        let instructions = fde.instructions(section, bases);
        Some(entry(
            fde.entry_len() as u64,
            instructions,
            encoding,
            section,
            bounds,
            named,
            cie.cost,
        ))
    }
}

/// Registers named so far, each once.
struct Named {
    bits: Box<[u64; 1024]>,
    list: Vec<u16>,
}

impl Default for Named {
    fn default() -> Self {
        Named {
            bits: Box::new([0; 1024]),
            list: Vec::new(),
        }
    }
}

impl Named {
    fn add(&mut self, r: Register) {
        let (word, bit) = (usize::from(r.0 / 64), 1u64 << (r.0 % 64));
        if self.bits[word] & bit == 0 {
            self.bits[word] |= bit;
            self.list.push(r.0);
        }
    }

    /// Empties it, in time linear in the registers named.
    fn clear(&mut self) {
        for r in self.list.drain(..) {
            self.bits[usize::from(r / 64)] = 0;
        }
    }
}

/// The cost of evaluating one entry of `len` bytes whose instructions are
/// `instructions` after work costing `cost` ([`INSTRUCTION_COST`]), the registers named
/// before it in `named`; or why it is not to be evaluated (one costlier than
/// `bounds.cost`). Decoded up to the first instruction that does not parse (framehop's
/// evaluation stops there), its length taken from `bounds.bytes`.
fn entry<R: Reader<Offset = usize>>(
    len: u64,
    mut instructions: gimli::CallFrameInstructionIter<'_, R>,
    encoding: Encoding,
    section: &EhFrame<R>,
    bounds: &mut Bounds,
    named: &mut Named,
    mut cost: u64,
) -> Result<u64, Costly> {
    if len > MAX_ENTRY_BYTES {
        return Err(Costly::Long);
    }
    bounds.bytes = bounds.bytes.checked_sub(len).ok_or(Costly::Repeats)?;
    while let Ok(Some(i)) = instructions.next() {
        cost += INSTRUCTION_COST;
        let (set, expression) = match i {
            CallFrameInstruction::RememberState => {
                cost += REMEMBER_COST;
                (None, None)
            }
            CallFrameInstruction::Undefined { register }
            | CallFrameInstruction::SameValue { register }
            | CallFrameInstruction::Offset { register, .. }
            | CallFrameInstruction::OffsetExtendedSf { register, .. }
            | CallFrameInstruction::ValOffset { register, .. }
            | CallFrameInstruction::ValOffsetSf { register, .. }
            | CallFrameInstruction::Restore { register }
            | CallFrameInstruction::Register {
                dest_register: register,
                ..
            } => (Some(register), None),
            CallFrameInstruction::Expression {
                register,
                expression,
            }
            | CallFrameInstruction::ValExpression {
                register,
                expression,
            } => (Some(register), Some(expression)),
            CallFrameInstruction::DefCfaExpression { expression } => (None, Some(expression)),
            _ => (None, None),
        };
        if let Some(r) = set {
            named.add(r);
        }
        if set.is_some() || matches!(i, CallFrameInstruction::RememberState) {
            cost += RULE_COST * (named.list.len() as u64).min(MAX_RULES);
        }
        if cost > bounds.cost {
            return Err(Costly::Costs);
        }
        let Some(Ok(mut ops)) = expression.map(|e| e.get(section).map(|e| e.0)) else {
            continue;
        };
        while !ops.is_empty() {
            match Operation::parse(&mut ops, encoding) {
                Ok(Operation::Skip { .. } | Operation::Bra { .. }) => return Err(Costly::Branches),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    Ok(cost)
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

    /// The unwind sections of ELF file `f`.
    pub(crate) fn sections<'a>(f: &object::File<'a>) -> UnwindSections<'a> {
        use object::{Object, ObjectSection};
        let sec = |n: &str| {
            let s = f.section_by_name(n)?;
            Some((s.data().ok()?, s.address()))
        };
        UnwindSections {
            eh_frame: sec(".eh_frame").unwrap(),
            eh_frame_hdr: sec(".eh_frame_hdr"),
            text: sec(".text").map(|s| s.1),
            got: sec(".got").map(|s| s.1),
        }
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
        check(&only_eh_frame(&eh_frame(fde_ops), 0))
    }

    /// What evaluating [`eh_frame`]'s FDE costs.
    fn cost(fde_ops: &[u8]) -> Result<u64, Costly> {
        let eh = eh_frame(fde_ops);
        let s = only_eh_frame(&eh, 0);
        let mut c = Checker::new(&s);
        let mut cost = None;
        c.reachable(&s, |c, o| {
            cost = c.fde_cost(o);
            true
        });
        cost.expect("one FDE")
    }

    /// `n` remember/restore pairs.
    fn pairs(n: usize) -> Vec<u8> {
        [0x0a, 0x0b].repeat(n)
    }

    /// The cost of `n` remember/restore pairs in [`eh_frame`]'s FDE, with its CIE.
    fn pairs_cost(n: u64) -> u64 {
        // The CIE: DW_CFA_def_cfa, DW_CFA_offset rip (one rule) and two DW_CFA_nop
        // padding it, its rules kept aside as the initial ones (a row copy).
        let cie = 4 * INSTRUCTION_COST + RULE_COST + REMEMBER_COST + RULE_COST;
        // Each pair: a copy of the row of that one rule, and a pop.
        let pair = 2 * INSTRUCTION_COST + REMEMBER_COST + RULE_COST;
        // DW_CFA_nop padding the FDE's 13 bytes and the pairs (and its length field) to
        // a multiple of 8.
        let padding = (8 - (17 + 2 * n) % 8) % 8;
        cie + n * pair + padding * INSTRUCTION_COST
    }

    #[test]
    fn remembers_up_to_the_cost_bound_pass_one_more_is_costly() {
        let most = (0..MAX_COST)
            .take_while(|&n| pairs_cost(n) <= MAX_COST)
            .last();
        let most = most.unwrap();
        // The attack's 30,000 pairs are refused, valgrind's 1,067 pass.
        assert!((1_067..30_000).contains(&most), "{most}");
        assert_eq!(verdict(&pairs(most as usize)), None);
        assert_eq!(
            verdict(&pairs(most as usize + 1)),
            Some(Costly::Costs),
            "{}",
            pairs_cost(most + 1)
        );
        assert_eq!(cost(&pairs(7)), Ok(pairs_cost(7)));
    }

    /// Each rule a row holds makes the instructions that set one costlier (a search
    /// of the row): the same instructions after 180 rules are refused, after 8 not.
    #[test]
    fn rules_in_the_row_count_in_the_cost() {
        let after = |rules: u16| {
            let mut ops: Vec<u8> = (16..16 + rules)
                .flat_map(|r| {
                    // DW_CFA_offset_extended REG (ULEB128), 1.
                    let reg = if r < 128 {
                        vec![r as u8]
                    } else {
                        vec![(r & 0x7f) as u8 | 0x80, (r >> 7) as u8]
                    };
                    [vec![0x05], reg, vec![1]].concat()
                })
                .collect();
            // DW_CFA_same_value r15.
            ops.extend([0x08, 15].repeat((MAX_COST / 300) as usize));
            verdict(&ops)
        };
        assert_eq!(after(8), None);
        assert_eq!(after(180), Some(Costly::Costs));
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

    /// Sections of `eh` alone, at `address`.
    pub(crate) fn only_eh_frame(eh: &[u8], address: u64) -> UnwindSections<'_> {
        UnwindSections {
            eh_frame: (eh, address),
            eh_frame_hdr: None,
            text: None,
            got: None,
        }
    }

    /// A verdict is kept for the bytes checked, not for the file: the same sections
    /// with one byte rewritten (a user's file copied again after a write that left its
    /// time stamps alone) are checked again.
    #[test]
    fn a_kept_verdict_answers_only_for_the_same_bytes() {
        // DW_CFA_def_cfa_expression, 3 bytes: three DW_OP_nop, or DW_OP_skip -3.
        let straight = eh_frame(&[0x0f, 3, 0x96, 0x96, 0x96]);
        let looping = eh_frame(&[0x0f, 3, 0x2f, 0xfd, 0xff]);
        assert_eq!(straight.len(), looping.len());
        let at = only_eh_frame;
        let mut v = Verdicts::default();
        assert_eq!(v.check(&at(&straight, 0)), None);
        assert_eq!(v.check(&at(&looping, 0)), Some(Costly::Branches));
        assert_eq!(v.check(&at(&straight, 0)), None);
        assert_eq!(
            v.held_bytes(),
            2 * VERDICT_BYTES,
            "the same bytes kept once"
        );
        assert_eq!(v.check(&at(&looping, 0x1000)), Some(Costly::Branches));
        assert_eq!(
            v.held_bytes(),
            3 * VERDICT_BYTES,
            "elsewhere: another input"
        );
    }

    /// Verdicts are kept up to their bound, the least recently used out.
    #[test]
    fn verdicts_are_bounded() {
        let mut v = Verdicts::default();
        let first = eh_frame(&[]);
        v.check(&only_eh_frame(&first, 0));
        let first_digest = digest(&only_eh_frame(&first, 0));
        for text in 0..MAX_VERDICTS as u64 {
            v.check(&UnwindSections {
                text: Some(text),
                ..only_eh_frame(&first, 0)
            });
        }
        assert_eq!(v.held_bytes(), MAX_VERDICTS as u64 * VERDICT_BYTES);
        assert!(!v.kept.contains_key(&first_digest), "the oldest went first");
    }

    /// The cost of every FDE framehop can reach in `s`, with its offset, costliest
    /// first (no bound applied).
    pub(crate) fn costs(s: &UnwindSections<'_>) -> Vec<(u64, usize)> {
        let mut c = Checker::new(s);
        c.bounds = Bounds {
            bytes: u64::MAX,
            cost: u64::MAX,
        };
        let mut costs = Vec::new();
        c.reachable(s, |c, o| {
            if let Some(Ok(cost)) = c.fde_cost(o) {
                costs.push((cost, o));
            }
            false
        });
        costs.sort_unstable_by(|a, b| b.cmp(a));
        costs
    }

    /// Debian's own binaries and libraries pass, every entry decoded through
    /// `.eh_frame_hdr`'s table, their costliest entry at most a quarter of
    /// [`MAX_COST`] (the figures in its comment). Real builds need more: gcc's `cc1` (442
    /// remembers in one FDE) and valgrind's tools (1,067) were refused under a bound of
    /// 256 remembers, and their frames lost (`stacks_too_costly`) under a real build.
    /// Both are installed by `cargo xtask setup` (xtask/src/setup.rs: gcc, valgrind).
    #[test]
    fn real_libraries_pass() {
        for path in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/usr/bin/python3.11",
            "/usr/lib/gcc/x86_64-linux-gnu/12/cc1",
            "/usr/libexec/valgrind/memcheck-amd64-linux",
        ] {
            let bytes = std::fs::read(path).expect("Debian 12's own");
            let f = object::File::parse(&*bytes).unwrap();
            let s = sections(&f);
            let (verdict, decoded) = scan(&s);
            assert_eq!(verdict, None, "{path}");
            // All but the section's CIEs and terminator.
            assert!(
                decoded > s.eh_frame.0.len() as u64 * 9 / 10,
                "{path}: {decoded}"
            );
            let costliest = costs(&s)[0].0;
            assert!(costliest <= MAX_COST / 4, "{path}: {costliest}");
        }
    }
}

/// Figures for BENCHMARKS.md ("Unwind rules that cost too much") and the weights of
/// [`INSTRUCTION_COST`]. Ignored: run with `cargo test --release -p cpi-user --lib --
/// --ignored --nocapture evaluation_cost_figures` (files to read in `CPI_COST_FILES`,
/// separated by `:`).
#[cfg(test)]
mod figures {
    use super::tests::{costs, eh_frame, only_eh_frame, sections};
    use super::*;
    use gimli::{EndianSlice, FrameDescriptionEntry, UnwindContext};
    use std::time::Instant;

    type Slice<'a> = EndianSlice<'a, LittleEndian>;

    /// µs per evaluation of the FDE at `offset` at its last address (every instruction
    /// evaluated), as framehop evaluates it on a rule-cache miss; its cost without
    /// limit.
    fn timed(s: &UnwindSections<'_>, offset: usize) -> (f64, u64) {
        let mut c = Checker::new(s);
        c.bounds = Bounds {
            bytes: u64::MAX,
            cost: u64::MAX,
        };
        let cost = c.fde_cost(offset).unwrap().unwrap();
        let fde: FrameDescriptionEntry<Slice<'_>> = c
            .section
            .fde_from_offset(&c.bases, offset.into(), EhFrame::cie_from_offset)
            .unwrap();
        let address = fde.initial_address() + fde.len().max(1) - 1;
        let mut ctx: Box<UnwindContext<usize>> = Box::default();
        let eval = |ctx: &mut UnwindContext<usize>| {
            fde.unwind_info_for_address(&c.section, &c.bases, ctx, address)
                .is_ok()
        };
        assert!(eval(&mut ctx), "evaluates");
        let (mut reps, t) = (0u32, Instant::now());
        while t.elapsed().as_millis() < 50 || reps < 5 {
            std::hint::black_box(eval(&mut ctx));
            reps += 1;
        }
        (t.elapsed().as_secs_f64() * 1e6 / f64::from(reps), cost)
    }

    fn synthetic(name: &str, ops: &[u8]) {
        let eh = eh_frame(ops);
        let s = only_eh_frame(&eh, 0);
        let mut fde = None;
        Checker::new(&s).reachable(&s, |_, o| {
            fde = Some(o);
            true
        });
        let (us, cost) = timed(&s, fde.unwrap());
        println!(
            "{name}: {} bytes, cost {cost}, {us:.1} µs per evaluation, {:.2} ns per unit",
            ops.len(),
            us * 1000.0 / cost as f64
        );
    }

    /// `n` registers given rules (`DW_CFA_offset_extended REG, 1`), from 16 up.
    fn rules(n: u16) -> Vec<u8> {
        let mut out = Vec::new();
        for r in 16..16 + n {
            out.push(0x05);
            if r < 128 {
                out.push(r as u8);
            } else {
                out.extend([(r & 0x7f) as u8 | 0x80, (r >> 7) as u8]);
            }
            out.push(1);
        }
        out
    }

    /// The costliest entries of the file at `path`, timed.
    fn real(path: &str) {
        let Ok(bytes) = std::fs::read(path) else {
            println!("{path}: not here");
            return;
        };
        let f = object::File::parse(&*bytes).unwrap();
        let s = sections(&f);
        let costs = costs(&s);
        let over = costs.iter().filter(|c| c.0 > MAX_COST).count();
        println!("{path}: {} FDEs, {over} over MAX_COST", costs.len());
        for &(_, o) in costs.iter().take(3) {
            let (us, cost) = timed(&s, o);
            println!(
                "  FDE at {o:#x}: cost {cost}, {us:.1} µs per evaluation, {:.2} ns per unit",
                us * 1000.0 / cost as f64
            );
        }
    }

    #[test]
    #[ignore = "figures, not a test"]
    fn evaluation_cost_figures() {
        synthetic("60,000 nops", &vec![0; 60_000]);
        synthetic("30,000 same_value r15", &[0x08, 15].repeat(30_000));
        synthetic(
            "30,000 remember/restore pairs",
            &[0x0a, 0x0b].repeat(30_000),
        );
        for n in [8u16, 64, 180] {
            let mut ops = rules(n);
            ops.extend([0x0a, 0x0b].repeat(1_000));
            synthetic(&format!("{n} rules, 1,000 pairs"), &ops);
            let mut ops = rules(n);
            ops.extend([0x08, 15].repeat(1_000));
            synthetic(&format!("{n} rules, 1,000 same_value r15"), &ops);
            let mut ops = rules(n);
            ops.extend([0x00].repeat(2_000));
            synthetic(&format!("{n} rules, 2,000 nops"), &ops);
        }
        // Within the old bounds (64 KiB, no remember): each rule set
        // searches a row of 181.
        let mut ops = rules(180);
        ops.extend([0x08, 15].repeat(32_000));
        synthetic("180 rules, 32,000 same_value r15", &ops);
        let files = std::env::var("CPI_COST_FILES").unwrap_or_else(|_| {
            "/usr/libexec/valgrind/memcheck-amd64-linux:/usr/lib/gcc/x86_64-linux-gnu/12/cc1"
                .to_string()
        });
        for path in files.split(':') {
            real(path);
        }
    }
}
