//! The default command: collect from pids, the whole system, or a command, then report.

use std::time::Duration;

use anyhow::bail;
use cpi_user::collect::{self, events::Rate, CollectOptions, StopReason, Target};
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
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Samples per second per busy CPU.
    #[arg(long, value_name = "HZ", default_value_t = 999)]
    pub frequency: u64,
    /// Base sampling period instead of --frequency (events; ns for cpu-clock); rounded
    /// up to a prime.
    #[arg(long, value_name = "N")]
    pub period: Option<u64>,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// User-space period re-draw interval, milliseconds.
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
    let duration = match args.duration {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            bail!("--duration must be a positive number of seconds, not {s}")
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    if args.frequency == 0 {
        bail!("--frequency must be at least 1");
    }
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
    let lost = &collected.run.lost;
    let received: u64 = collected.run.events.iter().map(|e| e.samples).sum();
    eprintln!(
        "cpi-bpf: stopped ({stop}) after {:.2} s: {received} samples received, {} lost (ring buffer full {}, branch errors {}, malformed {})",
        collected.run.duration_secs,
        lost.ring_full + lost.branch_errors + lost.malformed,
        lost.ring_full,
        lost.branch_errors,
        lost.malformed,
    );
    let profile = analyze(&collected.set, collected.run, &AnalysisOptions::default());
    emit(&profile, &args.output)?;
    Ok(0)
}
