//! `cargo xtask setup`'s kernel step: Debian's own cloud kernels (bullseye 5.10, bookworm
//! 6.1, trixie 6.12), which tests/tests/it/kernels.rs boots in QEMU. Each suite gets a
//! private apt state (its own sources list and lists directory under
//! `target/kernels/apt-SUITE/`, removed once the kernel is out), so the system's apt is
//! untouched; the kernel package is
//! fetched with `apt-get download` and unpacked with `dpkg -x`, and its `boot/vmlinuz-*` is
//! kept as `target/kernels/SUITE/vmlinuz`. A kernel already there is not fetched again.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

use super::setup::{output, status};

/// The suites whose kernels the matrix boots (tests/tests/it/kernels.rs names the same).
pub const SUITES: &[&str] = &["bullseye", "bookworm", "trixie"];

/// Where the kernels are kept: `target/kernels` in the workspace (or `CARGO_TARGET_DIR`).
pub fn dir() -> PathBuf {
    super::setup::target_dir().join("kernels")
}

pub fn fetch() -> anyhow::Result<()> {
    for suite in SUITES {
        fetch_suite(suite).with_context(|| format!("fetching Debian {suite}'s cloud kernel"))?;
    }
    Ok(())
}

fn fetch_suite(suite: &str) -> anyhow::Result<()> {
    let out = dir().join(suite);
    let vmlinuz = out.join("vmlinuz");
    if vmlinuz.exists() {
        println!("setup: {suite} kernel present ({})", vmlinuz.display());
        return Ok(());
    }
    let state = dir().join(format!("apt-{suite}"));
    std::fs::create_dir_all(state.join("lists/partial"))?;
    std::fs::create_dir_all(state.join("archives/partial"))?;
    let sources = state.join("sources.list");
    std::fs::write(
        &sources,
        format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian {suite} main\n"
        ),
    )?;
    let private = |cmd: &str| {
        let mut c = Command::new(cmd);
        c.arg("-o")
            .arg(format!("Dir::Etc::SourceList={}", sources.display()))
            .args(["-o", "Dir::Etc::SourceParts=/dev/null"])
            .arg("-o")
            .arg(format!(
                "Dir::State::Lists={}",
                state.join("lists").display()
            ))
            .arg("-o")
            .arg(format!("Dir::Cache={}", state.display()))
            .arg("-o")
            .arg(format!(
                "Dir::Cache::archives={}",
                state.join("archives").display()
            ))
            // Downloads land in our own directory, which apt's `_apt` user cannot enter.
            .args(["-o", "APT::Sandbox::User=root"]);
        c
    };
    println!(
        "setup: apt-get update ({suite}, private lists in {})",
        state.display()
    );
    status(private("apt-get").args(["update", "-qq"]))?;
    // The metapackage names the current ABI's image: linux-image-X.Y.Z-N-cloud-amd64.
    let deps = output(private("apt-cache").args(["depends", "linux-image-cloud-amd64"]))?;
    let image = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-") && p.contains("cloud-amd64"))
        .context("linux-image-cloud-amd64 depends on no linux-image-*-cloud-amd64")?
        .trim()
        .to_string();
    let debs = state.join("debs");
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::create_dir_all(&debs)?;
    println!("setup: apt-get download {image} ({suite})");
    status(
        private("apt-get")
            .current_dir(&debs)
            .args(["download", &image]),
    )?;
    let deb = std::fs::read_dir(&debs)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", debs.display()))?;
    let unpacked = state.join("unpacked");
    let _ = std::fs::remove_dir_all(&unpacked);
    status(Command::new("dpkg").arg("-x").arg(&deb).arg(&unpacked))?;
    let boot = unpacked.join("boot");
    let kernel = std::fs::read_dir(&boot)
        .with_context(|| format!("{} has no boot/", deb.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        });
    let Some(kernel) = kernel else {
        bail!("{} holds no boot/vmlinuz-*", deb.display());
    };
    std::fs::create_dir_all(&out)?;
    let tmp = out.join("vmlinuz.tmp");
    std::fs::copy(&kernel, &tmp)?;
    std::fs::rename(&tmp, &vmlinuz)?;
    // Only the kernel is kept: the package's modules and the suite's apt lists are
    // ~150 MB more, and the initramfs boots without modules.
    let _ = std::fs::remove_dir_all(&state);
    println!("setup: {suite} kernel ready ({})", vmlinuz.display());
    Ok(())
}
