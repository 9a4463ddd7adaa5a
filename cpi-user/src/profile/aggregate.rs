//! Per-process aggregation of wire samples, in runtime addresses. The collector and
//! the PMU model both feed a [`SampleSet`]; analysis reads it.
//!
//! Branch samples are reduced on arrival (the range window): of each sample's
//! entries e₁…eₙ (oldest → newest), the newest `window` ranges [eₖ.to, eₖ₊₁.from] and
//! the taken branch eₖ₊₁ that ends each are added with weight Q / window, Q being the
//! events the sample stands for ([`StackWeighting::Window`]). Stacks sampled on cycles
//! instead weigh Q / (cycles the window spans) ([`StackWeighting::CyclesSpanned`]).
//! Memory is bounded by distinct ranges, not samples. Each range also keeps its weight
//! per group of samples, for its error (`profile/error.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cpi_common::wire::{
    BranchEntry, BranchSample, EventRole, IpSample, FLAG_KERNEL, MAX_BRANCH_ENTRIES,
};

use super::error::{group_of, Groups, GROUPS};
use super::stack::{CallStack, StackAggregate};
use super::FastMap;
use crate::procmap::{CapturedFile, ProcessIdentity, ProcessMaps};

/// How each branch stack's ranges are weighted.
///
/// A stack sampled every Q taken branches covers `window` of them: each range stands
/// for Q / window executions (seed 000). A stack sampled every Q *cycles* is taken with
/// probability proportional to the cycles of the range the sample lands in, so ranges
/// ahead of slow code are over-represented; weighting the window by Q / (Σ cycles of its
/// ranges, from timed branch entries) makes each range count its executions again, up
/// to how well the window's cycles stand for those of the ranges sampled after it
/// (docs/METHOD.md, "Cycle-sampled branch stacks", gives the measured bias before and after).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackWeighting {
    /// Q / window: stacks sampled on retired taken branches.
    #[default]
    Window,
    /// Q / (cycles the window spans): stacks sampled on cycles with timed entries.
    /// Stacks with an untimed entry in the window are counted and left out.
    CyclesSpanned,
}

impl std::str::FromStr for StackWeighting {
    type Err = String;
    /// `window` or `cycles-spanned` (the CLI's names).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "window" => Ok(StackWeighting::Window),
            "cycles-spanned" => Ok(StackWeighting::CyclesSpanned),
            _ => Err(format!("`{s}`: expected window or cycles-spanned")),
        }
    }
}

impl StackWeighting {
    /// How the profile names it.
    pub fn describe(self) -> &'static str {
        match self {
            StackWeighting::Window => "each range weighs period / window",
            StackWeighting::CyclesSpanned => {
                "each range weighs period / cycles its window spans (timed entries), correcting cycle-sampled stacks"
            }
        }
    }
}

/// A taken branch (from, to) as recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TakenStat {
    /// Estimated executions (Σ Q / window).
    pub count: f64,
    /// Estimated mispredicted executions.
    pub mispredicts: f64,
    /// Sample occurrences.
    pub hits: u64,
}

/// A straight-line range [start, end] (both instruction addresses, end inclusive).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RangeStat {
    /// Estimated executions (Σ Q / window).
    pub count: f64,
    /// Sample occurrences.
    pub hits: u64,
    /// Σ w · LBR `cycles` over occurrences that carried them (timed LBR), w being the
    /// occurrence's weight in `count`: the cycles of the executions those occurrences
    /// stand for. Weighting matters when stacks are sampled on cycles: a window is picked
    /// with probability proportional to its cycles, so a plain mean over occurrences
    /// favours slow executions (measured with the PMU model: docs/METHOD.md, "Two CPI estimators").
    pub timed_cycles: f64,
    /// Σ w over the occurrences that carried cycles: the executions `timed_cycles` covers.
    pub timed_count: f64,
    /// Occurrences that carried cycles.
    pub timed_hits: u64,
    /// Samples whose window timed this range, each counted once however often the range
    /// repeats in it: the independent observations behind `timed_cycles` (a loop body
    /// timed 31 times in one window is one).
    pub timed_samples: u64,
    /// `count` per group of samples (the error model, `profile/error.rs`).
    pub count_groups: Groups,
    /// `timed_cycles` per group of samples.
    pub timed_cycles_groups: Groups,
    /// `timed_count` per group of samples.
    pub timed_count_groups: Groups,
}

/// Branch-record aggregate of one process.
#[derive(Clone, Debug, Default)]
pub struct BranchAggregate {
    /// Branch samples used (deep enough for the window).
    pub samples: u64,
    /// Σ Q over samples used.
    pub weight: u64,
    /// Taken branches by (from, to).
    taken: EdgeTable,
    /// Straight-line ranges by (first, last instruction address).
    ranges: RangeTable,
    /// Each range with the taken branch that ended it, (first, last, to) → (its slot in
    /// `ranges`, [`BACKWARD`] for a backward one; the branch's in `taken`): a record
    /// costs this one lookup, not one per table (BENCHMARKS.md, "PMU model /
    /// aggregation").
    ended: FastMap<(u64, u64, u64), (u32, u32)>,
    /// Samples with fewer than `window + 1` entries (dropped: counting them would
    /// weigh shallow samples differently).
    pub short_samples: u64,
    /// Ranges dropped at aggregation: running backwards.
    pub backward_ranges: u64,
    /// Samples left out under [`StackWeighting::CyclesSpanned`]: an entry of the window
    /// carries no cycles.
    pub untimed_samples: u64,
}

/// No range slot: the range runs backwards.
const BACKWARD: u32 = u32::MAX;

/// The taken branches of a [`BranchAggregate`], by (from, to).
#[derive(Clone, Debug, Default)]
struct EdgeTable {
    index: FastMap<(u64, u64), u32>,
    stats: Vec<TakenStat>,
}

/// The index of `key` in `index`; when new, `rows` (the table's row count, where the
/// caller pushes its row) and `true`.
fn index_or_add(index: &mut FastMap<(u64, u64), u32>, key: (u64, u64), rows: usize) -> (u32, bool) {
    let next = rows as u32;
    let i = *index.entry(key).or_insert(next);
    (i, i == next)
}

impl EdgeTable {
    /// The index of edge `key`, added empty when new.
    fn slot(&mut self, key: (u64, u64)) -> u32 {
        let (i, new) = index_or_add(&mut self.index, key, self.stats.len());
        if new {
            self.stats.push(TakenStat::default());
        }
        i
    }
}

/// The ranges of a [`BranchAggregate`], laid out for the per-record update: a small
/// index slot per range, its sums in one 56-byte entry, and its three per-group sums
/// side by side (one cache line a record where [`RangeStat`]'s three [`Groups`] took
/// three; `BranchAggregate::add` was 32 % of aggregating a branch sample, BENCHMARKS.md
/// "PMU model / aggregation"). Every sum takes the same additions in the same order as
/// [`RangeStat`]'s, so the figures are the same bits.
#[derive(Clone, Debug, Default)]
struct RangeTable {
    index: FastMap<(u64, u64), u32>,
    sums: Vec<RangeSums>,
    /// Per group: `count`, `timed_cycles`, `timed_count` (the [`RangeStat`] groups).
    groups: Vec<[[f32; 3]; GROUPS]>,
}

#[derive(Clone, Copy, Debug, Default)]
struct RangeSums {
    count: f64,
    hits: u64,
    timed_cycles: f64,
    timed_count: f64,
    timed_hits: u64,
    timed_samples: u64,
    /// The number (from 1) of the last sample that timed the range: it counts once in
    /// `timed_samples` however often it repeats in that sample.
    timed_in: u64,
}

impl RangeTable {
    /// The index of range `key`, added empty when new.
    fn slot(&mut self, key: (u64, u64)) -> usize {
        let (i, new) = index_or_add(&mut self.index, key, self.sums.len());
        if new {
            self.sums.push(RangeSums::default());
            self.groups.push([[0.0; 3]; GROUPS]);
        }
        i as usize
    }

    /// Range `i` as [`RangeStat`].
    fn stat(&self, i: usize) -> RangeStat {
        let (s, g) = (&self.sums[i], &self.groups[i]);
        let column = |k: usize| Groups(std::array::from_fn(|j| g[j][k]));
        RangeStat {
            count: s.count,
            hits: s.hits,
            timed_cycles: s.timed_cycles,
            timed_count: s.timed_count,
            timed_hits: s.timed_hits,
            timed_samples: s.timed_samples,
            count_groups: column(0),
            timed_cycles_groups: column(1),
            timed_count_groups: column(2),
        }
    }
}

/// IP samples of one process and one event role.
#[derive(Clone, Debug, Default)]
pub struct IpAggregate {
    /// IP samples received.
    pub samples: u64,
    /// Σ periods (events, or ns for cpu-clock).
    pub weight: u64,
    /// `weight` per group of samples (its error, `profile/error.rs`).
    pub weight_groups: Groups,
    /// ip → (samples, Σ periods, Σ periods per group of samples). The groups are kept
    /// for the events CPI divides (cycles, instructions), not for `cpu-clock`, whose
    /// time profile shows no ±: an always-on agent's per-address state stays small.
    pub by_ip: FastMap<u64, (u64, u64, Option<Box<Groups>>)>,
    /// Samples whose IP was in kernel mode ([`FLAG_KERNEL`]).
    pub kernel_samples: u64,
}

impl IpAggregate {
    /// Counts one IP sample with its period, per group of samples too when `grouped`.
    pub fn add(&mut self, s: &IpSample, grouped: bool) {
        let h = &s.header;
        let group = group_of(self.samples);
        self.samples += 1;
        self.weight += h.period;
        self.weight_groups.add(group, h.period as f64);
        if h.flags & FLAG_KERNEL != 0 {
            self.kernel_samples += 1;
        }
        let e = self.by_ip.entry(h.ip).or_default();
        e.0 += 1;
        e.1 += h.period;
        if grouped {
            e.2.get_or_insert_default().add(group, h.period as f64);
        }
    }
}

/// Why a branch sample contributes no ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WindowSkip {
    /// Fewer than `window + 1` entries.
    Short,
    /// [`StackWeighting::CyclesSpanned`]: an entry of the window carries no cycles.
    Untimed,
}

/// The window of one branch sample: the weight each of its ranges gets and its newest
/// `window + 1` entries (newest first), or why it has none. The one reading of a sample's
/// window: the process's ranges ([`BranchAggregate::add`]) and its call path's
/// (cpi-user/src/profile/stack.rs) both come from it.
pub(crate) fn sample_window(
    s: &BranchSample,
    window: usize,
    weighting: StackWeighting,
) -> Result<(f64, &[BranchEntry]), WindowSkip> {
    let entries = s.entries(); // newest first
    let window = window.max(1);
    if entries.len() < window + 1 {
        return Err(WindowSkip::Short);
    }
    let span = match weighting {
        StackWeighting::Window => window as f64,
        StackWeighting::CyclesSpanned => {
            // Entry i carries the cycles of the range it ends (Skylake's LBR_INFO
            // cycle count; saturated counts are a lower bound and kept).
            let c = &entries[..window];
            if c.iter().any(|e| e.cycles() == 0) {
                return Err(WindowSkip::Untimed);
            }
            c.iter().map(|e| e.cycles() as f64).sum()
        }
    };
    Ok((s.header.period as f64 / span, &entries[..=window]))
}

impl BranchAggregate {
    /// Adds one branch sample using its newest `window` ranges, weighted as `weighting`
    /// says.
    pub fn add(&mut self, s: &BranchSample, window: usize, weighting: StackWeighting) {
        let (w, entries) = match sample_window(s, window, weighting) {
            Ok(x) => x,
            Err(WindowSkip::Short) => {
                self.short_samples += 1;
                return;
            }
            Err(WindowSkip::Untimed) => {
                self.untimed_samples += 1;
                return;
            }
        };
        let group = group_of(self.samples);
        self.samples += 1;
        self.weight += s.header.period;
        // entries[i + 1] is older than entries[i]: range [older.to, newer.from], ended
        // by the taken branch `newer`.
        let number = self.samples;
        // Every record's slots first, then every record's sums: the lookups of a
        // window miss the caches independently, so apart they overlap.
        let mut slots = [(0, 0); MAX_BRANCH_ENTRIES];
        for (slot, pair) in slots.iter_mut().zip(entries.windows(2)) {
            *slot = self.slots_of(&pair[0], &pair[1]);
        }
        for (&(i, e), pair) in slots.iter().zip(entries.windows(2)) {
            let newer = &pair[0];
            let t = &mut self.taken.stats[e as usize];
            t.count += w;
            t.hits += 1;
            if newer.mispred() {
                t.mispredicts += w;
            }
            if i == BACKWARD {
                self.backward_ranges += 1;
                continue;
            }
            let i = i as usize;
            let (r, g) = (&mut self.ranges.sums[i], &mut self.ranges.groups[i][group]);
            r.count += w;
            r.hits += 1;
            g[0] += w as f32;
            let c = newer.cycles() as f64;
            if c != 0.0 {
                r.timed_cycles += w * c;
                r.timed_count += w;
                r.timed_hits += 1;
                if r.timed_in != number {
                    r.timed_in = number;
                    r.timed_samples += 1;
                }
                g[1] += (w * c) as f32;
                g[2] += w as f32;
            }
        }
    }

    /// The slots of the range [older.to, newer.from] ([`BACKWARD`] when it runs
    /// backwards) and of the taken branch `newer` that ended it, added when new.
    fn slots_of(&mut self, newer: &BranchEntry, older: &BranchEntry) -> (u32, u32) {
        let key = (older.to, newer.from, newer.to);
        if let Some(&at) = self.ended.get(&key) {
            return at;
        }
        let i = match older.to > newer.from {
            true => BACKWARD,
            false => self.ranges.slot((older.to, newer.from)) as u32,
        };
        let e = self.taken.slot((newer.from, newer.to));
        self.ended.insert(key, (i, e));
        (i, e)
    }

    /// The straight-line ranges, by (first, last instruction address); in no order.
    pub fn ranges(&self) -> impl Iterator<Item = ((u64, u64), RangeStat)> + '_ {
        self.ranges
            .index
            .iter()
            .map(|(&k, &i)| (k, self.ranges.stat(i as usize)))
    }

    /// The range [first, last], if it was seen.
    pub fn range(&self, first: u64, last: u64) -> Option<RangeStat> {
        let i = *self.ranges.index.get(&(first, last))?;
        Some(self.ranges.stat(i as usize))
    }

    /// Distinct ranges seen.
    pub fn range_count(&self) -> usize {
        self.ranges.sums.len()
    }

    /// The taken branches, by (from, to); in no order.
    pub fn taken(&self) -> impl Iterator<Item = (&(u64, u64), &TakenStat)> + '_ {
        let stats = &self.taken.stats;
        self.taken
            .index
            .iter()
            .map(move |(k, &i)| (k, &stats[i as usize]))
    }

    /// The taken branch (from, to), if it was seen.
    pub fn taken_edge(&self, from: u64, to: u64) -> Option<&TakenStat> {
        let i = *self.taken.index.get(&(from, to))?;
        Some(&self.taken.stats[i as usize])
    }

    /// Distinct taken branches seen.
    pub fn taken_count(&self) -> usize {
        self.taken.stats.len()
    }
}

/// Everything gathered for one process.
#[derive(Clone, Debug, Default)]
pub struct ProcessSamples {
    /// Process id (tgid).
    pub pid: u32,
    /// Process name; filled in by the collector or the importer, never left empty.
    pub comm: String,
    /// Start time (clock ticks since boot, `/proc/PID/stat`) read while it lived: with
    /// the pid, what tells it from a later process given the same pid. `None` when it was
    /// gone before it could be read, or for recordings made elsewhere.
    pub start: Option<u64>,
    /// Cgroup, container and pod, read when the process was first seen; `None` when it
    /// was gone by then, or for recordings made elsewhere.
    pub identity: Option<ProcessIdentity>,
    /// Mappings as last read (kept after exit).
    pub maps: Option<ProcessMaps>,
    /// Files of executable mappings opened while the process lived, by mapping start
    /// ([`crate::procmap::CapturedFiles`]): analysis reads these first.
    pub files: HashMap<u64, Arc<CapturedFile>>,
    /// The branch samples, reduced to ranges and taken branches.
    pub branches: BranchAggregate,
    /// The IP samples, per event role.
    pub ips: BTreeMap<EventRole, IpAggregate>,
    /// Call stacks of the samples that carried one.
    pub stacks: StackAggregate,
}

/// All processes of a run.
#[derive(Clone, Debug)]
pub struct SampleSet {
    /// Ranges used per branch sample (the range window).
    pub window: usize,
    /// How each sample's ranges are weighted.
    pub weighting: StackWeighting,
    /// By pid.
    pub processes: BTreeMap<u32, ProcessSamples>,
    /// Bound on the (estimated) bytes the stacks of all processes hold together: past
    /// it the least recently used stacks of any process are evicted and their samples
    /// counted ([`StackAggregate::dropped`]).
    pub stack_bytes: usize,
    /// Bytes the stacks hold now.
    stack_held: usize,
    /// Ticks once per sample with a stack: when each stack was last used.
    stack_clock: u64,
}

impl SampleSet {
    /// An empty set using the newest `window` ranges of each branch sample (at least 1).
    pub fn new(window: usize) -> Self {
        SampleSet {
            window: window.max(1),
            weighting: StackWeighting::Window,
            processes: BTreeMap::new(),
            stack_bytes: super::stack::DEFAULT_STACK_BYTES,
            stack_held: 0,
            stack_clock: 0,
        }
    }

    /// An empty set like this one (window, weighting, stack bound), for the next window.
    pub fn empty_like(&self) -> Self {
        SampleSet {
            weighting: self.weighting,
            stack_bytes: self.stack_bytes,
            ..SampleSet::new(self.window)
        }
    }

    /// Estimated bytes the stacks of all processes hold (at most [`Self::stack_bytes`]).
    #[cfg(test)]
    pub(crate) fn stack_held(&self) -> usize {
        self.stack_held
    }

    /// Samples whose stacks were evicted to stay within [`Self::stack_bytes`].
    pub fn stacks_evicted(&self) -> u64 {
        self.processes.values().map(|p| p.stacks.evicted).sum()
    }

    /// The process `pid`, added empty when new.
    pub fn process(&mut self, pid: u32) -> &mut ProcessSamples {
        self.processes.entry(pid).or_insert_with(|| ProcessSamples {
            pid,
            ..Default::default()
        })
    }

    /// Adds to the stacks of `pid` with `f` (given the clock), then keeps every
    /// process's stacks together within [`Self::stack_bytes`].
    fn add_stacked(&mut self, pid: u32, f: impl FnOnce(&mut StackAggregate, u64)) {
        self.stack_clock += 1;
        let now = self.stack_clock;
        let stacks = &mut self.process(pid).stacks;
        let before = stacks.bytes();
        f(stacks, now);
        let after = stacks.bytes();
        self.stack_held = self.stack_held + after - before;
        if self.stack_held > self.stack_bytes {
            self.evict_stacks();
        }
    }

    /// Evicts the least recently used stacks, of whichever processes, until the rest
    /// take at most 3/4 of the bound (so eviction, which sorts, runs once per many
    /// samples). Evicted stacks fold into their callers' `[rare callees]` stacks
    /// first; where what those keep leaves the rest over 7/8 (a fold grows with every
    /// stack under its caller), the least recently used go to `[dropped]` whole, down
    /// to 3/4: eviction stays rare (once per 1/8 of the bound at most), where folds that
    /// freed nothing would have made every sample evict.
    fn evict_stacks(&mut self) {
        let target = self.stack_bytes / 4 * 3;
        self.evict_to(target, true);
        if self.stack_held > self.stack_bytes / 8 * 7 {
            self.evict_to(target, false);
        }
    }

    /// One eviction of the least recently used stacks down to `target` bytes, folding
    /// them into their callers or not.
    fn evict_to(&mut self, target: usize, fold: bool) {
        let mut ages: Vec<(u64, usize)> = self
            .processes
            .values()
            .flat_map(|p| p.stacks.ages())
            .collect();
        ages.sort_unstable_by_key(|a| a.0);
        let (mut held, mut cut) = (self.stack_held, 0);
        for (used, bytes) in ages {
            if held <= target {
                break;
            }
            held = held.saturating_sub(bytes);
            cut = used;
        }
        let mut now_held = 0;
        for p in self.processes.values_mut() {
            p.stacks.evict_used_by(cut, fold);
            now_held += p.stacks.bytes();
        }
        self.stack_held = now_held;
    }

    /// Adds a branch sample to its process ([`BranchAggregate::add`]).
    pub fn add_branch(&mut self, s: &BranchSample) {
        self.add_branch_with_stack(s, None);
    }

    /// Adds a branch sample and, when it carried one, its call stack.
    pub fn add_branch_with_stack(&mut self, s: &BranchSample, stack: Option<&CallStack>) {
        let (window, weighting) = (self.window, self.weighting);
        let p = self.process(s.header.tgid);
        // The group the process's aggregate gives the sample (when its window counts).
        let group = group_of(p.branches.samples);
        p.branches.add(s, window, weighting);
        match stack {
            Some(stack) => self.add_stacked(s.header.tgid, |a, now| {
                a.add_branch(stack, sample_window(s, window, weighting).ok(), group, now)
            }),
            None => p.stacks.unstacked += 1,
        }
    }

    /// Adds an IP sample under its event role; records with an unknown role are
    /// returned as an error so the caller counts them as malformed.
    pub fn add_ip(&mut self, s: &IpSample) -> Result<(), u32> {
        self.add_ip_with_stack(s, None)
    }

    /// Adds an IP sample ([`Self::add_ip`]) and, when it carried one, its call stack.
    pub fn add_ip_with_stack(
        &mut self,
        s: &IpSample,
        stack: Option<&CallStack>,
    ) -> Result<(), u32> {
        let role = EventRole::from_u32(s.header.event).ok_or(s.header.event)?;
        let p = self.process(s.header.tgid);
        let ips = p.ips.entry(role).or_default();
        let group = group_of(ips.samples);
        ips.add(s, role != EventRole::CpuClock);
        match stack {
            Some(stack) => self.add_stacked(s.header.tgid, |a, now| {
                a.add_ip(stack, role, s.header.period, group, now)
            }),
            None => p.stacks.unstacked += 1,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpi_common::wire::{BranchEntry, SampleHeader};

    fn sample(period: u64, newest_first: &[BranchEntry]) -> BranchSample {
        let header = SampleHeader {
            tgid: 7,
            period,
            ..Default::default()
        };
        BranchSample::new(header, newest_first)
    }

    #[test]
    fn window_ranges_are_weighted_by_period_over_window() {
        // Oldest → newest: 0x10→0x100, 0x120→0x200, 0x230→0x300, 0x310→0x400.
        let e = [
            BranchEntry::new(0x310, 0x400, true, 9),
            BranchEntry::new(0x230, 0x300, false, 0),
            BranchEntry::new(0x120, 0x200, false, 5),
            BranchEntry::new(0x10, 0x100, false, 0),
        ];
        let mut set = SampleSet::new(2);
        set.add_branch(&sample(1000, &e));
        let b = &set.processes[&7].branches;
        assert_eq!(b.samples, 1);
        // Only the newest two ranges: [0x300,0x310] and [0x200,0x230].
        assert_eq!(b.range_count(), 2);
        assert_eq!(b.range(0x300, 0x310).unwrap().count, 500.0);
        assert_eq!(b.range(0x300, 0x310).unwrap().timed_cycles, 500.0 * 9.0);
        assert_eq!(b.range(0x300, 0x310).unwrap().timed_count, 500.0);
        assert_eq!(b.range(0x200, 0x230).unwrap().timed_hits, 0);
        assert!(b.range(0x100, 0x120).is_none());
        assert_eq!(b.taken_edge(0x310, 0x400).unwrap().mispredicts, 500.0);
        assert_eq!(b.taken_edge(0x230, 0x300).unwrap().count, 500.0);
        // A sample too shallow for the window is counted, not used.
        set.add_branch(&sample(1000, &e[..2]));
        assert_eq!(set.processes[&7].branches.short_samples, 1);
    }

    /// A path's cycles error is that of its share of the process's samples: its groups
    /// follow the process's sample numbering. Numbering the path's own samples gave every
    /// group the same count and an error about 1/7 of the true one (`diff` then
    /// flagged an unchanged path between two builds as changed).
    #[test]
    fn a_path_gets_the_error_of_its_share_of_the_samples() {
        use crate::profile::error;
        use crate::profile::stack::StackEnd;
        let stack = |leaf: u64| CallStack {
            kernel: Box::new([]),
            user: [leaf, 2, 3].into(),
            end: StackEnd::Complete,
        };
        let cycles = IpSample {
            header: SampleHeader {
                tgid: 1,
                period: 1000,
                event: EventRole::Cycles as u32,
                ..Default::default()
            },
        };
        let mut set = SampleSet::new(1);
        // 20 000 samples, each under path 7 or 8 by a fixed pseudo-random draw (p = ½).
        let mut x = 12345u64;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let leaf = 7 + (x >> 63);
            set.add_ip_with_stack(&cycles, Some(&stack(leaf))).unwrap();
        }
        let path = set.processes[&1].stacks.get(&stack(7)).unwrap();
        let n = path.ips[&EventRole::Cycles].0 as f64;
        let rel = error::relative(n * 1000.0, path.cycles_groups.variance());
        // Binomial: √((1 − p) / (n·p)) with p ≈ ½ is ≈ 0.71 %; the replicate estimate
        // from 32 groups is within about ±30 % of it.
        let binomial = ((20_000.0 - n) / 20_000.0 / n).sqrt();
        assert!(
            (0.5 * binomial..1.6 * binomial).contains(&rel),
            "path error {rel}, binomial {binomial}"
        );
    }

    #[test]
    fn stack_bound_evicts_least_recently_used_of_any_process() {
        use crate::profile::stack::StackEnd;
        let stack = |user: &[u64]| CallStack {
            kernel: Box::new([]),
            user: user.into(),
            end: StackEnd::Complete,
        };
        let ip = |tgid: u32| IpSample {
            header: SampleHeader {
                tgid,
                period: 1,
                event: EventRole::CpuClock as u32,
                ..Default::default()
            },
        };
        let mut set = SampleSet::new(1);
        // Room for about ten stacks (measured on one).
        set.add_ip_with_stack(&ip(1), Some(&stack(&[7, 7, 7])))
            .unwrap();
        set.stack_bytes = set.stack_held() * 10;
        // Process 1 uses its one stack again and again; process 2 brings 30 new ones.
        for i in 0..30u64 {
            set.add_ip_with_stack(&ip(1), Some(&stack(&[7, 7, 7])))
                .unwrap();
            set.add_ip_with_stack(&ip(2), Some(&stack(&[i + 100, 2, 3])))
                .unwrap();
        }
        assert!(set.stack_held() <= set.stack_bytes);
        let held: usize = set.processes.values().map(|p| p.stacks.bytes()).sum();
        assert_eq!(held, set.stack_held(), "the running total is the sum");
        let (one, two) = (&set.processes[&1].stacks, &set.processes[&2].stacks);
        assert!(one.get(&stack(&[7, 7, 7])).is_some(), "the hot stack stays");
        assert!(two.get(&stack(&[129, 2, 3])).is_some(), "the newest stays");
        assert!(two.get(&stack(&[100, 2, 3])).is_none(), "the oldest went");
        let kept: u64 = [one, two]
            .iter()
            .flat_map(|a| a.iter())
            .map(|(_, s)| s.samples())
            .sum();
        let dropped = one.dropped.samples() + two.dropped.samples();
        assert_eq!(kept + dropped, 61, "every sample kept or counted");
        // The evicted went under their callers, which the newest stacks still hold.
        let rare = two.get(&stack(&[super::super::stack::FOLDED_LEAF, 2, 3]));
        assert_eq!(
            rare.map(|s| s.samples()),
            Some(set.stacks_evicted()),
            "folded"
        );
        assert!(set.stacks_evicted() > 0 && dropped == 0);
        // The next window starts empty, with the same bound.
        let next = set.empty_like();
        assert_eq!((next.stack_bytes, next.stack_held()), (set.stack_bytes, 0));
    }

    #[test]
    fn cycles_spanned_weighs_the_window_by_its_cycles() {
        // Oldest → newest; the newest two entries carry 30 and 10 cycles.
        let e = [
            BranchEntry::new(0x310, 0x400, false, 10),
            BranchEntry::new(0x230, 0x300, false, 30),
            BranchEntry::new(0x120, 0x200, false, 0),
        ];
        let mut set = SampleSet::new(2);
        set.weighting = StackWeighting::CyclesSpanned;
        set.add_branch(&sample(1000, &e));
        let b = &set.processes[&7].branches;
        // 1000 cycles over a 40-cycle window: it repeated 25 times.
        assert_eq!(b.range(0x300, 0x310).unwrap().count, 25.0);
        assert_eq!(b.range(0x200, 0x230).unwrap().count, 25.0);
        // An untimed entry inside the window: left out, counted.
        let untimed = [e[0], BranchEntry::new(0x230, 0x300, false, 0), e[2]];
        set.add_branch(&sample(1000, &untimed));
        let b = &set.processes[&7].branches;
        assert_eq!((b.samples, b.untimed_samples), (1, 1));
    }

    #[test]
    fn backward_range_is_dropped_and_counted() {
        let e = [
            BranchEntry::new(0x100, 0x500, false, 0),
            BranchEntry::new(0x10, 0x200, false, 0),
        ];
        let mut set = SampleSet::new(1);
        set.add_branch(&sample(10, &e));
        let b = &set.processes[&7].branches;
        assert_eq!(b.backward_ranges, 1);
        assert_eq!(b.range_count(), 0);
        assert_eq!(
            b.taken_edge(0x100, 0x500).unwrap().count,
            10.0,
            "the taken edge itself is valid"
        );
    }
}
