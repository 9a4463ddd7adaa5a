//! `perf script` branch-stack text → wire [`BranchSample`]s and per-pid mappings, so
//! `perf record -b` data recorded elsewhere goes through the same analysis
//! (`cpi-bpf import-perf`).
//!
//! Input: `perf script -F pid,tid,ip,sym,dso,brstack` (or `brstackoff`), optionally with
//! `comm` and with `--show-mmap-events`. A sample line is `[comm] pid/tid ip sym (dso)`
//! followed by its branch entries, newest first, each
//! `0xFROM[(dso)]/0xTO[(dso)]/PRED/INTX/ABORT/CYCLES[/TYPE[/SPEC]]`: 6 to 8
//! `/`-separated parts as perf grew fields (a dso name may itself hold `/`; it is
//! read between its parentheses).
//!
//! With a `-g` recording, perf prints each sample's callchain under its sample line,
//! one tab-indented `ADDR sym+off (dso)` line per frame, leaf first, then the branch
//! entries on a line of their own; `Joiner` puts each such sample back together and
//! the frames become its [`CallStack`]. perf 6.1 prints a frame as its dso-relative
//! address (runtime address − mapping start + file offset; kernel frames as they are),
//! older perfs the runtime address: a frame is taken as runtime when its dso's mapping
//! holds it, else as relative to that mapping's file offset.
//!
//! Addresses: `brstack` prints runtime addresses; `brstackoff` prints each address as an
//! offset into its dso, except for non-PIE executables (`ET_EXEC`), whose addresses stay
//! as they are. Mappings come from `PERF_RECORD_MMAP`/`MMAP2` lines when present. Without
//! them, each dso is placed from its ELF headers: a non-PIE executable at its link
//! addresses; with `brstackoff`, any other dso at a synthetic base (runtime address =
//! base + file offset). A PIE or shared library seen through runtime `brstack`
//! addresses without mmap events cannot be placed; it is reported, not guessed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cpi_common::wire::{BranchEntry, BranchSample, SampleHeader, MAX_BRANCH_ENTRIES};

use crate::binary::Binary;
use crate::procmap::{MappedObject, Mapping, ProcessMaps};
use crate::profile::stack::{CallStack, StackEnd};
use crate::profile::{SampleSet, StackWeighting};

use super::perf_data::DEFAULT_MAX_STACK;

/// Why `perf script` text gave nothing to analyse.
#[derive(Debug, thiserror::Error)]
pub enum PerfScriptError {
    /// No line held a sample with branch entries.
    #[error(
        "no branch stacks found{}: expected `perf script -F pid,tid,ip,sym,dso,brstack` \
         output of a `perf record -b` recording",
        malformed_note(*.malformed, .first_malformed.as_deref())
    )]
    NoBranchStacks {
        /// Lines that looked like samples but did not parse.
        malformed: usize,
        /// The first of them, to show the user what was wrong.
        first_malformed: Option<String>,
    },
}

fn malformed_note(n: usize, first: Option<&str>) -> String {
    match first {
        Some(f) if n > 0 => format!(" ({n} malformed lines, the first {f})"),
        _ => String::new(),
    }
}

/// How the text was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportOptions {
    /// Entries are `brstackoff` dso offsets rather than runtime addresses.
    pub offsets: bool,
    /// Events each sample stands for (`perf record -c N`); 1 when unknown.
    pub period: u64,
    /// The text has a period field (`perf script -F ...,period,...`): each sample's
    /// own period, printed before the ip.
    pub period_field: bool,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            offsets: false,
            period: 1,
            period_field: false,
        }
    }
}

/// What a text held.
#[derive(Clone, Debug, Default)]
pub struct PerfImport {
    /// Every sample with branch entries, as wire records (newest entry first).
    pub samples: Vec<BranchSample>,
    /// The call stack of each of [`Self::samples`] (same order) when the text had
    /// callchain lines for it.
    pub stacks: Vec<Option<CallStack>>,
    /// pid → process name, from the samples' comm column.
    pub comms: BTreeMap<u32, String>,
    /// pid → mappings: from mmap events, else laid out from the samples' dsos.
    pub maps: BTreeMap<u32, ProcessMaps>,
    /// Lines that were neither samples with branch entries nor mmap events (samples
    /// without a branch stack, the kernel's own map).
    pub skipped_lines: usize,
    /// Lines that looked like samples or mmap events but did not parse; dropped.
    pub malformed_lines: usize,
    /// Where and why the first malformed line failed (`line N: ...`).
    pub first_malformed: Option<String>,
    /// Samples with more entries than a wire sample holds (newest kept).
    pub truncated_stacks: usize,
    /// Dsos whose addresses could not be placed (see the module doc).
    pub unplaced: Vec<String>,
    /// `brstackoff` samples whose runtime ip could not be placed, taken at their newest
    /// branch target instead.
    pub ips_at_branch_target: usize,
    /// User callchain frames no mapping of their dso holds: kept as printed.
    pub unplaced_frames: usize,
}

impl PerfImport {
    fn malformed(&mut self, line: usize, why: String) {
        self.malformed_lines += 1;
        self.first_malformed
            .get_or_insert_with(|| format!("line {line}: {why}"));
    }

    /// Feeds the samples and mappings into a [`SampleSet`] with the given range window.
    pub fn into_sample_set(self, window: usize, weighting: StackWeighting) -> SampleSet {
        let mut set = SampleSet::new(window);
        set.weighting = weighting;
        for (s, stack) in self.samples.iter().zip(&self.stacks) {
            set.add_branch_with_stack(s, stack.as_ref());
        }
        self.place(&mut set);
        set
    }

    /// Gives `set`'s processes their mappings and names.
    pub fn place(self, set: &mut SampleSet) {
        for (pid, maps) in self.maps {
            set.process(pid).maps = Some(maps);
        }
        for (pid, comm) in self.comms {
            set.process(pid).comm = comm;
        }
    }
}

/// One line of `perf script` text, classified.
enum Line<'a> {
    /// A `PERF_RECORD_MMAP*` event ([`parse_mmap`]'s answer; `None`: malformed).
    Mmap(Option<Option<(u32, Mapping)>>),
    /// A sample with branch entries.
    Sample(Parsed<'a>),
    /// Neither (a sample without a branch stack, a comment, a blank line).
    Skip,
    /// Looked like a sample or an entry and did not parse: why.
    Malformed(String),
}

/// A sample line's fields; entries newest first, at most [`MAX_BRANCH_ENTRIES`].
struct Parsed<'a> {
    head: Head,
    entries: Vec<BranchEntry>,
    /// Each entry's (from, to) dso, for `brstackoff` rebasing.
    dsos: Vec<[Option<&'a str>; 2]>,
    /// Entries beyond [`MAX_BRANCH_ENTRIES`] were dropped.
    truncated: bool,
}

fn classify(line: &str, period_field: bool) -> Line<'_> {
    if line.contains("PERF_RECORD_MMAP") {
        return Line::Mmap(parse_mmap(line));
    }
    let trimmed = line.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Line::Skip;
    }
    let malformed_entry = |t: &str| {
        let why = parse_entry(t).err().unwrap_or("not a branch entry");
        Line::Malformed(format!("malformed branch entry {:?} ({why})", clip(t)))
    };
    let Some(start) = first_entry(line) else {
        // A token shaped like a branch entry that does not parse: malformed, not a
        // sample without a branch stack.
        return branch_shaped(line).map_or(Line::Skip, malformed_entry);
    };
    let (head, tail) = line.split_at(start);
    if let Some(t) = branch_shaped(head) {
        return malformed_entry(t);
    }
    let Some(head) = parse_head(head, period_field) else {
        return Line::Malformed(
            "sample has no pid/tid field (use `perf script -F pid,tid,ip,sym,dso,brstack`)".into(),
        );
    };
    let mut entries = Vec::new();
    let mut dsos = Vec::new();
    let mut rest = tail;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        match parse_entry(rest) {
            Ok((e, used)) => {
                entries.push(e.entry);
                dsos.push([e.from_dso, e.to_dso]);
                rest = &rest[used..];
            }
            Err(why) => {
                let entry = rest.split_whitespace().next().unwrap_or("");
                return Line::Malformed(format!(
                    "malformed branch entry {:?} ({why})",
                    clip(entry)
                ));
            }
        }
    }
    let truncated = entries.len() > MAX_BRANCH_ENTRIES;
    entries.truncate(MAX_BRANCH_ENTRIES);
    dsos.truncate(MAX_BRANCH_ENTRIES);
    Line::Sample(Parsed {
        head,
        entries,
        dsos,
        truncated,
    })
}

/// A callchain line's frame: its address as printed and its dso.
type Frame = (u64, Option<String>);

/// `\t  ADDR sym+off (dso)`, a line of a `-g` recording's callchain.
fn callchain_frame(line: &str) -> Option<Frame> {
    let rest = line.strip_prefix('\t')?.trim();
    let (addr, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let addr = u64::from_str_radix(addr, 16).ok()?;
    let rest = rest.trim_end();
    let dso = rest
        .strip_suffix(')')
        .and_then(|r| r.rfind('(').map(|i| r[i + 1..].to_string()));
    Some((addr, dso))
}

/// A line holding only branch entries (a `-g` sample's, after its callchain).
fn entries_only(line: &str) -> bool {
    first_entry(line).is_some_and(|at| line[..at].trim().is_empty())
}

/// One sample as `perf script` printed it over one or more lines.
#[derive(Debug, Default)]
struct Joined {
    /// 1-based number of its first line.
    line: usize,
    /// The sample line, its branch entries appended when they came on a line of their own.
    text: String,
    /// Its callchain, leaf first.
    frames: Vec<Frame>,
}

/// Puts `-g` samples back together: a sample line, its callchain lines, then its
/// branch-entry line. Every other line passes through as it is.
#[derive(Debug, Default)]
struct Joiner {
    pending: Option<Joined>,
}

impl Joiner {
    /// Takes line `n`; whatever it completes goes to `f` (line number, text, frames).
    fn push(&mut self, n: usize, line: &str, f: &mut impl FnMut(usize, &str, &[Frame])) {
        if let Some(p) = &mut self.pending {
            if let Some(frame) = callchain_frame(line) {
                p.frames.push(frame);
                return;
            }
            if !p.frames.is_empty() && entries_only(line) {
                p.text.push(' ');
                p.text.push_str(line);
                return;
            }
        }
        self.finish(f);
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || line.contains("PERF_RECORD_MMAP") {
            f(n, line, &[]);
        } else {
            self.pending = Some(Joined {
                line: n,
                text: line.to_string(),
                frames: Vec::new(),
            });
        }
    }

    /// Passes on the sample still open at the end of the text.
    fn finish(&mut self, f: &mut impl FnMut(usize, &str, &[Frame])) {
        if let Some(p) = self.pending.take() {
            f(p.line, &p.text, &p.frames);
        }
    }
}

/// The first pass over the text: everything but the samples themselves, which
/// [`Placed::sample`] reads in a second pass once the mappings are known, so memory
/// does not grow with the text.
pub(crate) struct Scan {
    opts: ImportOptions,
    out: PerfImport,
    mmaps: BTreeMap<u32, Vec<Mapping>>,
    /// pid → dsos seen in its entries, for placement without mmap events.
    dsos: BTreeMap<u32, BTreeSet<String>>,
    /// Samples with branch entries.
    samples: u64,
    /// Some entry carries cycles (timed LBR).
    timed: bool,
    /// Some sample's own period differs from [`ImportOptions::period`].
    per_sample: bool,
    joiner: Joiner,
}

impl Scan {
    /// An empty scan of text written as `opts` says.
    pub fn new(opts: ImportOptions) -> Scan {
        Scan {
            opts,
            out: PerfImport::default(),
            mmaps: BTreeMap::new(),
            dsos: BTreeMap::new(),
            samples: 0,
            timed: false,
            per_sample: false,
            joiner: Joiner::default(),
        }
    }

    /// Takes line `n` (1-based) into account.
    pub fn line(&mut self, n: usize, line: &str) {
        let mut joiner = std::mem::take(&mut self.joiner);
        joiner.push(n, line, &mut |n, text, frames| self.sample(n, text, frames));
        self.joiner = joiner;
    }

    /// One sample (or other line) put back together.
    fn sample(&mut self, n: usize, line: &str, frames: &[Frame]) {
        let p = match classify(line, self.opts.period_field) {
            Line::Mmap(Some(Some((pid, m)))) => {
                self.mmaps.entry(pid).or_default().push(m);
                return;
            }
            // The kernel's own map (pid -1): kernel addresses are not placed.
            Line::Mmap(Some(None)) | Line::Skip => {
                self.out.skipped_lines += 1;
                return;
            }
            Line::Mmap(None) => {
                let why = format!("malformed mmap event {:?}", clip(line));
                self.out.malformed(n, why);
                return;
            }
            Line::Malformed(why) => {
                self.out.malformed(n, why);
                return;
            }
            Line::Sample(p) => p,
        };
        let seen = self.dsos.entry(p.head.pid).or_default();
        let frame_dsos = frames.iter().filter_map(|(_, d)| d.as_deref());
        for d in p.dsos.iter().flatten().flatten().copied().chain(frame_dsos) {
            if !seen.contains(d) {
                seen.insert(d.to_string());
            }
        }
        if let Some(c) = p.head.comm {
            self.out.comms.entry(p.head.pid).or_insert(c);
        }
        self.out.truncated_stacks += usize::from(p.truncated);
        self.samples += 1;
        self.timed |= p.entries.iter().any(|e| e.cycles() != 0);
        self.per_sample |= p
            .head
            .period
            .is_some_and(|q| q > 0 && q != self.opts.period);
    }

    /// Places every dso (recorded mmap events win; else the dsos' own ELF headers,
    /// read by `read_elf`); `Err` when no line held a branch stack.
    pub fn finish(
        mut self,
        read_elf: &dyn Fn(&Path) -> Option<ElfLayout>,
    ) -> Result<Placed, PerfScriptError> {
        let mut joiner = std::mem::take(&mut self.joiner);
        joiner.finish(&mut |n, text, frames| self.sample(n, text, frames));
        let Scan {
            opts,
            mut out,
            mut mmaps,
            dsos,
            samples,
            timed,
            per_sample,
            joiner: _,
        } = self;
        if samples == 0 {
            return Err(PerfScriptError::NoBranchStacks {
                malformed: out.malformed_lines,
                first_malformed: out.first_malformed,
            });
        }
        let mut bases: BTreeMap<String, u64> = BTreeMap::new();
        for (pid, seen) in dsos {
            let mut maps = mmaps.remove(&pid).unwrap_or_default();
            if maps.is_empty() {
                for dso in seen {
                    match read_elf(Path::new(&dso)) {
                        Some(l) if !l.pie => maps.extend(l.link_mappings(&dso)),
                        Some(l) if opts.offsets => {
                            let next = SYNTHETIC_BASE * (bases.len() as u64 + 1);
                            let base = *bases.entry(dso.clone()).or_insert(next);
                            maps.push(Mapping {
                                start: base,
                                end: base + l.file_size.max(1),
                                offset: 0,
                                executable: true,
                                object: file(&dso),
                                // Recorded elsewhere: device and inode mean nothing here.
                                file_id: None,
                            });
                        }
                        // `[kernel.kallsyms]`, `[unknown]`, `[vdso]`: no file to place.
                        _ if dso.starts_with('[') => {}
                        _ => out.unplaced.push(dso),
                    }
                }
            }
            maps.sort_by_key(|m| m.start);
            out.maps.insert(pid, ProcessMaps { mappings: maps });
        }
        for (pid, mut maps) in mmaps {
            maps.sort_by_key(|m| m.start);
            out.maps.insert(pid, ProcessMaps { mappings: maps });
        }
        out.unplaced.sort();
        out.unplaced.dedup();
        Ok(Placed {
            opts,
            import: out,
            bases,
            samples,
            timed,
            per_sample,
            joiner: Joiner::default(),
        })
    }
}

/// The text's mappings, known after [`Scan::finish`]; turns sample lines into wire
/// samples.
pub(crate) struct Placed {
    opts: ImportOptions,
    /// Everything but the samples (those go where the caller sends them).
    pub import: PerfImport,
    bases: BTreeMap<String, u64>,
    /// Samples with branch entries in the text.
    pub samples: u64,
    /// Some entry carries cycles (timed LBR).
    pub timed: bool,
    /// Some sample's own period differs from [`ImportOptions::period`].
    pub per_sample: bool,
    joiner: Joiner,
}

/// A wire sample and its call stack, when the text had one.
pub(crate) type StackedSample = (BranchSample, Option<CallStack>);

impl Placed {
    /// Takes the next line; each sample with branch entries it completes (a `-g`
    /// sample ends at the line after it) goes to `f`.
    pub fn line(&mut self, line: &str, f: &mut impl FnMut(StackedSample)) {
        let mut joiner = std::mem::take(&mut self.joiner);
        joiner.push(0, line, &mut |_, text, frames| {
            if let Some(s) = self.sample(text, frames) {
                f(s);
            }
        });
        self.joiner = joiner;
    }

    /// Ends the text: the last sample goes to `f`.
    pub fn finish(&mut self, f: &mut impl FnMut(StackedSample)) {
        let mut joiner = std::mem::take(&mut self.joiner);
        joiner.finish(&mut |_, text, frames| {
            if let Some(s) = self.sample(text, frames) {
                f(s);
            }
        });
    }

    /// A callchain in runtime addresses: kernel frames as printed, user frames through
    /// their dso's mapping (see the module doc).
    fn stack(&mut self, pid: u32, frames: &[Frame]) -> CallStack {
        let (mut kernel, mut user) = (Vec::new(), Vec::new());
        let maps = self.import.maps.get(&pid);
        for (addr, dso) in frames {
            let dso = dso.as_deref().unwrap_or("");
            if dso.starts_with("[kernel") || *addr >= KERNEL_START {
                kernel.push(*addr);
                continue;
            }
            let of_dso = maps.into_iter().flat_map(|m| &m.mappings).filter(
                |m| matches!(&m.object, MappedObject::File { path, .. } if path.as_os_str() == dso),
            );
            let runtime = of_dso.clone().find(|m| (m.start..m.end).contains(addr));
            let relative = of_dso
                .clone()
                .find(|m| (m.offset..m.offset.saturating_add(m.end - m.start)).contains(addr));
            user.push(match (runtime, relative) {
                (Some(_), _) => *addr,
                (None, Some(m)) => m.start + (addr - m.offset),
                (None, None) => {
                    self.import.unplaced_frames += 1;
                    *addr
                }
            });
        }
        CallStack {
            kernel: kernel.into(),
            user: user.into(),
            end: if frames.len() as u64 >= DEFAULT_MAX_STACK {
                StackEnd::Truncated
            } else {
                StackEnd::Complete
            },
        }
    }

    /// The wire sample of a sample put back together, with its stack.
    fn sample(&mut self, line: &str, frames: &[Frame]) -> Option<StackedSample> {
        let Line::Sample(p) = classify(line, self.opts.period_field) else {
            return None;
        };
        let stack = (!frames.is_empty()).then(|| self.stack(p.head.pid, frames));
        let mut entries = p.entries;
        // A `-g` sample line has no ip: its callchain's leaf is the ip.
        let leaf = stack
            .as_ref()
            .and_then(|s| s.kernel.first().or(s.user.first()).copied());
        let mut ip = p.head.ip.or(leaf).unwrap_or(entries[0].to);
        if self.opts.offsets {
            // A brstackoff offset into a dso placed at a synthetic base is base + offset.
            let rebase = |a: u64, d: &Option<&str>| match d.and_then(|d| self.bases.get(d)) {
                Some(base) => base + a,
                None => a,
            };
            for (e, [fd, td]) in entries.iter_mut().zip(&p.dsos) {
                e.from = rebase(e.from, fd);
                e.to = rebase(e.to, td);
            }
            // perf prints the sample ip as a runtime address even with brstackoff: one
            // that no mapping holds is taken at the newest branch target, the start of
            // the straight-line run the sample interrupted.
            let placed = self
                .import
                .maps
                .get(&p.head.pid)
                .is_some_and(|m| m.find(ip).is_some());
            if !placed {
                ip = entries[0].to;
                self.import.ips_at_branch_target += 1;
            }
        }
        let sample = branch_sample(
            p.head.pid,
            p.head.tid,
            ip,
            p.head.period.filter(|&q| q > 0).unwrap_or(self.opts.period),
            &entries,
        );
        Some((sample, stack))
    }
}

/// Lowest kernel address on x86-64: callchain frames at or above it are kernel frames.
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// Parses `perf script` text held in memory (both passes; the samples collected).
/// `read_elf` reads a dso's ELF placement (injected so tests and callers can resolve
/// paths as they need; [`elf_layout`] reads the file).
pub fn parse(
    text: &str,
    opts: ImportOptions,
    read_elf: &dyn Fn(&Path) -> Option<ElfLayout>,
) -> Result<PerfImport, PerfScriptError> {
    let mut scan = Scan::new(opts);
    for (i, line) in text.lines().enumerate() {
        scan.line(i + 1, line);
    }
    let mut placed = scan.finish(read_elf)?;
    let mut samples = Vec::new();
    for line in text.lines() {
        placed.line(line, &mut |s| samples.push(s));
    }
    placed.finish(&mut |s| samples.push(s));
    (placed.import.samples, placed.import.stacks) = samples.into_iter().unzip();
    Ok(placed.import)
}

/// Synthetic bases for `brstackoff` dsos: far above user space addresses so they never
/// meet a link address.
const SYNTHETIC_BASE: u64 = 0x1000_0000_0000;

/// The first token of `s` shaped like a branch entry (`0x.../...`).
fn branch_shaped(s: &str) -> Option<&str> {
    s.split_whitespace()
        .find(|t| t.starts_with("0x") && t.contains('/'))
}

/// At most 80 characters of `s`, for error messages.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn file(path: &str) -> MappedObject {
    MappedObject::File {
        path: PathBuf::from(path),
        deleted: false,
    }
}

/// Where an ELF file's code sits, as placement needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfLayout {
    /// `ET_DYN` (PIE or shared library): loaded at a base chosen at run time.
    pub pie: bool,
    /// Bytes of the file that segments cover (a synthetic mapping's length).
    pub file_size: u64,
    /// Executable `PT_LOAD` segments: (vaddr, memsz, file offset).
    pub exec_segments: Vec<(u64, u64, u64)>,
}

impl ElfLayout {
    /// The layout of a parsed [`Binary`].
    pub fn of(bin: &Binary) -> ElfLayout {
        ElfLayout {
            pie: bin.dynamic,
            file_size: bin
                .segments
                .iter()
                .map(|s| s.offset + s.filesz)
                .max()
                .unwrap_or(0),
            exec_segments: bin
                .segments
                .iter()
                .filter(|s| s.executable)
                .map(|s| (s.vaddr, s.memsz, s.offset))
                .collect(),
        }
    }

    fn link_mappings(&self, dso: &str) -> Vec<Mapping> {
        self.exec_segments
            .iter()
            .map(|&(vaddr, size, offset)| Mapping {
                start: vaddr,
                end: vaddr + size,
                offset,
                executable: true,
                object: file(dso),
                // Recorded elsewhere: device and inode mean nothing here.
                file_id: None,
            })
            .collect()
    }
}

/// Reads a file's [`ElfLayout`] through [`Binary::open`]; `Err` when it is missing, not
/// ELF, or (as root) not readable by the recording's user.
pub fn elf_layout(path: &Path) -> Result<ElfLayout, crate::binary::BinaryError> {
    Binary::open(path).map(|b| ElfLayout::of(&b))
}

struct ParsedEntry<'a> {
    entry: BranchEntry,
    from_dso: Option<&'a str>,
    to_dso: Option<&'a str>,
}

/// Byte offset of the first branch entry: a whitespace-preceded `0x` token that parses
/// as an entry.
fn first_entry(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    (0..b.len()).find(|&i| {
        (i == 0 || b[i - 1].is_ascii_whitespace())
            && line[i..].starts_with("0x")
            && parse_entry(&line[i..]).is_ok()
    })
}

/// What a sample line says before its branch entries.
struct Head {
    pid: u32,
    tid: u32,
    comm: Option<String>,
    ip: Option<u64>,
    /// `-F period`: the sample's own period (freq-mode recordings vary it).
    period: Option<u64>,
}

/// `[comm] pid/tid [[cpu]] [time:] [period] [event:] [ip] [sym] [(dso)]`.
fn parse_head(head: &str, period_field: bool) -> Option<Head> {
    let tokens: Vec<&str> = head.split_whitespace().collect();
    let at = tokens.iter().position(|t| {
        t.split_once('/')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
    })?;
    let (pid, tid) = tokens[at].split_once('/')?;
    let comm = (at > 0).then(|| tokens[..at].join(" "));
    // After pid/tid perf prints `[cpu]`, `time:`, the period (decimal), `event:`, then
    // the ip (bare hex): skip the bracketed and colon-ended ones.
    let rest: Vec<&str> = tokens[at + 1..]
        .iter()
        .copied()
        .filter(|t| !(t.ends_with(':') || (t.starts_with('[') && t.ends_with(']'))))
        .collect();
    let is_hex = |t: &&str| u64::from_str_radix(t, 16).ok();
    let (period, ip) = if period_field {
        (
            rest.first().and_then(|p| p.parse().ok()),
            rest.get(1).and_then(is_hex),
        )
    } else {
        (None, rest.first().and_then(is_hex))
    };
    Some(Head {
        pid: pid.parse().ok()?,
        tid: tid.parse().ok()?,
        comm,
        ip,
        period,
    })
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// `0xADDR` then an optional `(dso)` (parentheses balanced: dso names may hold `/`).
fn addr_dso(s: &str) -> Result<(u64, Option<&str>, usize), &'static str> {
    let digits = s
        .strip_prefix("0x")
        .ok_or("address without 0x")?
        .bytes()
        .take_while(u8::is_ascii_hexdigit)
        .count();
    let end = 2 + digits;
    let addr = hex(&s[..end]).ok_or("bad address")?;
    if !s[end..].starts_with('(') {
        return Ok((addr, None, end));
    }
    let mut depth = 0usize;
    for (i, c) in s[end..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    let inner = &s[end + 1..end + i];
                    // `dso+0xoff` when perf printed dsoff too.
                    let dso = match inner.rsplit_once("+0x") {
                        Some((d, off)) if hex(&format!("0x{off}")).is_some() => d,
                        _ => inner,
                    };
                    return Ok((addr, Some(dso), end + i + 1));
                }
            }
            _ => {}
        }
    }
    Err("unbalanced parentheses")
}

/// One entry; returns it and the bytes used.
fn parse_entry(s: &str) -> Result<(ParsedEntry<'_>, usize), &'static str> {
    let (from, from_dso, a) = addr_dso(s)?;
    let rest = s[a..].strip_prefix('/').ok_or("expected / after from")?;
    let (to, to_dso, b) = addr_dso(rest)?;
    let flags_start = a + 1 + b;
    let len = s[flags_start..]
        .find(char::is_whitespace)
        .unwrap_or(s.len() - flags_start);
    let flags = &s[flags_start..flags_start + len];
    let parts: Vec<&str> = flags
        .strip_prefix('/')
        .ok_or("expected flags")?
        .split('/')
        .collect();
    // from, to + 4 (pred, intx, abort, cycles) = 6 parts; + type = 7; + spec = 8.
    if !(4..=6).contains(&parts.len()) {
        return Err("expected 6 to 8 /-separated parts");
    }
    let mispred = match parts[0] {
        p if p.starts_with('M') => true,
        p if p.starts_with('P') || p.starts_with('-') || p.starts_with('N') => false,
        _ => return Err("prediction flag is not M, P or -"),
    };
    if !matches!(parts[1], "X" | "-") || !matches!(parts[2], "A" | "-") {
        return Err("in_tx/abort flags are not X/A or -");
    }
    let cycles: u64 = parts[3].parse().map_err(|_| "cycles is not a number")?;
    let mut entry = BranchEntry::new(from, to, mispred, cycles.min(u16::MAX as u64) as u16);
    if parts[0] == "-" {
        // Neither predicted nor mispredicted: the hardware did not say.
        entry.flags &= !0b11;
    }
    Ok((
        ParsedEntry {
            entry,
            from_dso,
            to_dso,
        },
        flags_start + len,
    ))
}

fn branch_sample(
    pid: u32,
    tid: u32,
    ip: u64,
    period: u64,
    newest_first: &[BranchEntry],
) -> BranchSample {
    // Deeper stacks than the wire carries (ARM BRBE has 64) keep their newest entries.
    let header = SampleHeader {
        tgid: pid,
        tid,
        period,
        ip,
        ..Default::default()
    };
    BranchSample::new(header, newest_first)
}

/// `... PERF_RECORD_MMAP2 PID/TID: [0xSTART(0xLEN) @ 0xPGOFF ...]: PROT PATH` (also the
/// older `PERF_RECORD_MMAP`). `Some(None)` for the kernel's map (pid -1).
fn parse_mmap(line: &str) -> Option<Option<(u32, Mapping)>> {
    let rest = &line[line.find("PERF_RECORD_MMAP")?..];
    let rest = rest.split_once(' ')?.1.trim_start();
    let (pidtid, rest) = rest.split_once(':')?;
    let pid: i64 = pidtid.split('/').next()?.trim().parse().ok()?;
    let Ok(pid) = u32::try_from(pid) else {
        return Some(None);
    };
    let inner = rest.trim_start().strip_prefix('[')?;
    let (inner, after) = inner.split_once("]:")?;
    let (start, inner) = inner.split_once('(')?;
    let (len, inner) = inner.split_once(')')?;
    let pgoff = inner
        .trim_start()
        .strip_prefix('@')?
        .split_whitespace()
        .next()?;
    let start = hex(start.trim())?;
    let len = hex(len.trim())?;
    let pgoff = hex(pgoff).or_else(|| pgoff.parse().ok())?;
    let after = after.trim_start();
    let (prot, path) = after.split_once(' ').unwrap_or((after, ""));
    let path = path.trim();
    let object = MappedObject::from_name(path);
    Some(Some((
        pid,
        Mapping {
            start,
            end: start.checked_add(len)?,
            offset: pgoff,
            executable: prot.contains('x'),
            object,
            // Recorded elsewhere: device and inode mean nothing here.
            file_id: None,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_elf(_: &Path) -> Option<ElfLayout> {
        None
    }

    #[test]
    fn entry_variants_six_seven_eight_parts_and_dso_with_slashes() {
        for (text, cycles, mispred) in [
            ("0x401136/0x401120/P/-/-/0", 0, false),
            ("0x401136/0x401120/M/-/-/17/COND", 17, true),
            (
                "0x401136/0x401120/P/-/-/3/COND/NON_SPEC_CORRECT_PATH",
                3,
                false,
            ),
            (
                "0x401136(/tmp/a b/prog)/0x401120(/tmp/a b/prog)/M/-/-/5/-/-",
                5,
                true,
            ),
        ] {
            let (e, used) = parse_entry(text).unwrap_or_else(|w| panic!("{text}: {w}"));
            assert_eq!(used, text.len(), "{text}");
            assert_eq!((e.entry.from, e.entry.to), (0x401136, 0x401120));
            assert_eq!(e.entry.cycles(), cycles);
            assert_eq!(e.entry.mispred(), mispred);
        }
        let (e, _) = parse_entry("0x10(/x/lib.so+0x1f0)/0x20(/x/lib.so)/-/-/-/0").unwrap();
        assert_eq!(e.from_dso, Some("/x/lib.so"));
        assert!(!e.entry.mispred() && !e.entry.predicted());
        for bad in [
            "0x1/0x2/P/-/-",
            "0x1/0x2/Q/-/-/0",
            "0x1/0x2/P/-/-/x",
            "0x1(/a/0x2/P/-/-/0",
        ] {
            assert!(parse_entry(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sample_line_with_comm_ip_sym_dso() {
        let text = "prog 4242/4243   401136 main (/tmp/prog)  \
                    0x401136(/tmp/prog)/0x401120(/tmp/prog)/P/-/-/0/COND \
                    0x401140(/tmp/prog)/0x401130(/tmp/prog)/M/-/-/0/COND\n";
        let imp = parse(text, ImportOptions::default(), &no_elf).unwrap();
        assert_eq!(imp.samples.len(), 1);
        let s = &imp.samples[0];
        assert_eq!(
            (s.header.tgid, s.header.tid, s.header.ip),
            (4242, 4243, 0x401136)
        );
        assert_eq!(s.entries().len(), 2);
        assert!(s.entries()[1].mispred());
        assert_eq!(imp.comms[&4242], "prog");
        assert_eq!(imp.unplaced, vec!["/tmp/prog".to_string()]);
    }

    #[test]
    fn mmap2_events_place_the_dso() {
        let text = "prog 7 [000] 0.0: PERF_RECORD_MMAP2 7/7: [0x555555555000(0x2000) @ 0x1000 08:01 12 0]: r-xp /tmp/pie\n\
                    7/7 555555555136 f (/tmp/pie) 0x555555555136/0x555555555120/P/-/-/0\n";
        let imp = parse(text, ImportOptions::default(), &no_elf).unwrap();
        let m = &imp.maps[&7].mappings[0];
        assert_eq!(
            (m.start, m.end, m.offset, m.executable),
            (0x555555555000, 0x555555557000, 0x1000, true)
        );
        assert!(imp.unplaced.is_empty());
    }

    /// `-g` text: the sample line, its callchain lines (kernel frames as they are, a PIE's
    /// frames dso-relative as perf 6.1 prints them or runtime as older perfs do, a frame
    /// of no known mapping), then its branch entries on a line of their own.
    #[test]
    fn callchain_lines_become_the_samples_stack() {
        let text = "\
prog 7 [000] 0.0: PERF_RECORD_MMAP2 7/7: [0x555555555000(0x2000) @ 0x1000 08:01 12 0]: r-xp /tmp/pie
prog     7/7        1000 
\t ffffffff81001234 irq_exit+0x4 ([kernel.kallsyms])
\t            1136 f+0x6 (/tmp/pie)
\t    555555555200 main+0x20 (/tmp/pie)
\t          2724a [unknown] ([unknown])
 0x555555555136(/tmp/pie)/0x555555555120(/tmp/pie)/P/-/-/0/ 

prog     7/7        1001 
\t            1136 f+0x6 (/tmp/pie)
 0x555555555136(/tmp/pie)/0x555555555120(/tmp/pie)/P/-/-/0/ 
prog     7/7        1002  0x555555555136(/tmp/pie)/0x555555555120(/tmp/pie)/P/-/-/0/
";
        let opts = ImportOptions {
            period_field: true,
            ..ImportOptions::default()
        };
        let imp = parse(text, opts, &no_elf).unwrap();
        assert_eq!(imp.malformed_lines, 0, "{:?}", imp.first_malformed);
        assert_eq!(imp.samples.len(), 3);
        let periods: Vec<u64> = imp.samples.iter().map(|s| s.header.period).collect();
        assert_eq!(periods, [1000, 1001, 1002]);
        let s = imp.stacks[0].as_ref().unwrap();
        assert_eq!(*s.kernel, [0xffff_ffff_8100_1234]);
        assert_eq!(*s.user, [0x5555_5555_5136, 0x5555_5555_5200, 0x2724a]);
        assert_eq!(s.end, StackEnd::Complete);
        assert_eq!(imp.unplaced_frames, 1);
        // The callchain's leaf is the ip of a -g sample line without one.
        assert_eq!(imp.samples[0].header.ip, 0xffff_ffff_8100_1234);
        assert_eq!(imp.samples[1].header.ip, 0x5555_5555_5136);
        assert_eq!(*imp.stacks[1].as_ref().unwrap().user, [0x5555_5555_5136]);
        // A sample without callchain lines has no stack.
        assert!(imp.stacks[2].is_none());
    }

    /// Lines as Debian's perf 6.1 prints them (`perf script -F pid,tid,ip,sym,dso
    /// --show-mmap-events` of a cpu-clock recording of a PIE here), with branch entries
    /// appended in perf's brstack form, since this machine cannot record them.
    #[test]
    fn real_perf_mmap_and_sample_lines() {
        let text = "\
    0/0     PERF_RECORD_MMAP -1/0: [0xffffffff81000000(0x120bb08) @ 0xffffffff81000000]: x [kernel.kallsyms]_text
22483/22483 PERF_RECORD_MMAP2 22483/22483: [0x55cc7d28f000(0x1000) @ 0x1000 fe:00 10027070 842982290]: r-xp /tmp/bolt/pieprog
22483/22483 PERF_RECORD_MMAP2 22483/22483: [0x7f2804d5d000(0x2000) @ 0 00:00 0 0]: r-xp [vdso]
22483/22483 PERF_RECORD_MMAP2 22483/22483: [0x7f2804b90000(0x156000) @ 0x26000 fe:00 326279 0]: r-xp /usr/lib/x86_64-linux-gnu/libc.so.6
22483/22483      55cc7d28f345 collatz_steps (/tmp/bolt/pieprog) 0x55cc7d28f342(/tmp/bolt/pieprog)/0x55cc7d28f330(/tmp/bolt/pieprog)/P/-/-/0/COND/- 0x55cc7d28f34e(/tmp/bolt/pieprog)/0x55cc7d28f33e(/tmp/bolt/pieprog)/M/-/-/0/COND/-
22483/22483      7f2804d6d3aa _dl_relocate_object (/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)
";
        let imp = parse(text, ImportOptions::default(), &no_elf).unwrap();
        assert_eq!(imp.samples.len(), 1);
        assert_eq!(
            imp.skipped_lines, 2,
            "kernel map and the sample without entries"
        );
        let maps = &imp.maps[&22483];
        assert_eq!(maps.mappings.len(), 3);
        let m = maps.find(0x55cc7d28f342).unwrap();
        assert_eq!(m.file_offset(0x55cc7d28f342), 0x1342);
        assert_eq!(maps.find(0x7f2804d5d010).unwrap().offset, 0);
        assert!(imp.unplaced.is_empty());
    }

    #[test]
    fn garbage_is_one_clear_error() {
        let e = parse("hello\nworld\n", ImportOptions::default(), &no_elf).unwrap_err();
        assert!(
            matches!(e, PerfScriptError::NoBranchStacks { malformed: 0, .. }),
            "{e}"
        );
        let e = parse(
            "1/1 10 f 0x1/0x2/P/-/-/0 0x3/0x4/Z/-/-/0\n",
            ImportOptions::default(),
            &no_elf,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("1 malformed lines, the first line 1: malformed branch entry"),
            "{e}"
        );
    }

    /// `perf script -F pid,tid,period,ip,...`: each sample keeps its own period (a
    /// freq-mode recording varies it); the ip is the token after it.
    #[test]
    fn period_field_is_each_samples_own() {
        let text = "prog 7/7 [001] 12.5: 31337 cycles:u: 401136 f (/p) 0x401136/0x401120/P/-/-/0\n\
                    prog 7/7 [001] 12.6: 1200 cycles:u: 401140 f (/p) 0x401136/0x401120/P/-/-/0\n";
        let opts = ImportOptions {
            period_field: true,
            ..Default::default()
        };
        let imp = parse(text, opts, &no_elf).unwrap();
        let got: Vec<(u64, u64)> = imp
            .samples
            .iter()
            .map(|s| (s.header.period, s.header.ip))
            .collect();
        assert_eq!(got, [(31337, 0x401136), (1200, 0x401140)]);
    }

    /// Malformed lines among good ones are counted and named, never silently dropped.
    #[test]
    fn malformed_lines_are_counted() {
        let mut text = String::from("1/1 10 f 0x10/0x20/P/-/-/0 0x5/0x8/P/-/-/0\n");
        for _ in 0..999 {
            text.push_str("1/1 10 f 0xZZ/0x20/P/-/-/0 0x5/0x8/P/-/-/0\n");
        }
        let imp = parse(&text, ImportOptions::default(), &no_elf).unwrap();
        assert_eq!(imp.samples.len(), 1);
        assert_eq!(imp.malformed_lines, 999);
        assert!(
            imp.first_malformed
                .as_deref()
                .unwrap()
                .starts_with("line 2: malformed branch entry"),
            "{:?}",
            imp.first_malformed
        );
    }
}
