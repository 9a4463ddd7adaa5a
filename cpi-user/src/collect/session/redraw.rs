//! The user layer's period re-draws of a [`super::Session`]'s open events.

use std::time::{Duration, Instant};

use cpi_common::policy::Rng;
use cpi_common::wire::EventRole;

use crate::collect::drain::CpuClockPeriods;
use crate::collect::events::EventSpec;
use crate::collect::ladder::OpenEvent;
use crate::collect::sys::PerfSys;

/// Events whose count is read (and maybe re-drawn) per re-draw tick at most: a process
/// with thousands of threads must not turn re-draws into a CPU hog (≈ 5 µs each).
const REDRAWS_PER_TICK: usize = 64;

/// The user layer's re-draw schedule: each open event is re-drawn once it has counted
/// [`cpi_common::policy::PeriodPolicy::redraw_after`] since its last re-draw.
pub(super) struct Redraw {
    rng: Rng,
    /// Per open event: the count at which it is re-drawn next.
    at: Vec<u64>,
    /// Per open event: when its count is next read. A `cpu-clock` event counts
    /// nanoseconds, at most one per nanosecond on each CPU it counts on, so it cannot
    /// reach `at` sooner than `at − count` ns (divided by those CPUs) after a read: until
    /// then it is not read (a read of another CPU's event is a cross-CPU call). At 19 Hz
    /// that is one read per re-draw, 2.5–5.9 s apart, instead of one per tick.
    read_at: Vec<Instant>,
    /// How often an event is read at most ([`CollectOptions::redraw_every`](crate::collect::CollectOptions::redraw_every)).
    every: Duration,
    /// CPUs online: what an event not bound to one CPU can count on at once.
    cpus: u64,
    next: usize,
}

impl Redraw {
    pub(super) fn new(
        now: Instant,
        rng: Rng,
        every: Duration,
        cpus: u64,
        specs: &[EventSpec],
        open: &[OpenEvent],
    ) -> Self {
        let mut r = Redraw {
            rng,
            at: vec![0; open.len()],
            read_at: vec![now; open.len()],
            every,
            cpus: cpus.max(1),
            next: 0,
        };
        for (i, e) in open.iter().enumerate() {
            let after = specs[e.spec_index].policy.redraw_after(&mut r.rng);
            r.at[i] = after;
            r.read_at[i] = r.next_read(now, specs, e, after);
        }
        r
    }

    /// When event `e`, read at `now` and `left` short of its re-draw, is read next.
    fn next_read(&self, now: Instant, specs: &[EventSpec], e: &OpenEvent, left: u64) -> Instant {
        let cannot_be_due = if specs[e.spec_index].role == EventRole::CpuClock {
            let cpus = if e.place.cpu().is_some() {
                1
            } else {
                self.cpus
            };
            Duration::from_nanos(left / cpus)
        } else {
            Duration::ZERO
        };
        now + cannot_be_due.max(self.every)
    }

    /// The soonest any event is read next: when [`Redraw::tick`] has work.
    pub(super) fn due(&self) -> Option<Instant> {
        self.read_at.iter().min().copied()
    }

    /// Reads the counts of up to [`REDRAWS_PER_TICK`] events whose read is due at `now`
    /// (round robin) and re-draws those that reached their count. Events the kernel
    /// created by `inherit` (threads started later) have no fd here and keep the period
    /// drawn when they were born. A failure (the event's thread exited) only means that
    /// event keeps its period.
    pub(super) fn tick(
        &mut self,
        now: Instant,
        sys: &dyn PerfSys,
        specs: &[EventSpec],
        open: &[OpenEvent],
        periods: &mut CpuClockPeriods,
    ) {
        let mut reads = 0;
        for _ in 0..open.len() {
            if reads == REDRAWS_PER_TICK {
                break;
            }
            let i = self.next % open.len();
            self.next += 1;
            if self.read_at[i] > now {
                continue;
            }
            reads += 1;
            let e = &open[i];
            let Ok(count) = sys.read_count(&e.fd) else {
                self.read_at[i] = now + self.every;
                continue;
            };
            if count >= self.at[i] {
                let spec = &specs[e.spec_index];
                let period = spec.policy.draw(&mut self.rng);
                if sys.set_period(&e.fd, period).is_ok() && spec.role == EventRole::CpuClock {
                    periods.set(e.place, period);
                }
                self.at[i] = count.saturating_add(spec.policy.redraw_after(&mut self.rng));
            }
            self.read_at[i] = self.next_read(now, specs, e, self.at[i].saturating_sub(count));
        }
    }

    /// After a rate change: every event restarts its schedule from its count now.
    pub(super) fn restart(&mut self, sys: &dyn PerfSys, specs: &[EventSpec], open: &[OpenEvent]) {
        let now = Instant::now();
        for (i, e) in open.iter().enumerate() {
            let count = sys.read_count(&e.fd).unwrap_or(0);
            let after = specs[e.spec_index].policy.redraw_after(&mut self.rng);
            self.at[i] = count.saturating_add(after);
            self.read_at[i] = self.next_read(now, specs, e, after);
        }
    }
}
