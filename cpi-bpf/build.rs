//! `CPI_BPF_COMMIT` for `--version` (the commit built).

fn main() {
    commit();
}

/// `CPI_BPF_COMMIT` for `--version`: the commit built, `-dirty` with local changes,
/// `unknown` outside a git checkout (a source tarball).
fn commit() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c)
            if git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty()) =>
        {
            format!("{c}-dirty")
        }
        Some(c) => c,
        None => "unknown".into(),
    };
    // HEAD's log moves with every commit and checkout of this work tree.
    if let Some(log) = git(&["rev-parse", "--git-path", "logs/HEAD"]) {
        println!("cargo:rerun-if-changed={log}");
    }
    println!("cargo:rustc-env=CPI_BPF_COMMIT={commit}");
}
