//! `report`: show a profile file written with `--output` again, in any format.

use std::path::PathBuf;

use cpi_user::report::file;

use crate::output::{emit, OutputArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A profile file written with `--format json --output FILE`; `-` reads standard
    /// input.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let profile = if args.file.as_os_str() == "-" {
        file::read_stream(std::io::stdin().lock(), "on standard input")?
    } else {
        file::read(&args.file)?
    };
    emit(&profile, &args.output)?;
    Ok(0)
}
