//! Fuzz targets for every reader of foreign bytes (issues 20 item 7 and 32): ELF,
//! `.eh_frame`, perf.data, `perf script` text, the profile JSON, stored agent windows,
//! the agent config, symbol names, DWARF line tables, perf maps, debug links (a binary
//! and the debug files its build-id and `.gnu_debuglink` name) and the kubelet's pod
//! list. Inputs are real files the other tests use, edited by proptest strategies
//! (bit flips, boundary integers, inserts, removals, truncation, splices) drawn from a
//! deterministic RNG, for a bounded time per target (`CPI_FUZZ_SECS`, default 10).
//! Each input must return (no panic) within [`PER_INPUT`] and allocate at most
//! [`MAX_LIVE`] live bytes. A failing input is written to `target/fuzz-<target>.bin`;
//! once fixed it belongs in `tests/data/fuzz/<target>/`, which is replayed first.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use cpi_agent::config::AgentOptions;
use cpi_agent::kubelet::parse_pods;
use cpi_agent::store::{read_range, RangeQuery};
use cpi_tests::{programs, temp_dir, workspace_root};
use cpi_user::binary::perfmap::PerfMap;
use cpi_user::binary::{ehframe::fde_ranges, Binary, DebugRoot, SourceLines};
use cpi_user::import::{perf_data, perf_script};
use cpi_user::report::file;
use object::{Object, ObjectSection, ObjectSymbol};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// A reader that has not returned after this long on one input is taken as hung
/// (generous: the machine may be busy with other tests).
const PER_INPUT: Duration = Duration::from_secs(20);
/// Live heap bytes one input may hold at its peak.
const MAX_LIVE: usize = 512 << 20;

thread_local! {
    /// Counting is on for the fuzz worker thread only: (on, live, peak).
    static HEAP: (Cell<bool>, Cell<usize>, Cell<usize>) =
        const { (Cell::new(false), Cell::new(0), Cell::new(0)) };
}

/// The system allocator, counting the live bytes of the thread being fuzzed.
struct Counting;

// SAFETY: delegates every call to `System`; the counters are thread-local cells that
// never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        track(l.size() as isize);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        track(l.size() as isize);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        track(-(l.size() as isize));
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        track(new as isize - l.size() as isize);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn track(delta: isize) {
    // `try_with`: the allocator runs during thread teardown too.
    let _ = HEAP.try_with(|(on, live, peak)| {
        if on.get() {
            let now = live.get().saturating_add_signed(delta);
            live.set(now);
            peak.set(peak.get().max(now));
        }
    });
}

/// Runs `f` with this thread's allocations counted; returns the peak live bytes.
fn peak_heap(f: impl FnOnce()) -> usize {
    HEAP.with(|(on, live, peak)| {
        live.set(0);
        peak.set(0);
        on.set(true);
    });
    f();
    HEAP.with(|(on, _, peak)| {
        on.set(false);
        peak.get()
    })
}

/// A position: anywhere, or within the first 512 bytes where headers live.
#[derive(Clone, Debug)]
struct Pos {
    head: bool,
    at: Index,
}

impl Pos {
    fn of(&self, len: usize) -> usize {
        let span = if self.head { len.min(512) } else { len };
        if span == 0 {
            0
        } else {
            self.at.index(span)
        }
    }
}

#[derive(Clone, Debug)]
enum Edit {
    Flip(Pos, u8),
    Byte(Pos, u8),
    /// A boundary integer written little-endian, `width` bytes.
    Word(Pos, u64, usize),
    Insert(Pos, Vec<u8>),
    Remove(Pos, usize),
    Truncate(Pos),
    /// Copies `len` bytes from one position over another.
    Splice(Pos, Pos, usize),
}

fn pos() -> impl Strategy<Value = Pos> {
    (any::<bool>(), any::<Index>()).prop_map(|(head, at)| Pos { head, at })
}

fn edit() -> impl Strategy<Value = Edit> {
    let word = prop_oneof![
        Just(0u64),
        Just(1),
        Just(0x7f),
        Just(0x80),
        Just(0xff),
        Just(0xffff),
        Just(0x7fff_ffff),
        Just(0xffff_ffff),
        Just(u64::MAX),
        Just(1 << 63),
        any::<u64>(),
    ];
    prop_oneof![
        (pos(), 0u8..8).prop_map(|(p, b)| Edit::Flip(p, b)),
        (pos(), any::<u8>()).prop_map(|(p, b)| Edit::Byte(p, b)),
        (pos(), word, prop_oneof![Just(2usize), Just(4), Just(8)])
            .prop_map(|(p, v, w)| Edit::Word(p, v, w)),
        (pos(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(p, b)| Edit::Insert(p, b)),
        (pos(), 1usize..64).prop_map(|(p, n)| Edit::Remove(p, n)),
        pos().prop_map(Edit::Truncate),
        (pos(), pos(), 1usize..256).prop_map(|(a, b, n)| Edit::Splice(a, b, n)),
    ]
}

fn apply(mut b: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = b.len();
        match e {
            Edit::Flip(p, bit) if len > 0 => b[p.of(len)] ^= 1 << bit,
            Edit::Byte(p, v) if len > 0 => b[p.of(len)] = *v,
            Edit::Word(p, v, w) => {
                let i = p.of(len);
                let end = (i + w).min(len);
                b[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
            }
            Edit::Insert(p, v) => {
                let i = p.of(len);
                b.splice(i..i, v.iter().copied());
            }
            Edit::Remove(p, n) => {
                let i = p.of(len);
                b.drain(i..(i + n).min(len));
            }
            Edit::Truncate(p) => b.truncate(p.of(len)),
            Edit::Splice(from, to, n) => {
                let (f, t) = (from.of(len), to.of(len));
                let n = (*n).min(len - f).min(len - t);
                b.copy_within(f..f + n, t);
            }
            _ => {}
        }
    }
    b
}

fn budget() -> Duration {
    let secs = std::env::var("CPI_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    Duration::from_secs_f64(secs)
}

/// What the worker reports per input, so the watchdog can name a hung one.
enum Progress {
    Start(Vec<u8>),
    Done,
    Finished(u64),
}

fn keep(name: &str, input: &[u8]) -> PathBuf {
    let path = workspace_root().join(format!("target/fuzz-{name}.bin"));
    std::fs::write(&path, input).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// Runs `target` on the committed regressions, the seeds, then edited seeds until the
/// budget is spent; panics on the first input that panics, hangs or holds too much heap.
/// Returns the executions.
fn fuzz(name: &'static str, seeds: Vec<Vec<u8>>, target: fn(&[u8])) -> u64 {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let regressions: Vec<Vec<u8>> =
        std::fs::read_dir(workspace_root().join("tests/data/fuzz").join(name))
            .into_iter()
            .flatten()
            .map(|e| std::fs::read(e.expect("list regressions").path()).expect("read regression"))
            .collect();
    let (tx, rx) = mpsc::channel();
    let deadline = Instant::now() + budget();
    let worker = std::thread::spawn(move || {
        let run = |input: Vec<u8>| {
            tx.send(Progress::Start(input.clone()))
                .expect("watchdog gone");
            let mut panicked = None;
            let peak = peak_heap(|| {
                let r = std::panic::catch_unwind(|| target(&input));
                panicked = r.err();
            });
            if panicked.is_some() {
                panic!(
                    "{name}: the reader panicked; input kept as {}",
                    keep(name, &input).display()
                );
            }
            assert!(
                peak <= MAX_LIVE,
                "{name}: {peak} live heap bytes for one input; input kept as {}",
                keep(name, &input).display()
            );
            tx.send(Progress::Done).expect("watchdog gone");
        };
        let mut n = 0u64;
        for input in regressions.iter().chain(&seeds) {
            run(input.clone());
            n += 1;
        }
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::deterministic_rng(RngAlgorithm::ChaCha),
        );
        let strategy = (0..seeds.len(), prop::collection::vec(edit(), 1..8));
        while Instant::now() < deadline {
            let (s, edits) = strategy.new_tree(&mut runner).expect("strategy").current();
            run(apply(seeds[s].clone(), &edits));
            n += 1;
        }
        tx.send(Progress::Finished(n)).expect("watchdog gone");
    });
    let mut current = Vec::new();
    loop {
        match rx.recv_timeout(PER_INPUT) {
            Ok(Progress::Start(input)) => current = input,
            Ok(Progress::Done) => {}
            Ok(Progress::Finished(n)) => {
                worker.join().expect("fuzz worker");
                println!("fuzz {name}: {n} executions, nothing found");
                return n;
            }
            // The worker panicked: its message says which input and why.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                std::panic::resume_unwind(worker.join().expect_err("worker ended early"))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "{name}: one input ran over {PER_INPUT:?}; input kept as {}",
                keep(name, &current).display()
            ),
        }
    }
}

fn read(path: impl AsRef<Path>) -> Vec<u8> {
    let path = path.as_ref();
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn data(rel: &str) -> Vec<u8> {
    read(workspace_root().join(rel))
}

/// ELF binaries of different shapes: the Debian gzip (PIE, stripped), an autofdo test
/// program (with symbols), a propeller sample.
fn elf_seeds() -> Vec<Vec<u8>> {
    vec![
        read("/usr/bin/gzip"),
        data("tests/data/autofdo/hierarchical_discriminator_test.x86_64"),
        data("tests/data/autofdo/propeller_sample_1.bin"),
    ]
}

/// Executions a target must reach: more than the seeds, or it did not fuzz.
fn ran(n: u64, seeds: usize) {
    assert!(n > seeds as u64, "only {n} executions");
}

#[test]
fn elf() {
    let n = fuzz("elf", elf_seeds(), |b| {
        let Ok(bin) = Binary::parse(Path::new("fuzz.elf"), b) else {
            return;
        };
        // The instruction decoder and CFG read the (edited) code bytes too.
        for f in bin.functions().take(64) {
            let _ = bin.cfg(&f, &[]);
        }
    });
    ran(n, 3);
}

#[test]
fn eh_frame() {
    // The section's contents at its address, where the pointer encodings are relative.
    let seeds: Vec<Vec<u8>> = elf_seeds()
        .iter()
        .filter_map(|elf| {
            let obj = object::File::parse(&**elf).expect("seed ELF");
            let s = obj.section_by_name(".eh_frame")?;
            let mut b = s.address().to_le_bytes().to_vec();
            b.extend_from_slice(s.data().ok()?);
            Some(b)
        })
        .collect();
    let n = fuzz("eh_frame", seeds, |b| {
        let (addr, data) = b.split_at(8.min(b.len()));
        let mut a = [0u8; 8];
        a[..addr.len()].copy_from_slice(addr);
        let _ = fde_ranges(data, u64::from_le_bytes(a));
    });
    ran(n, 3);
}

#[test]
fn perf_data() {
    // The propeller recording is 3 MB: its first 256 KiB (header, attrs, the first
    // records; the rest reads as truncated) keeps each execution short.
    let mut big = data("tests/data/autofdo/propeller_sample_1.perfdata1");
    big.truncate(256 << 10);
    let seeds = vec![
        data("tests/data/autofdo/hierarchical_discriminator_test.x86_64.perf.data"),
        big,
    ];
    let n = fuzz("perf_data", seeds, |b| {
        let mut samples = 0u64;
        let _ = perf_data::read(&mut Cursor::new(b), |_, _| samples += 1);
    });
    ran(n, 2);
}

/// `perf script -F pid,tid,ip,sym,dso,brstack` lines in the shapes perf has printed
/// (tests/tests/it/report_import.rs writes the same variants), with an mmap event line.
const PERF_SCRIPT: &str = "\
# perf script -F pid,tid,ip,sym,dso,brstack
PERF_RECORD_MMAP2 4242/4242: [0x401000(0x2000) @ 0x1000 08:01 1234 0]: r-xp /bin/prog
   4242/4242            401234 f (/bin/prog) 0x401200/0x401100/P/-/-/7 0x401180/0x401010/M/-/-/12
bench    4242/4243            401234 f (/bin/prog) 0x401200(/bin/prog)/0x401100(/bin/prog)/P/-/-/7/COND
   4242/4242            401234 f (/bin/prog) 0x401200(/bin/prog+0x200)/0x401100(/bin/prog+0x100)/P/-/-/3/COND/NON_SPEC_CORRECT_PATH
";

#[test]
fn perf_script_text() {
    let n = fuzz("perf_script", vec![PERF_SCRIPT.as_bytes().to_vec()], |b| {
        let text = String::from_utf8_lossy(b);
        for opts in [
            perf_script::ImportOptions::default(),
            perf_script::ImportOptions {
                offsets: true,
                period: 1000,
                period_field: true,
            },
        ] {
            let _ = perf_script::parse(&text, opts, &|_| None);
        }
    });
    ran(n, 1);
}

fn golden_profiles() -> Vec<Vec<u8>> {
    vec![
        data("tests/golden/cpi_profile.json"),
        data("tests/golden/time_profile.json"),
    ]
}

#[test]
fn profile_json() {
    let n = fuzz("profile_json", golden_profiles(), |b| {
        // What is accepted can be written back and read again.
        if let Ok(p) = file::parse(b, "fuzz") {
            let json = file::to_json(&p).expect("an accepted profile writes");
            file::parse(json.as_bytes(), "fuzz").expect("a written profile reads");
        }
    });
    ran(n, 2);
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(b).expect("gzip");
    z.finish().expect("gzip")
}

#[test]
fn store_window() {
    // Both forms: compressed windows (edits hit the gzip layer) and JSON the target
    // compresses (edits reach the profile reader behind it).
    let mut seeds = golden_profiles();
    seeds.extend(golden_profiles().iter().map(|p| gzip(p)));
    let n = fuzz("store_window", seeds, |b| {
        thread_local!(static DIR: PathBuf = temp_dir("fuzz-store"));
        DIR.with(|dir| {
            let body = if b.starts_with(&[0x1f, 0x8b]) {
                b.to_vec()
            } else {
                gzip(b)
            };
            std::fs::write(dir.join("w-1000-2000.json.gz"), body).expect("write window");
            // A window that cannot be read is skipped and named, never fatal.
            if let Ok(r) = read_range(dir, &RangeQuery::default()) {
                assert_eq!(r.windows + r.skipped.len(), 1);
            }
        })
    });
    ran(n, 4);
}

/// A golden time profile whose first process has one call path of `frames` (JSON text)
/// over a one-frame table.
fn profile_with_frames(frames: &str) -> Vec<u8> {
    let mut p: serde_json::Value =
        serde_json::from_slice(&data("tests/golden/time_profile.json")).expect("golden");
    p["processes"][0]["stacks"] = serde_json::json!("@frames@");
    p["stack_functions"] = serde_json::json!([{"name": "f", "binary": "/bin/b"}]);
    p["stack_frames"] = serde_json::json!([{"function": 0, "address": 16}]);
    let path = format!(r#"[{{"frames": {frames}, "end": "complete", "samples": 1}}]"#);
    p.to_string().replace("\"@frames@\"", &path).into_bytes()
}

/// Small files of large content: what the profile reader holds follows what the model
/// keeps, not the text. A gzip'd window of one unknown field holding 200 MiB of empty
/// objects (`{"format_version":2,"x":[{"a":0},…]}`, parsed into a `serde_json::Value`
/// first, took 5.4 GB) is skipped as it is read; a call path listing more frames than a
/// file may is refused at the bound, in one error.
#[test]
fn profile_bombs_read_in_memory_that_follows_the_content() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(b"{\"format_version\":2,\"x\":[").unwrap();
    let mib = b"{\"a\":0},".repeat(1 << 17);
    for _ in 0..200 {
        gz.write_all(&mib).unwrap();
    }
    gz.write_all(b"{\"a\":0}]}").unwrap();
    let bomb = gz.finish().unwrap();
    let mut read = None;
    let peak = peak_heap(|| read = Some(file::read_stream(Cursor::new(&bomb), "bomb.json.gz")));
    let e = read.unwrap().expect_err("no profile in the bomb");
    eprintln!("{} byte gzip: {peak} bytes at the peak: {e}", bomb.len());
    assert!(e.to_string().contains("missing field"), "{e}");
    assert!(
        peak < 16 << 20,
        "{peak} bytes for a {} byte gzip",
        bomb.len()
    );

    // As many frames as a file may list read; one more is refused.
    let zeros = |n: usize| format!("[{}0]", "0,".repeat(n - 1));
    let mut read = None;
    let text = profile_with_frames(&zeros(file::MAX_FILE_FRAMES + 1));
    let peak = peak_heap(|| read = Some(file::parse(&text, "frames.json")));
    let e = read.unwrap().expect_err("over the frame bound");
    eprintln!(
        "{} bytes of frames: {peak} bytes at the peak: {e}",
        text.len()
    );
    assert!(e.to_string().contains("more than"), "{e}");
    assert!(peak <= MAX_LIVE, "{peak} bytes");
    let p = file::parse(&profile_with_frames(&zeros(3)), "three.json").expect("three frames");
    let f = &p.processes[0].stacks[0].frames;
    assert_eq!(f.len(), 3);
    assert!(f
        .iter()
        .all(|f| (&*f.function, &*f.binary, f.address) == ("f", "/bin/b", 16)));
}

#[test]
fn agent_config() {
    let n = fuzz("agent_config", vec![data("dist/agent.toml")], |b| {
        thread_local!(static PATH: PathBuf = temp_dir("fuzz-config").join("agent.toml"));
        PATH.with(|path| {
            std::fs::write(path, b).expect("write config");
            if let Ok(o) = AgentOptions::from_file(path) {
                let _ = o.resolve();
            }
        })
    });
    ran(n, 1);
}

/// Symbol names from binaries others built (cpi-user/src/binary/demangle.rs): each line
/// of the input is demangled; a name comes back as it was or within the output bound.
#[test]
fn symbol_names() {
    let lib = read("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
    let obj = object::File::parse(&*lib).expect("libstdc++ is ELF");
    let cpp: Vec<u8> = obj
        .dynamic_symbols()
        .filter_map(|s| s.name().ok())
        .filter(|n| n.starts_with("_Z"))
        .take(400)
        .flat_map(|n| [n.as_bytes(), b"\n"].concat())
        .collect();
    let rust = b"_ZN3std2rt10lang_start17h0123456789abcdefE\n_RNvMNtCs1234_7mycrate5shapeNtB2_6Square4area\n_RINvCsbt0fQicOZbh_10rust_names3mixmEB2_\n".to_vec();
    let n = fuzz("symbol_names", vec![cpp, rust], |b| {
        for line in b.split(|&c| c == b'\n') {
            let name = String::from_utf8_lossy(line);
            let d = cpi_user::binary::demangle(&name);
            assert!(d == name || d.len() <= 8 << 10, "{} bytes", d.len());
        }
    });
    ran(n, 2);
}

/// `tests/programs/analysis_loops.c` built with `-g` (non-PIE), split as packagers do
/// in `dir`: `prog.debug` (`objcopy --only-keep-debug`: its DWARF and symbol table with
/// little else, so most edits land in them) and `prog` (stripped, with a debuglink to
/// it and gcc's build-id). `None` after saying why (no gcc or binutils).
fn split_debug_build(dir: &Path) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let exe = programs::compile("analysis_loops.c", &["-O2", "-g", "-fno-PIE", "-no-pie"])?;
    let (prog, debug) = (dir.join("prog"), dir.join("prog.debug"));
    let steps: [&[&str]; 3] = [
        &[
            "objcopy",
            "--only-keep-debug",
            &exe.to_string_lossy(),
            "prog.debug",
        ],
        &["strip", "-o", "prog", &exe.to_string_lossy()],
        &["objcopy", "--add-gnu-debuglink=prog.debug", "prog"],
    ];
    for step in steps {
        match Command::new(step[0])
            .args(&step[1..])
            .current_dir(dir)
            .output()
        {
            Ok(o) if o.status.success() => {}
            other => {
                cpi_tests::skip(format_args!("{step:?}: {other:?}"));
                return None;
            }
        }
    }
    Some((exe, debug, prog))
}

/// The addresses a line-table target asks about: some functions' starts and middles,
/// and the seeds' `.text` (non-PIE, at 0x401000) for inputs whose symbols are gone.
fn probes(bin: &Binary) -> Vec<u64> {
    bin.functions()
        .take(64)
        .flat_map(|f| [f.start, f.start + f.size / 2])
        .chain((0..16).map(|i| 0x40_1000 + i * 0x40))
        .collect()
}

/// DWARF line tables (cpi-user/src/binary/lines.rs), with the file names addr2line
/// renders under `names_within_bound`. Seeds: a `-g` build, its debug file, and the
/// shared-line-table attack (tests/data/fuzz/dwarf_lines/shared-line-table.elf, 28 KB built with
/// gas): 128 units sharing one table of 1 024 names under an 8 KiB `comp_dir`, covering
/// addresses the table has no row for, so addr2line renders each unit's names in turn.
/// Without the bound that input holds 2.16 GB live.
#[test]
fn dwarf_lines() {
    let dir = temp_dir("fuzz-lines");
    let Some((exe, debug, _)) = split_debug_build(&dir) else {
        return;
    };
    let seeds = vec![
        read(exe),
        read(debug),
        data("tests/data/fuzz/dwarf_lines/shared-line-table.elf"),
    ];
    let n = fuzz("dwarf_lines", seeds, |b| {
        let Ok(bin) = Binary::parse(Path::new("fuzz.elf"), b) else {
            return;
        };
        let lines = SourceLines::new(&bin);
        for a in probes(&bin) {
            let _ = lines.at(a);
        }
    });
    ran(n, 3);
}

/// Perf maps as JIT runtimes write them (Node, a JVM agent, .NET, `0x` prefixes), with a
/// line that is not an entry, a zero size and a start written twice.
const PERF_MAP: &str = "\
3c7e4bc0a0c0 1c0 Builtin:ArgumentsAdaptorTrampoline
3c7e4bc0a2a0 2e4 LazyCompile:~main /app/index.js:1
7f8e2d0123a0 120 Ljava/lang/String;::hashCode
00007F8E2D014000 5B [PreJIT] instance bool [System.Private.CoreLib] System.String::Equals(object)[OptimizedTier1]
0x7f8e2d015000 0x40 luajit trace 12
not an entry
7f8e2d016000 0 empty
7f8e2d0123a0 80 Ljava/lang/String;::hashCode (recompiled)
";

#[test]
fn perf_map() {
    let n = fuzz("perf_map", vec![PERF_MAP.as_bytes().to_vec()], |b| {
        let map = PerfMap::read(&mut Cursor::new(b), b.len() as u64);
        // Each line's first word, as an address, is looked up.
        for line in b.split(|&c| c == b'\n') {
            let word = line.split(|&c| c == b' ').next().unwrap_or_default();
            let hex = String::from_utf8_lossy(word);
            if let Ok(a) = u64::from_str_radix(hex.trim_start_matches("0x"), 16) {
                let _ = map.lookup(a);
            }
        }
    });
    ran(n, 1);
}

/// A debug root for [`debug_link`]: `root/bin/prog.debug` is another build's debug
/// file (its CRC differs), `root/bin/.debug/prog.debug` and the build-id path hold
/// `prog`'s. Seeds: `prog` and `prog` without its build-id (found by debuglink only).
static LINK_ROOT: OnceLock<PathBuf> = OnceLock::new();

fn debug_link_seeds() -> Option<Vec<Vec<u8>>> {
    let dir = temp_dir("fuzz-debuglink");
    let (exe, debug, prog) = split_debug_build(&dir)?;
    let root = dir.join("root");
    let bin = root.join("bin");
    std::fs::create_dir_all(bin.join(".debug")).expect("debug root");
    std::fs::copy(&exe, bin.join("prog.debug")).expect("a wrong debug file");
    std::fs::copy(&debug, bin.join(".debug/prog.debug")).expect("the debug file");
    let id = Binary::open(&exe).ok()?.build_id.clone()?;
    let ids = root.join(format!("usr/lib/debug/.build-id/{}", &id[..2]));
    std::fs::create_dir_all(&ids).expect("build-id directory");
    std::fs::copy(&debug, ids.join(format!("{}.debug", &id[2..]))).expect("the debug file");
    let no_id = dir.join("prog-no-id");
    let out = Command::new("objcopy")
        .args(["--remove-section=.note.gnu.build-id"])
        .arg(&prog)
        .arg(&no_id)
        .output()
        .expect("objcopy ran above");
    assert!(out.status.success(), "{out:?}");
    LINK_ROOT.set(root).expect("set once");
    Some(vec![read(prog), read(no_id)])
}

/// Debug links (cpi-user/src/binary/debugfile.rs): the edited binary, named
/// `/bin/prog`, looks up its debug file under [`LINK_ROOT`] and reads its lines there.
#[test]
fn debug_link() {
    let Some(seeds) = debug_link_seeds() else {
        return;
    };
    let n = fuzz("debug_link", seeds, |b| {
        let root = DebugRoot(LINK_ROOT.get().expect("set up").clone());
        let input = root.0.with_file_name("input");
        std::fs::write(&input, b).expect("write input");
        let f = std::fs::File::open(&input).expect("open input");
        let Ok(bin) = Binary::from_file_with_debug(&f, Path::new("/bin/prog"), &root) else {
            return;
        };
        let lines = SourceLines::new(&bin);
        for a in probes(&bin) {
            let _ = lines.at(a);
        }
    });
    ran(n, 2);
}

/// A kubelet `/pods` answer in the shapes the kubelet writes: a running pod (a
/// container, an init container, an ephemeral one, each runtime's id scheme), one
/// still creating its container, one with no status.
const POD_LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
 {"metadata":{"name":"web-1","namespace":"shop","uid":"74c13223-5a00-11e9-b385-42010a80018d",
   "labels":{"app":"web"}},
  "spec":{"nodeName":"n1","containers":[{"name":"nginx","image":"nginx:1.25"}]},
  "status":{"phase":"Running","qosClass":"Burstable",
   "containerStatuses":[{"name":"nginx","ready":true,"restartCount":0,
     "containerID":"containerd://9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"},
    {"name":"starting","ready":false}],
   "initContainerStatuses":[{"name":"init","containerID":"cri-o://0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"}],
   "ephemeralContainerStatuses":[{"name":"debug","containerID":"docker://abc123"}]}},
 {"metadata":{"name":"pending","namespace":"x","uid":"u2"}},
 {"metadata":{"name":"job-7","namespace":"batch","uid":"u3"},"status":{"containerStatuses":[]}}]}"#;

/// The kubelet's pod list (cpi-agent/src/kubelet.rs), an answer of up to 16 MiB
/// from a port anyone on the node may listen on.
#[test]
fn kubelet_pods() {
    let seeds = vec![
        POD_LIST.as_bytes().to_vec(),
        cpi_tests::pod_list(&[
            ("u1", "a", "default", "0123abcd"),
            ("u2", "b", "kube-system", "4567ef"),
        ])
        .into_bytes(),
    ];
    let n = fuzz("kubelet_pods", seeds, |b| {
        let _ = parse_pods(b);
    });
    ran(n, 2);
}

/// The first finding (a stored window whose block ends before its start panicked the
/// merge in `read_range`): the reader now says why it refuses the file.
#[test]
fn a_block_ending_before_its_start_is_corrupt() {
    let b = data("tests/data/fuzz/store_window/block-ends-before-start.json");
    let e = file::parse(&b, "w").expect_err("a reversed block is refused");
    assert!(e.to_string().contains("before its start 0x"), "{e}");
}
