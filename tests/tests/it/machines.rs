//! Recorded machines (tests/data/machines/, each with its source in the README there):
//! the ladder's mode and reason, the events planned on each core PMU, and `cpi-bpf
//! doctor --root` (a golden file each, `CPI_BPF_BLESS=1` regenerates them after review),
//! decided from their `/sys` and `/proc` trees without root or a PMU. The syscalls the
//! hybrid plan makes are checked in `cpi-user/src/collect/ladder.rs` (its syscall fake).

use std::path::PathBuf;
use std::process::Command;

use cpi_tests::{assert_one_error_line, cpi_bpf, output_ok, workspace_root};
use cpi_user::collect::caps::{Arch, Capabilities, Vendor};
use cpi_user::collect::events::{self, Rate};
use cpi_user::collect::DEFAULT_FREQUENCY;
use cpi_user::profile::Mode;

use crate::report_fixture::golden;

fn root(machine: &str) -> PathBuf {
    workspace_root().join("tests/data/machines").join(machine)
}

/// One machine's expected decision: mode, words its reason must hold, and the events
/// planned `(name, type, config, CPUs or None for every CPU)`.
struct Expect {
    machine: &'static str,
    vendor: Vendor,
    mode: Mode,
    reason: &'static [&'static str],
    events: &'static [(&'static str, u32, u64, Option<&'static str>)],
}

const CYCLES: (&str, u32, u64, Option<&str>) = ("cycles", 0, 0, None);

const MACHINES: &[Expect] = &[
    Expect {
        machine: "skylake-sp",
        vendor: Vendor::Intel,
        mode: Mode::Cpi,
        reason: &["PMU cpu with 32-deep branch records"],
        events: &[("cpu/r20c4/", 4, 0x20c4, None), CYCLES],
    },
    Expect {
        machine: "sapphire-rapids",
        vendor: Vendor::Intel,
        mode: Mode::Cpi,
        reason: &["PMU cpu with 32-deep branch records"],
        events: &[("cpu/r20c4/", 4, 0x20c4, None), CYCLES],
    },
    Expect {
        machine: "alderlake-hybrid",
        vendor: Vendor::Intel,
        mode: Mode::Cpi,
        reason: &[
            "PMUs cpu_core (CPUs 0-15) with 32-deep branch records",
            "and cpu_atom (CPUs 16-23) with 32-deep branch records",
        ],
        events: &[
            ("cpu_core/r20c4/", 4, 0x20c4, Some("0-15")),
            ("cpu_core/cycles/", 0, 4 << 32, Some("0-15")),
            ("cpu_atom/rc0c4/", 8, 0xc0c4, Some("16-23")),
            ("cpu_atom/cycles/", 0, 8 << 32, Some("16-23")),
        ],
    },
    Expect {
        machine: "amd-zen3",
        vendor: Vendor::Amd,
        mode: Mode::IpSampling,
        reason: &["PMU cpu has no branch records", "cpu/caps/branches missing"],
        events: &[CYCLES, ("instructions", 0, 1, None)],
    },
    Expect {
        machine: "amd-zen4",
        vendor: Vendor::Amd,
        mode: Mode::Cpi,
        reason: &["PMU cpu with 16-deep branch records"],
        events: &[("cpu/ex_ret_brn_tkn/ (rc4)", 4, 0xc4, None), CYCLES],
    },
    Expect {
        machine: "amd-zen3-epyc-brs",
        vendor: Vendor::Amd,
        mode: Mode::Cpi,
        reason: &["PMU cpu with 16-deep branch records (AMD BRS"],
        events: &[("cpu/ex_ret_brn_tkn/ (rc4)", 4, 0xc4, None), CYCLES],
    },
    Expect {
        machine: "arrowlake-h-hybrid",
        vendor: Vendor::Intel,
        mode: Mode::Cpi,
        reason: &[
            "PMUs cpu_core (CPUs 0-5) with 32-deep branch records",
            "and cpu_atom (CPUs 6-13) with 32-deep branch records",
            "and cpu_lowpower (CPUs 14-15) with 32-deep branch records",
        ],
        events: &[
            ("cpu_core/r20c4/", 4, 0x20c4, Some("0-5")),
            ("cpu_core/cycles/", 0, 4 << 32, Some("0-5")),
            ("cpu_atom/rc0c4/", 8, 0xc0c4, Some("6-13")),
            ("cpu_atom/cycles/", 0, 8 << 32, Some("6-13")),
            ("cpu_lowpower/rc0c4/", 9, 0xc0c4, Some("14-15")),
            ("cpu_lowpower/cycles/", 0, 9 << 32, Some("14-15")),
        ],
    },
    Expect {
        machine: "kvm-guest",
        vendor: Vendor::Intel,
        mode: Mode::IpSampling,
        reason: &[
            "PMU cpu has no branch records",
            "a virtual machine's PMU (cpuinfo flag hypervisor)",
        ],
        events: &[CYCLES, ("instructions", 0, 1, None)],
    },
    Expect {
        machine: "arm64-brbe",
        vendor: Vendor::Other,
        mode: Mode::Cpi,
        reason: &[
            "PMU armv8_pmuv3_0 (CPUs 0-63) with 64-deep branch records",
            "samples are collected, but instructions and blocks need x86-64 disassembly",
        ],
        events: &[
            (
                "cycles (no retired-taken-branch event known for this CPU)",
                0,
                0,
                None,
            ),
            CYCLES,
        ],
    },
];

#[test]
fn each_recorded_machine_gets_its_mode_reason_and_events() {
    for m in MACHINES {
        let c = Capabilities::probe_at(&root(m.machine), 0, "unrecorded");
        let name = m.machine;
        assert_eq!(c.vendor, m.vendor, "{name}");
        let (mode, reason) = c.mode();
        assert_eq!(mode, m.mode, "{name}: {reason}");
        for words in m.reason {
            assert!(reason.contains(words), "{name}: {reason:?} lacks {words:?}");
        }
        let rate = Rate {
            frequency: DEFAULT_FREQUENCY,
            period: None,
            core_hz: c.core_hz.unwrap_or(events::DEFAULT_CORE_HZ),
        };
        let specs = events::plan(mode, &c.processor(), &rate, false, false);
        let planned: Vec<(String, u32, u64, Option<String>)> = specs
            .iter()
            .map(|s| {
                let cpus = s.cpus.as_deref().map(cpi_user::collect::caps::cpu_list);
                (s.name.clone(), s.attr.type_, s.attr.config, cpus)
            })
            .collect();
        let want: Vec<(String, u32, u64, Option<String>)> = m
            .events
            .iter()
            .map(|&(n, t, cfg, cpus)| (n.to_string(), t, cfg, cpus.map(str::to_string)))
            .collect();
        assert_eq!(planned, want, "{name}");
        // The branch-stack events ask for one; the others do not.
        for s in &specs {
            let stack = s.attr.branch_sample_type != 0;
            assert_eq!(stack, s.program == "branch_sample", "{name}: {}", s.name);
        }
    }
}

#[test]
fn only_core_pmus_count_and_the_arch_decides_what_analysis_can_do() {
    // Skylake-SP's uncore_imc_0 has a cpumask, not a cpus file: not a core PMU.
    let c = Capabilities::probe_at(&root("skylake-sp"), 0, "unrecorded");
    assert!(c.pmu_devices.contains(&"uncore_imc_0".to_string()));
    let names: Vec<&str> = c.core_pmus.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["cpu"]);
    assert_eq!(c.lbr_depth(), Some(32));
    assert_eq!(
        c.kernel, "5.10.0-28-amd64",
        "from proc/sys/kernel/osrelease"
    );
    assert_eq!(c.online_cpus.len(), 80);
    let arm = Capabilities::probe_at(&root("arm64-brbe"), 0, "unrecorded");
    assert_eq!((arm.arch, arm.core_pmus[0].type_), (Arch::Aarch64, 10));
    let guest = Capabilities::probe_at(&root("kvm-guest"), 0, "unrecorded");
    assert!(guest.hypervisor && guest.lbr_depth().is_none());
}

/// Zen 3's BRS takes a branch-stack event only as `amd_brs_hw_config`
/// (arch/x86/events/amd/brs.c) allows: a sampling `ex_ret_brn_tkn` (config 0xc4 and
/// nothing else), a fixed period above the depth, branch filter ANY with privilege bits
/// only. A client Zen 3 (no `brs` flag) is not taken for one.
#[test]
fn zen3_brs_gets_the_only_branch_event_the_kernel_allows() {
    use cpi_user::collect::sys::{flag, PERF_SAMPLE_BRANCH_ANY};
    let c = Capabilities::probe_at(&root("amd-zen3-epyc-brs"), 0, "unrecorded");
    assert!(c.brs && c.lbr_depth() == Some(16));
    assert!(!Capabilities::probe_at(&root("amd-zen3"), 0, "unrecorded").brs);
    assert!(!Capabilities::probe_at(&root("amd-zen4"), 0, "unrecorded").brs);
    for period in [None, Some(17)] {
        let rate = Rate {
            frequency: DEFAULT_FREQUENCY,
            period,
            core_hz: c.core_hz.unwrap(),
        };
        let specs = events::plan(c.mode().0, &c.processor(), &rate, true, false);
        let b = specs
            .iter()
            .find(|s| s.attr.branch_sample_type != 0)
            .unwrap();
        let plm_all = 0x7; // PERF_SAMPLE_BRANCH_USER | KERNEL | HV
        assert_eq!(b.attr.config, 0xc4, "AMD_FAM19H_BRS_EVENT");
        assert_eq!(b.attr.flags & flag::FREQ, 0, "no frequency mode");
        assert!(b.attr.sample_period > 16, "period {}", b.attr.sample_period);
        // No branch types (BRS refuses them with EINVAL): the kernel takes every open
        // at the first try (cpi-user/src/collect/ladder.rs,
        // `zen3_brs_opens_every_event_without_a_refusal`, with the syscall fake).
        assert!(!b.saves_branch_types());
        assert_eq!(b.attr.branch_sample_type & !plm_all, PERF_SAMPLE_BRANCH_ANY);
    }
}

#[test]
fn doctor_reads_a_recorded_machine() {
    for m in MACHINES {
        let out = output_ok(
            Command::new(cpi_bpf())
                .arg("doctor")
                .arg("--root")
                .arg(root(m.machine)),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        golden(&format!("machine_{}_doctor.txt", m.machine), &text);
        // The mode line is the probe's, word for word.
        let c = Capabilities::probe_at(&root(m.machine), 0, "unrecorded");
        let (mode, reason) = c.mode();
        let mode_line = format!("{:<22} {} — {reason}", "mode", mode.name());
        assert!(
            text.lines().any(|l| l == mode_line),
            "{}: {text}",
            m.machine
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("planned event"))
                .count(),
            m.events.len(),
            "{text}"
        );
    }
    let out = Command::new(cpi_bpf())
        .args(["doctor", "--root", "/nonexistent-machine"])
        .output()
        .unwrap();
    assert_one_error_line(
        &out,
        "--root /nonexistent-machine: no sys/bus/event_source/devices",
    );
}
