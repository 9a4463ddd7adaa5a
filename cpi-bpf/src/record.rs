//! The default command: collect from pids, the whole system, or a command, then report.

use std::time::Duration;

use anyhow::{anyhow, bail};
use cpi_user::collect::caps::Capabilities;
use cpi_user::collect::events::{Rate, MAX_PERIOD};
use cpi_user::collect::{self, CollectOptions, StackMemory, StopReason, Target, DEFAULT_FREQUENCY};

use cpi_user::report::table;

use crate::output::{emit, stderr_width, validate, OutputArgs};
use crate::policy::PolicyArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Profile this process, all its threads (repeat, or PID,PID,...).
    #[arg(short, long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Profile every process on every CPU (with a command: while it runs).
    #[arg(short = 'a', long, conflicts_with = "pids")]
    pub system_wide: bool,
    /// Stop after SECS seconds (default: when the target exits, or on Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Samples per second per busy CPU.
    #[arg(short = 'F', long, value_name = "HZ", default_value_t = DEFAULT_FREQUENCY,
          value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "period")]
    pub frequency: u64,
    /// Base sampling period instead of --frequency (events; ns for cpu-clock); rounded
    /// up to a prime.
    #[arg(short = 'c', long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_PERIOD))]
    pub period: Option<u64>,
    /// The events to sample, as perf names them (cycles, branches, instructions,
    /// cpu-clock): cpi-bpf picks its events from what the machine can measure (see
    /// `cpi-bpf doctor`); naming others is an error.
    #[arg(short, long, value_name = "EVENT", value_delimiter = ',')]
    pub event: Vec<String>,
    /// Call stacks, as perf's -g: the default here (every sample carries its kernel
    /// frames and its user stack, unwound from .eh_frame or frame pointers).
    #[arg(short = 'g', conflicts_with = "no_stacks")]
    pub call_graph: bool,
    /// Leaf-only samples: no call stacks (smaller records, less time in the kernel per
    /// sample; BENCHMARKS.md, "Call stacks").
    #[arg(long)]
    pub no_stacks: bool,
    /// User space only (as perf's `-e cycles:u`); by default kernel code is sampled too,
    /// as perf does for root, and shown as the `[kernel]` binary.
    #[arg(long)]
    pub user_only: bool,
    /// Sample kernel code too: the default (see --user-only).
    #[arg(long, hide = true, conflicts_with = "user_only")]
    pub include_kernel: bool,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten, next_help_heading = "Tuning")]
    pub policy: PolicyArgs,
    /// How often the user layer checks which events are due a period re-draw (each is
    /// re-drawn after 48-112 of its own periods), milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub redraw_ms: u64,
    /// BPF ring buffer size, MiB (a power of two) [default: what holds 400 ms of samples
    /// at --frequency on every CPU, 1 to 16: 8 on 2 CPUs at 999 Hz].
    #[arg(long, value_name = "MIB")]
    pub ring_buffer_mib: Option<u32>,
    /// Ranges used per branch sample, the fixed window that keeps the profile uniform
    /// (default: branch-record depth − 1, as the PMU model uses).
    #[arg(long, value_name = "N")]
    pub range_window: Option<usize>,
    /// Command to start and profile (with its children); `--` before it is optional.
    #[arg(
        trailing_var_arg = true,
        value_name = "CMD",
        help_heading = "Arguments"
    )]
    pub command: Vec<String>,
}

/// What `-p`, `-a` and the command name.
fn target(args: &Args) -> anyhow::Result<Target> {
    Ok(
        match (
            args.pids.is_empty(),
            args.system_wide,
            args.command.is_empty(),
        ) {
            (false, false, true) => Target::Pids(args.pids.clone()),
            (true, true, true) => Target::SystemWide,
            (true, false, false) => Target::Command(args.command.clone()),
            (true, true, false) => Target::SystemWideWhile(args.command.clone()),
            (true, false, true) => {
                bail!("nothing to profile: give -p PID, -a (system-wide) or a command (see --help)")
            }
            _ => bail!("give -p PID or -a (system-wide), not both, and a command only without -p"),
        },
    )
}

/// The collection the arguments ask for.
fn collect_options(args: &Args, target: Target, user_only: bool) -> anyhow::Result<CollectOptions> {
    let ring_mib = args.ring_buffer_mib.unwrap_or_else(|| {
        let cpus = collect::target::online_cpus().len() as u64;
        collect::default_ring_mib(collect::ONE_SHOT_RING_HOLDS, args.frequency, cpus)
    });
    let ring_bytes = collect::ring_bytes(ring_mib).map_err(|e| anyhow!("--ring-buffer-mib {e}"))?;
    Ok(CollectOptions {
        target,
        duration: args.duration,
        rate: Rate {
            frequency: args.frequency,
            period: args.period,
            core_hz: collect::events::nominal_core_hz(),
        },
        include_kernel: !user_only,
        perturbation: args.policy.perturbation(),
        thinning: args.policy.thinning.max(1),
        redraw_every: Duration::from_millis(args.redraw_ms.max(1)),
        ring_bytes,
        window: args.range_window.map(|w| w.max(1)),
        cpu_time: false,
        drain_every: collect::DRAIN_EVERY,
        stacks: !args.no_stacks,
        stack_memory: StackMemory::default(),
    })
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let target = target(&args)?;
    let user_only = check_events(&args.event)? || args.user_only;
    let opts = collect_options(&args, target, user_only)?;
    // Before collecting: a bad --output must not cost the run.
    validate(&args.output)?;
    // Status lines fit the terminal; -v gives each whole, with its reasons.
    let verbose = args.output.verbose;
    let width = stderr_width().filter(|_| !verbose);
    let say = |line: &str| {
        let line = cpi_user::fsafe::escape(line);
        match width {
            Some(w) => eprintln!("{}", table::ellipsize(&line, w)),
            None => eprintln!("{line}"),
        }
    };
    let record = collect::RecordOptions {
        collect: opts,
        every_line: args.output.annotate.is_some(),
    };
    let recorded = collect::record(&record, &mut |n| {
        say(&format!(
            "cpi-bpf: {}",
            if verbose { n.full } else { n.brief }
        ))
    })?;
    emit(&recorded.profile, &args.output)?;
    Ok(exit_status(recorded.stop, recorded.command_status))
}

/// perf's exit status: the command's own (a shell's 128+N when a signal ended it), and
/// 128+N when cpi-bpf itself was stopped by signal N, whatever was profiled.
fn exit_status(stop: Option<StopReason>, command_status: Option<i32>) -> i32 {
    match stop {
        Some(StopReason::Signal("SIGINT")) => 128 + libc::SIGINT,
        Some(StopReason::Signal(_)) => 128 + libc::SIGTERM,
        Some(StopReason::TargetExit) => command_status.unwrap_or(0),
        _ => 0,
    }
}

/// `-e`: perf's event names, accepted when they are the events the capability ladder
/// samples on this machine; cpi-bpf does not sample others. True when every event has
/// perf's `:u` modifier (user space only).
fn check_events(events: &[String]) -> anyhow::Result<bool> {
    if events.is_empty() {
        return Ok(false);
    }
    let (mode, _) = Capabilities::probe().mode();
    let used = collect::record::sampled_events(mode);
    for e in events {
        // perf's modifiers (`cycles:u`, `cycles:pp`) say where and how precisely.
        let (name, _) = e.split_once(':').unwrap_or((e, ""));
        if !used.contains(&name) {
            bail!(
                "-e {e}: on this machine cpi-bpf samples {} ({} mode) and picks its events \
                 itself (cpi-bpf doctor says why)",
                used.join(" and "),
                mode.name()
            );
        }
    }
    Ok(events.iter().all(|e| {
        e.split_once(':')
            .is_some_and(|(_, m)| m.contains('u') && !m.contains('k'))
    }))
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
