//! `cpi-bpf`: the thin CLI over the `cpi_user` library.

mod agent;
mod doctor;
mod import_perf;
mod output;
mod policy;
mod record;
mod report;
mod simulate;

use clap::{Parser, Subcommand};

/// Accurate fine-grained CPI (cycles per instruction) and edge profiles from sampled
/// branch records, collected with eBPF.
#[derive(Parser, Debug)]
#[command(name = "cpi-bpf", version, args_conflicts_with_subcommands = true)]
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
    Simulate(simulate::Args),
    /// Read a profile file written with --output and show it again.
    Report(report::Args),
    /// Always-on profiling: windows into a local store, Prometheus metrics, push to
    /// Pyroscope; runs until SIGTERM.
    Agent(Box<agent::Args>),
    /// Analyse branch stacks recorded elsewhere with `perf record -b`: a perf.data
    /// file, or `perf script -F pid,tid,ip,sym,dso,brstack` text.
    ImportPerf(import_perf::Args),
}

use cpi_user::fsafe::escape;

fn main() {
    // Log lines carry paths and names other processes chose: escaped, one line each.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|buf, r| {
            use std::io::Write;
            let msg = r.args().to_string();
            writeln!(buf, "[{:<5} {}] {}", r.level(), r.target(), escape(&msg))
        })
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go out as clap writes them; a bad argument is one line.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("cpi-bpf: {first}");
            std::process::exit(2);
        }
    };
    let result = match cli.command {
        None => record::run(cli.record),
        Some(Command::Agent(a)) => agent::run(*a),
        Some(Command::Doctor(a)) => doctor::run(a),
        Some(Command::Simulate(a)) => simulate::run(a),
        Some(Command::Report(a)) => report::run(a),
        Some(Command::ImportPerf(a)) => import_perf::run(a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One clear line (with its causes), no backtrace.
            eprintln!("cpi-bpf: error: {}", escape(&format!("{e:#}")));
            std::process::exit(1);
        }
    }
}
