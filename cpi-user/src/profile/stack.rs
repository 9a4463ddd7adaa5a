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
//! Memory is bounded: the stacks of one process take at most
//! [`StackAggregate::limit`] bytes (estimated, [`DEFAULT_STACK_BYTES`] unless set); past
//! it the least recently used stacks go, and their samples are counted in
//! [`StackAggregate::dropped`], never silently.

use std::collections::{BTreeMap, HashMap};

use cpi_common::wire::{BranchEntry, EventRole};
use serde::{Deserialize, Serialize};

use super::error::{group_of, Groups};

/// Default bound on one process's stacks, in (estimated) bytes.
pub const DEFAULT_STACK_BYTES: usize = 8 << 20;

/// How unwinding a stack ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum StackEnd {
    /// The outermost frame was reached (no caller left to find).
    #[default]
    Complete,
    /// Stopped at the frame limit or the end of the copied stack bytes.
    Truncated,
    /// Stopped at code without unwind information (JIT, anonymous memory): the last
    /// frame is where it stopped; nothing past it is invented.
    UnknownCode,
    /// Unwinding failed (unreadable stack, corrupt unwind information, a cycle).
    Error,
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
    pub ranges: HashMap<(u64, u64), StackRange>,
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
#[derive(Clone, Debug)]
pub struct StackAggregate {
    /// By stack.
    pub stacks: HashMap<CallStack, StackStat>,
    /// Samples that carried no stack (the writer could not take one).
    pub unstacked: u64,
    /// What ran under the stacks evicted to stay within [`Self::limit`] (IP samples and
    /// periods, branch samples; no ranges).
    pub dropped: StackStat,
    /// Bound on [`Self::bytes`].
    pub limit: usize,
    /// Estimated bytes held.
    bytes: usize,
    clock: u64,
}

impl Default for StackAggregate {
    fn default() -> Self {
        StackAggregate {
            stacks: HashMap::new(),
            unstacked: 0,
            dropped: StackStat::default(),
            limit: DEFAULT_STACK_BYTES,
            bytes: 0,
            clock: 0,
        }
    }
}

/// Estimated heap and table bytes of one entry.
fn entry_bytes(stack: &CallStack, stat: &StackStat) -> usize {
    // Hash-table slots carry their key and value plus about one control byte and load
    // slack: counted as 1.5× the slot.
    let slot = |k: usize, v: usize| (k + v) * 3 / 2;
    slot(size_of::<CallStack>(), size_of::<StackStat>())
        + (stack.kernel.len() + stack.user.len()) * 8
        + stat.ips.len() * 48
        + stat.ranges.capacity() * slot(16, size_of::<StackRange>())
}

impl StackAggregate {
    /// Estimated bytes held (bounded by [`Self::limit`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Counts an IP sample of `role` with weight `period` under `stack`.
    pub fn add_ip(&mut self, stack: &CallStack, role: EventRole, period: u64) {
        self.update(stack, |s| {
            let e = s.ips.entry(role).or_default();
            if role == EventRole::Cycles {
                s.cycles_groups.add(group_of(e.0), period as f64);
            }
            e.0 += 1;
            e.1 += period;
        });
    }

    /// Counts a branch sample under `stack` with its window
    /// ([`super::aggregate::sample_window`]: the weight of each range and the entries,
    /// newest first), `None` when the sample gives no ranges.
    pub fn add_branch(&mut self, stack: &CallStack, window: Option<(f64, &[BranchEntry])>) {
        self.update(stack, |s| {
            let group = group_of(s.branch_samples);
            s.branch_samples += 1;
            let Some((w, entries)) = window else {
                return;
            };
            for pair in entries.windows(2) {
                let (newer, older) = (&pair[0], &pair[1]);
                // Backward ranges are counted by the process's aggregate.
                if older.to > newer.from {
                    continue;
                }
                let r = s.ranges.entry((older.to, newer.from)).or_default();
                r.count += w;
                r.hits += 1;
                r.groups.add(group, w);
            }
        });
    }

    fn update(&mut self, stack: &CallStack, f: impl FnOnce(&mut StackStat)) {
        self.clock += 1;
        if !self.stacks.contains_key(stack) {
            self.stacks.insert(stack.clone(), StackStat::default());
            // A new slot; its own bytes are added below.
        }
        let (key, stat) = self.stacks.get_key_value(stack).expect("inserted above");
        let before = if stat.last_use == 0 {
            0
        } else {
            entry_bytes(key, stat)
        };
        let stat = self.stacks.get_mut(stack).expect("inserted above");
        f(stat);
        stat.last_use = self.clock;
        let after = entry_bytes(stack, stat);
        self.bytes = self.bytes + after - before;
        if self.bytes > self.limit {
            self.evict();
        }
    }

    /// Drops the least recently used stacks until the rest take at most 3/4 of the
    /// bound (so eviction, which sorts, runs once per many samples).
    fn evict(&mut self) {
        let mut by_age: Vec<(u64, CallStack)> = self
            .stacks
            .iter()
            .map(|(k, v)| (v.last_use, k.clone()))
            .collect();
        by_age.sort_unstable_by_key(|e| e.0);
        let target = self.limit / 4 * 3;
        for (_, k) in by_age {
            if self.bytes <= target {
                break;
            }
            if let Some(stat) = self.stacks.remove(&k) {
                self.bytes = self.bytes.saturating_sub(entry_bytes(&k, &stat));
                for (role, (n, w)) in stat.ips {
                    let e = self.dropped.ips.entry(role).or_default();
                    e.0 += n;
                    e.1 += w;
                }
                self.dropped.branch_samples += stat.branch_samples;
            }
        }
    }
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
    fn ranges_of_a_window_go_to_its_stack() {
        let mut a = StackAggregate::default();
        let s = stack(&[0x1010, 0x2005]);
        // Newest first: ranges [0x1000, 0x1008] and (backwards) [0x1100, 0x1004].
        let e = [
            BranchEntry::new(0x1008, 0x1100, false, 0),
            BranchEntry::new(0x1004, 0x1000, false, 0),
            BranchEntry::new(0x0900, 0x1100, false, 0),
        ];
        a.add_branch(&s, Some((50.0, &e)));
        a.add_branch(&s, None);
        a.add_ip(&s, EventRole::Cycles, 1000);
        let st = &a.stacks[&s];
        assert_eq!(st.branch_samples, 2);
        assert_eq!(st.ranges.len(), 1, "the backward range is left out");
        assert_eq!(st.ranges[&(0x1000, 0x1008)].count, 50.0);
        assert_eq!(st.ips[&EventRole::Cycles], (1, 1000));
        assert_eq!(st.cycles_groups.total(), 1000.0);
        assert_eq!(st.samples(), 3);
        assert!(a.bytes() >= entry_bytes(&s, st));
    }

    #[test]
    fn bound_evicts_least_recently_used_and_counts_their_samples() {
        let mut a = StackAggregate::default();
        let one = entry_bytes(&stack(&[1, 2, 3]), &StackStat::default());
        a.limit = one * 10;
        // 30 distinct stacks, one sample each; stack 0 is used again every time.
        let hot = stack(&[7, 7, 7]);
        for i in 0..30u64 {
            a.add_ip(&hot, EventRole::CpuClock, 1);
            a.add_ip(&stack(&[i + 100, 2, 3]), EventRole::CpuClock, 1);
        }
        assert!(a.bytes() <= a.limit, "{} > {}", a.bytes(), a.limit);
        assert!(a.stacks.contains_key(&hot), "the hot stack stays");
        let kept: u64 = a.stacks.values().map(StackStat::samples).sum();
        assert!(a.dropped.samples() > 0);
        assert_eq!(
            kept + a.dropped.samples(),
            60,
            "every sample kept or counted"
        );
        // The newest cold stack stays, the oldest went.
        assert!(a.stacks.contains_key(&stack(&[129, 2, 3])));
        assert!(!a.stacks.contains_key(&stack(&[100, 2, 3])));
    }
}
