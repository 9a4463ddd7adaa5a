//! The line under the tables that explains their notation: each view records the
//! notations it writes ([`Notes`]), and the legend names only those.

use super::wrap;

/// A notation the tables may use, explained under them only when used.
#[derive(Clone, Copy)]
#[repr(u8)]
pub(crate) enum Notation {
    /// `±`: a standard error.
    Error = 1,
    /// A share's `±`, in percentage points.
    ShareError = 2,
    BelowFloor = 4,
    TimedCpi = 8,
    /// `≠`: the two CPI estimates disagree.
    Differs = 16,
    /// A CPI the profile withholds ([`Notes::withheld`]) written as `-`.
    Withheld = 32,
    /// `[N]`: a call-tree row deeper than its indentation shows.
    Depth = 64,
    /// `…` in a call path: frames left out to fit.
    Elided = 128,
}

/// The notations the views wrote, each recorded where it is written, for [`legend`].
/// A `Cell` so the table builders (`Fn` closures, built again to fit) can record.
#[derive(Default)]
pub(crate) struct Notes {
    used: std::cell::Cell<u8>,
    /// Why the profile has no CPI ([`crate::profile::model::Profile::cpi_withheld`]):
    /// no CPI is written, whatever the samples.
    pub(crate) withheld: Option<String>,
}

impl Notes {
    /// The notes of a view of `p`.
    pub(crate) fn of(p: &crate::profile::model::Profile) -> Notes {
        Notes {
            withheld: p.cpi_withheld.clone(),
            ..Notes::default()
        }
    }

    pub(crate) fn add(&self, n: Notation) {
        self.used.set(self.used.get() | n as u8);
    }

    fn has(&self, n: Notation) -> bool {
        self.used.get() & n as u8 != 0
    }
}

/// A line under the tables explaining the notation they use, only what they use.
pub(super) fn legend(notes: &Notes, width: Option<usize>) -> String {
    let mut parts = Vec::new();
    if notes.has(Notation::Error) {
        // What every ± means: cpi-user/src/profile/error.rs.
        parts.push("±: one standard error (the truth within ±1 for ~68 % of units, ±2 for ~95 %)");
    }
    if notes.has(Notation::ShareError) {
        parts.push("a share's ± is in percentage points, the sampling error of its samples");
    }
    if notes.has(Notation::BelowFloor) {
        parts.push("below floor: too few samples for a CPI");
    }
    if notes.has(Notation::TimedCpi) {
        parts.push("timed CPI: from the cycles the branch records carry");
    }
    if notes.has(Notation::Differs) {
        parts.push("≠: the two CPI estimates differ by more than 3 combined errors");
    }
    if notes.has(Notation::Depth) {
        parts.push("[N] name: a call-tree row at depth N, deeper than its indentation");
    }
    if notes.has(Notation::Elided) {
        parts.push("… in a path: frames (or a name's end) left out to fit; a row keeps its leaf and the frames that set it apart");
    }
    let withheld;
    if let (true, Some(why)) = (notes.has(Notation::Withheld), &notes.withheld) {
        withheld = format!("CPI -: {why}");
        parts.push(&withheld);
    }
    if parts.is_empty() {
        return String::new();
    }
    format!("\n{}", wrap(&parts.join("; "), width))
}
