//! Function names as perf users know them: PLT stubs named by their
//! target as objdump names them, and of several names at one address the one perf shows.

use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::programs::compile;
use cpi_tests::{cpi_bpf, output_ok, require_root, temp_dir};
use cpi_user::binary::Binary;
use cpi_user::profile::Profile;

/// `tests/programs/aliases.c` built with `flags`; gcc is installed by `cargo xtask setup`.
fn aliases(flags: &[&str]) -> PathBuf {
    compile("aliases.c", flags).expect("gcc builds tests/programs/aliases.c (cargo xtask setup)")
}

/// objdump's `<name@plt>` labels of `bin`'s PLT sections: (address, name).
fn objdump_plt_labels(bin: &Path) -> Vec<(u64, String)> {
    let out = output_ok(
        Command::new("objdump")
            .args(["-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got"])
            .arg(bin),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (addr, rest) = l.split_once(" <")?;
            let name = rest.strip_suffix(">:")?;
            name.ends_with("@plt")
                .then(|| Some((u64::from_str_radix(addr, 16).ok()?, name.to_string())))?
        })
        .collect()
}

/// Names of `bin`'s symbols (.symtab and .dynsym) at `addr`.
fn symbols_at(bin: &Path, addr: u64) -> Vec<String> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(bin).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.address() == addr)
        .filter_map(|s| Some(s.name().ok()?.to_string()))
        .collect()
}

#[test]
fn plt_stubs_are_named_by_their_target_as_objdump_names_them() {
    // .plt (lazy binding), .plt.sec + .plt.got (IBT stubs), and Debian's own binaries.
    let mut bins = vec![
        aliases(&["-O2"]),
        aliases(&["-O2", "-fcf-protection=full", "-Wl,-z,ibtplt"]),
    ];
    for p in ["/usr/bin/sqlite3", "/usr/lib/x86_64-linux-gnu/libc.so.6"] {
        if Path::new(p).exists() {
            bins.push(p.into());
        }
    }
    let mut sections = std::collections::BTreeSet::new();
    for bin in &bins {
        let labels = objdump_plt_labels(bin);
        assert!(
            !labels.is_empty(),
            "{}: objdump names no PLT stub",
            bin.display()
        );
        let b = Binary::open(bin).unwrap();
        for (addr, label) in &labels {
            // objdump names an ifunc's slot `*ABS*+0xRESOLVER@plt`; perf names it after
            // a symbol at the resolver's address (which of its aliases depends on the
            // symbols loaded: the binary's own, or libc6-dbg's).
            if let Some(rest) = label.strip_prefix("*ABS*+0x") {
                let resolver = u64::from_str_radix(rest.trim_end_matches("@plt"), 16).unwrap();
                let f = b.function_at(*addr).expect("a stub");
                let target = f.name.strip_suffix("@plt").expect("named after its target");
                assert!(
                    symbols_at(bin, resolver).iter().any(|n| n == target)
                        || b.function_at(resolver).is_some_and(|g| g.name == target),
                    "{}: {} is not a symbol at the resolver {resolver:#x}",
                    bin.display(),
                    f.name
                );
                continue;
            }
            let name = label;
            let f = b
                .function_at(*addr)
                .unwrap_or_else(|| panic!("{}: nothing at {addr:#x} ({name})", bin.display()));
            assert_eq!(
                (&f.name, f.start),
                (name, *addr),
                "{}: the stub at {addr:#x}",
                bin.display()
            );
        }
        let out = output_ok(Command::new("readelf").arg("-SW").arg(bin));
        for s in [".plt.sec", ".plt.got"] {
            if String::from_utf8_lossy(&out.stdout).contains(&format!(" {s} ")) {
                sections.insert(s);
            }
        }
        eprintln!(
            "{}: {} PLT stubs named as objdump names them",
            bin.display(),
            labels.len()
        );
    }
    assert_eq!(
        sections.into_iter().collect::<Vec<_>>(),
        [".plt.got", ".plt.sec"],
        "every PLT layout was checked"
    );
}

#[test]
fn of_several_names_at_one_address_the_one_perf_shows_is_shown() {
    if !require_root("perf record") {
        return;
    }
    let exe = aliases(&["-O2"]);
    let dir = temp_dir("symbols-aliases");
    let data = dir.join("perf.data");
    output_ok(
        Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-c", "100000", "-o"])
            .arg(&data)
            .arg(&exe)
            .arg("100000000"),
    );
    let report = output_ok(
        Command::new("perf")
            .args(["report", "--stdio", "-q", "--sort", "sym", "-i"])
            .arg(&data),
    );
    let perf_top = String::from_utf8_lossy(&report.stdout)
        .lines()
        .find_map(|l| Some(l.split("] ").nth(1)?.trim().to_string()))
        .expect("perf report shows a symbol");
    // The same program profiled by cpi-bpf (a time profile here).
    let ours = output_ok(
        Command::new(cpi_bpf())
            .args(["-F", "999", "--format", "json", "--"])
            .arg(&exe)
            .arg("100000000"),
    );
    let p = Profile::from_json(&ours.stdout).unwrap();
    let top = p
        .processes
        .iter()
        .flat_map(|pr| &pr.functions)
        .max_by_key(|f| f.samples)
        .expect("a function");
    // Four names share __hot_spin's address: a weak, a local, `__hot_spin` and
    // `hot_spin`; A-to-Z alone would show `__hot_spin`.
    assert_eq!(perf_top, "hot_spin", "perf's choice on this build");
    assert_eq!(top.name, perf_top);
    let _ = std::fs::remove_dir_all(&dir);
}
