//! `report`: show a profile file written with `--output` again, in any format.

use std::path::PathBuf;

use crate::output::{emit, OutputArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A profile file written with `--format json --output FILE`.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let profile = cpi_user::report::file::read(&args.file)?;
    emit(&profile, &args.output)?;
    Ok(0)
}
