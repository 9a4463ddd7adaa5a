//! `import-perf`: analyse branch stacks recorded elsewhere with `perf record -b`; the
//! pipeline is [`cpi_user::import`], this parses arguments and renders.

use std::path::PathBuf;

use cpi_user::import::{self, ImportOptions};

use crate::output::{emit, OutputArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// `perf script -F pid,tid,ip,sym,dso,brstack` text; `-` reads standard input.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The text was written with `brstackoff` (dso offsets) rather than `brstack`.
    #[arg(long)]
    pub brstackoff: bool,
    /// The recording's sampling period (`perf record -c N`, cycles); without it counts
    /// are relative (each sample weighs 1).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub period: u64,
    /// Newest ranges used per branch stack (seed 001's CBT window).
    #[arg(long, value_name = "N", default_value_t = ImportOptions::default().window)]
    pub window: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let opts = ImportOptions {
        window: args.window,
        offsets: args.brstackoff,
        period: args.period.max(1),
        ..ImportOptions::default()
    };
    let imported = import::import_path(&args.file, &opts)?;
    for note in &imported.notes {
        log::warn!("{note}");
    }
    emit(&imported.profile, &args.output)?;
    Ok(0)
}
