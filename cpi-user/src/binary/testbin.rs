//! Test fixtures: C programs from `tests/programs/` compiled with gcc -O2 into a plain
//! (non-PIE), a PIE and stripped copies of both. Built once per test process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

pub struct TestProgram {
    pub plain: PathBuf,
    pub stripped: PathBuf,
    pub pie: PathBuf,
    pub pie_stripped: PathBuf,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Builds into `target/test-programs/analysis/` once per source change: each output
/// is written under a temporary name and renamed, so concurrent test processes never
/// see a half-written binary and nothing piles up in /tmp.
fn build(name: &str) -> Result<TestProgram, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let src = root.join("tests/programs").join(format!("{name}.c"));
    let dir = root.join("target/test-programs/analysis");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let t = TestProgram {
        plain: dir.join(name),
        stripped: dir.join(format!("{name}.stripped")),
        pie: dir.join(format!("{name}.pie")),
        pie_stripped: dir.join(format!("{name}.pie.stripped")),
    };
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let src_time = mtime(&src).ok_or_else(|| format!("{}: missing", src.display()))?;
    let fresh = |p: &Path| mtime(p).is_some_and(|t| t >= src_time);
    let tmp = |p: &Path| PathBuf::from(format!("{}.tmp{}", p.display(), std::process::id()));
    let publish = |from: &Path, to: &Path| {
        std::fs::rename(from, to).map_err(|e| format!("{}: {e}", to.display()))
    };
    let export = "-Wl,--export-dynamic-symbol=exported_entry";
    for (out, pie) in [(&t.plain, false), (&t.pie, true)] {
        if fresh(out) {
            continue;
        }
        let (pic, link) = if pie {
            ("-fPIE", "-pie")
        } else {
            ("-fno-PIE", "-no-pie")
        };
        run(Command::new("gcc")
            .args(["-O2", "-g0", pic, link, export, "-o"])
            .arg(tmp(out))
            .arg(&src))?;
        publish(&tmp(out), out)?;
    }
    for (from, to) in [(&t.plain, &t.stripped), (&t.pie, &t.pie_stripped)] {
        if fresh(to) && mtime(to) >= mtime(from) {
            continue;
        }
        run(Command::new("strip").arg("-o").arg(tmp(to)).arg(from))?;
        publish(&tmp(to), to)?;
    }
    Ok(t)
}

impl TestProgram {
    /// The compiled program, or `None` after printing why it is unavailable.
    pub fn get(name: &str) -> Option<&'static TestProgram> {
        static BUILT: OnceLock<Mutex<HashMap<String, Result<&'static TestProgram, String>>>> =
            OnceLock::new();
        let mut m = BUILT.get_or_init(Default::default).lock().ok()?;
        let r = m
            .entry(name.to_string())
            .or_insert_with(|| build(name).map(|t| &*Box::leak(Box::new(t))));
        match r {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("skipped: cannot build test program {name} with gcc: {e}");
                None
            }
        }
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

/// `/proc/PID/maps` text mapping `bin`'s PT_LOADs at `base` + vaddr (page-aligned, as
/// ld.so does), plus an anonymous rwx page at 0x7f0000000000 and a `[vdso]`.
pub fn maps_for(
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
            "{start:x}-{end:x} r{x}p {:08x} 00:00 1 {}\n",
            s.offset & !0xfff,
            path.display()
        );
    }
    text += "7f0000000000-7f0000001000 rwxp 00000000 00:00 0\n";
    text += "7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]\n";
    crate::procmap::ProcessMaps::parse(&text).expect("well-formed maps")
}
