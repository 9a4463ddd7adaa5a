//! BOLT `.fdata` checked against the real reader: Debian's `llvm-bolt-22` must accept
//! the file, match the profile to the binary, and produce a binary that still runs
//! with the same output; `merge-fdata-22` must read it too.
//!
//! Two sources of profile: a profile built here from the test program's own symbol
//! table and disassembly (always), and `cpi-bpf simulate` (once it exists).

use crate::report_fixture;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::report_fixture::{have, scratch};
use cpi_common::policy::Perturbation;
use cpi_common::wire::EventRole;
use cpi_tests::{cpi_bpf, output_ok};
use cpi_user::binary::{Binary, Function};
use cpi_user::profile::model::*;
use cpi_user::report::fdata;
use object::{Object, ObjectSymbol};

const FUNCS: [&str; 3] = ["main", "collatz_steps", "checksum"];

fn tools_present() -> bool {
    for (tool, arg) in [
        ("gcc", "--version"),
        ("objdump", "--version"),
        ("llvm-bolt-22", "--version"),
    ] {
        if !have(tool, arg) {
            cpi_tests::skip(format_args!("{tool} not installed (Debian gcc, binutils, bolt-22; cargo xtask setup installs them)"));
            return false;
        }
    }
    true
}

/// `tests/programs/bolt_prog.c` built with relocations kept (BOLT needs them to move
/// functions).
fn build() -> PathBuf {
    cpi_tests::programs::compile(
        "bolt_prog.c",
        &["-O2", "-fno-pie", "-no-pie", "-Wl,--emit-relocs"],
    )
    .expect("gcc is present (tools_present)")
}

struct Insn {
    addr: u64,
    text: String,
}

/// `objdump -d` of one function: (address, Intel-syntax text).
fn disassemble(exe: &Path, start: u64, end: u64) -> Vec<Insn> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-M", "intel"])
        .arg(format!("--start-address=0x{start:x}"))
        .arg(format!("--stop-address=0x{end:x}"))
        .arg(exe)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (a, t) = l.trim().split_once(":\t")?;
            Some(Insn {
                addr: u64::from_str_radix(a, 16).ok()?,
                text: t.split_whitespace().collect::<Vec<_>>().join(" "),
            })
        })
        .collect()
}

/// The direct target of a jump or call (`jne 4012ce <f+0x1e>`).
fn target(text: &str) -> Option<u64> {
    let mut w = text.split_whitespace();
    w.next()?;
    u64::from_str_radix(w.next()?, 16).ok()
}

/// A profile of the test program made from its symbol table and disassembly: every
/// direct branch taken, every conditional also falling through, every block boundary
/// crossed, every call to a profiled function made. Counts are chosen, not measured.
fn hand_profile(exe: &Path) -> Profile {
    let data = std::fs::read(exe).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let mut funcs: Vec<(String, u64, u64)> = obj
        .symbols()
        .filter(|s| FUNCS.contains(&s.name().unwrap_or("")))
        .map(|s| (s.name().unwrap().to_string(), s.address(), s.size()))
        .collect();
    funcs.sort();
    assert_eq!(funcs.len(), FUNCS.len(), "symbols of the test program");
    let bin = exe.display().to_string();
    // BOLT's names of local symbols, as analysis resolves them.
    let bin_elf = Binary::open(exe).unwrap();
    let functions = funcs
        .iter()
        .map(|(name, start, size)| {
            let insns = disassemble(exe, *start, start + size);
            let is_jump = |t: &str| t.starts_with('j');
            let leaders: BTreeSet<u64> = insns
                .iter()
                .filter(|i| is_jump(&i.text))
                .filter_map(|i| target(&i.text))
                .collect();
            let mut edges = Vec::new();
            for (k, i) in insns.iter().enumerate() {
                let next = insns.get(k + 1).map(|n| n.addr);
                let edge = |to, kind, count, to_function: Option<&str>| EdgeProfile {
                    from: i.addr,
                    to,
                    kind,
                    count,
                    mispredicts: if kind == EdgeKind::Taken {
                        count / 50.0
                    } else {
                        0.0
                    },
                    to_function: to_function.map(str::to_string),
                    to_binary: None,
                };
                if is_jump(&i.text) {
                    if let Some(t) = target(&i.text).filter(|t| (*start..start + size).contains(t))
                    {
                        edges.push(edge(t, EdgeKind::Taken, 1000.0, None));
                    }
                    if !i.text.starts_with("jmp") {
                        if let Some(n) = next {
                            edges.push(edge(n, EdgeKind::FallThrough, 400.0, None));
                        }
                    }
                } else if i.text.starts_with("call") {
                    let callee = target(&i.text)
                        .and_then(|t| funcs.iter().find(|f| f.1 == t))
                        .map(|f| f.0.as_str());
                    if let (Some(t), Some(c)) = (target(&i.text), callee) {
                        edges.push(edge(t, EdgeKind::Taken, 300.0, Some(c)));
                    }
                } else if let Some(n) = next.filter(|n| leaders.contains(n)) {
                    if !i.text.starts_with("ret") && !i.text.starts_with("nop") {
                        edges.push(edge(n, EdgeKind::FallThrough, 200.0, None));
                    }
                }
            }
            let lines = insns
                .iter()
                .map(|i| InstructionProfile {
                    address: i.addr,
                    count: 1000.0,
                    samples: 10,
                    cycles: Some(1000.0),
                    cpi: None,
                    text: i.text.clone(),
                    source: None,
                })
                .collect();
            FunctionProfile {
                name: name.clone(),
                mangled: None,
                binary: bin.clone(),
                address: *start,
                size: *size,
                samples: 10,
                share: 1.0 / 3.0,
                measures: Measures {
                    time_ns: None,
                    cycles: Some(1.0e6),
                    instructions: Some(1.0e6),
                    cycles_rel_error: None,
                    instructions_rel_error: None,
                    cpi: None,
                },
                timed_cpi: None,
                cpi_disagree: false,
                bolt_name: bin_elf.bolt_local_name(&Function {
                    name: name.clone(),
                    start: *start,
                    size: *size,
                }),
                source: None,
                blocks: vec![],
                edges,
                lines,
            }
        })
        .collect();
    Profile {
        format_version: PROFILE_FORMAT_VERSION,
        tool_version: "test".into(),
        mode: Mode::Simulated,
        mode_reason: "hand-made profile for the BOLT format test".into(),
        command: vec![bin.clone()],
        duration_secs: 1.0,
        events: vec![],
        perturbation: Perturbation::None,
        range_window: 8,
        lost_samples: 0,
        lost: LossReport::default(),
        binaries: vec![BinaryInfo {
            path: bin,
            build_id: None,
            deleted: false,
            stripped: false,
            owner: None,
        }],
        accuracy: None,
        recorded_on: None,
        cpi_withheld: None,
        processes: vec![ProcessProfile {
            pid: 1,
            comm: "prog".into(),
            identity: Default::default(),
            samples: 30,
            branch_samples: 30,
            measures: Measures {
                time_ns: None,
                cycles: Some(3.0e6),
                instructions: Some(3.0e6),
                cycles_rel_error: None,
                instructions_rel_error: None,
                cpi: None,
            },
            functions,
            calls: Vec::new(),
            stacks: Vec::new(),
        }],
        unread: Vec::new(),
    }
}

/// Runs BOLT with `fdata`; returns its output after checking the optimised binary runs
/// like the original.
pub(crate) fn bolt(exe: &Path, fdata: &Path) -> String {
    let out_exe = fdata.with_extension("bolt");
    let out = Command::new("llvm-bolt-22")
        .arg(exe)
        .arg("-o")
        .arg(&out_exe)
        .arg(format!("-data={}", fdata.display()))
        .args(["-reorder-blocks=ext-tsp", "-reorder-functions=hfsort"])
        // -print-cfg reports each function's "Profile Acc": the share of its profile
        // that matched the binary's CFG.
        .arg("-print-cfg")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "llvm-bolt-22 rejected {}:\n{text}",
        fdata.display()
    );
    let a = Command::new(exe).output().unwrap();
    let b = Command::new(&out_exe).output().unwrap();
    assert!(b.status.success(), "optimised binary failed");
    assert_eq!(a.stdout, b.stdout, "optimised binary prints the same");
    text
}

/// Each profiled function's "Profile Acc : P%" from `-print-cfg`.
fn profile_accuracy(bolt_output: &str) -> Vec<f64> {
    bolt_output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Profile Acc"))
        .filter_map(|l| {
            l.trim_start_matches([' ', ':'])
                .trim_end_matches('%')
                .parse()
                .ok()
        })
        .collect()
}

/// "BOLT-INFO: N out of M functions in the binary (P%) have non-empty execution profile"
pub(crate) fn profiled_functions(bolt_output: &str) -> Option<u64> {
    let l = bolt_output
        .lines()
        .find(|l| l.contains("have non-empty execution profile"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn bolt_accepts_fdata_of_a_hand_built_profile() {
    if !tools_present() {
        return;
    }
    let dir = scratch("fdata-hand");
    let exe = build();
    let p = hand_profile(&exe);
    let files = fdata::render(&p).unwrap();
    assert_eq!(files.len(), 1);
    assert!(!files[0].no_lbr);
    assert!(files[0].text.contains("1 checksum/1 "), "{}", files[0].text);
    let fd = dir.join("prog.fdata");
    std::fs::write(&fd, &files[0].text).unwrap();
    let out = bolt(&exe, &fd);
    assert_eq!(profiled_functions(&out), Some(FUNCS.len() as u64), "{out}");
    assert!(!out.contains("invalid (possibly stale) profile"), "{out}");
    // -print-cfg prints each function more than once (after each pass): every report
    // must say the whole profile matched.
    let acc = profile_accuracy(&out);
    assert!(acc.len() >= FUNCS.len(), "{out}");
    assert!(acc.iter().all(|&a| a == 100.0), "Profile Acc {acc:?}");

    // merge-fdata reads it back (two copies: every count doubles).
    if have("merge-fdata-22", "--version") {
        let m = Command::new("merge-fdata-22")
            .arg(&fd)
            .arg(&fd)
            .output()
            .unwrap();
        assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
        let merged = String::from_utf8(m.stdout).unwrap();
        assert_eq!(merged.lines().count(), files[0].lines, "{merged}");
    } else {
        cpi_tests::skip(format_args!(
            "merge-fdata check: merge-fdata-22 not installed"
        ));
    }
}

/// Five C files, each with a `static` function `helper` (one `cold`, so it comes first
/// in address order though its file is linked fourth) and one with a `static` array of
/// that name.
const LOCAL_NAMES: [(&str, &str); 6] = [
    ("t3.c", "__attribute__((noipa)) static int helper(int x) { return x * 3 + 1; }\nint entry_3(int x) { return helper(x); }\n"),
    ("t4.c", "static int helper[4] = {1, 2, 3, 4};\nint entry_4(int x) { return helper[x & 3]; }\n"),
    ("main.c", "#include <stdio.h>\nint entry_1(int), entry_2(int), entry_3(int), entry_4(int);\n__attribute__((noipa)) static int helper(int x) { return x - 7; }\nint main(int argc, char **argv) { (void)argv; printf(\"%d\\n\", entry_1(argc) + entry_2(argc) + entry_3(argc) + entry_4(argc) + helper(argc)); return 0; }\n"),
    ("t1.c", "__attribute__((noipa, cold)) static int helper(int x) { return x + 1; }\nint entry_1(int x) { return helper(x); }\n"),
    ("t2.c", "__attribute__((noipa)) static int helper(int x) { return x * 2 + 1; }\n__attribute__((noipa)) static int spare(int x) { return x ^ 2; }\nint entry_2(int x) { return helper(x) + spare(x); }\n"),
    ("t5.c", "__attribute__((noipa)) static int spare(int x) { return x ^ 5; }\nint entry_5(int x) { return spare(x); }\n"),
];

/// The BOLT names of local functions (`helper/3`) read from the symbol table, against
/// llvm-bolt's own names for the same binary (its `-print-cfg` "All names").
#[test]
fn bolt_local_names_match_llvm_bolts() {
    if !tools_present() {
        return;
    }
    let dir = scratch("fdata-locals");
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-fno-pie", "-no-pie", "-Wl,--emit-relocs", "-o"])
        .arg(dir.join("prog"));
    for (file, text) in LOCAL_NAMES {
        std::fs::write(dir.join(file), text).unwrap();
        gcc.arg(dir.join(file));
    }
    output_ok(&mut gcc);
    let exe = dir.join("prog");
    let out = output_ok(
        Command::new("llvm-bolt-22")
            .arg(&exe)
            .arg("-o")
            .arg(dir.join("prog.bolt"))
            .arg("-print-cfg"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut theirs = std::collections::BTreeMap::new();
    let mut name = None;
    for l in text.lines().map(str::trim) {
        if let Some(n) = l.strip_prefix("All names   : ") {
            name = n.split_whitespace().next().map(str::to_string);
        } else if let Some(a) = l.strip_prefix("Address     : 0x") {
            let n = name.take().filter(|n| n.contains('/'));
            theirs.extend(n.map(|n| (u64::from_str_radix(a, 16).unwrap(), n)));
        }
    }
    let bin = Binary::open(&exe).unwrap();
    let data = std::fs::read(&exe).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let ours: std::collections::BTreeMap<u64, String> = elf
        .symbols()
        .filter(|s| s.is_local() && s.kind() == object::SymbolKind::Text && s.address() != 0)
        .filter_map(|s| {
            let f = Function {
                name: s.name().ok()?.to_string(),
                start: s.address(),
                size: s.size(),
            };
            Some((f.start, bin.bolt_local_name(&f)?))
        })
        .collect();
    // Symbols without a size (crtstuff's `frame_dummy/1`) are named too.
    let sizeless = (elf.symbols()).filter(|s| s.size() == 0 && ours.contains_key(&s.address()));
    assert!(sizeless.count() > 0, "ours: {ours:?}");
    let helpers = theirs.values().filter(|n| n.starts_with("helper/")).count();
    assert_eq!(helpers, 4, "llvm-bolt's names: {theirs:?}\n{text}");
    assert_eq!(ours, theirs);
}

#[test]
fn bolt_accepts_no_lbr_fdata_of_a_time_profile() {
    if !tools_present() {
        return;
    }
    let dir = scratch("fdata-nolbr");
    let exe = build();
    let mut p = hand_profile(&exe);
    p.mode = Mode::TimeProfile;
    p.events = vec![EventInfo {
        role: EventRole::CpuClock,
        name: "cpu-clock".into(),
        period: 1_000_003,
        jitter: 0,
        thinning: 1,
        unit: EventUnit::Ns,
        samples: 30,
        also: Vec::new(),
    }];
    for f in &mut p.processes[0].functions {
        f.edges.clear();
    }
    let files = fdata::render(&p).unwrap();
    assert!(files[0].no_lbr && files[0].text.starts_with("no_lbr cpu-clock\n"));
    let fd = dir.join("prog.fdata");
    std::fs::write(&fd, &files[0].text).unwrap();
    let out = bolt(&exe, &fd);
    assert_eq!(profiled_functions(&out), Some(FUNCS.len() as u64), "{out}");
}

/// The end-to-end check: `cpi-bpf simulate` profiles the program under the exact
/// tracer and PMU model, and BOLT optimises with that profile.
#[test]
fn bolt_optimises_with_the_fdata_of_cpi_bpf_simulate() {
    if !tools_present() {
        return;
    }
    let cpi = cpi_bpf();
    if let Err(why) = cpi_tests::tracer::tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let dir = scratch("fdata-sim");
    let exe = build();
    let fd = dir.join("prog.fdata");
    let out = Command::new(cpi)
        .args(["simulate", "--format", "fdata", "--output"])
        .arg(&fd)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cpi-bpf simulate failed: {err}");
    let text = std::fs::read_to_string(&fd).unwrap();
    assert!(
        FUNCS.iter().all(|f| text.contains(&format!("1 {f}"))),
        "every hot function has edges:\n{text}"
    );
    let bolt_out = bolt(&exe, &fd);
    assert!(
        profiled_functions(&bolt_out).unwrap_or(0) >= FUNCS.len() as u64,
        "{bolt_out}"
    );
    let acc = profile_accuracy(&bolt_out);
    let mean = acc.iter().sum::<f64>() / acc.len().max(1) as f64;
    eprintln!(
        "simulate: {} fdata lines, BOLT Profile Acc {acc:?}",
        text.lines().count()
    );
    assert!(
        mean >= 90.0,
        "mean Profile Acc {mean:.1}% ({acc:?})\n{bolt_out}"
    );
}

/// A taken-branch stream of the test program: a random walk over its own disassembly
/// (conditional jumps taken at random, calls and returns followed), so every range
/// between two branches is real straight-line code, as in a real LBR.
fn walk(exe: &Path, branches: usize) -> Vec<(u64, u64, bool)> {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let data = std::fs::read(exe).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let mut code = std::collections::BTreeMap::new();
    let mut main = 0;
    for s in obj
        .symbols()
        .filter(|s| FUNCS.contains(&s.name().unwrap_or("")))
    {
        if s.name() == Ok("main") {
            main = s.address();
        }
        let insns = disassemble(exe, s.address(), s.address() + s.size());
        for (k, i) in insns.iter().enumerate() {
            let next = insns.get(k + 1).map_or(i.addr + 1, |n| n.addr);
            code.insert(i.addr, (i.text.clone(), next));
        }
    }
    let mut rng = StdRng::seed_from_u64(42);
    let (mut pc, mut stack, mut out) = (main, Vec::new(), Vec::new());
    while out.len() < branches {
        // Mispredictions: every 20th branch, deterministic.
        let take = |from: u64, to: u64, out: &mut Vec<(u64, u64, bool)>| {
            out.push((from, to, out.len() % 20 == 7));
            to
        };
        let Some((text, next)) = code.get(&pc).cloned() else {
            // Outside the profiled functions (a PLT stub): return at once.
            let back = stack.pop().unwrap_or(main);
            pc = take(pc, back, &mut out);
            continue;
        };
        let tgt = target(&text);
        pc = if text.starts_with("ret") {
            // main returning restarts the program.
            let back = stack.pop().unwrap_or(main);
            take(pc, back, &mut out)
        } else if text.starts_with("call") {
            stack.push(next);
            match tgt {
                Some(t) => take(pc, t, &mut out),
                None => next,
            }
        } else if text.starts_with("jmp") {
            match tgt {
                Some(t) => take(pc, t, &mut out),
                None => next,
            }
        } else if text.starts_with('j') {
            let t = tgt.expect("direct conditional jump");
            // Loops mostly loop; forward branches are a coin flip.
            let p = if t <= pc { 0.85 } else { 0.5 };
            if rng.gen_bool(p) {
                take(pc, t, &mut out)
            } else {
                next
            }
        } else {
            next
        };
    }
    out
}

/// `perf script` text → `cpi-bpf import-perf --format fdata` → `llvm-bolt-22`: the
/// whole pipeline (parser, analysis, fdata writer) on branch records that follow the
/// test program's real control flow.
#[test]
fn bolt_optimises_with_fdata_from_imported_branch_stacks() {
    if !tools_present() {
        return;
    }
    let cpi = cpi_bpf();
    let dir = scratch("fdata-walk");
    let exe = build();
    let stream = walk(&exe, 300_000);
    let (depth, period) = (16, 97);
    let e = exe.display();
    let mut text = String::new();
    for end in (depth..stream.len()).step_by(period) {
        let newest = stream[end - 1];
        text.push_str(&format!("prog 4242/4242 {:x} f ({e})", newest.1));
        for &(from, to, mispred) in stream[end - depth..end].iter().rev() {
            let m = if mispred { 'M' } else { 'P' };
            text.push_str(&format!(" 0x{from:x}({e})/0x{to:x}({e})/{m}/-/-/0/-/-"));
        }
        text.push('\n');
    }
    let script = dir.join("perf.txt");
    std::fs::write(&script, text).unwrap();
    let fd = dir.join("walk.fdata");
    output_ok(
        Command::new(cpi)
            .args([
                "import-perf",
                "--period",
                &period.to_string(),
                "--format",
                "fdata",
                "--output",
            ])
            .arg(&fd)
            .arg(&script),
    );
    let fdata = std::fs::read_to_string(&fd).unwrap();
    assert!(
        fdata.contains("1 checksum/1 "),
        "local symbol named as BOLT does:\n{fdata}"
    );
    let bolt_out = bolt(&exe, &fd);
    assert_eq!(
        profiled_functions(&bolt_out),
        Some(FUNCS.len() as u64),
        "{bolt_out}"
    );
    let acc = profile_accuracy(&bolt_out);
    let mean = acc.iter().sum::<f64>() / acc.len().max(1) as f64;
    eprintln!(
        "imported walk: {} fdata lines, BOLT Profile Acc {acc:?}",
        fdata.lines().count()
    );
    assert!(
        mean >= 95.0,
        "mean Profile Acc {mean:.1}% ({acc:?})\n{fdata}"
    );

    // The imported taken-edge profile against the walk's exact counts: degree of
    // overlap Σ min(p̂, p) of the normalised counts (cpi-user/src/sim/accuracy.rs).
    let out = Command::new(cpi)
        .args([
            "import-perf",
            "--period",
            &period.to_string(),
            "--format",
            "json",
        ])
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success());
    let p = Profile::from_json(&out.stdout).unwrap();
    let mut est: std::collections::HashMap<(u64, u64), f64> = Default::default();
    for f in &p.processes[0].functions {
        for e in f.edges.iter().filter(|e| e.kind == EdgeKind::Taken) {
            *est.entry((e.from, e.to)).or_default() += e.count;
        }
    }
    let mut truth: std::collections::HashMap<(u64, u64), f64> = Default::default();
    for &(from, to, _) in &stream {
        *truth.entry((from, to)).or_default() += 1.0;
    }
    let norm = |m: &std::collections::HashMap<(u64, u64), f64>| {
        let t: f64 = m.values().sum();
        m.iter()
            .map(|(k, v)| (*k, v / t))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let (est, truth) = (norm(&est), norm(&truth));
    let overlap: f64 = truth
        .iter()
        .map(|(k, p)| p.min(est.get(k).copied().unwrap_or(0.0)))
        .sum();
    eprintln!("imported walk: taken-edge overlap with the exact stream {overlap:.3}");
    assert!(overlap >= 0.9, "overlap {overlap:.3}");
}

/// The writer's own rules on the hand-made fixture: main binary first, function-relative
/// offsets, calls by symbol, edges into another binary as `0 <file> <address>`,
/// fall-throughs with 0 mispredictions, one file per binary.
#[test]
fn fdata_lines_of_the_fixture_profile() {
    let mut p = report_fixture::cpi_profile();
    let f = &mut p.processes[0].functions[0];
    f.edges.push(EdgeProfile {
        from: 0x401210,
        to: 0x9a0c0,
        kind: EdgeKind::Taken,
        count: 7.0,
        mispredicts: 0.0,
        to_function: Some("memcpy".into()),
        to_binary: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
    });
    p.processes[0].functions[2].lines = vec![InstructionProfile {
        address: 0x9a0c4,
        count: 0.0,
        samples: 2,
        cycles: None,
        cpi: None,
        text: "rep movsb".into(),
        source: None,
    }];
    let files = fdata::render(&p).unwrap();
    let names: Vec<_> = files.iter().map(|f| f.binary.as_str()).collect();
    assert_eq!(
        names,
        [
            "/opt/bench/bin/bench",
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        ]
    );
    let main = &files[0].text;
    for line in [
        "1 crc_update 20 1 crc_update 8 1000000 2079000000",
        "1 crc_update 20 1 crc_update 24 0 1000000",
        "1 crc_update 2f 1 main 25 2000 1000000",
        "1 main 20 1 crc_update 0 0 1000000",
        "1 crc_update 10 0 libc.so.6 9a0c0 0 7",
    ] {
        assert!(
            main.lines().any(|l| l == line),
            "missing {line:?} in\n{main}"
        );
    }
    // libc has samples but no edges: BOLT's no_lbr form.
    assert!(files[1].no_lbr);
    assert_eq!(files[1].text, "no_lbr cpu/cycles/\n1 memcpy 4 2\n");
}
