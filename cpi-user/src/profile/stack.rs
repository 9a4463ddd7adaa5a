//! Call stacks of samples, aggregated per process in runtime addresses.
//!
//! Every source of samples hands a sample's stack over as a [`CallStack`]: the collector
//! after unwinding (cpi-user/src/unwind/), the PMU model from its exact shadow stack
//! (cpi-user/src/sim/), the importers from recorded callchains (cpi-user/src/import/).
//! Analysis (cpi-user/src/profile/analyze.rs) symbolises the stacks into
//! [`crate::profile::model::StackProfile`]s.
//!
//! Per stack it keeps the IP samples (count, Σ period, and Σ cycles per group of samples
//! for the error model, cpi-user/src/profile/error.rs) and the ranges of the branch
//! samples taken under it (each weighted as the process's ranges are,
//! `super::aggregate::sample_window`), so analysis can give each call path its own
//! instructions and CPI.
//!
//! Memory is bounded by the set that holds the aggregates
//! ([`super::aggregate::SampleSet::stack_bytes`], over all its processes together): past
//! it the least recently used stacks of any process go: their samples and ranges fold
//! into a `[rare callees]` stack under their nearest kept caller, or into
//! [`StackAggregate::dropped`] where none is kept, counted in
//! [`StackAggregate::evicted`], never silently.

use std::collections::BTreeMap;

use cpi_common::wire::{BranchEntry, EventRole, MAX_BRANCH_ENTRIES};
use serde::{Deserialize, Serialize};

use super::error::Groups;
use super::intern::{StackTrie, NODE_BYTES, NONE};
use super::FastMap;

/// Default bound on the stacks of all processes of one sample set, in (estimated) bytes.
pub(crate) const DEFAULT_STACK_BYTES: usize = 32 << 20;

/// How unwinding a stack ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum StackEnd {
    /// The outermost frame was reached (no caller left to find).
    #[default]
    Complete,
    /// Stopped at the frame limit, the end of the copied stack bytes, where going on
    /// would cost too much (unwind rules no compiler writes, cpi-user/src/unwind/cost.rs;
    /// the collector's unwinding time per pass spent, cpi-user/src/collect/drain.rs), or
    /// at a zero frame pointer in a file whose unwind sections were not read (it may go
    /// on: cpi-user/src/unwind/mod.rs `Stop::Unread`).
    Truncated,
    /// Stopped at code without unwind information (JIT, anonymous memory): the last
    /// frame is where it stopped; nothing past it is invented.
    UnknownCode,
    /// Unwinding failed (unreadable stack, corrupt unwind information, a cycle).
    Error,
}

impl StackEnd {
    /// The end whose index (`end as u64`) is `i`: how the stack trie's roots keep it.
    pub(crate) fn from_index(i: u64) -> Self {
        match i {
            1 => StackEnd::Truncated,
            2 => StackEnd::UnknownCode,
            3 => StackEnd::Error,
            _ => StackEnd::Complete,
        }
    }
}

impl From<crate::unwind::Stop> for StackEnd {
    /// How a stack the unwinder stopped on ends.
    fn from(stop: crate::unwind::Stop) -> Self {
        use crate::unwind::Stop;
        match stop {
            Stop::Root => StackEnd::Complete,
            Stop::FrameLimit | Stop::EndOfCopy | Stop::CostlyRules | Stop::Unread => {
                StackEnd::Truncated
            }
            Stop::UnknownCode => StackEnd::UnknownCode,
            Stop::Unreadable | Stop::BadUnwind => StackEnd::Error,
        }
    }
}

/// One sample's call stack, leaf first, in runtime addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CallStack {
    /// Kernel frames, leaf first, as the kernel's unwinder reports them (entry 0 the
    /// interrupted kernel IP); empty for user-mode samples.
    pub kernel: Box<[u64]>,
    /// User frames, leaf first: entry 0 is the interrupted user IP, the rest return
    /// addresses (symbolise `addr - 1`, the call instruction).
    pub user: Box<[u64]>,
    /// How unwinding the user stack ended.
    pub end: StackEnd,
}

/// A range [start, end] that ran under one stack, weighted like the process's ranges.
/// `repr(C)` keeps the sums a record adds to ahead of the groups, beside its row's
/// `last_use` (`RangeRow`).
#[derive(Clone, Debug, Default, PartialEq)]
#[repr(C)]
pub struct StackRange {
    /// Estimated executions (Σ period / window).
    pub count: f64,
    /// Occurrences.
    pub hits: u64,
    /// `count` per group of the stack's branch samples.
    pub groups: Groups,
}

/// What ran under one call stack.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackStat {
    /// IP samples and Σ periods per event role.
    pub ips: BTreeMap<EventRole, (u64, u64)>,
    /// Σ cycles periods per group of the stack's cycles samples (its error).
    pub cycles_groups: Groups,
    /// Branch samples taken under the stack.
    pub branch_samples: u64,
    /// The ranges of those samples' windows, as rows of the aggregate's
    /// [`StackAggregate::rows`], in the order first seen; each range once
    /// ([`StackAggregate::ranges_of`] reads them).
    rows: Vec<u32>,
    /// When the stack's own samples were last counted (the aggregate's clock); its
    /// ranges keep their own ([`RangeRow::last_use`]).
    last_use: u64,
}

/// A range under a stack, with when it was last counted: all a record of a window
/// touches besides its key, so a record reads no [`StackStat`] (the store of its
/// `last_use` was 9–12 % of `add_branch`, BENCHMARKS.md "PMU model / aggregation").
#[derive(Clone, Debug, Default)]
#[repr(C)]
struct RangeRow {
    /// When the range was last counted under the stack, for eviction.
    last_use: u64,
    /// (first, last instruction address).
    range: (u64, u64),
    stat: StackRange,
}

impl StackStat {
    /// Samples of every kind under the stack.
    pub fn samples(&self) -> u64 {
        self.ips.values().map(|v| v.0).sum::<u64>() + self.branch_samples
    }
}

/// The stacks of one process.
#[derive(Clone, Debug, Default)]
pub struct StackAggregate {
    /// The stacks seen, and the frames they share ([`super::intern`]).
    trie: StackTrie,
    /// What ran under each stack that has samples, with its node; a node's payload is
    /// its index here.
    stats: Vec<(u32, StackStat)>,
    /// The ranges that ran under each stack, a row each (listed by the stack's
    /// [`StackStat`]).
    rows: Vec<RangeRow>,
    /// Where each range that ran under a stack is counted: its [`RangeKey`] → its row.
    /// A range's rebuilt stack is keyed by its callers' node, so a range costs this one
    /// lookup, not the trie's child as well (the two were 46 % of aggregating a branch
    /// sample, BENCHMARKS.md "PMU model / aggregation").
    ranges_at: FastMap<RangeKey, u32>,
    /// Samples that carried no stack (the writer could not take one).
    pub unstacked: u64,
    /// What ran under the stacks evicted to stay within the set's bound with no kept
    /// caller to fold into (IP samples and periods, branch samples; no ranges).
    pub dropped: StackStat,
    /// Samples whose stacks were evicted: folded into a `[rare callees]` stack or
    /// [`Self::dropped`] (each counted once, however often its fold rises).
    pub evicted: u64,
    /// Estimated bytes held.
    bytes: usize,
}

/// A range under a stack, (stack, first, last): the stack as the edge that reaches its
/// node ([`StackTrie::edge`]: the callers' node and the leaf, which is the range's
/// first address wherever the stack was rebuilt), or as [`OWN`] | its node where its
/// leaf is not the range's first address or it has no edge. Each (node, range) has
/// one key.
type RangeKey = (u64, u64, u64);

/// The leaf of a `[rare callees]` stack: what evicted stacks held under its callers
/// ([`StackAggregate::evict_used_by`]); no code is at this address.
pub(crate) const FOLDED_LEAF: u64 = u64::MAX;

/// Marks a [`RangeKey`] whose stack is a node, not an edge (node ids are `u32`).
const OWN: u64 = 1 << 32;
/// The longest x86 instruction: a call whose target lies within this many bytes after
/// it went to its own next instruction.
const MAX_INSN_LEN: u64 = 15;

/// Estimated heap bytes of one stack's statistics (its frames are the trie's).
fn stat_bytes(stat: &StackStat) -> usize {
    // Hash-table slots carry their key and value plus about one control byte and load
    // slack: counted as 1.5× the slot; each range has one in `ranges_at`, and a row.
    size_of::<(u32, StackStat)>()
        + stat.ips.len() * 48
        + stat.rows.capacity() * size_of::<u32>()
        + stat.rows.len() * (size_of::<RangeRow>() + size_of::<(RangeKey, u32)>() * 3 / 2)
}

impl StackAggregate {
    /// Estimated bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Stacks held.
    pub fn len(&self) -> usize {
        self.stats.len()
    }

    /// Whether no stack is held.
    pub fn is_empty(&self) -> bool {
        self.stats.is_empty()
    }

    /// The stacks held, each built from the trie, with what ran under it; in no order.
    pub fn iter(&self) -> impl Iterator<Item = (CallStack, &StackStat)> + '_ {
        self.stats.iter().map(|(id, s)| (self.trie.stack(*id), s))
    }

    /// What ran under `stack`, if it is held.
    pub fn get(&self, stack: &CallStack) -> Option<&StackStat> {
        let p = self.trie.payload(self.trie.find(stack)?);
        self.stats.get(p as usize).map(|s| &s.1)
    }

    /// The ranges that ran under a stack of this aggregate (`stat`, from [`Self::iter`]
    /// or [`Self::get`]), by (first, last instruction address), in the order first seen.
    pub fn ranges_of<'a>(
        &'a self,
        stat: &'a StackStat,
    ) -> impl ExactSizeIterator<Item = (&'a (u64, u64), &'a StackRange)> + 'a {
        stat.rows.iter().map(|&j| {
            let row = &self.rows[j as usize];
            (&row.range, &row.stat)
        })
    }

    /// The node of `stack`, added when new, and its user frames' base (the node of its
    /// kernel frames).
    fn intern(&mut self, stack: &CallStack, added: &mut usize) -> (u32, u32) {
        let base = self.trie.kernel_base(stack, added);
        (self.trie.push_user(base, &stack.user, added), base)
    }

    /// Counts an IP sample of `role` with weight `period` under `stack`; `group` is the
    /// sample's group among its process's samples of that role (`error::group_of`), so
    /// a path's group sums vary as its share of the samples does; `now` is the holder's
    /// clock, for eviction.
    pub fn add_ip(
        &mut self,
        stack: &CallStack,
        role: EventRole,
        period: u64,
        group: usize,
        now: u64,
    ) {
        let mut added = 0;
        let (id, _) = self.intern(stack, &mut added);
        self.bytes += added * NODE_BYTES;
        self.update(id, now, |s| {
            let e = s.ips.entry(role).or_default();
            if role == EventRole::Cycles {
                s.cycles_groups.add(group, period as f64);
            }
            e.0 += 1;
            e.1 += period;
        });
    }

    /// Counts a branch sample under `stack` with its window
    /// (`super::aggregate::sample_window`: the weight of each range and the entries,
    /// newest first), `None` when the sample gives no ranges.
    ///
    /// Each range goes to the stack it ran under. Where the entries say which branches
    /// are calls and returns (`PERF_BR_*` types: the PMU model's entries, LBRs recorded
    /// with `save_type`), that stack is rebuilt walking the window from the newest entry
    /// back, starting from the sample's stack: undoing a call pops the callee's frame,
    /// undoing a return pushes the frame it left, other branches move the leaf; the leaf
    /// of a range's stack is the range's first address. Where they do not (or the walk
    /// runs out of known frames), the rest of the window's ranges go to the sample's own
    /// stack and analysis assigns them by function (cpi-user/src/profile/analyze.rs).
    ///
    /// `group` is the sample's group among its process's branch samples, as for
    /// [`Self::add_ip`]: numbering a path's own samples instead would give each group an
    /// equal count and hide the error of how many samples the path got.
    pub fn add_branch(
        &mut self,
        stack: &CallStack,
        window: Option<(f64, &[BranchEntry])>,
        group: usize,
        now: u64,
    ) {
        let mut added = 0;
        let (id, base) = self.intern(stack, &mut added);
        self.update(id, now, |s| s.branch_samples += 1);
        if let Some((w, entries)) = window {
            // The rebuilt stack (no kernel frames) as its callers' node and its leaf: a
            // range's stack is one lookup away. Without kernel frames the callers' node
            // is the stack's parent, found without a lookup.
            let mut rebuilt = stack.user.split_first().map(|(&leaf, callers)| {
                let node = match stack.kernel.is_empty() {
                    true => self.trie.user_parent(id).unwrap_or(base),
                    false => {
                        let root = self.trie.root(stack.end, &mut added);
                        self.trie.push_user(root, callers, &mut added)
                    }
                };
                (node, leaf)
            });
            // The window's keys, then their rows, then the sums: the lookups miss the
            // caches independently, so apart they overlap (as in `BranchAggregate::add`).
            let mut keys = [(0, 0, 0); MAX_BRANCH_ENTRIES];
            let mut n = 0;
            for pair in entries.windows(2) {
                let (newer, older) = (&pair[0], &pair[1]);
                rebuilt = rebuilt.and_then(|r| self.undo(r, newer, &mut added));
                // Backward ranges are counted by the process's aggregate.
                if older.to > newer.from {
                    continue;
                }
                let range = (older.to, newer.from);
                keys[n] = match rebuilt {
                    Some((callers, _)) => (u64::from(callers), range.0, range.1),
                    None => self.own_key(id, range),
                };
                n += 1;
            }
            let mut rows = [0; MAX_BRANCH_ENTRIES];
            for (row, key) in rows.iter_mut().zip(&keys[..n]) {
                *row = match self.ranges_at.get(key) {
                    Some(&j) => j,
                    None => self.add_range(*key, now, &mut added),
                };
            }
            for &j in &rows[..n] {
                let row = &mut self.rows[j as usize];
                row.last_use = now;
                let r = &mut row.stat;
                r.count += w;
                r.hits += 1;
                r.groups.add(group, w);
            }
        }
        self.bytes += added * NODE_BYTES;
    }

    /// The [`RangeKey`] of `range` under node `id`.
    fn own_key(&self, id: u32, range: (u64, u64)) -> RangeKey {
        match self.trie.edge(id) {
            Some((parent, leaf)) if leaf == range.0 => (u64::from(parent), range.0, range.1),
            _ => (OWN | u64::from(id), range.0, range.1),
        }
    }

    /// Adds the range keyed `key` to its stack's statistics (added when new): its row.
    /// The stack is the node `key` names, or the child of its callers' node at the
    /// range's first address.
    fn add_range(&mut self, key: RangeKey, now: u64, added: &mut usize) -> u32 {
        let (stack, first, last) = key;
        let at = match stack & OWN {
            0 => self.trie.child(stack as u32, first, added),
            _ => (stack & !OWN) as u32,
        };
        let j = self.rows.len() as u32;
        self.rows.push(RangeRow {
            last_use: now,
            range: (first, last),
            stat: StackRange::default(),
        });
        self.update(at, now, |s| s.rows.push(j));
        self.ranges_at.insert(key, j);
        j
    }

    /// When each stack (by its index in `stats`) was last used: its own samples or
    /// any of its ranges.
    fn last_uses(&self) -> Vec<u64> {
        let row = |j: &u32| self.rows[*j as usize].last_use;
        let last = |s: &StackStat| s.rows.iter().map(row).fold(s.last_use, u64::max);
        self.stats.iter().map(|(_, s)| last(s)).collect()
    }

    /// The rebuilt stack (callers' node, leaf) before the taken branch `e` ran, from
    /// the one after it; `None` when `e` carries no type or the frames cannot say (a
    /// call undone with no caller left).
    fn undo(
        &mut self,
        (callers, _): (u32, u64),
        e: &BranchEntry,
        added: &mut usize,
    ) -> Option<(u32, u64)> {
        use cpi_common::wire::branch_type as bt;
        match e.branch_type() {
            // A call to its own next instruction (`call 1f; 1: pop`, reading the PC)
            // makes no frame: its code pops the return address itself.
            bt::CALL | bt::IND_CALL if e.to > e.from && e.to - e.from <= MAX_INSN_LEN => {
                Some((callers, e.from))
            }
            // The callee's frame goes; the caller was at the call.
            bt::CALL | bt::IND_CALL => Some((self.trie.user_parent(callers)?, e.from)),
            // The frame the return left comes back: its leaf at the `ret`, returning to
            // where the return went.
            bt::RET => Some((self.trie.child(callers, e.to, added), e.from)),
            bt::COND | bt::UNCOND | bt::IND => Some((callers, e.from)),
            _ => None,
        }
    }

    /// Applies `f` to the statistics of node `id` (added when new).
    fn update(&mut self, id: u32, now: u64, f: impl FnOnce(&mut StackStat)) {
        let mut p = self.trie.payload(id);
        if p == NONE {
            p = self.stats.len() as u32;
            self.stats.push((id, StackStat::default()));
            self.trie.set_payload(id, p);
            self.bytes += stat_bytes(&StackStat::default());
        }
        let stat = &mut self.stats[p as usize].1;
        let before = stat_bytes(stat);
        f(stat);
        stat.last_use = now;
        self.bytes = self.bytes + stat_bytes(stat) - before;
    }

    /// When each stack was last used, with the bytes evicting it (and every stack used
    /// before it) frees: its statistics and the nodes no stack used later needs.
    pub(super) fn ages(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        let last_use = self.last_uses();
        let mut newest_first: Vec<u32> = (0..self.stats.len() as u32).collect();
        newest_first.sort_unstable_by_key(|&p| std::cmp::Reverse(last_use[p as usize]));
        let order = newest_first.into_iter().map(|p| self.stats[p as usize].0);
        let owned = self.trie.owned_by(order);
        owned.into_iter().map(move |(id, nodes)| {
            let p = self.trie.payload(id) as usize;
            (
                last_use[p],
                stat_bytes(&self.stats[p].1) + nodes * NODE_BYTES,
            )
        })
    }

    /// Evicts the stacks last used at or before `cut`. With `fold`, each one's samples
    /// and ranges fold into a `[rare callees]` stack ([`FOLDED_LEAF`]) under its
    /// nearest caller that a kept stack still runs through ([`Self::fold_targets`]),
    /// so every kept frame still holds all that ran under it, as a flame graph's
    /// minimum width leaves narrow frames in their parent's width; a stack with no such
    /// caller (every stack, without `fold`) goes to [`Self::dropped`]. Then the nodes
    /// no stack needs go.
    pub(super) fn evict_used_by(&mut self, cut: u64, fold: bool) {
        let last_use = self.last_uses();
        let keep: Vec<bool> = last_use.iter().map(|&l| l > cut).collect();
        let into = match fold {
            true => self.fold_targets(&keep),
            false => vec![None; keep.len()],
        };
        let mut old_rows = std::mem::take(&mut self.rows);
        // Where each kept stack's range is counted now, for the folds into it.
        let mut row_of: FastMap<(u32, (u64, u64)), u32> = FastMap::default();
        let mut evicted = Vec::new();
        for (p, (id, mut stat)) in std::mem::take(&mut self.stats).into_iter().enumerate() {
            self.trie.set_payload(id, NONE);
            if !keep[p] {
                if !matches!(self.trie.edge(id), Some((_, FOLDED_LEAF))) {
                    self.evicted += stat.samples();
                }
                evicted.push((into[p], stat, last_use[p]));
                continue;
            }
            let at = self.stats.len() as u32;
            for j in &mut stat.rows {
                let row = std::mem::take(&mut old_rows[*j as usize]);
                *j = self.rows.len() as u32;
                row_of.insert((at, row.range), *j);
                self.rows.push(row);
            }
            self.trie.set_payload(id, at);
            self.stats.push((id, stat));
        }
        for (target, stat, last) in evicted {
            let Some(node) = target else {
                for (role, (n, w)) in &stat.ips {
                    let e = self.dropped.ips.entry(*role).or_default();
                    e.0 += n;
                    e.1 += w;
                }
                self.dropped.branch_samples += stat.branch_samples;
                continue;
            };
            let at = match self.trie.payload(node) {
                NONE => {
                    self.trie.set_payload(node, self.stats.len() as u32);
                    self.stats.push((node, StackStat::default()));
                    self.stats.len() as u32 - 1
                }
                at => at,
            };
            self.fold_into(at, stat, last, &mut old_rows, &mut row_of);
        }
        self.trie.retain_with_payload();
        for (id, p) in self.trie.payloads() {
            self.stats[p as usize].0 = id;
        }
        self.ranges_at = FastMap::default();
        for (id, stat) in &self.stats {
            for &j in &stat.rows {
                let key = self.own_key(*id, self.rows[j as usize].range);
                self.ranges_at.insert(key, j);
            }
        }
        let stats: usize = self.stats.iter().map(|s| stat_bytes(&s.1)).sum();
        self.bytes = self.trie.len() * NODE_BYTES + stats;
    }

    /// For each stack, the `[rare callees]` node its samples fold into when it is not
    /// kept (`keep`, by index): under its nearest caller on a kept stack's path (a
    /// `[rare callees]` stack itself stays while its caller is on one, and rises when it
    /// is not); `None` for kept stacks and where no caller is on a kept path.
    fn fold_targets(&mut self, keep: &[bool]) -> Vec<Option<u32>> {
        let kept = (self.stats.iter().zip(keep)).filter_map(|(s, &k)| k.then_some(s.0));
        let alive = self.trie.on_paths_of(kept);
        let trie = &self.trie;
        let callers: Vec<Option<u32>> = (self.stats.iter().zip(keep))
            .map(|(&(id, _), &k)| {
                if k {
                    return None;
                }
                let mut at = trie.user_parent(id)?;
                while !alive[at as usize] {
                    at = trie.user_parent(at)?;
                }
                Some(at)
            })
            .collect();
        let mut added = 0;
        callers
            .into_iter()
            .map(|c| c.map(|at| self.trie.child(at, FOLDED_LEAF, &mut added)))
            .collect()
    }

    /// Adds an evicted stack's `stat` (last used at `last`; its rows in `rows`) to the
    /// statistics at index `at`, each range merged with the one it already counts
    /// (`row_of`).
    fn fold_into(
        &mut self,
        at: u32,
        stat: StackStat,
        last: u64,
        rows: &mut [RangeRow],
        row_of: &mut FastMap<(u32, (u64, u64)), u32>,
    ) {
        let t = &mut self.stats[at as usize].1;
        for (role, (n, w)) in stat.ips {
            let e = t.ips.entry(role).or_default();
            e.0 += n;
            e.1 += w;
        }
        t.cycles_groups.add_scaled(&stat.cycles_groups, 1.0);
        t.branch_samples += stat.branch_samples;
        t.last_use = t.last_use.max(last);
        for j in stat.rows {
            let row = std::mem::take(&mut rows[j as usize]);
            match row_of.get(&(at, row.range)) {
                Some(&k) => {
                    let into = &mut self.rows[k as usize];
                    into.last_use = into.last_use.max(row.last_use);
                    into.stat.count += row.stat.count;
                    into.stat.hits += row.stat.hits;
                    into.stat.groups.add_scaled(&row.stat.groups, 1.0);
                }
                None => {
                    let k = self.rows.len() as u32;
                    row_of.insert((at, row.range), k);
                    self.rows.push(row);
                    self.stats[at as usize].1.rows.push(k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn stack(user: &[u64]) -> CallStack {
        CallStack {
            kernel: Box::new([]),
            user: user.into(),
            end: StackEnd::Complete,
        }
    }

    /// A typed window, newest first: main jumps after f returned; f ran from its call
    /// at 0x100 (its ranges: main's [0x80, 0x100], f's [0x1000, 0x1010], main's
    /// [0x105, 0x120]).
    fn call_and_return() -> [BranchEntry; 4] {
        use cpi_common::wire::branch_type as bt;
        let e = |from, to, t| BranchEntry::new(from, to, false, 0).with_type(t);
        [
            e(0x120, 0x200, bt::UNCOND),
            e(0x1010, 0x105, bt::RET),
            e(0x100, 0x1000, bt::CALL),
            e(0x50, 0x80, bt::UNCOND),
        ]
    }

    #[test]
    fn typed_entries_give_each_range_the_stack_it_ran_under() {
        let entries = call_and_return();
        let mut agg = StackAggregate::default();
        let at_sample = stack(&[0x210, 0x9000]);
        agg.add_branch(&at_sample, Some((10.0, &entries)), 0, 1);
        let ranges = |user: &[u64]| {
            let st = agg.get(&stack(user)).unwrap();
            let mut r: Vec<(u64, u64)> = agg.ranges_of(st).map(|r| *r.0).collect();
            r.sort();
            r
        };
        assert_eq!(
            ranges(&[0x105, 0x9000]),
            [(0x105, 0x120)],
            "main after the call"
        );
        assert_eq!(
            ranges(&[0x1000, 0x105, 0x9000]),
            [(0x1000, 0x1010)],
            "f, called from main"
        );
        assert_eq!(
            ranges(&[0x80, 0x9000]),
            [(0x80, 0x100)],
            "main before the call"
        );
        assert_eq!(agg.get(&at_sample).unwrap().branch_samples, 1);
        assert_eq!(agg.ranges_of(agg.get(&at_sample).unwrap()).len(), 0);
        // Untyped entries: every range stays with the sample's stack.
        let untyped: Vec<BranchEntry> = entries.iter().map(|x| x.with_type(0)).collect();
        let mut agg = StackAggregate::default();
        agg.add_branch(&at_sample, Some((10.0, &untyped)), 0, 1);
        assert_eq!(agg.len(), 1);
        assert_eq!(agg.ranges_of(agg.get(&at_sample).unwrap()).len(), 3);
    }

    /// A stack whose ranges were counted lately stays, however old its own samples;
    /// after an eviction its ranges are found and counted in place.
    #[test]
    fn eviction_keeps_the_stacks_whose_ranges_are_in_use() {
        // f's range runs under a stack rebuilt from the window, whose own samples
        // (none) never say it is in use.
        let entries = call_and_return();
        let (at_sample, gone) = (stack(&[0x210, 0x9000]), stack(&[0x500, 0x9000]));
        let f = stack(&[0x1000, 0x105, 0x9000]);
        let mut a = StackAggregate::default();
        a.add_branch(&at_sample, Some((10.0, &entries)), 0, 1);
        a.add_ip(&gone, EventRole::CpuClock, 1, 0, 2);
        a.add_branch(&at_sample, Some((10.0, &entries)), 1, 3);
        a.evict_used_by(2, true);
        assert!(a.get(&gone).is_none(), "the stack last used at 2 went");
        // Into a `[rare callees]` stack under its caller, which kept stacks run through.
        let rare = a.get(&stack(&[FOLDED_LEAF, 0x9000])).expect("folded");
        assert_eq!((rare.samples(), a.dropped.samples()), (1, 0));
        let total: usize = a.ages().map(|x| x.1).sum();
        assert_eq!(total, a.bytes(), "the kept rows are counted once");
        a.add_branch(&at_sample, Some((10.0, &entries)), 2, 4);
        let st = a.get(&f).expect("f's stack, its range counted at 3, stays");
        let ranges: Vec<_> = a.ranges_of(st).collect();
        assert_eq!(ranges.len(), 1);
        assert_eq!((*ranges[0].0, ranges[0].1.hits), ((0x1000, 0x1010), 3));
        assert_eq!(ranges[0].1.count, 30.0);
        assert_eq!(a.ranges_at.len(), a.rows.len(), "one key a row");
    }

    #[test]
    fn ranges_of_a_window_go_to_its_stack() {
        let mut a = StackAggregate::default();
        let s = stack(&[0x1010, 0x2005]);
        // Newest first: ranges [0x1000, 0x1008] and (backwards) [0x1100, 0x1004].
        let e = [
            BranchEntry::new(0x1008, 0x1100, false, 0),
            BranchEntry::new(0x1004, 0x1000, false, 0),
            BranchEntry::new(0x0900, 0x1100, false, 0),
        ];
        a.add_branch(&s, Some((50.0, &e)), 0, 1);
        a.add_branch(&s, None, 1, 2);
        a.add_ip(&s, EventRole::Cycles, 1000, 2, 3);
        let st = a.get(&s).unwrap();
        assert_eq!(st.branch_samples, 2);
        let ranges: Vec<_> = a.ranges_of(st).collect();
        assert_eq!(ranges.len(), 1, "the backward range is left out");
        assert_eq!(*ranges[0].0, (0x1000, 0x1008));
        assert_eq!(ranges[0].1.count, 50.0);
        assert_eq!(st.ips[&EventRole::Cycles], (1, 1000));
        assert_eq!(st.cycles_groups.total(), 1000.0);
        assert_eq!(st.samples(), 3);
        assert!(a.bytes() >= stat_bytes(st));
    }

    /// The trie keeps a stack's end as its index: every end comes back as itself.
    #[test]
    fn every_stack_end_comes_back_from_its_index() {
        use StackEnd::*;
        for end in [Complete, Truncated, UnknownCode, Error] {
            assert_eq!(StackEnd::from_index(end as u64), end);
        }
    }

    /// Interned stacks come back as they went in: kernel and user frames of one
    /// address, and ends, kept apart; eviction takes the frames only evicted stacks
    /// needed and keeps the bytes right.
    #[test]
    fn interned_stacks_round_trip_and_evict_with_their_frames() {
        let with = |kernel: &[u64], user: &[u64], end| CallStack {
            kernel: kernel.into(),
            user: user.into(),
            end,
        };
        let old = [
            with(&[0xffff_1000], &[0x10], StackEnd::Complete),
            with(&[], &[0x10, 0xffff_1000], StackEnd::Complete),
            with(&[], &[], StackEnd::Error),
        ];
        let young = [
            with(&[], &[0x10], StackEnd::Truncated),
            with(&[], &[0x20, 0x30], StackEnd::Complete),
        ];
        let mut a = StackAggregate::default();
        for (now, s) in old.iter().chain(&young).enumerate() {
            a.add_ip(s, EventRole::CpuClock, 1, 0, now as u64);
        }
        let sorted = |a: &StackAggregate| {
            let mut v: Vec<_> = a
                .iter()
                .map(|(s, st)| {
                    assert_eq!(st.samples(), 1);
                    (s.kernel, s.user, s.end as u8)
                })
                .collect();
            v.sort();
            v
        };
        let all: Vec<_> = old.iter().chain(&young).cloned().collect();
        let want = |v: &[CallStack]| {
            let mut w: Vec<_> = v
                .iter()
                .map(|s| (s.kernel.clone(), s.user.clone(), s.end as u8))
                .collect();
            w.sort();
            w
        };
        assert_eq!(sorted(&a), want(&all));
        assert!(all.iter().all(|s| a.get(s).is_some()));
        let total: usize = a.ages().map(|x| x.1).sum();
        assert_eq!(total, a.bytes(), "every node counts for one stack");
        a.evict_used_by(old.len() as u64 - 1, true);
        // The user stack under the kept root folds into a `[rare callees]` stack there;
        // the one under kernel frames no kept stack runs through, and the frameless
        // one, have no caller to fold into.
        let rare = with(&[], &[FOLDED_LEAF], StackEnd::Complete);
        let mut kept: Vec<CallStack> = young.to_vec();
        kept.push(rare.clone());
        assert_eq!(sorted(&a), want(&kept));
        assert!(old.iter().all(|s| a.get(s).is_none()));
        assert_eq!(a.dropped.samples(), 2);
        // Two roots, 0x10 under one, 0x30 then 0x20 and the fold under the other.
        assert_eq!(a.trie.len(), 6);
        let stats: usize = a.stats.iter().map(|s| stat_bytes(&s.1)).sum();
        assert_eq!(a.bytes(), 6 * NODE_BYTES + stats);
        // What is kept is still counted in place.
        a.add_ip(&young[1], EventRole::CpuClock, 1, 0, 9);
        assert_eq!(a.get(&young[1]).unwrap().samples(), 2);
        assert_eq!(a.trie.len(), 6);
        // Old, the fold stays while a kept stack runs through its caller (the root),
        // and goes when none does.
        a.evict_used_by(8, true);
        assert_eq!(a.get(&rare).map(|s| s.samples()), Some(1));
        assert_eq!(a.dropped.samples(), 3, "young[0], whose root nothing holds");
        a.evict_used_by(9, false);
        assert!(a.is_empty());
        assert_eq!(a.dropped.samples(), 6);
        assert_eq!(a.evicted, 6, "each sample counted once");
    }

    /// The stack a range is counted under, the way it was before stacks were interned:
    /// the sample's user frames, rebuilt entry by entry on a `Vec`.
    fn reference(stack: &CallStack, entries: &[BranchEntry]) -> Vec<(CallStack, (u64, u64))> {
        use cpi_common::wire::branch_type as bt;
        let undo = |mut f: Vec<u64>, e: &BranchEntry| {
            match e.branch_type() {
                bt::CALL | bt::IND_CALL if f.len() >= 2 => {
                    f.remove(0);
                    f[0] = e.from;
                }
                bt::RET => {
                    f[0] = e.to;
                    f.insert(0, e.from);
                }
                bt::COND | bt::UNCOND | bt::IND => f[0] = e.from,
                _ => return None,
            }
            Some(f)
        };
        let mut rebuilt = Some(stack.user.to_vec());
        let mut out = Vec::new();
        for pair in entries.windows(2) {
            let (newer, older) = (&pair[0], &pair[1]);
            rebuilt = rebuilt.and_then(|f| undo(f, newer));
            if older.to > newer.from {
                continue;
            }
            let at = match &rebuilt {
                Some(f) => {
                    let mut user = f.clone();
                    user[0] = older.to;
                    CallStack {
                        kernel: Box::new([]),
                        user: user.into(),
                        end: stack.end,
                    }
                }
                None => stack.clone(),
            };
            out.push((at, (older.to, newer.from)));
        }
        out
    }

    /// Random typed windows under random stacks (some with kernel frames) count each
    /// range under the stack the `Vec` walk gives it, once; halfway, an eviction that
    /// drops nothing renumbers the trie, and the ranges are found again after it.
    #[test]
    fn interned_walk_matches_the_frame_walk() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let (mut agg, mut want) = (StackAggregate::default(), HashMap::new());
        for now in 1..=2000 {
            if now == 1000 {
                let nodes = agg.trie.len();
                agg.evict_used_by(0, true);
                assert!(agg.trie.len() < nodes, "nothing renumbered");
            }
            let user: Vec<u64> = (0..1 + next(6)).map(|_| 0x100 + next(8) * 0x10).collect();
            let kernel: Vec<u64> = (0..next(3) * next(2))
                .map(|_| 0xffff_0000 + next(4))
                .collect();
            let end = [StackEnd::Complete, StackEnd::Truncated][next(2) as usize];
            let stack = CallStack {
                kernel: kernel.into(),
                user: user.into(),
                end,
            };
            let entries: Vec<BranchEntry> = (0..next(12))
                .map(|_| {
                    let (from, to) = (0x100 + next(8) * 0x10, 0x100 + next(8) * 0x10);
                    BranchEntry::new(from, to, false, 0).with_type(next(7) as u8)
                })
                .collect();
            agg.add_branch(&stack, Some((1.0, &entries)), 0, now);
            want.insert((stack.clone(), None), 0);
            for (s, r) in reference(&stack, &entries) {
                want.insert((s.clone(), None), 0);
                *want.entry((s, Some(r))).or_insert(0) += 1;
            }
        }
        let mut got = HashMap::new();
        for (s, st) in agg.iter() {
            got.insert((s.clone(), None), 0);
            for (r, v) in agg.ranges_of(st) {
                got.insert((s.clone(), Some(*r)), v.hits);
            }
            let distinct: std::collections::HashSet<_> = agg.ranges_of(st).map(|r| r.0).collect();
            let n = agg.ranges_of(st).len();
            assert_eq!(distinct.len(), n, "a range twice under {s:?}");
        }
        let only = |a: &HashMap<_, u64>, b: &HashMap<_, u64>| {
            let mut v: Vec<_> = a.iter().filter(|(k, n)| b.get(*k) != Some(*n)).collect();
            v.sort_by_key(|x| format!("{x:?}"));
            v.truncate(4);
            format!("{v:?}")
        };
        assert!(
            got == want,
            "got only {}\nwant only {}",
            only(&got, &want),
            only(&want, &got)
        );
    }
}
