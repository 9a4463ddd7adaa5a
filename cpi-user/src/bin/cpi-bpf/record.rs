//! The default command: collect from pids, the whole system, or a command, then report.

use std::time::Duration;

use anyhow::bail;
use cpi_user::collect::events::{Rate, MAX_PERIOD};
use cpi_user::collect::{self, CollectOptions, StopReason, Target, DEFAULT_FREQUENCY};
use cpi_user::profile::{analyze, AnalysisOptions};

use crate::output::{emit, validate, OutputArgs};
use crate::policy::PolicyArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Profile this process, all its threads (repeat for more processes).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Profile every process on every CPU.
    #[arg(long, conflicts_with = "pids")]
    pub system_wide: bool,
    /// Stop after SECS seconds (default: when the target exits, or on Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Samples per second per busy CPU.
    #[arg(long, value_name = "HZ", default_value_t = DEFAULT_FREQUENCY,
          value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "period")]
    pub frequency: u64,
    /// Base sampling period instead of --frequency (events; ns for cpu-clock); rounded
    /// up to a prime.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_PERIOD))]
    pub period: Option<u64>,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// How often the user layer checks which events are due a period re-draw (each is
    /// re-drawn after 48-112 of its own periods), milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub redraw_ms: u64,
    /// BPF ring buffer size, MiB (a power of two).
    #[arg(long, value_name = "MIB", default_value_t = 8)]
    pub ring_buffer_mib: u32,
    /// Sample kernel code too.
    #[arg(long)]
    pub include_kernel: bool,
    /// Ranges used per branch sample, the fixed window that keeps the profile uniform
    /// (default: branch-record depth − 1, as the PMU model uses).
    #[arg(long, value_name = "N")]
    pub range_window: Option<usize>,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Command to start and profile (with its children).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let target = match (
        args.pids.is_empty(),
        args.system_wide,
        args.command.is_empty(),
    ) {
        (false, false, true) => Target::Pids(args.pids.clone()),
        (true, true, true) => Target::SystemWide,
        (true, false, false) => Target::Command(args.command.clone()),
        (true, false, true) => {
            bail!("nothing to profile: give --pid PID, --system-wide or -- CMD (see --help)")
        }
        _ => bail!("give only one of --pid, --system-wide and -- CMD"),
    };
    let duration = args.duration;
    if args.ring_buffer_mib == 0
        || !args.ring_buffer_mib.is_power_of_two()
        || args.ring_buffer_mib > 1024
    {
        bail!("--ring-buffer-mib must be a power of two between 1 and 1024");
    }
    // Before collecting: a bad --output must not cost the run.
    validate(&args.output)?;
    let opts = CollectOptions {
        target,
        duration,
        rate: Rate {
            frequency: args.frequency,
            period: args.period,
            core_hz: collect::events::nominal_core_hz(),
        },
        include_kernel: args.include_kernel,
        perturbation: args.policy.perturbation(),
        thinning: args.policy.thinning.max(1),
        redraw_every: Duration::from_millis(args.redraw_ms.max(1)),
        ring_bytes: args.ring_buffer_mib << 20,
        window: args.range_window.map(|w| w.max(1)),
        cpu_time: false,
        drain_every: collect::DRAIN_EVERY,
    };
    let collected = collect::collect(&opts, &mut |msg| {
        eprintln!("cpi-bpf: {}", cpi_user::fsafe::escape(msg))
    })?;
    let stop = match collected.stop {
        Some(StopReason::Duration) => "duration reached".to_string(),
        Some(StopReason::TargetExit) => match collected.command_status {
            Some(status) => format!("command exited with status {status}"),
            None => "target exited".to_string(),
        },
        Some(StopReason::Signal(s)) => format!("{s} received"),
        Some(StopReason::Finished) | None => "finished".to_string(),
    };
    let received: u64 = collected.run.events.iter().map(|e| e.samples).sum();
    eprintln!(
        "cpi-bpf: stopped ({stop}) after {:.2} s: {received} samples received",
        collected.run.duration_secs
    );
    let profile = analyze(&collected.set, collected.run, &AnalysisOptions::default());
    // The profile's own loss account (collection and analysis), so this line, the table
    // and the JSON count the same things.
    eprintln!(
        "cpi-bpf: {} samples lost {}",
        profile.lost_samples,
        profile.lost.breakdown()
    );
    emit(&profile, &args.output)?;
    Ok(0)
}

/// `--duration`: positive seconds, small enough to be a deadline.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("not a number of seconds: {s}"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("must be a positive number of seconds, not {s}"));
    }
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| d.as_secs() <= MAX_DURATION_SECS)
        .ok_or_else(|| format!("at most {MAX_DURATION_SECS} seconds (a year), not {s}"))
}

/// Longest `--duration`: a year.
const MAX_DURATION_SECS: u64 = 366 * 86_400;
