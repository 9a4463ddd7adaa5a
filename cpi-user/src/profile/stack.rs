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
//! [`super::aggregate::sample_window`]), so analysis can give each call path its own
//! instructions and CPI.
//!
//! Memory is bounded by the set that holds the aggregates
//! ([`super::aggregate::SampleSet::stack_bytes`], over all its processes together): past
//! it the least recently used stacks of any process go, and their samples are counted in
//! [`StackAggregate::dropped`], never silently.

use std::collections::BTreeMap;

use cpi_common::wire::{BranchEntry, EventRole};
use serde::{Deserialize, Serialize};

use super::error::Groups;
use super::FastMap;

/// Default bound on the stacks of all processes of one sample set, in (estimated) bytes.
pub const DEFAULT_STACK_BYTES: usize = 32 << 20;

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

/// A [`CallStack`] borrowed: the key a sample's stack is looked up by, with no
/// allocation unless it is new. Hashes as the `CallStack` it equals (the same fields,
/// slices hashed alike, in the same order).
#[derive(Clone, Copy, Debug, Hash)]
pub(crate) struct StackRef<'a> {
    kernel: &'a [u64],
    user: &'a [u64],
    end: StackEnd,
}

impl<'a> From<&'a CallStack> for StackRef<'a> {
    fn from(s: &'a CallStack) -> Self {
        StackRef {
            kernel: &s.kernel,
            user: &s.user,
            end: s.end,
        }
    }
}

impl hashbrown::Equivalent<CallStack> for StackRef<'_> {
    fn equivalent(&self, key: &CallStack) -> bool {
        self.end == key.end && *self.user == *key.user && *self.kernel == *key.kernel
    }
}

impl StackRef<'_> {
    fn to_owned(self) -> CallStack {
        CallStack {
            kernel: self.kernel.into(),
            user: self.user.into(),
            end: self.end,
        }
    }
}

/// A range [start, end] that ran under one stack, weighted like the process's ranges.
#[derive(Clone, Debug, Default, PartialEq)]
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
    /// The ranges of those samples' windows, by (first, last instruction address).
    pub ranges: FastMap<(u64, u64), StackRange>,
    /// When the stack was last used (the aggregate's clock), for eviction.
    last_use: u64,
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
    /// By stack.
    pub stacks: FastMap<CallStack, StackStat>,
    /// Samples that carried no stack (the writer could not take one).
    pub unstacked: u64,
    /// What ran under the stacks evicted to stay within the set's bound (IP samples
    /// and periods, branch samples; no ranges).
    pub dropped: StackStat,
    /// Estimated bytes held.
    bytes: usize,
}

/// Estimated heap and table bytes of one entry.
fn entry_bytes(stack: StackRef<'_>, stat: &StackStat) -> usize {
    // Hash-table slots carry their key and value plus about one control byte and load
    // slack: counted as 1.5× the slot.
    let slot = |k: usize, v: usize| (k + v) * 3 / 2;
    slot(size_of::<CallStack>(), size_of::<StackStat>())
        + (stack.kernel.len() + stack.user.len()) * 8
        + stat.ips.len() * 48
        + stat.ranges.capacity() * slot(16, size_of::<StackRange>())
}

impl StackAggregate {
    /// Estimated bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
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
        self.update(stack.into(), now, |s| {
            let e = s.ips.entry(role).or_default();
            if role == EventRole::Cycles {
                s.cycles_groups.add(group, period as f64);
            }
            e.0 += 1;
            e.1 += period;
        });
    }

    /// Counts a branch sample under `stack` with its window
    /// ([`super::aggregate::sample_window`]: the weight of each range and the entries,
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
        self.update(stack.into(), now, |s| s.branch_samples += 1);
        let Some((w, entries)) = window else {
            return;
        };
        let mut rebuilt: Option<Vec<u64>> = Some(stack.user.to_vec());
        for pair in entries.windows(2) {
            let (newer, older) = (&pair[0], &pair[1]);
            rebuilt = rebuilt.and_then(|frames| undo(frames, newer));
            // Backward ranges are counted by the process's aggregate.
            if older.to > newer.from {
                continue;
            }
            let add = |s: &mut StackStat| {
                let r = s.ranges.entry((older.to, newer.from)).or_default();
                r.count += w;
                r.hits += 1;
                r.groups.add(group, w);
            };
            match &mut rebuilt {
                Some(frames) => {
                    // The range's stack: the rebuilt one with the range's start as its
                    // leaf, looked up in place.
                    let leaf = std::mem::replace(&mut frames[0], older.to);
                    let at = StackRef {
                        kernel: &[],
                        user: frames,
                        end: stack.end,
                    };
                    self.update(at, now, add);
                    frames[0] = leaf;
                }
                None => self.update(stack.into(), now, add),
            }
        }
    }
    fn update(&mut self, stack: StackRef<'_>, now: u64, f: impl FnOnce(&mut StackStat)) {
        // A stack seen before (most samples) costs one lookup and no allocation; a new
        // entry counts its own bytes once, below.
        let (before, stat) = match self.stacks.get_mut(&stack) {
            Some(stat) => (entry_bytes(stack, stat), stat),
            None => (0, self.stacks.entry(stack.to_owned()).or_default()),
        };
        f(stat);
        stat.last_use = now;
        let after = entry_bytes(stack, stat);
        self.bytes = self.bytes + after - before;
    }

    /// When each stack was last used, with its bytes: the set's eviction picks a cut.
    pub(super) fn ages(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.stacks
            .iter()
            .map(|(k, v)| (v.last_use, entry_bytes(k.into(), v)))
    }

    /// Drops the stacks last used at or before `cut`, counting their samples in
    /// [`Self::dropped`].
    pub(super) fn evict_used_by(&mut self, cut: u64) {
        let (dropped, bytes) = (&mut self.dropped, &mut self.bytes);
        self.stacks.retain(|k, stat| {
            if stat.last_use > cut {
                return true;
            }
            *bytes = bytes.saturating_sub(entry_bytes(k.into(), stat));
            for (role, (n, w)) in &stat.ips {
                let e = dropped.ips.entry(*role).or_default();
                e.0 += n;
                e.1 += w;
            }
            dropped.branch_samples += stat.branch_samples;
            false
        });
    }
}

/// The user frames before the taken branch `e` ran, from those after it (leaf first:
/// the IP, then return addresses); `None` when `e` carries no type or the frames cannot
/// say (a call undone with no caller left).
fn undo(mut frames: Vec<u64>, e: &BranchEntry) -> Option<Vec<u64>> {
    use cpi_common::wire::branch_type as bt;
    match e.branch_type() {
        bt::CALL | bt::IND_CALL => {
            // The callee's frame goes; the caller was at the call.
            if frames.len() < 2 {
                return None;
            }
            frames.remove(0);
            frames[0] = e.from;
        }
        bt::RET => {
            // The frame the return left comes back: its leaf at the `ret`, returning to
            // where the return went.
            frames[0] = e.to;
            frames.insert(0, e.from);
        }
        bt::COND | bt::UNCOND | bt::IND => frames[0] = e.from,
        _ => return None,
    }
    (!frames.is_empty()).then_some(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(user: &[u64]) -> CallStack {
        CallStack {
            kernel: Box::new([]),
            user: user.into(),
            end: StackEnd::Complete,
        }
    }

    #[test]
    fn typed_entries_give_each_range_the_stack_it_ran_under() {
        use cpi_common::wire::branch_type as bt;
        let e = |from, to, t| BranchEntry::new(from, to, false, 0).with_type(t);
        // Newest first: main jumps after f returned; f ran from its call.
        let entries = [
            e(0x120, 0x200, bt::UNCOND),
            e(0x1010, 0x105, bt::RET),
            e(0x100, 0x1000, bt::CALL),
            e(0x50, 0x80, bt::UNCOND),
        ];
        let mut agg = StackAggregate::default();
        let at_sample = stack(&[0x210, 0x9000]);
        agg.add_branch(&at_sample, Some((10.0, &entries)), 0, 1);
        let ranges = |user: &[u64]| {
            let mut r: Vec<(u64, u64)> = agg.stacks[&stack(user)].ranges.keys().copied().collect();
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
        assert_eq!(agg.stacks[&at_sample].branch_samples, 1);
        assert!(agg.stacks[&at_sample].ranges.is_empty());
        // Untyped entries: every range stays with the sample's stack.
        let untyped: Vec<BranchEntry> = entries.iter().map(|x| x.with_type(0)).collect();
        let mut agg = StackAggregate::default();
        agg.add_branch(&at_sample, Some((10.0, &untyped)), 0, 1);
        assert_eq!(agg.stacks.len(), 1);
        assert_eq!(agg.stacks[&at_sample].ranges.len(), 3);
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
        let st = &a.stacks[&s];
        assert_eq!(st.branch_samples, 2);
        assert_eq!(st.ranges.len(), 1, "the backward range is left out");
        assert_eq!(st.ranges[&(0x1000, 0x1008)].count, 50.0);
        assert_eq!(st.ips[&EventRole::Cycles], (1, 1000));
        assert_eq!(st.cycles_groups.total(), 1000.0);
        assert_eq!(st.samples(), 3);
        assert!(a.bytes() >= entry_bytes((&s).into(), st));
    }
}
