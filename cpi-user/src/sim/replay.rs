//! Replays a trace: every straight-line range a thread ran goes through the cycle model
//! once, then into the exact truth and (optionally) the PMU model. Each thread's exact
//! call stack is kept beside it (cpi-user/src/sim/shadow.rs), so the truth is also known
//! per calling context and every sample carries its stack.
//!
//! A traced process that execs goes on in the same trace (cpi-user/src/sim/trace.rs):
//! the replay then starts again, so the truth and the samples are those of the last
//! program, and the programs before it are kept as [`Image`]s with their instruction
//! counts. Under Valgrind every program loads at the same addresses (no ASLR), so the
//! replaced program's code could not be told apart from the new one's.

use std::io::Read;

use super::code::CodeMap;
use super::context_truth::ContextTruth;
use super::cycles::{Dynamic, Ending, Predictor, RangeTable};
use super::pmu::{Pmu, PmuConfig, SampleSink};
use super::shadow::{ContextTree, Frames, ThreadStack};
use super::trace::{Event, TraceError, TraceReader};
use super::FastMap;
use crate::procmap::ProcessMaps;
use crate::progress::{self, Unit};

/// Trace records between progress updates (a few per second at replay speed).
const PROGRESS_EVERY: u64 = 1 << 16;

/// Exact counts of one executed instruction (runtime address).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsnTruth {
    /// Executions.
    pub count: u64,
    /// Modelled cycles charged to it over all executions (cpi-user/src/sim/cycles.rs).
    pub cycles: u64,
    /// Executions followed by the next sequential instruction (fall-through out).
    pub fall_out: u64,
    /// A `rep` string instruction: counted once per execution, not per iteration.
    pub rep: bool,
}

/// Exact counts of one taken transfer (runtime addresses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TakenTruth {
    /// Times the transfer was taken.
    pub count: u64,
    /// Of those, the times the model's predictor mispredicted it.
    pub mispredicts: u64,
}

/// A program the traced process ran and replaced by exec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// As the command or `execve` named it.
    pub path: String,
    /// Instructions it executed, all threads.
    pub instructions: u64,
}

/// The exact answer for a whole run, in runtime addresses.
#[derive(Clone, Debug, Default)]
pub struct Truth {
    /// The traced process (Valgrind runs the program in its own process).
    pub pid: u32,
    /// The program the truth is of: the command, or the last program it exec'd.
    pub program: String,
    /// The programs that ran before `program` and exec'd the next one, in order: not
    /// in the truth.
    pub replaced: Vec<Image>,
    /// Child processes the traced programs created (not traced).
    pub forks: u64,
    /// Instructions the run executed, all threads.
    pub instructions: u64,
    /// Modelled cycles of the whole run.
    pub cycles: u64,
    /// Per instruction, by runtime address (only code whose bytes decoded).
    pub insns: FastMap<u64, InsnTruth>,
    /// Per taken transfer, by (from, to) runtime addresses.
    pub taken: FastMap<(u64, u64), TakenTruth>,
    /// The calling contexts of the run: entry i is (parent context, return address) of
    /// context i; entry 0 is the empty stack (cpi-user/src/sim/shadow.rs).
    pub contexts: Vec<(u32, u64)>,
    /// What ran with each context as its stack, per instruction (only code whose bytes
    /// decoded, as `insns`).
    pub contexts_ran: ContextTruth,
    /// Instructions (and their cycles) in code without bytes (vdso, JIT) or whose bytes
    /// did not decode to the traced count: counted in totals, not per instruction.
    pub unknown_instructions: u64,
    /// The cycles of `unknown_instructions`.
    pub unknown_cycles: u64,
    /// Every executable mapping of the run.
    pub maps: ProcessMaps,
    /// Ranges [start, end] (runtime addresses) whose last instruction is a system call
    /// that never returned to the next instruction — a thread's exit, `rt_sigreturn` —
    /// with their execution counts. (Callgrind charges a block when it completes, so it
    /// does not count these: the tracer tests need them.)
    pub unreturned_ranges: Vec<(u64, u64, u64)>,
    /// How the replay went (anomalies, undecodable ranges).
    pub stats: ReplayStats,
}

/// Bookkeeping of a replay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Trace records read.
    pub records: u64,
    /// Range executions replayed.
    pub ranges: u64,
    /// Distinct [start, end] ranges (each decoded once).
    pub distinct_ranges: u64,
    /// Threads seen.
    pub threads: u64,
    /// Signal deliveries that cut a range.
    pub interrupts: u64,
    /// Records that make no sense (a range with no start); counted, skipped.
    pub anomalies: u64,
    /// Distinct ranges whose bytes did not decode to the trace's instruction count.
    pub mismatched_ranges: u64,
    /// Distinct ranges without code bytes (vdso, anonymous/JIT code).
    pub unknown_ranges: u64,
    /// Calls made when the calling-context tree was full (cpi-user/src/sim/shadow.rs).
    pub context_overflows: u64,
}

/// One (range, how it ended) pair and its exact counts.
#[derive(Clone, Debug)]
struct Slot {
    range: u32,
    /// The calling context the range ran in.
    context: u32,
    ending: Ending,
    count: u64,
    cycles: u64,
    last_mispredicts: u64,
    /// Ends in a system call that transferred elsewhere (`rt_sigreturn`).
    unreturned: bool,
}

/// The replay state.
#[derive(Default)]
pub struct Replay {
    code: CodeMap,
    table: RangeTable,
    predictor: Predictor,
    slots: Vec<Slot>,
    /// (context, start, end, to) → slot.
    by_key: FastMap<(u32, u64, u64, u64), u32>,
    /// (slot, index in its range) → mispredictions of that inner conditional.
    inner_mispredicts: FastMap<(u32, u32), u64>,
    contexts: ContextTree,
    /// The running thread's stack.
    stack: ThreadStack,
    dynamic: Dynamic,
    /// PMU models, each feeding its own sample set (one per seed when calibrating).
    pmus: Vec<Pmu>,
    stats: ReplayStats,
    pid: u32,
    /// Thread ends: [start, end].
    final_ranges: FastMap<(u64, u64), u64>,
    /// The program running now.
    program: String,
    replaced: Vec<Image>,
    forks: u64,
}

impl Replay {
    /// Replays a whole trace; with `pmu`, the PMU model runs too and its samples go into
    /// `set`.
    pub fn run<R: Read, S: SampleSink>(
        &mut self,
        reader: R,
        set: &mut S,
        pmu: Option<PmuConfig>,
    ) -> Result<(), TraceError> {
        self.run_models(reader, std::slice::from_mut(set), pmu.into_iter().collect())
    }

    /// Replays a whole trace once through several PMU models: the samples of `pmus[i]`
    /// go into `sets[i]` (one trace, many seeds: `sim::calibrate`).
    pub(crate) fn run_models<R: Read, S: SampleSink>(
        &mut self,
        reader: R,
        sets: &mut [S],
        pmus: Vec<PmuConfig>,
    ) -> Result<(), TraceError> {
        let mut r = TraceReader::new(reader)?;
        self.pid = r.pid();
        let new_pmus = |pid| pmus.iter().map(|cfg| Pmu::new(cfg.clone(), pid)).collect();
        self.pmus = new_pmus(self.pid);
        let mut starts: FastMap<u32, u64> = FastMap::default();
        let mut stacks: FastMap<u32, ThreadStack> = FastMap::default();
        let (mut tid, mut start) = (self.pid, 0u64);
        let shown = progress::stage("tracing", None, Unit::Count("branches"));
        loop {
            let ev = match r.next_branch() {
                Some((from, to, n)) => {
                    self.count_record(&shown);
                    self.branch(sets, tid, &mut start, from, to, n);
                    continue;
                }
                None => match r.next()? {
                    Some(ev) => ev,
                    None => break,
                },
            };
            self.count_record(&shown);
            match ev {
                Event::Maps(m) => self.code.update(m),
                Event::Image { path } => self.program = path,
                Event::Fork { .. } => self.forks += 1,
                Event::Exec => {
                    // A new program in the same process: start again (module doc).
                    self.restart(new_pmus(self.pid));
                    sets.iter_mut().for_each(SampleSink::restart);
                    starts.clear();
                    stacks.clear();
                    (tid, start) = (self.pid, 0);
                }
                Event::Thread { tid: t } => {
                    starts.insert(tid, start);
                    stacks.insert(tid, self.stack);
                    tid = t;
                    start = starts.get(&t).copied().unwrap_or(0);
                    self.stack = stacks.get(&t).copied().unwrap_or_default();
                }
                Event::Branch { from, to, n } => self.branch(sets, tid, &mut start, from, to, n),
                Event::Interrupt {
                    from, n, resume, ..
                } => {
                    self.stats.interrupts += 1;
                    if n > 0 {
                        self.range(sets, tid, start, from, n, Ending::Stop);
                    }
                    self.stack = self.contexts.signal(self.stack, resume);
                    start = 0;
                }
                Event::End { from, n } => {
                    starts.insert(tid, 0);
                    if start != 0 {
                        *self.final_ranges.entry((start, from)).or_default() += 1;
                    }
                    if n > 0 {
                        self.range(sets, tid, start, from, n, Ending::Stop);
                    }
                    self.stack = ThreadStack::default();
                    start = 0;
                }
            }
        }
        starts.insert(tid, start);
        self.stats.threads = starts.len() as u64;
        Ok(())
    }

    /// Counts a record; shows the count now and then.
    #[inline(always)]
    fn count_record(&mut self, shown: &progress::Stage) {
        self.stats.records += 1;
        if self.stats.records.is_multiple_of(PROGRESS_EVERY) {
            shown.update(self.stats.records);
        }
    }

    /// After an exec: the old program's state gone, its image kept in `replaced`.
    fn restart(&mut self, pmus: Vec<Pmu>) {
        let mut replaced = std::mem::take(&mut self.replaced);
        replaced.push(Image {
            path: std::mem::take(&mut self.program),
            instructions: self.instructions(),
        });
        *self = Replay {
            pid: self.pid,
            replaced,
            forks: self.forks,
            stats: ReplayStats {
                records: self.stats.records,
                ..ReplayStats::default()
            },
            pmus,
            ..Replay::default()
        };
    }

    /// A taken-branch record of thread `tid`: its range `*start..=from` of `n`
    /// instructions ran; the next starts at `to`.
    #[inline(always)]
    fn branch<S: SampleSink>(
        &mut self,
        sets: &mut [S],
        tid: u32,
        start: &mut u64,
        from: u64,
        to: u64,
        n: u32,
    ) {
        if n > 0 {
            self.range(sets, tid, *start, from, n, Ending::Taken { to });
        } else if from != 0 {
            self.stats.anomalies += 1;
        } else {
            // The thread starts, or a signal handler does: the kernel put it there.
            for pmu in &mut self.pmus {
                pmu.kernel_return(tid, to);
            }
        }
        *start = to;
    }

    fn range<S: SampleSink>(
        &mut self,
        sets: &mut [S],
        tid: u32,
        start: u64,
        end: u64,
        n: u32,
        ending: Ending,
    ) {
        if start == 0 {
            self.stats.anomalies += 1;
            return;
        }
        self.stats.ranges += 1;
        let to = match ending {
            Ending::Taken { to } => to,
            Ending::Stop => u64::MAX,
        };
        let before = self.stack;
        let slot = match self.by_key.get(&(before.node, start, end, to)) {
            Some(&s) if self.table.infos[self.slots[s as usize].range as usize].n == n => s,
            _ => {
                let range = self.table.get(&mut self.code, start, end, n);
                let unreturned = to != u64::MAX
                    && to != end + 2
                    && self
                        .code
                        .bytes(end)
                        .is_some_and(|(d, from, _)| d[from..].starts_with(&[0x0f, 0x05]));
                let s = self.slots.len() as u32;
                self.slots.push(Slot {
                    range,
                    context: before.node,
                    ending,
                    count: 0,
                    cycles: 0,
                    last_mispredicts: 0,
                    unreturned,
                });
                self.by_key.insert((before.node, start, end, to), s);
                s
            }
        };
        let sl = &mut self.slots[slot as usize];
        let info = &self.table.infos[sl.range as usize];
        self.predictor.execute(info, ending, &mut self.dynamic);
        sl.count += 1;
        sl.cycles += self.dynamic.cycles;
        sl.last_mispredicts += self.dynamic.last_mispredicted as u64;
        for &i in &self.dynamic.mispredicted {
            *self.inner_mispredicts.entry((slot, i)).or_default() += 1;
        }
        let after = match ending {
            Ending::Taken { to } => self.contexts.transfer(before, info.last, to),
            Ending::Stop => before,
        };
        let frames = Frames {
            tree: &self.contexts,
            before,
            after,
        };
        for (pmu, set) in self.pmus.iter_mut().zip(sets.iter_mut()) {
            pmu.on_range(set, tid, info, &self.dynamic, ending, &frames);
        }
        self.stack = after;
    }

    /// The (first) PMU model, after the run.
    pub fn pmu(&self) -> Option<&Pmu> {
        self.pmus.first()
    }

    /// Every PMU model, after the run, in the order given.
    pub(crate) fn pmus(&self) -> &[Pmu] {
        &self.pmus
    }

    /// Instructions replayed so far (since the last exec).
    fn instructions(&self) -> u64 {
        self.slots
            .iter()
            .map(|sl| sl.count * self.table.infos[sl.range as usize].n as u64)
            .sum()
    }

    /// Expands the per-range counts into the exact per-instruction and per-edge truth.
    pub fn truth(&self) -> Truth {
        let mut t = Truth {
            pid: self.pid,
            program: self.program.clone(),
            replaced: self.replaced.clone(),
            forks: self.forks,
            instructions: self.instructions(),
            maps: self.code.all_maps(),
            contexts: (0..self.contexts.len() as u32)
                .map(|n| (self.contexts.parent(n), self.contexts.ret_addr(n)))
                .collect(),
            unreturned_ranges: self
                .final_ranges
                .iter()
                .map(|(&(s, e), &c)| (s, e, c))
                .collect(),
            ..Default::default()
        };
        let penalty = super::cycles::MISPREDICT_PENALTY as u64;
        for r in &self.table.infos {
            t.contexts_ran.add_range(&r.addrs, &r.costs);
        }
        // Each slot's run in `contexts_ran`, for its inner conditionals' penalties.
        let mut runs = vec![u32::MAX; self.slots.len()];
        for (sl, run) in self.slots.iter().zip(&mut runs) {
            let r = &self.table.infos[sl.range as usize];
            if sl.unreturned {
                t.unreturned_ranges.push((r.start, r.end, sl.count));
            }
            t.cycles += sl.cycles;
            if let Ending::Taken { to } = sl.ending {
                let e = t.taken.entry((r.end, to)).or_default();
                e.count += sl.count;
                e.mispredicts += sl.last_mispredicts;
            }
            if !r.known() {
                t.unknown_instructions += sl.count * r.n as u64;
                t.unknown_cycles += sl.cycles;
                continue;
            }
            let last = r.addrs.len() - 1;
            // Cycles of the last instruction beyond its static cost: taken bubble and
            // misprediction, whatever is left of the slot's cycles after the rest.
            let mut rest = sl.cycles;
            for (i, (&a, &c)) in r.addrs.iter().zip(&r.costs).enumerate() {
                let e = t.insns.entry(a).or_default();
                e.count += sl.count;
                let mut cyc = sl.count * c as u64;
                if i != last {
                    e.fall_out += sl.count;
                }
                if i == last {
                    cyc = rest;
                } else {
                    rest -= cyc;
                }
                e.cycles += cyc;
            }
            *run = t
                .contexts_ran
                .add_run(sl.context, sl.range, sl.count, sl.cycles);
            for &i in &r.reps {
                if let Some(e) = t.insns.get_mut(&r.addrs[i as usize]) {
                    e.rep = true;
                }
            }
        }
        // Misprediction penalties of inner conditionals belong to them, not to the last
        // instruction of their range, which absorbed them above.
        for (&(slot, i), &m) in &self.inner_mispredicts {
            let sl = &self.slots[slot as usize];
            let r = &self.table.infos[sl.range as usize];
            if !r.known() {
                continue;
            }
            let pen = m * penalty;
            let (at, end) = (r.addrs[i as usize], r.end);
            if let Some(e) = t.insns.get_mut(&at) {
                e.cycles += pen;
            }
            if let Some(e) = t.insns.get_mut(&end) {
                e.cycles -= pen;
            }
            t.contexts_ran.add_penalty(runs[slot as usize], i, pen);
        }
        t.contexts_ran.finish();
        t.stats = ReplayStats {
            distinct_ranges: self.table.infos.len() as u64,
            mismatched_ranges: self.table.mismatched,
            unknown_ranges: self.table.unknown,
            context_overflows: self.contexts.overflows,
            ..self.stats.clone()
        };
        t
    }
}
