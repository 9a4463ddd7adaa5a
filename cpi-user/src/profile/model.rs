//! The profile: what analysis produces and every report/export reads. Serialised as the
//! versioned JSON profile file (`--output`), read back by `cpi-bpf report`.
//!
//! Addresses are in each binary's own address space (ELF virtual addresses, as
//! `objdump`/BOLT see them), not runtime addresses, so profiles of PIE binaries and
//! shared libraries compare across runs.

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change; readers reject newer versions.
pub const PROFILE_FORMAT_VERSION: u32 = 1;

/// What the numbers in a profile are (the capability ladder of DESIGN.md).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Branch records + cycle samples: instructions from LBR ranges, cycles from
    /// perturbed cycle samples. Full CPI.
    Cpi,
    /// PMU without branch records: cycles and instructions IP samples. CPI per unit is
    /// the imprecise "traditional" method (seed 000's problem statement).
    IpSampling,
    /// No PMU: software `cpu-clock` time profile. No cycles, no instructions, no CPI.
    TimeProfile,
    /// The PMU model replaying an exact trace (`cpi-bpf simulate`): a CPI profile of
    /// modelled cycles.
    Simulated,
}

impl Mode {
    pub fn has_cpi(self) -> bool {
        matches!(self, Mode::Cpi | Mode::IpSampling | Mode::Simulated)
    }

    /// The name on the command line, in profiles and in the mode line (`time-profile`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Cpi => "cpi",
            Mode::IpSampling => "ip-sampling",
            Mode::TimeProfile => "time-profile",
            Mode::Simulated => "simulated",
        }
    }

    /// What the mode measures, in the words of the mode line's reason
    /// (`cpu-clock time profile, no cycles, no instructions, no CPI`).
    pub fn measures(self) -> &'static str {
        match self {
            Mode::Cpi => "instructions from LBR ranges, cycles from perturbed-period samples",
            Mode::IpSampling => "cycles and instructions IP samples, CPI per unit is imprecise",
            Mode::TimeProfile => "cpu-clock time profile, no cycles, no instructions, no CPI",
            Mode::Simulated => "the PMU model replaying an exact trace; modelled cycles",
        }
    }

    /// The report header's description of the mode.
    pub fn description(self) -> &'static str {
        match self {
            Mode::Cpi => "CPI (instructions from branch records, cycles from cycle samples)",
            Mode::IpSampling => {
                "IP sampling (no branch records: per-unit CPI from separate cycles and \
                 instructions samples is imprecise)"
            }
            Mode::TimeProfile => {
                "time profile (no PMU: cpu-clock samples and CPU time only; no cycles, \
                 instructions or CPI)"
            }
            Mode::Simulated => {
                "simulated (the PMU model replaying an exact trace; modelled cycles)"
            }
        }
    }

    /// The next rung down the capability ladder when this mode's events cannot be
    /// opened (`Cpi` → `IpSampling` → `TimeProfile`); `None` at the bottom.
    pub fn step_down(self) -> Option<Mode> {
        match self {
            Mode::Cpi => Some(Mode::IpSampling),
            Mode::IpSampling => Some(Mode::TimeProfile),
            Mode::TimeProfile | Mode::Simulated => None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Profile {
    pub format_version: u32,
    /// `cpi-bpf` version that wrote the file.
    pub tool_version: String,
    pub mode: Mode,
    /// Why this mode (e.g. "no PMU: /sys/bus/event_source/devices/cpu missing").
    pub mode_reason: String,
    /// The profiled command, when cpi-bpf started it.
    #[serde(default)]
    pub command: Vec<String>,
    pub duration_secs: f64,
    pub events: Vec<EventInfo>,
    /// `none`, `kernel`, `user` or `both` (cpi_common::policy::Perturbation).
    pub perturbation: String,
    /// Branch records per sample used by the range algorithm (seed 001's CBT window).
    #[serde(default)]
    pub range_window: u32,
    /// Every sample lost on the way (sum of `lost`'s loss fields).
    pub lost_samples: u64,
    pub lost: LossReport,
    pub binaries: Vec<BinaryInfo>,
    pub processes: Vec<ProcessProfile>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EventInfo {
    /// `branches`, `cycles`, `instructions` or `cpu-clock`.
    pub role: String,
    /// What was opened, e.g. `cpu/r20c4/` or `cpu-clock`.
    pub name: String,
    /// Base period (a prime); `unit` per sample.
    pub period: u64,
    /// Largest user-space re-draw added to the period (0 = fixed).
    pub jitter: u64,
    /// In-kernel thinning factor (1 = off).
    pub thinning: u32,
    /// `events` or `ns`.
    pub unit: String,
    /// Records received for this event.
    pub samples: u64,
}

/// Losses, each counted where it happened. None is silent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct LossReport {
    /// Records the kernel could not write: ring buffer full.
    pub ring_full: u64,
    /// Branch helper failures (no branch stack on a sample).
    pub branch_errors: u64,
    /// Records user space could not decode (bad version/size).
    pub malformed: u64,
    /// Overflows thinned in the kernel on purpose (their period is carried, not lost).
    pub thinned: u64,
    /// Branch samples with fewer entries than the range window.
    pub short_samples: u64,
    /// LBR ranges dropped as invalid (backwards, leaving the function, crossing an
    /// unconditional transfer, unmapped).
    pub invalid_ranges: u64,
    /// IP samples whose address maps to no known code.
    pub unmapped_samples: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BinaryInfo {
    /// Path as mapped (`[kernel]`, `[anon]`, `[vdso]` for non-files).
    pub path: String,
    /// GNU build-id, hex.
    pub build_id: Option<String>,
    /// The file was deleted or replaced since it was mapped.
    #[serde(default)]
    pub deleted: bool,
    /// Function bounds came from `.eh_frame` (no symbol table): names are `func_<addr>`
    /// unless `.dynsym` names them.
    #[serde(default)]
    pub stripped: bool,
}

/// A quantity with its statistical quality.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub value: f64,
    /// Relative error bound (≈ 1/√samples of the scarcer input).
    pub rel_error: f64,
    /// Samples behind the estimate (the scarcer input).
    pub samples: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ProcessProfile {
    pub pid: u32,
    pub comm: String,
    /// IP samples (cycles or cpu-clock) attributed to the process.
    pub samples: u64,
    /// Branch samples attributed to the process.
    #[serde(default)]
    pub branch_samples: u64,
    /// cpu-clock time, ns (time profile).
    pub time_ns: Option<f64>,
    pub cycles: Option<f64>,
    pub instructions: Option<f64>,
    pub cpi: Option<Estimate>,
    /// Sorted by cycles (or samples), hottest first.
    pub functions: Vec<FunctionProfile>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FunctionProfile {
    pub name: String,
    /// Path of the binary (a key into `Profile::binaries`).
    pub binary: String,
    /// Start address in the binary's own address space.
    pub address: u64,
    pub size: u64,
    /// IP samples in the function.
    pub samples: u64,
    /// Fraction of the process's cycles (or samples, in a time profile).
    pub share: f64,
    pub time_ns: Option<f64>,
    pub cycles: Option<f64>,
    pub instructions: Option<f64>,
    pub cpi: Option<Estimate>,
    /// CPI from timed branch records (LBR `cycles` field), when the hardware has them.
    pub timed_cpi: Option<Estimate>,
    #[serde(default)]
    pub blocks: Vec<BlockProfile>,
    #[serde(default)]
    pub edges: Vec<EdgeProfile>,
    /// Per-instruction counts (for `--annotate`).
    #[serde(default)]
    pub lines: Vec<InstructionProfile>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BlockProfile {
    pub start: u64,
    /// First address after the block's last instruction.
    pub end: u64,
    /// Static instructions in the block.
    pub len: u32,
    /// Estimated executions.
    pub count: f64,
    pub samples: u64,
    pub cycles: Option<f64>,
    pub cpi: Option<Estimate>,
    pub timed_cpi: Option<Estimate>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum EdgeKind {
    /// A taken branch (seen in branch records).
    Taken,
    /// Derived: straight-line flow into the next block (incl. not-taken conditionals).
    FallThrough,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EdgeProfile {
    /// Address of the branch instruction (taken) or of the last instruction of the
    /// source block (fall-through).
    pub from: u64,
    /// Target address.
    pub to: u64,
    pub kind: EdgeKind,
    /// Estimated traversals.
    pub count: f64,
    /// Estimated mispredictions (taken edges with hardware flags).
    pub mispredicts: f64,
    /// Target function and binary when the edge leaves the function (calls, returns,
    /// tail calls).
    #[serde(default)]
    pub to_function: Option<String>,
    #[serde(default)]
    pub to_binary: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct InstructionProfile {
    pub address: u64,
    /// Estimated executions.
    pub count: f64,
    /// IP samples on this instruction.
    pub samples: u64,
    pub cycles: Option<f64>,
    /// Cycles / count; `None` below the sample floor.
    #[serde(default)]
    pub cpi: Option<Estimate>,
    /// Disassembly (Intel syntax), so `cpi-bpf report --annotate` works offline.
    #[serde(default)]
    pub text: String,
}

/// What the caller (collector, PMU model, importer) knows about a run; analysis turns
/// it plus a [`crate::profile::SampleSet`] into a [`Profile`], adding what it derives
/// (its own losses, binaries, processes).
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    pub mode: Mode,
    pub mode_reason: String,
    pub command: Vec<String>,
    pub duration_secs: f64,
    pub events: Vec<EventInfo>,
    pub perturbation: String,
    /// Losses counted before analysis (kernel counters, malformed records).
    pub lost: LossReport,
}
