//! Output options shared by every command that produces a profile (record, simulate,
//! report, import-perf); [`emit`] is the one place a profile leaves the program.
//! [`validate`] checks what can be checked before a collection starts, so a bad
//! `--output` never costs a run; if writing still fails at the end, the profile is saved
//! as JSON elsewhere and the error says where.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::ValueEnum;
use cpi_user::profile::Profile;
use cpi_user::report::html::series::WindowTotals;
use cpi_user::report::{fdata, file, folded, html, otlp, pprof, table};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human tables (top functions, hot blocks, or --annotate).
    Table,
    /// The versioned JSON profile (what `cpi-bpf report` reads).
    Json,
    /// gzip'd pprof profile.proto (go tool pprof, Pyroscope, Parca); call paths as
    /// location chains where samples carried stacks.
    Pprof,
    /// OTLP profiles: an ExportProfilesServiceRequest (protobuf, opentelemetry-proto
    /// v1.11.0, profiles v1development), one resource per process.
    Otlp,
    /// Folded stacks (`comm;root;…;leaf SAMPLES`, flamegraph.pl, inferno, speedscope).
    Folded,
    /// BOLT .fdata, per binary: with --output FILE, FILE holds the main binary and
    /// `FILE.<name>` each other binary; on standard output, the main binary only.
    Fdata,
    /// One self-contained HTML page: summary, sortable functions table, a flame graph
    /// coloured by CPI, each hot function's callers and annotated disassembly.
    Html,
}

#[derive(clap::Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output format [default: from --output's name (.json, .pb.gz or .pprof, .fdata, .folded,
    /// .html), else table].
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Write the output to FILE instead of standard output (an existing FILE is kept as
    /// FILE.old).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Show FUNC's disassembly with per-instruction counts and per-block CPI (table).
    #[arg(long, value_name = "FUNC")]
    pub annotate: Option<String>,
    /// Sort the function tables by this column, largest first (names A to Z).
    #[arg(long, value_name = "COLUMN", default_value = "share",
          value_parser = clap::builder::PossibleValuesParser::new(
              table::SortKey::ALL.map(|(name, _)| name)))]
    pub sort: String,
    /// One table per process (default: one list over all processes, with comm and pid
    /// columns; processes of one name are merged, as perf does).
    #[arg(long)]
    pub per_process: bool,
    /// One row group per process (default), or per comm, container or pod: the comm
    /// column then names the group (`namespace/pod/container`); with --per-process, a
    /// table per group (table).
    #[arg(long, value_name = "BY", default_value = "process",
          value_parser = clap::builder::PossibleValuesParser::new(
              table::GroupBy::ALL.map(|(name, _)| name)))]
    pub group_by: String,
    /// The whole header: why this mode, each event and its period, losses by reason.
    #[arg(short, long)]
    pub verbose: bool,
    /// No progress bar (one is shown on a terminal during long work: tracing, analysis,
    /// imports, store reads).
    #[arg(short, long)]
    pub quiet: bool,
    /// Rows per table.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = rows)]
    pub top: usize,
    /// Show the calls-only call graph (callers and callees of the hottest functions, or
    /// of --annotate FUNC) instead of the top tables (table). pprof always carries it
    /// (sample type `calls`).
    #[arg(long)]
    pub callgraph: bool,
    /// Show the call paths into FUNC (from the samples' stacks) instead of the top
    /// tables (table).
    #[arg(long, value_name = "FUNC")]
    pub callers: Option<String>,
}

impl OutputArgs {
    /// `--format`, or what `--output`'s name asks for, as perf and pprof users expect
    /// (`-o prof.json` writes JSON), else a table.
    pub fn format(&self) -> Format {
        self.format.unwrap_or_else(|| {
            let name = self
                .output
                .as_deref()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().to_ascii_lowercase())
                .unwrap_or_default();
            if name.ends_with(".json") {
                Format::Json
            } else if name.ends_with(".pb.gz") || name.ends_with(".pprof") {
                Format::Pprof
            } else if name.ends_with(".fdata") {
                Format::Fdata
            } else if name.ends_with(".folded") {
                Format::Folded
            } else if name.ends_with(".html") || name.ends_with(".htm") {
                Format::Html
            } else {
                Format::Table
            }
        })
    }
}

/// Checks the options before any work: `--annotate` only with tables, pprof (binary)
/// not to a terminal, and `--output` a file that can be written
/// (cpi-user/src/report/file.rs, `check_output`).
pub fn validate(args: &OutputArgs) -> anyhow::Result<()> {
    let format = args.format();
    if args.callgraph && format != Format::Table {
        anyhow::bail!(
            "--callgraph shows a table; it cannot be combined with --format {} (json has `calls`, pprof the `calls` sample type)",
            format_name(format)
        );
    }
    if args.callers.is_some() && format != Format::Table {
        anyhow::bail!(
            "--callers shows a table; it cannot be combined with --format {} (json and pprof hold the call paths)",
            format_name(format)
        );
    }
    if args.annotate.is_some() && format != Format::Table {
        anyhow::bail!(
            "--annotate shows a table; it cannot be combined with --format {}",
            format_name(format)
        );
    }
    let Some(path) = &args.output else {
        if matches!(format, Format::Pprof | Format::Otlp) && std::io::stdout().is_terminal() {
            anyhow::bail!(
                "--format {} is binary: refusing to write it to a terminal; give --output FILE \
                 or redirect standard output",
                format_name(format)
            );
        }
        return Ok(());
    };
    file::check_output(path).map_err(|e| anyhow::anyhow!("--output {}: {e}", path.display()))
}

/// `--top`: at least one row.
fn rows(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("tables need at least 1 row".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("not a number of rows: {s}")),
    }
}

fn format_name(f: Format) -> String {
    f.to_possible_value()
        .map_or_else(|| format!("{f:?}"), |v| v.get_name().to_string())
}

/// Renders `profile` as asked and writes it out. When the output cannot be written, the
/// profile is saved as JSON in the temporary directory (or the current one) and the
/// error names that file: nothing collected is lost.
pub fn emit(profile: &Profile, args: &OutputArgs) -> anyhow::Result<()> {
    emit_range(profile, &[], args)
}

/// [`emit`] of a profile merged from a store range: the HTML page charts `series`, the
/// windows' totals.
pub fn emit_range(
    profile: &Profile,
    series: &[WindowTotals],
    args: &OutputArgs,
) -> anyhow::Result<()> {
    validate(args)?;
    render_and_write(profile, series, args)
}

/// [`write_out`]; on failure the profile is saved elsewhere and the error says where.
fn write_saving(profile: &Profile, path: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    write_saving_with(profile, path, |w| w.write_all(bytes))
}

/// [`write_saving`] of what `write` writes (the JSON profile, serialised as it goes).
fn write_saving_with(
    profile: &Profile,
    path: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    write_out(path, write).map_err(|e| match save_elsewhere(profile) {
        Some(saved) => e.context(format!(
            "the profile is saved in {} (`cpi-bpf report {}` shows it)",
            saved.display(),
            saved.display()
        )),
        None => e,
    })
}

/// Writes the JSON profile to `$TMPDIR` (else /tmp), else the current directory.
fn save_elsewhere(profile: &Profile) -> Option<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = format!("cpi-bpf-profile-{}-{secs}.json", std::process::id());
    [std::env::temp_dir(), PathBuf::from(".")]
        .into_iter()
        .map(|d| d.join(&name))
        .find(|p| {
            cpi_user::fsafe::create_new(p)
                .and_then(|f| file::write_json(profile, f))
                .is_ok()
        })
}

fn render_and_write(
    profile: &Profile,
    series: &[WindowTotals],
    args: &OutputArgs,
) -> anyhow::Result<()> {
    match args.format() {
        Format::Table => {
            let opts = table::TableOptions {
                top: args.top,
                annotate: args.annotate.clone(),
                callgraph: args.callgraph,
                width: args.output.is_none().then(terminal_width).flatten(),
                verbose: args.verbose,
                per_process: args.per_process,
                group_by: table::GroupBy::named(&args.group_by).unwrap_or_default(),
                sort: table::SortKey::named(&args.sort).unwrap_or_default(),
                callers: args.callers.clone(),
            };
            match table::render(profile, &opts) {
                Ok(text) => write_saving(profile, args.output.as_deref(), text.as_bytes()),
                // An unknown or ambiguous --annotate/--callers name: the profile is still
                // shown, then the error with the names meant.
                Err(e) => {
                    let tables = table::render(
                        profile,
                        &table::TableOptions {
                            annotate: None,
                            callers: None,
                            ..opts
                        },
                    )?;
                    write_saving(profile, args.output.as_deref(), tables.as_bytes())?;
                    Err(e.into())
                }
            }
        }
        Format::Json => write_saving_with(profile, args.output.as_deref(), |w| {
            file::write_json(profile, w)
        }),
        Format::Pprof => {
            let bytes = pprof::encode(profile).context("compressing the pprof profile")?;
            write_saving(profile, args.output.as_deref(), &bytes)
        }
        Format::Html => write_saving(
            profile,
            args.output.as_deref(),
            html::render_range(profile, series)?.as_bytes(),
        ),
        Format::Otlp => write_saving(profile, args.output.as_deref(), &otlp::encode(profile)),
        Format::Folded => write_saving(
            profile,
            args.output.as_deref(),
            folded::render(profile).as_bytes(),
        ),
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
            write_saving(profile, args.output.as_deref(), main.text.as_bytes())?;
            match &args.output {
                Some(path) => {
                    for f in others {
                        let name = f.binary.rsplit('/').next().unwrap_or(&f.binary);
                        let mut p = path.as_os_str().to_owned();
                        p.push(format!(".{name}"));
                        write_saving(profile, Some(Path::new(&p)), f.text.as_bytes())?;
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

/// The width tables are fitted to on standard output: `COLUMNS` when set, else the
/// terminal's; none when standard output is not a terminal (a pipe or file gets whole
/// names, as perf's `--stdio` does).
fn terminal_width() -> Option<usize> {
    width_of(&console::Term::stdout())
}

/// [`terminal_width`] of standard error, where status lines go.
pub fn stderr_width() -> Option<usize> {
    width_of(&console::Term::stderr())
}

fn width_of(term: &console::Term) -> Option<usize> {
    if let Some(n) = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()) {
        return Some(n).filter(|&n| n > 0);
    }
    // None when the stream is not a terminal.
    term.size_checked().map(|(_, cols)| usize::from(cols))
}

/// Writes what `write` writes to `path`, or standard output.
pub fn write_out(
    path: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    match path {
        Some(path) => {
            file::write_output(path, write).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            match write(&mut out).and_then(|_| out.flush()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                r => r.context("writing to standard output"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        output: OutputArgs,
    }

    fn format_of(args: &[&str]) -> Format {
        Cli::parse_from(std::iter::once("cpi-bpf").chain(args.iter().copied()))
            .output
            .format()
    }

    #[test]
    fn output_name_chooses_the_format_unless_format_is_given() {
        assert_eq!(format_of(&["-o", "p.JSON"]), Format::Json);
        assert_eq!(format_of(&["-o", "dir/p.pb.gz"]), Format::Pprof);
        assert_eq!(format_of(&["-o", "p.pprof"]), Format::Pprof);
        assert_eq!(format_of(&["-o", "prog.fdata"]), Format::Fdata);
        assert_eq!(format_of(&["-o", "report.txt"]), Format::Table);
        assert_eq!(format_of(&[]), Format::Table);
        assert_eq!(
            format_of(&["-o", "p.json", "--format", "table"]),
            Format::Table
        );
    }
}
