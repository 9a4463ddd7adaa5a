//! The error model: every ± the profile reports is **one standard error** of the
//! estimate, relative to it (`Estimate::rel_error`, the `*_rel_error` fields in
//! cpi-user/src/profile/model.rs).
//!
//! Samples of each kind (branch samples; IP samples per event) are dealt in turn into
//! [`GROUPS`] interleaved groups as they arrive (sample i → group i mod G), and every
//! aggregate keeps its weight per group. A unit's estimate is then the sum of G
//! replicate estimates, each a sample of the run at G times the period, and its variance
//! is the replicate estimator G/(G−1) Σ_g (x_g − x/G)².
//! * **Instructions** (and block and instruction counts): the ranges of one branch sample
//!   come from one window (a loop's body repeats in it), so they are correlated; a
//!   sample's ranges all fall in its group, so the variance counts samples, not ranges,
//!   whatever the correlation, and each sample weighs its own (perturbed) period.
//! * **Cycles** (time; instructions in IP-sampling mode): the same over IP samples.
//! * **CPI** = cycles / instructions from two independent samplers:
//!   rel² = rel²(cycles) + rel²(instructions).
//! * **Timed CPI** = Σ LBR cycles / Σ instructions of the same timed ranges: the replicate
//!   variance of the residuals c_g − R·n_g (the delta method for a ratio).
//!
//! The variance is estimated with G − 1 = 31 degrees of freedom (an error / reported
//! error ratio is Student's t₃₁ at worst). Interleaved replicates see the run at 32 times
//! the period, so where a unit runs in bursts longer than one period they overstate the
//! error of the full sample somewhat: `cpi-bpf simulate --calibrate N -- CMD` measures the
//! coverage (docs/METHOD.md, "Error bars").

/// Interleaved groups the samples of each kind are dealt into.
pub(crate) const GROUPS: usize = 32;

/// Relative errors below this are the rounding of the f32 group sums (≈ 6·10⁻⁸ per
/// addition, over thousands of additions), not a spread the samples show.
pub(crate) const RESOLUTION: f64 = 1e-6;

/// Per-group sums of one quantity over the samples of each group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Groups(pub [f32; GROUPS]);

impl Default for Groups {
    fn default() -> Self {
        Groups([0.0; GROUPS])
    }
}

impl Groups {
    /// Adds `v` to group `g`.
    pub fn add(&mut self, g: usize, v: f64) {
        self.0[g] += v as f32;
    }

    /// Adds `k` × every group of `o`.
    pub(crate) fn add_scaled(&mut self, o: &Groups, k: f64) {
        let k = k as f32;
        self.0.iter_mut().zip(&o.0).for_each(|(a, b)| *a += k * b);
    }

    /// Σ over groups.
    pub fn total(&self) -> f64 {
        self.0.iter().map(|&x| x as f64).sum()
    }

    /// The replicate variance of the total.
    pub(crate) fn variance(&self) -> f64 {
        replicate_variance(&self.0.map(f64::from))
    }
}

/// The replicate variance of the sum of the per-group values `x`.
fn replicate_variance(x: &[f64; GROUPS]) -> f64 {
    let mean = x.iter().sum::<f64>() / GROUPS as f64;
    let ss: f64 = x.iter().map(|&x| (x - mean).powi(2)).sum();
    ss * GROUPS as f64 / (GROUPS - 1) as f64
}

/// The group of a process's `n`-th sample of one kind.
pub(crate) fn group_of(n: u64) -> usize {
    (n % GROUPS as u64) as usize
}

/// Relative standard error of `value` with variance `var` (0 when `value` is 0).
pub fn relative(value: f64, var: f64) -> f64 {
    if value > 0.0 {
        var.max(0.0).sqrt() / value
    } else {
        0.0
    }
}

/// Relative standard error of a quotient of two independent estimates, from theirs.
pub(crate) fn quotient(rel_num: f64, rel_den: f64) -> f64 {
    rel_num.hypot(rel_den)
}

/// Relative standard error of Σnum / Σden when both come from the same samples (timed
/// CPI): the replicate variance of the residuals num_g − R·den_g, over Σden².
pub fn ratio(num: &Groups, den: &Groups) -> f64 {
    let (n, d) = (num.total(), den.total());
    if n <= 0.0 || d <= 0.0 {
        return 0.0;
    }
    let r = n / d;
    // The residuals in f64: in f32 a residual below half an ulp of the sums is lost.
    let z: [f64; GROUPS] = std::array::from_fn(|g| num.0[g] as f64 - r * den.0[g] as f64);
    relative(n, replicate_variance(&z))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_groups_have_no_variance_and_one_group_has_all() {
        let mut g = Groups::default();
        (0..GROUPS).for_each(|i| g.add(i, 10.0));
        assert_eq!(g.variance(), 0.0);
        let mut one = Groups::default();
        one.add(0, 320.0);
        // Σ (x − 10)² = 310² + 31·10² = 99 200; × 32/31.
        assert!((one.variance() - 99_200.0 * 32.0 / 31.0).abs() < 1e-6);
    }

    /// Independent (Bernoulli) draws: the replicate variance matches Σ weight².
    #[test]
    fn groups_estimate_the_spread_of_independent_samples() {
        let mut g = Groups::default();
        let mut sq = 0.0;
        let mut state = 1u64;
        for n in 0..200_000u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (state >> 33).is_multiple_of(10) {
                g.add(group_of(n), 3.0);
                sq += 9.0;
            }
        }
        let ratio = g.variance() / sq;
        // The variance estimate has 31 degrees of freedom: ± 25 % at one sigma.
        assert!((0.3..2.0).contains(&ratio), "{ratio}");
    }

    #[test]
    fn ratio_of_proportional_groups_is_exact() {
        let (mut c, mut n) = (Groups::default(), Groups::default());
        for i in 0..GROUPS {
            n.add(i, (i + 1) as f64);
            c.add(i, 2.0 * (i + 1) as f64);
        }
        assert!(ratio(&c, &n) < 1e-6);
        assert!((quotient(0.03, 0.04) - 0.05).abs() < 1e-12);
    }
}
