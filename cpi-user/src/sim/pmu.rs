//! The PMU model: a taken-branch counter with an LBR ring and a cycle counter per
//! thread, driven by the replayed trace, emitting the wire records real collection
//! emits ([`BranchSample`] with `event = Branches`, [`IpSample`] with `event = Cycles`)
//! into a [`SampleSink`]: a [`SampleSet`], the same aggregation path, or a recorder
//! (the aggregation benchmark, which times the aggregation apart from this model).
//!
//! Both perturbation layers are the production code of `cpi_common::policy`:
//! * kernel: every counter overflow goes through [`ThinState::on_overflow`] with
//!   [`Perturbation::thinning`], exactly as the eBPF program does: the hardware period is
//!   the requested one, one record per K overflows is emitted, weighted by the periods
//!   it stands for;
//! * user: as the collector does, every `redraw_interval_ns` of simulated time (the
//!   collector's drain cadence) each counter that has counted as much as
//!   [`PeriodPolicy::redraw_after`] asks since its last re-draw gets a fresh period from
//!   [`PeriodPolicy::draw`], set like `PERF_EVENT_IOC_PERIOD` does: the count restarts
//!   (events since the last overflow are not carried).
//!
//! Without the user layer the period is used exactly as given (the defaults are primes),
//! which is what lets a test lock a loop onto it.
//!
//! The branch stack is snapshotted on the taken-branch counter's overflow
//! ([`BranchEvent::Branches`], seed 000) or, as `perf record -b` does by default, on
//! the cycle counter's ([`BranchEvent::Cycles`]: each cycle sample then carries the LBR
//! as it was at that instruction, and the taken-branch counter emits nothing).
//!
//! Every record carries the thread's exact call stack from the replay's shadow stack
//! (cpi-user/src/sim/shadow.rs): a cycle sample the stack of the instruction it lands
//! on, a branch sample the stack after the taken branch it was taken at — as an unwinder
//! run at the interrupt would see them.
//!
//! The LBR holds what hardware with a user-only filter holds: every taken transfer of
//! user code, to the next instruction included (`call 1f; 1: pop`, a `jmp *reg` to the
//! next instruction; Linux types a zero-length call `X86_BR_ZERO_CALL` and keeps it),
//! and the kernel's returns to user mode. Hardware files a branch under the privilege
//! level of its *target* (Intel SDM, LBR_SELECT: "do not capture branches ending in ring
//! 0"; Linux `arch/x86/events/utils.c`: "branch priv level determined by target as is
//! done by HW when LBR_SELECT is implemented"), so with user-only recording the entry
//! into the kernel (interrupt, fault, system call) leaves no entry and the `iret` or
//! `sysret` back to user mode leaves one whose `from` is a kernel address, which perf
//! types `PERF_BR_ERET`/`PERF_BR_SYSRET`. The model records that return as
//! [`KERNEL_EXIT`] → the user instruction it went to, wherever the trace shows the
//! kernel moving a thread: a thread starting, a signal handler starting (the
//! interrupted range ends with no entry), `rt_sigreturn` resuming the interrupted code
//! (any non-branch instruction that transferred control did so through the kernel).
//! Analysis drops the range that ends at the kernel address, as it must on hardware.
//! The kernel's return after an ordinary system call is not modelled (the trace does
//! not mark it): those ranges run on through the `syscall` here.
//!
//! LBR entries carry the cycles since the previous entry (Skylake+ semantics, saturated
//! at 0xffff) and the predictor's mispredict flag. Skid: the cycle sample's IP is taken
//! `skid` instructions after the overflowing one (within its range); the branch sample
//! is taken `skid` taken branches after the overflow.

use cpi_common::policy::{
    PeriodPolicy, Perturbation, Rng, ThinState, Thinning, DEFAULT_PERTURBATION, DEFAULT_THINNING,
};
use cpi_common::wire::{
    branch_type, BranchEntry, BranchSample, EventRole, IpSample, SampleHeader, SampleKind,
    MAX_BRANCH_ENTRIES, WIRE_VERSION,
};

use super::cycles::{Dynamic, Ending, Flow, RangeInfo};
use super::shadow::Frames;
use super::FastMap;
use crate::profile::{CallStack, SampleSet, StackWeighting};

/// Where the PMU model's records go.
pub trait SampleSink {
    /// A branch sample taken under call stack `stack`.
    fn branch(&mut self, s: &BranchSample, stack: &CallStack);
    /// A cycle sample taken under call stack `stack`.
    fn ip(&mut self, s: &IpSample, stack: &CallStack);
    /// The program was replaced (exec): what was sunk so far is dropped.
    fn restart(&mut self);
}

impl SampleSink for SampleSet {
    fn branch(&mut self, s: &BranchSample, stack: &CallStack) {
        self.add_branch_with_stack(s, Some(stack));
    }

    fn ip(&mut self, s: &IpSample, stack: &CallStack) {
        self.add_ip_with_stack(s, Some(stack))
            .expect("the model emits known roles only");
    }

    fn restart(&mut self) {
        *self = self.empty_like();
    }
}

/// The counter whose overflow snapshots the branch stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BranchEvent {
    /// Retired taken branches (Intel `BR_INST_RETIRED.NEAR_TAKEN`): each stack stands
    /// for `period` taken branches.
    #[default]
    Branches,
    /// Cycles (`perf record -b`'s default): each stack stands for `period` cycles.
    Cycles,
}

impl std::str::FromStr for BranchEvent {
    type Err = String;
    /// `branches` or `cycles` (the CLI's names).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "branches" => Ok(BranchEvent::Branches),
            "cycles" => Ok(BranchEvent::Cycles),
            _ => Err(format!("`{s}`: expected branches or cycles")),
        }
    }
}

/// What the model samples and how.
#[derive(Clone, Debug)]
pub struct PmuConfig {
    /// The counter whose overflow snapshots the branch stack.
    pub branch_event: BranchEvent,
    /// How the analysis weighs each stack's ranges; `None`: the default for
    /// `branch_event` ([`PmuConfig::weighting`]).
    pub stack_weighting: Option<StackWeighting>,
    /// Taken branches per emitted branch sample (base, and the user layer's jitter).
    pub branch: PeriodPolicy,
    /// Cycles per emitted IP sample.
    pub cycles: PeriodPolicy,
    /// LBR depth (entries per branch sample), 2..=32.
    pub depth: usize,
    /// Which perturbation layers run (kernel thinning, user re-draws), as in collection.
    pub perturbation: Perturbation,
    /// Kernel-layer thinning factor K (used when the kernel layer is on).
    pub thinning: u32,
    /// Instructions (cycle samples) or taken branches (branch samples) between the
    /// overflow and where the sample is taken; 0: exact.
    pub skid: u32,
    /// How often due re-draws are made (the collector's drain cadence).
    pub redraw_interval_ns: u64,
    /// Simulated clock: cycles per nanosecond.
    pub cycles_per_ns: u64,
    /// Seed of the period draws and thinning phases: one seed, one result.
    pub seed: u64,
}

impl Default for PmuConfig {
    fn default() -> Self {
        PmuConfig {
            branch_event: BranchEvent::Branches,
            stack_weighting: None,
            branch: PeriodPolicy::around(SIM_BRANCH_PERIOD),
            cycles: PeriodPolicy::around(SIM_CYCLE_PERIOD),
            depth: MAX_BRANCH_ENTRIES,
            perturbation: DEFAULT_PERTURBATION,
            thinning: DEFAULT_THINNING,
            skid: 0,
            redraw_interval_ns: SIM_REDRAW_MS * 1_000_000,
            cycles_per_ns: 3,
            seed: SIM_SEED,
        }
    }
}

impl PmuConfig {
    /// The stack weighting in force: as given, else period / window for stacks sampled
    /// on taken branches and period / cycles spanned for stacks sampled on cycles (the
    /// model's entries are always timed).
    pub fn weighting(&self) -> StackWeighting {
        self.stack_weighting.unwrap_or(match self.branch_event {
            BranchEvent::Branches => StackWeighting::Window,
            BranchEvent::Cycles => StackWeighting::CyclesSpanned,
        })
    }
}

/// Default taken branches per branch sample. Lower than a production rate because a
/// traced run is short (Valgrind runs 50–100× slower than native): a prime that still
/// gives thousands of samples on a 100 M-instruction run.
pub const SIM_BRANCH_PERIOD: u64 = 2_003;
/// Default cycles per cycle sample (prime; see [`SIM_BRANCH_PERIOD`]).
pub const SIM_CYCLE_PERIOD: u64 = 2_003;
/// Default user-layer re-draw interval, simulated milliseconds (shorter than
/// collection's: a traced run lasts simulated milliseconds to seconds).
pub const SIM_REDRAW_MS: u64 = 10;
/// Default seed of the policy's random numbers.
pub const SIM_SEED: u64 = 0x5eed;
/// The `from` of the model's LBR entries for the kernel's returns to user mode (module
/// doc): an address in the kernel half (the x86-64 kernel text base without KASLR).
pub const KERNEL_EXIT: u64 = 0xffff_ffff_8100_0000;

/// One hardware counter of one thread.
#[derive(Clone, Debug)]
struct Counter {
    /// The hardware period policy.
    hw: PeriodPolicy,
    period: u64,
    left: u64,
    thin: ThinState,
    /// Events counted (at overflows) since the last re-draw, and how many the schedule
    /// waits for.
    counted: u64,
    redraw_after: u64,
}

impl Counter {
    fn new(hw: PeriodPolicy, cfg: &PmuConfig, rng: &mut Rng) -> Self {
        let period = if cfg.perturbation.user() {
            hw.draw(rng)
        } else {
            hw.base
        };
        Counter {
            hw,
            period,
            left: period,
            thin: ThinState::new(rng.next_u64()),
            counted: 0,
            redraw_after: hw.redraw_after(rng),
        }
    }

    fn thinning(cfg: &PmuConfig) -> Thinning {
        cfg.perturbation.thinning(cfg.thinning)
    }
}

#[derive(Clone, Debug)]
struct ThreadPmu {
    branches: Counter,
    cycles: Counter,
    /// LBR ring, `lbr[(head + i) % depth]`; newest at `head`.
    lbr: Vec<BranchEntry>,
    head: usize,
    filled: usize,
    /// Cycles since the newest LBR entry.
    since_entry: u64,
    /// A skidded branch sample: taken branches still to retire, and its weight.
    branch_skid: Option<(u32, u64)>,
}

impl ThreadPmu {
    /// Pushes `e` as the newest LBR entry, timed with the cycles since the previous one.
    fn push(&mut self, e: BranchEntry, depth: usize) {
        let c = self.since_entry.min(0xffff) as u16;
        self.since_entry = 0;
        self.head = (self.head + depth - 1) % depth;
        self.lbr[self.head] =
            BranchEntry::new(e.from, e.to, e.mispred(), c).with_type(e.branch_type());
        self.filled = (self.filled + 1).min(depth);
    }
}

/// Counts of what the model did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PmuStats {
    /// Overflows of the taken-branch counter.
    pub branch_overflows: u64,
    /// Overflows of the cycle counter.
    pub cycle_overflows: u64,
    /// Branch-stack records emitted (after thinning).
    pub branch_samples: u64,
    /// IP records emitted (after thinning).
    pub ip_samples: u64,
    /// Overflows thinned by the kernel layer.
    pub thinned: u64,
    /// Period re-draws by the user layer (per counter).
    pub redraws: u64,
    /// Cycle samples whose IP is a range start because the bytes were unknown.
    pub unattributed_ips: u64,
}

/// The model of the whole traced process.
pub struct Pmu {
    cfg: PmuConfig,
    pid: u32,
    threads: FastMap<u32, ThreadPmu>,
    rng: Rng,
    now_cycles: u64,
    next_redraw: u64,
    /// What the model did so far.
    pub stats: PmuStats,
}

impl Pmu {
    /// The model of process `pid`; `cfg.depth` is clamped to 2..=32.
    pub fn new(cfg: PmuConfig, pid: u32) -> Self {
        let mut cfg = cfg;
        cfg.depth = cfg.depth.clamp(2, MAX_BRANCH_ENTRIES);
        let next_redraw = cfg.redraw_interval_ns.saturating_mul(cfg.cycles_per_ns);
        Pmu {
            rng: Rng::new(cfg.seed),
            cfg,
            pid,
            threads: FastMap::default(),
            now_cycles: 0,
            next_redraw,
            stats: PmuStats::default(),
        }
    }

    fn thread(&mut self, tid: u32) -> &mut ThreadPmu {
        let (cfg, rng) = (&self.cfg, &mut self.rng);
        self.threads.entry(tid).or_insert_with(|| ThreadPmu {
            branches: Counter::new(cfg.branch, cfg, rng),
            cycles: Counter::new(cfg.cycles, cfg, rng),
            lbr: vec![BranchEntry::default(); cfg.depth],
            head: 0,
            filled: 0,
            since_entry: 0,
            branch_skid: None,
        })
    }

    fn header(
        &self,
        kind: SampleKind,
        tid: u32,
        event: EventRole,
        period: u64,
        ip: u64,
        nr: u16,
    ) -> SampleHeader {
        SampleHeader {
            version: WIRE_VERSION,
            kind: kind as u16,
            flags: 0,
            nr,
            cpu: 0,
            tgid: self.pid,
            tid,
            event: event as u32,
            period,
            time_ns: self.now_cycles / self.cfg.cycles_per_ns.max(1),
            ip,
            cgroup_id: 0,
        }
    }

    fn redraw(&mut self) {
        let user = self.cfg.perturbation.user();
        while self.now_cycles >= self.next_redraw {
            self.next_redraw += self.cfg.redraw_interval_ns.max(1) * self.cfg.cycles_per_ns;
            if !user {
                continue;
            }
            let mut tids: Vec<u32> = self.threads.keys().copied().collect();
            tids.sort_unstable();
            for tid in tids {
                let t = self.threads.get_mut(&tid).expect("listed");
                for c in [&mut t.branches, &mut t.cycles] {
                    if c.counted < c.redraw_after {
                        continue;
                    }
                    c.period = c.hw.draw(&mut self.rng);
                    c.left = c.period;
                    c.counted = 0;
                    c.redraw_after = c.hw.redraw_after(&mut self.rng);
                    self.stats.redraws += 1;
                }
            }
        }
    }

    /// Emits thread `tid`'s LBR as a branch sample standing for `weight` events, taken
    /// under call stack `stack`.
    fn emit_stack(
        &mut self,
        set: &mut impl SampleSink,
        tid: u32,
        ip: u64,
        weight: u64,
        stack: &CallStack,
    ) {
        let t = &self.threads[&tid];
        let depth = self.cfg.depth;
        let mut entries = [BranchEntry::default(); MAX_BRANCH_ENTRIES];
        for (i, e) in entries.iter_mut().enumerate().take(t.filled) {
            *e = t.lbr[(t.head + i) % depth];
        }
        let nr = t.filled as u16;
        let h = self.header(SampleKind::Branch, tid, EventRole::Branches, weight, ip, nr);
        set.branch(&BranchSample { header: h, entries }, stack);
        self.stats.branch_samples += 1;
    }

    /// The kernel returned thread `tid` to user mode at `to` (a thread starting, a signal
    /// handler starting): the LBR entry hardware records for it (module doc). The
    /// taken-branch counter counts user-mode near branches only: not this one.
    pub(crate) fn kernel_return(&mut self, tid: u32, to: u64) {
        let depth = self.cfg.depth;
        let entry = BranchEntry::new(KERNEL_EXIT, to, false, 0).with_type(branch_type::ERET);
        self.thread(tid).push(entry, depth);
    }

    /// One execution of range `r` by thread `tid`, as the cycle model costed it, under
    /// the call stacks `frames`. `ending` with `Taken` retires the taken branch
    /// `r.end → to`.
    pub(crate) fn on_range(
        &mut self,
        set: &mut impl SampleSink,
        tid: u32,
        r: &RangeInfo,
        d: &Dynamic,
        ending: Ending,
        frames: &Frames,
    ) {
        self.count_cycles(set, tid, r, d, frames);
        self.now_cycles += d.cycles;
        self.count_branch(set, tid, r, d, ending, frames);
        if self.now_cycles >= self.next_redraw {
            self.redraw();
        }
    }

    /// The cycle counter over range `r`'s execution: its overflows, sampled where the
    /// skid puts them.
    fn count_cycles(
        &mut self,
        set: &mut impl SampleSink,
        tid: u32,
        r: &RangeInfo,
        d: &Dynamic,
        frames: &Frames,
    ) {
        let thin = Counter::thinning(&self.cfg);
        let skid = self.cfg.skid as usize;
        let cycles = d.cycles;
        let mut ips: Vec<(u64, u64)> = Vec::new();
        {
            let t = self.thread(tid);
            if t.cycles.left > cycles {
                t.cycles.left -= cycles;
            } else {
                let n = r.n as usize;
                for i in 0..n {
                    let mut c = d.cost_of(r, i);
                    while c >= t.cycles.left {
                        c -= t.cycles.left;
                        let period = t.cycles.period;
                        t.cycles.left = period;
                        t.cycles.counted += period;
                        let j = (i + skid).min(n - 1);
                        let ip = r.addrs.get(j).copied().unwrap_or(r.start);
                        ips.push((ip, period));
                    }
                    t.cycles.left -= c;
                }
            }
        }
        for (ip, period) in ips {
            self.stats.cycle_overflows += 1;
            if !r.known() {
                self.stats.unattributed_ips += 1;
            }
            let t = self.threads.get_mut(&tid).expect("created above");
            match t.cycles.thin.on_overflow(period, thin) {
                Some(w) => {
                    let h = self.header(SampleKind::Ip, tid, EventRole::Cycles, w, ip, 0);
                    let stack = frames.before(ip);
                    set.ip(&IpSample { header: h }, &stack);
                    self.stats.ip_samples += 1;
                    if self.cfg.branch_event == BranchEvent::Cycles {
                        // The LBR as it stands at this instruction: r's own taken
                        // branch has not retired yet.
                        self.emit_stack(set, tid, ip, w, &stack);
                    }
                }
                None => self.stats.thinned += 1,
            }
        }
    }

    /// The LBR and the taken-branch counter as range `r` ends (`ending`).
    fn count_branch(
        &mut self,
        set: &mut impl SampleSink,
        tid: u32,
        r: &RangeInfo,
        d: &Dynamic,
        ending: Ending,
        frames: &Frames,
    ) {
        let thin = Counter::thinning(&self.cfg);
        let skid = self.cfg.skid as usize;
        let cycles = d.cycles;
        let depth = self.cfg.depth;
        let mut fire = None;
        let (mut overflowed, mut thinned) = (false, false);
        let on_branches = self.cfg.branch_event == BranchEvent::Branches;
        // A range whose last instruction is no branch went elsewhere through the kernel
        // (`rt_sigreturn`): its LBR entry is the kernel's return, and no user-mode near
        // branch retired for the counter (module doc).
        if let (Ending::Taken { to }, true) = (ending, r.known() && r.last == Flow::Other) {
            self.thread(tid).since_entry += cycles;
            self.kernel_return(tid, to);
            return;
        }
        {
            let t = self.thread(tid);
            t.since_entry += cycles;
            if let Ending::Taken { to } = ending {
                let entry = BranchEntry::new(r.end, to, d.last_mispredicted, 0)
                    .with_type(r.last.perf_type());
                t.push(entry, depth);
                if let Some((left, w)) = t.branch_skid.as_mut() {
                    if *left == 0 {
                        fire = Some((to, *w));
                        t.branch_skid = None;
                    } else {
                        *left -= 1;
                    }
                }
                t.branches.left -= u64::from(on_branches);
                if t.branches.left == 0 {
                    overflowed = true;
                    let p = t.branches.period;
                    t.branches.left = p;
                    t.branches.counted += p;
                    match t.branches.thin.on_overflow(p, thin) {
                        Some(w) if skid == 0 => fire = Some((to, w)),
                        Some(w) => t.branch_skid = Some((skid as u32 - 1, w)),
                        None => thinned = true,
                    }
                }
            }
        }
        self.stats.branch_overflows += overflowed as u64;
        self.stats.thinned += thinned as u64;
        if let Some((ip, weight)) = fire {
            self.emit_stack(set, tid, ip, weight, &frames.after(ip));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::cycles::{Flow, Predictor};
    use crate::sim::shadow::{ContextTree, ThreadStack};

    /// A loop: range A [0x1000, 0x1008] (3 instructions, ends in a taken conditional
    /// back to 0x1000); every iteration is one taken branch 0x1008 → 0x1000.
    fn loop_range() -> RangeInfo {
        RangeInfo {
            start: 0x1000,
            end: 0x1008,
            n: 3,
            addrs: vec![0x1000, 0x1004, 0x1008],
            costs: vec![1, 3, 1],
            static_cycles: 5,
            conds: Vec::new(),
            last: Flow::Conditional,
            reps: Vec::new(),
        }
    }

    fn run(cfg: PmuConfig, iterations: u64) -> (SampleSet, Pmu, u64) {
        let mut set = SampleSet::new(cfg.depth - 1);
        let mut pmu = Pmu::new(cfg, 7);
        let mut pred = Predictor::default();
        let mut d = Dynamic::default();
        let r = loop_range();
        let tree = ContextTree::default();
        let frames = Frames {
            tree: &tree,
            before: ThreadStack::default(),
            after: ThreadStack::default(),
        };
        let mut cycles = 0;
        for _ in 0..iterations {
            pred.execute(&r, Ending::Taken { to: 0x1000 }, &mut d);
            cycles += d.cycles;
            pmu.on_range(&mut set, 7, &r, &d, Ending::Taken { to: 0x1000 }, &frames);
        }
        (set, pmu, cycles)
    }

    fn fixed(p: u64) -> PeriodPolicy {
        PeriodPolicy { base: p, jitter: 0 }
    }

    /// Every taken branch and every cycle sampled, LBR depth 4, periods as given.
    fn every_event() -> PmuConfig {
        PmuConfig {
            branch: fixed(1),
            cycles: fixed(1),
            depth: 4,
            perturbation: Perturbation::None,
            ..PmuConfig::default()
        }
    }

    #[test]
    fn period_one_samples_every_taken_branch_and_every_cycle() {
        let (set, pmu, cycles) = run(every_event(), 1000);
        assert_eq!(pmu.stats.branch_samples, 1000);
        assert_eq!(pmu.stats.ip_samples, cycles);
        let p = &set.processes[&7];
        // The first depth-1 samples are shallower than the window.
        assert_eq!(p.branches.short_samples, 3);
        // Each later sample adds 3 ranges of weight 1/3: the range count is exact.
        let r = p.branches.range(0x1000, 0x1008).unwrap();
        assert!((r.count - 997.0).abs() < 1e-9, "{r:?}");
        // Per-instruction cycles are exact: 1, 3 and 1 (+1 taken) per iteration,
        // after the predictor warmed up.
        let ips = &p.ips[&EventRole::Cycles];
        assert_eq!(ips.weight, cycles);
        assert_eq!(ips.by_ip[&0x1004].1, 3000);
        // The LBR entries carry the cycles since the previous entry.
        assert!(r.timed_hits > 0 && r.timed_cycles >= 6.0 * r.timed_count);
        // The loop range is timed 3 times in each sample's window: 997 samples.
        assert_eq!((r.timed_hits, r.timed_samples), (3 * 997, 997));
    }

    /// A call range [0x2000, 0x2004] to 0x3000 (return address 0x2009): cycle samples
    /// in it carry the caller's stack, branch samples taken at the call the callee's.
    #[test]
    fn samples_carry_the_stack_of_where_they_were_taken() {
        let r = RangeInfo {
            start: 0x2000,
            end: 0x2004,
            n: 2,
            addrs: vec![0x2000, 0x2004],
            costs: vec![1, 2],
            static_cycles: 3,
            conds: Vec::new(),
            last: Flow::Direct {
                ret_to: Some(0x2009),
            },
            reps: Vec::new(),
        };
        let mut tree = ContextTree::default();
        let outer = tree.transfer(
            ThreadStack::default(),
            Flow::Direct {
                ret_to: Some(0x1005),
            },
            0x2000,
        );
        let inner = tree.transfer(outer, r.last, 0x3000);
        let frames = Frames {
            tree: &tree,
            before: outer,
            after: inner,
        };
        let mut set = SampleSet::new(3);
        let mut pmu = Pmu::new(every_event(), 7);
        let mut d = Dynamic::default();
        Predictor::default().execute(&r, Ending::Taken { to: 0x3000 }, &mut d);
        pmu.on_range(&mut set, 7, &r, &d, Ending::Taken { to: 0x3000 }, &frames);
        let stacks = &set.processes[&7].stacks;
        assert_eq!(stacks.unstacked, 0);
        let user = |s: &CallStack| s.user.to_vec();
        let mut ip: Vec<(Vec<u64>, u64)> = stacks
            .iter()
            .filter_map(|(s, st)| st.ips.get(&EventRole::Cycles).map(|c| (user(&s), c.1)))
            .collect();
        ip.sort();
        // Every cycle of the range sampled (period 1), each under [ip, 0x1005].
        assert_eq!(
            ip,
            vec![
                (vec![0x2000, 0x1005], 1),
                (vec![0x2004, 0x1005], d.cycles - 1)
            ]
        );
        let branch: Vec<Vec<u64>> = stacks
            .iter()
            .filter(|(_, st)| st.branch_samples > 0)
            .map(|(s, _)| user(&s))
            .collect();
        assert_eq!(branch, vec![vec![0x3000, 0x2009, 0x1005]]);
        assert!(stacks
            .iter()
            .all(|(s, _)| s.end == crate::profile::StackEnd::Complete));
    }

    /// Where the kernel moved the thread — a signal handler starting, `rt_sigreturn` (a
    /// `syscall` whose range went elsewhere) — the LBR holds the kernel's return to user
    /// mode, from a kernel address, and the taken-branch counter does not count it.
    #[test]
    fn kernel_returns_are_recorded_from_the_kernel() {
        let mut pmu = Pmu::new(every_event(), 7);
        pmu.kernel_return(7, 0x5000);
        let sigreturn = RangeInfo {
            start: 0x6000,
            end: 0x6005,
            n: 2,
            addrs: vec![0x6000, 0x6005],
            costs: vec![1, 61],
            static_cycles: 62,
            conds: Vec::new(),
            last: Flow::Other,
            reps: Vec::new(),
        };
        let tree = ContextTree::default();
        let frames = Frames {
            tree: &tree,
            before: ThreadStack::default(),
            after: ThreadStack::default(),
        };
        let mut d = Dynamic::default();
        Predictor::default().execute(&sigreturn, Ending::Taken { to: 0x1234 }, &mut d);
        let mut set = SampleSet::new(1);
        pmu.on_range(
            &mut set,
            7,
            &sigreturn,
            &d,
            Ending::Taken { to: 0x1234 },
            &frames,
        );
        let t = &pmu.threads[&7];
        let newest: Vec<(u64, u64, u8)> = (0..t.filled)
            .map(|i| t.lbr[(t.head + i) % 4])
            .map(|e| (e.from, e.to, e.branch_type()))
            .collect();
        assert_eq!(
            newest,
            [
                (KERNEL_EXIT, 0x1234, branch_type::ERET),
                (KERNEL_EXIT, 0x5000, branch_type::ERET)
            ]
        );
        // The sigreturn range's cycles time the entry that ends it.
        assert_eq!(t.lbr[t.head].cycles() as u64, d.cycles);
        // Neither is a near branch of user mode: period 1, yet no branch sample.
        assert_eq!(pmu.stats.branch_samples, 0);
    }

    #[test]
    fn thinning_and_redraws_keep_total_weight_near_exact() {
        for perturbation in [Perturbation::Kernel, Perturbation::Both] {
            let cfg = PmuConfig {
                branch: fixed(101),
                cycles: PeriodPolicy::around(997),
                depth: 8,
                perturbation,
                thinning: 4,
                redraw_interval_ns: 1_000, // 3000 cycles: many re-draws
                ..PmuConfig::default()
            };
            let (set, pmu, cycles) = run(cfg, 200_000);
            let p = &set.processes[&7];
            let ips = &p.ips[&EventRole::Cycles];
            if perturbation == Perturbation::Kernel {
                // No re-draw: Σ weights + what is pending in the counter = all cycles.
                assert!(ips.weight <= cycles);
                assert!(
                    cycles - ips.weight < 2 * 997 * 4,
                    "{} of {cycles}",
                    ips.weight
                );
                assert_eq!(pmu.stats.redraws, 0);
            } else {
                // Re-draws restart the count (PERF_EVENT_IOC_PERIOD): each loses less
                // than one (re-drawn, ≤ 17/16 × base) period's progress; thinning holds
                // back at most the overflows since the last record.
                assert!(pmu.stats.redraws > 10, "{}", pmu.stats.redraws);
                let lost = cycles - ips.weight;
                let bound = pmu.stats.redraws * 997 * 17 / 16 + 2 * 4 * 997 * 17 / 16;
                assert!(lost <= bound, "lost {lost} > {bound}");
            }
            assert!(pmu.stats.thinned > 0);
            // One emitted record per ~K overflows.
            let rate = pmu.stats.cycle_overflows as f64 / pmu.stats.ip_samples as f64;
            assert!((3.0..5.0).contains(&rate), "{rate}");
        }
    }

    #[test]
    fn user_layer_redraws_prime_periods_in_band() {
        let cfg = PmuConfig {
            cycles: PeriodPolicy::around(1000),
            perturbation: Perturbation::User,
            redraw_interval_ns: 100,
            ..PmuConfig::default()
        };
        let (_, pmu, _) = run(cfg, 200_000);
        let t = &pmu.threads[&7];
        let p = t.cycles.period;
        assert!(
            cpi_common::policy::is_prime(p) && (1009..=1009 + 63 + 20).contains(&p),
            "{p}"
        );
        // A re-draw waits for the fewest periods of REDRAW_PERIODS counted by its
        // counter, however often the collector drains.
        assert!(pmu.stats.redraws > 10, "{}", pmu.stats.redraws);
        let overflows = pmu.stats.cycle_overflows + pmu.stats.branch_overflows;
        assert!(
            pmu.stats.redraws * cpi_common::policy::REDRAW_PERIODS.start() <= overflows,
            "{} re-draws for {overflows} overflows",
            pmu.stats.redraws
        );
    }
}
