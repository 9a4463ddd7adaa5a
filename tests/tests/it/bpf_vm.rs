//! The shipped BPF programs on real branch stacks: the eBPF object cpi-user
//! embeds runs in an interpreter (tests/src/bpf_vm.rs) on every sample of recordings
//! made on real Intel machines (tests/data/README.md: Skylake-SP, Haswell-E, Westmere-EP), its helpers answering with each
//! sample's branch stack, period, ip and pid; the ring-buffer records are decoded by the
//! collector's own decoder (`collect::drain::decode`) and analysed. With thinning off the
//! profile must equal `import-perf`'s of the same recording; with thinning on, the
//! periods must all be accounted for. Faults of one byte of entry layout, one period or
//! one flag bit in one sample must make the comparison fail.

use std::path::{Path, PathBuf};

use cpi_common::policy::{KernelConfig, Perturbation, ThinState, DEFAULT_THINNING};
use cpi_common::wire::{Counter, EventRole, StackMode, COUNTERS};
use cpi_tests::bpf_vm::{Harness, Overflow};
use cpi_tests::{temp_dir, workspace_root};
use cpi_user::collect::drain::{decode, Record};
use cpi_user::import::{load_path, perf_data, Estimator, ImportOptions, Loaded};
use cpi_user::profile::model::Profile;

/// A real recording: the file, and its main binary's recorded path and local copy.
struct Recording {
    file: &'static str,
    recorded_as: &'static str,
    binary: &'static str,
    /// Sampled on cycles (else on taken branches: a profile without cycles).
    cycles: bool,
}

const SKYLAKE: Recording = Recording {
    file: "propeller_sample_1.perfdata1",
    recorded_as: "/build/work/11ef31a2a8be9640fa8d4c917e76f0db3923/google3/blaze-out/\
                  k8-opt/genfiles/devtools/crosstool/autofdo/testdata/propeller_sample_1.bin.gen",
    binary: "propeller_sample_1.bin",
    cycles: true,
};

const HASWELL: Recording = Recording {
    file: "hierarchical_discriminator_test.x86_64.perf.data",
    recorded_as: "/local/home/kvivekananda/hierarchical_discriminator_test",
    binary: "hierarchical_discriminator_test.x86_64",
    cycles: true,
};

const WESTMERE: Recording = Recording {
    file: "test.lbr",
    recorded_as: "/export/hda3/tmp/test.binary",
    binary: "test.binary",
    cycles: false,
};

fn data(name: &str) -> PathBuf {
    workspace_root().join("tests/data/autofdo").join(name)
}

/// `import-perf`'s reading of `r` (its binary found through a symfs, as
/// tests/tests/it/import_real.rs does).
fn import(r: &Recording, dir: &Path) -> (PathBuf, ImportOptions, Loaded) {
    let symfs = dir.join("symfs");
    let at = symfs.join(r.recorded_as.trim_start_matches('/'));
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::fs::copy(data(r.binary), &at).unwrap();
    let mut opts = ImportOptions::default();
    opts.locator.symfs = Some(symfs);
    let file = data(r.file);
    let loaded = load_path(&file, &opts).unwrap_or_else(|e| panic!("{}: {e}", r.file));
    (file, opts, loaded)
}

/// A change to what the kernel would hand the program for one sample (`at`: the sample's
/// index among those with a branch stack).
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The branch entries copied one byte later than `struct perf_branch_entry` puts them.
    EntryLayout { at: usize },
    /// `ctx->sample_period` one more.
    Period { at: usize },
    /// One bit of the newest entry's flags word flipped.
    FlagBit { at: usize, bit: u32 },
}

/// What the program emitted over a whole recording.
struct Run {
    /// The samples, decoded, in a set holding the import's processes (names, mappings,
    /// files) and options.
    loaded: Loaded,
    /// Program runs: one per sample and role.
    runs: u64,
    /// Σ sample periods handed to the programs, by role.
    periods: [u64; 2],
    /// Σ record weights received, by role.
    weights: [u64; 2],
    counters: [u64; COUNTERS as usize],
    /// Per role: the period still pending in the thinning state at the end.
    pending: [u64; 2],
}

fn role_slot(role: EventRole) -> usize {
    match role {
        EventRole::Branches => 0,
        EventRole::Cycles => 1,
        r => panic!("unexpected role {r:?}"),
    }
}

/// Runs the shipped programs on every sample of `file` with `config` and `stacks`, each
/// sample of the branch-stack event to `branch_sample` and each of a cycles event to
/// `ip_cycles` (a `perf record -e cycles -b` sample is both, as `import-perf` reads it),
/// and decodes the records into a copy of `imported`'s processes.
fn run_programs(
    file: &Path,
    imported: &Loaded,
    config: KernelConfig,
    stacks: StackMode,
    fault: Option<Fault>,
) -> Run {
    let object = cpi_user::collect::bpf_object();
    assert!(
        !object.is_empty(),
        "cpi-user was built with AYA_BUILD_SKIP=1: no eBPF object to run"
    );
    let h = Harness::load(object, config, stacks)
        .unwrap_or_else(|e| panic!("loading the shipped object: {e}"));
    let (branch_vm, cycles_vm) = (h.vm("branch_sample").unwrap(), h.vm("ip_cycles").unwrap());
    let mut set = imported.set.empty_like();
    for (&pid, p) in &imported.set.processes {
        let q = set.process(pid);
        q.comm.clone_from(&p.comm);
        q.start = p.start;
        q.maps.clone_from(&p.maps);
        q.files.clone_from(&p.files);
    }
    let (mut overflows, mut runs, mut branch_samples) = (0u64, 0u64, 0usize);
    let (mut periods, mut weights) = ([0u64; 2], [0u64; 2]);
    let mut f = std::fs::File::open(file).unwrap();
    perf_data::read(&mut f, |header, s| {
        let est = Estimator::of(&header.events[s.event], header);
        let mut o = Overflow {
            pid: s.pid,
            tid: s.tid,
            ip: s.ip,
            kernel: s.kernel,
            period: s.period,
            time_ns: 1_000_000 + overflows * 250_000,
            cgroup_id: 0x1_0000_0000 + u64::from(s.pid),
            sp: 0x7ffd_0000_0000 + overflows * 16,
            bp: 0x7ffd_0000_1000,
            branches: None,
            kernel_frames: Vec::new(),
        };
        overflows += 1;
        let mut programs = Vec::new();
        if !s.branches.is_empty() {
            let mut bytes: Vec<u8> = s
                .branches
                .iter()
                .flat_map(|e| [e.from, e.to, e.flags])
                .flat_map(u64::to_le_bytes)
                .collect();
            match fault {
                Some(Fault::EntryLayout { at }) if at == branch_samples => {
                    bytes.insert(0, 0);
                    bytes.pop();
                }
                Some(Fault::Period { at }) if at == branch_samples => o.period += 1,
                Some(Fault::FlagBit { at, bit }) if at == branch_samples => {
                    bytes[16 + bit as usize / 8] ^= 1 << (bit % 8);
                }
                _ => {}
            }
            o.branches = Some(bytes);
            branch_samples += 1;
            programs.push((EventRole::Branches, &branch_vm));
        }
        if est == Estimator::Cycles {
            programs.push((EventRole::Cycles, &cycles_vm));
        }
        for (role, vm) in programs {
            periods[role_slot(role)] += o.period;
            runs += 1;
            let records = h
                .run(vm, &o)
                .unwrap_or_else(|e| panic!("sample {overflows} ({role:?}): {e}"));
            for bytes in records {
                let (rec, section) = decode(&bytes)
                    .unwrap_or_else(|| panic!("record of {} bytes refused", bytes.len()));
                let header = match &rec {
                    Record::Branch(b) => b.header,
                    Record::Ip(ip) => ip.header,
                };
                assert_eq!(header.cgroup_id, o.cgroup_id, "the task's cgroup id");
                if stacks != StackMode::Off {
                    let sec = section.expect("a stack section in stack mode");
                    // A kernel-mode sample's user registers come from the task
                    // (`bpf_probe_read_kernel`), which the recording does not hold.
                    let regs = if o.kernel {
                        (0, 0, 0)
                    } else {
                        (o.ip, o.sp, o.bp)
                    };
                    assert_eq!(
                        (sec.header.user_ip, sec.header.user_sp, sec.header.user_bp),
                        regs,
                        "the user registers the program read from the context"
                    );
                    assert!(sec.stack.is_empty() && sec.kernel.is_empty());
                }
                match rec {
                    Record::Branch(b) => {
                        assert_eq!(role, EventRole::Branches);
                        weights[0] += b.header.period;
                        set.add_branch(&b);
                    }
                    Record::Ip(ip) => {
                        assert_eq!(ip.header.event, role as u32);
                        weights[1] += ip.header.period;
                        set.add_ip(&ip).unwrap();
                    }
                }
            }
        }
    })
    .unwrap();
    let mut counters = [0u64; COUNTERS as usize];
    for (i, c) in counters.iter_mut().enumerate() {
        *c = u64::from_le_bytes(h.map_value("COUNTERS", i).try_into().unwrap());
    }
    let pending = [EventRole::Branches, EventRole::Cycles].map(|r| {
        let v = h.map_value("THIN", r as usize);
        // SAFETY: the map's values are `ThinState`s, `#[repr(C)]` plain data.
        let st: ThinState = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
        st.pending
    });
    let mut loaded = imported.clone();
    loaded.set = set;
    Run {
        loaded,
        runs,
        periods,
        weights,
        counters,
        pending,
    }
}

fn config(perturbation: Perturbation) -> KernelConfig {
    // As the collector fills it (cpi-user/src/collect/session.rs), kernel samples kept
    // as import-perf keeps them.
    KernelConfig {
        thinning: perturbation.thinning(DEFAULT_THINNING),
        include_kernel: 1,
        filter: 0,
        cgroup_levels: 0,
        _pad: 0,
    }
}

/// The first line where the two profiles' JSON differ, with its path-like context.
fn first_difference(ours: &Profile, theirs: &Profile) -> Option<String> {
    let a = serde_json::to_string_pretty(ours).unwrap();
    let b = serde_json::to_string_pretty(theirs).unwrap();
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let at = la
        .iter()
        .zip(&lb)
        .position(|(x, y)| x != y)
        .or_else(|| (la.len() != lb.len()).then_some(la.len().min(lb.len())))?;
    let from = at.saturating_sub(6);
    Some(format!(
        "line {at}: harness {:?}, import-perf {:?}\nharness context:\n{}",
        la.get(at),
        lb.get(at),
        la[from..(at + 1).min(la.len())].join("\n")
    ))
}

/// The harness's profile against import-perf's, with thinning off.
fn compare(
    r: &Recording,
    stacks: StackMode,
    fault: Option<Fault>,
) -> Result<(Run, Profile), String> {
    // Tests run in parallel: a directory of this call's own.
    let dir = temp_dir(&format!("bpf-vm-{}-{stacks:?}-{fault:?}", r.binary));
    let (file, opts, imported) = import(r, &dir);
    let run = run_programs(&file, &imported, config(Perturbation::None), stacks, fault);
    let theirs = imported.analyze(&opts.analysis).profile;
    let ours = run.loaded.clone().analyze(&opts.analysis).profile;
    let _ = std::fs::remove_dir_all(&dir);
    match first_difference(&ours, &theirs) {
        Some(d) => Err(d),
        None => Ok((run, ours)),
    }
}

fn check_equal(r: &Recording, stacks: StackMode) {
    let (run, p) =
        compare(r, stacks, None).unwrap_or_else(|d| panic!("{}: profiles differ: {d}", r.file));
    let c = |k: Counter| run.counters[k as usize];
    eprintln!(
        "{}: {} program runs, {} records, profiles equal",
        r.file,
        run.runs,
        c(Counter::Emitted)
    );
    assert_eq!(c(Counter::Seen), run.runs, "every run is counted");
    assert_eq!(c(Counter::Emitted), c(Counter::Seen));
    assert_eq!(
        c(Counter::BranchError) + c(Counter::RingFull) + c(Counter::Thinned),
        0
    );
    assert_eq!(
        run.weights, run.periods,
        "weights are the periods, thinning off"
    );
    let measured = |q: &cpi_user::profile::model::ProcessProfile| {
        if r.cycles {
            q.measures.cycles
        } else {
            q.measures.instructions
        }
    };
    assert!(
        p.processes
            .iter()
            .any(|q| q.functions.len() >= 2 && measured(q).is_some_and(|c| c > 0.0)),
        "{}: a profile with functions and {}",
        r.file,
        if r.cycles { "cycles" } else { "instructions" }
    );
}

/// AutoFDO's Skylake-SP recording (`perf record -e cycles -b`, 32-entry timed LBR).
#[test]
fn skylake_recording_through_the_shipped_program_equals_import_perf() {
    check_equal(&SKYLAKE, StackMode::Off);
}

/// The same through the stacks path (`STACK_MODE` = copy-stack, the collector's default:
/// records built in the per-CPU scratch map and copied out with `bpf_ringbuf_output`).
#[test]
fn skylake_recording_through_the_stack_path_equals_import_perf() {
    check_equal(&SKYLAKE, StackMode::CopyStack);
}

/// A Haswell-E recording (`perf record -e cycles:P -b`, 16-entry LBR, another perf).
#[test]
fn haswell_recording_through_the_shipped_program_equals_import_perf() {
    check_equal(&HASWELL, StackMode::Off);
}

/// A Westmere-EP recording on a taken-branch event (`-e br_inst_exec:taken -c 500000
/// -b`, 16-entry LBR, perf 3.3): records of the branches role only, no cycles.
#[test]
fn westmere_taken_branch_recording_through_the_shipped_program_equals_import_perf() {
    check_equal(&WESTMERE, StackMode::Off);
}

/// In-kernel thinning on (the collector's `--perturbation kernel`): about one record in
/// four, and every period accounted for: carried by a record, or still pending.
#[test]
fn thinning_keeps_every_period_of_a_real_recording() {
    let dir = temp_dir("bpf-vm-thin");
    let (file, opts, imported) = import(&SKYLAKE, &dir);
    let run = run_programs(
        &file,
        &imported,
        config(Perturbation::Kernel),
        StackMode::Off,
        None,
    );
    for slot in 0..2 {
        assert_eq!(
            run.weights[slot] + run.pending[slot],
            run.periods[slot],
            "role {slot}: weights + pending = periods"
        );
    }
    let c = |k: Counter| run.counters[k as usize];
    assert_eq!(c(Counter::Seen), run.runs);
    assert_eq!(c(Counter::Emitted) + c(Counter::Thinned), c(Counter::Seen));
    let kept = c(Counter::Emitted) as f64 / c(Counter::Seen) as f64;
    assert!(
        (kept - 1.0 / DEFAULT_THINNING as f64).abs() < 0.05,
        "kept {kept:.3} of the overflows, expected ≈ 1/{DEFAULT_THINNING}"
    );
    // The profile's cycles are the emitted weights: import-perf's total less what is
    // pending.
    let theirs = imported.analyze(&opts.analysis).profile;
    let ours = run.loaded.analyze(&opts.analysis).profile;
    let total = |p: &Profile| {
        p.processes
            .iter()
            .filter_map(|p| p.measures.cycles)
            .sum::<f64>()
    };
    let want = total(&theirs) - run.pending[1] as f64;
    assert!(
        (total(&ours) - want).abs() <= 1e-9 * want,
        "cycles {} with thinning, import-perf {} less {} pending",
        total(&ours),
        total(&theirs),
        run.pending[1]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The comparison fails on one wrong byte of layout, one period, one flag bit in one
/// sample of thousands: it would catch a program that read the records wrong.
#[test]
fn one_wrong_byte_period_or_flag_fails_the_comparison() {
    for fault in [
        Fault::EntryLayout { at: 1000 },
        Fault::Period { at: 1000 },
        // The lowest bit of the 16-bit cycles field, and the mispredict bit.
        Fault::FlagBit { at: 1000, bit: 4 },
        Fault::FlagBit { at: 1000, bit: 0 },
    ] {
        let r = compare(&SKYLAKE, StackMode::Off, Some(fault));
        assert!(r.is_err(), "{fault:?} went unnoticed");
        eprintln!("{fault:?}: {}", r.err().unwrap().lines().next().unwrap());
    }
    // On a taken-branch recording the period weighs the ranges (absolute counts).
    for fault in [
        Fault::Period { at: 1000 },
        Fault::FlagBit { at: 1000, bit: 0 },
    ] {
        let r = compare(&WESTMERE, StackMode::Off, Some(fault));
        assert!(r.is_err(), "Westmere: {fault:?} went unnoticed");
    }
}
