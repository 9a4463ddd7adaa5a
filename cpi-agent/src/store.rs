//! The agent's local store (`--store DIR`, default `DEFAULT_DIR`): one gzip'd profile
//! file per window, in the versioned JSON format of cpi-user/src/report/file.rs, named
//! `w-<start ms>-<end ms>.json.gz` (Unix milliseconds, so names sort by time).
//!
//! Writes are atomic: the window goes to a hidden temp file with an unpredictable name,
//! created `O_EXCL|O_NOFOLLOW` mode 0600 (cpi-user/src/fsafe/mod.rs), is fsync'd,
//! renamed into place, and the directory is fsync'd. A crash at any point leaves either
//! the complete window or no window (plus, at worst, a temp file that readers ignore and
//! the next [`Store::open`] removes). The agent's store must be a directory of its own
//! user that no one else can write ([`Store::open`] refuses others). Profiles name every
//! process and binary on the host, so the store is the agent's user's alone: directory
//! 0700, windows 0600 (as perf writes perf.data), or with a reader group
//! (`--store-group`) directory 0750 and windows 0640 of that group. Retention: windows
//! that ended more than `retain` ago go first, then the oldest until the store is under
//! `max_bytes`.
//!
//! Reading is bounded: at most [`MAX_INDEX`] windows are listed (the newest; the rest
//! counted), windows are opened without blocking and only if regular files, and a
//! window decompresses to at most the profile file's own limit
//! ([`file::MAX_PROFILE_BYTES`]), so a FIFO, a gzip bomb or a million files in the
//! directory cost bounded time and memory.
//!
//! [`read_range`] merges the windows of a time range into one profile
//! (cpi-user/src/profile/merge.rs): `cpi-bpf report --store DIR --since 1h`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;

use super::sink::{Sink, SinkError};
use super::{AgentStatus, Window};
use cpi_user::profile::merge::{retain_processes, MergeError, Merger};
use cpi_user::profile::{AnalysisOptions, Profile};
use cpi_user::progress;
use cpi_user::report::file;
use cpi_user::report::html::series::WindowTotals;

/// `--store` default (systemd's `StateDirectory=cpi-bpf`).
pub(crate) const DEFAULT_DIR: &str = "/var/lib/cpi-bpf";
/// `--retain` default.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(24 * 3600);
/// `--store-max-mib` default.
pub(crate) const DEFAULT_MAX_MIB: u64 = 1024;
/// Windows listed at most: 100 000 is 11 days of 10 s windows; an index entry is about
/// 70 bytes, so the index stays under 8 MB whatever the directory holds.
pub const MAX_INDEX: usize = 100_000;

const PREFIX: &str = "w-";
const SUFFIX: &str = ".json.gz";
/// Temp files are hidden: every name starting with a dot.
const TEMP_PREFIX: &str = ".";

/// A store that cannot be opened, written or read; one line naming the directory. Each
/// names its cause once: as its `source()` (print the chain: [`cpi_user::chain`]), or
/// in its message when the cause is not carried ([`StoreError::Unsafe`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file-system operation on the store failed.
    #[error("store {}: {what}", .dir.display())]
    Io {
        /// The store directory.
        dir: PathBuf,
        /// What was being done ("not writable", "writing w-….json.gz", ...).
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// The store directory belongs to another user or others can write it.
    /// Its message is `store ` and the check's, which names the directory and the cause
    /// (so it is not also its `source()`).
    #[error("store {0}")]
    Unsafe(cpi_user::fsafe::DirError),
    /// The windows of a range cannot be merged (e.g. different modes).
    #[error("store {}", .dir.display())]
    Merge {
        /// The store directory.
        dir: PathBuf,
        /// Why cpi-user/src/profile/merge.rs refused.
        #[source]
        source: MergeError,
    },
    /// [`read_range`] found no readable window in the range.
    #[error("store {}: no windows between {since} and {until}", .dir.display())]
    NoWindows {
        /// The store directory.
        dir: PathBuf,
        /// The range's start (RFC 3339), or "the first".
        since: String,
        /// The range's end (RFC 3339), or "now".
        until: String,
    },
}

/// A window file in the store: its name, the window's times (from its name) and size.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StoredWindow {
    name: Box<str>,
    start: SystemTime,
    end: SystemTime,
    bytes: u64,
}

/// The writer side, owned by the agent.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    retain: Duration,
    max_bytes: u64,
    /// The reader group of the windows.
    group: Option<u32>,
    windows: Vec<StoredWindow>,
    /// Windows [`Sink::report`] failed to write since start.
    failures: u64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `w-<start>-<end>.json.gz` → (start, end).
fn parse_name(name: &str) -> Option<(SystemTime, SystemTime)> {
    let mid = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let (a, b) = mid.split_once('-')?;
    let t = |s: &str| Some(UNIX_EPOCH + Duration::from_millis(s.parse().ok()?));
    Some((t(a)?, t(b)?))
}

impl Store {
    /// Creates `dir` (0700) if needed, refuses it if another user owns it or others can
    /// write it, makes it 0700 (0750 and of `group` when a reader group is given),
    /// checks that a window can be written there (a probe file is written, fsync'd and
    /// removed), removes temp files a crash left, and lists the windows already stored.
    pub fn open(
        dir: &Path,
        retain: Duration,
        max_bytes: u64,
        group: Option<u32>,
    ) -> Result<Store, StoreError> {
        let err = |what: &str| {
            let what = what.to_string();
            move |source| StoreError::Io {
                dir: dir.to_path_buf(),
                what,
                source,
            }
        };
        cpi_user::fsafe::check_private_dir(dir).map_err(StoreError::Unsafe)?;
        if let Some(gid) = group {
            std::os::unix::fs::chown(dir, None, Some(gid))
                .map_err(err("cannot give it to the group"))?;
        }
        let mode = if group.is_some() { 0o750 } else { 0o700 };
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))
            .map_err(err("cannot chmod it"))?;
        let probe = dir.join(format!("{TEMP_PREFIX}probe-{}", std::process::id()));
        cpi_user::fsafe::create_new(&probe)
            .and_then(|mut f| f.write_all(b"probe").and_then(|_| f.sync_all()))
            .map_err(err("not writable"))?;
        fs::remove_file(&probe).map_err(err("not writable"))?;
        for entry in fs::read_dir(dir).map_err(err("cannot list it"))? {
            let entry = entry.map_err(err("cannot list it"))?;
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(Store {
            dir: dir.to_path_buf(),
            retain,
            max_bytes,
            group,
            windows: list(dir)?.0,
            failures: 0,
        })
    }

    /// Bytes of the windows stored.
    pub fn bytes(&self) -> u64 {
        self.windows.iter().map(|w| w.bytes).sum()
    }

    /// Writes `w` atomically, then applies retention (as of `w.end`).
    pub fn write(&mut self, w: &Window) -> Result<PathBuf, StoreError> {
        let dir = self.dir.clone();
        let err = |what: String| {
            let dir = dir.clone();
            move |source| StoreError::Io { dir, what, source }
        };
        let name = format!(
            "{PREFIX}{:013}-{:013}{SUFFIX}",
            unix_ms(w.start),
            unix_ms(w.end)
        );
        let dest = self.dir.join(&name);
        let mut bytes = 0;
        let mut write = || -> io::Result<()> {
            cpi_user::fsafe::replace(&dest, |f| {
                if let Some(gid) = self.group {
                    std::os::unix::fs::fchown(&*f, None, Some(gid))?;
                    f.set_permissions(fs::Permissions::from_mode(0o640))?;
                }
                // Level 1: a window is compressed every interval, within the CPU budget.
                let mut gz = GzEncoder::new(&mut *f, flate2::Compression::fast());
                file::write_json_compact(&w.profile, &mut gz)?;
                gz.finish()?;
                bytes = f.metadata()?.len();
                Ok(())
            })?;
            File::open(&self.dir)?.sync_all()
        };
        if let Err(e) = write() {
            return Err(err(format!("writing {name}"))(e));
        }
        self.windows.retain(|x| *x.name != *name);
        self.windows.push(StoredWindow {
            name: name.into(),
            start: w.start,
            end: w.end,
            bytes,
        });
        self.retain(w.end)?;
        Ok(dest)
    }

    /// Removes windows that ended before `now - retain`, then the oldest until the
    /// store holds at most `max_bytes`.
    pub fn retain(&mut self, now: SystemTime) -> Result<(), StoreError> {
        self.windows.sort_by_key(|w| (w.start, w.end));
        let cutoff = now.checked_sub(self.retain).unwrap_or(UNIX_EPOCH);
        let mut total = self.bytes();
        let mut keep = Vec::with_capacity(self.windows.len());
        let mut failed = None;
        for w in std::mem::take(&mut self.windows) {
            let newest = keep.is_empty() && total <= w.bytes;
            if (w.end < cutoff || total > self.max_bytes) && !newest {
                match fs::remove_file(self.dir.join(&*w.name)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        // Kept (and counted); the first failure is reported.
                        failed.get_or_insert((self.dir.join(&*w.name), e));
                        keep.push(w);
                        continue;
                    }
                    _ => total -= w.bytes,
                }
            } else {
                keep.push(w);
            }
        }
        self.windows = keep;
        match failed {
            Some((path, source)) => Err(StoreError::Io {
                dir: self.dir.clone(),
                what: format!("removing {}", path.display()),
                source,
            }),
            None => Ok(()),
        }
    }
}

/// The first sink: the store's bytes and failed writes are part of the status the
/// later sinks see.
impl Sink for Store {
    fn report(&mut self, window: &Window, status: &mut AgentStatus) -> Result<(), SinkError> {
        let written = self.write(window);
        if written.is_err() {
            self.failures += 1;
        }
        status.store_bytes = self.bytes();
        status.store_failures = self.failures;
        written.map(drop).map_err(SinkError::from)
    }
}

/// The windows in `dir`, oldest first (temp files and foreign files ignored): the newest
/// [`MAX_INDEX`], and how many older ones were left out.
fn list(dir: &Path) -> Result<(Vec<StoredWindow>, u64), StoreError> {
    let err = |source| StoreError::Io {
        dir: dir.to_path_buf(),
        what: "cannot list it".into(),
        source,
    };
    let mut out = Vec::new();
    let mut dropped = 0u64;
    let newest_first = |v: &mut Vec<StoredWindow>, dropped: &mut u64| {
        v.sort_unstable_by_key(|w| std::cmp::Reverse((w.start, w.end)));
        *dropped += v.len().saturating_sub(MAX_INDEX) as u64;
        v.truncate(MAX_INDEX);
    };
    for entry in fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some((start, end)) = parse_name(&name) else {
            continue;
        };
        let bytes = match entry.metadata() {
            Ok(m) => m.len(),
            // Removed by retention since it was listed.
            Err(_) => continue,
        };
        out.push(StoredWindow {
            name: name.into(),
            start,
            end,
            bytes,
        });
        if out.len() >= 2 * MAX_INDEX {
            newest_first(&mut out, &mut dropped);
        }
    }
    newest_first(&mut out, &mut dropped);
    out.reverse();
    Ok((out, dropped))
}

/// Reads one stored window: a regular file (opened without blocking), decompressed to at
/// most [`file::MAX_PROFILE_BYTES`].
fn read_window(path: &Path) -> Result<Profile, file::ProfileFileError> {
    let f = cpi_user::fsafe::open(path).map_err(|e| file::ProfileFileError::Io {
        path: path.to_path_buf(),
        error: io::Error::other(e.to_string()),
    })?;
    file::read_stream(GzDecoder::new(f), &path.display().to_string())
}

/// What [`read_range`] selects.
#[derive(Clone, Debug, Default)]
pub struct RangeQuery {
    /// Windows that end after this time.
    pub since: Option<SystemTime>,
    /// Windows that start before this time.
    pub until: Option<SystemTime>,
    /// Only processes with exactly this comm.
    pub comm: Option<String>,
}

/// The merged profile of a range and what went into it.
#[derive(Debug)]
pub struct RangeProfile {
    /// The merged profile (cpi-user/src/profile/merge.rs).
    pub profile: Profile,
    /// Windows merged (those skipped not counted).
    pub windows: usize,
    /// Start of the earliest window merged.
    pub first_start: SystemTime,
    /// End of the latest window merged.
    pub last_end: SystemTime,
    /// Windows that could not be read (each with why, the first [`MAX_NAMED_SKIPS`]):
    /// skipped, not fatal.
    pub skipped: Vec<(PathBuf, String)>,
    /// Windows skipped beyond those named in `skipped`.
    pub skipped_unnamed: u64,
    /// Older windows left out of the index ([`MAX_INDEX`]).
    pub not_indexed: u64,
    /// Each merged window's totals per comm, oldest first (the HTML report's chart).
    pub series: Vec<WindowTotals>,
}

/// Unreadable windows named one by one, at most; the rest are counted.
pub const MAX_NAMED_SKIPS: usize = 20;

/// Merges the windows of `dir` that overlap the query's range (one at a time: memory
/// holds the sums, not the windows).
pub fn read_range(dir: &Path, q: &RangeQuery) -> Result<RangeProfile, StoreError> {
    let (listed, not_indexed) = list(dir)?;
    let in_range: Vec<StoredWindow> = listed
        .into_iter()
        .filter(|w| q.since.is_none_or(|s| w.end > s) && q.until.is_none_or(|u| w.start < u))
        .collect();
    let mut merger = Merger::new(AnalysisOptions::default().sample_floor);
    let (mut skipped, mut skipped_unnamed) = (Vec::new(), 0);
    let (mut first, mut last, mut n) = (None, None, 0);
    let mut series = Vec::new();
    let shown = progress::stage(
        "merging",
        Some(in_range.len() as u64),
        progress::Unit::Count("windows"),
    );
    for (i, w) in in_range.iter().enumerate() {
        shown.update(i as u64);
        let path = dir.join(&*w.name);
        let mut p = match read_window(&path) {
            Ok(p) => p,
            Err(_) if skipped.len() >= MAX_NAMED_SKIPS => {
                skipped_unnamed += 1;
                continue;
            }
            Err(e) => {
                skipped.push((path, e.to_string()));
                continue;
            }
        };
        // The window's processes over the reader's bounds: left out, the rest merged.
        for why in std::mem::take(&mut p.unread) {
            match skipped.len() >= MAX_NAMED_SKIPS {
                true => skipped_unnamed += 1,
                false => skipped.push((path.clone(), why)),
            }
        }
        if let Some(c) = &q.comm {
            retain_processes(&mut p, |x| &x.comm == c);
        }
        merger.add(&p).map_err(|source| StoreError::Merge {
            dir: dir.to_path_buf(),
            source,
        })?;
        series.push(WindowTotals::of(&p, w.start, w.end));
        first.get_or_insert(w.start);
        last = Some(w.end);
        n += 1;
    }
    let (Some(first_start), Some(last_end)) = (first, last) else {
        let show = |t: Option<SystemTime>, none: &str| {
            t.map_or(none.to_string(), cpi_user::report::time::rfc3339_seconds)
        };
        return Err(StoreError::NoWindows {
            dir: dir.to_path_buf(),
            since: show(q.since, "the first"),
            until: show(q.until, "now"),
        });
    };
    let profile = merger.finish().map_err(|source| StoreError::Merge {
        dir: dir.to_path_buf(),
        source,
    })?;
    Ok(RangeProfile {
        profile,
        windows: n,
        first_start,
        last_end,
        skipped,
        skipped_unnamed,
        not_indexed,
        series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpi_user::profile::model::{
        EventInfo, EventUnit, LossReport, Measures, Mode, ProcessProfile, PROFILE_FORMAT_VERSION,
    };

    fn profile(comm: &str, samples: u64) -> Profile {
        Profile {
            format_version: PROFILE_FORMAT_VERSION,
            tool_version: "0".into(),
            mode: Mode::TimeProfile,
            mode_reason: "test".into(),
            command: vec![],
            duration_secs: 1.0,
            // Each window also sampled a process of another comm, 100 samples.
            events: vec![EventInfo {
                role: cpi_common::wire::EventRole::CpuClock,
                name: "cpu-clock".into(),
                period: 1_000_000,
                jitter: 0,
                thinning: 1,
                unit: EventUnit::Ns,
                samples: samples + 100,
                also: Vec::new(),
            }],
            perturbation: cpi_common::policy::Perturbation::User,
            range_window: 1,
            lost_samples: 0,
            lost: LossReport::default(),
            binaries: vec![],
            processes: vec![ProcessProfile {
                pid: 1,
                comm: comm.into(),
                identity: Default::default(),
                samples,
                branch_samples: 0,
                measures: Measures {
                    time_ns: Some(samples as f64 * 1e6),
                    cycles: None,
                    instructions: None,
                    cycles_rel_error: None,
                    instructions_rel_error: None,
                    cpi: None,
                },
                functions: vec![],
                calls: vec![],
                stacks: vec![],
            }],
            accuracy: None,
            recorded_on: None,
            cpi_withheld: None,
            unread: Vec::new(),
        }
    }

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cpi-store-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn windows_round_trip_and_ranges_merge() {
        let dir = temp("rt");
        let mut s = Store::open(&dir, Duration::from_secs(3600), 1 << 30, None).unwrap();
        for i in 0..5 {
            let w = Window {
                start: at(i * 10),
                end: at(i * 10 + 10),
                profile: profile(if i % 2 == 0 { "a" } else { "b" }, i + 1),
            };
            s.write(&w).unwrap();
        }
        // A temp file a crash left behind is ignored by readers, removed on open.
        fs::write(
            dir.join(format!("{TEMP_PREFIX}w-1-2{SUFFIX}")),
            b"\x1f\x8b junk",
        )
        .unwrap();
        assert_eq!(list(&dir).unwrap().0.len(), 5);
        let all = read_range(&dir, &RangeQuery::default()).unwrap();
        assert_eq!(
            (all.windows, all.first_start, all.last_end),
            (5, at(0), at(50))
        );
        assert_eq!(all.profile.duration_secs, 5.0);
        let by_comm: Vec<(String, u64)> = all
            .profile
            .processes
            .iter()
            .map(|p| (p.comm.clone(), p.samples))
            .collect();
        assert_eq!(by_comm, [("a".into(), 1 + 3 + 5), ("b".into(), 2 + 4)]);
        let q = RangeQuery {
            since: Some(at(25)),
            until: Some(at(41)),
            comm: Some("b".into()),
        };
        let r = read_range(&dir, &q).unwrap();
        assert_eq!((r.windows, r.first_start, r.last_end), (3, at(20), at(50)));
        assert_eq!(r.profile.processes.len(), 1);
        assert_eq!(r.profile.processes[0].samples, 4);
        // The header's event counts are those of the processes kept, not the windows'.
        let samples: Vec<u64> = r.profile.events.iter().map(|e| e.samples).collect();
        assert_eq!(samples, [4]);
        let all_samples: Vec<u64> = all.profile.events.iter().map(|e| e.samples).collect();
        assert_eq!(all_samples, [(1 + 2 + 3 + 4 + 5) + 5 * 100]);
        let q = RangeQuery {
            since: Some(at(1000)),
            ..Default::default()
        };
        assert!(matches!(
            read_range(&dir, &q),
            Err(StoreError::NoWindows { .. })
        ));
        Store::open(&dir, Duration::from_secs(1), 1, None).unwrap();
        assert!(fs::read_dir(&dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')));
        // A corrupt window is skipped with its reason, not fatal.
        fs::write(
            dir.join(format!("{PREFIX}0000000000001-0000000000002{SUFFIX}")),
            b"x",
        )
        .unwrap();
        let r = read_range(&dir, &RangeQuery::default()).unwrap();
        assert_eq!((r.windows, r.skipped.len()), (5, 1));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn retention_by_age_then_size_keeps_the_newest() {
        let dir = temp("ret");
        let mut s = Store::open(&dir, Duration::from_secs(30), 1 << 30, None).unwrap();
        for i in 0..6 {
            let w = Window {
                start: at(i * 10),
                end: at(i * 10 + 10),
                profile: profile("a", i),
            };
            s.write(&w).unwrap();
        }
        // At t=60 windows ending before t=30 are gone: [30,40) [40,50) [50,60) stay,
        // and [20,30) (ends at 30, not before).
        let left: Vec<SystemTime> = list(&dir).unwrap().0.iter().map(|w| w.start).collect();
        assert_eq!(left, [at(20), at(30), at(40), at(50)]);
        assert_eq!(
            s.bytes(),
            list(&dir).unwrap().0.iter().map(|w| w.bytes).sum::<u64>()
        );
        let one = list(&dir).unwrap().0[0].bytes;
        s.max_bytes = 2 * one + one / 2;
        s.retain(at(60)).unwrap();
        let left: Vec<SystemTime> = list(&dir).unwrap().0.iter().map(|w| w.start).collect();
        assert_eq!(left, [at(40), at(50)]);
        // The newest window stays even when it alone is over the bound.
        s.max_bytes = 1;
        s.retain(at(60)).unwrap();
        assert_eq!(list(&dir).unwrap().0.len(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_store_is_one_error_at_open() {
        let e = Store::open(Path::new("/proc/cpi-bpf-store"), DEFAULT_RETAIN, 1, None).unwrap_err();
        assert!(
            e.to_string().starts_with("store /proc/cpi-bpf-store: "),
            "{e}"
        );
    }
}
