//! The exact truth per calling context, kept as the replay counted it: per (context,
//! range) its executions and cycles, and the code of each range, expanded into
//! instructions only when read ([`ContextTruth::for_each`]).
//!
//! A map per (context, instruction) held every instruction of every range once per
//! context it ran in: on gcc's cc1 that map was most of simulate's memory and its
//! growth its peak (4.3 GiB; BENCHMARKS.md, "Call paths of cc1 and python3 under
//! `simulate`"). A range here costs its run's 24 bytes.

/// One range's executions in one calling context.
#[derive(Clone, Copy, Debug)]
struct Run {
    context: u32,
    /// The range's number in [`ContextTruth`]'s code.
    range: u32,
    count: u64,
    /// Modelled cycles of those executions, misprediction penalties included.
    cycles: u64,
}

/// What ran in each calling context, exactly.
#[derive(Clone, Debug, Default)]
pub struct ContextTruth {
    /// The instruction addresses of every range, one after another.
    addrs: Vec<u64>,
    /// The static cost of each instruction of `addrs`.
    costs: Vec<u32>,
    /// Where each range's instructions start in `addrs`; its end is the next start.
    starts: Vec<usize>,
    runs: Vec<Run>,
    /// (run, instruction index, cycles): the misprediction penalty of a conditional
    /// inside a range, which the range's last instruction absorbed in the run's cycles
    /// and which belongs to the conditional; sorted by run.
    penalties: Vec<(u32, u32, u64)>,
}

impl ContextTruth {
    /// Adds the code of the next range (numbered in order from 0): its instruction
    /// addresses and their static costs (empty when the bytes are unknown).
    pub(crate) fn add_range(&mut self, addrs: &[u64], costs: &[u32]) {
        self.starts.push(self.addrs.len());
        self.addrs.extend_from_slice(addrs);
        self.costs.extend_from_slice(costs);
    }

    /// Adds `count` executions of range `range` in `context`, taking `cycles`; the run's
    /// number, for [`Self::add_penalty`].
    pub(crate) fn add_run(&mut self, context: u32, range: u32, count: u64, cycles: u64) -> u32 {
        self.runs.push(Run {
            context,
            range,
            count,
            cycles,
        });
        self.runs.len() as u32 - 1
    }

    /// Moves `cycles` of run `run` from its range's last instruction to its
    /// instruction `index` (a conditional's misprediction penalty).
    pub(crate) fn add_penalty(&mut self, run: u32, index: u32, cycles: u64) {
        self.penalties.push((run, index, cycles));
    }

    /// Orders what was added for reading; call once all is added.
    pub(crate) fn finish(&mut self) {
        self.penalties.sort_unstable_by_key(|p| (p.0, p.1));
        self.starts.push(self.addrs.len());
    }

    /// Calls `f(context, instruction address, executions, cycles)` for every instruction
    /// of every run; an instruction that ran in one context as part of several ranges
    /// comes once per range, to be summed.
    pub fn for_each(&self, mut f: impl FnMut(u32, u64, u64, u64)) {
        let mut penalties = self.penalties.as_slice();
        for (n, r) in self.runs.iter().enumerate() {
            let split = penalties.partition_point(|p| p.0 as usize <= n);
            let (own, rest) = penalties.split_at(split);
            penalties = rest;
            let span = self.starts[r.range as usize]..self.starts[r.range as usize + 1];
            let (addrs, costs) = (&self.addrs[span.clone()], &self.costs[span]);
            let Some(last) = addrs.len().checked_sub(1) else {
                continue;
            };
            // As the replay charges a range: each instruction its static cost, the last
            // whatever remains (taken bubble, mispredictions), less the inner
            // conditionals' penalties, which go to them.
            let mut rest = r.cycles;
            let mut own = own.iter().peekable();
            for (i, (&a, &c)) in addrs.iter().zip(costs).enumerate().take(last) {
                let mut cycles = r.count * u64::from(c);
                rest -= cycles;
                if let Some(&(_, _, pen)) = own.next_if(|p| p.1 as usize == i) {
                    cycles += pen;
                    rest -= pen;
                }
                f(r.context, a, r.count, cycles);
            }
            f(r.context, addrs[last], r.count, rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each instruction gets its static cost, the last the rest less the penalties
    /// moved to the conditionals inside the range.
    #[test]
    fn runs_expand_into_instructions_with_their_penalties() {
        let mut t = ContextTruth::default();
        t.add_range(&[0x10, 0x12, 0x15], &[1, 2, 1]);
        t.add_range(&[0x40], &[1]);
        let a = t.add_run(3, 0, 10, 100);
        t.add_run(4, 1, 5, 7);
        t.add_penalty(a, 1, 20);
        t.finish();
        let mut seen = Vec::new();
        t.for_each(|c, a, n, cyc| seen.push((c, a, n, cyc)));
        assert_eq!(
            seen,
            [
                (3, 0x10, 10, 10),
                (3, 0x12, 10, 40),
                (3, 0x15, 10, 50),
                (4, 0x40, 5, 7)
            ]
        );
    }
}
