//! Call paths in every output: a profile with stacks, made by the library's
//! own analysis from samples with stacks on a real compiled program (sim_calls:
//! main → outer → inner / leaf), read by `go tool pprof -traces`, parsed back from
//! `--format folded`, shown by the table and `--callers`, kept by `report --store`
//! merging, and pushed to the local Pyroscope receiver as multi-frame samples.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use cpi_agent::push::{PushConfig, Pusher};
use cpi_agent::store::Store;
use cpi_agent::Window;
use cpi_common::policy::Perturbation;
use cpi_common::wire::{
    BranchEntry, BranchSample, EventRole, IpSample, SampleHeader, SampleKind, WIRE_VERSION,
};
use cpi_tests::{cpi_bpf, output_ok};
use cpi_user::binary::{Binary, FlowKind};
use cpi_user::profile::model::{EventInfo, EventUnit, LossReport, Mode, Profile, RunInfo};
use cpi_user::profile::{analyze, AnalysisOptions, CallStack, SampleSet, StackEnd};
use cpi_user::report::file::write_json;
use cpi_user::report::pprof::PprofProfile;

use crate::report_fixture::{have, scratch};

const PID: u32 = 4242;

/// Samples per path (cycles samples, period 1000): (path leaf first, IP samples, branch
/// samples).
const INNER: u64 = 60;
const LEAF: u64 = 20;
const OUTER: u64 = 20;
const UNSTACKED: u64 = 5;

fn ip(addr: u64) -> IpSample {
    IpSample {
        header: SampleHeader {
            version: WIRE_VERSION,
            kind: SampleKind::Ip as u16,
            tgid: PID,
            tid: PID,
            event: EventRole::Cycles as u32,
            period: 1000,
            ip: addr,
            ..Default::default()
        },
    }
}

/// A branch sample whose one-range window is [first, last] (window 1).
fn branch(first: u64, last: u64) -> BranchSample {
    let header = SampleHeader {
        version: WIRE_VERSION,
        kind: SampleKind::Branch as u16,
        tgid: PID,
        tid: PID,
        event: EventRole::Branches as u32,
        period: 2000,
        ..Default::default()
    };
    BranchSample::new(
        header,
        &[
            BranchEntry::new(last, first, false, 0),
            BranchEntry::new(first - 1, first, false, 0),
        ],
    )
}

/// `/proc/PID/maps` text mapping the non-PIE `exe` where its headers say.
fn maps_text(exe: &Path, bin: &Binary) -> String {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(exe).unwrap();
    let dev = format!(
        "{:x}:{:02x} {}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    );
    bin.segments
        .iter()
        .map(|s| {
            format!(
                "{:x}-{:x} r{}p {:08x} {dev} {}\n",
                s.vaddr & !0xfff,
                (s.vaddr + s.memsz + 0xfff) & !0xfff,
                if s.executable { 'x' } else { '-' },
                s.offset & !0xfff,
                exe.display()
            )
        })
        .collect()
}

/// The profile: stacks main → outer → inner (60 samples), main → outer → leaf (20),
/// main → outer (20), and 5 samples without a stack; branch samples under the first two
/// give inner and leaf their instructions.
fn profile() -> (Profile, PathBuf) {
    let exe = cpi_tests::programs::compile("sim_calls.c", &["-O2", "-g0", "-fno-PIE", "-no-pie"])
        .expect("gcc builds sim_calls.c");
    let bin = Binary::open(&exe).unwrap();
    let func = |n: &str| bin.function_by_name(n).unwrap();
    let first_two = |n: &str| {
        let c = bin.cfg(&func(n), &[]).unwrap();
        assert!(!c.instructions[0].kind.always_transfers());
        (c.instructions[0].addr, c.instructions[1].addr)
    };
    let ret = |caller: &str, callee: &str| {
        let c = bin.cfg(&func(caller), &[]).unwrap();
        let target = func(callee).start;
        c.instructions
            .iter()
            .find(|i| i.kind == FlowKind::Call && i.target == Some(target))
            .unwrap_or_else(|| panic!("{caller} calls {callee}"))
            .next()
    };
    let stack = |user: Vec<u64>| CallStack {
        kernel: Box::new([]),
        user: user.into(),
        end: StackEnd::Complete,
    };
    let main_ret = ret("main", "outer");
    let (i0, i1) = first_two("inner");
    let (l0, l1) = first_two("leaf");
    let (o0, _) = first_two("outer");
    let in_inner = stack(vec![i1, ret("outer", "inner"), main_ret]);
    let in_leaf = stack(vec![l0, ret("outer", "leaf"), main_ret]);
    let in_outer = stack(vec![o0, main_ret]);

    let mut set = SampleSet::new(1);
    let p = set.process(PID);
    p.comm = "sim_calls".into();
    p.maps = Some(cpi_user::procmap::ProcessMaps::parse(&maps_text(&exe, &bin)).unwrap());
    for (s, n) in [(&in_inner, INNER), (&in_leaf, LEAF), (&in_outer, OUTER)] {
        let at = s.user[0];
        for _ in 0..n {
            set.add_ip_with_stack(&ip(at), Some(s)).unwrap();
        }
    }
    for _ in 0..UNSTACKED {
        set.add_ip(&ip(i1)).unwrap();
    }
    for _ in 0..30 {
        set.add_branch_with_stack(&branch(i0, i1), Some(&in_inner));
        set.add_branch_with_stack(&branch(l0, l1), Some(&in_leaf));
    }
    let event = |role, name: &str, period, samples| EventInfo {
        role,
        name: name.into(),
        period,
        jitter: 0,
        thinning: 1,
        unit: EventUnit::Events,
        samples,
        also: Vec::new(),
    };
    let run = RunInfo {
        mode: Mode::Cpi,
        mode_reason: "synthetic samples with stacks".into(),
        command: vec![exe.display().to_string()],
        duration_secs: 1.0,
        events: vec![
            event(
                EventRole::Cycles,
                "cycles",
                1000,
                INNER + LEAF + OUTER + UNSTACKED,
            ),
            event(EventRole::Branches, "branches", 2000, 60),
        ],
        perturbation: Perturbation::None,
        lost: LossReport::default(),
    };
    let opts = AnalysisOptions {
        sample_floor: 5,
        ..Default::default()
    };
    (analyze(&set, run, &opts), exe)
}

/// `profile()` written as a profile file in `dir`.
fn profile_file(dir: &Path) -> (Profile, PathBuf) {
    let (p, _) = profile();
    let file = dir.join("stacks.json");
    write_json(&p, std::fs::File::create(&file).unwrap()).unwrap();
    (p, file)
}

fn report(args: &[&str]) -> String {
    let out = output_ok(Command::new(cpi_bpf()).arg("report").args(args));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn analysis_gives_each_path_its_samples_and_cpi() {
    let (p, _) = profile();
    let proc = &p.processes[0];
    let chain = |s: &cpi_user::profile::model::StackProfile| -> Vec<String> {
        s.frames.iter().rev().map(|f| f.function.clone()).collect()
    };
    let chains: Vec<(Vec<String>, u64)> =
        proc.stacks.iter().map(|s| (chain(s), s.samples)).collect();
    assert_eq!(
        chains,
        [
            (vec!["main".into(), "outer".into(), "inner".into()], INNER),
            (vec!["main".into(), "outer".into(), "leaf".into()], LEAF),
            (vec!["main".into(), "outer".into()], OUTER),
            (vec!["[no stack]".into()], UNSTACKED),
        ],
        "hottest first, every sample in one path"
    );
    let inner = &proc.stacks[0];
    let f = proc.functions.iter().find(|f| f.name == "inner").unwrap();
    // All of inner's ranges ran under this path: the same instructions.
    assert_eq!(inner.instructions, f.measures.instructions);
    let cpi = inner.cpi.expect("above the floor");
    assert_eq!(
        cpi.value,
        inner.cycles.unwrap() / inner.instructions.unwrap()
    );
    assert!(cpi.rel_error > 0.0);
}

#[test]
fn go_tool_pprof_traces_show_the_call_chains() {
    let dir = scratch("stacks-pprof");
    let (_, file) = profile_file(&dir);
    let pb = dir.join("stacks.pb.gz");
    report(&[
        file.to_str().unwrap(),
        "--format",
        "pprof",
        "-o",
        pb.to_str().unwrap(),
    ]);
    if !have("go", "version") {
        assert!(std::env::var_os("CI").is_none(), "go missing in CI");
        cpi_tests::skip(format_args!(
            "`go` not installed (cargo xtask setup installs golang-go)"
        ));
        return;
    }
    let out = output_ok(
        Command::new("go")
            .args(["tool", "pprof", "-traces", "-sample_index=samples"])
            .arg(&pb)
            .env("PPROF_BINARY_PATH", "/nonexistent")
            .env("HOME", std::env::temp_dir()),
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // Each trace: the value on the leaf's line, then one line per caller.
    let traces: Vec<Vec<String>> = text
        .split("-----------+-------------------------------------------------------")
        .map(|t| {
            t.lines()
                .filter_map(|l| l.split_whitespace().last().map(str::to_string))
                .filter(|w| !w.is_empty())
                .collect()
        })
        .collect();
    let has = |chain: &[&str]| {
        traces
            .iter()
            .any(|t| t.ends_with(&chain.iter().map(|s| s.to_string()).collect::<Vec<_>>()))
    };
    assert!(has(&["inner", "outer", "main"]), "{text}");
    assert!(has(&["leaf", "outer", "main"]), "{text}");
    assert!(has(&["outer", "main"]), "{text}");
    // The sample counts of the chains are the paths'.
    assert!(
        text.contains(&format!("{INNER}   inner")) || text.contains(&format!("{INNER} inner")),
        "{text}"
    );
}

#[test]
fn folded_parses_back_to_the_paths() {
    let dir = scratch("stacks-folded");
    let (p, file) = profile_file(&dir);
    let text = report(&[file.to_str().unwrap(), "--format", "folded"]);
    // Brendan Gregg's format: `frame;frame;… COUNT`, the count after the last space.
    let mut parsed: Vec<(Vec<String>, u64)> = Vec::new();
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("`stack count`");
        parsed.push((
            stack.split(';').map(str::to_string).collect(),
            count.parse().expect("an integer count"),
        ));
    }
    let want = |c: &[&str], n: u64| (c.iter().map(|s| s.to_string()).collect::<Vec<_>>(), n);
    assert_eq!(
        parsed,
        [
            want(&["sim_calls", "main", "outer", "inner"], INNER),
            want(&["sim_calls", "main", "outer", "leaf"], LEAF),
            want(&["sim_calls", "main", "outer"], OUTER),
            want(&["sim_calls", "[no stack]"], UNSTACKED),
        ]
    );
    assert_eq!(
        parsed.iter().map(|x| x.1).sum::<u64>(),
        p.processes[0].samples,
        "the counts are the process's samples"
    );
}

#[test]
fn table_shows_call_paths_and_callers() {
    let dir = scratch("stacks-table");
    let (_, file) = profile_file(&dir);
    let f = file.to_str().unwrap();
    let text = report(&[f]);
    assert!(text.contains("hottest call paths"), "{text}");
    assert!(text.contains("main → outer → inner"), "{text}");
    assert!(text.contains("call tree: inclusive and self"), "{text}");
    // Fits the terminal like the other tables: the path is cut at its root end.
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", f])
            .env("COLUMNS", "80"),
    );
    let narrow = String::from_utf8(out.stdout).unwrap();
    assert!(narrow.lines().all(|l| l.chars().count() <= 80), "{narrow}");
    assert!(narrow.contains("→ inner"), "{narrow}");

    let callers = report(&[f, "--callers", "leaf"]);
    assert!(callers.contains("paths into leaf"), "{callers}");
    assert!(callers.contains("main → outer → leaf"), "{callers}");
    assert!(!callers.contains("→ inner"), "{callers}");
    // A name no function or path has errs as `--annotate` does, naming what resembles it.
    for (name, near) in [("nosuchfunction", None), ("lea", Some("leaf"))] {
        let out = Command::new(cpi_bpf())
            .args(["report", f, "--callers", name])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("no function named {name:?}")),
            "{err}"
        );
        assert!(near.is_none_or(|n| err.contains(n)), "{err}");
    }
}

#[test]
fn store_merge_keeps_the_paths() {
    let dir = scratch("stacks-store");
    let (p, _) = profile();
    let store_dir = dir.join("store");
    let mut store = Store::open(&store_dir, Duration::from_secs(3600), 1 << 30, None).unwrap();
    let now = SystemTime::now();
    for i in 0..2u64 {
        let start = now - Duration::from_secs(120 - 60 * i);
        store
            .write(&Window {
                start,
                end: start + Duration::from_secs(60),
                profile: p.clone(),
            })
            .unwrap();
    }
    let text = report(&["--store", store_dir.to_str().unwrap(), "--format", "json"]);
    let merged = Profile::from_json(text.as_bytes()).unwrap();
    let s = &merged.processes[0].stacks;
    assert_eq!(s.len(), p.processes[0].stacks.len());
    for (m, one) in s.iter().zip(&p.processes[0].stacks) {
        assert_eq!(m.frames, one.frames);
        assert_eq!(m.samples, 2 * one.samples);
        assert_eq!(m.instructions.map(|x| x / 2.0), one.instructions);
        // Same CPI, a smaller error (twice the samples).
        if let (Some(a), Some(b)) = (m.cpi, one.cpi) {
            assert!((a.value - b.value).abs() < 1e-9 * b.value);
            assert!(a.rel_error < b.rel_error);
        }
    }
}

#[test]
fn pyroscope_receiver_gets_multi_frame_samples() {
    let (p, _) = profile();
    let rx = cpi_tests::pyroscope::Receiver::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let pusher = Pusher::new(PushConfig {
        url: rx.url(),
        tenant: None,
        service_label: cpi_agent::push::ServiceLabel::Comm,
        queue_windows: 4,
        timeout: Duration::from_secs(5),
        ca_file: None,
        password_file: None,
        token_file: None,
    })
    .unwrap();
    let now = SystemTime::now();
    pusher.submit(&Window {
        start: now - Duration::from_secs(10),
        end: now,
        profile: p,
    });
    pusher.flush(Duration::from_secs(10));
    assert!(rx.violations().is_empty(), "{:?}", rx.violations());
    let pushes = rx.accepted();
    let series = &pushes.first().expect("a push accepted").series;
    let prof: &PprofProfile = &series[0].profile;
    let names = |ids: &[u64]| -> Vec<String> {
        ids.iter()
            .map(|id| {
                let l = prof.location.iter().find(|l| l.id == *id).unwrap();
                let f = prof
                    .function
                    .iter()
                    .find(|f| f.id == l.line[0].function_id)
                    .unwrap();
                prof.string_table[f.name as usize].clone()
            })
            .collect()
    };
    let chains: Vec<Vec<String>> = prof.sample.iter().map(|s| names(&s.location_id)).collect();
    assert!(
        chains.contains(&vec!["inner".into(), "outer".into(), "main".into()]),
        "{chains:?}"
    );
    rx.stop();
}

/// `--callgraph` of a time profile (no branch records) said "no call graph" although
/// every sample has a stack: callers and callees now come from the stacks.
/// The recording (tests/golden/format1_stacks.json): leaf, called from path_b and path_c.
#[test]
fn time_profile_call_graph_comes_from_the_stacks() {
    let f = cpi_tests::workspace_root().join("tests/golden/format1_stacks.json");
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--callgraph"])
            .arg(&f)
            .env("COLUMNS", "80"),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("call graph from call stacks"), "{text}");
    let edge = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("← {name} ")))
            .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no caller {name}: {text}"))
    };
    // path_b calls leaf twice as often as path_c (tests/programs/stacks.c's chain).
    let (b, c) = (edge("path_b"), edge("path_c"));
    assert!(b > c && c > 0, "{b} {c}");
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
}
