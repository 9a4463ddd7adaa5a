//! The diff's table: 80 columns, foreign names escaped.

use std::fmt::Write;

use super::{Basis, Change, Diff, UnitDiff, UnitKind};
use crate::fsafe::escape;
use crate::report::table::{ellipsize, si, time, wrap};

/// The table: processes then functions, `top` rows each, every line within 80
/// columns; foreign names escaped. Units with nothing on either side (every quantity
/// 0 → 0) are left out.
pub fn render(d: &Diff, top: usize) -> String {
    let mut s = header(d);
    for (kind, title) in [
        (UnitKind::Process, "processes"),
        (UnitKind::Function, "functions"),
        (UnitKind::Path, "call paths (leaf ← callers)"),
    ] {
        let rows: Vec<&UnitDiff> = (d.units.iter())
            .filter(|u| u.kind == kind && !u.is_empty())
            .collect();
        if rows.is_empty() && kind == UnitKind::Path {
            continue;
        }
        let _ = write!(s, "\n{title}");
        if rows.len() > top {
            let _ = write!(s, " (top {top} of {})", rows.len());
        }
        let _ = writeln!(
            s,
            "\n  {:<26} {:<7} {:>8} {:>8} {:>15} {:>7}",
            "name", "what", "base", "new", "Δ % ± σ", "z"
        );
        for u in rows.into_iter().take(top) {
            s.push_str(&row(u));
        }
    }
    s.push_str(
        "\n* significant; the row shows the unit's most significant change; σ: one\n  \
         standard error of the change, relative to base (to new for a new unit)\n",
    );
    s
}

/// What was tested and how units were matched, wrapped at 80 columns.
fn header(d: &Diff) -> String {
    let modes = if d.base_mode == d.new_mode {
        d.base_mode.name().to_string()
    } else {
        format!("{} → {}", d.base_mode.name(), d.new_mode.name())
    };
    let matched = matching(d);
    let text = format!(
        "diff of {modes} profiles: {} {} changes tested, {} significant \
         (Benjamini–Hochberg at α = {}); {}",
        d.tests,
        match d.basis {
            Basis::Absolute => "absolute",
            Basis::Share => "share",
        },
        d.significant,
        d.alpha,
        escape(&matched),
    );
    wrap(&text, Some(80))
}

/// How the diff matched its units, as a sentence's clause (not escaped).
pub(crate) fn matching(d: &Diff) -> String {
    match &d.pairing {
        Some(p) => format!(
            "{}; other processes by comm, their functions by binary file name and name",
            p.describe()
        ),
        None => "processes matched by comm, functions by binary file name and function \
                 name, call paths by their names"
            .to_string(),
    }
}

/// A relative change in at most 6 characters (`+30.0%`, `+1234%`, `×56`).
fn percent(r: f64, sign: bool) -> String {
    let x = r * 100.0;
    match (x.abs(), sign) {
        (a, _) if a >= 9999.5 => format!("×{:.0}", r.abs()),
        (a, true) if a >= 99.95 => format!("{x:+.0}%"),
        (a, false) if a >= 99.95 => format!("{x:.0}%"),
        (_, true) => format!("{x:+.1}%"),
        // A σ under 0.1 % keeps a digit that is not 0, and one under 0.005 % is not
        // printed as none.
        (a, false) if a > 0.0 && a < 0.005 => "<0.01%".to_string(),
        (a, false) if a > 0.0 && a < 0.095 => format!("{x:.2}%"),
        (_, false) => format!("{x:.1}%"),
    }
}

/// One value of quantity `what` in its unit: CPI to 3 decimals, time in ms or s,
/// shares in %, counts with an SI suffix.
pub(crate) fn value(what: &str, v: f64) -> String {
    match what {
        "cpi" => format!("{v:.3}"),
        "time_ns" => time(v),
        k if k.ends_with("_share") => format!("{:.1}%", v * 100.0),
        _ => si(v),
    }
}

/// The change relative to base and its σ (`+30.0%`, `1.2%`); `new` where base is 0
/// and NEW has some, its σ then relative to the new value (a percentage like every
/// other σ of the column); `-` and no σ where both are 0.
pub(crate) fn delta_pm(c: &Change) -> (String, String) {
    match c.delta_rel {
        Some(r) => (
            percent(r, true),
            percent(c.delta_error / c.base.abs(), false),
        ),
        None if c.new != 0.0 => (
            "new".to_string(),
            percent(c.delta_error / c.new.abs(), false),
        ),
        None => ("-".to_string(), String::new()),
    }
}

/// z with one decimal where it means something; a z of thousands without.
pub(crate) fn z_text(z: f64) -> String {
    if z.abs() < 100.0 {
        format!("{z:.1}")
    } else {
        format!("{z:.0}")
    }
}

fn row(u: &UnitDiff) -> String {
    let name = ellipsize(&escape(&u.name), 26);
    let Some((what, c)) = u.headline() else {
        return format!("  {name:<26}\n");
    };
    let delta = match delta_pm(c) {
        (d, sigma) if sigma.is_empty() => d,
        (d, sigma) => format!("{d} ± {sigma}"),
    };
    let label = match what {
        "instructions" => "instr",
        "cycles_share" => "cyc sh",
        "time_ns" => "time",
        "time_ns_share" => "time sh",
        "instructions_share" => "ins sh",
        "cpi" => "CPI",
        k => k,
    };
    format!(
        "{} {name:<26} {label:<7} {:>8} {:>8} {delta:>15} {:>7}\n",
        if u.significant { '*' } else { ' ' },
        value(what, c.base),
        value(what, c.new),
        z_text(c.z),
    )
}
