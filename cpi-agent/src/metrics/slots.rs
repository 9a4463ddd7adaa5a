//! Which comms have their own metric series. At most `top_comms` comms have one at any
//! time; the rest add to `comm="other"`, and their samples to `cpi_bpf_comm_overflow_samples_total`.
//! Slots go by recent CPU, never first come (a user's 25 cheap processes started first
//! took every slot for an hour, and the busy service that followed had no series). Each
//! window adds a comm's weight (cycles, else cpu time, else samples; all its processes
//! together) to its score, which halves every window ([`SCORE_DECAY`]). A comm with
//! samples in the window takes a free slot, or the slot of the lowest-scoring labelled
//! comm if it outscores it by [`HYSTERESIS`], so comms of similar weight do not swap
//! series window after window. An idle comm keeps its series until another needs the
//! slot: its score halves every window, so the first busy comm that needs a slot takes
//! it at once (and a comm that just exited stays scrapeable while nothing needs its
//! slot: counters that vanish seconds after their process are missed by scrapes).
//! Scores are kept for at most [`candidate_cap`] comms, the lowest dropped, so endless distinct comms cost bounded memory. A comm that loses its
//! slot has its series removed and their values kept with its score; if it gets a slot
//! back, its series resume from those values (the counters never go down). Only a comm
//! the bounded table has forgotten restarts at 0, a counter reset `rate()` handles.

use std::collections::HashMap;

use cpi_user::profile::model::Profile;

use super::OTHER_COMM;

/// A comm's CPU score halves each window, so the ranking follows the last few windows.
const SCORE_DECAY: f64 = 0.5;
/// A comm takes a labelled comm's slot only when it outscores it by this factor, so
/// comms of similar weight do not swap series window after window.
const HYSTERESIS: f64 = 1.5;

/// One comm's sums over a window.
#[derive(Default)]
pub(super) struct CommTotals {
    pub(super) weight: f64,
    pub(super) samples: u64,
    pub(super) cycles: Option<f64>,
    pub(super) instructions: Option<f64>,
    pub(super) cpu_ns: Option<f64>,
}

fn add(a: &mut Option<f64>, b: Option<f64>) {
    if let Some(b) = b {
        *a = Some(a.unwrap_or(0.0) + b);
    }
}

/// Per comm, heaviest first (ties by name, so the order is deterministic).
pub(super) fn comm_totals(p: &Profile) -> Vec<(String, CommTotals)> {
    let mut by: HashMap<&str, CommTotals> = HashMap::new();
    for proc in &p.processes {
        let t = by.entry(proc.comm.as_str()).or_default();
        t.weight += proc
            .measures
            .cycles
            .or(proc.measures.time_ns)
            .unwrap_or(proc.samples as f64);
        t.samples += proc.samples;
        add(&mut t.cycles, proc.measures.cycles);
        add(&mut t.instructions, proc.measures.instructions);
        add(&mut t.cpu_ns, proc.measures.time_ns);
    }
    let mut v: Vec<(String, CommTotals)> =
        by.into_iter().map(|(c, t)| (c.to_string(), t)).collect();
    v.sort_by(|a, b| b.1.weight.total_cmp(&a.1.weight).then(a.0.cmp(&b.0)));
    v
}

/// One comm the ranking remembers.
#[derive(Default)]
struct Candidate {
    /// Its CPU weight, decayed by [`SCORE_DECAY`] each window.
    score: f64,
    /// Windows since its last samples.
    idle: u32,
    labelled: bool,
    /// Its series' values (cycles, instructions, cpu seconds) when it lost its slot,
    /// restored when it gets one back so the counters stay monotonic.
    kept: [Option<f64>; 3],
}

/// Candidates remembered for `top_comms` slots: enough that a comm near the cut keeps
/// its score (and its kept values), bounded whatever the comms on the host.
pub(super) fn candidate_cap(top_comms: usize) -> usize {
    top_comms.saturating_mul(4).max(64)
}

/// The slots changed by a window: comms whose series go away, comms that get one.
#[derive(Default)]
pub(super) struct SlotChanges {
    pub(super) lost: Vec<String>,
    pub(super) gained: Vec<String>,
}

/// The comms with their own series, ranked by recent CPU (module doc: the
/// cardinality rule).
pub(super) struct CommSlots {
    limit: usize,
    cap: usize,
    table: HashMap<String, Candidate>,
}

impl CommSlots {
    pub(super) fn new(limit: usize) -> CommSlots {
        CommSlots {
            limit,
            cap: candidate_cap(limit),
            table: HashMap::new(),
        }
    }

    /// Scores this window's comms (`totals`, heaviest first), trims the table to its
    /// bound, and gives slots to the heaviest others.
    pub(super) fn update(&mut self, totals: &[(String, CommTotals)]) -> SlotChanges {
        for c in self.table.values_mut() {
            c.score *= SCORE_DECAY;
            c.idle = c.idle.saturating_add(1);
        }
        for (i, (name, t)) in totals.iter().enumerate() {
            if name == OTHER_COMM {
                continue;
            }
            // Below the window's `cap` heaviest, a new comm would be trimmed at once:
            // do not insert it, so a flood of comms costs no more than `cap` entries.
            let c = match self.table.get_mut(name) {
                Some(c) => c,
                None if i < self.cap => self.table.entry(name.clone()).or_default(),
                None => continue,
            };
            c.score += t.weight;
            c.idle = 0;
        }
        self.trim();
        let mut changes = SlotChanges::default();
        self.admit(&mut changes);
        changes
    }

    /// Evicts the lowest-scoring unlabelled candidates beyond the bound.
    fn trim(&mut self) {
        let mut free: Vec<(f64, &String)> = (self.table.iter())
            .filter(|(_, c)| !c.labelled)
            .map(|(n, c)| (c.score, n))
            .collect();
        let excess = self.table.len().saturating_sub(self.cap).min(free.len());
        if excess == 0 {
            return;
        }
        free.select_nth_unstable_by(excess - 1, |a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
        let gone: Vec<String> = free[..excess].iter().map(|(_, n)| (*n).clone()).collect();
        for n in gone {
            self.table.remove(&n);
        }
    }

    /// Gives free slots to this window's heaviest unlabelled comms, then lets each
    /// further one take the weakest labelled comm's slot when it outscores it by
    /// [`HYSTERESIS`].
    fn admit(&mut self, changes: &mut SlotChanges) {
        let by_score =
            |a: &(f64, String), b: &(f64, String)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let mut challengers: Vec<(f64, String)> = (self.table.iter())
            .filter(|(_, c)| !c.labelled && c.idle == 0 && c.score > 0.0)
            .map(|(n, c)| (c.score, n.clone()))
            .collect();
        challengers.sort_by(by_score);
        let mut holders: Vec<(f64, String)> = (self.table.iter())
            .filter(|(_, c)| c.labelled)
            .map(|(n, c)| (c.score, n.clone()))
            .collect();
        // Weakest last, so pop() gives it.
        holders.sort_by(by_score);
        for (score, name) in challengers {
            if holders.len() + changes.gained.len() >= self.limit {
                match holders.last() {
                    Some((weakest, _)) if score > HYSTERESIS * weakest => {}
                    _ => break,
                }
                if let Some((_, out)) = holders.pop() {
                    self.set_labelled(&out, false);
                    changes.lost.push(out);
                }
            }
            self.set_labelled(&name, true);
            changes.gained.push(name);
        }
    }

    fn set_labelled(&mut self, name: &str, labelled: bool) {
        if let Some(c) = self.table.get_mut(name) {
            c.labelled = labelled;
        }
    }

    pub(super) fn label<'a>(&self, comm: &'a str) -> &'a str {
        match self.table.get(comm) {
            Some(c) if c.labelled => comm,
            _ => OTHER_COMM,
        }
    }

    /// Remembers a comm's series values as it loses its slot.
    pub(super) fn keep(&mut self, comm: &str, values: [Option<f64>; 3]) {
        if let Some(c) = self.table.get_mut(comm) {
            c.kept = values;
        }
    }

    pub(super) fn kept(&self, comm: &str) -> [Option<f64>; 3] {
        self.table.get(comm).map_or([None; 3], |c| c.kept)
    }

    #[cfg(test)]
    pub(super) fn tracked(&self) -> usize {
        self.table.len()
    }
}
