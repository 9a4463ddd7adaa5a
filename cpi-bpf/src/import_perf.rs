//! `import-perf`: analyse recordings made elsewhere with `perf record` (branch stacks,
//! or a clock event's samples; callchains, or dwarf stacks unwound, as call stacks); the pipeline is
//! [`cpi_user::import`], this parses arguments and renders.

use std::path::PathBuf;

use cpi_user::import::{self, Estimator, ImportOptions};
use cpi_user::profile::StackWeighting;

use crate::output::{emit, OutputArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A `perf.data` file (`perf record -b`, or `-e cpu-clock` as a time profile; `-g`
    /// callchains become call stacks, `--call-graph dwarf` user stacks are unwound here
    /// over the recorded binaries), or `perf script -F pid,tid,ip,sym,dso,brstack` text
    /// (with its callchain lines); `-` reads text from standard input.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Look for the recorded binaries under DIR (DIR + recorded path), as perf does.
    #[arg(long, value_name = "DIR")]
    pub symfs: Option<PathBuf>,
    /// NAME=PATH: the recorded binary NAME (full path or file name) is PATH here; a
    /// bare PATH is offered for build-id lookup. Repeatable.
    #[arg(long = "binary", value_name = "NAME=PATH", value_parser = parse_binary)]
    pub binaries: Vec<(Option<String>, PathBuf)>,
    /// Text only: the text was written with `brstackoff` (dso offsets) rather than `brstack`.
    #[arg(long)]
    pub brstackoff: bool,
    /// Text only (perf.data carries its periods): the recording's sampling period
    /// (`perf record -c N`, cycles); without it counts are relative (each sample
    /// weighs 1).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub period: u64,
    /// Text only: the text has a period field (`perf script -F pid,tid,period,ip,...`),
    /// each sample's own period (freq-mode recordings vary it).
    #[arg(long)]
    pub period_field: bool,
    /// Text only (perf.data names its events): the event the stacks were sampled on,
    /// `cycles` (perf record -b's default), `taken-branches` or `other`.
    #[arg(long, value_name = "EVENT", default_value = "cycles", value_parser = parse_event)]
    pub event: Estimator,
    /// Newest ranges used per branch stack: a fixed number, so deep and shallow stacks
    /// weigh the same.
    #[arg(long, value_name = "N", default_value_t = ImportOptions::default().window)]
    pub window: usize,
    /// How each stack's ranges are weighted: `window` (period / window) or
    /// `cycles-spanned` (period / cycles the window spans, from timed entries). Default:
    /// `cycles-spanned` for stacks sampled on cycles whose entries carry cycles, else
    /// `window`.
    #[arg(long, value_name = "HOW", value_parser = clap::value_parser!(StackWeighting))]
    pub stack_weighting: Option<StackWeighting>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let mut opts = ImportOptions {
        window: args.window,
        offsets: args.brstackoff,
        period: args.period.max(1),
        text_event: args.event,
        stack_weighting: args.stack_weighting,
        period_field: args.period_field,
        ..ImportOptions::default()
    };
    opts.locator.symfs = args.symfs;
    for (name, path) in args.binaries {
        match name {
            Some(n) => opts.locator.overrides.push((n, path)),
            None => opts.locator.files.push(path),
        }
    }
    let named = opts.locator.overrides.iter().map(|(_, p)| p);
    let input = crate::open_recording(
        &args.file,
        opts.locator.symfs.iter().cloned().collect(),
        named.chain(&opts.locator.files).cloned().collect(),
    )?;
    let what = args.file.display().to_string();
    let imported = import::load_input(input, &what, &opts)?.analyze(&opts.analysis);
    for note in &imported.notes {
        log::warn!("{note}");
    }
    for detail in &imported.details {
        log::info!("{detail}");
    }
    emit(&imported.profile, &args.output)?;
    Ok(0)
}

/// `NAME=PATH` or a bare `PATH`.
fn parse_binary(s: &str) -> Result<(Option<String>, PathBuf), String> {
    match s.split_once('=') {
        Some((n, p)) if !n.is_empty() && !p.is_empty() => Ok((Some(n.into()), p.into())),
        Some(_) => Err("expected NAME=PATH or PATH".into()),
        None => Ok((None, s.into())),
    }
}

fn parse_event(s: &str) -> Result<Estimator, String> {
    match s {
        "cycles" => Ok(Estimator::Cycles),
        "taken-branches" => Ok(Estimator::TakenBranches),
        "other" => Ok(Estimator::Other),
        _ => Err("expected cycles, taken-branches or other".into()),
    }
}
