//! The default command: collect from pids, the whole system, or a command.

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("collection is not built yet")
}
