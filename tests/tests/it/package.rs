//! `cargo xtask package` builds the Debian package; dpkg installs it into a scratch root
//! (`dpkg --root`: dpkg's own unpacking, conffiles and maintainer scripts, without
//! touching this machine's packages) and removes it again. From there `simulate` finds
//! the packaged tracer by the lookup an installed `/usr/bin/cpi-bpf` uses, its man
//! pages render and its unit verifies.

use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::{cargo, cpi_bpf, output_ok, require_root, temp_dir, workspace_root};

/// Builds the package with the release binary the suite already built; its path.
fn build_package() -> PathBuf {
    // target/<profile>/cpi-bpf → target/
    let target = cpi_bpf().parent().and_then(Path::parent).unwrap();
    let out = output_ok(
        cargo()
            .args(["xtask", "package"])
            .env("CARGO_TARGET_DIR", target),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deb = stdout
        .lines()
        .find_map(|l| l.strip_prefix("package: "))
        .unwrap_or_else(|| panic!("no package path in: {stdout}"));
    PathBuf::from(deb)
}

/// `dpkg --root=ROOT ARGS` (scripts run here, not chrooted: the root has no shell; they
/// skip systemd under `DPKG_ROOT`), and its output.
fn dpkg(root: &Path, args: &[&str]) -> std::process::Output {
    output_ok(
        Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--force-script-chrootless", "--force-depends"])
            .args(args),
    )
}

/// `simulate -- /bin/true` by the installed binary, its tracer looked up as it would be
/// at /usr/bin (no `CPI_TRACER_DIR`).
fn simulate(root: &Path) -> std::process::Output {
    Command::new(root.join("usr/bin/cpi-bpf"))
        .env_remove("CPI_TRACER_DIR")
        .args(["simulate", "--", "/bin/true"])
        .output()
        .unwrap()
}

#[test]
fn package_installs_and_simulate_finds_its_tracer() {
    if !require_root("installing the package with dpkg") {
        return;
    }
    let deb = build_package();
    let fields = output_ok(Command::new("dpkg-deb").args(["-f"]).arg(&deb));
    let fields = String::from_utf8_lossy(&fields.stdout);
    assert!(fields.contains("Depends: libc6"), "{fields}");
    assert!(fields.contains("Recommends: valgrind (= "), "{fields}");

    let dir = temp_dir("package");
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("var/lib/dpkg/updates")).unwrap();
    std::fs::create_dir_all(root.join("var/lib/dpkg/info")).unwrap();
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    dpkg(&root, &["-i", deb.to_str().unwrap()]);

    let out = simulate(&root);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("mode: simulated"),
        "simulate from the package: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without its tracer it says where it looked (the package's folder under this
    // root, and /usr/lib/cpi-bpf) and how to get it.
    let lib = root.join("usr/lib/cpi-bpf");
    let away = dir.join("tracer-away");
    std::fs::rename(&lib, &away).unwrap();
    let out = simulate(&root);
    std::fs::rename(&away, &lib).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for said in [
        lib.to_str().unwrap(),
        "/usr/lib/cpi-bpf",
        "cargo xtask package",
    ] {
        assert!(stderr.contains(said), "{said:?} not in: {stderr}");
    }
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    // The man pages render; simulate's says where the tracer is looked for.
    let man = output_ok(
        Command::new("man")
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "200")
            .env("LC_ALL", "C")
            .arg("-l")
            .arg(root.join("usr/share/man/man1/cpi-bpf-simulate.1.gz")),
    );
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(page.contains("/usr/lib/cpi-bpf"), "{page}");
    for f in [
        "usr/share/man/man1/cpi-bpf.1.gz",
        "usr/share/bash-completion/completions/cpi-bpf",
        "usr/share/zsh/vendor-completions/_cpi-bpf",
        "usr/share/fish/vendor_completions.d/cpi-bpf.fish",
    ] {
        assert!(root.join(f).is_file(), "{f} is not in the package");
    }

    // The unit is dist/'s, and verifies against the installed binary and config.
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/cpi-bpf.service")).unwrap();
    let dist = std::fs::read_to_string(workspace_root().join("dist/cpi-bpf.service")).unwrap();
    assert_eq!(unit, dist);
    let conf = root.join("etc/cpi-bpf/agent.toml");
    if let Some(out) = cpi_tests::verify_unit(&unit, &root.join("usr/bin/cpi-bpf"), &conf, &dir) {
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Removed, only the conffile stays (as apt remove leaves it; purge takes it).
    dpkg(&root, &["-r", "cpi-bpf"]);
    assert!(!root.join("usr/bin/cpi-bpf").exists());
    assert!(!lib.exists());
    assert!(conf.is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
