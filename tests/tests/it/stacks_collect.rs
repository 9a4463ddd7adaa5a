//! Call stacks from live collection: the kernel side copies each sample's user
//! registers and stack top, the drain unwinds them (cpi-user/src/unwind/) and hands
//! `CallStack`s to the per-process aggregate. Checked at the library level, symbolised
//! here with the binary layer, on `tests/programs/stacks.c` built with and without frame
//! pointers (Debian's gcc omits them by default; Debian's libc has none). Root only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cpi_common::policy::Perturbation;
use cpi_common::wire::{EventRole, MAX_STACK_BYTES};
use cpi_tests::{compile_c, cpu_heavy, require_root, temp_dir};
use cpi_user::binary::Binary;
use cpi_user::collect::events::{nominal_core_hz, Rate};
use cpi_user::collect::{collect, CollectOptions, StackMemory, Target, DRAIN_EVERY};
use cpi_user::procmap::MappedObject;
use cpi_user::profile::model::LossReport;
use cpi_user::profile::stack::{CallStack, StackEnd};
use cpi_user::profile::ProcessSamples;

/// `stacks.c` built as `stacks` with `flags`, in a fresh directory.
fn program(tag: &str, flags: &[&str]) -> Option<PathBuf> {
    compile_c("stacks.c", &temp_dir(tag), "stacks", flags)
}

/// One-shot collection of `exe args` with stacks on: the process's samples and the
/// window's loss account.
fn profile(exe: &Path, args: &[&str]) -> (ProcessSamples, LossReport) {
    let mut argv = vec![exe.display().to_string()];
    argv.extend(args.iter().map(ToString::to_string));
    let opts = CollectOptions {
        target: Target::Command(argv),
        duration: Some(Duration::from_secs(30)),
        rate: Rate {
            frequency: 999,
            period: None,
            core_hz: nominal_core_hz(),
        },
        include_kernel: true,
        perturbation: Perturbation::User,
        thinning: 1,
        redraw_every: Duration::from_millis(50),
        ring_bytes: 8 << 20,
        window: None,
        cpu_time: false,
        drain_every: DRAIN_EVERY,
        stacks: true,
        stack_memory: StackMemory::default(),
    };
    let c = collect(&opts, &mut |m| eprintln!("{m}")).expect("collect");
    let p = c
        .set
        .processes
        .into_values()
        .find(|p| p.comm == "stacks")
        .expect("samples of the stacks process");
    (p, c.run.lost)
}

/// Function names of a stack's user frames, leaf first (return addresses looked up at
/// `addr - 1`, the call).
struct Names {
    binaries: HashMap<PathBuf, Option<Binary>>,
}

impl Names {
    fn of(&mut self, p: &ProcessSamples, s: &CallStack) -> Vec<String> {
        s.user
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let a = if i == 0 { a } else { a - 1 };
                self.name(p, a).unwrap_or_else(|| format!("{a:#x}"))
            })
            .collect()
    }

    fn name(&mut self, p: &ProcessSamples, addr: u64) -> Option<String> {
        let m = p.maps.as_ref()?.find(addr)?;
        let MappedObject::File { path, .. } = &m.object else {
            return None;
        };
        let bin = self
            .binaries
            .entry(path.clone())
            .or_insert_with(|| Binary::open(path).ok())
            .as_ref()?;
        let vaddr = bin.vaddr_of_offset(m.file_offset(addr))?;
        Some(bin.function_at(vaddr)?.name)
    }
}

/// Per stack: its symbolised user path (outermost first, `;`-joined, as folded text),
/// how it ended and its cpu-clock samples.
fn paths(p: &ProcessSamples) -> Vec<(String, StackEnd, u64)> {
    let mut names = Names {
        binaries: HashMap::new(),
    };
    p.stacks
        .iter()
        .map(|(s, stat)| {
            let mut f = names.of(p, &s);
            f.reverse();
            let n = stat.ips.get(&EventRole::CpuClock).map_or(0, |e| e.0);
            (f.join(";"), s.end, n)
        })
        .collect()
}

/// The part of a folded path from `main` on (what runs before main differs between
/// unwinders and libc builds).
fn from_main(path: &str) -> Option<String> {
    let frames: Vec<&str> = path.split(';').collect();
    let i = frames.iter().position(|&f| f == "main")?;
    Some(frames[i..].join(";"))
}

/// Samples under each path from main on, and all samples.
fn shares(paths: &[(String, StackEnd, u64)]) -> (HashMap<String, u64>, u64) {
    let mut by = HashMap::new();
    let mut total = 0;
    for (path, end, n) in paths {
        total += n;
        if *end == StackEnd::Complete {
            if let Some(m) = from_main(path) {
                *by.entry(m).or_default() += n;
            }
        }
    }
    (by, total)
}

/// ≥ 90 % of the samples have a complete stack down to main.
fn assert_complete_to_main(
    what: &str,
    paths: &[(String, StackEnd, u64)],
) -> (HashMap<String, u64>, u64) {
    let (by, total) = shares(paths);
    let complete: u64 = by.values().sum();
    let mut top: Vec<_> = by.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1));
    eprintln!(
        "{what}: {complete} of {total} samples complete to main; top: {:?}",
        &top[..top.len().min(5)]
    );
    assert!(total >= 200, "{what}: only {total} samples");
    assert!(
        complete as f64 >= 0.9 * total as f64,
        "{what}: {complete} of {total} samples have a complete stack down to main; \
         incomplete: {:?}",
        paths
            .iter()
            .filter(|(p, e, _)| *e != StackEnd::Complete || from_main(p).is_none())
            .take(8)
            .collect::<Vec<_>>()
    );
    (by, total)
}

/// `perf record -e cpu-clock --call-graph dwarf` of the same program: samples per path
/// from main on, and all samples of the process. `None` when perf is missing.
fn perf_shares(exe: &Path, args: &[&str]) -> Option<(HashMap<String, u64>, u64)> {
    let dir = temp_dir("stacks-perf");
    let data = dir.join("perf.data");
    let rec = Command::new("perf")
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "--call-graph",
            "dwarf",
            "-o",
        ])
        .arg(&data)
        .arg("--")
        .arg(exe)
        .args(args)
        .output();
    match rec {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("perf record: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "perf missing in CI: {e}");
            cpi_tests::skip(format_args!(
                "the perf comparison: perf not available ({e})"
            ));
            return None;
        }
    }
    let out = Command::new("perf")
        .args(["script", "-F", "comm,ip,sym", "-i"])
        .arg(&data)
        .output()
        .expect("perf script");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut by = HashMap::new();
    let mut total = 0;
    for block in text.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        if lines.next().map(str::trim) != Some("stacks") {
            continue;
        }
        total += 1;
        // `ADDR SYM+0xOFF` or `ADDR [unknown]`, leaf first.
        let mut f: Vec<&str> = lines
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(|s| s.split('+').next().unwrap_or(s))
            .collect();
        f.reverse();
        if let Some(m) = from_main(&f.join(";")) {
            *by.entry(m).or_default() += 1;
        }
    }
    Some((by, total))
}

/// The chain program's two paths: shares within 4 standard errors of perf's
/// `--call-graph dwarf` on the same program (two independent sample sets).
fn chain(tag: &str, flags: &[&str]) {
    if !require_root("stacks from live collection") {
        return;
    }
    let Some(exe) = program(tag, flags) else {
        return;
    };
    let _serial = cpu_heavy();
    let args = ["chain", "300"];
    let (p, lost) = profile(&exe, &args);
    let (ours, n) = assert_complete_to_main(tag, &paths(&p));
    // A stack can fail for reasons outside the unwinder (a stack page the kernel could
    // not read in the sample's context, a sample as the process starts or exits); one
    // was seen in 800 on a CI run. Rare is what is asserted; completeness is above.
    assert!(lost.stacks_failed * 100 <= n, "{n} samples: {lost:?}");
    let ab = "main;path_a;path_b;leaf";
    let c = "main;path_c;leaf";
    // A path's samples include those with frames below its leaf: perf appends the
    // kernel's (an interrupt on the way back to user mode, frequent on a loaded host:
    // "main;path_a;path_b;leaf;asm_sysvec_reschedule_ipi;irqentry_exit_to_user_mode").
    let share = |by: &HashMap<String, u64>, k: &str, n: u64| {
        let under = |p: &str| p == k || p.strip_prefix(k).is_some_and(|r| r.starts_with(';'));
        by.iter()
            .filter(|(p, _)| under(p))
            .map(|(_, &c)| c)
            .sum::<u64>() as f64
            / n as f64
    };
    assert!(
        share(&ours, ab, n) > share(&ours, c, n) && share(&ours, c, n) > 0.1,
        "{tag}: {ours:?}"
    );
    let Some((theirs, recorded)) = perf_shares(&exe, &args) else {
        return;
    };
    // Shares among perf's stacks complete to main, as ours are (checked above): a stack
    // perf's DWARF unwinding left short (8 KiB copied; under load perf's own failures
    // grow) is in neither path, and counting it would bias the deeper path down
    // (0.518 against the program's 2/3 in one loaded CI run, ours 0.658).
    let m: u64 = theirs.values().sum();
    for path in [ab, c] {
        let (a, b) = (share(&ours, path, n), share(&theirs, path, m));
        let p = (a + b) / 2.0;
        let se = (p * (1.0 - p) * (1.0 / n as f64 + 1.0 / m as f64)).sqrt();
        eprintln!(
            "{tag} {path}: ours {a:.3} of {n}, perf {b:.3} of {m} complete ({recorded} recorded), se {se:.3}"
        );
        assert!(
            (a - b).abs() <= 4.0 * se + 0.01,
            "{tag} {path}: ours {a:.3} ({n} samples) vs perf --call-graph dwarf {b:.3} ({m}): {theirs:?}"
        );
    }
}

#[test]
fn chain_stacks_are_complete_and_match_perf_without_frame_pointers() {
    chain("stacks-nofp", &[]);
}

#[test]
fn chain_stacks_are_complete_and_match_perf_with_frame_pointers() {
    chain("stacks-fp", &["-fno-omit-frame-pointer"]);
}

/// qsort in Debian's libc (no frame pointers) calling back into the program: unwound
/// through libc's `.eh_frame` down to main.
fn qsort(tag: &str, flags: &[&str]) {
    if !require_root("stacks from live collection") {
        return;
    }
    let Some(exe) = program(tag, flags) else {
        return;
    };
    let _serial = cpu_heavy();
    let (p, _) = profile(&exe, &["qsort", "300"]);
    let (by, total) = assert_complete_to_main(tag, &paths(&p));
    let through: u64 = by
        .iter()
        // libc's entry is named as perf names it: with libc6-dbg's symbols that is
        // `__GI___qsort_r` (a strong local beats the weak `qsort_r`), else `qsort`.
        .filter(|(k, _)| {
            k.split(';').nth(2).is_some_and(|f| f.contains("qsort"))
                && k.starts_with("main;sort_all;")
                && k.contains(";by_value")
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        through as f64 >= 0.9 * total as f64,
        "{tag}: {through} of {total} samples under main;sort_all;qsort;…;by_value: {by:?}"
    );
}

#[test]
fn qsort_callbacks_unwind_through_libc_without_frame_pointers() {
    qsort("stacks-qsort-nofp", &[]);
}

#[test]
fn qsort_callbacks_unwind_through_libc_with_frame_pointers() {
    qsort("stacks-qsort-fp", &["-fno-omit-frame-pointer"]);
}

/// A library loaded after the process's maps were read, whose code is only ever a
/// caller (it calls back into the executable, so no sample's own address is in it):
/// the stacks through it are complete to main, not stopped at its code as unknown.
/// Before, every such stack stopped there, and a run whose maps were first read while
/// `ld.so` was still mapping libc had every path of the run cut at libc.
#[test]
fn stacks_through_a_library_that_only_calls_back_are_complete() {
    if !require_root("stacks from live collection") {
        return;
    }
    let dir = temp_dir("stacks-late");
    let Some(exe) = compile_c("stacks.c", &dir, "stacks", &[]) else {
        return;
    };
    let Some(lib) = compile_c("calllib.c", &dir, "calllib.so", &["-shared", "-fPIC"]) else {
        return;
    };
    let _serial = cpu_heavy();
    let (p, lost) = profile(&exe, &["late", "300", lib.to_str().unwrap()]);
    let paths = paths(&p);
    let (by, total) = assert_complete_to_main("late", &paths);
    let through = by.get("main;lib_calls;leaf").copied().unwrap_or(0);
    eprintln!("late: {through} of {total} under main;lib_calls;leaf; {lost:?}");
    // Half the work runs under lib_calls: a path with no samples is the library's
    // frames lost, whatever the sampling.
    assert!(through >= 10, "{by:?}");
    // As for failed stacks: one can stop at code not yet mapped as the process starts.
    // Since `-- CMD` counts per CPU, suite runs cut stacks at one return address, the
    // same in each run, where runs alone cut 0-2 of ~600: 22-25 of ~620 (3.4-3.9 %);
    // 14 of 654 and 14 of 669 once a miss reads /proc again when the kernel's mmap
    // record is not drained yet (2026-12-07). The cause is not found, so the bound is
    // 5 % until it is (before the records fix, every path of such a run was cut).
    assert!(
        lost.stacks_unknown_code * 20 <= total,
        "{lost:?}: {:?}",
        paths
            .iter()
            .filter(|(_, e, _)| *e == StackEnd::UnknownCode)
            .collect::<Vec<_>>()
    );
}

/// 10 000 frames deep: deeper than the copied stack; every such stack is cut, flagged
/// and counted, never made up.
#[test]
fn deep_recursion_is_truncated_and_counted() {
    if !require_root("stacks from live collection") {
        return;
    }
    let Some(exe) = program("stacks-deep", &[]) else {
        return;
    };
    let _serial = cpu_heavy();
    let (p, lost) = profile(&exe, &["recurse", "150"]);
    let paths = paths(&p);
    let total: u64 = paths.iter().map(|x| x.2).sum();
    let truncated: u64 = paths
        .iter()
        .filter(|(path, end, _)| *end == StackEnd::Truncated && !path.contains("main"))
        .map(|x| x.2)
        .sum();
    eprintln!("recurse: {truncated} of {total} truncated; {lost:?}");
    assert!(total >= 100, "{total} samples");
    assert!(truncated as f64 >= 0.9 * total as f64, "{paths:?}");
    assert!(lost.stacks_truncated >= truncated, "{lost:?}");
    // What is there is the recursion itself, frame after frame.
    assert!(paths
        .iter()
        .filter(|(_, end, _)| *end == StackEnd::Truncated)
        .all(|(path, _, _)| path.split(';').all(|f| f == "recurse" || f == "leaf")));
}

/// The caps on the user-stack copy that every loaded copy of the kernel side's
/// `STACK_CAPS` holds, as `bpftool` dumps them: (tgid, bytes).
fn stack_caps_held() -> Vec<(u32, u32)> {
    let json = |args: &[&str]| -> Option<serde_json::Value> {
        let out = Command::new("bpftool").arg("-j").args(args).output().ok()?;
        // A map listed a moment ago is gone when the collector that held it (another
        // test's) ended in between.
        let gone = String::from_utf8_lossy(&out.stdout).contains("No such file or directory");
        assert!(out.status.success() || gone, "bpftool {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).ok().filter(|_| !gone)
    };
    // Raw little-endian bytes, as "0x1c" strings (the map has no BTF).
    let u32_of = |v: &serde_json::Value| -> Option<u32> {
        let bytes: Vec<u8> = (v.as_array()?.iter())
            .map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
            .collect::<Option<_>>()?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?))
    };
    let maps = json(&["map", "show"]).expect("bpftool's list of maps");
    let ids: Vec<String> = (maps.as_array().expect("a list").iter())
        .filter(|m| m["name"] == "STACK_CAPS")
        .map(|m| m["id"].to_string())
        .collect();
    ids.iter()
        .filter_map(|id| json(&["map", "dump", "id", id]))
        .flat_map(|d| d.as_array().cloned().unwrap_or_default())
        .filter_map(|e| Some((u32_of(&e["key"])?, u32_of(&e["value"])?)))
        .collect()
}

/// The copy of a process's stack is cut to what its stacks need (cpi-user/src/collect/
/// stack_caps.rs), as the kernel's map shows while it runs shallow; when its stacks
/// then grow past that cut, still within a whole copy, the copy grows back and they
/// unwind complete.
#[test]
fn the_stack_copy_is_cut_for_shallow_stacks_and_grows_back_for_deep_ones() {
    if !require_root("stacks from live collection") {
        return;
    }
    let Some(exe) = program("stacks-grow", &[]) else {
        return;
    };
    let _serial = cpu_heavy();
    let done = AtomicBool::new(false);
    let (seen, (p, lost)) = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            let mut seen = Vec::new();
            while !done.load(Ordering::Relaxed) {
                seen.extend(stack_caps_held());
                std::thread::sleep(Duration::from_millis(50));
            }
            seen
        });
        let got = profile(&exe, &["grow", "1000"]);
        done.store(true, Ordering::Relaxed);
        (watch.join().unwrap(), got)
    });
    let caps: Vec<u32> = (seen.iter())
        .filter(|(pid, _)| *pid == p.pid)
        .map(|x| x.1)
        .collect();
    let paths = paths(&p);
    let deep = |path: &String| path.contains(";deep;");
    let total: u64 = paths.iter().filter(|x| deep(&x.0)).map(|x| x.2).sum();
    let complete: u64 = (paths.iter())
        .filter(|(path, end, _)| *end == StackEnd::Complete && from_main(path).is_some())
        .filter(|x| deep(&x.0))
        .map(|x| x.2)
        .sum();
    eprintln!(
        "caps held for {}: {:?}; deep stacks complete: {complete} of {total}; {lost:?}",
        p.pid,
        caps.iter().collect::<std::collections::BTreeSet<_>>()
    );
    assert!(
        caps.iter().any(|&c| (c as usize) < MAX_STACK_BYTES / 2),
        "the shallow phase's copy was never cut: {caps:?}"
    );
    assert!(total >= 200, "only {total} samples in deep");
    // A copy the cap stopped is a cut stack (truncated), not a failed one.
    assert!(
        lost.stacks_failed * 100 <= total,
        "{total} samples: {lost:?}"
    );
    assert!(
        complete as f64 >= 0.9 * total as f64,
        "{complete} of {total} deep stacks complete to main"
    );
}
