//! `simulate`: run a command under the exact tracer, replay it through the PMU model,
//! and show the profile sampling would report plus its distance from the exact answer.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::Stdio;

use anyhow::Context;
use cpi_common::policy::PeriodPolicy;
use cpi_user::profile::model::{EventInfo, LossReport, Mode, RunInfo};
use cpi_user::profile::{analyze, AnalysisOptions};
use cpi_user::report::{file, table};
use cpi_user::sim::accuracy::{self, Accuracy};
use cpi_user::sim::pmu::{self, PmuConfig};
use cpi_user::sim::simulate_command;

use crate::output::{emit, write_out, Format, OutputArgs};
use crate::policy::PolicyArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Taken branches per branch sample (used as given; the default is a prime).
    #[arg(long, value_name = "Q", default_value_t = pmu::SIM_BRANCH_PERIOD)]
    pub branch_period: u64,
    /// Cycles per cycle sample (used as given; the default is a prime).
    #[arg(long, value_name = "P", default_value_t = pmu::SIM_CYCLE_PERIOD)]
    pub cycle_period: u64,
    /// LBR depth: branch records per sample (2..=32); the range window is depth − 1.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub depth: usize,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Skid: the cycle sample's IP lands N instructions late, the branch sample N taken
    /// branches late.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub skid: u32,
    /// How often the user layer makes its due period re-draws (the collector's drain
    /// cadence), simulated milliseconds (3 cycles per ns).
    #[arg(long, value_name = "MS", default_value_t = 10)]
    pub redraw_ms: u64,
    /// Seed of the policy's random numbers.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    #[command(flatten)]
    pub output: OutputArgs,
    /// The command to run (after `--`). Its standard output goes to our standard error.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<OsString>,
}

fn policy(period: u64) -> PeriodPolicy {
    let base = period.max(1);
    PeriodPolicy {
        base,
        jitter: base >> PeriodPolicy::DEFAULT_JITTER_SHIFT,
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if !(2..=cpi_common::wire::MAX_BRANCH_ENTRIES).contains(&args.depth) {
        anyhow::bail!("--depth must be 2..=32, not {}", args.depth);
    }
    let cfg = PmuConfig {
        branch: policy(args.branch_period),
        cycles: policy(args.cycle_period),
        depth: args.depth,
        perturbation: args.policy.perturbation(),
        thinning: args.policy.thinning.max(1),
        skid: args.skid,
        redraw_interval_ns: args.redraw_ms.max(1) * 1_000_000,
        seed: args.seed,
        ..PmuConfig::default()
    };
    let out = simulate_command(&cfg, &args.command, Stdio::from(std::io::stderr()))
        .context("simulating")?;
    let perturbation = cfg.perturbation.name().to_string();
    let thinning = if cfg.perturbation.kernel() {
        cfg.thinning
    } else {
        1
    };
    let event = |role: &str, name: &str, p: &PeriodPolicy, samples: u64| EventInfo {
        role: role.into(),
        name: name.into(),
        period: p.base,
        jitter: if cfg.perturbation.user() { p.jitter } else { 0 },
        thinning,
        unit: "events".into(),
        samples,
    };
    let run = RunInfo {
        mode: Mode::Simulated,
        mode_reason: format!(
            "PMU model replaying an exact trace (Valgrind cpitrace) with modelled cycles; \
             {} instructions, {} cycles exactly",
            out.truth.instructions, out.truth.cycles
        ),
        command: args
            .command
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect(),
        duration_secs: out.wall_secs,
        events: vec![
            event(
                "branches",
                "model: retired taken branches + LBR",
                &cfg.branch,
                out.pmu.branch_samples,
            ),
            event("cycles", "model: cycles", &cfg.cycles, out.pmu.ip_samples),
        ],
        perturbation,
        lost: LossReport {
            thinned: out.pmu.thinned,
            ..LossReport::default()
        },
    };
    let opts = AnalysisOptions {
        symbolizer: cpi_user::binary::SymbolizerOptions {
            use_proc: false,
            ..Default::default()
        },
        ..AnalysisOptions::default()
    };
    let profile = analyze(&out.samples, run, &opts);
    let acc = accuracy::compare(&profile, &out.truth);
    match args.output.format {
        Format::Json => {
            let mut v: serde_json::Value = serde_json::from_str(&file::to_json(&profile)?)?;
            v["accuracy"] = serde_json::to_value(&acc)?;
            let text = serde_json::to_string_pretty(&v)? + "\n";
            write_out(args.output.output.as_deref(), text.as_bytes())?;
        }
        Format::Table => {
            let opts = table::TableOptions {
                top: args.output.top,
                annotate: args.output.annotate.clone(),
            };
            let text = table::render(&profile, &opts)? + &render_accuracy(&acc);
            write_out(args.output.output.as_deref(), text.as_bytes())?;
        }
        _ => emit(&profile, &args.output)?,
    }
    Ok(out.status.code().unwrap_or(1))
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{:.2}%", v * 100.0))
        .unwrap_or_else(|| "-".into())
}

fn render_accuracy(a: &Accuracy) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\naccuracy against the exact trace");
    let _ = writeln!(
        s,
        "  overlap: instruction {:.4}  block {:.4}  function {:.4}  edge {:.4}",
        a.overlap_instruction, a.overlap_block, a.overlap_function, a.overlap_edge
    );
    let _ = writeln!(
        s,
        "  CPI error (functions with >= 2% of cycles): median {}  max {}{}",
        pct(a.cpi_error_median),
        pct(a.cpi_error_max),
        if a.functions_without_cpi > 0 {
            format!("  ({} without a CPI estimate)", a.functions_without_cpi)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "  {:>7} {:>12} {:>12} {:>8} {:>8} {:>7}  function",
        "share", "instr true", "instr est", "CPI true", "CPI est", "error"
    );
    for f in a.functions.iter().take(15) {
        let cpi = |c: Option<f64>| c.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "  {:>6.2}% {:>12} {:>12.0} {:>8} {:>8} {:>7}  {}",
            f.share * 100.0,
            f.instructions_true,
            f.instructions_est,
            cpi(f.cpi_true),
            cpi(f.cpi_est),
            pct(f.cpi_error),
            f.name
        );
    }
    s
}
