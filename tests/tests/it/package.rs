//! `cargo xtask package` builds the Debian package; dpkg installs it into a scratch root
//! (`dpkg --root`: dpkg's own unpacking, conffiles and maintainer scripts, without
//! touching this machine's packages) and removes it again. From there `simulate` finds
//! the packaged tracer by the lookup an installed `/usr/bin/cpi-bpf` uses, its man
//! pages render and its unit verifies; purge removes the agent's windows. The unit's
//! hardening is rated by `systemd-analyze security --offline`, and its system call
//! filter checked against the calls the agent makes under strace.

use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::{cargo, cpi_bpf, output_ok, require_root, skip, stderr, temp_dir, workspace_root};

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

    // Removed, the conffile and the agent's windows stay (as apt remove leaves them);
    // purge takes both.
    let store = root.join("var/lib/cpi-bpf");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("w-1.json.gz"), "a window").unwrap();
    dpkg(&root, &["-r", "cpi-bpf"]);
    assert!(!root.join("usr/bin/cpi-bpf").exists());
    assert!(!lib.exists());
    assert!(conf.is_file());
    assert!(store.join("w-1.json.gz").is_file());
    dpkg(&root, &["--purge", "cpi-bpf"]);
    assert!(!conf.exists());
    assert!(!store.exists(), "purge left {}", store.display());
    let _ = std::fs::remove_dir_all(&dir);
}

/// dist/'s unit, as `systemd-analyze security --offline` rates it: its overall
/// exposure, and each exposure it names (`✗ Setting=…`).
fn unit_security() -> Option<(f64, Vec<String>)> {
    let dir = temp_dir("unit-security");
    let unit = dir.join("cpi-bpf.service");
    std::fs::copy(workspace_root().join("dist/cpi-bpf.service"), &unit).unwrap();
    let out = match Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            skip(format_args!("systemd-analyze not available ({e})"));
            return None;
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let overall = text
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for cpi-bpf.service: "))
        .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure in: {text}{}", stderr(&out)));
    let exposures = text
        .lines()
        .filter_map(|l| l.strip_prefix("✗"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    Some((overall, exposures))
}

/// The unit is hardened as far as BPF and perf allow: well below the 4.9 it had without
/// a system call filter, `RestrictSUIDSGID`, `ProtectKernelLogs`, `UMask` and the rest,
/// and each exposure left is named in its comments with why.
#[test]
fn the_unit_is_hardened_and_says_why_for_each_exposure_left() {
    let Some((overall, exposures)) = unit_security() else {
        return;
    };
    assert!(overall <= 3.0, "exposure {overall}: {exposures:?}");
    let unit = std::fs::read_to_string(workspace_root().join("dist/cpi-bpf.service")).unwrap();
    let comments: String = unit
        .lines()
        .filter(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    for e in &exposures {
        assert!(
            comments.contains(e.as_str()),
            "{e} is not justified in the unit"
        );
    }
    for set in [
        "SystemCallArchitectures=native",
        "RestrictSUIDSGID=yes",
        "ProtectKernelLogs=yes",
        "MemoryDenyWriteExecute=yes",
        "UMask=0077",
    ] {
        assert!(unit.lines().any(|l| l == set), "{set} not in the unit");
    }
}

/// The system calls `spec` (a `SystemCallFilter=` value, or a group) names, groups
/// expanded by `systemd-analyze syscall-filter`.
fn system_calls(spec: &str, into: &mut std::collections::BTreeSet<String>) {
    for name in spec.split_whitespace() {
        if !name.starts_with('@') {
            into.insert(name.to_string());
            continue;
        }
        let out = output_ok(Command::new("systemd-analyze").args(["syscall-filter", name]));
        let text = String::from_utf8_lossy(&out.stdout);
        // The group's name, then its calls and nested groups; comments start with '#'.
        for l in text.lines().skip(1).map(str::trim) {
            if !l.is_empty() && !l.starts_with('#') {
                system_calls(l, into);
            }
        }
    }
}

/// Every system call the agent makes (system-wide, stacks and source lines on, under
/// strace for a few windows) is one the unit's `SystemCallFilter` leaves it: a call
/// outside it would fail with EPERM in the service.
#[test]
fn the_units_system_call_filter_allows_every_call_the_agent_makes() {
    if !require_root("running the agent") {
        return;
    }
    let unit = std::fs::read_to_string(workspace_root().join("dist/cpi-bpf.service")).unwrap();
    let (mut allowed, mut denied) = Default::default();
    for filter in unit
        .lines()
        .filter_map(|l| l.strip_prefix("SystemCallFilter="))
    {
        match filter.strip_prefix('~') {
            Some(deny) => system_calls(deny, &mut denied),
            None => system_calls(filter, &mut allowed),
        }
    }
    assert!(allowed.contains("bpf") && allowed.contains("perf_event_open"));
    let dir = temp_dir("unit-syscalls");
    let summary = dir.join("strace");
    let out = Command::new("timeout")
        .args(["-s", "TERM", "6", "strace", "-f", "-qq", "-c", "-o"])
        .arg(&summary)
        .arg(cpi_bpf())
        .args(["agent", "--interval", "1", "--metrics-addr", "127.0.0.1:0"])
        .args(["--source-lines", "--store"])
        .arg(dir.join("store"))
        .output()
        .unwrap();
    let Ok(text) = std::fs::read_to_string(&summary) else {
        skip(format_args!("strace did not run: {}", stderr(&out)));
        return;
    };
    assert!(
        stderr(&out).contains("agent: stopped after"),
        "{}",
        stderr(&out)
    );
    // `% time seconds usecs/call calls [errors] syscall` rows, then `total`.
    let called: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<f64>().is_ok())
        })
        .filter_map(|l| l.split_whitespace().last())
        .filter(|c| *c != "total")
        .collect();
    assert!(called.contains(&"perf_event_open"), "{text}");
    let refused: Vec<&&str> = called
        .iter()
        .filter(|c| !allowed.contains(**c) || denied.contains(**c))
        .collect();
    assert!(refused.is_empty(), "the unit refuses {refused:?}: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}
