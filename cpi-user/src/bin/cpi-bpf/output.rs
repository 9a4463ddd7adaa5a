//! Output options shared by every command that produces a profile (record, simulate,
//! report, import-perf); [`emit`] is the one place a profile leaves the program.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::ValueEnum;
use cpi_user::profile::Profile;
use cpi_user::report::{fdata, file, pprof, table};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human tables (top functions, hot blocks, or --annotate).
    Table,
    /// The versioned JSON profile (what `cpi-bpf report` reads).
    Json,
    /// gzip'd pprof profile.proto (go tool pprof, Pyroscope, Parca).
    Pprof,
    /// BOLT .fdata, per binary: with --output FILE, FILE holds the main binary and
    /// FILE.<name> each other binary; on standard output, the main binary only.
    Fdata,
}

#[derive(clap::Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the output to FILE instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Show FUNC's disassembly with per-instruction counts and per-block CPI (table).
    #[arg(long, value_name = "FUNC")]
    pub annotate: Option<String>,
    /// Rows per table.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
}

/// Renders `profile` as asked and writes it out.
pub fn emit(profile: &Profile, args: &OutputArgs) -> anyhow::Result<()> {
    if args.annotate.is_some() && args.format != Format::Table {
        anyhow::bail!(
            "--annotate shows a table; it cannot be combined with --format {:?}",
            args.format
        );
    }
    match args.format {
        Format::Table => {
            let opts = table::TableOptions {
                top: args.top,
                annotate: args.annotate.clone(),
            };
            write_out(
                args.output.as_deref(),
                table::render(profile, &opts)?.as_bytes(),
            )
        }
        Format::Json => write_out(args.output.as_deref(), file::to_json(profile)?.as_bytes()),
        Format::Pprof => {
            let bytes = pprof::encode(profile).context("compressing the pprof profile")?;
            write_out(args.output.as_deref(), &bytes)
        }
        Format::Fdata => {
            let files = fdata::render(profile)?;
            let Some((main, others)) = files.split_first() else {
                anyhow::bail!("no .fdata to write");
            };
            if main.no_lbr {
                log::warn!(
                    "{}: no branch records in this profile: .fdata in no_lbr (sample) form",
                    main.binary
                );
            }
            write_out(args.output.as_deref(), main.text.as_bytes())?;
            match &args.output {
                Some(path) => {
                    for f in others {
                        let name = f.binary.rsplit('/').next().unwrap_or(&f.binary);
                        let mut p = path.as_os_str().to_owned();
                        p.push(format!(".{name}"));
                        write_out(Some(Path::new(&p)), f.text.as_bytes())?;
                        eprintln!(
                            "cpi-bpf: {}: .fdata written to {}",
                            f.binary,
                            Path::new(&p).display()
                        );
                    }
                }
                None if !others.is_empty() => eprintln!(
                    "cpi-bpf: .fdata on standard output is for {} only; use --output FILE for \
                     the other {} binaries",
                    main.binary,
                    others.len()
                ),
                None => {}
            }
            Ok(())
        }
    }
}

/// Writes `bytes` to `path`, or standard output.
pub fn write_out(path: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    match path {
        Some(path) => {
            std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            match out.write_all(bytes).and_then(|_| out.flush()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                r => r.context("writing to standard output"),
            }
        }
    }
}
