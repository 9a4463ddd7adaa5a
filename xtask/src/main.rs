//! Developer entry points: `cargo xtask setup`, `cargo xtask run -- ARGS`, `cargo xtask docs`,
//! `cargo xtask package`.

mod kernels;
mod package;
mod setup;
mod tracer;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install everything the build and the tests need on a fresh machine (idempotent).
    Setup,
    /// Build cpi-bpf and run it as root with ARGS.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build cpi-bpf and write its man pages and shell completions into target/release/.
    Docs,
    /// Build the Debian package target/debian/cpi-bpf_VERSION_ARCH.deb (binary, Valgrind
    /// tracer, man pages, completions, systemd unit, agent.toml).
    Package,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::setup(),
        Command::Run { args } => setup::run(&args),
        Command::Docs => setup::docs(),
        Command::Package => package::package().map(drop),
    }
}
