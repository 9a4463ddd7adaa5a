//! Builds the eBPF object (`cpi-ebpf`) with aya-build, as the aya template does:
//! `cargo +nightly build --target bpfel-unknown-none -Z build-std=core` into OUT_DIR.
//! `AYA_BUILD_SKIP=1` skips it (clippy, docs, machines without bpf-linker); an empty
//! object is written instead and loading it fails with a clear error at run time.

use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR")?);
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
        std::fs::write(out_dir.join("cpi-ebpf"), b"")?;
        return Ok(());
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "cpi-ebpf")
        .ok_or_else(|| anyhow!("cpi-ebpf package not found in the workspace"))?;
    let root = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    // The eBPF program compiles cpi-common's source too: rebuild when it changes.
    let common = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "cpi-common")
        .and_then(|p| p.manifest_path.parent())
        .ok_or_else(|| anyhow!("cpi-common package not found in the workspace"))?;
    println!("cargo:rerun-if-changed={common}");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: root.as_str(),
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
