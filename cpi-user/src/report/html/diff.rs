//! `cpi-bpf diff --format html`: the diff's table and a differential flame graph. The
//! graph is NEW's call tree (width = its cycles or time); each frame is matched to
//! BASE's frame of the same path (processes by comm, as the diff matches them) and
//! coloured by its subtree's change: tested like the table's units, z = Δ / √(σ_base² +
//! σ_new²) with Benjamini–Hochberg at the diff's level over the frames drawn. Paths only
//! BASE has are not drawn (their width in NEW is 0); the table lists what vanished.

use minijinja::context;
use serde::Serialize;

use super::flame::{self, ProcessKey, Sums, Tree, Width};
use super::{environment, svg_frames, Graph, HtmlError, Look, Strings, SCRIPT, STYLE};
use crate::profile::model::Profile;
use crate::profile::AnalysisOptions;
use crate::report::diff::render::{delta_pm, matching, value, z_text};
use crate::report::diff::{
    aligned, benjamini_hochberg, p_value, share_of, z_score, Basis, Change, Diff,
};

/// One frame's change against the base.
#[derive(Serialize, Clone, Debug)]
pub(super) struct FrameChange {
    base: f64,
    delta: f64,
    delta_error: f64,
    z: f64,
    significant: bool,
}

/// One tested change of one unit, a row of the page's table: values in their units
/// (as the terminal's table writes them), the raw numbers for sorting; the name and
/// comm numbers in the page's [`Strings`].
#[derive(Serialize)]
struct Row<'a> {
    kind: crate::report::diff::UnitKind,
    name: usize,
    comm: usize,
    quantity: &'static str,
    change: &'a Change,
    base: String,
    new: String,
    delta: String,
    sigma: String,
    z: String,
}

/// The tested changes with something on either side (no `0 → 0`).
fn rows<'a>(d: &'a Diff, strings: &Strings) -> Vec<Row<'a>> {
    d.units
        .iter()
        .flat_map(|u| {
            (u.changes.iter())
                .filter(|(_, c)| c.tested && (c.base != 0.0 || c.new != 0.0))
                .map(move |(q, c)| {
                    let (delta, sigma) = delta_pm(c);
                    Row {
                        kind: u.kind,
                        name: strings.id(&u.name),
                        comm: strings.id(&u.comm),
                        quantity: q,
                        change: c,
                        base: value(q, c.base),
                        new: value(q, c.new),
                        delta,
                        sigma: if sigma.is_empty() {
                            sigma
                        } else {
                            format!("± {sigma}")
                        },
                        z: z_text(c.z),
                    }
                })
        })
        .collect()
}

/// Fill of a frame whose change is not significant.
const UNCHANGED: &str = "#e4e4e4";

/// The fill of a significant change: red where NEW has more, blue less, deeper with the
/// relative change (full at ±100 %).
fn change_colour(c: &FrameChange) -> String {
    if !c.significant {
        return UNCHANGED.into();
    }
    let rel = if c.base > 0.0 {
        (c.delta / c.base).abs().min(1.0)
    } else {
        1.0
    };
    let light = 85.0 - 35.0 * rel;
    if c.delta > 0.0 {
        format!("hsl(8,80%,{light:.1}%)")
    } else {
        format!("hsl(215,70%,{light:.1}%)")
    }
}

/// Each node of `new` with its counterpart in `base` (same path of names).
fn matched(base: &Tree, new: &Tree) -> Vec<Option<usize>> {
    let mut of = vec![None; new.nodes.len()];
    of[0] = Some(0);
    // Parents come before children in `nodes`.
    for i in 1..new.nodes.len() {
        let n = &new.nodes[i];
        of[i] = of[n.parent].and_then(|bp| base.find(bp, &n.name, &n.binary));
    }
    of
}

/// A value and its variance on the diff's basis: absolute, or the share of the root.
fn on_basis(s: &Sums, root: &Sums, basis: Basis) -> (f64, f64) {
    match basis {
        Basis::Absolute => (s.width, s.width_var),
        Basis::Share => share_of((s.width, s.width_var), (root.width, root.width_var)),
    }
}

/// A frame's change as its tooltip says it: both values in their unit, Δ % ± σ, z.
fn tip(c: &FrameChange, quantity: &str) -> String {
    let change = Change::new((c.base, 0.0), (c.base + c.delta, 0.0));
    let (delta, sigma) = delta_pm(&Change {
        delta_error: c.delta_error,
        ..change
    });
    let sigma = if sigma.is_empty() {
        sigma
    } else {
        format!(" ± {sigma}")
    };
    format!(
        "base {}, new {}: Δ {delta}{sigma} (z {}){}",
        value(quantity, c.base),
        value(quantity, c.base + c.delta),
        z_text(c.z),
        if c.significant {
            ", significant"
        } else {
            ", not significant"
        }
    )
}

/// The page of a diff of `base` and `new`.
pub fn render_diff(base: &Profile, new: &Profile, d: &Diff) -> Result<String, HtmlError> {
    let width = if d.amount == "time_ns" {
        Width::Time
    } else {
        Width::Cycles
    };
    let (base, new) = aligned(base, new, d.pairing.as_ref());
    let (tb, tn) = (
        flame::callers_first(&base, width, ProcessKey::Comm),
        flame::callers_first(&new, width, ProcessKey::Comm),
    );
    let ids = Default::default();
    let strings = Strings::default();
    let look = Look {
        width,
        counts: false,
        cpi: false,
        floor: AnalysisOptions::default().sample_floor,
        ids: &ids,
        strings: &strings,
    };
    let quantity = match d.basis {
        Basis::Absolute => d.amount.to_string(),
        Basis::Share => format!("{}_share", d.amount),
    };
    let total = tn.nodes[0].total.width;
    let (mut frames, dropped) = svg_frames(&tn, false, &look, total);
    let of = matched(&tb, &tn);
    let (rb, rn) = (tb.nodes[0].total, tn.nodes[0].total);
    let changes: Vec<FrameChange> = frames
        .iter()
        .map(|f| {
            let none = Sums::default();
            let b = of[f.node].map_or(&none, |i| &tb.nodes[i].total);
            let (vb, eb) = on_basis(b, &rb, d.basis);
            let (vn, en) = on_basis(&tn.nodes[f.node].total, &rn, d.basis);
            let sigma = (eb + en).sqrt();
            FrameChange {
                base: vb,
                delta: vn - vb,
                delta_error: sigma,
                z: z_score(vn - vb, sigma),
                significant: false,
            }
        })
        .collect();
    let p: Vec<f64> = changes.iter().map(|c| p_value(c.z)).collect();
    let flagged = benjamini_hochberg(&p, d.alpha);
    for ((f, mut c), s) in frames.iter_mut().zip(changes).zip(flagged) {
        c.significant = s && f.depth > 0;
        f.fill = change_colour(&c);
        f.tip = tip(&c, &quantity);
        f.change = Some(c);
    }
    let page = environment()?.get_template("diff.html")?.render(context! {
        diff => d,
        matching => matching(d),
        rows => rows(d, &strings),
        width_name => width.name(),
        graph => Graph::of(frames, dropped),
        strings => strings.json(),
        script => SCRIPT,
        style => STYLE,
    })?;
    Ok(page)
}
