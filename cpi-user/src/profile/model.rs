//! The profile: what analysis produces and every report/export reads. Serialised as the
//! versioned JSON profile file (`--output`), read back by `cpi-bpf report`.
//!
//! Addresses are in each binary's own address space (ELF virtual addresses, as
//! `objdump`/BOLT see them), not runtime addresses, so profiles of PIE binaries and
//! shared libraries compare across runs.

use cpi_common::policy::Perturbation;
use cpi_common::wire::EventRole;
use serde::{Deserialize, Serialize};

use super::stack::StackEnd;
use crate::procmap::ProcessIdentity;

pub use crate::binary::cfg::EdgeKind;
pub use crate::binary::SourceLine;

/// Bumped on any incompatible change; readers reject newer versions and read every older
/// one (cpi-user/src/report/file.rs). 2: call paths list their frames by number in the
/// file's frame table (1 wrote each frame whole, three quarters of a busy host's window).
pub const PROFILE_FORMAT_VERSION: u32 = 2;

/// What the numbers in a profile are (the capability ladder, `collect/ladder.rs`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Branch records + cycle samples: instructions from LBR ranges, cycles from
    /// perturbed cycle samples. Full CPI.
    Cpi,
    /// PMU without branch records: cycles and instructions IP samples. CPI per unit is
    /// the imprecise "traditional" method (separate counts per unit, no branch records).
    IpSampling,
    /// No PMU: software `cpu-clock` time profile. No cycles, no instructions, no CPI.
    TimeProfile,
    /// The PMU model replaying an exact trace (`cpi-bpf simulate`): a CPI profile of
    /// modelled cycles.
    Simulated,
    /// Branch records without cycles (an imported recording with no cycles event):
    /// instructions from the ranges, no cycles, no CPI (timed CPI where entries carry
    /// cycles). No collection mode: the ladder never chooses it.
    Instructions,
}

impl Mode {
    /// Whether the mode counts instructions, so tables show the cycles, instructions
    /// and CPI columns (empty where the profile has none): every mode but the time
    /// profile.
    pub fn has_cpi(self) -> bool {
        !matches!(self, Mode::TimeProfile)
    }

    /// Whether instructions come from branch-record ranges.
    pub(crate) fn uses_ranges(self) -> bool {
        matches!(self, Mode::Cpi | Mode::Simulated | Mode::Instructions)
    }

    /// The name on the command line, in profiles and in the mode line (`time-profile`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Cpi => "cpi",
            Mode::IpSampling => "ip-sampling",
            Mode::TimeProfile => "time-profile",
            Mode::Simulated => "simulated",
            Mode::Instructions => "instructions",
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
            Mode::Instructions => "instructions from branch-record ranges; no cycles, no CPI",
        }
    }

    /// What the mode measures in a few words: the mode line on a terminal
    /// (cpi-user/src/collect/ladder.rs), which fits 80 columns; [`Mode::measures`] and
    /// why the mode was chosen are its `-v` form.
    pub fn brief(self) -> &'static str {
        match self {
            Mode::Cpi => "CPI per function, block and instruction",
            Mode::IpSampling => "no branch records: CPI per function is rough",
            Mode::TimeProfile => "CPU time per function; no cycles or CPI",
            Mode::Simulated => "the PMU model replaying an exact trace",
            Mode::Instructions => "instructions from branch records; no CPI",
        }
    }

    /// The report header's description of the mode.
    pub(crate) fn description(self) -> &'static str {
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
            Mode::Instructions => {
                "instructions (from branch records; the recording holds no cycles: no CPI)"
            }
        }
    }

    /// The next rung down the capability ladder when this mode's events cannot be
    /// opened (`Cpi` → `IpSampling` → `TimeProfile`); `None` at the bottom.
    pub(crate) fn step_down(self) -> Option<Mode> {
        match self {
            Mode::Cpi => Some(Mode::IpSampling),
            Mode::IpSampling => Some(Mode::TimeProfile),
            Mode::TimeProfile | Mode::Simulated | Mode::Instructions => None,
        }
    }
}

/// A profile: the run, its losses, and per-process results (the JSON profile file).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Profile {
    /// [`PROFILE_FORMAT_VERSION`]: a file of an older version is brought to it as it is
    /// read (cpi-user/src/report/file.rs).
    pub format_version: u32,
    /// `cpi-bpf` version that wrote the file.
    pub tool_version: String,
    /// What the numbers are.
    pub mode: Mode,
    /// Why this mode (e.g. "no PMU: /sys/bus/event_source/devices/cpu missing").
    pub mode_reason: String,
    /// The profiled command, when cpi-bpf started it.
    #[serde(default)]
    pub command: Vec<String>,
    /// Wall-clock duration of the collection (or traced run), seconds.
    pub duration_secs: f64,
    /// The events sampled, with their periods and sample counts.
    pub events: Vec<EventInfo>,
    /// Which perturbation layers ran; serialised as `none`, `kernel`, `user` or `both`.
    #[serde(with = "perturbation_name")]
    pub perturbation: Perturbation,
    /// Branch records per sample used by the range algorithm (the window of
    /// `cpi_common::policy::range_window`).
    #[serde(default)]
    pub range_window: u32,
    /// Every sample lost on the way ([`LossReport::lost`]: ring full, branch errors,
    /// malformed; not the samples received and left unused).
    pub lost_samples: u64,
    /// Losses by kind.
    pub lost: LossReport,
    /// Every binary a function of the profile lives in.
    pub binaries: Vec<BinaryInfo>,
    /// Per-process results, hottest first.
    #[serde(deserialize_with = "bounds::processes")]
    pub processes: Vec<ProcessProfile>,
    /// Distance from the exact answer, when there is one (`cpi-bpf simulate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<Accuracy>,
    /// The architecture an imported recording names (perf.data's `HEADER_ARCH`), said on
    /// the mode line: another machine's numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_on: Option<String>,
    /// Why no unit has a cycles/instructions CPI, whatever its samples
    /// ([`Profile::without_cpi`]): its instruction counts are relative, or it holds no
    /// cycles. Tables then write "-" and say why, not "below floor", and the page
    /// colours no frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpi_withheld: Option<String>,
    /// The processes of the file this profile was read from that were left out, a line
    /// each (cpi-user/src/profile/model/bounds.rs); never written.
    #[serde(skip)]
    pub unread: Vec<String>,
}

impl Profile {
    /// Removes the cycles/instructions CPI, for profiles whose instruction counts are
    /// relative (stacks not sampled on taken branches, uncorrected) or that hold no
    /// cycles; timed CPI (from the branch entries themselves) stays.
    pub fn without_cpi(&mut self, why: String) {
        self.cpi_withheld = Some(why);
        for proc in &mut self.processes {
            proc.measures.cpi = None;
            proc.stacks.iter_mut().for_each(|s| s.cpi = None);
            for f in &mut proc.functions {
                f.measures.cpi = None;
                f.blocks.iter_mut().for_each(|b| b.cpi = None);
                f.lines.iter_mut().for_each(|l| l.cpi = None);
            }
        }
    }
}

/// One sampled event.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EventInfo {
    /// What the event measures; serialised as `branches`, `cycles`, `instructions` or
    /// `cpu-clock` ([`role_name`]).
    #[serde(with = "role_name_serde")]
    pub role: EventRole,
    /// What was opened, e.g. `cpu/r20c4/` or `cpu-clock`.
    pub name: String,
    /// Base period (a prime); `unit` per sample.
    pub period: u64,
    /// Largest user-space re-draw added to the period (0 = fixed).
    pub jitter: u64,
    /// In-kernel thinning factor (1 = off).
    pub thinning: u32,
    /// What the period counts.
    pub unit: EventUnit,
    /// Records received for this event.
    pub samples: u64,
    /// The other roles the same samples serve, listed once under `role`: a cycles event
    /// recorded with branch stacks (`perf record -e cycles -b`) gives its stacks'
    /// ranges and its periods' cycles from one set of records. Empty for an event of
    /// one role.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "role_names_serde"
    )]
    pub also: Vec<EventRole>,
}

impl EventInfo {
    /// Every role the event's samples serve: `role`, then `also`.
    pub fn roles(&self) -> impl Iterator<Item = EventRole> + '_ {
        std::iter::once(self.role).chain(self.also.iter().copied())
    }

    /// Whether the event's samples serve `role`.
    pub fn serves(&self, role: EventRole) -> bool {
        self.roles().any(|r| r == role)
    }

    /// Its roles by name, joined by `+` (`branches+cycles`).
    pub fn role_names(&self) -> String {
        self.roles().map(role_name).collect::<Vec<_>>().join("+")
    }
}

/// The name of an event role in profiles and tables.
pub fn role_name(role: EventRole) -> &'static str {
    match role {
        EventRole::Branches => "branches",
        EventRole::Cycles => "cycles",
        EventRole::Instructions => "instructions",
        EventRole::CpuClock => "cpu-clock",
    }
}

/// What an event's period counts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum EventUnit {
    /// Hardware events (branches, cycles, instructions).
    Events,
    /// Nanoseconds (`cpu-clock`).
    Ns,
}

impl EventUnit {
    /// The unit of an event of `role`'s period.
    pub const fn of_role(role: EventRole) -> EventUnit {
        match role {
            EventRole::CpuClock => EventUnit::Ns,
            _ => EventUnit::Events,
        }
    }

    /// The name in profiles and tables.
    pub const fn name(self) -> &'static str {
        match self {
            EventUnit::Events => "events",
            EventUnit::Ns => "ns",
        }
    }
}

impl std::fmt::Display for EventUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// [`EventRole`] as its [`role_name`].
mod role_name_serde {
    use super::{role_name, EventRole};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(role: &EventRole, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(role_name(*role))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<EventRole, D::Error> {
        let name = String::deserialize(d)?;
        [
            EventRole::Branches,
            EventRole::Cycles,
            EventRole::Instructions,
            EventRole::CpuClock,
        ]
        .into_iter()
        .find(|r| role_name(*r) == name)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown event role {name:?}")))
    }
}

/// A list of [`EventRole`]s as their [`role_name`]s.
mod role_names_serde {
    use super::EventRole;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Named(#[serde(with = "super::role_name_serde")] EventRole);

    pub(crate) fn serialize<S: Serializer>(roles: &[EventRole], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(roles.iter().map(|&r| Named(r)))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<EventRole>, D::Error> {
        Ok(Vec::<Named>::deserialize(d)?
            .into_iter()
            .map(|n| n.0)
            .collect())
    }
}

/// [`Perturbation`] as its [`Perturbation::name`].
mod perturbation_name {
    use super::Perturbation;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(p: &Perturbation, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(p.name())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Perturbation, D::Error> {
        let name = String::deserialize(d)?;
        [
            Perturbation::None,
            Perturbation::Kernel,
            Perturbation::User,
            Perturbation::Both,
        ]
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown perturbation {name:?}")))
    }
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
    /// Side-band records (mmap, comm, exec) the kernel dropped, its buffer full: no
    /// sample is lost, but processes too short-lived for `/proc` may lose their mappings
    /// (their samples then count as unmapped). Absent from files before it existed.
    #[serde(default)]
    pub sideband_lost: u64,
    /// Call stacks cut at the frame limit or at the end of the copied user stack.
    #[serde(default)]
    pub stacks_truncated: u64,
    /// Call stacks stopped at code without a file behind it (JIT, anonymous, vDSO).
    #[serde(default)]
    pub stacks_unknown_code: u64,
    /// Call stacks that failed: unreadable stack, unwind rules that led nowhere.
    #[serde(default)]
    pub stacks_failed: u64,
    /// Call stacks cut because going on would cost too much: at a frame whose unwind
    /// rules no compiler writes (a hostile binary's), or leaf only once the collector's
    /// unwinding time for one pass over the ring was spent. Samples kept, stacks short.
    #[serde(default)]
    pub stacks_too_costly: u64,
    /// Samples whose call stacks were evicted to keep the stacks within their memory
    /// bound: they stay in every total, under a `[rare callees]` path below their
    /// nearest caller still held, or a `[dropped]` path where none is.
    #[serde(default)]
    pub stacks_evicted: u64,
    /// Samples of processes a kernel filter (the agent's `--pid`, `--cgroup`) did not
    /// want, dropped in the eBPF program before anything else: not wanted data, so not
    /// lost and in no total (cpi-user/src/collect/filter.rs).
    #[serde(default)]
    pub filtered_in_kernel: u64,
    /// Times the kernel throttled a sampling event for the rest of a tick
    /// (`PERF_RECORD_THROTTLE`, `kernel.perf_event_max_sample_rate`): samples not taken,
    /// how many unknown. Seen only where cpi-bpf reads the kernel's own buffers
    /// (collection without root); left out of files when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub throttled: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LossReport {
    /// Samples really lost on the way: the ring was full, the branch helper failed, or
    /// the record could not be decoded. Thinned overflows carry their period forward;
    /// short stacks and invalid ranges were received and left unused by design;
    /// unmapped samples were received and could not be placed: each is its own line.
    pub fn lost(&self) -> u64 {
        self.ring_full
            .saturating_add(self.branch_errors)
            .saturating_add(self.malformed)
    }

    /// The account after the lost total, as the table and the stop line print it:
    /// `(ring full a, branch errors b, malformed c); not used: …; unmapped …; thinned …`,
    /// and what a kernel filter dropped when it dropped any.
    pub(crate) fn breakdown(&self) -> String {
        format!(
            "(ring full {}, branch errors {}, malformed {}); not used: short stacks {}, \
             invalid ranges {}; unmapped samples {}; thinned on purpose {} (period carried); \
             side-band records lost {}; stacks truncated {}, at unknown code {}, failed {}, \
             too costly {}, evicted {}{}{}",
            self.ring_full,
            self.branch_errors,
            self.malformed,
            self.short_samples,
            self.invalid_ranges,
            self.unmapped_samples,
            self.thinned,
            self.sideband_lost,
            self.stacks_truncated,
            self.stacks_unknown_code,
            self.stacks_failed,
            self.stacks_too_costly,
            self.stacks_evicted,
            match self.filtered_in_kernel {
                0 => String::new(),
                n => format!("; filtered in kernel {n} (not wanted, not lost)"),
            },
            match self.throttled {
                0 => String::new(),
                n => format!("; sampling throttled by the kernel {n} times"),
            }
        )
    }
}

impl LossReport {
    /// The one list of the counts: each by its name in the profile file, in the file's
    /// order (the agent's `cpi_bpf_samples_lost` reasons, the merge's sums).
    pub fn counts(&self) -> [(&'static str, u64); 15] {
        let mut copy = self.clone();
        copy.counts_mut().map(|(name, n)| (name, *n))
    }

    fn counts_mut(&mut self) -> [(&'static str, &mut u64); 15] {
        // Destructured: a new counter cannot be left out of the list.
        let LossReport {
            ring_full,
            branch_errors,
            malformed,
            thinned,
            short_samples,
            invalid_ranges,
            unmapped_samples,
            sideband_lost,
            stacks_truncated,
            stacks_unknown_code,
            stacks_failed,
            stacks_too_costly,
            stacks_evicted,
            filtered_in_kernel,
            throttled,
        } = self;
        [
            ("ring_full", ring_full),
            ("branch_errors", branch_errors),
            ("malformed", malformed),
            ("thinned", thinned),
            ("short_samples", short_samples),
            ("invalid_ranges", invalid_ranges),
            ("unmapped_samples", unmapped_samples),
            ("sideband_lost", sideband_lost),
            ("stacks_truncated", stacks_truncated),
            ("stacks_unknown_code", stacks_unknown_code),
            ("stacks_failed", stacks_failed),
            ("stacks_too_costly", stacks_too_costly),
            ("stacks_evicted", stacks_evicted),
            (Self::FILTERED, filtered_in_kernel),
            ("throttled", throttled),
        ]
    }

    /// The count of what a kernel filter dropped: not wanted, so not lost.
    pub const FILTERED: &'static str = "filtered_in_kernel";

    /// Adds another account (windows merged into one profile,
    /// cpi-user/src/profile/merge.rs); a count that would pass `u64::MAX` stays there and
    /// sets `overflow`.
    pub(crate) fn add_checked(&mut self, o: &LossReport, overflow: &mut bool) {
        for ((_, a), (_, b)) in self.counts_mut().into_iter().zip(o.counts()) {
            add_count(a, b, overflow);
        }
    }
}

/// `*a += b` for counts summed from files others may have written: saturates at
/// `u64::MAX` and sets `overflow` instead of wrapping.
pub(crate) fn add_count(a: &mut u64, b: u64, overflow: &mut bool) {
    match a.checked_add(b) {
        Some(v) => *a = v,
        None => {
            *a = u64::MAX;
            *overflow = true;
        }
    }
}

/// One binary the profile refers to.
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
    /// Who could have written the binary (cpi-user/src/fsafe/behalf.rs): as root, the
    /// source files its line tables name are read as that user; absent in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<crate::fsafe::behalf::Owner>,
}

/// A quantity with its statistical quality.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// The estimate.
    pub value: f64,
    /// One standard error, relative to `value` (cpi-user/src/profile/error.rs says how
    /// each is computed). Files written before the error model hold 1/√samples here.
    pub rel_error: f64,
    /// Samples behind the estimate (the scarcer input).
    pub samples: u64,
}

impl Estimate {
    /// Combined standard errors beyond which two estimates of one quantity disagree: 3
    /// (one unit in 370 by chance, where 2 would flag one in 20 of a long table).
    pub(crate) const DISAGREE: f64 = 3.0;

    /// Whether `a` and `b`, two estimates of the same quantity, differ by more than
    /// [`Self::DISAGREE`] of their combined standard error; false when either is missing.
    pub(crate) fn disagree(a: Option<&Estimate>, b: Option<&Estimate>) -> bool {
        let (Some(a), Some(b)) = (a, b) else {
            return false;
        };
        let sigma = (a.value * a.rel_error).hypot(b.value * b.rel_error);
        (a.value - b.value).abs() > Self::DISAGREE * sigma
    }
}

/// What a process or a function measured: time or cycles, instructions, their
/// standard errors and the CPI they make. Written flattened (`#[serde(flatten)]`), so
/// the file holds these keys beside its owner's own, in this order.
///
/// A call path ([`StackProfile`]) has the same quantities but writes `cpi` before the
/// errors: flattened, these would reorder its keys in the file.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct Measures {
    /// cpu-clock time, ns (time profile).
    pub time_ns: Option<f64>,
    /// Cycles attributed.
    pub cycles: Option<f64>,
    /// Instructions executed.
    pub instructions: Option<f64>,
    /// One standard error of `cycles`, relative to it (cpi-user/src/profile/error.rs).
    /// Absent from files before the error model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycles_rel_error: Option<f64>,
    /// One standard error of `instructions`, relative to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions_rel_error: Option<f64>,
    /// Cycles per instruction.
    pub cpi: Option<Estimate>,
}

/// One process.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ProcessProfile {
    /// Process id.
    pub pid: u32,
    /// Command name (`/proc/PID/comm`).
    pub comm: String,
    /// Cgroup, container and pod (cpi-user/src/procmap/cgroup.rs), each field absent when
    /// unknown and in files written before it.
    #[serde(flatten)]
    pub identity: ProcessIdentity,
    /// IP samples (cycles or cpu-clock) attributed to the process.
    pub samples: u64,
    /// Branch samples attributed to the process.
    #[serde(default)]
    pub branch_samples: u64,
    /// Time or cycles, instructions, their errors and the process's CPI.
    #[serde(flatten)]
    pub measures: Measures,
    /// Sorted by cycles (or samples), hottest first.
    #[serde(deserialize_with = "bounds::functions")]
    pub functions: Vec<FunctionProfile>,
    /// Calls-only call graph: caller → callee counts from the branch
    /// records that are calls, scaled like ranges; most frequent first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallEdge>,
    /// Call paths, hottest first (empty when no sample carried a stack, and in files
    /// written before stacks); at most cpi-user/src/profile/paths.rs `MAX_PATHS`, the
    /// narrowest beyond them summed into a `[rare callees]` path under their widest
    /// callers that keep a path (`fold_plan`), as are the stacks the memory bound
    /// evicted (those with no caller still held in a `[dropped]` path), and the
    /// samples without a stack in a `[no stack]` path.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "bounds::paths"
    )]
    pub stacks: Vec<StackProfile>,
}

/// One call path of one process and what ran under it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StackProfile {
    /// Frames, leaf first: kernel frames (when kernel samples are included), then user
    /// frames. A profile file lists each by its number in the file's frame table
    /// (`frame_numbers`).
    #[serde(
        serialize_with = "frame_numbers::serialize",
        deserialize_with = "frame_numbers::deserialize"
    )]
    pub frames: Vec<StackFrame>,
    /// How unwinding ended (cpi-user/src/profile/stack.rs).
    pub end: StackEnd,
    /// IP samples (cycles or cpu-clock) under the path.
    pub samples: u64,
    /// Branch samples under the path.
    #[serde(default)]
    pub branch_samples: u64,
    /// cpu-clock time, ns (time profile).
    pub time_ns: Option<f64>,
    /// Cycles under the path.
    pub cycles: Option<f64>,
    /// Instructions that ran in the leaf frame's function under the path (the rule for
    /// branch ranges: cpi-user/src/profile/analyze.rs, "Call paths").
    pub instructions: Option<f64>,
    /// Cycles per instruction of the path's leaf function under this path.
    pub cpi: Option<Estimate>,
    /// One standard error of `cycles`, relative to it (cpi-user/src/profile/error.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycles_rel_error: Option<f64>,
    /// One standard error of `instructions`, relative to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions_rel_error: Option<f64>,
    /// Range occurrences behind `instructions`.
    #[serde(default)]
    pub range_hits: u64,
}

/// One frame of a [`StackProfile`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackFrame {
    /// Function name (`[kernel]`, `[anon]`, `func_<addr>` when the binary names none).
    pub function: String,
    /// Path of the binary (a key into `Profile::binaries`); empty when unknown.
    pub binary: String,
    /// The frame's address in the binary's own address space (for callers, the
    /// return address).
    pub address: u64,
}

pub mod bounds;

/// How a profile file writes call paths' frames (format 2): the writer
/// (cpi-user/src/report/file.rs) numbers every frame of every path by its entry in the
/// file's frame table, in the order serde writes the paths, and lends those numbers to
/// [`StackProfile`]'s serialisation for that one write. Serialised any other way, frames
/// are written whole, which the reader takes too (`read`, numbers and whole frames).
pub(crate) mod frame_numbers {
    use std::cell::RefCell;

    use serde::{ser::Error, Serialize, Serializer};

    use super::StackFrame;

    thread_local! {
        static LENT: RefCell<Option<std::vec::IntoIter<u32>>> = const { RefCell::new(None) };
    }

    mod read;
    pub(super) use read::deserialize;
    pub(crate) use read::{collect, mark, rewind};

    /// Runs `write` with `numbers` (every path's frame numbers, paths in serialisation
    /// order) in place of the frames; they are taken back when it returns or unwinds.
    pub(crate) fn lend<R>(numbers: Vec<u32>, write: impl FnOnce() -> R) -> R {
        struct TakeBack;
        impl Drop for TakeBack {
            fn drop(&mut self) {
                LENT.with(|l| *l.borrow_mut() = None);
            }
        }
        LENT.with(|l| *l.borrow_mut() = Some(numbers.into_iter()));
        let _take_back = TakeBack;
        write()
    }

    pub(super) fn serialize<S: Serializer>(frames: &[StackFrame], s: S) -> Result<S::Ok, S::Error> {
        let numbers: Option<Vec<u32>> = LENT.with(|l| {
            let mut lent = l.borrow_mut();
            lent.as_mut()
                .map(|n| n.by_ref().take(frames.len()).collect())
        });
        match numbers {
            None => frames.serialize(s),
            Some(n) if n.len() == frames.len() => n.serialize(s),
            Some(_) => Err(S::Error::custom(
                "the frame numbers ran out before the call paths",
            )),
        }
    }
}

/// One caller → callee pair of the calls-only call graph.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CallEdge {
    /// The calling function's name.
    pub caller: String,
    /// The binary holding the caller.
    pub caller_binary: String,
    /// The called function's name.
    pub callee: String,
    /// The binary holding the callee.
    pub callee_binary: String,
    /// Estimated calls (Σ period / window over the call records, like ranges).
    pub count: f64,
    /// Branch records behind the estimate.
    pub samples: u64,
}

/// One function of one binary.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FunctionProfile {
    /// Name as people read it: the symbol demangled (C++, Rust:
    /// cpi-user/src/binary/demangle.rs), `func_<addr>` when the binary has none.
    pub name: String,
    /// The symbol as the binary spells it, when demangling changed it (BOLT's `.fdata`
    /// names functions by it); absent for C names and in files written before demangling,
    /// whose `name` is the symbol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mangled: Option<String>,
    /// Path of the binary (a key into `Profile::binaries`).
    pub binary: String,
    /// Start address in the binary's own address space.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// IP samples in the function.
    pub samples: u64,
    /// Fraction of the process's cycles (or samples, in a time profile).
    pub share: f64,
    /// Time or cycles, instructions, their errors and the function's CPI (`None` below
    /// the sample floor).
    #[serde(flatten)]
    pub measures: Measures,
    /// CPI from timed branch records (LBR `cycles` field), when the hardware has them.
    pub timed_cpi: Option<Estimate>,
    /// `cpi` and `timed_cpi` differ by more than `Estimate::DISAGREE` combined
    /// standard errors: one of the two estimators is off here (docs/METHOD.md, "Two
    /// CPI estimators"). Absent (false) in older files.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cpi_disagree: bool,
    /// The name BOLT gives the symbol when it is local (`static`): `name/N`, N counting
    /// the local symbols of that name in address order (BOLT's
    /// `NameResolver::uniquify`); `None` for a global symbol. Resolved from the binary's
    /// symbol table during analysis, so `.fdata` is written from the profile alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bolt_name: Option<String>,
    /// Source line of the function's first instruction, from the binary's DWARF line
    /// table (cpi-user/src/binary/lines.rs); absent without debug info and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceLine>,
    /// Basic blocks with counts, by address.
    #[serde(default)]
    pub blocks: Vec<BlockProfile>,
    /// Control-flow edges with counts.
    #[serde(default)]
    pub edges: Vec<EdgeProfile>,
    /// Per-instruction counts (for `--annotate`).
    #[serde(default)]
    pub lines: Vec<InstructionProfile>,
}

/// Of a process's cycles, the share in code whose bytes could not be read (anonymous
/// executable memory, as JIT compilers write; `[vdso]` and other special mappings): its
/// instructions are unknown, so a CPI over the process would lack them. `None` without
/// cycles.
pub fn unreadable_code_share(functions: &[FunctionProfile]) -> Option<f64> {
    let cycles = |f: &&FunctionProfile| f.measures.cycles.unwrap_or(0.0);
    let total: f64 = functions.iter().map(|f| cycles(&f)).sum();
    let unreadable: f64 = (functions.iter())
        .filter(|f| f.binary.starts_with('[') && f.binary != "[kernel]")
        .map(|f| cycles(&f))
        .sum();
    (total > 0.0).then(|| unreadable / total)
}

/// A process's CPI is withheld when this share of its cycles or more is in code whose
/// instructions are unknown ([`unreadable_code_share`]).
pub const UNREADABLE_CODE_CEILING: f64 = 0.01;

impl FunctionProfile {
    /// The symbol as the binary spells it.
    pub fn symbol(&self) -> &str {
        self.mangled.as_deref().unwrap_or(&self.name)
    }

    /// `name` is what people read or the symbol (`--annotate` takes either).
    pub(crate) fn is_named(&self, name: &str) -> bool {
        self.name == name || self.mangled.as_deref() == Some(name)
    }

    /// Sets `cpi_disagree` on the function and its blocks from their two CPI estimates.
    pub(crate) fn flag_disagreement(&mut self) {
        self.cpi_disagree = Estimate::disagree(self.measures.cpi.as_ref(), self.timed_cpi.as_ref());
        for b in &mut self.blocks {
            b.cpi_disagree = Estimate::disagree(b.cpi.as_ref(), b.timed_cpi.as_ref());
        }
    }
}

/// One basic block.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BlockProfile {
    /// Address of the first instruction.
    pub start: u64,
    /// First address after the block's last instruction.
    pub end: u64,
    /// Static instructions in the block.
    pub len: u32,
    /// Estimated executions.
    pub count: f64,
    /// IP samples in the block.
    pub samples: u64,
    /// Cycles attributed to the block.
    pub cycles: Option<f64>,
    /// Cycles per instruction; `None` below the sample floor.
    pub cpi: Option<Estimate>,
    /// CPI from timed branch records, when the hardware has them.
    pub timed_cpi: Option<Estimate>,
    /// As [`FunctionProfile::cpi_disagree`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cpi_disagree: bool,
}

/// One control-flow edge.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EdgeProfile {
    /// Address of the branch instruction (taken) or of the last instruction of the
    /// source block (fall-through).
    pub from: u64,
    /// Target address.
    pub to: u64,
    /// Taken branch or fall-through.
    pub kind: EdgeKind,
    /// Estimated traversals.
    pub count: f64,
    /// Estimated mispredictions (taken edges with hardware flags).
    pub mispredicts: f64,
    /// Target function and binary when the edge leaves the function (calls, returns,
    /// tail calls).
    #[serde(default)]
    pub to_function: Option<String>,
    /// Binary of `to_function`.
    #[serde(default)]
    pub to_binary: Option<String>,
}

/// One instruction (`--annotate`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct InstructionProfile {
    /// Address in the binary.
    pub address: u64,
    /// Estimated executions.
    pub count: f64,
    /// IP samples on this instruction.
    pub samples: u64,
    /// Cycles attributed to the instruction.
    pub cycles: Option<f64>,
    /// Cycles / count; `None` below the sample floor.
    #[serde(default)]
    pub cpi: Option<Estimate>,
    /// Disassembly (Intel syntax), so `cpi-bpf report --annotate` works offline.
    #[serde(default)]
    pub text: String,
    /// Source line of the instruction, when the binary has DWARF line tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceLine>,
}

/// Accuracy of one process's profile against the exact answer (computed by
/// `sim::accuracy::compare`; kept in [`Profile::accuracy`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Accuracy {
    /// Overlap Σ min(p̂, p) of the normalised per-instruction counts.
    pub overlap_instruction: f64,
    /// The same overlap over basic blocks.
    pub overlap_block: f64,
    /// The same overlap over functions.
    pub overlap_function: f64,
    /// The same overlap over taken and fall-through edges.
    pub overlap_edge: f64,
    /// Median relative CPI error over functions with ≥ 2 % of cycles (`None`: no such
    /// function has a CPI estimate).
    pub cpi_error_median: Option<f64>,
    /// Largest relative CPI error over the same functions.
    pub cpi_error_max: Option<f64>,
    /// Functions that have ≥ 2 % of cycles but no CPI in the profile (below its floor).
    pub functions_without_cpi: u64,
    /// Exact totals.
    pub instructions_true: u64,
    /// Exact cycles (modelled).
    pub cycles_true: u64,
    /// Profile totals (process level).
    pub instructions_est: Option<f64>,
    /// Cycles the profile estimates.
    pub cycles_est: Option<f64>,
    /// Of `instructions_true`, those in code whose bytes could not be read (JIT, vdso):
    /// no function has them. Absent (0) from files before it existed.
    #[serde(default)]
    pub instructions_unknown: u64,
    /// Functions by share of the exact cycles, largest first.
    pub functions: Vec<FunctionAccuracy>,
    /// Overlap Σ min(p̂, p) of the normalised instructions per call path (a path is its
    /// chain of function names, leaf first; its instructions are those that ran in the
    /// leaf function under it). `None`: the profile has no call paths (files before
    /// stacks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_path: Option<f64>,
    /// Median relative CPI error over call paths with ≥ 2 % of cycles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_cpi_error_median: Option<f64>,
    /// Largest relative CPI error over the same paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_cpi_error_max: Option<f64>,
    /// Median over the same paths of |CPI error| in units of the error the profile
    /// reports for the path (its standard errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_cpi_errors_reported_median: Option<f64>,
    /// Call paths with ≥ 2 % of cycles but no CPI in the profile.
    #[serde(default)]
    pub paths_without_cpi: u64,
    /// Call paths by share of the exact cycles, largest first (the top ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathAccuracy>,
}

/// One call path, true and estimated.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PathAccuracy {
    /// Function names, leaf first (as [`StackProfile::frames`]).
    pub frames: Vec<String>,
    /// Share of the truth's cycles.
    pub share: f64,
    /// Exact instructions in the leaf function under the path.
    pub instructions_true: u64,
    /// Instructions the profile estimates.
    pub instructions_est: f64,
    /// Exact cycles (modelled) of those instructions.
    pub cycles_true: u64,
    /// Cycles the profile estimates.
    pub cycles_est: f64,
    /// Exact cycles per instruction.
    pub cpi_true: Option<f64>,
    /// The profile's CPI for the path, when it has one.
    pub cpi_est: Option<f64>,
    /// |cpi_est − cpi_true| / cpi_true.
    pub cpi_error: Option<f64>,
    /// The error the profile reports for `cpi_est` (relative standard error).
    pub cpi_rel_error: Option<f64>,
}

/// One function, true and estimated.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FunctionAccuracy {
    /// Function name.
    pub name: String,
    /// Path of its binary.
    pub binary: String,
    /// Start address in the binary.
    pub address: u64,
    /// Share of the truth's cycles.
    pub share: f64,
    /// Exact instructions.
    pub instructions_true: u64,
    /// Instructions the profile estimates.
    pub instructions_est: f64,
    /// Exact cycles (modelled).
    pub cycles_true: u64,
    /// Cycles the profile estimates.
    pub cycles_est: f64,
    /// Exact cycles per instruction.
    pub cpi_true: Option<f64>,
    /// The profile's CPI, when above its sample floor.
    pub cpi_est: Option<f64>,
    /// |cpi_est − cpi_true| / cpi_true.
    pub cpi_error: Option<f64>,
    /// The error the profile reports for `cpi_est` (its [`Estimate::rel_error`]): what
    /// tests and calibration judge `cpi_error` by. Absent from files before it existed.
    #[serde(default)]
    pub cpi_rel_error: Option<f64>,
    /// The error the profile reports for `instructions_est` (relative). Absent from
    /// files before it existed.
    #[serde(default)]
    pub instructions_rel_error: Option<f64>,
}

/// What the caller (collector, PMU model, importer) knows about a run; analysis turns
/// it plus a [`crate::profile::SampleSet`] into a [`Profile`], adding what it derives
/// (its own losses, binaries, processes).
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// What the numbers will be.
    pub mode: Mode,
    /// Why this mode.
    pub mode_reason: String,
    /// The profiled command, when cpi-bpf started it.
    pub command: Vec<String>,
    /// Duration of the run, seconds.
    pub duration_secs: f64,
    /// The events sampled.
    pub events: Vec<EventInfo>,
    /// Which perturbation layers ran.
    pub perturbation: Perturbation,
    /// Losses counted before analysis (kernel counters, malformed records).
    pub lost: LossReport,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mode line a terminal shows (cpi-user/src/collect/ladder.rs) fits 80 columns
    /// in every mode.
    #[test]
    fn every_brief_mode_line_fits_80_columns() {
        for m in [
            Mode::Cpi,
            Mode::IpSampling,
            Mode::TimeProfile,
            Mode::Simulated,
            Mode::Instructions,
        ] {
            let line = format!("cpi-bpf: mode: {} — {}", m.name(), m.brief());
            assert!(line.chars().count() <= 80, "{line}");
        }
    }

    #[test]
    fn estimates_disagree_beyond_three_combined_errors() {
        let e = |value, rel_error| Estimate {
            value,
            rel_error,
            samples: 100,
        };
        // σ = hypot(0.03, 0.04) = 0.05: 0.15 apart is the edge.
        assert!(!Estimate::disagree(
            Some(&e(1.0, 0.03)),
            Some(&e(1.14, 0.04 / 1.14))
        ));
        assert!(Estimate::disagree(
            Some(&e(1.0, 0.03)),
            Some(&e(1.16, 0.04 / 1.16))
        ));
        assert!(!Estimate::disagree(Some(&e(1.0, 0.03)), None));
    }
}
