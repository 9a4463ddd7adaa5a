//! The PMU model and its proof (DESIGN.md, "Validation without hardware"): an exact
//! trace of a real run ([`trace`], written by the Valgrind tool in `tests/tracer/`),
//! a deterministic [`cycles`] model, the [`pmu`] model that turns the replayed trace
//! into the wire samples real collection produces, and the exact truth those samples
//! are measured against ([`replay`], [`accuracy`]).

pub mod accuracy;
pub mod code;
pub mod cycles;
pub mod pmu;
pub mod replay;
pub mod run;
pub mod trace;

use std::ffi::OsString;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};

use crate::profile::SampleSet;
use pmu::{PmuConfig, PmuStats};
use replay::{Replay, Truth};

/// Why a simulation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the cpitrace Valgrind tool is not built (looked in {tried:?}); run `cargo xtask setup` or set CPI_TRACER_DIR")]
    ToolNotFound { tried: Vec<PathBuf> },
    #[error("no command to run")]
    NoCommand,
    #[error("starting valgrind: {0} (apt-get install valgrind)")]
    Spawn(#[source] std::io::Error),
    #[error("trace FIFO {0}: {1}")]
    Fifo(PathBuf, #[source] std::io::Error),
    #[error("valgrind failed ({0}) before the trace was complete")]
    Valgrind(ExitStatus),
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
pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// What one simulated run produced.
pub struct SimOutput {
    /// The wire samples the PMU model emitted, aggregated (maps and comm filled in).
    pub samples: SampleSet,
    pub truth: Truth,
    pub pmu: PmuStats,
    pub status: ExitStatus,
    pub wall_secs: f64,
}

/// Runs `cmd` under the tracer and replays the live trace through the cycle model and
/// the PMU model configured by `cfg`.
pub fn simulate_command(
    cfg: &PmuConfig,
    cmd: &[OsString],
    stdout: Stdio,
) -> Result<SimOutput, SimError> {
    let tool = run::find_tool_dir()?;
    let t0 = std::time::Instant::now();
    let cfg = cfg.clone();
    let window =
        cpi_common::policy::range_window(cfg.depth.clamp(2, cpi_common::wire::MAX_BRANCH_ENTRIES));
    let ((samples, truth, pmu), status) = run::run_streaming(&tool, cmd, stdout, move |fifo| {
        let mut set = SampleSet::new(window);
        // The pid is only known from the trace header; the model is created lazily.
        let mut replay = Replay::default();
        replay.run(fifo, &mut set, Some(cfg))?;
        let truth = replay.truth();
        let stats = replay.pmu().map(|p| p.stats.clone()).unwrap_or_default();
        Ok((set, truth, stats))
    })?;
    let mut samples = samples;
    let comm = cmd[0].to_string_lossy();
    let comm = comm.rsplit('/').next().unwrap_or(&comm).to_string();
    let p = samples.process(truth.pid);
    p.maps = Some(truth.maps.clone());
    p.comm = comm;
    Ok(SimOutput {
        samples,
        truth,
        pmu,
        status,
        wall_secs: t0.elapsed().as_secs_f64(),
    })
}
