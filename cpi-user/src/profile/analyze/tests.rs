use super::*;
use crate::binary::testbin::{maps_for, TestProgram};
use crate::binary::Binary;
use crate::profile::error::{group_of, GROUPS};
use crate::profile::model::InstructionProfile;
use cpi_common::policy::Perturbation;
use cpi_common::wire::{IpSample, SampleHeader, SampleKind, FLAG_KERNEL, WIRE_VERSION};

/// The relative standard error profile/error.rs gives the sum of `weights`, the
/// i-th sample's weight falling in group `group_of(i)`: computed here from the
/// formula, independently of `Groups`.
pub(super) fn groups_rel(weights: &[f64]) -> f64 {
    let mut g = [0.0; GROUPS];
    for (i, w) in weights.iter().enumerate() {
        g[group_of(i as u64)] += w;
    }
    let total: f64 = weights.iter().sum();
    let mean = total / GROUPS as f64;
    let var =
        g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() * GROUPS as f64 / (GROUPS - 1) as f64;
    var.sqrt() / total
}

pub(super) fn ip(pid: u32, role: EventRole, addr: u64, period: u64) -> IpSample {
    IpSample {
        header: SampleHeader {
            version: WIRE_VERSION,
            kind: SampleKind::Ip as u16,
            flags: if addr >= crate::binary::symbolize::KERNEL_START {
                FLAG_KERNEL
            } else {
                0
            },
            tgid: pid,
            event: role as u32,
            period,
            ip: addr,
            ..Default::default()
        },
    }
}

pub(super) fn run_info(mode: Mode) -> RunInfo {
    RunInfo {
        mode,
        mode_reason: "test".into(),
        command: vec![],
        duration_secs: 1.0,
        events: vec![],
        perturbation: Perturbation::Both,
        lost: LossReport::default(),
    }
}

pub(super) fn opts() -> AnalysisOptions {
    AnalysisOptions {
        symbolizer: SymbolizerOptions {
            use_proc: false,
            kallsyms: None,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn time_profile_functions_losses_and_json() {
    let Some(t) = TestProgram::get("analysis_loops") else {
        return;
    };
    const BASE: u64 = 0x5555_5555_4000;
    for path in [&t.pie, &t.pie_stripped] {
        let bin = Binary::open(&t.pie).unwrap();
        let sum = bin.function_by_name("sum_loop").unwrap().start;
        let exported = bin.function_by_name("exported_entry").unwrap().start;
        let mut set = SampleSet::new(8);
        let p = set.process(100);
        p.comm = "loops".into();
        p.maps = Some(maps_for(path, &bin, BASE));
        let mut add = |addr, n| {
            for _ in 0..n {
                set.add_ip(&ip(100, EventRole::CpuClock, addr, 1_000_000))
                    .unwrap();
            }
        };
        add(BASE + sum + 4, 20);
        add(BASE + sum + 8, 10);
        add(BASE + exported, 10);
        add(0xffff_ffff_8100_0000, 5);
        add(0x10, 3);
        let mut run = run_info(Mode::TimeProfile);
        run.lost.ring_full = 2;
        run.lost.thinned = 7;
        let prof = analyze(&set, run, &opts());
        assert_eq!(prof.lost.unmapped_samples, 3);
        assert_eq!(
            prof.lost_samples, 2,
            "ring_full only: not unmapped, not thinned"
        );
        let pp = &prof.processes[0];
        assert_eq!((pp.pid, pp.comm.as_str(), pp.samples), (100, "loops", 48));
        assert_eq!(pp.measures.time_ns, Some(48e6));
        let f = &pp.functions;
        let stripped = path == &t.pie_stripped;
        let sum_name = if stripped {
            format!("func_{sum:x}")
        } else {
            "sum_loop".to_string()
        };
        assert_eq!(
            (f[0].name.as_str(), f[0].samples, f[0].address),
            (sum_name.as_str(), 30, sum)
        );
        assert_eq!(f[0].measures.time_ns, Some(30e6));
        assert!((f[0].share - 30.0 / 48.0).abs() < 1e-12);
        assert_eq!((f[1].name.as_str(), f[1].samples), ("exported_entry", 10));
        assert_eq!(
            (f[2].name.as_str(), f[2].binary.as_str()),
            ("[kernel]", "[kernel]")
        );
        let b = prof
            .binaries
            .iter()
            .find(|b| b.path == path.display().to_string())
            .unwrap();
        assert_eq!(b.build_id, bin.build_id);
        assert_eq!(b.stripped, stripped);
        // The JSON fields the README documents for a time profile.
        let j = serde_json::to_value(&prof).unwrap();
        assert_eq!(j["mode"], "time-profile");
        assert_eq!(j["lost_samples"], 2);
        assert_eq!(j["processes"][0]["pid"], 100);
        assert_eq!(j["processes"][0]["comm"], "loops");
        assert_eq!(j["processes"][0]["samples"], 48);
        assert_eq!(j["processes"][0]["functions"][0]["name"], sum_name.as_str());
        assert_eq!(j["processes"][0]["functions"][0]["samples"], 30);
        assert_eq!(
            j["processes"][0]["functions"][0]["binary"],
            path.display().to_string()
        );
    }
}

/// The agent's lines (sampled instructions only, each decoded alone) are the lines
/// of every instruction, kept where there are samples.
#[test]
fn evidence_lines_are_every_line_with_samples() {
    let Some(t) = TestProgram::get("analysis_loops") else {
        return;
    };
    const BASE: u64 = 0x5555_5555_4000;
    for path in [&t.pie, &t.pie_stripped] {
        let bin = Binary::open(path).unwrap();
        let main = Binary::open(&t.pie)
            .unwrap()
            .function_by_name("main")
            .unwrap();
        let mut set = SampleSet::new(8);
        let p = set.process(100);
        p.maps = Some(maps_for(path, &bin, BASE));
        // Every byte of main, some twice: instruction starts and middles.
        for off in 0..main.size {
            for _ in 0..1 + off % 2 {
                set.add_ip(&ip(100, EventRole::CpuClock, BASE + main.start + off, 1000))
                    .unwrap();
            }
        }
        let every = analyze(&set, run_info(Mode::TimeProfile), &opts());
        let evidence = analyze(
            &set,
            run_info(Mode::TimeProfile),
            &AnalysisOptions {
                lines: LineDetail::Evidence,
                ..opts()
            },
        );
        let (a, b) = (
            &every.processes[0].functions,
            &evidence.processes[0].functions,
        );
        assert_eq!(a.len(), b.len());
        for (a, b) in a.iter().zip(b) {
            let kept: Vec<InstructionProfile> =
                a.lines.iter().filter(|l| l.samples > 0).cloned().collect();
            assert!(kept.len() > 10, "{}: {} lines", a.name, kept.len());
            assert_eq!(kept, b.lines, "{}", a.name);
            assert_eq!(
                b.lines.iter().map(|l| l.samples).sum::<u64>(),
                a.samples,
                "every sample on a line"
            );
        }
    }
}

#[test]
fn deleted_binary_is_flagged_and_ip_sampling_has_cpi() {
    let Some(t) = TestProgram::get("analysis_loops") else {
        return;
    };
    let bin = Binary::open(&t.plain).unwrap();
    let fib = bin.function_by_name("fib").unwrap().start;
    let maps = maps_for(&t.plain, &bin, 0);
    let text = maps
        .mappings
        .iter()
        .map(|m| match &m.object {
            crate::procmap::MappedObject::File { path, .. } => format!(
                "{:x}-{:x} r-xp {:08x} {} {} (deleted)\n",
                m.start,
                m.end,
                m.offset,
                crate::binary::testbin::maps_dev_ino(path),
                path.display()
            ),
            _ => String::new(),
        })
        .collect::<String>();
    let mut set = SampleSet::new(8);
    set.process(5).maps = Some(ProcessMaps::parse(&text).unwrap());
    for _ in 0..40 {
        set.add_ip(&ip(5, EventRole::Cycles, fib + 1, 1000))
            .unwrap();
    }
    for _ in 0..25 {
        set.add_ip(&ip(5, EventRole::Instructions, fib + 1, 500))
            .unwrap();
    }
    // The agent's cpu-clock companion (collect/events.rs `plan`): CPU time beside
    // the hardware events, leaving their numbers alone.
    for _ in 0..30 {
        set.add_ip(&ip(5, EventRole::CpuClock, fib + 1, 1_000_000))
            .unwrap();
    }
    let prof = analyze(&set, run_info(Mode::IpSampling), &opts());
    assert!(prof.binaries[0].deleted);
    assert_eq!(prof.processes[0].measures.time_ns, Some(30e6));
    let f = &prof.processes[0].functions[0];
    assert_eq!(f.measures.time_ns, Some(30e6));
    assert_eq!(f.name, "fib");
    assert_eq!(
        (f.measures.cycles, f.measures.instructions),
        (Some(40_000.0), Some(12_500.0))
    );
    let cpi = f.measures.cpi.unwrap();
    assert_eq!((cpi.value, cpi.samples), (3.2, 25));
    // Per instruction too: the instruction holding fib+1 has both.
    let l = f
        .lines
        .iter()
        .find(|l| l.address <= fib + 1 && fib + 1 < l.address + 8)
        .filter(|l| l.count > 0.0)
        .unwrap();
    assert_eq!(
        (l.count, l.cycles, l.samples),
        (12_500.0, Some(40_000.0), 40)
    );
    assert_eq!(l.cpi.unwrap().value, 3.2);
    assert_eq!(f.lines.iter().filter(|l| l.count > 0.0).count(), 1);
    // Independent samplers: 40 cycle samples of 1000 and 25 instructions samples of
    // 500, each spread over the groups of profile/error.rs, combine in quadrature.
    let (rel_c, rel_n) = (groups_rel(&[1000.0; 40]), groups_rel(&[500.0; 25]));
    assert!(rel_c > 0.0 && rel_n > 0.0);
    assert!((cpi.rel_error - rel_c.hypot(rel_n)).abs() < 1e-9);
    assert!((f.measures.cycles_rel_error.unwrap() - rel_c).abs() < 1e-9);
    // Below the floor: no number.
    let mut o = opts();
    o.sample_floor = 26;
    let prof = analyze(&set, run_info(Mode::IpSampling), &o);
    assert_eq!(prof.processes[0].functions[0].measures.cpi, None);
    assert_eq!(prof.processes[0].measures.cpi, None);
}
