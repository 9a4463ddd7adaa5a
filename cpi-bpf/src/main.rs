//! `cpi-bpf`: the thin CLI over the `cpi_user` library and the `cpi_agent` crate.

mod agent;
mod diff;
mod docs;
mod doctor;
mod import_perf;
mod output;
mod policy;
mod progress;
mod record;
mod report;
mod simulate;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Accurate fine-grained CPI (cycles per instruction) and edge profiles from sampled
/// branch records, collected with eBPF.
#[derive(Parser, Debug)]
#[command(
    name = "cpi-bpf",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("CPI_BPF_COMMIT"), ")"),
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    record: record::Args,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show what this machine can measure (PMU, LBR, BTF, privileges) and the mode
    /// cpi-bpf would run in.
    Doctor(doctor::Args),
    /// Run a command under an exact tracer and show what sampling would report for it,
    /// and how far that is from the exact answer (the PMU model).
    ///
    /// The Valgrind tracer it runs is looked for in $CPI_TRACER_DIR, in `cpi-tracer/` of
    /// the build tree the binary sits in, in `lib/cpi-bpf/` of the prefix it is installed
    /// under, and in /usr/lib/cpi-bpf (where the Debian package puts it).
    Simulate(simulate::Args),
    /// Read a profile file written with --output and show it again.
    Report(report::Args),
    /// Always-on profiling: windows into a local store, Prometheus metrics, push to
    /// Pyroscope; runs until SIGTERM.
    Agent(Box<agent::Args>),
    /// Analyse recordings made elsewhere with `perf record -b` (or `-e cpu-clock`, a
    /// time profile), `-g` callchains and `--call-graph dwarf` stacks as call stacks: a
    /// perf.data file, or `perf script -F pid,tid,ip,sym,dso,brstack` text.
    ImportPerf(import_perf::Args),
    /// Compare two profiles: per process and function, the change in cycles (time),
    /// instructions and CPI with its error and z-score, significance controlled over all
    /// changes at once (Benjamini–Hochberg).
    Diff(diff::Args),
}

/// What the command line asks for: a profile (`Cli`) or the hidden `generate-docs`.
enum Invocation {
    Run(Box<Cli>),
    Docs(docs::Args),
}

use cpi_user::fsafe::escape;

/// Opens the recording or profile FILE the user named (`-`: standard input; a FIFO
/// without a writer is an error within `FIFO_WAIT`) and, as root, lets what it names be
/// opened only as the user it came from could (cpi-user/src/fsafe/behalf.rs), except
/// `trusted_dirs` and `trusted_files`, named on this command line.
fn open_recording(
    path: &std::path::Path,
    trusted_dirs: Vec<std::path::PathBuf>,
    trusted_files: Vec<std::path::PathBuf>,
) -> anyhow::Result<std::fs::File> {
    use cpi_user::fsafe::{self, behalf};
    let f = fsafe::open_input(path, fsafe::FIFO_WAIT)?;
    if let Some(r) = behalf::reader_for(&f)? {
        behalf::read_as(r.trusting(trusted_dirs, trusted_files));
    }
    Ok(f)
}

fn main() {
    // `generate-docs` is added here, not in `Cli`, so that the pages and completions it
    // writes from `Cli` do not offer it.
    let parsed = Cli::command()
        .subcommand(docs::command())
        .try_get_matches()
        .and_then(|m| match m.subcommand() {
            Some((docs::NAME, sub)) => docs::Args::from_arg_matches(sub).map(Invocation::Docs),
            _ => Cli::from_arg_matches(&m).map(|c| Invocation::Run(Box::new(c))),
        });
    let cli = match parsed {
        Ok(Invocation::Run(cli)) => *cli,
        Ok(Invocation::Docs(a)) => exit_with(docs::run(a, Cli::command())),
        // Help and version go out as clap writes them; a bad argument is one line.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!("cpi-bpf: error: {}", one_line(&e));
            std::process::exit(2);
        }
    };
    let output = match &cli.command {
        None => Some(&cli.record.output),
        Some(Command::Simulate(a)) => Some(&a.output),
        Some(Command::Report(a)) => Some(&a.output),
        Some(Command::ImportPerf(a)) => Some(&a.output),
        Some(Command::Agent(_) | Command::Doctor(_) | Command::Diff(_)) => None,
    };
    // The agent's level comes from its flags and config file: it starts logging itself.
    if !matches!(cli.command, Some(Command::Agent(_))) {
        init_logging(if output.is_some_and(|o| o.verbose) {
            log::LevelFilter::Info
        } else {
            log::LevelFilter::Warn
        });
    }
    progress::install(output.is_none_or(|o| o.quiet));
    let result = match cli.command {
        None => record::run(cli.record),
        Some(Command::Agent(a)) => agent::run(*a),
        Some(Command::Doctor(a)) => doctor::run(a),
        Some(Command::Simulate(a)) => simulate::run(a),
        Some(Command::Report(a)) => report::run(a),
        Some(Command::ImportPerf(a)) => import_perf::run(a),
        Some(Command::Diff(a)) => diff::run(a),
    };
    exit_with(result)
}

/// Library messages in the one style of every message (`cpi-bpf: warning: …`), with the
/// paths and names other processes chose escaped; with `-v` the detail behind a summary
/// (info level) too. Written above a progress bar, never through it. `RUST_LOG`
/// overrides `level`.
fn init_logging(level: log::LevelFilter) {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level.as_str()))
        .format(|buf, record| {
            use std::io::Write;
            let tag = match record.level() {
                log::Level::Error => "error: ",
                log::Level::Warn => "warning: ",
                _ => "",
            };
            let msg = record.args().to_string();
            writeln!(buf, "cpi-bpf: {tag}{}", escape(&msg))
        })
        .target(env_logger::Target::Pipe(Box::new(progress::Stderr)))
        .init();
}

/// `e` and its causes joined by `: ` ([`cpi_user::chain`]): each error's message says
/// what failed and leaves its cause to `source()`.
fn error_line(e: &anyhow::Error) -> String {
    cpi_user::chain(e.as_ref())
}

fn exit_with(result: anyhow::Result<i32>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One clear line (with its causes), no backtrace.
            eprintln!("cpi-bpf: error: {}", escape(&error_line(&e)));
            std::process::exit(1);
        }
    }
}

/// clap's message in one line: its first line, then the suggestion ("did you mean") or
/// the valid values it would have printed below it.
fn one_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    let mut line = first.strip_prefix("error: ").unwrap_or(first).to_string();
    let values = |v: &ContextValue| match v {
        ContextValue::String(s) => vec![s.clone()],
        ContextValue::Strings(s) => s.clone(),
        _ => Vec::new(),
    };
    let quoted = |v: Vec<String>| {
        v.iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (kind, value) in e.context() {
        match kind {
            ContextKind::SuggestedArg
            | ContextKind::SuggestedSubcommand
            | ContextKind::SuggestedValue => {
                line += &format!("; did you mean {}?", quoted(values(value)));
            }
            ContextKind::ValidValue => {
                line += &format!("; possible values: {}", values(value).join(", "));
            }
            ContextKind::InvalidArg
                if e.kind() == clap::error::ErrorKind::MissingRequiredArgument =>
            {
                line += &format!(" {}", values(value).join(" "));
            }
            _ => {}
        }
    }
    line
}
