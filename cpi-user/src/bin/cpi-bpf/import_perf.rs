//! `import-perf`: analyse branch stacks recorded elsewhere with `perf record -b`, from
//! `perf script -F pid,tid,ip,sym,dso,brstack` (or `brstackoff`) text.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use cpi_common::policy::Perturbation;
use cpi_common::wire::{EventRole, IpSample, SampleHeader, SampleKind, WIRE_VERSION};
use cpi_user::profile::model::{EventInfo, EventUnit, LossReport, Mode, RunInfo};
use cpi_user::profile::{analyze, AnalysisOptions};
use cpi_user::report::perf_script::{self, ImportOptions};

use crate::output::{emit, OutputArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// `perf script` text; `-` reads standard input.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The text was written with `brstackoff` (dso offsets) rather than `brstack`.
    #[arg(long)]
    pub brstackoff: bool,
    /// The recording's sampling period (`perf record -c N`, cycles); without it counts
    /// are relative (each sample weighs 1).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub period: u64,
    /// Newest ranges used per branch stack (seed 001's CBT window).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub window: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let mut text = String::new();
    if args.file.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
    } else {
        text = std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?;
    }
    let opts = ImportOptions {
        offsets: args.brstackoff,
        period: args.period.max(1),
    };
    let import = perf_script::parse(&text, opts, &perf_script::elf_layout)
        .with_context(|| format!("{}", args.file.display()))?;
    for dso in &import.unplaced {
        log::warn!(
            "{dso}: cannot place its runtime addresses (PIE or shared library without mmap \
             events): re-run `perf script` with --show-mmap-events, or use brstackoff"
        );
    }
    if import.ips_at_branch_target > 0 {
        log::warn!(
            "{} sample ips are runtime addresses no mapping holds (brstackoff without mmap \
             events): each is taken at its newest branch target",
            import.ips_at_branch_target
        );
    }
    if import.truncated_stacks > 0 {
        log::warn!(
            "{} branch stacks were deeper than {} entries; the newest were kept",
            import.truncated_stacks,
            cpi_common::wire::MAX_BRANCH_ENTRIES
        );
    }
    // Each perf sample is also a cycles IP sample: `perf record -b` samples cycles.
    let ips: Vec<IpSample> = import
        .samples
        .iter()
        .map(|s| IpSample {
            header: SampleHeader {
                version: WIRE_VERSION,
                kind: SampleKind::Ip as u16,
                event: EventRole::Cycles as u32,
                nr: 0,
                ..s.header
            },
        })
        .collect();
    let n = import.samples.len() as u64;
    let mut set = import.into_sample_set(args.window);
    for ip in &ips {
        set.add_ip(ip).expect("cycles is a known role");
    }
    let event = |role: EventRole| EventInfo {
        role,
        name: "cycles (perf record -b)".into(),
        period: opts.period,
        jitter: 0,
        thinning: 1,
        unit: EventUnit::Events,
        samples: n,
    };
    let relative = if args.period > 1 {
        String::new()
    } else {
        "; no --period: counts are relative".to_string()
    };
    let run = RunInfo {
        mode: Mode::Cpi,
        mode_reason: format!(
            "imported from perf script text {}: cycles samples with branch stacks \
             (instruction counts scale with cycles, not taken branches){relative}",
            args.file.display()
        ),
        command: Vec::new(),
        duration_secs: 0.0,
        events: vec![event(EventRole::Branches), event(EventRole::Cycles)],
        perturbation: Perturbation::None,
        lost: LossReport::default(),
    };
    let profile = analyze(&set, run, &AnalysisOptions::default());
    emit(&profile, &args.output)?;
    Ok(0)
}
