//! Recordings made elsewhere → the same per-pid [`SampleSet`] as live samples, then
//! the normal analysis ([`crate::profile::analyze()`]): `cpi-bpf import-perf`.
//!
//! Inputs: `perf.data` ([`perf_data`], told by its `PERFILE2` magic) and `perf script`
//! branch-stack text ([`perf_script`]). Both are streamed in two passes (what the
//! recording holds, then its samples), so memory does not grow with the input; text
//! lines are bounded by `MAX_LINE_BYTES`, so a file that is not a recording
//! (`/dev/zero`) ends in one error, not in memory exhaustion. A pipe (standard input,
//! `<(…)`, a FIFO) is spooled to an unnamed temporary file (at most `MAX_STDIN_BYTES`)
//! for the second pass.
//!
//! The event the branch stacks were sampled on decides what the numbers mean
//! ([`Estimator`]), and the mode line says it: taken-branch events give absolute
//! instruction counts (each range occurrence stands for period / window, as in
//! `profile/aggregate.rs`), cycles
//! give cycles per function from the periods but only a relative instruction profile,
//! other events a relative instruction profile. CPI is shown only where the recording
//! holds both (a taken-branch event plus a cycles event), timed CPI wherever the
//! branch entries carry cycles.

pub(crate) mod locate;
mod meaning;
pub mod perf_data;
pub(crate) mod perf_records;
pub mod perf_script;
mod relocate;
mod text;
mod time_profile;
mod unwound;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use cpi_common::wire::{
    BranchSample, EventRole, IpSample, SampleHeader, SampleKind, FLAG_KERNEL, MAX_BRANCH_ENTRIES,
    WIRE_VERSION,
};

use crate::procmap::MappedObject;
use crate::profile::events::{raw_event, RawEvent, Vendor};
use crate::profile::SampleSet;
use crate::progress;
use locate::{LocateError, Locator};
use meaning::{branch_event_infos, branch_meaning, cpi_withheld, raw_note, recorded_on, sampling};
use perf_data::{EventAttr, PerfDataError};

use crate::profile::model::{EventInfo, EventUnit, LossReport, Mode, Profile, RunInfo};
use crate::profile::{analyze, AnalysisOptions, StackWeighting};
use cpi_common::policy::Perturbation;
use perf_script::{PerfImport, PerfScriptError};
use relocate::{relocate, Relocator, Said};
pub use text::{import_text, load_text};
use text::{load_lines, timed_note};
use time_profile::load_time_profile;
use unwound::Unwinder;

/// Largest `perf script` text read from a pipe (spooled to a temporary file for the
/// second pass); files are not limited.
pub(crate) const MAX_STDIN_BYTES: u64 = 16 << 30;
/// Longest text line: a 64-entry stack with long dso names is well under this.
pub(crate) const MAX_LINE_BYTES: usize = 1 << 20;

/// Why a recording could not be imported; each prints as one line (with its source).
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The input could not be opened (or a FIFO had no writer).
    #[error(transparent)]
    Open(#[from] crate::fsafe::OpenError),
    /// Reading the input failed.
    #[error("{what}")]
    Io {
        /// The input, as named in messages (a path, or `-`).
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A pipe's text over `MAX_STDIN_BYTES`.
    #[error(
        "{what}: more than {limit} bytes through a pipe: save the text to a file and import that"
    )]
    TooLarge {
        /// The input, as named in messages (`-`).
        what: String,
        /// `MAX_STDIN_BYTES`.
        limit: u64,
    },
    /// A text line over `MAX_LINE_BYTES`: the input is not `perf script` text.
    #[error(
        "{what}: line {line} is longer than {limit} bytes: not `perf script` text \
         (perf.data files start with PERFILE2)"
    )]
    LongLine {
        /// The input, as named in messages (a path, or `-`).
        what: String,
        /// 1-based number of the offending line.
        line: usize,
        /// `MAX_LINE_BYTES`.
        limit: usize,
    },
    /// The perf.data file is malformed or not one this reader handles ([`perf_data`]).
    #[error("{what}")]
    PerfData {
        /// The input, as named in messages (a path, or `-`).
        what: String,
        /// What is wrong with it.
        #[source]
        source: PerfDataError,
    },
    /// No event of the recording has branch stacks.
    #[error(
        "{what}: no branch stacks: its events ({events}) were recorded without \
         `perf record -b` (or -j), so no instruction counts can be derived (a \
         cpu-clock or task-clock recording imports as a time profile)"
    )]
    NoBranchStacks {
        /// The input, as named in messages (a path, or `-`).
        what: String,
        /// The recording's event names, comma-separated.
        events: String,
    },
    /// A recorded binary could not be matched on this machine (`locate`).
    #[error("{what}")]
    Locate {
        /// The input, as named in messages (a path, or `-`).
        what: String,
        /// Which binary and why.
        #[source]
        source: LocateError,
    },
    /// The recording parses but holds nothing this tool can use (say why).
    #[error("{what}: {why}")]
    Unusable {
        /// The input, as named in messages (a path, or `-`).
        what: String,
        /// One sentence.
        why: String,
    },
    /// The `perf script` text could not be parsed ([`perf_script`]).
    #[error("{what}")]
    PerfScript {
        /// The input, as named in messages (a path, or `-`).
        what: String,
        /// The parser's error.
        #[source]
        source: PerfScriptError,
    },
}

impl ImportError {
    /// The error of a failed read of the input named `what` in messages.
    pub(crate) fn io(what: &str) -> impl Fn(std::io::Error) -> ImportError + Copy + '_ {
        move |source| ImportError::Io {
            what: what.into(),
            source,
        }
    }
}

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Newest ranges used per branch stack (the range window, `--window`; README.md,
    /// "Usage").
    pub window: usize,
    /// Text only: entries are `brstackoff` dso offsets rather than runtime addresses.
    pub offsets: bool,
    /// Text only: events each sample stands for (`perf record -c N`) when the text has
    /// no period field; 1 when unknown.
    pub period: u64,
    /// Text only: the text has a period field (`perf script -F ...,period`).
    pub period_field: bool,
    /// Text only (perf.data names its events): what the stacks were sampled on.
    pub text_event: Estimator,
    /// How each stack's ranges are weighted; `None`: period / cycles spanned for
    /// perf.data stacks sampled on cycles with timed entries, period / window otherwise
    /// ([`StackWeighting`]).
    pub stack_weighting: Option<StackWeighting>,
    /// Where the recorded binaries are on this machine.
    pub locator: Locator,
    /// Passed on to [`analyze()`] unchanged.
    pub analysis: AnalysisOptions,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            window: 8,
            offsets: false,
            period: 1,
            period_field: false,
            text_event: Estimator::Cycles,
            stack_weighting: None,
            locator: Locator {
                caches: Locator::default_caches(),
                ..Locator::default()
            },
            analysis: AnalysisOptions::default(),
        }
    }
}

/// An imported recording, analysed.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The analysed profile, its mode line saying what the numbers mean.
    pub profile: Profile,
    /// What the user should know about the input (dropped lines, unplaced dsos, ...),
    /// one sentence each.
    pub notes: Vec<String>,
    /// What `-v` adds to the notes, one sentence each.
    pub details: Vec<String>,
}

/// A recording read into samples, not yet analysed: [`Loaded::analyze`] makes the
/// profile; the samples and their call stacks are here for callers that want them.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The samples, per pid, with their mappings, names and call stacks.
    pub set: SampleSet,
    /// What the numbers mean (the mode line) and the events.
    pub run: RunInfo,
    /// What the user should know about the input, one sentence each.
    pub notes: Vec<String>,
    /// What `-v` adds to the notes (each unusable binary's reason), one sentence each.
    pub details: Vec<String>,
    /// Recorded files the notes named unusable: the analysis does not name them again.
    unusable: Vec<PathBuf>,
    /// Recorded on another kernel ([`perf_data::Header::other_kernel`]): this
    /// machine's `/proc/kallsyms` does not name its kernel addresses.
    other_kernel: bool,
    /// The architecture the recording names (`HEADER_ARCH`).
    arch: Option<String>,
    /// Why the recording gives no CPI, where it gives none (the profile drops it).
    cpi_withheld: Option<String>,
    /// No cycles or time: shares are of instructions.
    by_instructions: bool,
}

impl Loaded {
    /// Analyses the samples ([`analyze()`]) into the profile `import-perf` shows.
    pub fn analyze(self, opts: &AnalysisOptions) -> Imported {
        let mut opts = opts.clone();
        opts.symbolizer.said.extend(self.unusable);
        if self.other_kernel {
            opts.symbolizer.kallsyms = None;
        }
        let mut profile = analyze(&self.set, self.run, &opts);
        profile.recorded_on = self.arch;
        if let Some(why) = self.cpi_withheld {
            profile.without_cpi(why);
        }
        if self.by_instructions {
            shares_of_instructions(&mut profile);
        }
        Imported {
            profile,
            notes: self.notes,
            details: self.details,
        }
    }
}

/// Reads `path` (`-` is standard input; a pipe, text only) into samples
/// ([`crate::fsafe::open_input`], then [`load_input`]).
pub fn load_path(path: &Path, opts: &ImportOptions) -> Result<Loaded, ImportError> {
    let what = path.display().to_string();
    let f = crate::fsafe::open_input(path, crate::fsafe::FIFO_WAIT)?;
    load_input(f, &what, opts)
}

/// Reads the recording open as `f` (named `what` in messages) into samples: perf.data
/// when it starts with `PERFILE2`, else `perf script` text. A regular file or a device is
/// read where it is, twice; a pipe's text is spooled first (`spool`).
pub fn load_input(
    mut f: std::fs::File,
    what: &str,
    opts: &ImportOptions,
) -> Result<Loaded, ImportError> {
    use std::os::unix::fs::FileTypeExt;
    let io = ImportError::io(what);
    let t = f.metadata().map_err(io)?.file_type();
    let mut magic = [0u8; 8];
    let n = read_full(&mut f, &mut magic).map_err(io)?;
    let perf_data = &magic[..n] == perf_data::MAGIC;
    if t.is_file() || t.is_char_device() || t.is_block_device() {
        if perf_data {
            return load_perf_data(&f, what, opts);
        }
        return load_lines(rewind(&f), what, opts);
    }
    if perf_data {
        return Err(ImportError::PerfData {
            what: what.into(),
            source: PerfDataError::PipeMode,
        });
    }
    let spool = spool(std::io::Cursor::new(magic[..n].to_vec()).chain(f), what)?;
    load_lines(rewind(&spool), what, opts)
}

/// Opens `f` again from its start (one pass of [`load_lines`]).
fn rewind(
    f: &std::fs::File,
) -> impl FnMut() -> std::io::Result<progress::Reading<BufReader<std::fs::File>>> + '_ {
    move || {
        let mut g = f.try_clone()?;
        g.seek(SeekFrom::Start(0))?;
        let size = g.metadata().ok().map(|m| m.len());
        let r = BufReader::with_capacity(1 << 16, g);
        Ok(progress::Reading::new(r, "reading", size))
    }
}

/// Copies `r` into an unnamed temporary file (`O_TMPFILE`: no name to follow or leave
/// behind), at most [`MAX_STDIN_BYTES`].
fn spool(r: impl Read, what: &str) -> Result<std::fs::File, ImportError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = ImportError::io(what);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(std::env::temp_dir())
        .map_err(io)?;
    let copied = std::io::copy(&mut r.take(MAX_STDIN_BYTES + 1), &mut f).map_err(io)?;
    if copied > MAX_STDIN_BYTES {
        return Err(ImportError::TooLarge {
            what: what.into(),
            limit: MAX_STDIN_BYTES,
        });
    }
    Ok(f)
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// What the event the branch stacks were sampled on lets the numbers mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimator {
    /// Retired taken branches: each sample stands for `period` taken branches, so a
    /// range occurrence stands for period/k executions (absolute counts).
    TakenBranches,
    /// Cycles: the periods give cycles per function; the ranges only a relative
    /// instruction profile (cycle-sampled stacks over-weight slow code).
    Cycles,
    /// Anything else: a relative instruction profile, each sample weighing 1.
    Other,
}

impl Estimator {
    /// Classifies an event of `header`'s recording: by its recorded name, a raw core-PMU
    /// code by what it counts on the recording's CPU (its cpuid: `rc4` is taken branches
    /// on AMD, all branches on Intel; `crate::profile::events::raw_event`, the table the
    /// collector opens events from), else by its generic type and config.
    pub fn of(e: &EventAttr, header: &perf_data::Header) -> Estimator {
        let name = e.name.as_deref().unwrap_or("").to_ascii_lowercase();
        let base = name.split(':').next().unwrap_or("");
        let taken_name = name.contains("near_taken")
            || name.contains("ex_ret_brn_tkn")
            || (name.contains("br_inst_exec") && name.contains("taken"));
        let vendor = header.cpuid.as_deref().map(Vendor::from_vendor_id);
        let raw = header
            .is_core_raw(e)
            .then(|| raw_event(vendor, e.config))
            .flatten();
        // Generic hardware events: the low 32 bits (hybrid parts put the PMU's type in
        // the high ones); 0 is PERF_COUNT_HW_CPU_CYCLES.
        let hw_cycles = e.kind == 0 && e.config & 0xffff_ffff == 0;
        if taken_name || raw == Some(RawEvent::TakenBranches) {
            Estimator::TakenBranches
        } else if matches!(base, "cycles" | "cpu-cycles" | "cpu_clk_unhalted.thread")
            || hw_cycles
            || raw == Some(RawEvent::Cycles)
        {
            Estimator::Cycles
        } else {
            Estimator::Other
        }
    }
}

/// What the pass over a perf.data file gathered.
struct Pass {
    set: SampleSet,
    /// Samples per event.
    per_event: Vec<u64>,
    /// Σ sample periods per event.
    period_sums: Vec<u64>,
    /// Deepest branch stack seen.
    max_depth: usize,
    /// Branch entries that carry cycles, per event.
    timed_per_event: Vec<u64>,
    /// The same over the stacks used.
    timed_entries: u64,
    truncated_stacks: u64,
    /// The first and last sample's time (ns of the recording's perf clock), over the
    /// samples that carry one.
    span: Option<(u64, u64)>,
    records: perf_data::Records,
    header: perf_data::Header,
}

impl Pass {
    /// Seconds from the first sample to the last, as `perf script`'s times span them;
    /// 0 where the samples carry no time.
    fn duration_secs(&self) -> f64 {
        self.span
            .map_or(0.0, |(first, last)| (last - first) as f64 / 1e9)
    }
}

/// Which event's samples a pass feeds into the aggregate, and as what.
#[derive(Clone, Copy, Debug, Default)]
struct Roles {
    /// The event whose branch stacks are used, and what it counts.
    branch: Option<(usize, Estimator)>,
    /// The event whose samples give cycles.
    cycles: Option<usize>,
    /// The clock event whose samples give time (a time profile).
    clock: Option<usize>,
}

impl Roles {
    /// What the IP samples of event `event` count, if they are used.
    fn ip_role(&self, event: usize) -> Option<EventRole> {
        if Some(event) == self.cycles {
            Some(EventRole::Cycles)
        } else if Some(event) == self.clock {
            Some(EventRole::CpuClock)
        } else {
            None
        }
    }
}

/// `file` read from its start, with progress shown.
fn read_from_start(
    file: &std::fs::File,
    what: &str,
) -> Result<progress::Reading<std::fs::File>, ImportError> {
    let f = file
        .try_clone()
        .and_then(|mut f| f.seek(SeekFrom::Start(0)).map(|_| f))
        .map_err(ImportError::io(what))?;
    let size = f.metadata().ok().map(|m| m.len());
    Ok(progress::Reading::new(f, "reading", size))
}

/// One pass over the file with range window `window` and stack weighting `weighting`,
/// feeding the samples of `roles`' events (none in a first pass) with their call stacks,
/// user stacks recorded as bytes unwound by `unwinder`.
fn perf_data_pass(
    file: &std::fs::File,
    what: &str,
    (window, weighting): (usize, StackWeighting),
    roles: Roles,
    mut unwinder: Option<&mut Unwinder>,
) -> Result<Pass, ImportError> {
    let mut f = read_from_start(file, what)?;
    let mut set = SampleSet::new(window);
    set.weighting = weighting;
    let mut per_event = Vec::new();
    let mut period_sums: Vec<u64> = Vec::new();
    let mut timed_per_event: Vec<u64> = Vec::new();
    let (mut max_depth, mut timed_entries, mut truncated_stacks) = (0usize, 0u64, 0u64);
    let mut span: Option<(u64, u64)> = None;
    let (header, records) = perf_data::read(&mut f, |h, s| {
        if h.events[s.event].has_time() {
            let (first, last) = span.unwrap_or((s.time, s.time));
            span = Some((first.min(s.time), last.max(s.time)));
        }
        if per_event.len() < h.events.len() {
            per_event.resize(h.events.len(), 0);
            period_sums.resize(h.events.len(), 0);
            timed_per_event.resize(h.events.len(), 0);
        }
        per_event[s.event] += 1;
        period_sums[s.event] = period_sums[s.event].saturating_add(s.period);
        let timed = s.branches.iter().filter(|e| e.cycles() != 0).count() as u64;
        timed_per_event[s.event] += timed;
        if !s.branches.is_empty() {
            max_depth = max_depth.max(s.branches.len());
        }
        let branch = roles
            .branch
            .filter(|&(b, _)| b == s.event && !s.branches.is_empty());
        let ip_role = roles.ip_role(s.event);
        if branch.is_none() && ip_role.is_none() {
            return;
        }
        // A dwarf recording's callchain holds only the kernel part; its user part is
        // in the stack bytes, unwound here.
        let unwound = unwinder
            .as_deref_mut()
            .filter(|_| h.events[s.event].has_user_stack())
            .map(|u| u.stack(&s));
        let stack = unwound.as_ref().or(s.stack.as_ref());
        let sh = SampleHeader {
            version: WIRE_VERSION,
            flags: if s.kernel { FLAG_KERNEL } else { 0 },
            tgid: s.pid,
            tid: s.tid,
            ip: s.ip,
            period: s.period,
            ..Default::default()
        };
        if let Some(role) = ip_role {
            let ip = IpSample {
                header: SampleHeader {
                    kind: SampleKind::Ip as u16,
                    event: role as u32,
                    ..sh
                },
            };
            // Both roles are known ones: the aggregate refuses only unknown roles.
            let _ = set.add_ip_with_stack(&ip, stack);
        }
        if let Some((_, est)) = branch {
            if s.branches.len() > MAX_BRANCH_ENTRIES {
                truncated_stacks += 1;
            }
            timed_entries += timed;
            let period = match est {
                Estimator::TakenBranches | Estimator::Cycles => s.period,
                Estimator::Other => 1,
            };
            set.add_branch_with_stack(
                &BranchSample::new(SampleHeader { period, ..sh }, &s.branches),
                stack,
            );
        }
    })
    .map_err(|source| ImportError::PerfData {
        what: what.into(),
        source,
    })?;
    per_event.resize(header.events.len(), 0);
    period_sums.resize(header.events.len(), 0);
    timed_per_event.resize(header.events.len(), 0);
    Ok(Pass {
        set,
        per_event,
        period_sums,
        max_depth,
        timed_per_event,
        timed_entries,
        truncated_stacks,
        span,
        records,
        header,
    })
}

/// Reads a perf.data file into samples: its branch stacks when it has them, else the
/// samples of a clock event as a time profile.
fn load_perf_data(
    file: &std::fs::File,
    what: &str,
    opts: &ImportOptions,
) -> Result<Loaded, ImportError> {
    let unusable = |why: String| ImportError::Unusable {
        what: what.into(),
        why,
    };
    // First pass: the events, how deep the stacks are, the mappings.
    let scan = perf_data_pass(
        file,
        what,
        (opts.window, StackWeighting::Window),
        Roles::default(),
        None,
    )?;
    let events = &scan.header.events;
    let with_stacks: Vec<usize> = (0..events.len())
        .filter(|&i| events[i].has_branch_stack())
        .collect();
    if let Some(loaded) = time_profile_instead(file, what, opts, &scan, &with_stacks) {
        return loaded;
    }
    let (branch, est, cycles) = branch_roles(&scan, &with_stacks);
    let mut notes = Vec::new();
    let window = window_within(opts.window, scan.max_depth, &mut notes).map_err(unusable)?;
    let weighting = stack_weighting(opts.stack_weighting, est, scan.timed_per_event[branch] > 0)
        .map_err(unusable)?;
    let corrected = est == Estimator::Cycles && weighting == StackWeighting::CyclesSpanned;
    let roles = Roles {
        branch: Some((branch, est)),
        cycles,
        clock: None,
    };
    let (pass, placed) = placed_pass(
        file,
        what,
        (window, weighting),
        roles,
        (&opts.locator, &scan),
    )?;
    let infos = branch_event_infos(&pass, branch, cycles);
    let Said {
        notes: placed_notes,
        details,
        files: unusable,
    } = placed.said;
    notes.extend(placed_notes);
    let duration_secs = pass.duration_secs();
    let header = pass.header;
    let set = pass.set;
    if pass.truncated_stacks > 0 {
        notes.push(format!(
            "{} branch stacks were deeper than {MAX_BRANCH_ENTRIES} entries; the newest were kept",
            pass.truncated_stacks
        ));
    }
    let ev = &header.events[branch];
    let timed_note = timed_note(pass.timed_entries > 0);
    let cycles_name = cycles.map(|c| header.events[c].display_name());
    let meaning = branch_meaning(est, ev, cycles_name.as_deref(), window, corrected);
    let (code, code_note) = raw_note(ev, &header);
    let run = RunInfo {
        mode: if cycles.is_some() {
            Mode::Cpi
        } else {
            Mode::Instructions
        },
        mode_reason: format!(
            "imported from perf.data {what} ({}): branch stacks on {} ({code}{}{code_note}): \
             {meaning}{timed_note}",
            recorded_on(&header),
            ev.display_name(),
            sampling(ev, ""),
        ),
        command: Vec::new(),
        duration_secs,
        events: infos,
        perturbation: Perturbation::None,
        lost: placed.lost,
    };
    notes.extend(untimed_note(&set));
    Ok(Loaded {
        set,
        run,
        notes,
        details,
        unusable,
        other_kernel: header.other_kernel(),
        arch: header.arch.clone(),
        cpi_withheld: cpi_withheld(est, &ev.display_name(), corrected, cycles.is_some()),
        by_instructions: cycles.is_none(),
    })
}

/// The time profile a recording gives instead of its branch stacks' ranges (another
/// architecture's, whose code is not decoded here, or one without branch stacks), or
/// why it gives none; `None` where the branch stacks are used.
fn time_profile_instead(
    file: &std::fs::File,
    what: &str,
    opts: &ImportOptions,
    scan: &Pass,
    with_stacks: &[usize],
) -> Option<Result<Loaded, ImportError>> {
    let events = &scan.header.events;
    let names = || {
        events
            .iter()
            .map(EventAttr::display_name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sampled = |i: usize| scan.per_event[i] > 0;
    let clock = (0..events.len()).find(|&i| events[i].is_clock() && sampled(i));
    if let Some(arch) = scan.header.foreign_arch() {
        // Branch stacks need the code decoded: time is what another architecture's
        // recording gives here.
        let cycles = (0..events.len())
            .find(|&i| sampled(i) && Estimator::of(&events[i], &scan.header) == Estimator::Cycles);
        return Some(match (clock, cycles) {
            (Some(clock), _) => load_time_profile(file, what, opts, (clock, Timer::Clock), scan),
            (None, Some(c)) => load_time_profile(file, what, opts, (c, Timer::Cycles), scan),
            (None, None) => Err(ImportError::Unusable {
                what: what.into(),
                why: format!(
                    "recorded on {arch}: its branch stacks need its code decoded, which this \
                     build does for x86-64 only, and it holds no cycles or clock samples to \
                     count time by (events: {})",
                    names()
                ),
            }),
        });
    }
    if with_stacks.is_empty() || scan.max_depth == 0 {
        return Some(match clock {
            Some(clock) => load_time_profile(file, what, opts, (clock, Timer::Clock), scan),
            None => Err(ImportError::NoBranchStacks {
                what: what.into(),
                events: names(),
            }),
        });
    }
    None
}

/// The event whose branch stacks are used (a taken-branch event's if there is one, else
/// the first with stacks), what it counts, and the sampled cycles event.
fn branch_roles(scan: &Pass, with_stacks: &[usize]) -> (usize, Estimator, Option<usize>) {
    let events = &scan.header.events;
    let branch = with_stacks
        .iter()
        .copied()
        .find(|&i| Estimator::of(&events[i], &scan.header) == Estimator::TakenBranches)
        .unwrap_or(with_stacks[0]);
    let est = Estimator::of(&events[branch], &scan.header);
    let cycles = (0..events.len())
        .filter(|&i| scan.per_event[i] > 0)
        .find(|&i| Estimator::of(&events[i], &scan.header) == Estimator::Cycles);
    (branch, est, cycles)
}

/// The range window `asked` for, within what stacks of `max_depth` entries allow (one
/// range fewer), with a note when it is not; why not where they hold no range.
fn window_within(asked: usize, max_depth: usize, notes: &mut Vec<String>) -> Result<usize, String> {
    let usable = max_depth.min(MAX_BRANCH_ENTRIES);
    if usable < 2 {
        return Err(format!(
            "its branch stacks hold {usable} entries: at least 2 are needed for one range"
        ));
    }
    let window = asked.max(1);
    if window > usable - 1 {
        notes.push(format!(
            "--window {window} is larger than the stacks allow: their {usable} entries hold {} ranges; using {}",
            usable - 1,
            usable - 1
        ));
        return Ok(usable - 1);
    }
    Ok(window)
}

/// What placing a pass's processes said, and the stacks unwound short.
struct Placed {
    said: Said,
    lost: LossReport,
}

/// A pass feeding `roles` ([`perf_data_pass`]) whose dwarf samples are unwound over the
/// mappings and build-ids the `scan` pass read, with the files `locator` finds, then
/// [`place`]d.
fn placed_pass(
    file: &std::fs::File,
    what: &str,
    weights: (usize, StackWeighting),
    roles: Roles,
    (locator, scan): (&Locator, &Pass),
) -> Result<(Pass, Placed), ImportError> {
    let mut build_ids = scan.header.build_ids.clone();
    build_ids.extend(scan.records.build_ids.clone());
    let foreign = scan.header.foreign_arch().map(str::to_string);
    let mut relocator = Relocator::new(locator, build_ids, what, foreign.clone());
    if foreign.is_some() {
        // Its user registers and stack bytes are another architecture's: not unwound.
        let mut pass = perf_data_pass(file, what, weights, roles, None)?;
        let placed = place(&mut pass, relocator)?;
        return Ok((pass, placed));
    }
    let mut unwinder = Unwinder::new(&scan.records.processes, &mut relocator);
    let mut pass = perf_data_pass(file, what, weights, roles, Some(&mut unwinder))?;
    if let Some(e) = unwinder.error.take() {
        return Err(e);
    }
    let unwound = unwinder.counts;
    let mut placed = place(&mut pass, relocator)?;
    placed.said.notes.extend(unwound.note());
    unwound.into_losses(&mut placed.lost);
    Ok((pass, placed))
}

/// Gives the pass's processes their recorded mappings and names, and points the
/// mappings at the local binaries with `relocator` (the one the pass's unwinding used);
/// returns the notes on both.
fn place(pass: &mut Pass, mut relocator: Relocator) -> Result<Placed, ImportError> {
    let set = &mut pass.set;
    for (pid, r) in pass.records.processes.iter() {
        if let Some(p) = set.processes.get_mut(&pid) {
            if !r.maps.mappings.is_empty() {
                p.maps = Some(r.maps.clone());
            }
            if !r.comm.is_empty() {
                p.comm.clone_from(&r.comm);
            }
        }
    }
    for p in set.processes.values_mut() {
        relocator.relocate(p.maps.iter_mut().flat_map(|m| m.mappings.iter_mut()))?;
    }
    Ok(Placed {
        said: relocator.finish(),
        lost: LossReport::default(),
    })
}

/// What a recording's time is counted by when its branch stacks are not used.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// `cpu-clock`, `task-clock`: periods in ns, a time profile.
    Clock,
    /// Cycles (another architecture's recording, whose code is not decoded here):
    /// cycles per function, no instructions.
    Cycles,
}

/// Says how many stacks the cycles-spanned weighting left out for an untimed entry.
/// How branch stacks are weighted: as asked, else by the cycles each window spans when
/// the stacks were sampled on cycles and carry timed entries (stacks on cycles
/// over-weight ranges ahead of slow code: docs/METHOD.md, "Cycle-sampled branch stacks"),
/// else per window. `Err` (why) when cycles-spanned is asked of untimed stacks.
fn stack_weighting(
    asked: Option<StackWeighting>,
    est: Estimator,
    timed: bool,
) -> Result<StackWeighting, String> {
    let weighting = asked.unwrap_or(if est == Estimator::Cycles && timed {
        StackWeighting::CyclesSpanned
    } else {
        StackWeighting::Window
    });
    if weighting == StackWeighting::CyclesSpanned && !timed {
        return Err(
            "--stack-weighting cycles-spanned needs branch entries that carry cycles \
                    (timed LBR); these carry none"
                .into(),
        );
    }
    Ok(weighting)
}

fn untimed_note(set: &SampleSet) -> Option<String> {
    let untimed: u64 = set
        .processes
        .values()
        .map(|p| p.branches.untimed_samples)
        .sum();
    (untimed > 0).then(|| {
        format!(
            "{untimed} stacks had an entry without cycles in the window and were left out of the cycles-spanned weighting"
        )
    })
}

/// Without cycles, a function's share is its share of the process's instructions and
/// functions rank by instructions.
fn shares_of_instructions(p: &mut Profile) {
    for proc in &mut p.processes {
        let total: f64 = proc
            .functions
            .iter()
            .filter_map(|f| f.measures.instructions)
            .sum();
        for f in &mut proc.functions {
            f.share = match (f.measures.instructions, total > 0.0) {
                (Some(i), true) => i / total,
                _ => 0.0,
            };
        }
        proc.functions.sort_by(|a, b| {
            b.measures
                .instructions
                .unwrap_or(0.0)
                .total_cmp(&a.measures.instructions.unwrap_or(0.0))
                .then(a.name.cmp(&b.name))
        });
    }
}
