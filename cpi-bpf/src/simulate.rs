//! `simulate`: run a command under the exact tracer, replay it through the PMU model,
//! and show the profile sampling would report plus its distance from the exact answer
//! (the pipeline is `cpi_user::sim::simulate`; this file parses arguments and renders).

use std::ffi::OsString;
use std::process::Stdio;

use anyhow::Context;
use cpi_common::policy::PeriodPolicy;
use cpi_common::wire::MAX_BRANCH_ENTRIES;
use cpi_user::fsafe::escape;
use cpi_user::profile::analyze::LineDetail;
use cpi_user::profile::StackWeighting;
use cpi_user::sim::calibrate::{calibrate, Calibration};
use cpi_user::sim::pmu::{self, BranchEvent, PmuConfig};

use crate::output::{emit, OutputArgs};
use crate::policy::PolicyArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Taken branches per branch sample (used as given; the default is a prime).
    #[arg(long, value_name = "Q", default_value_t = pmu::SIM_BRANCH_PERIOD,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub branch_period: u64,
    /// Cycles per cycle sample (used as given; the default is a prime).
    #[arg(long, value_name = "P", default_value_t = pmu::SIM_CYCLE_PERIOD,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub cycle_period: u64,
    /// The counter whose overflow snapshots the branch stack: `branches` (retired taken
    /// branches, the method's choice) or `cycles` (as `perf record -b` does by default; the stacks
    /// then ride on the cycle samples, at --cycle-period).
    #[arg(long, value_name = "EVENT", default_value = "branches",
          value_parser = clap::value_parser!(BranchEvent))]
    pub branch_event: BranchEvent,
    /// How each stack's ranges are weighted: `window` (period / window) or
    /// `cycles-spanned` (period / cycles the window spans). Default: `window` for
    /// stacks on branches, `cycles-spanned` for stacks on cycles.
    #[arg(long, value_name = "HOW", value_parser = clap::value_parser!(StackWeighting))]
    pub stack_weighting: Option<StackWeighting>,
    /// LBR depth: branch records per sample (2..=32); the range window is depth − 1.
    #[arg(long, value_name = "N", default_value_t = MAX_BRANCH_ENTRIES, value_parser = depth)]
    pub depth: usize,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Skid: the cycle sample's IP lands N instructions late, the branch sample N taken
    /// branches late.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub skid: u32,
    /// How often the user layer makes its due period re-draws (the collector's drain
    /// cadence), simulated milliseconds (3 cycles per ns).
    #[arg(long, value_name = "MS", default_value_t = pmu::SIM_REDRAW_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub redraw_ms: u64,
    /// Seed of the policy's random numbers.
    #[arg(long, default_value_t = pmu::SIM_SEED)]
    pub seed: u64,
    /// Measure the error bars instead of showing one profile: replay the trace with N
    /// seeds (--seed, --seed + 1, …) and print the share of functions and blocks whose
    /// exact value lies within ±1 and ±2 reported errors (one standard error: ≈ 68 % and
    /// 95 % when the errors are right).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub calibrate: Option<u32>,
    #[command(flatten)]
    pub output: OutputArgs,
    /// The command to run (after `--`), followed through exec; children it forks are not
    /// traced. Its standard output goes to our standard error.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<OsString>,
}

/// `--depth`: 2..=32 branch records.
fn depth(s: &str) -> Result<usize, String> {
    let d: usize = s.parse().map_err(|e| format!("{e}"))?;
    if (2..=MAX_BRANCH_ENTRIES).contains(&d) {
        Ok(d)
    } else {
        Err(format!("must be 2..={MAX_BRANCH_ENTRIES}"))
    }
}

fn policy(base: u64) -> PeriodPolicy {
    PeriodPolicy {
        base,
        jitter: base >> PeriodPolicy::DEFAULT_JITTER_SHIFT,
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let cfg = PmuConfig {
        branch_event: args.branch_event,
        stack_weighting: args.stack_weighting,
        branch: policy(args.branch_period),
        cycles: policy(args.cycle_period),
        depth: args.depth,
        perturbation: args.policy.perturbation(),
        thinning: args.policy.thinning.max(1),
        skid: args.skid,
        redraw_interval_ns: args.redraw_ms * 1_000_000,
        seed: args.seed,
        ..PmuConfig::default()
    };
    script_note(&args.command);
    if let Some(seeds) = args.calibrate {
        let c = calibrate(&cfg, seeds, &args.command, Stdio::from(std::io::stderr()))
            .context("calibrating")?;
        followed_note(c.followed.as_deref());
        print!("{}", coverage_table(&c, &args.command));
        return Ok(c.status.code().unwrap_or(1));
    }
    let lines = match args.output.annotate {
        Some(_) => LineDetail::Every,
        None => LineDetail::Evidence,
    };
    let stderr = Stdio::from(std::io::stderr());
    let report =
        cpi_user::sim::simulate_with(&cfg, lines, &args.command, stderr).context("simulating")?;
    followed_note(cpi_user::sim::followed(&report.truth).as_deref());
    emit(&report.profile, &args.output)?;
    Ok(report.status.code().unwrap_or(1))
}

/// Says on stderr what the trace followed beyond one program, if anything.
fn followed_note(followed: Option<&str>) {
    if let Some(f) = followed {
        eprintln!("cpi-bpf: note: {}", escape(f));
    }
}

/// Says on stderr, before tracing, when the command is a script: Valgrind traces its
/// interpreter (and, through its execs, what that runs).
fn script_note(command: &[OsString]) {
    let Some(path) = command
        .first()
        .and_then(|c| cpi_user::collect::target::resolve_command(&c.to_string_lossy()).ok())
    else {
        return;
    };
    if let Some(i) = cpi_user::sim::script_interpreter(&path) {
        eprintln!(
            "cpi-bpf: note: {} is a script: Valgrind traces its interpreter, {}, and follows \
             its exec",
            escape(&path.to_string_lossy()),
            escape(&i)
        );
    }
}

/// The coverage table of a calibration run.
fn coverage_table(c: &Calibration, command: &[OsString]) -> String {
    let cmd: Vec<String> = command
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let mut t = format!(
        "coverage of the reported errors (± = one standard error) over {} seeds of `{}`\n\
         {:<24} {:>8} {:>10} {:>10}\n",
        c.seeds,
        cmd.join(" "),
        "estimate",
        "units",
        "within ±1",
        "within ±2"
    );
    for r in &c.rows {
        let (one, two) = r.shares();
        t += &format!(
            "{:<24} {:>8} {:>9.1}% {:>9.1}%\n",
            r.estimate,
            r.units,
            one * 100.0,
            two * 100.0
        );
    }
    t += "target (normal errors)              68.3%      95.4%\n";
    t
}
