//! `doctor`: every probe the capability ladder uses, then the mode cpi-bpf would run in.

use cpi_user::collect::diagnose::{diagnose, diagnose_recorded};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Probe a recorded machine instead of this one: DIR holds its `sys/` and `proc/`
    /// (`sys/bus/event_source/devices/*`, `sys/devices/system/cpu/online`,
    /// `proc/cpuinfo`, `proc/sys/kernel/osrelease`; tests/data/machines/ has some).
    /// Prints what cpi-bpf finds there, the mode and the events it would open, on
    /// which CPUs; nothing is opened or loaded.
    #[arg(long, value_name = "DIR")]
    root: Option<std::path::PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let diagnosis = match &args.root {
        Some(root) => diagnose_recorded(root)?,
        None => diagnose(),
    };
    for (what, finding) in &diagnosis.lines {
        println!("{what:<22} {finding}");
    }
    Ok(if diagnosis.can_collect { 0 } else { 1 })
}
