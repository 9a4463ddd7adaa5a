//! The page's one colour scale for CPI, stated on the page ([`SCALE`]) so a reader (and
//! a test) can tell a frame's CPI from its colour: t = log₂(CPI) / 2 clamped to
//! [−1, 1]; CPI above 1 is red, `hsl(8, 80 %, 92 − 42·t %)` (CPI 4 and above deepest:
//! stalls), CPI below 1 blue, `hsl(215, 70 %, 92 − 42·|t| %)` (CPI ¼ and below deepest).

/// The scale in words, for the page's legend.
pub(crate) const SCALE: &str = "colour = CPI of the frame's subtree (cycles / instructions): \
    red = more cycles per instruction (stalls: cache misses, mispredictions, long-latency \
    operations), deepest at CPI ≥ 4; blue = fewer, deepest at CPI ≤ 0.25; pale = CPI 1; \
    grey = too few samples for a CPI. Lightness = 92 % − 42 % × |log₂(CPI)| / 2.";

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
}
