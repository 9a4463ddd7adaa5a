//! `cpi-bpf diff`'s test program (tests/programs/diff_pair.c) in its two builds, and
//! its simulated profiles, for the diff tests of tests/tests/it/report_diff.rs and
//! report_html.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tracer::tool_dir;
use crate::{compile_c, cpi_bpf, output_ok};

/// Rounds of a simulation: 2 × 10⁷ loop iterations, ≈ 4·10⁴ cycle samples per
/// function (1.5 s a simulation).
pub const ROUNDS: &str = "100";

/// The base build (dir/a/diff_pair) and the changed one, whose alpha_work does 130 %
/// of the work (dir/b/diff_pair): one name, as two builds of one program have.
pub fn builds(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let base = compile_c("diff_pair.c", &a, "diff_pair", &[])?;
    let changed = compile_c("diff_pair.c", &b, "diff_pair", &["-DALPHA_PERCENT=130"])?;
    Some((base, changed))
}

/// `simulate --seed SEED` of `exe` for `rounds`, saved as JSON in `out`.
pub fn simulate(exe: &Path, rounds: &str, seed: u64, out: &Path) {
    output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--quiet", "--format", "json", "--seed"])
            .arg(seed.to_string())
            .arg("-o")
            .arg(out)
            .arg("--")
            .arg(exe)
            .arg(rounds),
    );
}

/// Three profiles in `dir`: the base build with seeds 1 and 2 (a1, a2) and the changed
/// build with seed 3 (b1); `None` (the reason said) without the tracer or a compiler.
pub fn profiles(dir: &Path) -> Option<[PathBuf; 3]> {
    if let Err(why) = tool_dir() {
        crate::skip(&why);
        return None;
    }
    let (base, changed) = builds(dir)?;
    let out = ["a1", "a2", "b1"].map(|name| dir.join(format!("{name}.json")));
    std::thread::scope(|s| {
        s.spawn(|| simulate(&base, ROUNDS, 1, &out[0]));
        s.spawn(|| simulate(&base, ROUNDS, 2, &out[1]));
        s.spawn(|| simulate(&changed, ROUNDS, 3, &out[2]));
    });
    Some(out)
}
