//! The PMU model and its proof (docs/METHOD.md, "Simulate"): an exact
//! trace of a real run ([`trace`], written by the Valgrind tool in `tests/tracer/`),
//! a deterministic `cycles` model, the [`pmu`] model that turns the replayed trace
//! into the wire samples real collection produces, and the exact truth those samples
//! are measured against ([`replay`], [`accuracy`]).

pub mod accuracy;
pub mod calibrate;
pub(crate) mod code;
pub mod context_truth;
pub(crate) mod cycles;
pub mod path_truth;
pub mod pmu;
pub mod replay;
pub mod run;
pub(crate) mod shadow;
mod sys;
pub mod trace;

use std::ffi::OsString;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use crate::binary::SymbolizerOptions;
use crate::profile::analyze::LineDetail;
use crate::profile::model::{EventInfo, EventUnit, LossReport, Mode, Profile, RunInfo};
use crate::profile::{analyze, AnalysisOptions, SampleSet, StackWeighting};
use cpi_common::policy::PeriodPolicy;
use cpi_common::wire::EventRole;
use pmu::{BranchEvent, PmuConfig, PmuStats};
use replay::{Replay, Truth};

/// Bytes each simulated process's call stacks may hold (the collector's default is
/// [`crate::profile::stack::DEFAULT_STACK_BYTES`]).
pub(crate) const SIM_STACK_BYTES: usize = 256 << 20;

/// Why a simulation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The tracer (`tests/tracer/cpitrace.c`) is neither installed nor built.
    #[error(
        "the cpitrace Valgrind tool is not installed (looked in {}); install the cpi-bpf \
         package (`cargo xtask package && apt install ./target/debian/cpi-bpf_*.deb` in a \
         source checkout), or build it with `cargo xtask setup` and set \
         CPI_TRACER_DIR=<target dir>/cpi-tracer",
        run::display_dirs(tried)
    )]
    ToolNotFound {
        /// The folders searched.
        tried: Vec<PathBuf>,
    },
    /// No command was given.
    #[error("no command to run")]
    NoCommand,
    /// Valgrind could not be started.
    #[error("starting valgrind (apt-get install valgrind)")]
    Spawn(#[source] std::io::Error),
    /// The FIFO the trace streams through could not be made or read.
    #[error("trace FIFO {0}")]
    Fifo(PathBuf, #[source] std::io::Error),
    /// The trace file could not be created.
    #[error("creating the trace file {0}")]
    TraceFile(PathBuf, #[source] std::io::Error),
    /// Valgrind exited before the trace ended.
    #[error("valgrind failed ({0}) before the trace was complete")]
    Valgrind(ExitStatus),
    /// The trace stream is malformed.
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
}

/// Multiply-xorshift hasher for the replay's integer keys: the std SipHash costs more
/// than the rest of a record's processing.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(23) ^ v).wrapping_mul(0xff51_afd7_ed55_8ccd);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
}

/// HashMap with [`FastHasher`].
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// What one traced and replayed run produced.
struct SimOutput {
    /// Per PMU model: the wire samples it emitted, aggregated (maps and comm filled
    /// in), and what it counted and emitted.
    pub models: Vec<(SampleSet, PmuStats)>,
    /// The exact answer.
    pub truth: Truth,
    /// How the command exited.
    pub status: ExitStatus,
    /// Wall-clock time of the traced run and replay.
    pub wall_secs: f64,
}

/// The result of [`simulate`]: the profile sampling would report, with its accuracy
/// against the exact trace ([`Profile::accuracy`], always set), and the exact truth.
pub struct SimReport {
    /// The profile, `accuracy` included.
    pub profile: Profile,
    /// The exact answer the profile was compared with.
    pub truth: Truth,
    /// What the PMU model counted and emitted.
    pub pmu: PmuStats,
    /// How the command exited.
    pub status: ExitStatus,
}

impl SimReport {
    /// The profile's accuracy against the exact trace.
    pub fn accuracy(&self) -> &crate::profile::model::Accuracy {
        self.profile
            .accuracy
            .as_ref()
            .expect("simulate always sets the accuracy")
    }
}

/// The simulate pipeline (`cpi-bpf simulate`): runs `cmd` under the exact tracer
/// (its standard output to `stdout`), replays the trace through the cycle model and the
/// PMU model configured by `cfg`, analyses the samples with the production analysis and
/// measures the profile against the exact answer.
pub fn simulate(cfg: &PmuConfig, cmd: &[OsString], stdout: Stdio) -> Result<SimReport, SimError> {
    simulate_with(cfg, LineDetail::Every, cmd, stdout)
}

/// [`simulate`], giving `lines` instructions of each function a line: `cpi-bpf
/// simulate` keeps only the lines and blocks that ran unless `--annotate` shows a
/// function whole, as the one-shot does (most instructions of the functions a compile
/// of cc1 touches never run: their lines were 68 % of a 578 MB file).
pub fn simulate_with(
    cfg: &PmuConfig,
    lines: LineDetail,
    cmd: &[OsString],
    stdout: Stdio,
) -> Result<SimReport, SimError> {
    let mut out = simulate_command(std::slice::from_ref(cfg), cmd, stdout)?;
    let (samples, pmu) = out.models.remove(0);
    let profile = profile_of(
        cfg,
        &samples,
        &out.truth,
        &pmu,
        command_strings(cmd),
        out.wall_secs,
        lines,
    );
    Ok(SimReport {
        profile,
        truth: out.truth,
        pmu,
        status: out.status,
    })
}

fn command_strings(cmd: &[OsString]) -> Vec<String> {
    cmd.iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect()
}

/// The model's events, as a recording's events are listed: the branch-stack event
/// and the cycles event, with their sampling policies.
fn model_events(cfg: &PmuConfig, pmu: &PmuStats) -> Vec<EventInfo> {
    let thinning = if cfg.perturbation.kernel() {
        cfg.thinning
    } else {
        1
    };
    let event = |role: EventRole, name: &str, p: &PeriodPolicy, samples: u64| EventInfo {
        role,
        name: name.into(),
        period: p.base,
        jitter: if cfg.perturbation.user() { p.jitter } else { 0 },
        thinning,
        unit: EventUnit::of_role(role),
        samples,
        also: Vec::new(),
    };
    vec![
        match cfg.branch_event {
            BranchEvent::Branches => event(
                EventRole::Branches,
                "model: retired taken branches + LBR",
                &cfg.branch,
                pmu.branch_samples,
            ),
            BranchEvent::Cycles => event(
                EventRole::Branches,
                "model: cycles + LBR",
                &cfg.cycles,
                pmu.branch_samples,
            ),
        },
        event(
            EventRole::Cycles,
            "model: cycles",
            &cfg.cycles,
            pmu.ip_samples,
        ),
    ]
}

/// The analysis half of [`simulate`], for samples the PMU model produced from a trace
/// (`samples` with the traced process's maps): the run description, the production
/// analysis (each function's instructions given a line as `lines` says), and the
/// accuracy against `truth`.
pub fn profile_of(
    cfg: &PmuConfig,
    samples: &SampleSet,
    truth: &Truth,
    pmu: &PmuStats,
    command: Vec<String>,
    duration_secs: f64,
    lines: LineDetail,
) -> Profile {
    let weighting = cfg.weighting();
    // Stacks sampled on cycles, weighted per window, give a relative instruction
    // profile: no CPI from it.
    let relative = cfg.branch_event == BranchEvent::Cycles && weighting == StackWeighting::Window;
    let stacks = match cfg.branch_event {
        BranchEvent::Branches => "branch stacks sampled on taken branches",
        BranchEvent::Cycles => "branch stacks sampled on cycles",
    };
    let untimed = samples
        .processes
        .values()
        .map(|p| p.branches.untimed_samples)
        .sum::<u64>();
    let run = RunInfo {
        mode: Mode::Simulated,
        mode_reason: format!(
            "PMU model replaying an exact trace (Valgrind cpitrace) with modelled cycles; \
             {} instructions, {} cycles exactly; {stacks}, {}{}{}{}",
            truth.instructions,
            truth.cycles,
            weighting.describe(),
            if relative {
                ": a relative instruction profile, no CPI"
            } else {
                ""
            },
            if untimed > 0 {
                format!("; {untimed} stacks without timed entries left out")
            } else {
                String::new()
            },
            followed(truth)
                .map(|f| format!("; {f}"))
                .unwrap_or_default()
        ),
        command,
        duration_secs,
        events: model_events(cfg, pmu),
        perturbation: cfg.perturbation,
        lost: LossReport {
            thinned: pmu.thinned,
            // The `[dropped]` path's samples, said as the collector says them.
            stacks_evicted: samples.stacks_evicted(),
            ..LossReport::default()
        },
    };
    let opts = AnalysisOptions {
        // The traced process is gone: its maps come from the trace.
        symbolizer: SymbolizerOptions {
            use_proc: false,
            ..SymbolizerOptions::default()
        },
        lines,
        ..AnalysisOptions::default()
    };
    let mut profile = analyze(samples, run, &opts);
    if relative {
        profile.without_cpi(
            "its branch stacks were sampled on cycles and weighted per window, so their \
             instruction counts are relative (cycle-sampled stacks over-weight slow code)"
                .into(),
        );
    }
    profile.accuracy = Some(accuracy::compare(&profile, truth));
    if lines == LineDetail::Evidence {
        drop_unrun_blocks(&mut profile);
    }
    profile
}

/// Leaves out the blocks that never ran (no count, no sample), as
/// [`LineDetail::Evidence`] leaves out their instructions' lines; only once the
/// accuracy, which judges every block of a function, is measured. A compile of cc1
/// touches 533 k blocks of which 436 k never ran: 47 % of its file.
fn drop_unrun_blocks(profile: &mut Profile) {
    for f in profile.processes.iter_mut().flat_map(|p| &mut p.functions) {
        f.blocks.retain(|b| b.count > 0.0 || b.samples > 0);
    }
}

/// What the trace followed beyond one program, in a line (for the mode reason and a
/// note on stderr): the programs the command exec'd, and the child processes it created,
/// which are not traced (cpi-user/src/sim/run.rs). `None` when one program ran alone.
pub fn followed(truth: &Truth) -> Option<String> {
    let mut parts = Vec::new();
    if !truth.replaced.is_empty() {
        let before: u64 = truth.replaced.iter().map(|i| i.instructions).sum();
        let chain: Vec<String> = truth
            .replaced
            .iter()
            .map(|i| {
                format!(
                    "{} ({}{} instructions)",
                    i.path,
                    script(&i.path),
                    i.instructions
                )
            })
            .collect();
        let last = &truth.program;
        let last_script = script(last);
        parts.push(format!(
            "the command exec'd: {} → {last}{}; the profile is of {last}, the {before} \
             instructions before its exec are not in it",
            chain.join(" → "),
            last_script
                .strip_suffix(", ")
                .map(|s| format!(" ({s})"))
                .unwrap_or_default(),
        ));
    }
    if truth.forks > 0 {
        parts.push(format!(
            "{} child process{} created, not traced (simulate follows exec, not fork)",
            truth.forks,
            if truth.forks == 1 { "" } else { "es" }
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// `a script for INTERPRETER, ` when `path` is one, else nothing.
fn script(path: &str) -> String {
    script_interpreter(Path::new(path))
        .map(|i| format!("a script for {i}, "))
        .unwrap_or_default()
}

/// The interpreter line of the script at `path` (`#!/usr/bin/env bash` gives
/// `/usr/bin/env bash`): the program the kernel, and Valgrind, run instead of it.
/// `None` for anything else, or a bare name (found through a `PATH` that is not ours).
pub fn script_interpreter(path: &Path) -> Option<String> {
    use std::io::Read;
    if !path.as_os_str().as_encoded_bytes().contains(&b'/') {
        return None;
    }
    let mut head = Vec::new();
    crate::fsafe::open(path)
        .ok()?
        .take(256)
        .read_to_end(&mut head)
        .ok()?;
    let line = head.strip_prefix(b"#!")?.split(|&b| b == b'\n').next()?;
    let line = String::from_utf8_lossy(line).trim().to_string();
    (!line.is_empty()).then_some(line)
}

/// Runs `cmd` under the tracer and replays the live trace once through the cycle model
/// and one PMU model per entry of `cfgs`.
fn simulate_command(
    cfgs: &[PmuConfig],
    cmd: &[OsString],
    stdout: Stdio,
) -> Result<SimOutput, SimError> {
    let tool = run::find_tool_dir()?;
    let t0 = std::time::Instant::now();
    let cfgs = cfgs.to_vec();
    let ((sets, truth, stats), status) = run::run_streaming(&tool, cmd, stdout, move |fifo| {
        let mut sets: Vec<SampleSet> = cfgs
            .iter()
            .map(|cfg| {
                let depth = cfg.depth.clamp(2, cpi_common::wire::MAX_BRANCH_ENTRIES);
                let mut set = SampleSet::new(cpi_common::policy::range_window(depth));
                set.weighting = cfg.weighting();
                // The proof harness keeps every call path it can: the address-keyed stacks
                // of deep two-way recursion (glibc's msort in sim_mix) outgrow the
                // default bound, whose evictions then cost the per-path overlap (0.73 at
                // 8 MiB, 0.98 at 64 MiB, 0.994 at 512 MiB).
                set.stack_bytes = SIM_STACK_BYTES;
                set
            })
            .collect();
        // The pid is only known from the trace header; the models are created lazily.
        let mut replay = Replay::default();
        replay.run_models(fifo, &mut sets, cfgs)?;
        let truth = replay.truth();
        let stats: Vec<PmuStats> = replay.pmus().iter().map(|p| p.stats.clone()).collect();
        Ok((sets, truth, stats))
    })?;
    // As the kernel names a process: after the file it exec'd last.
    let comm = truth
        .program
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let models = sets
        .into_iter()
        .zip(stats)
        .map(|(mut samples, stats)| {
            let p = samples.process(truth.pid);
            p.maps = Some(truth.maps.clone());
            p.comm = comm.clone();
            (samples, stats)
        })
        .collect();
    Ok(SimOutput {
        models,
        truth,
        status,
        wall_secs: t0.elapsed().as_secs_f64(),
    })
}
