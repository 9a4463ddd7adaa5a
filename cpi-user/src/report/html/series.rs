//! A store range over time (`report --store DIR --since … --format html`): each
//! window's CPU time (or cycles) and CPI per comm, drawn as the page's chart.

use std::time::SystemTime;

use serde::Serialize;

use crate::profile::model::Profile;

/// One window's totals per comm.
#[derive(Clone, Debug, Serialize)]
pub struct WindowTotals {
    /// The window's start and end, seconds since the epoch.
    pub start: f64,
    /// End of the window.
    pub end: f64,
    /// Per comm: CPU time (ns), cycles and instructions where measured.
    pub comms: Vec<CommTotals>,
}

/// One comm's totals in one window.
#[derive(Clone, Debug, Serialize)]
pub struct CommTotals {
    /// The process name.
    pub comm: String,
    /// CPU time, ns (a time profile), else `None`.
    pub time_ns: Option<f64>,
    /// Cycles, where counted.
    pub cycles: Option<f64>,
    /// Instructions, where counted.
    pub instructions: Option<f64>,
    /// Σ CPI × instructions and Σ instructions over the comm's processes that have a
    /// CPI: the window's CPI is their quotient, so a comm of one process charts that
    /// process's own estimate (the profile's, which sums the cycles of the code it
    /// read at instruction level, not every cycle of the process).
    pub cpi_weight: Option<(f64, f64)>,
}

impl WindowTotals {
    /// The totals of `p`, the window from `start` to `end`.
    pub fn of(p: &Profile, start: SystemTime, end: SystemTime) -> WindowTotals {
        let secs = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        };
        let mut comms: Vec<CommTotals> = Vec::new();
        for pr in &p.processes {
            let add = |a: &mut Option<f64>, b: Option<f64>| {
                if let Some(b) = b {
                    *a = Some(a.unwrap_or(0.0) + b);
                }
            };
            let i = match comms.iter().position(|c| c.comm == pr.comm) {
                Some(i) => i,
                None => {
                    comms.push(CommTotals {
                        comm: pr.comm.clone(),
                        time_ns: None,
                        cycles: None,
                        instructions: None,
                        cpi_weight: None,
                    });
                    comms.len() - 1
                }
            };
            let c = &mut comms[i];
            add(&mut c.time_ns, pr.measures.time_ns);
            add(&mut c.cycles, pr.measures.cycles);
            add(&mut c.instructions, pr.measures.instructions);
            if let (Some(cpi), Some(n)) = (pr.measures.cpi, pr.measures.instructions) {
                let (w, i) = c.cpi_weight.unwrap_or_default();
                c.cpi_weight = Some((w + cpi.value * n, i + n));
            }
        }
        WindowTotals {
            start: secs(start),
            end: secs(end),
            comms,
        }
    }
}

/// The chart of a store range: per comm (the [`CHART_COMMS`] largest), a line of its
/// CPU (cores busy, or cycles per second) and, where the profile has CPI, a line of its
/// CPI, one point per window.
#[derive(Serialize)]
pub(crate) struct Chart {
    /// `cores` (CPU time per second) or `cycles/s`.
    unit: &'static str,
    lines: Vec<Line>,
    /// Largest value of each panel (the y axis' top).
    top: f64,
    cpi_top: f64,
    /// The range's first and last time, RFC 3339.
    from: String,
    to: String,
}

/// One comm's lines.
#[derive(Serialize)]
struct Line {
    comm: String,
    colour: &'static str,
    /// SVG points (`x,y …`) of the CPU line and of the CPI line (empty without CPI).
    points: String,
    cpi_points: String,
    /// The values themselves, per window (`,`-separated), for scripts and tests.
    values: String,
    cpi_values: String,
}

/// Comms charted, largest first.
pub(crate) const CHART_COMMS: usize = 8;
const PALETTE: [&str; CHART_COMMS] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
/// A comm's values per window: its CPU, and its CPI where there is one.
type Column = (String, Vec<Option<f64>>, Vec<Option<f64>>);

const W: f64 = 1200.0;
const H: f64 = 160.0;

impl Chart {
    /// The chart of `series`; `None` for fewer than two windows.
    pub fn of(series: &[WindowTotals]) -> Option<Chart> {
        let (first, last) = (series.first()?, series.last()?);
        if series.len() < 2 {
            return None;
        }
        let time = series
            .iter()
            .flat_map(|w| &w.comms)
            .any(|c| c.time_ns.is_some());
        let amount = |c: &CommTotals, secs: f64| {
            let v = if time {
                c.time_ns.map(|t| t / 1e9)
            } else {
                c.cycles
            };
            v.unwrap_or(0.0) / secs.max(1e-9)
        };
        let cpi = |c: &CommTotals| match c.cpi_weight {
            Some((w, i)) if i > 0.0 => Some(w / i),
            _ => None,
        };
        let totals = largest(series, &amount);
        let per = |comm: &str, f: &dyn Fn(&CommTotals, f64) -> Option<f64>| -> Vec<Option<f64>> {
            series
                .iter()
                .map(|w| {
                    w.comms
                        .iter()
                        .find(|c| c.comm == comm)
                        .and_then(|c| f(c, w.end - w.start))
                })
                .collect()
        };
        let columns: Vec<Column> = totals
            .into_iter()
            .map(|comm| {
                let a = per(&comm, &|c, s| Some(amount(c, s)));
                let b = per(&comm, &|c, _| cpi(c));
                (comm, a, b)
            })
            .collect();
        let max = |k: fn(&Column) -> &Vec<Option<f64>>| {
            columns
                .iter()
                .flat_map(|c| k(c).iter().flatten())
                .fold(0.0f64, |a, &b| a.max(b))
        };
        let (top, cpi_top) = (max(|c| &c.1), max(|c| &c.2));
        let span = (last.end - first.start).max(1e-9);
        let x = |w: &WindowTotals| ((w.start + w.end) / 2.0 - first.start) / span * W;
        let line = |vals: &[Option<f64>], top: f64| {
            series
                .iter()
                .zip(vals)
                .filter_map(|(w, v)| {
                    v.map(|v| format!("{:.1},{:.1}", x(w), H - v / top.max(1e-12) * H))
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let list = |vals: &[Option<f64>]| {
            vals.iter()
                .map(|v| v.map_or(String::new(), |v| format!("{v:.6e}")))
                .collect::<Vec<_>>()
                .join(",")
        };
        let lines = columns
            .iter()
            .zip(PALETTE)
            .map(|((comm, a, b), colour)| Line {
                comm: comm.clone(),
                colour,
                points: line(a, top),
                cpi_points: line(b, cpi_top),
                values: list(a),
                cpi_values: list(b),
            })
            .collect();
        let rfc = crate::report::time::rfc3339_of_secs;
        Some(Chart {
            unit: if time { "cores" } else { "cycles/s" },
            lines,
            top,
            cpi_top,
            from: rfc(first.start),
            to: rfc(last.end),
        })
    }
}

/// The [`CHART_COMMS`] comms with the most of `amount` over `series`, largest first.
fn largest(series: &[WindowTotals], amount: &dyn Fn(&CommTotals, f64) -> f64) -> Vec<String> {
    let mut totals: Vec<(String, f64)> = Vec::new();
    for w in series {
        for c in &w.comms {
            match totals.iter_mut().find(|t| t.0 == c.comm) {
                Some(t) => t.1 += amount(c, w.end - w.start),
                None => totals.push((c.comm.clone(), amount(c, w.end - w.start))),
            }
        }
    }
    totals.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    totals.truncate(CHART_COMMS);
    totals.into_iter().map(|(c, _)| c).collect()
}
