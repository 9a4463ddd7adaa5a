//! The range algorithm end to end (SampleSet → analyze) on real gcc output, with
//! branch traces whose exact counts are known.

use super::tests::{groups_rel, ip, opts, run_info};
use super::*;
use crate::binary::testbin::{maps_for, TestProgram};
use crate::binary::Binary;
use crate::binary::{Cfg, FlowKind, Instruction};
use crate::profile::model::{EdgeKind, FunctionProfile, StackProfile};
use crate::profile::stack::{CallStack, StackEnd};
use cpi_common::wire::{BranchEntry, BranchSample, SampleHeader};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;

const PID: u32 = 77;

fn branch_sample(period: u64, newest_first: &[BranchEntry]) -> BranchSample {
    let header = SampleHeader {
        tgid: PID,
        period,
        ..Default::default()
    };
    BranchSample::new(header, newest_first)
}

fn set_for(path: &Path, bin: &Binary, base: u64, window: usize) -> SampleSet {
    let mut set = SampleSet::new(window);
    set.process(PID).maps = Some(maps_for(path, bin, base));
    set
}

fn func<'a>(p: &'a Profile, name: &str) -> &'a FunctionProfile {
    p.processes[0]
        .functions
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} not in profile"))
}

/// sum_loop of analysis_loops: its CFG, the loop's latch (backward jne) and head,
/// the `ret` after the latch, and main's call to it.
struct SumLoop {
    f: crate::binary::Function,
    cfg: Cfg,
    latch: usize,
    head: usize,
    ret: usize,
    call: Instruction,
}

fn sum_loop(bin: &Binary) -> SumLoop {
    let f = bin.function_by_name("sum_loop").unwrap().clone();
    let cfg = bin.cfg(&f, &[]).unwrap();
    let ins = &cfg.instructions;
    let latch = ins
        .iter()
        .position(|i| i.kind == FlowKind::CondBranch && i.target < Some(i.addr))
        .expect("a backward loop branch");
    let head = cfg.instruction_at(ins[latch].target.unwrap()).unwrap();
    let ret = latch + 1;
    assert_eq!(ins[ret].kind, FlowKind::Return);
    let main = bin.function_by_name("main").unwrap().clone();
    let call = bin
        .cfg(&main, &[])
        .unwrap()
        .instructions
        .iter()
        .find(|i| i.kind == FlowKind::Call && i.target == Some(f.start))
        .unwrap()
        .clone();
    SumLoop {
        f,
        cfg,
        latch,
        head,
        ret,
        call,
    }
}

/// sum_loop(a, 3) as gcc -O2 compiles it: entered by a call from main, three
/// iterations (the backward jne taken twice), ret back to main. One sample of
/// period 3000 with window 3 → each range occurrence stands for 1000, and the
/// sample is added 50 times.
#[test]
fn sum_loop_three_iterations_exact() {
    let Some(t) = TestProgram::get("analysis_loops") else {
        return;
    };
    for (path, base) in [(&t.plain, 0u64), (&t.pie, 0x5555_5555_4000)] {
        let bin = Binary::open(path).unwrap();
        let SumLoop {
            f,
            cfg,
            latch,
            head,
            ret,
            call,
        } = sum_loop(&bin);
        let ins = &cfg.instructions;
        let rt = |a: u64| a + base;
        // Oldest → newest: call, jne, jne, ret; cycles since the previous entry.
        let e1 = BranchEntry::new(rt(call.addr), rt(f.start), false, 0);
        let e2 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), false, 12);
        let e3 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), true, 5);
        let e4 = BranchEntry::new(rt(ins[ret].addr), rt(call.next()), false, 7);
        let mut set = set_for(path, &bin, base, 3);
        for _ in 0..50 {
            set.add_branch(&branch_sample(3000, &[e4, e3, e2, e1]));
        }
        // The same function again, its entry once timed 14 cycles.
        let slow = BranchEntry::new(e2.from, e2.to, false, 14);
        let mut varied = set_for(path, &bin, base, 3);
        for i in 0..50 {
            let e2 = if i == 7 { slow } else { e2 };
            varied.add_branch(&branch_sample(3000, &[e4, e3, e2, e1]));
        }
        // Synthetic cycles: 30 samples on the loop head, 10 on the entry.
        for _ in 0..30 {
            set.add_ip(&ip(PID, EventRole::Cycles, rt(ins[head].addr), 997))
                .unwrap();
        }
        for _ in 0..10 {
            set.add_ip(&ip(PID, EventRole::Cycles, rt(f.start), 1009))
                .unwrap();
        }
        let mut o = opts();
        o.sample_floor = 10;
        let prof = analyze(&set, run_info(Mode::Cpi), &o);
        assert_eq!(prof.lost.invalid_ranges, 0);
        let fp = func(&prof, "sum_loop");
        // Per instruction: entry path once, body three times, ret once, the
        // n <= 0 exit never.
        let expect: Vec<f64> = (0..ins.len())
            .map(|i| {
                if i < head || i == ret {
                    50_000.0
                } else if i <= latch {
                    150_000.0
                } else {
                    0.0
                }
            })
            .collect();
        let got: Vec<f64> = fp.lines.iter().map(|l| l.count).collect();
        assert_eq!(got, expect, "{path:?}");
        assert_eq!(fp.lines[latch].text, ins[latch].text);
        let n_instr = (head + 1) + 3 * (latch + 1 - head);
        assert_eq!(fp.measures.instructions, Some(50_000.0 * n_instr as f64));
        // Blocks: count = executions of the block.
        let block = |a: u64| fp.blocks.iter().find(|b| b.start == a).unwrap();
        assert_eq!(block(ins[head].addr).count, 150_000.0);
        assert_eq!(block(ins[head].addr).len as usize, latch + 1 - head);
        assert_eq!(block(f.start).count, 50_000.0);
        assert_eq!(block(ins[ret].addr).count, 50_000.0);
        // Edges: the loop's taken back edge twice per call, the exit fall-through
        // once, the return leaving for main.
        let edge = |from: u64, to: u64, kind: EdgeKind| {
            fp.edges
                .iter()
                .find(|e| e.from == from && e.to == to && e.kind == kind)
                .unwrap_or_else(|| panic!("edge {from:#x}->{to:#x} {kind:?}"))
        };
        let back = edge(ins[latch].addr, ins[head].addr, EdgeKind::Taken);
        assert_eq!((back.count, back.mispredicts), (100_000.0, 50_000.0));
        assert_eq!(back.to_function, None);
        assert_eq!(
            edge(ins[latch].addr, ins[ret].addr, EdgeKind::FallThrough).count,
            50_000.0
        );
        let out = edge(ins[ret].addr, call.next(), EdgeKind::Taken);
        assert_eq!(out.to_function.as_deref(), Some("main"));
        assert_eq!(out.to_binary.as_deref(), Some(&*path.display().to_string()));
        let into_loop = fp
            .edges
            .iter()
            .filter(|e| e.kind == EdgeKind::FallThrough && e.to == ins[head].addr)
            .map(|e| e.count)
            .sum::<f64>();
        assert_eq!(
            into_loop, 50_000.0,
            "entry falls into the loop once per call"
        );
        // The oldest entry (main's call) only starts the oldest range: with window
        // 3 its own edge is outside the window and not counted.
        assert!(
            prof.processes[0].functions.iter().all(|f| f.name != "main"),
            "main has no evidence of its own: not reported"
        );
        // CPI from synthetic cycles: 30×997 + 10×1009 over the range instructions;
        // samples = min(40 cycle samples, 150 range occurrences).
        let cycles = 30.0 * 997.0 + 10.0 * 1009.0;
        let cpi = fp.measures.cpi.unwrap();
        assert_eq!(cpi.value, cycles / (50_000.0 * n_instr as f64));
        assert_eq!(cpi.samples, 40);
        // The error model (profile/error.rs): the cycles through the groups their
        // 40 samples fell in (the head's 30 first, then the entry's 10); the
        // instructions through the groups of the 50 branch samples, not of the 150
        // ranges (1000 × n_instr instructions each).
        let mut periods = vec![997.0; 30];
        periods.extend([1009.0; 10]);
        let rel_c = groups_rel(&periods);
        let rel_n = groups_rel(&[1000.0 * n_instr as f64; 50]);
        assert!(rel_n > 0.0);
        assert!((fp.measures.instructions_rel_error.unwrap() - rel_n).abs() < 1e-9);
        assert!((cpi.rel_error - rel_c.hypot(rel_n)).abs() < 1e-9);
        // The loop block: 30 cycle samples (< floor 10? no: 30 ≥ 10) → a number;
        // the entry block has 10 → a number; the ret block has none → None.
        let hb = block(ins[head].addr);
        assert_eq!(hb.cycles, Some(30.0 * 997.0));
        assert_eq!(
            hb.cpi.unwrap().value,
            30.0 * 997.0 / (150_000.0 * (latch + 1 - head) as f64)
        );
        assert_eq!(block(ins[ret].addr).cpi, None);
        // Timed LBR: 12 cycles over [entry, first jne], 5 over one iteration, 7 over
        // the last iteration + ret, in every one of the 50 samples: the ratio does not
        // vary between samples, so no error can be measured: below the floor.
        assert_eq!(fp.timed_cpi, None);
        // With the one slower entry, a number: 50 samples, each timing the three
        // ranges once (not 150), with the error of one sample in 50 differing.
        let vp = analyze(&varied, run_info(Mode::Cpi), &o);
        let timed = func(&vp, "sum_loop").timed_cpi.unwrap();
        let (r1, r2, r3) = (latch + 1, latch + 1 - head, latch + 2 - head);
        let want = (50.0 * 24.0 + 2.0) / (50 * (r1 + r2 + r3)) as f64;
        assert!((timed.value - want).abs() < 1e-12);
        assert_eq!(timed.samples, 50);
        assert!(timed.rel_error > 1e-5, "{}", timed.rel_error);
        // The loop block is timed alone in one range (5 cycles per iteration), but
        // the other two cover it with other blocks: its first and last iterations are
        // never timed alone, so it has no timed CPI.
        assert_eq!(hb.timed_cpi, None);
        // Process CPI covers the analysed functions.
        let pp = &prof.processes[0];
        assert_eq!(pp.branch_samples, 50);
        assert_eq!(
            pp.measures.cpi.unwrap().value,
            cycles / pp.measures.instructions.unwrap()
        );
    }
}

/// Call paths of sum_loop called from main: frames symbolised (main's at its return
/// address), cycles per path from the IP samples under it, instructions from the
/// branch samples' ranges by the attribution rule, CPI with its error, and the
/// samples without a stack in `[no stack]`.
#[test]
fn call_paths_get_their_samples_instructions_and_cpi() {
    let t = TestProgram::get("analysis_loops").expect("analysis_loops builds (gcc)");
    let base = 0x5555_5555_4000;
    let bin = Binary::open(&t.pie).unwrap();
    let SumLoop {
        f,
        cfg,
        latch,
        head,
        ret,
        call,
    } = sum_loop(&bin);
    let ins = &cfg.instructions;
    let rt = |a: u64| a + base;
    let e1 = BranchEntry::new(rt(call.addr), rt(f.start), false, 0);
    let e2 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), false, 0);
    let e3 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), false, 0);
    let e4 = BranchEntry::new(rt(ins[ret].addr), rt(call.next()), false, 0);
    let in_loop = CallStack {
        kernel: Box::new([]),
        user: Box::new([rt(ins[head].addr), rt(call.next())]),
        end: StackEnd::Complete,
    };
    // Taken in main after sum_loop returned: its ranges ran in a callee no longer
    // on the stack.
    let in_main = CallStack {
        user: Box::new([rt(call.next())]),
        ..in_loop.clone()
    };
    let mut set = set_for(&t.pie, &bin, base, 2);
    for _ in 0..40 {
        // Window 2 of [e3, e2, e1]: [entry, latch] and [head, latch].
        set.add_branch_with_stack(&branch_sample(2000, &[e3, e2, e1]), Some(&in_loop));
        // Window 2 of [e4, e3, e2]: [head, latch] and [head, ret].
        set.add_branch_with_stack(&branch_sample(2000, &[e4, e3, e2]), Some(&in_main));
        set.add_ip_with_stack(
            &ip(PID, EventRole::Cycles, rt(ins[head].addr), 997),
            Some(&in_loop),
        )
        .unwrap();
    }
    for _ in 0..5 {
        set.add_ip(&ip(PID, EventRole::Cycles, rt(ins[head].addr), 997))
            .unwrap();
    }
    let prof = analyze(&set, run_info(Mode::Cpi), &opts());
    let pp = &prof.processes[0];
    let names =
        |s: &StackProfile| -> Vec<String> { s.frames.iter().map(|f| f.function.clone()).collect() };
    let path = pp
        .stacks
        .iter()
        .find(|s| names(s) == ["sum_loop", "main"])
        .expect("sum_loop <- main");
    assert_eq!(
        path.frames[1].address,
        call.next(),
        "main at its return address"
    );
    assert_eq!(path.frames[0].address, ins[head].addr);
    assert_eq!((path.samples, path.branch_samples), (40, 40));
    assert_eq!(path.cycles, Some(40.0 * 997.0));
    // Both stacks' ranges ran in sum_loop: its instructions are all the path's,
    // 1000 per range occurrence (period 2000 / window 2).
    let body = (latch + 1 - head) as f64;
    let n = 40.0 * 1000.0 * ((latch + 1) as f64 + body + body + body + 1.0);
    assert_eq!(path.instructions, Some(n));
    assert_eq!(func(&prof, "sum_loop").measures.instructions, Some(n));
    assert_eq!(path.range_hits, 160);
    let cpi = path.cpi.unwrap();
    assert_eq!(cpi.value, 40.0 * 997.0 / n);
    assert_eq!(cpi.samples, 40);
    assert!(cpi.rel_error > 0.0 && cpi.rel_error.is_finite());
    // main's own path: the samples taken there, no instructions of its own.
    let m = pp.stacks.iter().find(|s| names(s) == ["main"]).unwrap();
    assert_eq!((m.samples, m.branch_samples, m.instructions), (0, 40, None));
    let none = pp
        .stacks
        .iter()
        .find(|s| names(s) == ["[no stack]"])
        .unwrap();
    assert_eq!((none.samples, none.cycles), (5, Some(5.0 * 997.0)));
    assert_eq!(pp.stacks[0], *path, "hottest first");
    let total: u64 = pp.stacks.iter().map(|s| s.samples).sum();
    assert_eq!(total, pp.samples);
}

/// Stacks evicted by the memory bound fold, samples and ranges alike, into a
/// `[rare callees]` path under their nearest caller still held: the oldest of
/// sum_loop's stacks go under main with their cycles and instructions, so main's
/// subtree keeps its width and CPI, and nothing goes to `[dropped]`.
#[test]
fn evicted_call_paths_fold_under_their_caller_with_their_instructions() {
    let t = TestProgram::get("analysis_loops").expect("analysis_loops builds (gcc)");
    let base = 0x5555_5555_4000;
    let bin = Binary::open(&t.pie).unwrap();
    let SumLoop {
        f,
        cfg,
        latch,
        head,
        call,
        ..
    } = sum_loop(&bin);
    let ins = &cfg.instructions;
    let rt = |a: u64| a + base;
    let e1 = BranchEntry::new(rt(call.addr), rt(f.start), false, 0);
    let e2 = BranchEntry::new(rt(ins[latch].addr), rt(ins[head].addr), false, 0);
    // sum_loop's stacks, one per instruction of its loop the samples land on: folded,
    // their ranges merge (what frees the memory).
    let in_loop = |k: usize| CallStack {
        kernel: Box::new([]),
        user: Box::new([rt(ins[k].addr), rt(call.next())]),
        end: StackEnd::Complete,
    };
    let in_main = CallStack {
        user: Box::new([rt(call.next())]),
        ..in_loop(head)
    };
    let mut set = set_for(&t.pie, &bin, base, 2);
    for i in 0..40 {
        let k = head + i % (latch + 1 - head);
        set.add_branch_with_stack(&branch_sample(2000, &[e2, e2, e1]), Some(&in_loop(k)));
        set.add_ip_with_stack(
            &ip(PID, EventRole::Cycles, rt(ins[k].addr), 997),
            Some(&in_loop(k)),
        )
        .unwrap();
    }
    let unbounded = analyze(&set, run_info(Mode::Cpi), &opts());
    // Room for what is held and a little: main's next sample makes the set evict the
    // least recently used, sum_loop's stacks.
    set.stack_bytes = set.stack_held() + 1;
    set.add_ip_with_stack(
        &ip(PID, EventRole::Cycles, rt(call.addr), 997),
        Some(&in_main),
    )
    .unwrap();
    assert!(set.stacks_evicted() > 0, "the bound evicted");
    let prof = analyze(&set, run_info(Mode::Cpi), &opts());
    let names =
        |s: &StackProfile| -> Vec<String> { s.frames.iter().map(|f| f.function.clone()).collect() };
    let path = |p: &crate::profile::model::ProcessProfile, n: &[&str]| {
        p.stacks.iter().find(|s| names(s) == n).cloned()
    };
    let was = path(&unbounded.processes[0], &["sum_loop", "main"]).expect("sum_loop <- main");
    let folded = path(&prof.processes[0], &["[rare callees]", "main"])
        .unwrap_or_else(|| panic!("{:#?}", prof.processes[0].stacks));
    // The oldest stacks went; the rest stay sum_loop's. Together they hold what
    // sum_loop held, cycles and instructions alike (a CPI where the samples allow).
    let kept = path(&prof.processes[0], &["sum_loop", "main"]).expect("the newest stay");
    assert!(folded.samples > 0 && kept.samples > 0);
    assert_eq!(folded.samples + kept.samples, was.samples);
    let sum = |a: Option<f64>, b: Option<f64>| a.unwrap_or(0.0) + b.unwrap_or(0.0);
    assert_eq!(sum(folded.cycles, kept.cycles), was.cycles.unwrap());
    let n = sum(folded.instructions, kept.instructions);
    assert!(
        (n - was.instructions.unwrap()).abs() < 1e-9 * n,
        "{n} instructions"
    );
    assert!(folded.instructions.is_some_and(|n| n > 0.0), "{folded:?}");
    assert!(path(&prof.processes[0], &["[dropped]"]).is_none());
    let total: u64 = prof.processes[0].stacks.iter().map(|s| s.samples).sum();
    assert_eq!(total, prof.processes[0].samples);
}

/// Two processes mapping the same PIE at different bases (one decode, shared
/// between them) get the same function profile, each with its own leaders.
#[test]
fn processes_sharing_a_binary_get_the_same_profile() {
    let Some(t) = TestProgram::get("analysis_loops") else {
        return;
    };
    let bin = Binary::open(&t.pie).unwrap();
    let f = bin.function_by_name("fib").unwrap().clone();
    let cfg = bin.cfg(&f, &[]).unwrap();
    let call = cfg
        .instructions
        .iter()
        .find(|i| i.kind == FlowKind::Call)
        .unwrap();
    let mut set = SampleSet::new(1);
    for (pid, base) in [(1u32, 0x5555_0000_0000u64), (2, 0x7000_0000_0000)] {
        set.process(pid).maps = Some(maps_for(&t.pie, &bin, base));
        let mut s = branch_sample(
            10,
            &[
                BranchEntry::new(base + call.addr, base + f.start, false, 0),
                BranchEntry::new(0x20, base + f.start, false, 0),
            ],
        );
        s.header.tgid = pid;
        set.add_branch(&s);
    }
    // Process 2 also saw a branch into the middle of fib: an extra leader.
    let mid = cfg.instructions[2].addr;
    let mut s = branch_sample(
        10,
        &[
            BranchEntry::new(0x7000_0000_0000 + call.addr, 0x10, false, 0),
            BranchEntry::new(0x30, 0x7000_0000_0000 + mid, false, 0),
        ],
    );
    s.header.tgid = 2;
    set.add_branch(&s);
    let prof = analyze(&set, run_info(Mode::Cpi), &opts());
    let fib = |i: usize| {
        prof.processes[i]
            .functions
            .iter()
            .find(|g| g.name == "fib")
            .unwrap()
    };
    let (a, b) = (fib(0), fib(1));
    let text =
        |f: &FunctionProfile| -> Vec<String> { f.lines.iter().map(|l| l.text.clone()).collect() };
    assert_eq!(text(a), text(b));
    assert_eq!(a.lines[0].count, 10.0);
    assert_eq!(b.lines[0].count, 10.0);
    assert_eq!(
        b.lines[2].count, 20.0,
        "both ranges cover the third instruction"
    );
    assert!(
        a.blocks.iter().all(|x| x.start != mid),
        "no leader in process 1"
    );
    assert!(
        b.blocks.iter().any(|x| x.start == mid),
        "leader in process 2"
    );
}

#[test]
fn ranges_leaving_a_function_or_crossing_a_call_are_invalid() {
    let Some(t) = TestProgram::get("analysis_loops") else {
        return;
    };
    let bin = Binary::open(&t.plain).unwrap();
    let sum = bin.function_by_name("sum_loop").unwrap().clone();
    let fib = bin.function_by_name("fib").unwrap().clone();
    let fcfg = bin.cfg(&fib, &[]).unwrap();
    let call = fcfg
        .instructions
        .iter()
        .find(|i| i.kind == FlowKind::Call)
        .unwrap();
    let mut set = set_for(&t.plain, &bin, 0, 1);
    // [sum_loop.start, fib's call]: leaves the function.
    set.add_branch(&branch_sample(
        1,
        &[
            BranchEntry::new(call.addr, fib.start, false, 0),
            BranchEntry::new(0x10, sum.start, false, 0),
        ],
    ));
    // [fib.start, the instruction after the call ... a later branch]: crosses the
    // call. The ending branch is the last instruction (ret).
    let ret = fcfg.instructions.last().unwrap();
    set.add_branch(&branch_sample(
        1,
        &[
            BranchEntry::new(ret.addr, 0x10, false, 0),
            BranchEntry::new(0x20, fib.start, false, 0),
        ],
    ));
    // [fib.start + 1, call]: not an instruction boundary.
    set.add_branch(&branch_sample(
        1,
        &[
            BranchEntry::new(call.addr, fib.start, false, 0),
            BranchEntry::new(0x20, fib.start + 1, false, 0),
        ],
    ));
    // A valid one: [fib.start, call].
    set.add_branch(&branch_sample(
        1,
        &[
            BranchEntry::new(call.addr, fib.start, false, 0),
            BranchEntry::new(0x20, fib.start, false, 0),
        ],
    ));
    let prof = analyze(&set, run_info(Mode::Cpi), &opts());
    assert_eq!(prof.lost.invalid_ranges, 3);
    assert_eq!(prof.lost_samples, 0, "invalid ranges are not lost samples");
    let f = func(&prof, "fib");
    let counted: Vec<u64> = f
        .lines
        .iter()
        .filter(|l| l.count > 0.0)
        .map(|l| l.address)
        .collect();
    let upto: Vec<u64> = fcfg
        .instructions
        .iter()
        .map(|i| i.addr)
        .filter(|&a| a <= call.addr)
        .collect();
    assert_eq!(counted, upto, "only the valid range counts");
    assert!(f.lines.iter().all(|l| l.count == 0.0 || l.count == 1.0));
}

/// Exact truth of a walk through one function's CFG.
#[derive(Default)]
struct Walk {
    /// Taken branches, oldest first (runtime addresses).
    taken: Vec<(u64, u64)>,
    count: HashMap<u64, f64>,
    fall: HashMap<(u64, u64), f64>,
    taken_count: HashMap<(u64, u64), f64>,
}

/// Random walk from the entry: conditionals go either way, direct jumps are
/// followed, anything else leaves the function. Counts are committed when the
/// taken branch ending their range is emitted (period-1 reproduction).
fn walk(cfg: &Cfg, base: u64, rng: &mut rand::rngs::StdRng) -> Walk {
    let mut w = Walk::default();
    w.taken.push((0x20, base + cfg.function.start));
    let mut pending_c: Vec<u64> = Vec::new();
    let mut pending_f: Vec<(u64, u64)> = Vec::new();
    let mut i = 0usize;
    for _ in 0..20_000 {
        let ins = &cfg.instructions[i];
        pending_c.push(ins.addr);
        let target = ins.target.and_then(|t| cfg.instruction_at(t));
        let next = match ins.kind {
            FlowKind::CondBranch if target.is_some() && rng.gen_bool(0.5) => None,
            FlowKind::Jump if target.is_some() => None,
            FlowKind::Next | FlowKind::CondBranch | FlowKind::Syscall
                if i + 1 < cfg.instructions.len() =>
            {
                Some(i + 1)
            }
            _ => {
                // Leaves the function (call, ret, indirect jump, tail call, trap).
                w.taken.push((base + ins.addr, ins.target.unwrap_or(0x10)));
                commit(&mut w, &mut pending_c, &mut pending_f);
                return w;
            }
        };
        match next {
            Some(j) => {
                if cfg.block_of[i] != cfg.block_of[j] {
                    pending_f.push((ins.addr, cfg.instructions[j].addr));
                }
                i = j;
            }
            None => {
                let j = target.unwrap();
                let to = cfg.instructions[j].addr;
                w.taken.push((base + ins.addr, base + to));
                *w.taken_count.entry((ins.addr, to)).or_default() += 1.0;
                commit(&mut w, &mut pending_c, &mut pending_f);
                i = j;
            }
        }
    }
    w // step limit: the unfinished range is not part of the truth
}

fn commit(w: &mut Walk, c: &mut Vec<u64>, f: &mut Vec<(u64, u64)>) {
    for a in c.drain(..) {
        *w.count.entry(a).or_default() += 1.0;
    }
    for e in f.drain(..) {
        *w.fall.entry(e).or_default() += 1.0;
    }
}

/// Every function of the program (plain, PIE, stripped): a period-1 sample at every
/// taken branch of random walks reproduces the walks' exact counts.
#[test]
fn period_one_walks_reproduce_exact_counts() {
    let Some(t) = TestProgram::get("analysis_loops") else {
        return;
    };
    const WINDOW: usize = 4;
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut checked = 0;
    for (path, base) in [
        (&t.plain, 0u64),
        (&t.pie, 0x5555_5555_4000),
        (&t.pie_stripped, 0x5555_5555_4000),
    ] {
        let bin = Binary::open(path).unwrap();
        for f in bin.functions().filter(|f| !f.name.starts_with('[')) {
            let cfg = bin.cfg(&f, &[]).unwrap();
            let mut set = set_for(path, &bin, base, WINDOW);
            let mut truth = Walk::default();
            for _ in 0..5 {
                let mut w = walk(&cfg, base, &mut rng);
                // Pad both ends with unmapped branches so the first and last ranges
                // fall in WINDOW samples each, like every other range.
                let pad = |k: u64| (0x1000 + 16 * k, 0x1008 + 16 * k);
                let mut taken: Vec<(u64, u64)> = (0..WINDOW as u64).map(pad).collect();
                taken.append(&mut w.taken);
                taken.extend((0..WINDOW as u64).map(|k| pad(k + 8)));
                w.taken = taken;
                for j in WINDOW..w.taken.len() {
                    let e: Vec<BranchEntry> = (0..=WINDOW)
                        .map(|k| {
                            let (a, b) = w.taken[j - k];
                            BranchEntry::new(a, b, false, 0)
                        })
                        .collect();
                    set.add_branch(&branch_sample(1, &e));
                }
                for (k, v) in w.count {
                    *truth.count.entry(k).or_default() += v;
                }
                for (k, v) in w.fall {
                    *truth.fall.entry(k).or_default() += v;
                }
                for (k, v) in w.taken_count {
                    *truth.taken_count.entry(k).or_default() += v;
                }
            }
            if truth.count.is_empty() {
                continue;
            }
            let prof = analyze(&set, run_info(Mode::Cpi), &opts());
            let fp = func(&prof, &f.name);
            for l in &fp.lines {
                let want = truth.count.get(&l.address).copied().unwrap_or(0.0);
                assert_eq!(l.count, want, "{} {:#x} in {path:?}", f.name, l.address);
            }
            for e in &fp.edges {
                let want = match (e.kind, e.to_function.is_some()) {
                    (EdgeKind::FallThrough, _) => truth.fall.get(&(e.from, e.to)),
                    (EdgeKind::Taken, false) => truth.taken_count.get(&(e.from, e.to)),
                    (EdgeKind::Taken, true) => continue,
                };
                assert_eq!(Some(&e.count), want, "{} edge {e:?}", f.name);
            }
            let n_fall = fp
                .edges
                .iter()
                .filter(|e| e.kind == EdgeKind::FallThrough)
                .count();
            assert_eq!(n_fall, truth.fall.len(), "{}", f.name);
            checked += 1;
        }
    }
    assert!(checked >= 15, "walked {checked} functions");
}

/// A range that runs off the end of one function into the next (no jump joins them,
/// as libc's strcasecmp runs into strcasecmp_l) counts in each function it ran in,
/// each instruction in its own; one that would run past a `ret` into the next function
/// stays invalid. Stripped, no symbol or FDE covers this assembly: its hole in the
/// function table is named after the binary and counted all the same.
#[test]
fn ranges_falling_into_the_next_function_count_in_each() {
    let Some(t) = TestProgram::get("fall_through") else {
        return;
    };
    let plain = Binary::open(&t.plain).unwrap();
    let at = |name: &str| plain.function_by_name(name).unwrap();
    let (head, tail, ends, after) = (
        at("head_part"),
        at("tail_part"),
        at("ends_in_ret"),
        at("after_ret"),
    );
    let last = |f: &crate::binary::Function| plain.decode(f).unwrap().last().unwrap().addr;
    for path in [&t.plain, &t.stripped] {
        let bin = Binary::open(path).unwrap();
        let mut set = set_for(path, &bin, 0, 1);
        // main calls head_part, which runs into tail_part and returns: [head, tail's ret].
        let falls = [
            BranchEntry::new(last(&tail), 0x10, false, 9),
            BranchEntry::new(0x20, head.start, false, 0),
        ];
        // [ends_in_ret, after_ret's ret]: would run past ends_in_ret's ret.
        let crosses = [
            BranchEntry::new(last(&after), 0x10, false, 0),
            BranchEntry::new(0x20, ends.start, false, 0),
        ];
        for _ in 0..3 {
            set.add_branch(&branch_sample(1, &falls));
        }
        set.add_branch(&branch_sample(1, &crosses));
        let mut o = opts();
        o.sample_floor = 1;
        let prof = analyze(&set, run_info(Mode::Cpi), &o);
        assert_eq!(prof.lost.invalid_ranges, 1, "{}", path.display());
        let counted: Vec<(u64, f64)> = (prof.processes[0].functions.iter())
            .flat_map(|f| &f.lines)
            .filter(|l| l.count > 0.0)
            .map(|l| (l.address, l.count))
            .collect();
        let mut want: Vec<(u64, f64)> = [&head, &tail]
            .iter()
            .flat_map(|f| plain.decode(f).unwrap())
            .map(|i| (i.addr, 3.0))
            .collect();
        want.sort_by_key(|w| w.0);
        let mut got = counted;
        got.sort_by_key(|w| w.0);
        assert_eq!(got, want, "{}", path.display());
        if path == &t.plain {
            for (f, n) in [(&head, 2.0), (&tail, 3.0)] {
                let p = func(&prof, &f.name);
                assert_eq!(p.measures.instructions, Some(3.0 * n), "{}", f.name);
                // Its LBR cycles cover both functions: neither is timed by them.
                assert!(p.timed_cpi.is_none(), "{}", f.name);
            }
        } else {
            let holder = &prof.processes[0].functions[0];
            assert!(
                holder.name.starts_with('[') && holder.name.contains("]+0x"),
                "code no symbol or FDE covers is named by its binary and address: {}",
                holder.name
            );
        }
    }
}
