//! `diff`: compare two profiles and tell a real change from noise (the method is
//! `cpi_user::report::diff`; this file parses arguments and renders).

use std::path::PathBuf;

use anyhow::Context;
use clap::ValueEnum;
use cpi_user::report::diff::{self, Basis, DiffOptions, DEFAULT_ALPHA};
use cpi_user::report::file;

use crate::output::write_out;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table of the processes and functions, significant changes first (80 columns).
    Table,
    /// Every unit with `name`, its values, errors, `z` and `significant`.
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// Absolute cycles (time), instructions and CPI: the same workload run twice.
    Absolute,
    /// Shares of each process's total, and CPI: runs of different lengths.
    Share,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Processes are matched by comm (pids differ between runs), functions by the file name of \
their binary and their name. Each change has a z-score from the two profiles' own errors, \
z = Δ / √(σ_base² + σ_new²); all changes are tested together with the Benjamini–Hochberg \
procedure at level --alpha, so two runs of one program flag nothing (at most α of the \
time). For a differential flame graph of the pprof exports: \
go tool pprof -diff_base BASE.pb.gz NEW.pb.gz.")]
pub struct Args {
    /// The profile to compare against (written with --format json -o FILE).
    #[arg(value_name = "BASE")]
    pub base: PathBuf,
    /// The profile to compare.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// Significance level: the false discovery rate over all changes tested.
    #[arg(long, value_name = "α", default_value_t = DEFAULT_ALPHA, value_parser = alpha)]
    pub alpha: f64,
    /// Which changes are tested.
    #[arg(long, value_enum, default_value_t = By::Absolute)]
    pub by: By,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the diff to FILE instead of standard output (an existing FILE is kept as
    /// FILE.old).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Rows per table.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
}

/// `--alpha`: a level strictly between 0 and 1.
fn alpha(s: &str) -> Result<f64, String> {
    let a: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if a > 0.0 && a < 1.0 {
        Ok(a)
    } else {
        Err("must be between 0 and 1 (exclusive)".into())
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let (base, new) = (file::read(&args.base)?, file::read(&args.new)?);
    let opts = DiffOptions {
        alpha: args.alpha,
        basis: match args.by {
            By::Absolute => Basis::Absolute,
            By::Share => Basis::Share,
        },
    };
    let d = diff::diff(&base, &new, &opts).context("diff")?;
    let text = match args.format {
        Format::Table => diff::render(&d, args.top),
        Format::Json => serde_json::to_string_pretty(&d)? + "\n",
    };
    write_out(args.output.as_deref(), |w| w.write_all(text.as_bytes()))?;
    Ok(0)
}
