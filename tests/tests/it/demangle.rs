//! Names people read (cpi-user/src/binary/demangle.rs): a C++ program and a Rust program
//! (legacy and v0 mangling) profiled for real (a time profile works without a PMU) show
//! demangled names in the table, the JSON (the symbol kept beside) and pprof (`name`
//! demangled, `system_name` the symbol), and `--annotate` takes either form; the `.fdata`
//! keeps the symbols, and `llvm-bolt-22` matches them to the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::{cpi_bpf, output_ok, programs, require_root};
use cpi_user::profile::model::{FunctionProfile, Profile};
use cpi_user::report::{fdata, file, pprof};
use object::{Object, ObjectSymbol};

use crate::report_fixture::{have, scratch};

/// Profiles `exe 2` (it runs for 2 s) into a JSON profile in `dir`.
fn profile(exe: &Path, dir: &Path) -> (PathBuf, Profile) {
    let json = dir.join(format!(
        "{}.json",
        exe.file_name().unwrap().to_string_lossy()
    ));
    output_ok(
        Command::new(cpi_bpf())
            .args(["--user-only", "--duration", "20", "--format", "json", "-o"])
            .arg(&json)
            .arg("--")
            .arg(exe)
            .arg("2"),
    );
    let p = file::read(&json).unwrap();
    (json, p)
}

/// The profiled function named `name` in the main binary.
fn function<'a>(p: &'a Profile, exe: &Path, name: &str) -> &'a FunctionProfile {
    let exe = exe.to_string_lossy();
    let all: Vec<&FunctionProfile> = p.processes.iter().flat_map(|pr| &pr.functions).collect();
    all.iter()
        .find(|f| f.name == name && f.binary == exe)
        .unwrap_or_else(|| {
            let names: Vec<(&str, Option<&str>)> = all
                .iter()
                .map(|f| (f.name.as_str(), f.mangled.as_deref()))
                .collect();
            panic!("no {name:?} in {exe}: {names:?}")
        })
}

/// The symbol of `exe` whose name contains `part`.
fn symbol(exe: &Path, part: &str) -> String {
    let data = std::fs::read(exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let s = f
        .symbols()
        .filter_map(|s| s.name().ok())
        .find(|n| n.contains(part))
        .unwrap_or_else(|| panic!("no symbol with {part} in {}", exe.display()));
    s.to_string()
}

/// (demangled, mangled) of every function of the pprof built from `p`.
fn pprof_names(p: &Profile) -> Vec<(String, String)> {
    let m = pprof::build(p);
    let s = |i: i64| m.string_table[i as usize].clone();
    m.function
        .iter()
        .map(|f| (s(f.name), s(f.system_name)))
        .collect()
}

/// Each `(demangled, symbol)` pair is a profiled function of `exe` with that name and
/// symbol, in the JSON profile, the pprof and the table; `--annotate` finds it by either.
fn check_names(exe: &Path, json: &Path, p: &Profile, want: &[(&str, &str)]) {
    let pb = pprof_names(p);
    let table = output_ok(Command::new(cpi_bpf()).arg("report").arg(json));
    let table = String::from_utf8_lossy(&table.stdout);
    for &(name, sym) in want {
        let f = function(p, exe, name);
        assert_eq!(f.mangled.as_deref(), Some(sym), "{name}");
        assert!(f.samples > 0, "{name}: no samples");
        assert!(
            pb.iter().any(|(n, s)| n == name && s == sym),
            "pprof lacks ({name}, {sym}): {pb:?}"
        );
        // Piped, the table keeps names whole.
        assert!(table.contains(name), "table lacks {name}:\n{table}");
        assert!(
            !table.contains(sym),
            "table shows the symbol {sym}:\n{table}"
        );
        for key in [name, sym] {
            let out = output_ok(
                Command::new(cpi_bpf())
                    .args(["report", "--annotate", key])
                    .arg(json),
            );
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains(name), "--annotate {key}:\n{text}");
        }
    }
    // A symbol is kept only where demangling changed the name (C names have none).
    for f in p.processes.iter().flat_map(|pr| &pr.functions) {
        if let Some(m) = &f.mangled {
            assert!(m.starts_with("_Z") || m.starts_with("_R"), "{m}");
            assert_ne!(*m, f.name);
        }
    }
}

#[test]
fn cpp_names_are_demangled_and_fdata_keeps_symbols() {
    if !require_root("profiling a C++ program") {
        return;
    }
    let dir = scratch("demangle-cpp");
    // Relocations kept, non-PIE: what BOLT needs to rewrite the binary.
    let exe = programs::compile(
        "cpp_names.cpp",
        &["-O2", "-g", "-fno-pie", "-no-pie", "-Wl,--emit-relocs"],
    )
    .expect("g++ (cargo xtask setup)");
    let (json, p) = profile(&exe, &dir);
    let want = [
        ("shapes::Square::area() const", "_ZNK6shapes6Square4areaEv"),
        (
            "unsigned long mix<unsigned long>(unsigned long)",
            "_Z3mixImET_S0_",
        ),
        (
            "(anonymous namespace)::spin(int)",
            "_ZN12_GLOBAL__N_14spinEi",
        ),
    ];
    check_names(&exe, &json, &p, &want);

    // .fdata names functions by their symbols (the time profile gives the no_lbr form),
    // and BOLT matches them to the binary.
    let files = fdata::render(&p).unwrap();
    let main = files
        .iter()
        .find(|f| Path::new(&f.binary) == exe)
        .expect("an .fdata for the program");
    for (name, sym) in want {
        // A local (static) symbol is BOLT's `name/N`.
        assert!(
            [" ", "/"]
                .iter()
                .any(|end| main.text.contains(&format!("1 {sym}{end}"))),
            "{sym}:\n{}",
            main.text
        );
        assert!(!main.text.contains(name), "{name}:\n{}", main.text);
    }
    if !have("llvm-bolt-22", "--version") {
        assert!(
            std::env::var_os("CI").is_none(),
            "llvm-bolt-22 not installed (Debian bolt-22; cargo xtask setup installs it)"
        );
        cpi_tests::skip(format_args!("the BOLT check: llvm-bolt-22 not installed"));
        return;
    }
    let fd = dir.join("cpp_names.fdata");
    std::fs::write(&fd, &main.text).unwrap();
    let out = crate::report_fdata::bolt(&exe, &fd);
    let matched = crate::report_fdata::profiled_functions(&out).unwrap_or(0);
    // main and the three functions above at least.
    assert!(matched >= 4, "{matched} functions matched:\n{out}");
}

#[test]
fn rust_names_are_demangled_legacy_and_v0() {
    if !require_root("profiling a Rust program") {
        return;
    }
    let dir = scratch("demangle-rust");
    let base = ["-C", "opt-level=2", "-g"];
    let v0: Vec<&str> = base
        .iter()
        .copied()
        .chain(["-C", "symbol-mangling-version=v0"])
        .collect();
    let mut schemes = Vec::new();
    for flags in [&base[..], &v0[..]] {
        let exe = programs::compile("rust_names.rs", flags).expect("rustc");
        let (json, p) = profile(&exe, &dir);
        let area = symbol(&exe, "6Square4area");
        let mix = symbol(&exe, "3mix");
        // The scheme the symbols themselves use (stable rustc's default is legacy).
        let want = if area.starts_with("_R") {
            schemes.push("v0");
            [
                ("<rust_names::shapes::Square>::area", area.as_str()),
                ("rust_names::mix::<u32>", mix.as_str()),
            ]
        } else {
            assert!(area.starts_with("_ZN") && area.contains("17h"), "{area}");
            schemes.push("legacy");
            [
                ("rust_names::shapes::Square::area", area.as_str()),
                ("rust_names::mix", mix.as_str()),
            ]
        };
        check_names(&exe, &json, &p, &want);
    }
    assert_eq!(schemes, ["legacy", "v0"]);
}

/// A C++ binary split as packagers split it (`objcopy --only-keep-debug`, `strip`,
/// `objcopy --add-gnu-debuglink`): profiled, it is named and placed from its debug file
/// (cpi-user/src/binary/debugfile.rs), demangled, with source lines.
#[test]
fn stripped_binary_takes_names_and_lines_from_its_debug_file() {
    if !require_root("profiling a C++ program") {
        return;
    }
    let dir = scratch("demangle-split");
    let built = programs::compile("cpp_names.cpp", &["-O2", "-g"]).expect("g++");
    let exe = dir.join("cpp_names");
    cpi_tests::copy_program(&built, &exe);
    for args in [
        vec![
            "objcopy",
            "--only-keep-debug",
            "cpp_names",
            "cpp_names.debug",
        ],
        vec!["strip", "cpp_names"],
        vec![
            "objcopy",
            "--add-gnu-debuglink=cpp_names.debug",
            "cpp_names",
        ],
    ] {
        output_ok(Command::new(args[0]).args(&args[1..]).current_dir(&*dir));
    }
    let data = std::fs::read(&exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    assert!(f.symbol_table().is_none(), "stripped");
    let (_, p) = profile(&exe, &dir);
    let area = function(&p, &exe, "shapes::Square::area() const");
    assert_eq!(area.mangled.as_deref(), Some("_ZNK6shapes6Square4areaEv"));
    let src = area
        .source
        .as_ref()
        .expect("a source line from the debug file");
    assert!(
        src.file.ends_with("tests/programs/cpp_names.cpp"),
        "{src:?}"
    );
    // The local function, which no dynamic symbol names.
    function(&p, &exe, "(anonymous namespace)::spin(int)");
}
