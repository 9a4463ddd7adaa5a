//! Separate debug files, found as gdb finds them: a binary stripped of its symbol table
//! or line tables takes them from a file that holds them
//! (`objcopy --only-keep-debug`, Debian's `-dbgsym` packages), looked up
//!
//! 1. by build-id: `/usr/lib/debug/.build-id/xx/yyyy….debug`, accepted when its own
//!    build-id is the binary's;
//! 2. by `.gnu_debuglink` name: next to the binary, in `.debug/` beside it, and under
//!    `/usr/lib/debug/` + the binary's directory, accepted when its CRC-32 is the one the
//!    link records.
//!
//! Paths resolve inside a root directory ([`DebugRoot`], `/` by default) and files are
//! opened with cpi-user/src/fsafe/mod.rs (never blocking, regular files only, never
//! leaving the root); a debug file is mapped like the binary (cpi-user/src/fsafe/sys/map.rs).

use std::path::{Component, Path, PathBuf};

use object::Object;

use crate::fsafe::map::GuardedMap;

/// The global debug directory, as Debian and gdb have it.
const DEBUG_DIR: &str = "/usr/lib/debug";
/// Bytes read for debug-link CRCs per binary, all candidates together: each CRC reads
/// its whole file, and the candidates beside the binary are files its user chose. Sparse
/// 4 GiB files there once cost a one-shot 18.7 s of CPU and 4.21 GB of RSS, and stalled
/// an agent's window past 10 s. 1 GiB covers the debug files of the largest
/// libraries we know of (libLLVM's, with compressed sections, is a few hundred MB);
/// past it the candidate is refused, said once per binary. A build-id match costs no
/// CRC and is tried first.
const MAX_CRC_BYTES: u64 = 1 << 30;
/// The CRC is read in chunks of this size through `pread`, not through a mapping, so a
/// refused or mismatched candidate leaves nothing in this process's resident set.
const CRC_CHUNK: usize = 1 << 20;

/// The directory debug-file paths resolve in: `/`, or a test's tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugRoot(pub PathBuf);

impl Default for DebugRoot {
    fn default() -> Self {
        DebugRoot(PathBuf::from("/"))
    }
}

/// A separate debug file, mapped.
#[derive(Debug)]
pub(crate) struct DebugFile {
    /// Where it was found (inside the root).
    pub path: PathBuf,
    pub(super) map: GuardedMap,
    /// Who could have written it (its line tables name source files).
    pub(super) owner: crate::fsafe::behalf::Owner,
}

/// What a binary says about its debug file.
struct Wanted<'d> {
    build_id: Option<&'d [u8]>,
    /// `.gnu_debuglink`: file name and CRC-32.
    link: Option<(&'d str, u32)>,
}

/// The debug file of the binary at `path` (bytes `data`), when it lacks a symbol table
/// or line tables and one is found; `None` otherwise (the common case, not an error).
pub fn find(path: &Path, data: &[u8], root: &DebugRoot) -> Option<DebugFile> {
    let file = object::File::parse(data).ok()?;
    if file.symbol_table().is_some() && file.section_by_name(".debug_line").is_some() {
        return None;
    }
    let wanted = Wanted {
        build_id: file.build_id().ok().flatten().filter(|b| !b.is_empty()),
        link: file
            .gnu_debuglink()
            .ok()
            .flatten()
            .and_then(|(name, crc)| Some((std::str::from_utf8(name).ok()?, crc)))
            .filter(|(name, _)| plain_name(name)),
    };
    let mut crc_budget = MAX_CRC_BYTES;
    candidates(path, &wanted)
        .into_iter()
        .find_map(|(cand, check)| {
            let f = crate::fsafe::open_in_root(&root.0, &cand).ok()?;
            let owner = crate::fsafe::behalf::Owner::of(&f.metadata().ok()?);
            if let Check::Crc(crc) = check {
                if crc_within(&f, &cand, &mut crc_budget)? != crc {
                    log::debug!("{}: not {}'s debug file", cand.display(), path.display());
                    return None;
                }
            }
            let map = super::map_file(&f).ok()?;
            let ok = match check {
                Check::BuildId(id) => {
                    object::File::parse(map.bytes())
                        .ok()
                        .and_then(|d| d.build_id().ok().flatten())
                        == Some(id)
                }
                Check::Crc(_) => true,
            };
            if !ok || map.truncated() {
                log::debug!("{}: not {}'s debug file", cand.display(), path.display());
                return None;
            }
            log::debug!("{}: symbols from {}", path.display(), cand.display());
            Some(DebugFile {
                path: cand,
                map,
                owner,
            })
        })
}

/// The CRC-32 of `f` (the debug-link candidate `cand`), read within what is left of
/// `budget` and taken from it; `None` when it is larger than that (said, and the next
/// candidate, e.g. the global directory's, is still tried) or unreadable.
fn crc_within(f: &std::fs::File, cand: &Path, budget: &mut u64) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let len = f.metadata().ok()?.len();
    if len > *budget {
        crate::fsafe::budget::refused(crate::fsafe::budget::Reader::DebugLink);
        log::warn!(
            "{}: debug-link candidate not read: {len} bytes, over what is left of the {MAX_CRC_BYTES}-byte bound on debug-link CRCs",
            crate::fsafe::escape(&cand.to_string_lossy())
        );
        return None;
    }
    *budget -= len;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CRC_CHUNK];
    let mut at = 0u64;
    while at < len {
        // A file grown meanwhile is read no further than the length the budget paid for.
        let want = usize::try_from(len - at).map_or(CRC_CHUNK, |left| left.min(CRC_CHUNK));
        let n = f.read_at(&mut buf[..want], at).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Some(hasher.finalize())
}

/// How a candidate proves it belongs to the binary.
#[derive(Clone, Copy)]
enum Check<'d> {
    BuildId(&'d [u8]),
    Crc(u32),
}

/// gdb's order: build-id first, then the debuglink in the binary's directory, its
/// `.debug/`, and the global directory.
fn candidates<'d>(path: &Path, w: &Wanted<'d>) -> Vec<(PathBuf, Check<'d>)> {
    let mut out = Vec::new();
    if let Some(id) = w.build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        out.push((
            Path::new(DEBUG_DIR).join(format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..])),
            Check::BuildId(id),
        ));
    }
    if let (Some((name, crc)), Some(dir)) = (w.link, path.parent()) {
        let global = Path::new(DEBUG_DIR).join(dir.strip_prefix("/").unwrap_or(dir));
        for d in [dir.to_path_buf(), dir.join(".debug"), global] {
            out.push((d.join(name), Check::Crc(crc)));
        }
    }
    out
}

/// A debuglink is a file name, not a path.
fn plain_name(name: &str) -> bool {
    let mut c = Path::new(name).components();
    matches!((c.next(), c.next()), (Some(Component::Normal(_)), None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::testbin::debug_build;
    use crate::binary::{Binary, SourceLines};
    use std::process::Command;

    fn run(cmd: &mut Command) {
        let out = cmd.output().expect("binutils (cargo xtask setup)");
        assert!(out.status.success(), "{cmd:?}: {out:?}");
    }

    /// `exe` split as packagers do: `dir/prog` stripped, with a debuglink to the debug
    /// file, which is at `dir/prog.debug`.
    fn split(exe: &Path, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let prog = dir.join("prog");
        std::fs::copy(exe, &prog).unwrap();
        let debug = dir.join("prog.debug");
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&prog)
            .arg(&debug));
        run(Command::new("strip").arg(&prog));
        run(Command::new("objcopy")
            .current_dir(dir)
            .arg("--add-gnu-debuglink=prog.debug")
            .arg("prog"));
        prog
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cpi-debugfile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The stripped binary names and places its functions, and gives their source
    /// lines, as the unstripped one does.
    fn same_as(full: &Binary, split: &Binary) {
        assert!(!split.stripped(), "{:?}", split.path);
        let (fl, sl) = (SourceLines::new(full), SourceLines::new(split));
        for name in ["sum_loop", "classify", "fib", "main"] {
            let f = full.function_by_name(name).unwrap();
            let g = split.function_at(f.start).unwrap();
            assert_eq!((g.name.as_str(), g.start, g.size), (name, f.start, f.size));
            assert!(
                fl.at(f.start).is_some(),
                "{name}: no line in the full build"
            );
            assert_eq!(sl.at(f.start), fl.at(f.start), "{name}");
        }
    }

    #[test]
    fn debuglink_next_to_the_binary_and_in_dot_debug() {
        let Some(exe) = debug_build("analysis_loops") else {
            return;
        };
        let dir = temp("link");
        let prog = split(&exe, &dir);
        let full = Binary::open(&exe).unwrap();
        let b = Binary::open(&prog).unwrap();
        assert_eq!(
            b.debug_file.as_deref(),
            Some(dir.join("prog.debug").as_path())
        );
        same_as(&full, &b);

        std::fs::create_dir(dir.join(".debug")).unwrap();
        std::fs::rename(dir.join("prog.debug"), dir.join(".debug/prog.debug")).unwrap();
        let b = Binary::open(&prog).unwrap();
        assert_eq!(
            b.debug_file.as_deref(),
            Some(dir.join(".debug/prog.debug").as_path())
        );
        same_as(&full, &b);

        // Another file under the linked name: its CRC differs, it is not used.
        std::fs::copy(&exe, dir.join(".debug/prog.debug")).unwrap();
        let b = Binary::open(&prog).unwrap();
        assert_eq!(b.debug_file, None);
        assert!(b.stripped());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn build_id_directory_under_a_root() {
        let Some(exe) = debug_build("analysis_loops") else {
            return;
        };
        let dir = temp("build-id");
        let prog = split(&exe, &dir.join("bin"));
        let full = Binary::open(&exe).unwrap();
        let id = full.build_id.clone().expect("gcc links with a build-id");
        let root = dir.join("root");
        let ids = root.join(format!("usr/lib/debug/.build-id/{}", &id[..2]));
        std::fs::create_dir_all(&ids).unwrap();
        let at = ids.join(format!("{}.debug", &id[2..]));
        // Only the build-id path: the debuglink's places are empty.
        std::fs::rename(dir.join("bin/prog.debug"), &at).unwrap();
        let r = DebugRoot(root.clone());
        let b = Binary::open_with_debug(&prog, &r).unwrap();
        assert_eq!(
            b.debug_file.as_deref(),
            Some(Path::new(&format!(
                "/usr/lib/debug/.build-id/{}/{}.debug",
                &id[..2],
                &id[2..]
            )))
        );
        same_as(&full, &b);
        // Not found from `/`.
        assert_eq!(Binary::open(&prog).unwrap().debug_file, None);

        // A debug file of another build at that path: refused.
        let other = debug_build("hot_cold").unwrap();
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&other)
            .arg(&at));
        let b = Binary::open_with_debug(&prog, &r).unwrap();
        assert_eq!(b.debug_file, None);
        assert!(b.stripped());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debuglink_names_that_are_paths_are_refused() {
        for (name, ok) in [
            ("prog.debug", true),
            ("../../etc/shadow", false),
            ("/etc/shadow", false),
            ("a/b", false),
            ("..", false),
            ("", false),
        ] {
            assert_eq!(plain_name(name), ok, "{name}");
        }
    }

    /// A CRC reads no more than the budget left, and takes what it read from it.
    #[test]
    fn crcs_are_read_within_the_budget() {
        let dir = temp("crc-budget");
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let bytes: Vec<u8> = (0..3 * CRC_CHUNK + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let len = bytes.len() as u64;
        let mut small = len - 1;
        assert_eq!(crc_within(&f, &p, &mut small), None);
        assert_eq!(small, len - 1, "a refused file costs nothing");
        let mut big = 2 * len;
        assert_eq!(crc_within(&f, &p, &mut big), Some(crc32fast::hash(&bytes)));
        assert_eq!(big, len);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Row "`.gnu_debuglink` naming 4 GiB sparse files beside the binary and in
    /// `.debug/`" of the hostile-host attacks: both are refused unread, and the real debug file in the
    /// global directory is still found.
    #[test]
    fn huge_debuglink_candidates_are_refused_unread() {
        let Some(exe) = debug_build("analysis_loops") else {
            return;
        };
        let dir = temp("huge-link");
        let bin = dir.join("root/home/u");
        let prog = split(&exe, &bin);
        let global = dir.join("root/usr/lib/debug/home/u");
        std::fs::create_dir_all(&global).unwrap();
        std::fs::rename(bin.join("prog.debug"), global.join("prog.debug")).unwrap();
        std::fs::create_dir_all(bin.join(".debug")).unwrap();
        for planted in [bin.join("prog.debug"), bin.join(".debug/prog.debug")] {
            let f = std::fs::File::create(planted).unwrap();
            f.set_len(4 << 30).unwrap();
        }
        let root = DebugRoot(dir.join("root"));
        let data = std::fs::read(&prog).unwrap();
        let found = find(Path::new("/home/u/prog"), &data, &root).expect("the global file");
        assert_eq!(found.path, Path::new("/usr/lib/debug/home/u/prog.debug"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
