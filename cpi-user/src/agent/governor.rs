//! The overhead governor (`--overhead-budget PCT`): after each window, the agent's cost —
//! its own CPU time (`/proc/self/stat`, every thread) plus the in-kernel run time of its
//! BPF programs (BPF_ENABLE_STATS, `Session::bpf_run_time` in
//! cpi-user/src/collect/session.rs; they run on the sampled tasks' time, so the two do not
//! overlap) — as a fraction of one CPU over the window's wall time. Over budget → the
//! sampling frequency goes down in proportion (most of the cost scales with it), never
//! below `--min-frequency`; well under budget → back up, at most doubling per window,
//! never above `--frequency`. Samples carry their period, so profiles stay unbiased
//! across a change. The logic is pure ([`Governor::observe`]); the agent measures and
//! applies.

use std::time::Duration;

/// Raise only when the overhead is below this fraction of the budget (hysteresis).
const RAISE_BELOW: f64 = 0.5;
/// Aim this far under the budget when lowering.
const TARGET: f64 = 0.8;
/// Changes smaller than this fraction of the current frequency are not made.
const MIN_STEP: f64 = 0.1;

/// Cumulative costs at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// utime + stime of the agent process, seconds.
    pub cpu_seconds: f64,
    /// In-kernel run time of its BPF programs, seconds (0 when unavailable).
    pub bpf_seconds: f64,
}

/// What one window's measurement led to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// Agent + BPF cost over the window, percent of one CPU.
    pub overhead_pct: f64,
    /// The new frequency when it changes.
    pub change: Option<(u64, u64)>,
}

/// The frequency and the last usage seen; one per agent, driven once per window.
#[derive(Clone, Debug)]
pub struct Governor {
    /// Percent of one CPU.
    budget_pct: f64,
    min_hz: u64,
    max_hz: u64,
    hz: u64,
    last: Option<Usage>,
}

impl Governor {
    /// Starts at `max_hz` (the requested `--frequency`).
    pub fn new(budget_pct: f64, min_hz: u64, max_hz: u64) -> Self {
        Governor {
            budget_pct,
            min_hz: min_hz.min(max_hz).max(1),
            max_hz: max_hz.max(1),
            hz: max_hz.max(1),
            last: None,
        }
    }

    /// The sampling frequency to run at now, Hz.
    pub fn frequency(&self) -> u64 {
        self.hz
    }

    /// The frequency the session actually runs at (e.g. a failed change).
    pub fn set_frequency(&mut self, hz: u64) {
        self.hz = hz;
    }

    /// Takes the cumulative usage at the end of a window of `wall` time; the first
    /// call only sets the baseline.
    pub fn observe(&mut self, now: Usage, wall: Duration) -> Option<Decision> {
        let last = self.last.replace(now)?;
        let wall = wall.as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let spent = (now.cpu_seconds - last.cpu_seconds).max(0.0)
            + (now.bpf_seconds - last.bpf_seconds).max(0.0);
        let overhead_pct = 100.0 * spent / wall;
        let next = next_frequency(
            self.hz,
            overhead_pct,
            self.budget_pct,
            self.min_hz,
            self.max_hz,
        );
        let change = (next != self.hz).then_some((self.hz, next));
        self.hz = next;
        Some(Decision {
            overhead_pct,
            change,
        })
    }
}

/// The frequency after a window that cost `overhead_pct` at `hz` (module doc).
pub fn next_frequency(
    hz: u64,
    overhead_pct: f64,
    budget_pct: f64,
    min_hz: u64,
    max_hz: u64,
) -> u64 {
    let hz_f = hz as f64;
    let wanted = if overhead_pct > budget_pct {
        hz_f * TARGET * budget_pct / overhead_pct
    } else if overhead_pct < RAISE_BELOW * budget_pct {
        let room = if overhead_pct > 0.0 {
            TARGET * budget_pct / overhead_pct
        } else {
            2.0
        };
        hz_f * room.min(2.0)
    } else {
        hz_f
    };
    let wanted = (wanted.round() as u64).clamp(min_hz, max_hz);
    let step = (wanted as f64 - hz_f).abs() / hz_f;
    // Small steps are noise, except reaching a bound.
    if step < MIN_STEP && wanted != min_hz && wanted != max_hz {
        hz
    } else {
        wanted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_budget_lowers_in_proportion_not_below_the_floor() {
        // 4 % measured against 1 %: down to 0.8/4 of the rate.
        assert_eq!(next_frequency(1000, 4.0, 1.0, 10, 1000), 200);
        assert_eq!(next_frequency(1000, 400.0, 1.0, 10, 1000), 10, "floor");
        assert_eq!(
            next_frequency(10, 5.0, 1.0, 10, 1000),
            10,
            "already at the floor"
        );
    }

    #[test]
    fn well_under_raises_at_most_double_not_above_the_ceiling() {
        assert_eq!(next_frequency(100, 0.1, 1.0, 10, 1000), 200);
        assert_eq!(next_frequency(100, 0.3, 1.0, 10, 1000), 200);
        assert_eq!(next_frequency(100, 0.45, 1.0, 10, 1000), 178);
        assert_eq!(next_frequency(800, 0.0, 1.0, 10, 999), 999, "ceiling");
        assert_eq!(next_frequency(999, 0.0, 1.0, 10, 999), 999);
    }

    #[test]
    fn near_the_budget_holds_steady() {
        for o in [0.5, 0.7, 0.9, 1.0] {
            assert_eq!(next_frequency(500, o, 1.0, 10, 1000), 500, "overhead {o}");
        }
    }

    #[test]
    fn observe_measures_cpu_plus_bpf_over_wall_and_settles() {
        let mut g = Governor::new(1.0, 10, 1000);
        assert_eq!(g.observe(Usage::default(), Duration::from_secs(10)), None);
        // 0.3 s of agent CPU + 0.1 s in BPF over 10 s = 4 %.
        let d = g
            .observe(
                Usage {
                    cpu_seconds: 0.3,
                    bpf_seconds: 0.1,
                },
                Duration::from_secs(10),
            )
            .unwrap();
        assert!((d.overhead_pct - 4.0).abs() < 1e-9);
        assert_eq!(d.change, Some((1000, 200)));
        assert_eq!(g.frequency(), 200);
        // A cost proportional to the rate (4 % at 1000 Hz): the next windows stay put
        // under budget.
        let mut u = Usage {
            cpu_seconds: 0.3,
            bpf_seconds: 0.1,
        };
        for _ in 0..5 {
            let cost = 4.0 / 100.0 * 10.0 * g.frequency() as f64 / 1000.0;
            u.cpu_seconds += cost;
            let d = g.observe(u, Duration::from_secs(10)).unwrap();
            assert!(d.overhead_pct <= 1.0 + 1e-9, "{d:?}");
        }
        assert_eq!(g.frequency(), 200);
    }
}
