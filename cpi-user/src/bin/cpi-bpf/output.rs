//! Output options shared by every command that produces a profile.

use std::path::PathBuf;

use anyhow::Context;
use clap::ValueEnum;
use cpi_user::profile::Profile;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human tables.
    Table,
    /// The versioned JSON profile (what `cpi-bpf report` reads).
    Json,
}

#[derive(clap::Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the output to FILE instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Renders `profile` as asked and writes it out.
pub fn emit(profile: &Profile, args: &OutputArgs) -> anyhow::Result<()> {
    let text = match args.format {
        Format::Json => serde_json::to_string_pretty(profile)? + "\n",
        Format::Table => cpi_user::report::table::render(profile),
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            match out.write_all(text.as_bytes()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                r => r.context("writing to standard output"),
            }
        }
    }
}
