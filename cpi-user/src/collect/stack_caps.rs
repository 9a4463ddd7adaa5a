//! How much of each process's user stack the kernel side copies per sample (the eBPF
//! map `STACK_CAPS`, cpi-ebpf/src/main.rs `stack_cap`): all a record holds
//! ([`MAX_STACK_BYTES`]) until the process's unwound stacks show where they end, then
//! twice the deepest of them; all again at the first stack a lowered cap cut.
//!
//! Each KiB not copied saves ≈ 0.18 µs of the sampled CPU's time (two copies: into the
//! per-CPU scratch, then into the ring), and a fixed smaller cap truncates deep
//! programs' stacks (BENCHMARKS.md, "Copying less stack"). A process whose stacks grow
//! past its cap loses the samples until the raise lands (those in the ring already, a
//! pass's worth: counted as truncated), and waits four times as long before it is
//! lowered again, so a process whose depth swings settles at the full copy.

use std::collections::HashMap;

use cpi_common::wire::{MAX_STACK_BYTES, MAX_STACK_CAPS};

use super::sys::StackCapMap;

/// Stacks of a process unwound before its first cap is chosen.
const LEARN_AFTER: u32 = 64;

/// Most stacks between two choices of a cap: a process cut four times stays at the
/// full copy for this long.
const MOST_PATIENCE: u32 = LEARN_AFTER << 8;

/// Caps are multiples of this, and never below it.
const STEP: usize = 512;

/// What is learnt of one process's stacks.
#[derive(Clone, Copy, Debug)]
struct Learning {
    /// The cap the kernel side holds (or is about to be given).
    cap: usize,
    /// The most bytes a stack used since the last choice.
    deepest: usize,
    /// Stacks since the last choice.
    seen: u32,
    /// Stacks to see before the next choice.
    patience: u32,
}

/// The caps of the processes whose stacks the collector unwinds, and the changes the
/// kernel side has yet to be given.
#[derive(Debug, Default)]
pub(crate) struct StackCaps {
    procs: HashMap<u32, Learning>,
    /// The new cap of each process whose cap changed; [`MAX_STACK_BYTES`] removes it.
    pending: HashMap<u32, usize>,
}

impl StackCaps {
    /// One stack of `pid` unwound from its copy: `used` bytes of it were read, and
    /// `cut` when it went on past a copy that stopped at its cap.
    pub fn observe(&mut self, pid: u32, used: usize, cut: bool) {
        if !self.procs.contains_key(&pid) && self.procs.len() >= MAX_STACK_CAPS as usize {
            return;
        }
        let p = self.procs.entry(pid).or_insert(Learning {
            cap: MAX_STACK_BYTES,
            deepest: 0,
            seen: 0,
            patience: LEARN_AFTER,
        });
        if cut {
            if p.cap < MAX_STACK_BYTES {
                p.cap = MAX_STACK_BYTES;
                p.patience = p.patience.saturating_mul(4).min(MOST_PATIENCE);
                self.pending.insert(pid, MAX_STACK_BYTES);
            }
            // A stack deeper than any copy: nothing to learn from the others.
            (p.deepest, p.seen) = (0, 0);
            return;
        }
        p.deepest = p.deepest.max(used);
        p.seen += 1;
        if p.seen < p.patience {
            return;
        }
        let cap = (p.deepest * 2)
            .next_multiple_of(STEP)
            .clamp(STEP, MAX_STACK_BYTES);
        if cap != p.cap {
            p.cap = cap;
            self.pending.insert(pid, cap);
        }
        (p.deepest, p.seen) = (0, 0);
    }

    /// `pid` left, or was given to another process: its cap goes.
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.procs.remove(&pid) {
            if p.cap < MAX_STACK_BYTES || self.pending.contains_key(&pid) {
                self.pending.insert(pid, MAX_STACK_BYTES);
            }
        }
    }

    /// Gives the kernel side the changes since the last call. A cap the map has no
    /// room for is forgotten: that process keeps the full copy.
    pub fn apply(&mut self, map: &mut dyn StackCapMap) {
        // Removals first: they make room.
        let mut changes: Vec<_> = self.pending.drain().collect();
        changes.sort_unstable_by_key(|&(pid, cap)| (cap < MAX_STACK_BYTES, pid));
        for (pid, cap) in changes {
            if cap >= MAX_STACK_BYTES {
                // Only an entry already gone can fail to go: nothing to undo.
                let _ = map.remove_cap(pid);
            } else if map.set_cap(pid, cap as u32).is_err() {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.cap = MAX_STACK_BYTES;
                }
            }
        }
    }

    /// Drops the changes: no kernel side takes them (the perf buffers' copies are of a
    /// size fixed when the events are opened).
    pub fn discard(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io;

    /// The kernel's map, with room for two.
    impl StackCapMap for BTreeMap<u32, u32> {
        fn set_cap(&mut self, tgid: u32, bytes: u32) -> io::Result<()> {
            if self.len() >= 2 && !self.contains_key(&tgid) {
                return Err(io::Error::from_raw_os_error(libc::E2BIG));
            }
            self.insert(tgid, bytes);
            Ok(())
        }
        fn remove_cap(&mut self, tgid: u32) -> io::Result<()> {
            self.remove(&tgid)
                .map(drop)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
        }
    }

    fn run(caps: &mut StackCaps, pid: u32, n: u32, used: usize) {
        for _ in 0..n {
            caps.observe(pid, used, false);
        }
    }

    #[test]
    fn a_shallow_process_is_lowered_to_twice_its_deepest_stack_and_raised_when_cut() {
        let (mut caps, mut map) = (StackCaps::default(), BTreeMap::new());
        run(&mut caps, 7, LEARN_AFTER - 1, 300);
        caps.observe(7, 700, false);
        caps.apply(&mut map);
        assert_eq!(map.get(&7), Some(&1536), "2 × 700 B, to the next 512");
        // Deeper stacks that still fit raise it at the next choice.
        run(&mut caps, 7, LEARN_AFTER, 1400);
        caps.apply(&mut map);
        assert_eq!(map.get(&7), Some(&3072));
        // One stack cut by the cap: back to the full copy at once…
        caps.observe(7, 3072, true);
        caps.apply(&mut map);
        assert_eq!(map.get(&7), None);
        // …and lowered again only after four times as many stacks.
        run(&mut caps, 7, 4 * LEARN_AFTER - 1, 300);
        caps.apply(&mut map);
        assert_eq!(map.get(&7), None);
        run(&mut caps, 7, 1, 300);
        caps.apply(&mut map);
        assert_eq!(map.get(&7), Some(&1024));
    }

    #[test]
    fn deep_processes_keep_the_full_copy_and_the_map_holds_only_lowered_caps() {
        let (mut caps, mut map) = (StackCaps::default(), BTreeMap::new());
        // Stacks past the whole copy: cut at the full cap, never lowered.
        for _ in 0..4 * LEARN_AFTER {
            caps.observe(1, MAX_STACK_BYTES, true);
        }
        run(&mut caps, 2, LEARN_AFTER, 5000);
        caps.apply(&mut map);
        assert!(map.is_empty(), "{map:?}");
        // A process gone takes its cap with it.
        run(&mut caps, 3, LEARN_AFTER, 100);
        caps.apply(&mut map);
        assert_eq!(map.get(&3), Some(&512));
        caps.forget(3);
        caps.apply(&mut map);
        assert!(map.is_empty(), "{map:?}");
    }

    #[test]
    fn a_cap_the_map_has_no_room_for_leaves_the_full_copy() {
        let (mut caps, mut map) = (StackCaps::default(), BTreeMap::new());
        for pid in 1..=3 {
            run(&mut caps, pid, LEARN_AFTER, 100);
        }
        caps.apply(&mut map);
        assert_eq!(map.len(), 2, "the fake holds two");
        let refused = (1..=3).find(|p| !map.contains_key(p)).unwrap();
        assert_eq!(caps.procs[&refused].cap, MAX_STACK_BYTES);
        // Chosen again at its next choice, once there is room.
        let held = *map.keys().next().unwrap();
        caps.forget(held);
        run(&mut caps, refused, LEARN_AFTER, 100);
        caps.apply(&mut map);
        assert_eq!(map.get(&refused), Some(&512), "{map:?}");
        // Changes no kernel side takes do not pile up.
        run(&mut caps, 9, LEARN_AFTER, 100);
        caps.discard();
        assert!(caps.pending.is_empty());
    }
}
