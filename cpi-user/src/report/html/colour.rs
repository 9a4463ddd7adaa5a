//! The page's two colour scales for CPI. The default, [`relative`] ([`RELATIVE_SCALE`]),
//! sets a frame's self CPI against its process's: red where it is higher, blue lower,
//! deeper with |log₂ ratio|, and coloured only where the two error bars do not overlap,
//! so the colour points at the code that stalls more than the rest of its program
//! (real code sits between CPI 1.5 and 2.5, one pale band on any absolute scale).
//!
//! The absolute scale, stated on the page ([`SCALE`]) so a reader (and
//! a test) can tell a frame's CPI from its colour: t = log₂(CPI) / 2 clamped to
//! [−1, 1]; CPI above 1 is red, `hsl(8, 80 %, 92 − 42·t %)` (CPI 4 and above deepest:
//! stalls), CPI below 1 blue, `hsl(215, 70 %, 92 − 42·|t| %)` (CPI ¼ and below deepest).

/// The scale in words, for the page's legend.
pub(crate) const SCALE: &str = "colour = CPI of the frame's subtree (cycles / instructions): \
    red = more cycles per instruction (stalls: cache misses, mispredictions, long-latency \
    operations), deepest at CPI ≥ 4; blue = fewer, deepest at CPI ≤ 0.25; pale = CPI 1; \
    grey = too few samples for a CPI. Lightness = 92 % − 42 % × |log₂(CPI)| / 2.";

/// The relative scale in words, for the page's legend.
pub(crate) const RELATIVE_SCALE: &str = "colour = the frame's self CPI (cycles / instructions \
    of the code in the function itself, on this call path) against its process's CPI: red = \
    higher (stalls: cache misses, mispredictions, long-latency operations), blue = lower, \
    deepest at 4× either way, coloured only where the two error bars (one standard error \
    each) do not overlap; beige = within its error of the process's CPI, or no samples of \
    its own; grey = too few samples for a self CPI. Lightness = 82 % − 32 % × \
    min(|log₂(self CPI / process CPI)| / 2, 1). In a callers view, the frame's CPI \
    against the function's.";

/// Fill of a frame whose self CPI its error does not separate from its process's.
const SAME: &str = "hsl(40,30%,88%)";

/// Fill of frames without a CPI in a profile that has CPI (too few samples).
const NO_CPI: &str = "#d4d4d4";
/// Fill of every frame of a profile without CPI (a time profile): one colour, as the
/// colour says nothing there.
const UNCOLOURED: &str = "#e8c9a0";

/// The fill for a CPI on the scale.
pub(crate) fn of_cpi(cpi: f64) -> String {
    let t = (cpi.max(1e-9).log2() / 2.0).clamp(-1.0, 1.0);
    let light = 92.0 - 42.0 * t.abs();
    if t >= 0.0 {
        format!("hsl(8,80%,{light:.1}%)")
    } else {
        format!("hsl(215,70%,{light:.1}%)")
    }
}

/// A frame's fill: on the scale where the profile has CPI, else one neutral colour.
pub fn frame(profile_has_cpi: bool, cpi: Option<f64>) -> String {
    match (profile_has_cpi, cpi) {
        (true, Some(c)) => of_cpi(c),
        (true, None) => NO_CPI.into(),
        (false, _) => UNCOLOURED.into(),
    }
}

/// The two fills of a frame or a table's CPI cell: on the relative scale (the page's
/// default: `own` ± its relative error against `reference`, `own_samples` the samples
/// behind it) and on the absolute one (for `abs`). One colour for both where the
/// profile has no CPI. The page's switch swaps them everywhere.
pub(crate) fn fills(
    has_cpi: bool,
    abs: Option<f64>,
    own: Option<(f64, f64)>,
    reference: Option<(f64, f64)>,
    own_samples: u64,
) -> (String, String) {
    let abs = frame(has_cpi, abs);
    if !has_cpi {
        return (abs.clone(), abs);
    }
    (relative(own, reference, own_samples), abs)
}

/// A frame's fill on the relative scale: `own` its self CPI ± relative error,
/// `reference` its process's, `own_samples` the IP samples of its own.
pub(crate) fn relative(
    own: Option<(f64, f64)>,
    reference: Option<(f64, f64)>,
    own_samples: u64,
) -> String {
    let (Some((c, rc)), Some((r, rr))) = (own, reference) else {
        return if own_samples == 0 { SAME } else { NO_CPI }.into();
    };
    if !separated((c, rc), (r, rr)) {
        return SAME.into();
    }
    let t = ((c / r).log2().abs() / 2.0).min(1.0);
    let light = 82.0 - 32.0 * t;
    if c > r {
        format!("hsl(8,80%,{light:.1}%)")
    } else {
        format!("hsl(215,70%,{light:.1}%)")
    }
}

/// Whether two estimates' error bars (± one relative standard error each) do not
/// overlap.
pub(crate) fn separated((a, ra): (f64, f64), (b, rb): (f64, f64)) -> bool {
    (a - b).abs() > a * ra + b * rb
}

/// A heat-map fill for a share of a function's cycles or samples (0..1): white to orange.
pub(crate) fn heat(share: f64) -> String {
    let s = share.clamp(0.0, 1.0).sqrt();
    format!("hsl(32,95%,{:.1}%)", 100.0 - 45.0 * s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_is_red_for_stalls_and_blue_for_fast_code() {
        assert_eq!(of_cpi(4.0), "hsl(8,80%,50.0%)");
        assert_eq!(of_cpi(16.0), "hsl(8,80%,50.0%)");
        assert_eq!(of_cpi(1.0), "hsl(8,80%,92.0%)");
        assert_eq!(of_cpi(0.5), "hsl(215,70%,71.0%)");
        assert_eq!(of_cpi(0.1), "hsl(215,70%,50.0%)");
    }

    #[test]
    fn relative_colour_only_where_the_errors_separate() {
        let process = Some((2.0, 0.01));
        assert_eq!(relative(Some((8.0, 0.1)), process, 50), "hsl(8,80%,50.0%)");
        assert_eq!(relative(Some((4.0, 0.1)), process, 50), "hsl(8,80%,66.0%)");
        assert_eq!(
            relative(Some((1.0, 0.1)), process, 50),
            "hsl(215,70%,66.0%)"
        );
        // 2.2 ± 10 % reaches 1.98, under the process's 2.02: not separated.
        assert_eq!(relative(Some((2.2, 0.1)), process, 50), SAME);
        assert_eq!(relative(None, process, 3), NO_CPI);
        assert_eq!(relative(None, process, 0), SAME);
        assert_eq!(relative(Some((4.0, 0.1)), None, 50), NO_CPI);
    }
}
