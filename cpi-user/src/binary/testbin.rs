//! Test fixtures: C programs from `tests/programs/` compiled with gcc -O2 into a plain
//! (non-PIE), a PIE and stripped copies of both, by `tests/src/programs.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The one compile-and-cache helper of the workspace's tests (std only).
#[path = "../../../tests/src/programs.rs"]
mod programs;
pub use programs::skip;

pub(crate) struct TestProgram {
    pub plain: PathBuf,
    pub stripped: PathBuf,
    pub pie: PathBuf,
    pub pie_stripped: PathBuf,
}

/// Builds through `tests/src/programs.rs` (cached in `target/test-programs/`); `None`
/// after it printed why.
fn build(name: &str) -> Option<TestProgram> {
    let source = format!("{name}.c");
    let export = "-Wl,--export-dynamic-symbol=exported_entry";
    let plain = programs::compile(&source, &["-O2", "-g0", "-fno-PIE", "-no-pie", export])?;
    let pie = programs::compile(&source, &["-O2", "-g0", "-fPIE", "-pie", export])?;
    Some(TestProgram {
        stripped: programs::stripped(&plain)?,
        pie_stripped: programs::stripped(&pie)?,
        plain,
        pie,
    })
}

/// `tests/programs/NAME.c` built non-PIE with `-O2 -g` (DWARF line tables), or `None`
/// after printing why.
pub(crate) fn debug_build(name: &str) -> Option<PathBuf> {
    programs::compile(&format!("{name}.c"), &["-O2", "-g", "-fno-PIE", "-no-pie"])
}

impl TestProgram {
    /// The compiled program, or `None` after printing why it is unavailable.
    pub fn get(name: &str) -> Option<&'static TestProgram> {
        static BUILT: OnceLock<Mutex<HashMap<String, Option<&'static TestProgram>>>> =
            OnceLock::new();
        let mut m = BUILT.get_or_init(Default::default).lock().ok()?;
        *m.entry(name.to_string())
            .or_insert_with(|| build(name).map(|t| &*Box::leak(Box::new(t))))
    }

    /// Address of `sym` according to `nm` (an independent reader of the symbol table).
    pub fn nm(&self, sym: &str) -> Option<u64> {
        let out = Command::new("nm").arg(&self.plain).output().ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let (a, _, n) = (f.next()?, f.next()?, f.next()?);
            (n == sym).then(|| u64::from_str_radix(a, 16).ok())?
        })
    }
}

/// `path`'s device and inode as `/proc/PID/maps` shows them (`fe:00 247030`).
pub(crate) fn maps_dev_ino(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).expect("test binary exists");
    format!(
        "{:x}:{:02x} {}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    )
}

/// `/proc/PID/maps` text mapping `bin`'s PT_LOADs at `base` + vaddr (page-aligned, as
/// ld.so does), plus an anonymous rwx page at 0x7f0000000000 and a `[vdso]`.
pub(crate) fn maps_for(
    path: &Path,
    bin: &crate::binary::Binary,
    base: u64,
) -> crate::procmap::ProcessMaps {
    let mut text = String::new();
    for s in &bin.segments {
        let start = base + (s.vaddr & !0xfff);
        let end = base + ((s.vaddr + s.memsz + 0xfff) & !0xfff);
        let x = if s.executable { 'x' } else { '-' };
        text += &format!(
            "{start:x}-{end:x} r{x}p {:08x} {} {}\n",
            s.offset & !0xfff,
            maps_dev_ino(path),
            path.display()
        );
    }
    text += "7f0000000000-7f0000001000 rwxp 00000000 00:00 0\n";
    text += "7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]\n";
    crate::procmap::ProcessMaps::parse(&text).expect("well-formed maps")
}

/// A copy of `src` with `pad` zero bytes appended, in a fresh directory named after
/// `tag` (removed on drop): a file a test may rewrite under a live `Binary`.
pub struct Scratch {
    pub dir: PathBuf,
    pub path: PathBuf,
}

impl Scratch {
    pub fn copy(src: &Path, tag: &str, pad: usize) -> Scratch {
        let dir = std::env::temp_dir().join(format!("cpi-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bin");
        let mut bytes = std::fs::read(src).unwrap();
        bytes.resize(bytes.len() + pad, 0);
        std::fs::write(&path, &bytes).unwrap();
        Scratch { dir, path }
    }

    /// Runs `read` while another thread rewrites the file in place: at each of `offs`
    /// the two bytes of `é`, whose second byte alternates with `A` (invalid UTF-8).
    pub(crate) fn flipping<T>(&self, offs: &[u64], read: impl FnOnce() -> T) -> T {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .unwrap();
        for &off in offs {
            f.write_at(b"\xc3\xa9", off).unwrap();
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    for b in [b"A", b"\xa9"] {
                        for &off in offs {
                            f.write_at(b, off + 1).unwrap();
                        }
                    }
                }
            });
            let r = read();
            stop.store(true, Ordering::Relaxed);
            r
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
