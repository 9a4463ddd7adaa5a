//! The one-shot (`cpi-bpf --pid`, `-a`, `-- CMD`): one window collected until a stop
//! condition, its end said, analysed into a profile. The binary parses its arguments
//! and renders what this returns.

use super::{collect, CollectError, CollectOptions, Notice, StopReason};
use crate::binary::kallsyms::Kallsyms;
use crate::binary::symbolize::SymbolizerOptions;
use crate::profile::analyze::LineDetail;
use crate::profile::{analyze, AnalysisOptions, Mode, Profile};

/// What a one-shot collects, and how much of the code it resolves.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// The collection.
    pub collect: CollectOptions,
    /// Source lines for every instruction of the sampled functions (what `--annotate`
    /// shows), not only for the sampled ones: every instruction of every sampled
    /// function made a clang build's profile 185 MB.
    pub every_line: bool,
}

/// A one-shot's profile and how the collection ended.
#[derive(Debug)]
pub struct Recorded {
    /// The analysed profile.
    pub profile: Profile,
    /// Why collection stopped.
    pub stop: Option<StopReason>,
    /// The exit status of the command cpi-bpf started.
    pub command_status: Option<i32>,
}

/// Collects as `opts` say, tells `notify` the mode, the step-downs and, before the
/// analysis, that collection stopped (the tests read a target's CPU time at that line),
/// and analyses the window. Lost samples are logged as a warning.
pub fn record(
    opts: &RecordOptions,
    notify: &mut dyn FnMut(Notice<'_>),
) -> Result<Recorded, CollectError> {
    // Naming kernel functions reads /proc/kallsyms, which the kernel formats as it is
    // read (0.4 s on a busy machine): read it while collecting, not after.
    let symbolizer = SymbolizerOptions::default();
    if opts.collect.include_kernel {
        symbolizer.kallsyms.iter().for_each(Kallsyms::read_ahead);
    }
    let collected = collect(&opts.collect, notify)?;
    let stop = match (collected.stop, collected.command_status) {
        (Some(StopReason::TargetExit), Some(status)) => {
            format!("command exited with status {status}")
        }
        (s, _) => s.unwrap_or(StopReason::Finished).to_string(),
    };
    let received: u64 = collected.run.events.iter().map(|e| e.samples).sum();
    notify(Notice::plain(&format!(
        "stopped ({stop}) after {:.2} s: {received} samples received",
        collected.run.duration_secs
    )));
    let lines = if opts.every_line {
        LineDetail::Every
    } else {
        LineDetail::Evidence
    };
    let analysis = AnalysisOptions {
        lines,
        symbolizer,
        ..AnalysisOptions::default()
    };
    let profile = analyze(&collected.set, collected.run, &analysis);
    // The profile's own loss account (collection and analysis), so this line, the table
    // and the JSON count the same things; none lost is said by the table and JSON only.
    if profile.lost_samples > 0 {
        log::warn!(
            "{} samples lost {}",
            profile.lost_samples,
            profile.lost.breakdown()
        );
    }
    Ok(Recorded {
        profile,
        stop: collected.stop,
        command_status: collected.command_status,
    })
}

/// The events a mode samples, as perf names them: what `-e` may name.
pub fn sampled_events(mode: Mode) -> &'static [&'static str] {
    match mode {
        Mode::Cpi => &["cycles", "branches"],
        Mode::IpSampling => &["cycles", "instructions"],
        Mode::TimeProfile | Mode::Simulated | Mode::Instructions => &["cpu-clock"],
    }
}
