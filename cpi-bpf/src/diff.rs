//! `diff`: compare two profiles and tell a real change from noise (the method is
//! `cpi_user::report::diff`; this file parses arguments and renders).

use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Context;
use clap::ValueEnum;
use cpi_agent::store;
use cpi_user::report::diff::{self, Basis, DiffOptions, Matching, DEFAULT_ALPHA};

use crate::output::write_out;
use crate::report::{read_profile, read_store, store_time};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table of the processes and functions, significant changes first (80 columns).
    Table,
    /// Every unit with `name`, its values, errors, `z` and `significant`.
    Json,
    /// A page with the table and a differential flame graph (NEW's widths, frames
    /// coloured by their significant changes).
    Html,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// Absolute cycles (time), instructions and CPI: the same workload run twice.
    Absolute,
    /// Shares of each process's total, and CPI: runs of different lengths.
    Share,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Match {
    /// By comm and binary file name; but when each profile has one main process (over
    /// half of it), those two are matched with each other and their functions by name.
    Auto,
    /// By comm and binary file name only.
    Comm,
    /// Each profile's largest process with the other's, their functions by name and
    /// call paths by their names, whatever the file names.
    Function,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Processes are matched by comm (pids differ between runs), functions by the file name of \
their binary and their name; one program built twice under two names (each profile's \
main process) is matched by function name and call path, as the header says (--match). Each change has a z-score from the two profiles' own errors, \
z = Δ / √(σ_base² + σ_new²); all changes are tested together with the Benjamini–Hochberg \
procedure at level --alpha, so two runs of one program flag nothing (at most α of the \
time). For a differential flame graph of the pprof exports: \
go tool pprof -diff_base BASE.pb.gz NEW.pb.gz.")]
pub struct Args {
    /// The profile to compare against: a file written with --format json -o FILE, or one
    /// window of an agent's store (`w-….json.gz`).
    #[arg(
        value_name = "BASE",
        required_unless_present = "store",
        conflicts_with = "store"
    )]
    pub base: Option<PathBuf>,
    /// The profile to compare.
    #[arg(value_name = "NEW", required_unless_present = "store")]
    pub new: Option<PathBuf>,
    /// Compare two ranges of an agent's store (cpi-bpf agent --store DIR) instead: BASE
    /// is --base-since..--base-until, NEW --since..--until.
    #[arg(long, value_name = "DIR", requires = "base_range")]
    pub store: Option<PathBuf>,
    /// With --store: BASE is the windows since TIME, or since DURATION ago (1h, 30m, 2d).
    #[arg(long, value_name = "TIME|DURATION", requires = "store", value_parser = store_time,
          group = "base_range")]
    pub base_since: Option<SystemTime>,
    /// With --store: BASE is the windows until TIME, or until DURATION ago.
    #[arg(long, value_name = "TIME|DURATION", requires = "store", value_parser = store_time,
          group = "base_range")]
    pub base_until: Option<SystemTime>,
    /// With --store: NEW is the windows since TIME, or since DURATION ago.
    #[arg(long, value_name = "TIME|DURATION", requires = "store", value_parser = store_time)]
    pub since: Option<SystemTime>,
    /// With --store: NEW is the windows until TIME, or until DURATION ago.
    #[arg(long, value_name = "TIME|DURATION", requires = "store", value_parser = store_time)]
    pub until: Option<SystemTime>,
    /// With --store: only processes named NAME.
    #[arg(long, value_name = "NAME", requires = "store")]
    pub comm: Option<String>,
    /// Significance level: the false discovery rate over all changes tested.
    #[arg(long, value_name = "ALPHA", default_value_t = DEFAULT_ALPHA, value_parser = alpha)]
    pub alpha: f64,
    /// Which changes are tested.
    #[arg(long, value_enum, default_value_t = By::Absolute)]
    pub by: By,
    /// How processes and functions are matched across the two profiles.
    #[arg(long = "match", value_enum, default_value_t = Match::Auto)]
    pub matching: Match,
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
    let (base, new) = match (&args.store, &args.base, &args.new) {
        (Some(dir), _, _) => {
            let range = |since, until| store::RangeQuery {
                since,
                until,
                comm: args.comm.clone(),
            };
            (
                read_store(dir, &range(args.base_since, args.base_until))?,
                read_store(dir, &range(args.since, args.until))?,
            )
        }
        (None, Some(base), Some(new)) => (read_profile(base)?, read_profile(new)?),
        _ => anyhow::bail!("diff: give BASE and NEW (profile files), or --store DIR"),
    };
    let opts = DiffOptions {
        alpha: args.alpha,
        basis: match args.by {
            By::Absolute => Basis::Absolute,
            By::Share => Basis::Share,
        },
        matching: match args.matching {
            Match::Auto => Matching::Auto,
            Match::Comm => Matching::Comm,
            Match::Function => Matching::Function,
        },
    };
    let d = diff::diff(&base, &new, &opts).context("diff")?;
    let text = match args.format {
        Format::Table => diff::render(&d, args.top),
        Format::Json => serde_json::to_string_pretty(&d)? + "\n",
        Format::Html => cpi_user::report::html::render_diff(&base, &new, &d)?,
    };
    write_out(args.output.as_deref(), |w| w.write_all(text.as_bytes()))?;
    Ok(0)
}
