//! Builds the Valgrind tracer tool (`tests/tracer/cpitrace.c`) into `target/cpi-tracer/`.
//!
//! Valgrind finds a tool as `$VALGRIND_LIB/<tool>-<platform>` and loads
//! `vgpreload_core-<platform>.so` from the same folder, so the folder also gets symlinks
//! to the installed preload and suppression files; `cpi-bpf simulate` runs
//! `VALGRIND_LIB=target/cpi-tracer valgrind --tool=cpitrace`. Needs Debian's `valgrind`
//! (headers, libcoregrind/libvex, valgrind.pc), `gcc` and `pkg-config`. Rebuilds only
//! when the source or the compile command changed (a stamp file holds both).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

pub const TOOL: &str = "cpitrace";
const PLATFORM: &str = "amd64-linux";

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

fn pkg_config(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("valgrind")
        .output()
        .context("running pkg-config (apt-get install pkg-config)")?;
    if !out.status.success() {
        bail!(
            "pkg-config {} valgrind failed (apt-get install valgrind): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Builds the tool folder; its path.
pub fn build() -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let src = root.join("tests/tracer/cpitrace.c");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("cpi-tracer");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let exe = dir.join(format!("{TOOL}-{PLATFORM}"));

    let cflags = pkg_config(&["--cflags"])?;
    let libs = pkg_config(&["--libs"])?;
    let load = pkg_config(&["--variable=valt_load_address"])?;
    let libdir = pkg_config(&["--variable=libdir"])?;
    let mut args: Vec<String> = [
        "-O2",
        "-g",
        "-Wall",
        "-Werror",
        "-fno-strict-aliasing",
        "-fno-builtin",
        "-fno-stack-protector",
        "-fomit-frame-pointer",
        "-m64",
        "-DVGA_amd64=1",
        "-DVGO_linux=1",
        "-DVGP_amd64_linux=1",
        "-DVGPV_amd64_linux_vanilla=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(cflags.split_whitespace().map(str::to_string));
    args.extend(["-o".into(), exe.display().to_string()]);
    args.push(src.display().to_string());
    // Valgrind's own tool link line (coregrind/link_tool_exe_linux): static, no libc,
    // text at the load address the core expects.
    args.extend(
        [
            "-static",
            "-nodefaultlibs",
            "-nostartfiles",
            "-u",
            "_start",
            &format!("-Wl,-Ttext-segment={load}"),
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args.extend(libs.split_whitespace().map(str::to_string));

    let source =
        std::fs::read_to_string(&src).with_context(|| format!("reading {}", src.display()))?;
    let stamp_path = dir.join("build.stamp");
    let stamp = format!("{}\n{}", args.join(" "), source);
    if exe.exists() && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(&stamp) {
        println!("tracer: {} is up to date", exe.display());
    } else {
        let status = Command::new("gcc")
            .args(&args)
            .status()
            .context("running gcc (apt-get install gcc)")?;
        if !status.success() {
            bail!("gcc failed building {}", src.display());
        }
        std::fs::write(&stamp_path, stamp)?;
        println!("tracer: built {}", exe.display());
    }

    // What the core loads from VALGRIND_LIB besides the tool.
    let installed = Path::new(&libdir).join("valgrind");
    let libexec = Path::new("/usr/libexec/valgrind");
    for name in [
        format!("vgpreload_core-{PLATFORM}.so"),
        "default.supp".to_string(),
    ] {
        let from = [libexec, installed.as_path()]
            .iter()
            .map(|d| d.join(&name))
            .find(|p| p.exists())
            .with_context(|| {
                format!(
                    "{name} not found in {} or {}",
                    libexec.display(),
                    installed.display()
                )
            })?;
        let link = dir.join(&name);
        if std::fs::read_link(&link).ok().as_deref() != Some(from.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&from, &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(dir)
}
