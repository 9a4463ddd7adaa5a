//! The default command: collect from pids, the whole system, or a command, then report.

use std::time::Duration;

use anyhow::bail;
use cpi_user::collect::events::{self, Rate};
use cpi_user::collect::{self, CollectOptions, StopReason, Target};
use cpi_user::profile::{analyze, AnalysisOptions};

use crate::output::{emit, OutputArgs};
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
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Samples per second per busy CPU (at most 100000, the kernel's default
    /// perf_event_max_sample_rate).
    #[arg(long, value_name = "HZ", default_value_t = 999, conflicts_with = "period",
          value_parser = clap::value_parser!(u64).range(1..=events::MAX_FREQUENCY))]
    pub frequency: u64,
    /// Base sampling period instead of --frequency (events; ns for cpu-clock, at least
    /// 10000); rounded up to a prime.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=events::MAX_PERIOD))]
    pub period: Option<u64>,
    #[command(flatten)]
    pub policy: PolicyArgs,
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

/// Longest `--duration`: a year (tokio's timers cannot be set much further out).
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

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
    let duration = match args.duration {
        Some(s) => match Duration::try_from_secs_f64(s) {
            Ok(d) if s > 0.0 && d <= MAX_DURATION => Some(d),
            _ => bail!(
                "--duration must be a number of seconds above 0 and at most {} (a year), not {s}",
                MAX_DURATION.as_secs()
            ),
        },
        None => None,
    };
    if args.ring_buffer_mib == 0
        || !args.ring_buffer_mib.is_power_of_two()
        || args.ring_buffer_mib > 1024
    {
        bail!("--ring-buffer-mib must be a power of two between 1 and 1024");
    }
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
        ring_bytes: args.ring_buffer_mib << 20,
        window: args.range_window.map(|w| w.max(1)),
    };
    let collected = collect::collect(&opts, &mut |msg| eprintln!("cpi-bpf: {msg}"))?;
    let stop = match collected.stop {
        StopReason::Duration => "duration reached".to_string(),
        StopReason::TargetExit => match collected.command_status {
            Some(status) => format!("command exited with status {status}"),
            None => "target exited".to_string(),
        },
        StopReason::Signal(s) => format!("{s} received"),
    };
    let received: u64 = collected.run.events.iter().map(|e| e.samples).sum();
    eprintln!(
        "cpi-bpf: stopped ({stop}) after {:.2} s: {received} samples received",
        collected.run.duration_secs
    );
    let profile = analyze(&collected.set, collected.run, &AnalysisOptions::default());
    // The same loss account as the table and the JSON file (`lost_samples`, `lost`),
    // which analysis completes (unmapped samples, invalid ranges).
    let l = &profile.lost;
    eprintln!(
        "cpi-bpf: lost: {} (ring buffer full {}, branch errors {}, malformed {}, short {}, \
         unmapped {}, invalid ranges {})",
        profile.lost_samples,
        l.ring_full,
        l.branch_errors,
        l.malformed,
        l.short_samples,
        l.unmapped_samples,
        l.invalid_ranges,
    );
    emit(&profile, &args.output)?;
    Ok(0)
}
