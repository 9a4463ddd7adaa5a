//! The run header: the mode first, the command, duration, samples and losses always.

use super::*;

/// The run in a few lines: the mode, the command, duration, samples and losses; with
/// `verbose`, the mode's reason, each event and its period, losses by reason, notes.
pub(super) fn header(p: &Profile, opts: &TableOptions) -> String {
    let w = opts.width;
    let mut s = match &p.recorded_on {
        Some(arch) => wrap(
            &format!("mode: {} — recorded on {arch}", p.mode.description()),
            w,
        ),
        None => wrap(&format!("mode: {}", p.mode.description()), w),
    };
    if opts.verbose {
        s += &wrap(&format!("reason: {}", p.mode_reason), w);
    }
    if !p.command.is_empty() {
        s += &wrap(&format!("command: {}", p.command.join(" ")), w);
    }
    let samples: u64 = p.events.iter().map(|e| e.samples).sum();
    let events: Vec<&str> = p.events.iter().map(|e| e.name.as_str()).collect();
    let mut line = format!(
        "{:.2} s, {} samples ({}), {} lost",
        p.duration_secs,
        group(samples),
        events.join(", "),
        group(p.lost_samples)
    );
    if let Some(k) = kernel_share(p) {
        let _ = write!(line, ", {} in the kernel", pct(k));
    }
    // Said here, not only under -v: shares below are of what found a function.
    let placed: u64 = p.processes.iter().map(|pr| pr.samples).sum();
    let unplaced = p.lost.unmapped_samples;
    if unplaced > 0 {
        let _ = write!(
            line,
            ", {} of samples in no function",
            pct(unplaced as f64 / placed.max(unplaced) as f64)
        );
    }
    if !opts.verbose {
        line += " (-v: periods, losses by reason, notes)";
    }
    s += &wrap(&line, w);
    if !opts.verbose {
        return s;
    }
    let mut line = format!("perturbation: {}", p.perturbation.name());
    // The range window only means something where there are branch records.
    if p.range_window > 0 && p.mode.uses_ranges() {
        let _ = write!(line, ", range window: {}", p.range_window);
    }
    s += &wrap(&line, w);
    for e in &p.events {
        let mut period = format!("period {} {}", e.period, e.unit);
        if e.jitter > 0 {
            let _ = write!(period, " + up to {} re-drawn", e.jitter);
        }
        if e.thinning > 1 {
            let _ = write!(period, ", thinned 1/{}", e.thinning);
        }
        s += &wrap(
            &format!(
                "event: {} {} ({period}): {} samples",
                e.role_names(),
                e.name,
                group(e.samples)
            ),
            w,
        );
    }
    s += &wrap(
        &format!(
            "lost samples: {} {}",
            group(p.lost_samples),
            p.lost.breakdown()
        ),
        w,
    );
    for b in p.binaries.iter().filter(|b| b.deleted || b.stripped) {
        let what = match (b.deleted, b.stripped) {
            (true, true) => {
                "deleted since mapped; stripped: function bounds from .eh_frame or .gopclntab"
            }
            (true, false) => "deleted since mapped",
            _ => "stripped: function bounds from .eh_frame or .gopclntab",
        };
        s += &wrap(&format!("note: {}: {what}", b.path), w);
    }
    s
}

/// The share of the profile's cycles (CPU time in a time profile) in kernel code,
/// when there is any: said on the summary line, so the shares below are read knowing it.
/// Of all the processes' samples, those that found no function included: a share of
/// the functions alone said "100 % in the kernel" of a program whose own code had no
/// symbols.
fn kernel_share(p: &Profile) -> Option<f64> {
    let fns = || p.processes.iter().flat_map(|pr| &pr.functions);
    let in_functions: f64 = fns().map(|f| heat(p.mode, f)).sum();
    let in_processes: f64 = (p.processes.iter())
        .map(|pr| {
            if p.mode.has_cpi() {
                pr.measures.cycles.unwrap_or(0.0)
            } else {
                pr.measures.time_ns.unwrap_or(pr.samples as f64)
            }
        })
        .sum();
    let total = in_functions.max(in_processes);
    let kernel: f64 = fns()
        .filter(|f| f.binary == KERNEL)
        .map(|f| heat(p.mode, f))
        .sum();
    (kernel > 0.0 && total > 0.0).then(|| kernel / total)
}

/// The binary kernel code is attributed to (binary/symbolize.rs).
const KERNEL: &str = "[kernel]";
