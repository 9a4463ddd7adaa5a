//! `perf script` import: samples written in every branch-stack text variant read back
//! as the same wire samples and the same SampleSet; the `import-perf` command gives the
//! same profile as analysing those samples directly.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::report_fixture::scratch;
use cpi_common::wire::{
    BranchEntry, BranchSample, EventRole, IpSample, SampleHeader, SampleKind, MAX_BRANCH_ENTRIES,
    WIRE_VERSION,
};
use cpi_tests::{cpi_bpf, output_ok};
use cpi_user::import::perf_script::{elf_layout, parse, ElfLayout, ImportOptions};
use cpi_user::profile::model::{Mode, Profile, RunInfo};
use cpi_user::profile::{analyze, AnalysisOptions, BranchAggregate, SampleSet};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// How to print entries: the field variants perf has had.
#[derive(Clone, Copy, Debug)]
enum Variant {
    /// `from/to/P/-/-/cycles` (old perf, no dso field).
    Six,
    /// `+ /type`, with `(dso)` after each address and a comm before pid/tid.
    SevenDsoComm,
    /// `+ /type/spec`, dso with `+0xoff` (dsoff).
    EightDsoff,
}

fn write_perf_script(samples: &[BranchSample], dso: &str, v: Variant) -> String {
    let mut s = String::from("# perf script -F pid,tid,ip,sym,dso,brstack\n");
    for x in samples {
        let h = &x.header;
        if matches!(v, Variant::SevenDsoComm) {
            s.push_str("bench ");
        }
        s.push_str(&format!(
            "{:>7}/{:<7} {:>16x} f ({dso})",
            h.tgid, h.tid, h.ip
        ));
        for e in x.entries() {
            let at = |a: u64| match v {
                Variant::Six => format!("0x{a:x}"),
                Variant::SevenDsoComm => format!("0x{a:x}({dso})"),
                Variant::EightDsoff => format!("0x{a:x}({dso}+0x{:x})", a & 0xfff),
            };
            let pred = if e.mispred() { 'M' } else { 'P' };
            let tail = match v {
                Variant::Six => String::new(),
                Variant::SevenDsoComm => "/COND".into(),
                Variant::EightDsoff => "/COND/NON_SPEC_CORRECT_PATH".into(),
            };
            s.push_str(&format!(
                " {}/{}/{pred}/-/-/{}{tail}",
                at(e.from),
                at(e.to),
                e.cycles()
            ));
        }
        s.push('\n');
    }
    s
}

/// Random but plausible samples: forward ranges inside [lo, hi).
fn synthetic(seed: u64, n: usize, lo: u64, hi: u64, period: u64) -> Vec<BranchSample> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let nr = rng.gen_range(2..=MAX_BRANCH_ENTRIES);
            let mut entries = [BranchEntry::default(); MAX_BRANCH_ENTRIES];
            for e in entries.iter_mut().take(nr) {
                let from = rng.gen_range(lo..hi);
                let to = rng.gen_range(lo..hi);
                *e = BranchEntry::new(from, to, rng.gen_bool(0.1), rng.gen_range(0..200));
            }
            BranchSample {
                header: SampleHeader {
                    version: WIRE_VERSION,
                    kind: SampleKind::Branch as u16,
                    nr: nr as u16,
                    tgid: 100 + (i % 2) as u32,
                    tid: 200 + (i % 3) as u32,
                    event: EventRole::Branches as u32,
                    period,
                    ip: entries[0].to,
                    ..Default::default()
                },
                entries,
            }
        })
        .collect()
}

fn same_sample(a: &BranchSample, b: &BranchSample) {
    assert_eq!(a.header, b.header);
    assert_eq!(a.entries(), b.entries());
}

fn sample_set(samples: &[BranchSample], window: usize) -> SampleSet {
    let mut set = SampleSet::new(window);
    for s in samples {
        set.add_branch(s);
    }
    set
}

fn same_set(a: &SampleSet, b: &SampleSet) {
    assert_eq!(
        a.processes.keys().collect::<Vec<_>>(),
        b.processes.keys().collect::<Vec<_>>()
    );
    for (pid, pa) in &a.processes {
        let pb = &b.processes[pid];
        let taken = |b: &BranchAggregate| b.taken().map(|(k, t)| (*k, *t)).collect::<Vec<_>>();
        let (mut ta, mut tb) = (taken(&pa.branches), taken(&pb.branches));
        ta.sort_by_key(|t| t.0);
        tb.sort_by_key(|t| t.0);
        assert_eq!(ta, tb, "pid {pid}");
        let ranges = |b: &BranchAggregate| b.ranges().collect::<BTreeMap<_, _>>();
        assert_eq!(ranges(&pa.branches), ranges(&pb.branches), "pid {pid}");
        assert_eq!(pa.branches.samples, pb.branches.samples);
        assert_eq!(pa.branches.short_samples, pb.branches.short_samples);
    }
}

/// Equal JSON, numbers up to float summation order (analysis sums in hash order).
fn same_json(a: &serde_json::Value, b: &serde_json::Value, at: &str) {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
                "{at}: {x} vs {y}"
            );
        }
        (Array(x), Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: lengths");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                same_json(x, y, &format!("{at}[{i}]"));
            }
        }
        (Object(x), Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, v) in x {
                same_json(v, &y[k], &format!("{at}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

fn no_elf(_: &Path) -> Option<ElfLayout> {
    None
}

#[test]
fn every_text_variant_round_trips_to_the_same_samples_and_sample_set() {
    let samples = synthetic(7, 300, 0x401000, 0x402000, 10_007);
    let want = sample_set(&samples, 8);
    for v in [Variant::Six, Variant::SevenDsoComm, Variant::EightDsoff] {
        let text = write_perf_script(&samples, "/opt/my prog/bin/bench", v);
        let opts = ImportOptions {
            offsets: false,
            period: 10_007,
            ..Default::default()
        };
        let imp = parse(&text, opts, &no_elf).unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert_eq!(imp.samples.len(), samples.len(), "{v:?}");
        for (a, b) in samples.iter().zip(&imp.samples) {
            same_sample(a, b);
        }
        same_set(
            &want,
            &imp.clone()
                .into_sample_set(8, cpi_user::profile::StackWeighting::Window),
        );
        if matches!(v, Variant::SevenDsoComm) {
            assert_eq!(imp.comms[&100], "bench");
        }
    }
}

#[test]
fn brstackoff_offsets_are_placed_by_the_dso_kind() {
    let samples = synthetic(9, 50, 0x1000, 0x3000, 1);
    let text = write_perf_script(&samples, "/lib/libfoo.so", Variant::SevenDsoComm);
    let pie = |_: &Path| {
        Some(ElfLayout {
            pie: true,
            file_size: 0x5000,
            exec_segments: vec![(0x1000, 0x2000, 0x1000)],
        })
    };
    let imp = parse(
        &text,
        ImportOptions {
            offsets: true,
            period: 1,
            ..Default::default()
        },
        &pie,
    )
    .unwrap();
    // The synthetic samples' ips are offsets too (outside any mapping): placed at the
    // newest branch target.
    assert_eq!(imp.ips_at_branch_target, samples.len());
    assert!(imp.samples.iter().all(|s| s.header.ip == s.entries[0].to));
    let maps = &imp.maps[&100].mappings;
    assert_eq!(maps.len(), 1);
    let base = maps[0].start;
    assert_eq!((maps[0].offset, maps[0].end - base), (0, 0x5000));
    for (a, b) in samples.iter().zip(&imp.samples) {
        for (ea, eb) in a.entries().iter().zip(b.entries()) {
            // runtime = base + file offset, which maps back to the same offset.
            assert_eq!((eb.from - base, eb.to - base), (ea.from, ea.to));
            assert_eq!(maps[0].file_offset(eb.from), ea.from);
        }
    }
    // A non-PIE executable keeps its addresses under brstackoff (perf prints them as
    // they are) and is placed at its link addresses.
    let exec = |_: &Path| {
        Some(ElfLayout {
            pie: false,
            file_size: 0x5000,
            exec_segments: vec![(0x1000, 0x2000, 0x1000)],
        })
    };
    let imp = parse(
        &text,
        ImportOptions {
            offsets: true,
            period: 1,
            ..Default::default()
        },
        &exec,
    )
    .unwrap();
    same_sample(&samples[0], &imp.samples[0]);
    assert_eq!(imp.maps[&100].mappings[0].start, 0x1000);
}

/// `cpi-bpf import-perf` on text written from samples of a real binary gives the
/// profile that analysing those samples in-process gives.
#[test]
fn import_perf_command_gives_the_same_profile() {
    let bin = cpi_bpf();
    let dir = scratch("import");
    let Some(exe) = cpi_tests::programs::compile("hot_cold.c", &["-O1", "-fno-pie", "-no-pie"])
    else {
        return;
    };
    let data = std::fs::read(&exe).unwrap();
    let addr = |name: &str| {
        use object::{Object, ObjectSymbol};
        let obj = object::File::parse(&*data).unwrap();
        let s = obj.symbols().find(|s| s.name() == Ok(name)).unwrap();
        (s.address(), s.size())
    };
    let (hot, hot_size) = addr("hot");
    let (cold, _) = addr("cold");
    // Three quarters of the samples in `hot`, the rest in `cold`.
    let mut samples = synthetic(11, 200, hot, hot + hot_size, 1009);
    for (i, s) in samples.iter_mut().enumerate() {
        s.header.tgid = 4242;
        s.header.ip = if i % 4 == 3 { cold } else { hot + 1 };
    }
    let text = write_perf_script(&samples, &exe.display().to_string(), Variant::SevenDsoComm);
    let file = dir.join("perf.txt");
    std::fs::write(&file, &text).unwrap();
    let out = output_ok(
        Command::new(bin)
            // The stacks carry cycles: keep the plain weighting the direct analysis
            // below uses (the cycles-spanned default is tested in import_perf_data.rs).
            .args(["import-perf", "--period", "1009", "--format", "json"])
            .args(["--stack-weighting", "window"])
            .arg(&file),
    );
    let imported = Profile::from_json(&out.stdout).unwrap();

    // The same samples straight into analysis.
    let mut set = sample_set(&samples, 8);
    for s in &samples {
        let ip = IpSample {
            header: SampleHeader {
                kind: SampleKind::Ip as u16,
                event: EventRole::Cycles as u32,
                nr: 0,
                ..s.header
            },
        };
        set.add_ip(&ip).unwrap();
    }
    let layout = elf_layout(&exe).unwrap();
    assert!(!layout.pie);
    let p = set.process(4242);
    p.comm = "bench".into();
    p.maps = Some(cpi_user::procmap::ProcessMaps {
        mappings: layout
            .exec_segments
            .iter()
            .map(|&(start, size, offset)| cpi_user::procmap::Mapping {
                start,
                end: start + size,
                offset,
                executable: true,
                object: cpi_user::procmap::MappedObject::File {
                    path: exe.clone(),
                    deleted: false,
                },
                file_id: None,
            })
            .collect(),
    });
    let run = RunInfo {
        mode: Mode::Cpi,
        mode_reason: String::new(),
        command: vec![],
        duration_secs: 0.0,
        events: vec![],
        perturbation: cpi_common::policy::Perturbation::None,
        lost: Default::default(),
    };
    let mut direct = analyze(&set, run, &AnalysisOptions::default());
    // Text does not name its event: taken as cycles, whose stacks give a relative
    // instruction profile and no CPI.
    direct.without_cpi(
        imported
            .cpi_withheld
            .clone()
            .expect("the import withholds CPI"),
    );
    same_json(
        &serde_json::to_value(&imported.processes).unwrap(),
        &serde_json::to_value(&direct.processes).unwrap(),
        "processes",
    );
    let names: Vec<_> = imported.processes[0]
        .functions
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["hot", "cold"], "ranked by samples");
    assert_eq!(imported.processes[0].functions[0].samples, 150);
    assert_eq!(imported.mode, Mode::Cpi, "taken as cycles");
    // Stacks on taken branches, and nothing else: instructions, not `cpi`.
    let out = output_ok(
        Command::new(bin)
            .args(["import-perf", "--period", "1009", "--format", "json"])
            .args(["--event", "taken-branches"])
            .arg(&file),
    );
    let taken = Profile::from_json(&out.stdout).unwrap();
    assert_eq!(taken.mode, Mode::Instructions, "{}", taken.mode_reason);
    assert!(taken.mode_reason.contains("no cycles, no CPI"));
}

/// Random byte edits of real perf script text: the parser never panics; it returns
/// samples or one error.
#[test]
fn perf_script_parser_survives_corruption() {
    let samples = synthetic(13, 40, 0x401000, 0x402000, 1);
    let text = write_perf_script(&samples, "/bin/prog", Variant::EightDsoff).into_bytes();
    let mut rng = StdRng::seed_from_u64(0xf00d);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..2000 {
        let mut b = text.clone();
        for _ in 0..rng.gen_range(1..6) {
            let i = rng.gen_range(0..b.len());
            match rng.gen_range(0..3) {
                0 => b[i] = *b"0x/()- M\nP9af".get(rng.gen_range(0..13)).unwrap(),
                1 => b.truncate(i),
                _ => {
                    b.remove(i);
                }
            }
        }
        let t = String::from_utf8_lossy(&b);
        let r = std::panic::catch_unwind(|| parse(&t, ImportOptions::default(), &no_elf));
        match r.unwrap_or_else(|_| panic!("parser panicked on {t:?}")) {
            Ok(imp) => {
                assert!(imp
                    .samples
                    .iter()
                    .all(|s| s.entries().len() <= MAX_BRANCH_ENTRIES));
                ok += 1
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                err += 1
            }
        }
    }
    assert!(ok > 0 && err > 0, "ok {ok}, err {err}");
}
