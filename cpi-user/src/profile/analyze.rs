//! Analysis: a [`SampleSet`] (runtime addresses, per process) → a [`Profile`] (binary
//! addresses, per process and function).
//!
//! Every IP sample is symbolised to a function; per function we keep samples and Σ
//! periods per event role: `cpu-clock` periods are time (ns), `cycles` periods are
//! cycles, `instructions` periods are instructions (IP-sampling mode). Samples that
//! symbolise to nothing are counted in `lost.unmapped_samples`, never dropped silently.

use std::collections::{BTreeMap, HashMap};

use cpi_common::wire::EventRole;

use super::aggregate::{ProcessSamples, SampleSet};
use super::model::{
    BinaryInfo, Estimate, FunctionProfile, LossReport, Mode, ProcessProfile, Profile, RunInfo,
    PROFILE_FORMAT_VERSION,
};
use crate::binary::{CodeObject, Function, Resolved, Symbolizer, SymbolizerOptions};
use crate::procmap::ProcessMaps;

/// How analysis runs.
#[derive(Clone, Debug)]
pub struct AnalysisOptions {
    /// Units (functions, blocks, instructions) with fewer samples than this behind their
    /// CPI get `cpi: None` ("below floor") instead of a number.
    pub sample_floor: u64,
    pub symbolizer: SymbolizerOptions,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            sample_floor: 20,
            symbolizer: SymbolizerOptions::default(),
        }
    }
}

/// IP-sample tallies of one role: (samples, Σ periods).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Tally {
    samples: u64,
    weight: u64,
}

impl Tally {
    fn add(&mut self, samples: u64, weight: u64) {
        self.samples += samples;
        self.weight += weight;
    }
}

const ROLES: usize = 4;

fn role_index(r: EventRole) -> usize {
    r as usize
}

/// What was gathered for one function of one process.
struct FunctionWork {
    object_name: String,
    function: Function,
    /// vaddr → tallies per role.
    ips: BTreeMap<u64, [Tally; ROLES]>,
}

impl FunctionWork {
    fn total(&self, role: EventRole) -> Tally {
        let mut t = Tally::default();
        for v in self.ips.values() {
            let x = v[role_index(role)];
            t.add(x.samples, x.weight);
        }
        t
    }
}

/// Key of a function within a process: (object name, start address).
type FuncKey = (String, u64);

/// Analyses every process of `set`.
pub fn analyze(set: &SampleSet, run: RunInfo, opts: &AnalysisOptions) -> Profile {
    let mut sym = Symbolizer::new(opts.symbolizer.clone());
    analyze_with(set, run, opts, &mut sym)
}

/// [`analyze`] with a caller-owned symbolizer (reuses its binary cache across calls).
pub fn analyze_with(
    set: &SampleSet,
    run: RunInfo,
    opts: &AnalysisOptions,
    sym: &mut Symbolizer,
) -> Profile {
    let mut lost = run.lost.clone();
    let mut binaries: BTreeMap<String, BinaryInfo> = BTreeMap::new();
    let mut processes = Vec::new();
    for p in set.processes.values() {
        lost.short_samples += p.branches.short_samples;
        lost.invalid_ranges += p.branches.backward_ranges;
        processes.push(analyze_process(
            p,
            run.mode,
            sym,
            &mut lost,
            opts,
            &mut binaries,
        ));
    }
    Profile {
        format_version: PROFILE_FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: run.mode,
        mode_reason: run.mode_reason,
        command: run.command,
        duration_secs: run.duration_secs,
        events: run.events,
        perturbation: run.perturbation,
        range_window: set.window as u32,
        lost_samples: lost_total(&lost),
        lost,
        binaries: binaries.into_values().collect(),
        processes,
    }
}

/// Every loss except `thinned` (thinned overflows carry their period forward).
pub fn lost_total(l: &LossReport) -> u64 {
    l.ring_full
        + l.branch_errors
        + l.malformed
        + l.short_samples
        + l.invalid_ranges
        + l.unmapped_samples
}

/// The role whose IP samples are the process's "samples": cycles where there is a PMU,
/// cpu-clock in a time profile.
fn sample_role(mode: Mode) -> EventRole {
    match mode {
        Mode::TimeProfile => EventRole::CpuClock,
        Mode::Cpi | Mode::IpSampling | Mode::Simulated => EventRole::Cycles,
    }
}

/// Symbolises one process's addresses once each and collects the functions they hit.
struct ProcessResolver<'a> {
    pid: u32,
    maps: &'a ProcessMaps,
    cache: HashMap<u64, Option<(usize, u64)>>,
    index: HashMap<FuncKey, usize>,
    funcs: Vec<FunctionWork>,
}

impl<'a> ProcessResolver<'a> {
    fn new(pid: u32, maps: &'a ProcessMaps) -> Self {
        ProcessResolver {
            pid,
            maps,
            cache: HashMap::new(),
            index: HashMap::new(),
            funcs: Vec::new(),
        }
    }

    /// (function index, address in the binary) of a runtime address.
    fn resolve(
        &mut self,
        sym: &mut Symbolizer,
        binaries: &mut BTreeMap<String, BinaryInfo>,
        addr: u64,
    ) -> Option<(usize, u64)> {
        if let Some(&r) = self.cache.get(&addr) {
            return r;
        }
        let r = match sym.resolve(self.pid, self.maps, addr) {
            Ok(r) => {
                note_binary(binaries, &r);
                let key = (r.object_name.clone(), r.function.start);
                let vaddr = r.vaddr;
                let i = *self.index.entry(key).or_insert_with(|| {
                    self.funcs.push(FunctionWork {
                        object_name: r.object_name,
                        function: r.function,
                        ips: BTreeMap::new(),
                    });
                    self.funcs.len() - 1
                });
                Some((i, vaddr))
            }
            Err(e) => {
                log::debug!("{e}");
                None
            }
        };
        self.cache.insert(addr, r);
        r
    }
}

fn analyze_process(
    p: &ProcessSamples,
    mode: Mode,
    sym: &mut Symbolizer,
    lost: &mut LossReport,
    opts: &AnalysisOptions,
    binaries: &mut BTreeMap<String, BinaryInfo>,
) -> ProcessProfile {
    let empty = ProcessMaps::default();
    let mut res = ProcessResolver::new(p.pid, p.maps.as_ref().unwrap_or(&empty));
    for (&role, agg) in &p.ips {
        for (&ip, &(n, w)) in &agg.by_ip {
            match res.resolve(sym, binaries, ip) {
                Some((i, vaddr)) => {
                    res.funcs[i].ips.entry(vaddr).or_default()[role_index(role)].add(n, w)
                }
                None => lost.unmapped_samples += n,
            }
        }
    }

    let role = sample_role(mode);
    let (samples, weight) = p
        .ips
        .get(&role)
        .map(|a| (a.samples, a.weight))
        .unwrap_or((0, 0));
    let total = |r: EventRole| p.ips.get(&r).map(|a| a.weight as f64);
    let instructions = match mode {
        Mode::IpSampling => total(EventRole::Instructions),
        _ => None,
    };
    let tally = |r: EventRole| {
        p.ips
            .get(&r)
            .map(|a| Tally {
                samples: a.samples,
                weight: a.weight,
            })
            .unwrap_or_default()
    };
    let cpi = match mode {
        Mode::IpSampling => ip_sampling_cpi(
            tally(EventRole::Cycles),
            tally(EventRole::Instructions),
            opts.sample_floor,
        ),
        _ => None,
    };
    let mut functions: Vec<FunctionProfile> = res
        .funcs
        .iter()
        .map(|w| function_profile(w, mode, weight, opts))
        .collect();
    functions.sort_by(|a, b| {
        b.cycles
            .unwrap_or(0.0)
            .total_cmp(&a.cycles.unwrap_or(0.0))
            .then(b.samples.cmp(&a.samples))
            .then(a.name.cmp(&b.name))
    });
    ProcessProfile {
        pid: p.pid,
        comm: p.comm.clone(),
        samples,
        branch_samples: p.branches.samples,
        time_ns: total(EventRole::CpuClock),
        cycles: total(EventRole::Cycles),
        instructions,
        cpi,
        functions,
    }
}

fn function_profile(
    w: &FunctionWork,
    mode: Mode,
    proc_weight: u64,
    opts: &AnalysisOptions,
) -> FunctionProfile {
    let primary = w.total(sample_role(mode));
    let opt = |r: EventRole| {
        let t = w.total(r);
        (t.samples > 0).then_some(t.weight as f64)
    };
    let (instructions, cpi) = match mode {
        Mode::IpSampling => (
            opt(EventRole::Instructions),
            ip_sampling_cpi(
                w.total(EventRole::Cycles),
                w.total(EventRole::Instructions),
                opts.sample_floor,
            ),
        ),
        _ => (None, None),
    };
    FunctionProfile {
        name: w.function.name.clone(),
        binary: w.object_name.clone(),
        address: w.function.start,
        size: w.function.size,
        samples: primary.samples,
        share: if proc_weight > 0 {
            primary.weight as f64 / proc_weight as f64
        } else {
            0.0
        },
        time_ns: opt(EventRole::CpuClock),
        cycles: opt(EventRole::Cycles),
        instructions,
        cpi,
        timed_cpi: None,
        blocks: Vec::new(),
        edges: Vec::new(),
        lines: Vec::new(),
    }
}

/// CPI = cycles / instructions with rel_error ≈ 1/√(scarcer sample count); `None` below
/// the floor or without instructions.
fn estimate(cycles: f64, instructions: f64, samples: u64, floor: u64) -> Option<Estimate> {
    (samples >= floor.max(1) && instructions > 0.0).then(|| Estimate {
        value: cycles / instructions,
        rel_error: 1.0 / (samples as f64).sqrt(),
        samples,
    })
}

/// The "traditional" CPI of IP-sampling mode: both sides from IP samples × period.
fn ip_sampling_cpi(cycles: Tally, instructions: Tally, floor: u64) -> Option<Estimate> {
    estimate(
        cycles.weight as f64,
        instructions.weight as f64,
        cycles.samples.min(instructions.samples),
        floor,
    )
}

fn note_binary(binaries: &mut BTreeMap<String, BinaryInfo>, r: &Resolved) {
    if binaries.contains_key(&r.object_name) {
        return;
    }
    let (build_id, stripped) = match &r.object {
        CodeObject::Elf(b) => (b.build_id.clone(), b.stripped()),
        _ => (None, false),
    };
    binaries.insert(
        r.object_name.clone(),
        BinaryInfo {
            path: r.object_name.clone(),
            build_id,
            deleted: r.deleted,
            stripped,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::testbin::{maps_for, TestProgram};
    use crate::binary::Binary;
    use cpi_common::wire::{IpSample, SampleHeader, SampleKind, FLAG_KERNEL, WIRE_VERSION};

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
            perturbation: "both".into(),
            lost: LossReport::default(),
        }
    }

    pub(super) fn opts() -> AnalysisOptions {
        AnalysisOptions {
            symbolizer: SymbolizerOptions {
                use_proc: false,
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
            assert_eq!(prof.lost_samples, 5, "ring_full + unmapped, not thinned");
            let pp = &prof.processes[0];
            assert_eq!((pp.pid, pp.comm.as_str(), pp.samples), (100, "loops", 48));
            assert_eq!(pp.time_ns, Some(48e6));
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
            assert_eq!(f[0].time_ns, Some(30e6));
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
            // The JSON fields issue 2 promises.
            let j = serde_json::to_value(&prof).unwrap();
            assert_eq!(j["mode"], "time-profile");
            assert_eq!(j["lost_samples"], 5);
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
                    "{:x}-{:x} r-xp {:08x} 00:00 1 {} (deleted)\n",
                    m.start,
                    m.end,
                    m.offset,
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
        let prof = analyze(&set, run_info(Mode::IpSampling), &opts());
        assert!(prof.binaries[0].deleted);
        let f = &prof.processes[0].functions[0];
        assert_eq!(f.name, "fib");
        assert_eq!((f.cycles, f.instructions), (Some(40_000.0), Some(12_500.0)));
        let cpi = f.cpi.unwrap();
        assert_eq!((cpi.value, cpi.samples), (3.2, 25));
        assert!((cpi.rel_error - 0.2).abs() < 1e-12);
        // Below the floor: no number.
        let mut o = opts();
        o.sample_floor = 26;
        let prof = analyze(&set, run_info(Mode::IpSampling), &o);
        assert_eq!(prof.processes[0].functions[0].cpi, None);
        assert_eq!(prof.processes[0].cpi, None);
    }
}
