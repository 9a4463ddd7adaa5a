//! What an import says of its recording: the mode line's words (how the events were
//! sampled, what their counts let the numbers mean) and the events, each once with its
//! own samples.

use super::*;

/// How an event was sampled, for a mode line: its frequency, or its period (in `unit`).
pub(super) fn sampling(e: &EventAttr, unit: &str) -> String {
    if e.freq {
        format!("freq {} Hz, each sample's own period", e.period_or_freq)
    } else {
        format!("period {}{unit}", e.period_or_freq)
    }
}

/// What a profile from the branch stacks of `ev` (counting `est`) says, for its mode
/// line: how its instruction counts, cycles (from `cycles_name`'s samples) and CPI
/// were had.
pub(super) fn branch_meaning(
    est: Estimator,
    ev: &EventAttr,
    cycles_name: Option<&str>,
    window: usize,
    corrected: bool,
) -> String {
    // Before Sandy Bridge Intel had no retired taken-branch event; the executed one
    // (e.g. Westmere's, tests/data/README.md) also counts branches on mispredicted paths.
    let executed = if est == Estimator::TakenBranches
        && ev
            .display_name()
            .to_ascii_lowercase()
            .contains("br_inst_exec")
    {
        " (executed, not retired, taken branches: those on mispredicted paths count too, so the counts run high by their share)"
    } else {
        ""
    };
    match (est, cycles_name) {
        (Estimator::TakenBranches, Some(c)) => format!(
            "taken-branch event{executed}: absolute instruction counts (each range stands for period/{window}); cycles from {c} samples × their periods; CPI"
        ),
        (Estimator::TakenBranches, None) => format!(
            "taken-branch event{executed}: absolute instruction counts (each range stands for period/{window}), shares of instructions; the recording holds no cycles: no cycles, no CPI"
        ),
        (Estimator::Cycles, _) if corrected => "cycles event: cycles per function from the sample periods; instruction counts from the stacks weighted by period / cycles each window spans (timed entries; corrects cycle sampling's bias towards slow code); CPI = cycles / those counts"
            .to_string(),
        (Estimator::Cycles, _) => "cycles event: cycles per function from the sample periods; the instruction profile is relative (stacks sampled on cycles, not taken branches): no CPI from it"
            .to_string(),
        (Estimator::Other, Some(c)) => format!(
            "neither taken branches nor cycles: a relative instruction profile (each sample weighs 1); cycles from {c} samples; no CPI"
        ),
        (Estimator::Other, None) => "neither taken branches nor cycles: a relative instruction profile (each sample weighs 1), shares of instructions; no cycles, no CPI"
            .to_string(),
    }
}

/// The events of a branch-stack profile, each once with its own samples: the `branch`
/// event's stacks, the `cycles` event's samples (one event where the stacks were
/// sampled on cycles: `perf record -e cycles -b`).
pub(super) fn branch_event_infos(
    pass: &Pass,
    branch: usize,
    cycles: Option<usize>,
) -> Vec<EventInfo> {
    let mut infos = Vec::new();
    for (i, e) in pass.header.events.iter().enumerate() {
        let (role, also) = match (i == branch, Some(i) == cycles) {
            (true, true) => (EventRole::Branches, vec![EventRole::Cycles]),
            (true, false) => (EventRole::Branches, Vec::new()),
            (false, true) => (EventRole::Cycles, Vec::new()),
            (false, false) => continue,
        };
        // Freq mode has no one period: the mean of the samples' own, said in the name.
        let n = pass.per_event[i];
        let (name, period) = if e.freq {
            (
                format!(
                    "{} (freq {} Hz; mean period)",
                    e.display_name(),
                    e.period_or_freq
                ),
                pass.period_sums[i] / n.max(1),
            )
        } else {
            (e.display_name(), e.period_or_freq)
        };
        infos.push(EventInfo {
            role,
            name,
            period,
            jitter: 0,
            thinning: 1,
            unit: EventUnit::Events,
            samples: n,
            also,
        });
    }
    infos
}

/// The architecture the recording names, for its mode line.
pub(super) fn recorded_on(header: &perf_data::Header) -> String {
    match &header.arch {
        Some(a) => format!("recorded on {a}"),
        None => "no architecture recorded".to_string(),
    }
}

/// How a raw core-PMU event was read ([`Estimator::of`]), as `(code, note)`: its code,
/// to say after the name the recording gives it (`HEADER_EVENT_DESC`, the name `perf
/// evlist` shows: `br_inst_exec:taken (0x534088; …`) unless the name spells it; and
/// whether it was read on the recording's CPU or without one.
pub(super) fn raw_note(e: &EventAttr, header: &perf_data::Header) -> (String, String) {
    if !header.is_core_raw(e) {
        return Default::default();
    }
    let spelled = format!("{:x}", e.config);
    let code = match &e.name {
        Some(n) if !n.to_ascii_lowercase().contains(&spelled) => format!("{:#x}; ", e.config),
        _ => String::new(),
    };
    let note = match &header.cpuid {
        Some(cpu) => format!("; the code read as counted on its CPU, {cpu}"),
        None => "; the code read without a CPU (no cpuid header), so only codes that mean \
                 one event on every vendor are known"
            .to_string(),
    };
    (code, note)
}

/// Why a profile from branch stacks on `ev` (counting `est`) gives no CPI, or `None`
/// where it gives one: taken-branch stacks with a cycles event, or cycle-sampled stacks
/// weighted by the cycles each window spans (`corrected`).
pub(super) fn cpi_withheld(
    est: Estimator,
    ev: &str,
    corrected: bool,
    cycles: bool,
) -> Option<String> {
    match (est, cycles) {
        (_, false) => Some(format!(
            "the recording counts no cycles (its branch stacks are on {ev}), so there is no CPI"
        )),
        (Estimator::TakenBranches, true) => None,
        (Estimator::Cycles, true) if corrected => None,
        (Estimator::Cycles, true) => Some(format!(
            "its branch stacks were sampled on cycles ({ev}) without timed entries, so their \
             instruction counts are relative (cycle-sampled stacks over-weight slow code): \
             no CPI is drawn from them"
        )),
        (Estimator::Other, true) => Some(format!(
            "its branch stacks were sampled on {ev}, neither taken branches nor cycles, so \
             their instruction counts are relative: no CPI is drawn from them"
        )),
    }
}
