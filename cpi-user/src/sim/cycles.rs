//! The cycle model: a deterministic cost for every executed instruction.
//!
//! **Static part** (per instruction, decoded with iced-x86 from the mapped ELF bytes):
//!
//! | class | cycles |
//! |-------|--------|
//! | any instruction | 1 |
//! | + reads memory (not `lea`) | +2 |
//! | + writes memory | +1 |
//! | `mul`/`imul` | +2 |
//! | `div`/`idiv` | +24 |
//! | vector/FP register operand (xmm/ymm/zmm, x87) | +2 |
//! | FP divide / square root | +12 |
//! | `call`/`ret` | +1 |
//! | `rep` string instruction (one execution, any count) | +10 |
//! | `lock` prefix or `xchg` with memory | +18 |
//! | `syscall`/`int` | +60 |
//! | `cpuid` / `rdtsc` / `pause` | +30 |
//! | instruction bytes unknown (no file: vdso, JIT) | 1 in total |
//!
//! **Dynamic part**, so the same code costs differently by input:
//! * a taken branch costs +1 (front-end redirect);
//! * a branch predictor — gshare over 12 bits of global history with 2¹⁴ two-bit
//!   counters for conditional branches, a 4096-entry direct-mapped target buffer for
//!   indirect jumps and calls, a 16-entry return stack — charges
//!   [`MISPREDICT_PENALTY`] cycles to every mispredicted branch.
//!
//! Replay is fast because each distinct straight-line range (from a branch target to the
//! next taken branch) is decoded once into a [`RangeInfo`] with its static cost summed;
//! per execution only the range's conditional branches go through the predictor.

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
};

use super::code::CodeMap;
use super::FastMap;

/// Cycles charged to a mispredicted branch.
pub(crate) const MISPREDICT_PENALTY: u32 = 15;
/// Extra cycles of a taken branch.
pub(crate) const TAKEN_COST: u32 = 1;

/// How the last instruction of a range transfers control (when it is taken).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Not a control transfer (or unknown bytes).
    Other,
    /// Conditional jump: predicted by the [`Predictor`]'s pattern history table.
    Conditional,
    /// Direct jump or call: never mispredicted.
    Direct {
        /// A call's return address (pushed on the return stack); `None` for a jump.
        ret_to: Option<u64>,
    },
    /// Indirect jump or call: predicted by the branch target buffer.
    Indirect {
        /// A call's return address (pushed on the return stack); `None` for a jump.
        ret_to: Option<u64>,
    },
    /// `ret`: predicted by the return stack.
    Return,
}

impl Flow {
    /// The `PERF_BR_*` type a branch record of this kind carries (0: not a branch).
    pub(crate) fn perf_type(self) -> u8 {
        use cpi_common::wire::branch_type as bt;
        match self {
            Flow::Other => 0,
            Flow::Conditional => bt::COND,
            Flow::Direct { ret_to: None } => bt::UNCOND,
            Flow::Direct { ret_to: Some(_) } => bt::CALL,
            Flow::Indirect { ret_to: None } => bt::IND,
            Flow::Indirect { ret_to: Some(_) } => bt::IND_CALL,
            Flow::Return => bt::RET,
        }
    }
}

/// A decoded straight-line range [start, end] (both instruction addresses).
#[derive(Clone, Debug)]
pub(crate) struct RangeInfo {
    /// Runtime address of the first instruction.
    pub start: u64,
    /// Runtime address of the last instruction.
    pub end: u64,
    /// Instructions in the range (from the trace when the bytes are unknown).
    pub n: u32,
    /// Instruction addresses; empty when the bytes are unknown.
    pub addrs: Vec<u64>,
    /// Static cost of each instruction (parallel to `addrs`).
    pub costs: Vec<u32>,
    /// Sum of `costs` (`n` when the bytes are unknown): a range's cycles without
    /// mispredictions and taken-branch cost.
    pub static_cycles: u64,
    /// Indices of conditional branches before the last instruction (not taken here).
    pub conds: Vec<u32>,
    /// The last instruction's kind.
    pub last: Flow,
    /// Indices of `rep` string instructions (counted once per execution).
    pub reps: Vec<u32>,
}

impl RangeInfo {
    /// The bytes decoded: per-instruction addresses and costs exist.
    pub fn known(&self) -> bool {
        !self.addrs.is_empty()
    }
}

/// Static cost of one instruction, its flow kind, and whether it is a `rep` string
/// instruction.
pub(crate) fn classify(ins: &Instruction, info: &mut InstructionInfoFactory) -> (u32, Flow, bool) {
    let mut cost = 1u32;
    let used = info.info(ins);
    let mut mem_write = false;
    for m in used.used_memory() {
        match m.access() {
            OpAccess::Read | OpAccess::CondRead => cost += 2,
            OpAccess::Write | OpAccess::CondWrite => {
                cost += 1;
                mem_write = true
            }
            OpAccess::ReadWrite | OpAccess::ReadCondWrite => {
                cost += 3;
                mem_write = true
            }
            _ => {}
        }
    }
    let vector = (0..ins.op_count()).any(|i| {
        let r = ins.op_register(i);
        r.is_vector_register() || r.is_st()
    });
    use Mnemonic::*;
    let m = ins.mnemonic();
    cost += match m {
        Mul | Imul | Mulx => 2,
        Div | Idiv => 24,
        Divss | Divsd | Divps | Divpd | Vdivss | Vdivsd | Vdivps | Vdivpd | Sqrtss | Sqrtsd
        | Sqrtps | Sqrtpd | Vsqrtss | Vsqrtsd | Vsqrtps | Vsqrtpd | Fdiv | Fdivp | Fsqrt => 12,
        Syscall | Int | Int3 | Sysenter => 60,
        Cpuid | Rdtsc | Rdtscp | Pause => 30,
        _ => 0,
    };
    if vector {
        cost += 2;
    }
    let string = matches!(
        m,
        Movsb
            | Movsw
            | Movsq
            | Stosb
            | Stosw
            | Stosd
            | Stosq
            | Lodsb
            | Lodsw
            | Lodsd
            | Lodsq
            | Cmpsb
            | Cmpsw
            | Cmpsq
            | Scasb
            | Scasw
            | Scasd
            | Scasq
    ) || (matches!(m, Movsd | Cmpsd) && !vector);
    let rep = string && (ins.has_rep_prefix() || ins.has_repne_prefix());
    if rep {
        cost += 10;
    }
    if ins.has_lock_prefix() || (m == Xchg && mem_write) {
        cost += 18;
    }
    let ret_to = Some(ins.next_ip());
    let flow = match ins.flow_control() {
        FlowControl::ConditionalBranch => Flow::Conditional,
        FlowControl::UnconditionalBranch => Flow::Direct { ret_to: None },
        FlowControl::Call => {
            cost += 1;
            Flow::Direct { ret_to }
        }
        FlowControl::IndirectBranch => Flow::Indirect { ret_to: None },
        FlowControl::IndirectCall => {
            cost += 1;
            Flow::Indirect { ret_to }
        }
        FlowControl::Return => {
            cost += 1;
            Flow::Return
        }
        _ => Flow::Other,
    };
    (cost, flow, rep)
}

/// Decodes the range [start, end] that the trace says holds `n` instructions. When the
/// bytes are unknown or do not decode to exactly that, the range is kept as `n`
/// instructions of cost 1 each, without addresses (`mismatch` tells the second case).
pub(crate) fn decode_range(code: &mut CodeMap, start: u64, end: u64, n: u32) -> (RangeInfo, bool) {
    let unknown = |mismatch| {
        (
            RangeInfo {
                start,
                end,
                n,
                addrs: Vec::new(),
                costs: Vec::new(),
                static_cycles: n as u64,
                conds: Vec::new(),
                last: Flow::Other,
                reps: Vec::new(),
            },
            mismatch,
        )
    };
    let Some((data, from, to)) = code.bytes(start) else {
        return unknown(false);
    };
    if end < start {
        return unknown(true);
    }
    let want = ((end - start) as usize + 16).min(to - from);
    let bytes = &data[from..from + want];
    let mut dec = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut factory = InstructionInfoFactory::new();
    let mut ins = Instruction::default();
    let (mut addrs, mut costs, mut conds, mut reps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut total = 0u64;
    let mut last = Flow::Other;
    while dec.can_decode() && addrs.len() <= n as usize {
        dec.decode_out(&mut ins);
        if ins.is_invalid() {
            break;
        }
        let (c, flow, rep) = classify(&ins, &mut factory);
        if rep {
            reps.push(addrs.len() as u32);
        }
        addrs.push(ins.ip());
        costs.push(c);
        total += c as u64;
        if ins.ip() == end {
            last = flow;
            break;
        }
        if flow == Flow::Conditional {
            conds.push(addrs.len() as u32 - 1);
        }
        if ins.ip() > end {
            break;
        }
    }
    if addrs.last() != Some(&end) || addrs.len() != n as usize {
        return unknown(true);
    }
    (
        RangeInfo {
            start,
            end,
            n,
            addrs,
            costs,
            static_cycles: total,
            conds,
            last,
            reps,
        },
        false,
    )
}

/// How a range execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// A taken transfer from the range's last instruction to `to`.
    Taken {
        /// Where control went (runtime address).
        to: u64,
    },
    /// The range ended without a taken transfer (thread end, signal).
    Stop,
}

/// Cycles of one range execution beyond its static cost.
#[derive(Clone, Debug, Default)]
pub(crate) struct Dynamic {
    /// Indices (into the range) of mispredicted not-taken conditional branches.
    pub mispredicted: Vec<u32>,
    /// The last instruction was a mispredicted branch.
    pub last_mispredicted: bool,
    /// Extra cycles charged to the last instruction (taken + misprediction).
    pub last_extra: u32,
    /// Static + dynamic cycles of the whole range.
    pub cycles: u64,
}

impl Dynamic {
    /// Cycles of instruction `i` of `r` in this execution.
    pub(crate) fn cost_of(&self, r: &RangeInfo, i: usize) -> u64 {
        let mut c = r.costs.get(i).copied().unwrap_or(1) as u64;
        if self.mispredicted.contains(&(i as u32)) {
            c += MISPREDICT_PENALTY as u64;
        }
        if i + 1 == r.n as usize {
            c += self.last_extra as u64;
        }
        c
    }
}

const PHT_BITS: u32 = 14;
const HIST_BITS: u32 = 12;
const BTB_BITS: u32 = 12;
const RSB_DEPTH: usize = 16;

/// The dynamic part: a branch predictor. Deterministic (no randomness).
pub(crate) struct Predictor {
    pht: Vec<u8>,
    history: u64,
    btb: Vec<(u64, u64)>,
    rsb: Vec<u64>,
}

impl Default for Predictor {
    fn default() -> Self {
        Predictor {
            pht: vec![1; 1 << PHT_BITS], // weakly not taken
            history: 0,
            btb: vec![(0, 0); 1 << BTB_BITS],
            rsb: Vec::with_capacity(RSB_DEPTH),
        }
    }
}

impl Predictor {
    /// A conditional branch at `pc` went `taken`; true when mispredicted.
    pub fn conditional(&mut self, pc: u64, taken: bool) -> bool {
        let hist = self.history & ((1 << HIST_BITS) - 1);
        let idx = ((pc ^ (pc >> PHT_BITS) ^ (hist << (PHT_BITS - HIST_BITS)))
            & ((1 << PHT_BITS) - 1)) as usize;
        let c = &mut self.pht[idx];
        let predicted = *c >= 2;
        *c = if taken {
            (*c + 1).min(3)
        } else {
            c.saturating_sub(1)
        };
        self.history = (self.history << 1) | taken as u64;
        predicted != taken
    }

    /// An indirect jump/call at `pc` went to `to`; true when mispredicted.
    pub(crate) fn indirect(&mut self, pc: u64, to: u64) -> bool {
        let idx = ((pc ^ (pc >> BTB_BITS)) & ((1 << BTB_BITS) - 1)) as usize;
        let hit = self.btb[idx] == (pc, to);
        self.btb[idx] = (pc, to);
        !hit
    }

    /// A call whose return address is `ret_to`: pushed on the return stack (the oldest
    /// entry falls off when full).
    pub fn call(&mut self, ret_to: u64) {
        if self.rsb.len() == RSB_DEPTH {
            self.rsb.remove(0);
        }
        self.rsb.push(ret_to);
    }

    /// A return went to `to`; true when mispredicted.
    pub fn ret(&mut self, to: u64) -> bool {
        self.rsb.pop() != Some(to)
    }

    /// Runs one execution of `r` ending as `ending`, filling `d`.
    pub(crate) fn execute(&mut self, r: &RangeInfo, ending: Ending, d: &mut Dynamic) {
        d.mispredicted.clear();
        d.last_mispredicted = false;
        d.last_extra = 0;
        for &i in &r.conds {
            if self.conditional(r.addrs[i as usize], false) {
                d.mispredicted.push(i);
            }
        }
        let extra = d.mispredicted.len() as u64 * MISPREDICT_PENALTY as u64;
        match ending {
            Ending::Taken { to } => {
                let mis = match r.last {
                    Flow::Conditional => self.conditional(r.end, true),
                    Flow::Direct { ret_to } => {
                        if let Some(ret) = ret_to {
                            self.call(ret);
                        }
                        false
                    }
                    Flow::Indirect { ret_to } => {
                        let mis = self.indirect(r.end, to);
                        if let Some(ret) = ret_to {
                            self.call(ret);
                        }
                        mis
                    }
                    Flow::Return => self.ret(to),
                    Flow::Other => false,
                };
                d.last_mispredicted = mis;
                d.last_extra = TAKEN_COST + if mis { MISPREDICT_PENALTY } else { 0 };
            }
            Ending::Stop => {
                if r.last == Flow::Conditional && self.conditional(r.end, false) {
                    d.last_mispredicted = true;
                    d.last_extra = MISPREDICT_PENALTY;
                }
            }
        }
        d.cycles = r.static_cycles + extra + d.last_extra as u64;
    }
}

/// Decoded ranges, keyed by (start, end), decoded once.
#[derive(Default)]
pub(crate) struct RangeTable {
    /// The ranges by id (what [`RangeTable::get`] returns).
    pub infos: Vec<RangeInfo>,
    by_bounds: FastMap<(u64, u64), u32>,
    /// Ranges whose bytes did not decode to the trace's instruction count.
    pub mismatched: u64,
    /// Ranges without code bytes (vdso, anonymous/JIT code).
    pub unknown: u64,
}

impl RangeTable {
    /// The id of range [start, end] holding `n` instructions, decoding it on first use.
    pub fn get(&mut self, code: &mut CodeMap, start: u64, end: u64, n: u32) -> u32 {
        if let Some(&id) = self.by_bounds.get(&(start, end)) {
            if self.infos[id as usize].n == n {
                return id;
            }
        }
        let (info, mismatch) = decode_range(code, start, end, n);
        if mismatch {
            self.mismatched += 1;
        } else if !info.known() {
            self.unknown += 1;
        }
        let id = self.infos.len() as u32;
        self.infos.push(info);
        self.by_bounds.insert((start, end), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_one(bytes: &[u8]) -> (u32, Flow) {
        let mut dec = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
        let ins = dec.decode();
        let (c, f, _) = classify(&ins, &mut InstructionInfoFactory::new());
        (c, f)
    }

    #[test]
    fn classes_cost_what_the_table_says() {
        assert_eq!(decode_one(&[0x48, 0x01, 0xd8]).0, 1); // add rax, rbx
        assert_eq!(decode_one(&[0x48, 0x8b, 0x03]).0, 3); // mov rax, [rbx]
        assert_eq!(decode_one(&[0x48, 0x89, 0x03]).0, 2); // mov [rbx], rax
        assert_eq!(decode_one(&[0x48, 0xf7, 0xf3]).0, 25); // div rbx
        assert_eq!(decode_one(&[0x48, 0x0f, 0xaf, 0xc3]).0, 3); // imul rax, rbx
        assert_eq!(decode_one(&[0x48, 0x8d, 0x04, 0x18]).0, 1); // lea: no memory access
        assert_eq!(decode_one(&[0xf3, 0xa4]).0, 1 + 2 + 1 + 10); // rep movsb
        let (c, f) = decode_one(&[0x74, 0x05]); // je
        assert_eq!((c, f), (1, Flow::Conditional));
        let (c, f) = decode_one(&[0xe8, 0, 0, 0, 0]); // call rel32: pushes (store)
        assert_eq!(c, 1 + 1 + 1);
        assert_eq!(
            f,
            Flow::Direct {
                ret_to: Some(0x1005)
            }
        );
        assert_eq!(decode_one(&[0xc3]).1, Flow::Return);
        assert!(matches!(
            decode_one(&[0xff, 0xe0]).1,
            Flow::Indirect { ret_to: None }
        )); // jmp rax
    }

    #[test]
    fn predictor_learns_a_pattern_and_misses_random_outcomes() {
        let mut p = Predictor::default();
        // Always taken: misses while the history fills (each new history value is a
        // fresh counter), then none.
        let misses: u32 = (0..100).map(|_| p.conditional(0x40, true) as u32).sum();
        assert!(misses <= 2 * HIST_BITS, "{misses}");
        let misses: u32 = (0..1000).map(|_| p.conditional(0x40, true) as u32).sum();
        assert_eq!(misses, 0);
        // Alternating outcomes are learnt through the global history.
        let mut p = Predictor::default();
        let misses: u32 = (0..1000)
            .map(|i| p.conditional(0x80, i % 2 == 0) as u32)
            .sum();
        assert!(misses < 30, "{misses}");
        // Pseudo-random outcomes miss about half the time.
        let mut p = Predictor::default();
        let mut rng = cpi_common::Rng::new(3);
        let misses: u32 = (0..10_000)
            .map(|_| p.conditional(0xc0, rng.next_u64() & 1 == 1) as u32)
            .sum();
        assert!((4000..6000).contains(&misses), "{misses}");
        // Returns are predicted by the return stack.
        let mut p = Predictor::default();
        p.call(0x1005);
        p.call(0x2005);
        assert!(!p.ret(0x2005));
        assert!(p.ret(0x9999));
    }
}
