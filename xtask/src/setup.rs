//! `cargo xtask setup`: everything the build and the tests need on a fresh Debian 12
//! machine of the dev kind, each step skipped when already done:
//! Debian packages, the nightly's `rust-src`, bpf-linker built against the nightly's own
//! libLLVM (rebuilt only when `rustc +nightly -vV` changes), the Valgrind tracer, Debian's
//! kernels for the QEMU matrix (`kernels.rs`), then the release build with its man pages
//! and shell completions ([`docs`]).
//! `cargo xtask run -- ARGS`: build cpi-bpf and run it as root.
//! `cargo xtask docs`: only the man pages and completions.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// Debian packages the tests use: gcc and g++ (test programs; binutils' objcopy and strip
/// split debug files off them), valgrind (the tracer and its
/// headers, libs and valgrind.pc), pkgconf (pkg-config: the tracer build reads
/// valgrind.pc), golang-go (`go tool pprof`), bolt-22 (llvm-bolt / perf2bolt for `.fdata`),
/// llvm-19 (llvm-profgen), clang-19 (the code shapes clang lays out, built beside gcc's:
/// tests/tests/it/simulate_shapes.rs), linux-perf (`perf report`/`perf script`: the references the
/// imports of real recordings are checked against, tests/tests/it/import_real.rs),
/// prometheus (the server that scrapes the agent in tests/tests/agent_sinks.rs),
/// qemu-system-x86 and busybox-static (the kernel matrix, tests/tests/it/kernels.rs),
/// python3-venv (the Kubernetes schema validator's and the OTLP bindings' venvs,
/// [`pinned_venv`]), time (GNU time: a child's own peak RSS, tests/tests/it/hostile.rs),
/// chromium (opens the HTML report, tests/tests/it/report_html.rs), tmux (an 80-column
/// terminal for the tables, tests/tests/it/report_tree.rs), dpkg-dev
/// (`dpkg-shlibdeps` for `cargo xtask package`) and man-db (the package test renders its
/// man page), bpftool (the kernel's own run time of the agent's programs,
/// tests/tests/it/agent_cost.rs), sqlite3, bzip2 and xz-utils (programs nobody here wrote,
/// replayed by the PMU model in tests/tests/it/corpus.rs).
const PACKAGES: &[&str] = &[
    "gcc",
    "g++",
    "binutils",
    "valgrind",
    "pkgconf",
    "golang-go",
    "bolt-22",
    "llvm-19",
    "clang-19",
    "linux-perf",
    "prometheus",
    "qemu-system-x86",
    "busybox-static",
    "python3-venv",
    "time",
    "chromium",
    "tmux",
    "dpkg-dev",
    "man-db",
    "bpftool",
    "sqlite3",
    "bzip2",
    "xz-utils",
];

const BPF_LINKER_VERSION: &str = "0.13.0";
const NIGHTLY: &str = "nightly";

pub fn setup() -> anyhow::Result<()> {
    apt_packages()?;
    rust_src()?;
    bpf_linker()?;
    super::tracer::build()?;
    super::kernels::fetch()?;
    k8s_validator()?;
    pinned_venv("otlp-proto", OTLP_PROTO)?;
    docs()?;
    println!("setup: done");
    Ok(())
}

pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn status(cmd: &mut Command) -> anyhow::Result<()> {
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed ({st})");
    }
    Ok(())
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
}

/// Runs `cmd` as root: directly when we are root, else through sudo.
fn as_root(program: &str) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.arg(program);
        c
    }
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_ok_and(|s| s.trim() == "0")
}

fn apt_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        println!("setup: Debian packages present");
        return Ok(());
    }
    println!("setup: apt-get update");
    status(as_root("apt-get").args(["update", "-qq"]))?;
    println!("setup: apt-get install {}", missing.join(" "));
    status(
        as_root("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing),
    )
}

fn rust_src() -> anyhow::Result<()> {
    let nightly_present = Command::new("rustc")
        .args([&format!("+{NIGHTLY}"), "-V"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !nightly_present {
        // Only on a machine without any nightly: installing over an existing one would
        // move it, and the aya/bpf-linker pins are tied to it (README.md, "Set up and run").
        println!("setup: rustup toolchain install {NIGHTLY} --component rust-src");
        return status(Command::new("rustup").args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]));
    }
    let have = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        NIGHTLY,
    ]))?;
    if have.lines().any(|l| l.starts_with("rust-src")) {
        println!("setup: nightly rust-src present");
        return Ok(());
    }
    println!("setup: rustup component add rust-src --toolchain {NIGHTLY}");
    status(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", NIGHTLY]))
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

/// bpf-linker 0.13.0 against the nightly's own libLLVM: its build
/// script only needs `$LLVM_PREFIX/lib/libLLVM.so`, so a folder holding a symlink to the
/// sysroot's `libLLVM.so.*` is enough; the rpath makes the binary work without it. The
/// binary is tied to that exact nightly, so a stamp holding `rustc +nightly -vV`
/// decides whether to rebuild.
fn bpf_linker() -> anyhow::Result<()> {
    let version = output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "-vV"]))?;
    let home = cargo_home();
    let binary = home.join("bin/bpf-linker");
    let stamp = home.join("bpf-linker.cpi-bpf-stamp");
    let wanted = format!("bpf-linker {BPF_LINKER_VERSION}\n{version}");
    if binary.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        println!("setup: bpf-linker {BPF_LINKER_VERSION} present for this nightly");
        return Ok(());
    }
    let llvm_major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("`rustc +nightly -vV` shows no LLVM version")?
        .trim()
        .to_string();
    let sysroot = PathBuf::from(
        output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "--print", "sysroot"]))?.trim(),
    );
    let libdir = sysroot.join("lib");
    let libllvm = std::fs::read_dir(&libdir)
        .with_context(|| format!("reading {}", libdir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("libLLVM.so.") || (n.starts_with("libLLVM-") && n.ends_with(".so"))
            })
        })
        .with_context(|| format!("no libLLVM.so.* in {}", libdir.display()))?;
    let prefix = std::env::temp_dir().join(format!("cpi-bpf-llvm-prefix-{llvm_major}"));
    std::fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&libllvm, &link)
        .with_context(|| format!("linking {} to {}", link.display(), libllvm.display()))?;
    println!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against {} (LLVM {llvm_major}); about a minute",
        libllvm.display()
    );
    status(
        Command::new("cargo")
            .args([
                "install",
                "--locked",
                "--force",
                "--no-default-features",
                "--features",
                &format!("llvm-{llvm_major}"),
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            ])
            .env("LLVM_PREFIX", &prefix)
            .env(
                "RUSTFLAGS",
                format!("-C link-arg=-Wl,-rpath,{}", libdir.display()),
            ),
    )?;
    std::fs::write(&stamp, wanted)?;
    Ok(())
}

/// Builds cpi-bpf (release, eBPF object included) and runs it as root with `args`.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let bin = build()?;
    let mut cmd = as_root(&bin.to_string_lossy());
    let st = cmd
        .args(args)
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    std::process::exit(st.code().unwrap_or(1));
}

/// Builds cpi-bpf and has it write its man pages and bash/zsh/fish completions (from its
/// own CLI definition, cpi-bpf/src/docs.rs) beside it:
/// `target/release/man/` and `target/release/completions/`.
pub fn docs() -> anyhow::Result<()> {
    let bin = build()?;
    let dir = bin.parent().context("the binary's folder")?;
    status(Command::new(&bin).arg("generate-docs").arg(dir))?;
    println!(
        "setup: man page {}/man/cpi-bpf.1; completions in {}/completions (bash, zsh, fish)",
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// `cargo build --release` of the cpi-bpf binary; its path. `cargo run` gives xtask
/// its own `CARGO_PKG_*` and `CARGO_MANIFEST_*`; build scripts (ring's) rerun when these
/// differ from a plain `cargo build`'s, so they are not passed on.
pub fn build() -> anyhow::Result<PathBuf> {
    let mut cargo = Command::new("cargo");
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_") || k.starts_with("CARGO_MANIFEST_") {
            cargo.env_remove(&*k);
        }
    }
    status(cargo.args([
        "build",
        "--release",
        "--package",
        "cpi-bpf",
        "--bin",
        "cpi-bpf",
    ]))?;
    Ok(target_dir().join("release/cpi-bpf"))
}

/// The workspace's `target/` (or `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("xtask sits in the workspace")
                .join("target")
        })
}

/// The Kubernetes schema validator the DaemonSet test runs offline
/// (tests/tests/it/daemonset.rs): PyPI's `kubernetes-validate`, which bundles the
/// schemas, in a venv at `target/k8s-validate/`.
const K8S_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// The official OpenTelemetry protobuf bindings the OTLP tests decode with
/// (tests/tests/it/report_otlp.rs), in a venv at `target/otlp-proto/`: 1.45.2 holds the
/// profiles schema of opentelemetry-proto v1.11.0, which cpi-user/src/report/otlp.rs
/// writes.
const OTLP_PROTO: &str = "opentelemetry-proto==1.45.2";

fn k8s_validator() -> anyhow::Result<()> {
    pinned_venv("k8s-validate", K8S_VALIDATE)
}

/// A venv at `target/NAME` holding PyPI's `requirement` (`package==version`), made or
/// upgraded only when it lacks that version (the system's Python stays untouched).
fn pinned_venv(name: &str, requirement: &str) -> anyhow::Result<()> {
    let venv = target_dir().join(name);
    let (package, pinned) = requirement
        .split_once("==")
        .context("a pinned requirement")?;
    let probe = format!("import importlib.metadata as m; print(m.version({package:?}))");
    if output(Command::new(venv.join("bin/python")).args(["-c", &probe]))
        .is_ok_and(|v| v.trim() == pinned)
    {
        return Ok(());
    }
    status(
        Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&venv),
    )?;
    status(Command::new(venv.join("bin/pip")).args(["install", "--quiet", requirement]))?;
    println!("setup: {requirement} in {}", venv.display());
    Ok(())
}
