//! One function's instructions (iced-x86, 64-bit, linear sweep over its bounds), basic
//! blocks and control-flow graph.
//!
//! Leaders: the entry, direct branch targets inside the function, the instruction after
//! any transfer (branch, call, return, syscall, trap), and caller-supplied addresses
//! (targets seen in branch records, e.g. of indirect jumps).
//!
//! Edges (the definitions the profile's edge counts follow):
//! - **taken**: a direct jump or conditional branch to a block of this function;
//! - **fall-through**: block A's last instruction is immediately followed in execution
//!   by the next block's first instruction — A ends in a not-taken conditional branch,
//!   a syscall, or before a leader. A block ending in a call has **no** fall-through
//!   edge: execution continues in the callee, and control comes back by a taken return
//!   (recorded as a taken edge of the callee's `ret`).

use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter, IntelFormatter, Mnemonic, OpKind};

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Function;

/// How control reaches an edge's target (re-exported as `profile::model::EdgeKind`,
/// where profiles carry it).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum EdgeKind {
    /// A taken branch (seen in branch records).
    Taken,
    /// Derived: straight-line flow into the next block (incl. not-taken conditionals).
    FallThrough,
}

/// How control leaves an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowKind {
    /// Falls through to the next instruction.
    Next,
    /// Conditional branch (`Jcc`, `LOOP`, `JRCXZ`): taken or falls through.
    CondBranch,
    /// Direct unconditional jump.
    Jump,
    /// Indirect jump (jump tables, tail calls through a register).
    IndirectJump,
    /// Direct call.
    Call,
    /// Call through a register or memory.
    IndirectCall,
    /// `ret`.
    Return,
    /// `syscall`/`sysenter`: enters the kernel and comes back to the next instruction.
    Syscall,
    /// Traps and undecodable bytes (`ud2`, `int3`, `int n`, invalid): execution does not
    /// continue to the next instruction.
    Stop,
}

impl FlowKind {
    /// Always transfers control away: straight-line execution cannot continue past it.
    /// A valid LBR range contains one only as its last instruction.
    pub fn always_transfers(self) -> bool {
        !matches!(
            self,
            FlowKind::Next | FlowKind::CondBranch | FlowKind::Syscall
        )
    }

    /// Ends a basic block.
    pub(crate) fn ends_block(self) -> bool {
        self != FlowKind::Next
    }

    /// Execution may continue at the next instruction.
    pub(crate) fn falls_through(self) -> bool {
        matches!(
            self,
            FlowKind::Next | FlowKind::CondBranch | FlowKind::Syscall
        )
    }
}

/// One decoded instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instruction {
    /// Address in the binary.
    pub addr: u64,
    /// Length in bytes.
    pub len: u8,
    /// How control leaves it.
    pub kind: FlowKind,
    /// Direct branch or call target.
    pub target: Option<u64>,
    /// Intel syntax.
    pub text: String,
}

impl Instruction {
    /// Address of the next instruction.
    pub fn next(&self) -> u64 {
        self.addr + u64::from(self.len)
    }
}

/// A basic block: straight-line instructions with one entry and one exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicBlock {
    /// Address of its first instruction.
    pub start: u64,
    /// First address after the last instruction.
    pub end: u64,
    /// Index of the first instruction in [`Cfg::instructions`].
    pub first: usize,
    /// Instructions in the block.
    pub len: usize,
}

impl BasicBlock {
    /// Index of its last instruction in [`Cfg::instructions`].
    pub fn last(&self) -> usize {
        self.first + self.len - 1
    }
}

/// A static CFG edge between two blocks of the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfgEdge {
    /// Source block index.
    pub from_block: usize,
    /// Target block index.
    pub to_block: usize,
    /// Taken or fall-through.
    pub kind: EdgeKind,
}

/// One function's instructions, blocks and static edges.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// The function.
    pub function: Function,
    /// Sorted by address; shared between CFGs of the same function.
    pub instructions: Arc<[Instruction]>,
    /// Blocks in address order.
    pub blocks: Vec<BasicBlock>,
    /// Instruction index → block index.
    pub block_of: Vec<usize>,
    /// Static edges between blocks of the function.
    pub edges: Vec<CfgEdge>,
}

impl Cfg {
    /// Decodes `bytes` (the function's code, starting at `func.start`).
    pub fn build(func: &Function, bytes: &[u8], extra_leaders: &[u64]) -> Cfg {
        Cfg::from_instructions(func, decode(func, bytes).into(), extra_leaders)
    }

    /// Blocks and edges over already decoded instructions (decoding and formatting
    /// dominate the cost; the analysis decodes each function once per run and builds
    /// blocks per process, whose branch records add different leaders).
    pub(crate) fn from_instructions(
        func: &Function,
        instructions: Arc<[Instruction]>,
        extra_leaders: &[u64],
    ) -> Cfg {
        let n = instructions.len();
        let idx = |a: u64| instructions.binary_search_by_key(&a, |i| i.addr).ok();
        let mut leader = vec![false; n];
        if n > 0 {
            leader[0] = true;
        }
        for (i, ins) in instructions.iter().enumerate() {
            if ins.kind.ends_block() && i + 1 < n {
                leader[i + 1] = true;
            }
            if let Some(j) = ins
                .target
                .filter(|_| matches!(ins.kind, FlowKind::Jump | FlowKind::CondBranch))
                .and_then(idx)
            {
                leader[j] = true;
            }
        }
        for &a in extra_leaders {
            if let Some(j) = idx(a) {
                leader[j] = true;
            }
        }

        let mut blocks: Vec<BasicBlock> = Vec::new();
        let mut block_of = Vec::with_capacity(n);
        for (i, ins) in instructions.iter().enumerate() {
            if leader[i] {
                blocks.push(BasicBlock {
                    start: ins.addr,
                    end: ins.next(),
                    first: i,
                    len: 0,
                });
            }
            let b = blocks.last_mut().expect("instruction 0 is a leader");
            b.len += 1;
            b.end = ins.next();
            block_of.push(blocks.len() - 1);
        }

        let mut edges = Vec::new();
        for (bi, b) in blocks.iter().enumerate() {
            let last = &instructions[b.last()];
            if last.kind.falls_through() && bi + 1 < blocks.len() && blocks[bi + 1].start == b.end {
                edges.push(CfgEdge {
                    from_block: bi,
                    to_block: bi + 1,
                    kind: EdgeKind::FallThrough,
                });
            }
            if matches!(last.kind, FlowKind::Jump | FlowKind::CondBranch) {
                if let Some(j) = last.target.and_then(idx) {
                    edges.push(CfgEdge {
                        from_block: bi,
                        to_block: block_of[j],
                        kind: EdgeKind::Taken,
                    });
                }
            }
        }
        Cfg {
            function: func.clone(),
            instructions,
            blocks,
            block_of,
            edges,
        }
    }

    /// Index of the instruction starting exactly at `addr`.
    pub(crate) fn instruction_at(&self, addr: u64) -> Option<usize> {
        self.instructions
            .binary_search_by_key(&addr, |i| i.addr)
            .ok()
    }

    /// Index of the instruction whose bytes contain `addr`.
    pub(crate) fn instruction_containing(&self, addr: u64) -> Option<usize> {
        let i = self
            .instructions
            .partition_point(|i| i.addr <= addr)
            .checked_sub(1)?;
        (addr < self.instructions[i].next()).then_some(i)
    }

    /// The block starting exactly at `addr`.
    #[cfg(test)]
    pub(crate) fn block_at(&self, addr: u64) -> Option<usize> {
        self.instruction_at(addr)
            .map(|i| self.block_of[i])
            .filter(|&b| self.blocks[b].start == addr)
    }
}

/// Linear-sweep disassembly of `bytes` (the code of `func`, starting at its start).
pub fn decode(func: &Function, bytes: &[u8]) -> Vec<Instruction> {
    let mut decoder = Decoder::with_ip(64, bytes, func.start, DecoderOptions::NONE);
    let mut fmt = IntelFormatter::new();
    (&mut decoder)
        .into_iter()
        .map(|ins| instruction(&ins, &mut fmt))
        .collect()
}

/// Where [`decode`]'s linear sweep puts each instruction, compactly: what finding the
/// instruction that holds an address needs, without formatting any. Each instruction's
/// length (x86's are at most 15 bytes) and, every [`SWEEP_MARK`] instructions, the
/// offset where the next one starts: ≈ 1.06 bytes an instruction where offsets took 4
/// (they were most of the agent's decode cache under large binaries).
#[derive(Debug)]
pub(crate) struct Sweep {
    lens: Box<[u8]>,
    /// `marks[k]`: the offset of instruction `k * SWEEP_MARK`.
    marks: Box<[u32]>,
}

/// Instructions between two of [`Sweep`]'s marks: a lookup adds at most this many lengths.
const SWEEP_MARK: usize = 64;

impl Sweep {
    /// The sweep of `bytes` (a function's code, from its start).
    pub(crate) fn of(bytes: &[u8]) -> Self {
        let decoder = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE);
        // x86-64 code averages about 4 bytes an instruction: a third of its bytes is
        // room for most functions without growing.
        let mut lens = Vec::with_capacity(bytes.len() / 3 + 1);
        let mut marks = Vec::with_capacity(bytes.len() / (3 * SWEEP_MARK) + 1);
        for ins in decoder {
            if lens.len() % SWEEP_MARK == 0 {
                marks.push(ins.ip() as u32);
            }
            lens.push(ins.len() as u8);
        }
        Sweep {
            lens: lens.into_boxed_slice(),
            marks: marks.into_boxed_slice(),
        }
    }

    /// The offset of the instruction that holds offset `off`, if one does.
    pub(crate) fn holding(&self, off: u32) -> Option<u32> {
        let k = self.marks.partition_point(|&m| m <= off).checked_sub(1)?;
        let mut at = self.marks[k];
        for &len in self.lens.iter().skip(k * SWEEP_MARK).take(SWEEP_MARK) {
            let next = at + u32::from(len);
            if off < next {
                return Some(at);
            }
            at = next;
        }
        None
    }

    /// Heap bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.lens.len() + self.marks.len() * size_of::<u32>()
    }
}

/// The one instruction at the start of `bytes` (at address `addr`), as [`decode`] gives
/// it.
pub(crate) fn decode_one(addr: u64, bytes: &[u8]) -> Instruction {
    let mut decoder = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    instruction(&decoder.decode(), &mut IntelFormatter::new())
}

fn instruction(ins: &iced_x86::Instruction, fmt: &mut IntelFormatter) -> Instruction {
    let mut text = String::new();
    let kind = if ins.is_invalid() {
        text.push_str("(bad)");
        FlowKind::Stop
    } else {
        fmt.format(ins, &mut text);
        flow_kind(ins)
    };
    let target = matches!(
        ins.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    )
    .then(|| ins.near_branch_target());
    Instruction {
        addr: ins.ip(),
        len: ins.len() as u8,
        kind,
        target,
        text,
    }
}

fn flow_kind(ins: &iced_x86::Instruction) -> FlowKind {
    match ins.flow_control() {
        FlowControl::Next | FlowControl::XbeginXabortXend => FlowKind::Next,
        FlowControl::ConditionalBranch => FlowKind::CondBranch,
        FlowControl::UnconditionalBranch => FlowKind::Jump,
        FlowControl::IndirectBranch => FlowKind::IndirectJump,
        FlowControl::Call if matches!(ins.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter) => {
            FlowKind::Syscall
        }
        FlowControl::Call => FlowKind::Call,
        FlowControl::IndirectCall => FlowKind::IndirectCall,
        FlowControl::Return => FlowKind::Return,
        FlowControl::Interrupt | FlowControl::Exception => FlowKind::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::testbin::TestProgram;
    use crate::binary::Binary;

    /// The compact sweep finds, at every offset, the instruction the full decoding puts
    /// there (across many marks, on bytes of every kind, invalid ones too), and none
    /// past the last instruction.
    #[test]
    fn the_sweep_holds_each_offset_where_the_decoding_does() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let bytes: Vec<u8> = (0..5000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let f = func(0x1000, bytes.len() as u64);
        let all = decode(&f, &bytes);
        assert!(all.len() > 4 * SWEEP_MARK, "{} instructions", all.len());
        let sweep = Sweep::of(&bytes);
        for ins in &all {
            for a in ins.addr..ins.next() {
                let got = sweep.holding((a - f.start) as u32);
                assert_eq!(got, Some((ins.addr - f.start) as u32), "at {a:#x}");
            }
        }
        let end = all.last().unwrap().next() - f.start;
        assert_eq!(sweep.holding(end as u32), None);
        assert!(sweep.bytes() * 3 < all.len() * 4, "{} bytes", sweep.bytes());
    }

    fn func(start: u64, size: u64) -> Function {
        Function {
            name: "f".into(),
            start,
            size,
        }
    }

    #[test]
    fn hand_assembled_loop() {
        // 0x1000: xor eax,eax        31 c0
        // 0x1002: add eax,edi        01 f8      <- loop head (jne target)
        // 0x1004: dec edi            ff cf
        // 0x1006: jne 0x1002         75 fa
        // 0x1008: call 0x2000        e8 f3 0f 00 00
        // 0x100d: syscall            0f 05
        // 0x100f: ret                c3
        let code = [
            0x31, 0xc0, 0x01, 0xf8, 0xff, 0xcf, 0x75, 0xfa, 0xe8, 0xf3, 0x0f, 0x00, 0x00, 0x0f,
            0x05, 0xc3,
        ];
        let cfg = Cfg::build(&func(0x1000, code.len() as u64), &code, &[0x1004]);
        let kinds: Vec<FlowKind> = cfg.instructions.iter().map(|i| i.kind).collect();
        use FlowKind::*;
        assert_eq!(kinds, [Next, Next, Next, CondBranch, Call, Syscall, Return]);
        assert_eq!(cfg.instructions[3].target, Some(0x1002));
        assert_eq!(cfg.instructions[4].target, Some(0x2000));
        assert_eq!(cfg.instructions[3].text, "jne short 0000000000001002h");
        let starts: Vec<u64> = cfg.blocks.iter().map(|b| b.start).collect();
        // Entry, jne target, extra leader, after jne, after call, after syscall.
        assert_eq!(starts, [0x1000, 0x1002, 0x1004, 0x1008, 0x100d, 0x100f]);
        let e: Vec<(usize, usize, EdgeKind)> = cfg
            .edges
            .iter()
            .map(|e| (e.from_block, e.to_block, e.kind))
            .collect();
        use EdgeKind::*;
        assert_eq!(
            e,
            [
                (0, 1, FallThrough),
                (1, 2, FallThrough),
                (2, 3, FallThrough),
                (2, 1, Taken),
                // No fall-through after the call (block 3); syscall falls through.
                (4, 5, FallThrough),
            ]
        );
        assert_eq!(cfg.instruction_containing(0x1009), Some(4));
        assert_eq!(cfg.instruction_at(0x1009), None);
        assert_eq!(cfg.block_at(0x1004), Some(2));
        assert_eq!(cfg.block_at(0x1006), None);
    }

    #[test]
    fn truncated_code_decodes_as_bad_and_stops() {
        let cfg = Cfg::build(&func(0, 2), &[0xe8, 0x00], &[]);
        assert_eq!(cfg.instructions.len(), 1);
        assert_eq!(cfg.instructions[0].kind, FlowKind::Stop);
        assert!(Cfg::build(&func(0, 0), &[], &[]).blocks.is_empty());
    }

    #[test]
    fn real_function_matches_objdump_boundaries() {
        let Some(t) = TestProgram::get("analysis_loops") else {
            return;
        };
        let bin = Binary::open(&t.plain).unwrap();
        let f = bin.function_by_name("classify").unwrap();
        let cfg = bin.cfg(&f, &[]).unwrap();
        let out = match std::process::Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(format!("--start-address={:#x}", f.start))
            .arg(format!("--stop-address={:#x}", f.end()))
            .arg(&t.plain)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                crate::binary::testbin::skip(format_args!("objdump unavailable: {e}"));
                return;
            }
        };
        let objdump: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (a, rest) = l.trim_start().split_once(":\t")?;
                (!rest.is_empty()).then(|| u64::from_str_radix(a, 16).ok())?
            })
            .collect();
        let ours: Vec<u64> = cfg.instructions.iter().map(|i| i.addr).collect();
        assert_eq!(ours, objdump);
        // Blocks partition the instructions.
        let covered: usize = cfg.blocks.iter().map(|b| b.len).sum();
        assert_eq!(covered, cfg.instructions.len());
        assert!(cfg.blocks.len() > 3, "classify has branches");
    }
}
