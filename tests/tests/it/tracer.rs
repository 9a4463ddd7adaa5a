//! The tracer's exact counts against callgrind's (an independent oracle: same VEX front
//! end, but it counts every instruction itself, per basic block).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use cpi_tests::tracer::{
    callgrind_counts, program, shared_tool_dir, tool_dir, words_text, InsnKey,
};
use cpi_user::binary::BinaryCache;
use cpi_user::procmap::MappedObject;
use cpi_user::profile::SampleSet;
use cpi_user::sim::replay::{InsnTruth, Replay, Truth};
use cpi_user::sim::run::record_trace;
use cpi_user::sim::trace::{Event, TraceReader};

fn trace_truth(tool: &Path, cmd: &[&str], dir: &Path) -> Truth {
    let file = dir.join("trace.bin");
    let cmd: Vec<OsString> = cmd.iter().map(OsString::from).collect();
    let status = record_trace(tool, &cmd, &file, Stdio::null()).expect("tracer runs");
    assert!(status.success(), "traced command failed: {status}");
    let mut replay = Replay::default();
    let f = std::fs::File::open(&file).unwrap();
    replay
        .run(f, &mut SampleSet::new(1), None)
        .expect("trace reads");
    let _ = std::fs::remove_file(&file);
    replay.truth()
}

/// Runtime address → callgrind's (object, ELF address), through analysis's own ELF
/// reader.
struct Addrs<'a> {
    truth: &'a Truth,
    binaries: BinaryCache,
}

impl Addrs<'_> {
    fn key(&mut self, a: u64) -> Option<InsnKey> {
        let m = self.truth.maps.find(a)?;
        let MappedObject::File { path, .. } = &m.object else {
            return None;
        };
        let v = self
            .binaries
            .get(path)
            .ok()?
            .vaddr_of_offset(m.file_offset(a))?;
        Some((
            std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()),
            v,
        ))
    }
}

/// Every instruction's count equals callgrind's, with two measured, explained
/// exceptions:
/// * `rep` string instructions: callgrind counts iterations, we count executions
///   (hardware retires one instruction), so ours ≤ callgrind's and ≥ 1 when it ran;
/// * ranges ending in a system call that never returns to the next instruction (a
///   thread's exit, `rt_sigreturn`): callgrind charges a basic block when it completes,
///   and those never do, so ours = callgrind's + the executions of such ranges.
///
/// `only`: compare the instructions of this object alone (see
/// [`threads_and_signals_match_callgrind`] for why).
fn compare(name: &str, truth: &Truth, cg: &HashMap<InsnKey, u64>, only: Option<&Path>) {
    let mut addrs = Addrs {
        truth,
        binaries: BinaryCache::new(),
    };
    let mut ours: HashMap<InsnKey, InsnTruth> = HashMap::new();
    let mut unreturned: HashMap<InsnKey, u64> = HashMap::new();
    for (&a, t) in &truth.insns {
        let k = addrs.key(a).expect("executed code maps to an ELF address");
        let c: u64 = truth
            .unreturned_ranges
            .iter()
            .filter(|&&(s, e, _)| (s..=e).contains(&a))
            .map(|r| r.2)
            .sum();
        if only.is_some_and(|o| k.0 != o) {
            continue;
        }
        if c > 0 {
            unreturned.insert(k.clone(), c);
        }
        ours.insert(k, *t);
    }
    // Callgrind's `???` entries are runtime addresses.
    let mut theirs: HashMap<InsnKey, u64> = HashMap::new();
    for ((ob, a), &c) in cg {
        let k = if ob == Path::new("???") {
            addrs.key(*a).unwrap_or((ob.clone(), *a))
        } else {
            (ob.clone(), *a)
        };
        if only.is_some_and(|o| k.0 != o) {
            continue;
        }
        *theirs.entry(k).or_default() += c;
    }
    let mut bad: Vec<(InsnKey, u64, u64)> = Vec::new();
    let (mut exact, mut reps, mut at_exit) = (0u64, 0u64, 0u64);
    for (k, t) in &ours {
        let c = theirs.get(k).copied().unwrap_or(0);
        let ok = if t.rep {
            reps += 1;
            t.count <= c && (c == 0) == (t.count == 0)
        } else if t.count == c {
            exact += 1;
            true
        } else if unreturned
            .get(k)
            .is_some_and(|&u| t.count > c && t.count <= c + u)
        {
            at_exit += 1;
            true
        } else {
            false
        };
        if !ok {
            bad.push((k.clone(), t.count, c));
        }
    }
    for (k, &c) in &theirs {
        if c > 0 && !ours.contains_key(k) {
            bad.push((k.clone(), 0, c));
        }
    }
    bad.sort();
    assert!(!ours.is_empty(), "{name}: nothing to compare");
    eprintln!(
        "{name}: {} instructions executed, {} distinct: {exact} exact, {reps} rep, \
         {at_exit} in unreturned-syscall ranges; {} differ",
        truth.instructions,
        ours.len(),
        bad.len()
    );
    for ((p, a), o, c) in bad.iter().take(30) {
        eprintln!("  {} {a:#x}: ours {o}, callgrind {c}", p.display());
    }
    assert!(bad.is_empty(), "{name}: {} instructions differ", bad.len());
    assert!(
        at_exit <= 20,
        "{name}: {at_exit} instructions in unreturned-syscall ranges"
    );
    assert_eq!(truth.unknown_instructions, 0, "every range decoded");
    assert_eq!(truth.stats.anomalies, 0);
}

fn check(name: &str, cmd: &[&str], only: Option<&Path>) -> Option<Truth> {
    let tool = match tool_dir() {
        Ok(t) => t,
        Err(why) => {
            cpi_tests::skip(&why);
            return None;
        }
    };
    let dir: PathBuf =
        std::env::temp_dir().join(format!("cpi-tracer-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shared = shared_tool_dir(&tool, &dir).unwrap();
    let truth = trace_truth(&shared, cmd, &dir);
    let cg = callgrind_counts(&shared, cmd, &dir).unwrap();
    compare(name, &truth, &cg, only);
    let _ = std::fs::remove_dir_all(&dir);
    Some(truth)
}

#[test]
fn test_program_counts_equal_callgrind() {
    let exe = program("sim_mix").unwrap();
    check("sim_mix", &[exe.to_str().unwrap(), "1"], None);
}

/// Threads (serialised by Valgrind, one range stream per thread) and signals (the
/// interrupted range ends, the handler starts a fresh one).
///
/// Compared on the program's own code only: what libc runs in `pthread_create`/`join`
/// (futex waits, spinning) depends on when Valgrind switches threads, which differs
/// between the tracer's run and callgrind's (94 libc instructions differed by one on an
/// Intel host). The program's own code (the workers, the signal handler, main, each
/// with a fixed trip count) runs the same every time, and it is where thread switches
/// and signal deliveries cut ranges, so a tracer that mishandled them still fails here.
#[test]
fn threads_and_signals_match_callgrind() {
    let exe = program("sim_threads").unwrap();
    let own = std::fs::canonicalize(&exe).unwrap();
    let Some(truth) = check("sim_threads", &[exe.to_str().unwrap()], Some(&own)) else {
        return;
    };
    eprintln!("{:?}", truth.stats);
    assert_eq!(truth.stats.interrupts, 20, "one per raise()");
    assert!(truth.stats.threads >= 3, "main and two workers");
}

#[test]
fn debian_gzip_counts_equal_callgrind() {
    let input = std::env::temp_dir().join(format!("cpi-tracer-gzip-{}.txt", std::process::id()));
    std::fs::write(&input, words_text(200_000)).unwrap();
    check(
        "gzip",
        &["/usr/bin/gzip", "-c", "-6", input.to_str().unwrap()],
        None,
    );
    let _ = std::fs::remove_file(&input);
}

/// A program that execs: the tool writes out the caller's trace at the execve, ending its
/// range on the system call, and the new program's tool instance goes on in the same
/// trace (cpi-user/src/sim/trace.rs), which the replay starts again on.
#[test]
fn exec_ends_the_callers_trace_and_the_new_program_goes_on() {
    let tool = match tool_dir() {
        Ok(t) => t,
        Err(why) => {
            cpi_tests::skip(&why);
            return;
        }
    };
    let dir = cpi_tests::temp_dir("tracer_exec");
    let file = dir.join("trace.bin");
    let cmd: Vec<OsString> = ["/bin/sh", "-c", "exec /bin/true"]
        .iter()
        .map(OsString::from)
        .collect();
    let status = record_trace(&tool, &cmd, &file, Stdio::null()).expect("tracer runs");
    assert!(status.success(), "{status}");
    let mut r = TraceReader::new(std::fs::File::open(&file).unwrap()).unwrap();
    let (mut maps, mut last_end, mut images, mut execs) = (None, None, Vec::new(), 0);
    while let Some(ev) = r.next().expect("trace reads") {
        match ev {
            Event::Maps(m) => maps = Some(m),
            Event::End { from, .. } => last_end = Some(from),
            Event::Image { path } => images.push(path),
            Event::Exec => {
                execs += 1;
                // The caller's last range ends on the execve, in libc.
                let at = last_end.expect("a range ended before the exec");
                let m = maps.as_ref().and_then(|m| m.find(at));
                assert!(
                    m.is_some_and(|m| m.object.display_name().contains("libc.so")),
                    "{at:x} in {m:?}"
                );
            }
            _ => {}
        }
    }
    assert_eq!(execs, 1);
    assert_eq!(images, ["/bin/sh", "/bin/true"]);
    let mut replay = Replay::default();
    replay
        .run(
            std::fs::File::open(&file).unwrap(),
            &mut SampleSet::new(1),
            None,
        )
        .expect("trace reads");
    let _ = std::fs::remove_dir_all(&dir);
    let truth = replay.truth();
    assert_eq!(truth.program, "/bin/true");
    assert_eq!(truth.replaced.len(), 1, "{:?}", truth.replaced);
    assert_eq!(truth.replaced[0].path, "/bin/sh");
    assert!(
        truth.replaced[0].instructions > 10_000,
        "{:?}",
        truth.replaced
    );
    // Only /bin/true's instructions are in the truth, with no range left without a start.
    assert!(truth.instructions > 10_000, "{}", truth.instructions);
    assert_eq!(truth.stats.anomalies, 0);
    assert!(
        truth
            .maps
            .mappings
            .iter()
            .all(|m| !m.object.display_name().contains("dash")),
        "{:?}",
        truth.maps
    );
}
