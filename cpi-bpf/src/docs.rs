//! `cpi-bpf generate-docs DIR` (hidden): the man pages and the bash/zsh/fish completions,
//! generated from the clap definition in `main.rs` so they cannot drift from `--help`.
//! `cargo xtask setup` runs it into `target/release/` (xtask/src/setup.rs).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args as _;
use clap_complete::Shell;

pub const NAME: &str = "generate-docs";

/// The hidden subcommand, for `main.rs` to add beside `Cli`'s own.
pub fn command() -> clap::Command {
    Args::augment_args(
        clap::Command::new(NAME)
            .hide(true)
            .about("Write the man pages and shell completions into DIR"),
    )
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Folder to write `man/cpi-bpf.1` (one page per subcommand beside it) and
    /// `completions/` into.
    dir: PathBuf,
}

pub fn run(a: Args, mut cmd: clap::Command) -> anyhow::Result<i32> {
    let man = a.dir.join("man");
    let completions = a.dir.join("completions");
    for d in [&man, &completions] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    clap_mangen::generate_to(cmd.clone(), &man)
        .with_context(|| format!("writing man pages into {}", man.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, "cpi-bpf", &completions).with_context(
            || format!("writing {shell} completions into {}", completions.display()),
        )?;
    }
    Ok(0)
}
