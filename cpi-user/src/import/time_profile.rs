//! A recording whose branch stacks are not used: its clock or cycles samples as a time
//! profile, with their callchains.

use super::*;

/// A recording whose branch stacks are not used (it has none, or they are another
/// architecture's code): the samples of `clock` (`cpu-clock`, `task-clock`; periods in
/// ns) as a time profile, or those of a cycles event, with their callchains.
pub(super) fn load_time_profile(
    file: &std::fs::File,
    what: &str,
    opts: &ImportOptions,
    (clock, timer): (usize, Timer),
    scan: &Pass,
) -> Result<Loaded, ImportError> {
    let roles = match timer {
        Timer::Clock => Roles {
            clock: Some(clock),
            ..Roles::default()
        },
        Timer::Cycles => Roles {
            cycles: Some(clock),
            ..Roles::default()
        },
    };
    let (pass, placed) = placed_pass(
        file,
        what,
        (opts.window, StackWeighting::Window),
        roles,
        (&opts.locator, scan),
    )?;
    let Said {
        notes,
        details,
        files: unusable,
    } = placed.said;
    let e = &pass.header.events[clock];
    let n = pass.per_event[clock];
    let sampling = sampling(e, if timer == Timer::Clock { " ns" } else { "" });
    let period = if e.freq {
        pass.period_sums[clock] / n.max(1)
    } else {
        e.period_or_freq
    };
    let header = &pass.header;
    let stacks = stacks_said(e, header);
    // Another architecture's binaries are not opened (Relocator): per mapped file only.
    let scope = match header.foreign_arch() {
        Some(a) => format!(
            "its {a} code is not read here (this build reads x86-64 code only): samples \
             per mapped file, no functions, instruction counts, blocks or CPI"
        ),
        None => "no branch stacks".to_string(),
    };
    let (mode, role, unit, meaning) = match timer {
        Timer::Clock => (
            Mode::TimeProfile,
            EventRole::CpuClock,
            EventUnit::Ns,
            format!("{scope}: a time profile, no instructions, no CPI"),
        ),
        Timer::Cycles => (
            Mode::IpSampling,
            EventRole::Cycles,
            EventUnit::Events,
            format!("{scope}: cycles from the samples × their periods, no instructions, no CPI"),
        ),
    };
    let run = RunInfo {
        mode,
        mode_reason: format!(
            "imported from perf.data {what} ({}): {} samples ({sampling}), {stacks}; \
             {meaning}",
            recorded_on(header),
            e.display_name()
        ),
        command: Vec::new(),
        duration_secs: pass.duration_secs(),
        events: vec![EventInfo {
            role,
            name: e.display_name(),
            period,
            jitter: 0,
            thinning: 1,
            unit,
            samples: n,
            also: Vec::new(),
        }],
        perturbation: Perturbation::None,
        lost: placed.lost,
    };
    Ok(Loaded {
        set: pass.set,
        run,
        notes,
        details,
        unusable,
        other_kernel: header.other_kernel(),
        arch: header.arch.clone(),
        // A time profile counts no instructions: nothing to withhold.
        cpi_withheld: None,
        by_instructions: false,
    })
}

/// What a time profile's samples of `e` have for call stacks, for its mode line.
fn stacks_said(e: &EventAttr, header: &perf_data::Header) -> &'static str {
    if e.has_user_stack() && header.foreign_arch().is_some() {
        "with their kernel callchains only (the copied user stacks are another \
         architecture's, not unwound here)"
    } else if e.has_user_stack() {
        "with call stacks unwound here from their copied user stacks (--call-graph dwarf)"
    } else if e.has_callchain() {
        "with callchains"
    } else {
        "without callchains (perf record -g records them)"
    }
}
