//! The perturbation policy (docs/METHOD.md, "Perturbation"): period `N + random delta`, in two
//! layers:
//!
//! * **kernel** — the eBPF program cannot change a perf event's period (no helper, no
//!   kfunc on the kernels this targets). It *thins*: after each emitted record it draws how many
//!   overflows to skip, and the next record carries the summed period of every overflow
//!   since the last one ([`ThinState::on_overflow`]). Totals stay exact; output volume
//!   drops by the thinning factor.
//! * **user** — the collector re-draws each event's period, `P + R` rounded up to a
//!   prime, `R` uniform in `0..=jitter`, `jitter ≪ P` ([`PeriodPolicy::draw`]), and sets
//!   it with `PERF_EVENT_IOC_PERIOD` once the event has counted a random number of its
//!   own periods since the last re-draw ([`PeriodPolicy::redraw_after`]). The ioctl
//!   restarts the count, so each re-draw throws away the progress towards the next
//!   overflow; many periods between re-draws keep that loss small at every rate.
//!
//! The eBPF program, the collector and the PMU model all call these functions, so the
//! model measures the policy that production runs.
#![warn(missing_docs)]

/// xorshift64* — tiny, branch-free, no division: fine for the verifier. Not for crypto.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator from `seed` (0 is remapped: xorshift has an all-zero fixed point).
    pub const fn new(seed: u64) -> Self {
        Rng {
            state: if seed == 0 {
                0x9e37_79b9_7f4a_7c15
            } else {
                seed
            },
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..=max` (modulo bias is < max / 2^64: negligible for our ranges).
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        self.next_u64() % (max + 1)
    }
}

/// Which layers of the policy run.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Perturbation {
    /// Fixed period, every overflow emitted.
    None = 0,
    /// In-kernel thinning only.
    Kernel = 1,
    /// User-space period re-draws only.
    User = 2,
    /// Both layers (the default).
    Both = 3,
}

impl Perturbation {
    /// The in-kernel thinning layer runs.
    pub const fn kernel(self) -> bool {
        matches!(self, Perturbation::Kernel | Perturbation::Both)
    }

    /// The user-space period re-draw layer runs.
    pub const fn user(self) -> bool {
        matches!(self, Perturbation::User | Perturbation::Both)
    }

    /// The name used on the command line and in profiles.
    pub const fn name(self) -> &'static str {
        match self {
            Perturbation::None => "none",
            Perturbation::Kernel => "kernel",
            Perturbation::User => "user",
            Perturbation::Both => "both",
        }
    }

    /// The thinning the kernel layer applies: `keep_one_in` when that layer runs, off
    /// otherwise. The hardware period is the requested one either way.
    pub const fn thinning(self, keep_one_in: u32) -> Thinning {
        if self.kernel() {
            Thinning::new(keep_one_in)
        } else {
            Thinning::OFF
        }
    }
}

/// The default layers, from the PMU model's synchronisation measurement
/// (`tests/tests/it/simulate.rs`, docs/METHOD.md, "Perturbation"): user-space re-draws remove the
/// bias of a loop locked onto the period; in-kernel thinning cannot move the phase (the
/// hardware still overflows every P events), it only cuts the records written. So by
/// default only the user layer runs and thinning is an opt-in volume control.
pub const DEFAULT_PERTURBATION: Perturbation = Perturbation::User;

/// Thinning factor when the kernel layer runs and none is given.
pub const DEFAULT_THINNING: u32 = 4;

/// The range window (`--range-window`, README.md "Usage") for branch stacks `depth`
/// entries deep: every range of a full stack (a fixed count, so samples weigh the same).
pub const fn range_window(depth: usize) -> usize {
    if depth > 1 {
        depth - 1
    } else {
        1
    }
}

/// Window when the branch-record depth is unknown: Intel's pre-Skylake and AMD Zen 4's
/// 16 entries.
pub const FALLBACK_RANGE_WINDOW: usize = range_window(16);

/// A sampling period and how far the user-space layer may move it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeriodPolicy {
    /// `P`: a prime, the period when no perturbation runs.
    pub base: u64,
    /// Largest `R`; `P + R` is rounded up to a prime.
    pub jitter: u64,
}

impl PeriodPolicy {
    /// Jitter is `P / 16` by default: wide enough to de-phase any loop shorter than that,
    /// narrow enough (≤ 6 %) to keep the rate what the user asked for.
    pub const DEFAULT_JITTER_SHIFT: u32 = 4;

    /// The policy around `target`: base = the first prime ≥ `target`, default jitter.
    pub fn around(target: u64) -> Self {
        let base = next_prime(target.max(2));
        PeriodPolicy {
            base,
            jitter: base >> Self::DEFAULT_JITTER_SHIFT,
        }
    }

    /// A fresh period: the first prime ≥ `P + R`.
    pub fn draw(&self, rng: &mut Rng) -> u64 {
        next_prime(self.base + rng.up_to(self.jitter))
    }

    /// How much the event must count (in its own units) before its next re-draw:
    /// `K × P`, `K` uniform in [`REDRAW_PERIODS`]. A re-draw restarts the count and so
    /// discards on average half a period of progress: `1 / (2 K)` of the samples, under
    /// 1 % for the mean `K`, whatever the rate — the schedule follows the event's count,
    /// not the clock, so neither a low rate nor a busy machine (the target counting
    /// slower than wall time) raises the loss.
    pub fn redraw_after(&self, rng: &mut Rng) -> u64 {
        let (lo, hi) = (*REDRAW_PERIODS.start(), *REDRAW_PERIODS.end());
        self.base.saturating_mul(lo + rng.up_to(hi - lo))
    }
}

/// Periods counted between two user-layer re-draws of one event (uniform, so re-draws
/// of different events do not fall into step).
pub const REDRAW_PERIODS: core::ops::RangeInclusive<u64> = 48..=112;

/// In-kernel thinning: one emitted record per `keep_one_in` overflows on average.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thinning {
    /// 1 = emit every overflow.
    pub keep_one_in: u32,
    /// Keeps the layout free of implicit padding (the eBPF side reads it as bytes).
    pub _pad: u32,
}

impl Thinning {
    /// No thinning: every overflow is emitted.
    pub const OFF: Thinning = Thinning {
        keep_one_in: 1,
        _pad: 0,
    };

    /// One record per `keep_one_in` overflows (0 is taken as 1).
    pub const fn new(keep_one_in: u32) -> Self {
        Thinning {
            keep_one_in: if keep_one_in == 0 { 1 } else { keep_one_in },
            _pad: 0,
        }
    }
}

/// Per-CPU (kernel) or per-counter (model) thinning state.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThinState {
    /// [`Rng`] state for the skip draws; 0 = not seeded yet (`cpi-ebpf/src/main.rs`
    /// seeds it on a CPU's first overflow).
    pub rng_state: u64,
    /// Overflows still to skip before the next emitted record.
    pub skip_left: u64,
    /// Period accumulated by skipped overflows, carried by the next emitted record.
    pub pending: u64,
}

impl ThinState {
    /// A fresh state whose skip draws start from `seed`; the first overflow is emitted.
    pub const fn new(seed: u64) -> Self {
        ThinState {
            rng_state: Rng::new(seed).state,
            skip_left: 0,
            pending: 0,
        }
    }

    /// One counter overflow whose period was `period`. Returns the weight (events the
    /// record stands for) when this overflow is to be emitted, `None` when thinned.
    ///
    /// Skips are uniform in `0..=2(K-1)`, mean `K - 1`, so one overflow in `K` is kept
    /// on average, at a random phase.
    pub fn on_overflow(&mut self, period: u64, thin: Thinning) -> Option<u64> {
        self.pending += period;
        if self.skip_left > 0 {
            self.skip_left -= 1;
            return None;
        }
        let weight = self.pending;
        self.pending = 0;
        let k = thin.keep_one_in as u64;
        if k > 1 {
            let mut rng = Rng::new(self.rng_state);
            self.skip_left = rng.up_to(2 * (k - 1));
            self.rng_state = rng.state;
        }
        Some(weight)
    }
}

/// Configuration the collector writes into the eBPF programs' config map (index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// Thinning applied to every event's overflows.
    pub thinning: Thinning,
    /// Emit samples whose IP is in the kernel (otherwise counted as seen, not emitted).
    pub include_kernel: u32,
    /// `FILTER_*` bits: which allow-lists a sample must pass (all that are set); 0 keeps
    /// every sample. Failing samples are counted as `Counter::Filtered` only.
    pub filter: u32,
    /// Bit L set: some allowed cgroup sits at level L of the cgroup v2 tree (root = 0),
    /// so the program compares the sample's ancestor at L (`bpf_get_current_ancestor_cgroup_id`).
    pub cgroup_levels: u32,
    /// Keeps the layout free of implicit padding (the eBPF side reads it as bytes).
    pub _pad: u32,
}

/// [`KernelConfig::filter`]: the sample's tgid must be in the eBPF map `ALLOWED_TGIDS`.
pub const FILTER_TGID: u32 = 1 << 0;
/// [`KernelConfig::filter`]: one of the sample's cgroup v2 ancestors (itself included)
/// must be in the eBPF map `ALLOWED_CGROUPS`.
pub const FILTER_CGROUP: u32 = 1 << 1;
/// [`KernelConfig::filter`], with [`FILTER_TGID`]: a process that a kept process forks
/// is kept too, from its first instruction (user space takes the tgids of processes
/// gone out of `ALLOWED_TGIDS`). The eBPF program sees each fork and exit itself (raw tracepoints
/// `task_newtask` and `sched_process_exit`), so no sample waits for user space to learn
/// of a child: `-p` and `-- CMD` as root count per CPU, not per thread.
pub const FILTER_FOLLOW: u32 = 1 << 2;

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            thinning: Thinning::OFF,
            include_kernel: 0,
            filter: 0,
            cgroup_levels: 0,
            _pad: 0,
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]` plain data.
    unsafe impl aya::Pod for super::KernelConfig {}
    unsafe impl aya::Pod for super::ThinState {}
}

/// Trial division; user space only (the eBPF side never draws periods).
pub fn is_prime(n: u64) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) || n.is_multiple_of(3) {
        return false;
    }
    let mut d = 5u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) || n.is_multiple_of(d + 2) {
            return false;
        }
        d += 6;
    }
    true
}

/// The first prime ≥ `n`.
pub fn next_prime(n: u64) -> u64 {
    let mut c = n.max(2);
    while !is_prime(c) {
        c += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn primes() {
        let small: std::vec::Vec<u64> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert_eq!(next_prime(500_000), 500_009); // Linux AutoFDO doc's period
        assert!(!is_prime(1_000_000_007 * 3));
    }

    #[test]
    fn draws_stay_in_band_and_vary() {
        let p = PeriodPolicy::around(100_000);
        assert!(is_prime(p.base) && p.jitter == p.base >> 4);
        let mut rng = Rng::new(42);
        let draws: std::vec::Vec<u64> = (0..1000).map(|_| p.draw(&mut rng)).collect();
        assert!(draws
            .iter()
            .all(|&d| d >= p.base && d <= next_prime(p.base + p.jitter)));
        assert!(draws.iter().all(|&d| is_prime(d)));
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(
            distinct.len() > 200,
            "only {} distinct periods",
            distinct.len()
        );
    }

    #[test]
    fn redraws_wait_many_periods_at_random() {
        let p = PeriodPolicy::around(100_000);
        let mut rng = Rng::new(3);
        let waits: std::vec::Vec<u64> = (0..2000).map(|_| p.redraw_after(&mut rng)).collect();
        assert!(waits.iter().all(|&w| w >= 48 * p.base && w <= 112 * p.base));
        let mean_k = waits.iter().sum::<u64>() as f64 / waits.len() as f64 / p.base as f64;
        assert!((mean_k - 80.0).abs() < 2.0, "mean {mean_k} periods");
        // Expected loss per re-draw: half a period, over the mean wait.
        assert!(0.5 / mean_k < 0.01);
        let huge = PeriodPolicy {
            base: u64::MAX / 4,
            jitter: 0,
        };
        assert_eq!(
            huge.redraw_after(&mut rng),
            u64::MAX,
            "saturates, no overflow"
        );
    }

    #[test]
    fn thinning_keeps_totals_exact_and_rate_near_k() {
        let mut st = ThinState::new(7);
        let thin = Thinning::new(8);
        let (mut emitted, mut weight) = (0u64, 0u64);
        for _ in 0..80_000 {
            if let Some(w) = st.on_overflow(1000, thin) {
                emitted += 1;
                weight += w;
            }
        }
        assert_eq!(weight + st.pending, 80_000 * 1000, "no period is lost");
        let rate = 80_000.0 / emitted as f64;
        assert!((rate - 8.0).abs() < 0.3, "one in {rate}, expected ≈ 8");
        let mut off = ThinState::new(1);
        assert_eq!(off.on_overflow(5, Thinning::OFF), Some(5));
        assert_eq!(off.on_overflow(5, Thinning::OFF), Some(5));
    }
}
