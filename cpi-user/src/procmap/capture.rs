//! Capture while the process is alive: its mappings when it is first seen and again when
//! a sampled address misses them (an exec or a new mmap), and the files its executable
//! mappings map, opened at that moment through `/proc/PID/map_files/START-END` (the very
//! file mapped, even deleted or in another mount namespace) or `/proc/PID/root/PATH`, and
//! kept open, keyed by device + inode. Analysis ([`crate::binary::Symbolizer`]) reads
//! the captured file, so a process that has since exited, exec'd or had its binary
//! deleted is analysed from what it really ran.
//!
//! A zombie thread-group leader whose threads still run has empty `/proc/PID/maps`: the
//! maps (and `root`) of one of its live threads (`/proc/PID/task/TID/`) are used instead.
//!
//! Processes are keyed by (pid, start time): a reused pid does not inherit the mappings
//! of the process that had it before. Open files are bounded in number
//! ([`MAX_OPEN_FILES`]); beyond it, files are found by path at analysis time.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{parse_lines, MappedObject, ProcessMaps};

/// Re-read a process's maps on a miss at most this often (a genuinely unmapped address
/// must not turn every sample into a `/proc` read).
pub const REREAD_EVERY: Duration = Duration::from_millis(100);

/// At most this many captured files are held open (one descriptor each).
pub const MAX_OPEN_FILES: usize = 512;

/// Identity of a mapped file: device (major, minor) and inode, as `/proc/PID/maps` shows
/// them. Never a path: a path can name another file by the time it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl ObjectId {
    /// The identity of an opened file (`st_dev` split the way the kernel encodes it).
    fn of(meta: &std::fs::Metadata) -> ObjectId {
        let dev = meta.dev();
        ObjectId {
            major: (((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)) as u32,
            minor: ((dev & 0xff) | ((dev >> 12) & !0xff)) as u32,
            inode: meta.ino(),
        }
    }
}

/// A mapped file held open since the process mapped it.
#[derive(Clone, Debug)]
pub struct CapturedFile {
    pub id: ObjectId,
    /// The path the process mapped it under (in its own mount namespace).
    pub path: PathBuf,
    /// The kernel marked it `(deleted)` when the maps were read.
    pub deleted: bool,
    file: Arc<File>,
}

impl CapturedFile {
    /// The whole file's bytes.
    pub fn read_all(&self) -> std::io::Result<Vec<u8>> {
        let len = self.file.metadata()?.len();
        let mut data = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
        self.file.read_exact_at(&mut data, 0)?;
        Ok(data)
    }
}

impl PartialEq for CapturedFile {
    fn eq(&self, o: &Self) -> bool {
        (self.id, &self.path, self.deleted) == (o.id, &o.path, o.deleted)
    }
}
impl Eq for CapturedFile {}
impl std::hash::Hash for CapturedFile {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.id, &self.path, self.deleted).hash(h)
    }
}
impl PartialOrd for CapturedFile {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for CapturedFile {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.id, &self.path, self.deleted).cmp(&(o.id, &o.path, o.deleted))
    }
}

/// What is known of one process.
#[derive(Debug)]
struct Tracked {
    /// Start time (clock ticks after boot, `/proc/PID/stat` field 22) when last read.
    start: Option<u64>,
    read_at: Instant,
}

/// Mappings and files of the processes seen so far (see the module doc).
#[derive(Debug, Default)]
pub struct Tracker {
    procs: HashMap<u32, Tracked>,
    files: HashMap<ObjectId, Arc<File>>,
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `pid`'s maps are to be read now: on first sight, or on a `miss` (a
    /// sampled address in none of its known mappings) at most every [`REREAD_EVERY`].
    pub fn due(&self, pid: u32, miss: bool) -> bool {
        self.procs
            .get(&pid)
            .is_none_or(|t| miss && t.read_at.elapsed() >= REREAD_EVERY)
    }

    /// Reads `pid`'s mappings now and captures the files of its executable ones.
    /// Mappings of `older` (what was read before) that the new ones do not cover are
    /// kept, unless the pid now belongs to another process. `None` when the process is
    /// gone: the caller keeps what it had.
    pub fn read(&mut self, pid: u32, older: Option<&ProcessMaps>) -> Option<ProcessMaps> {
        let start = start_time(pid);
        let previous = self.procs.insert(
            pid,
            Tracked {
                start,
                read_at: Instant::now(),
            },
        );
        let (base, text) = maps_text(pid)?;
        let lines = parse_lines(&text).ok()?;
        let mut mappings = Vec::with_capacity(lines.len());
        for (mut m, id) in lines {
            if m.executable && id.inode != 0 {
                if let MappedObject::File { path, deleted } = &m.object {
                    if let Some(file) = self.open(pid, &base, m.start, m.end, path, id) {
                        m.object = MappedObject::Captured(CapturedFile {
                            id,
                            path: path.clone(),
                            deleted: *deleted,
                            file,
                        });
                    }
                }
            }
            mappings.push(m);
        }
        let mut maps = ProcessMaps { mappings };
        let same_process = previous.is_some_and(|p| p.start == start);
        if let Some(o) = older.filter(|_| same_process) {
            maps.keep_older(o);
        }
        Some(maps)
    }

    /// The open file `id`, opened now through `/proc` if not held yet.
    fn open(
        &mut self,
        pid: u32,
        base: &Path,
        start: u64,
        end: u64,
        path: &Path,
        id: ObjectId,
    ) -> Option<Arc<File>> {
        if let Some(f) = self.files.get(&id) {
            return Some(Arc::clone(f));
        }
        if self.files.len() >= MAX_OPEN_FILES {
            return None;
        }
        // map_files is the mapped file itself; it exists only at the process level.
        let by_map = File::open(format!("/proc/{pid}/map_files/{start:x}-{end:x}")).ok();
        let file = by_map.or_else(|| {
            let f = File::open(
                base.join("root")
                    .join(path.strip_prefix("/").unwrap_or(path)),
            )
            .ok()?;
            // Only the file that was mapped: the path may name another one by now.
            (ObjectId::of(&f.metadata().ok()?) == id).then_some(f)
        })?;
        let file = Arc::new(file);
        self.files.insert(id, Arc::clone(&file));
        Some(file)
    }
}

/// The process's name: `/proc/PID/comm`, else the file name of its main executable
/// mapping (the process is gone), else `:PID` (as perf names unknown processes). Never
/// empty.
pub fn comm(pid: u32, maps: Option<&ProcessMaps>) -> String {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        let s = s.trim_end();
        if !s.is_empty() {
            return s.to_string();
        }
    }
    maps.and_then(|m| {
        m.mappings
            .iter()
            .filter(|m| m.executable)
            .find_map(|m| m.object.file())
            .and_then(|(p, _)| p.file_name())
            .map(|n| n.to_string_lossy().chars().take(15).collect())
    })
    .unwrap_or_else(|| format!(":{pid}"))
}

/// The maps text of `pid` and the `/proc` directory it came from: the process's own, or,
/// for a zombie leader (empty maps), that of a live thread.
fn maps_text(pid: u32) -> Option<(PathBuf, String)> {
    let own = PathBuf::from(format!("/proc/{pid}"));
    let text = std::fs::read_to_string(own.join("maps")).ok()?;
    if !text.trim().is_empty() {
        return Some((own, text));
    }
    std::fs::read_dir(own.join("task"))
        .ok()?
        .filter_map(Result::ok)
        .find_map(|t| {
            let text = std::fs::read_to_string(t.path().join("maps")).ok()?;
            (!text.trim().is_empty()).then(|| (t.path(), text))
        })
}

/// Field 22 of `/proc/PID/stat`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_text_is_captured_by_device_and_inode() {
        let me = std::process::id();
        let here = own_text_is_captured_by_device_and_inode as *const () as u64;
        let mut t = Tracker::new();
        assert!(t.due(me, false));
        let maps = t.read(me, None).unwrap();
        assert!(!t.due(me, true), "a miss right after a read waits");
        let m = maps.find(here).unwrap();
        let MappedObject::Captured(c) = &m.object else {
            panic!("own text not captured: {m:?}");
        };
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        assert_eq!(c.id, ObjectId::of(&exe));
        assert_eq!(c.read_all().unwrap().len() as u64, exe.len());
        assert!(!comm(me, Some(&maps)).is_empty());
        assert_eq!(comm(u32::MAX, None), format!(":{}", u32::MAX));
    }

    #[test]
    fn older_mappings_are_kept_where_the_new_ones_leave_room() {
        let old = ProcessMaps::parse(
            "1000-2000 r-xp 00000000 fd:01 1 /old\n5000-6000 r-xp 00000000 fd:01 2 /gone\n",
        )
        .unwrap();
        let mut new = ProcessMaps::parse("1800-3000 r-xp 00000000 fd:01 3 /new\n").unwrap();
        new.keep_older(&old);
        let names: Vec<String> = new
            .mappings
            .iter()
            .map(|m| m.object.display_name())
            .collect();
        assert_eq!(names, ["/new", "/gone"], "the overlapped /old is replaced");
        assert_eq!(new.find(0x5800).unwrap().object.display_name(), "/gone");
    }
}
