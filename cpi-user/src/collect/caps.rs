//! What this machine can measure, and the capability ladder (`ladder.rs`):
//! LBR + cycles → [`Mode::Cpi`]; PMU without branch records → [`Mode::IpSampling`];
//! no PMU → [`Mode::TimeProfile`]. The file-system probes take a root directory so the
//! ladder is tested on fake `/sys` and `/proc` trees.

use std::path::Path;

use cpi_common::wire::StackMode;

use crate::profile::Mode;

pub use crate::profile::events::Vendor;

/// A core PMU, by perf's rule (`is_pmu_core` in tools/perf/util/pmu.c): `cpu`, or any
/// PMU with a `cpus` file (Intel hybrid `cpu_core`/`cpu_atom`, Arm `armv8_pmuv3_0`, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorePmu {
    /// Its directory under `/sys/bus/event_source/devices/`.
    pub name: String,
    /// `type`: the `perf_event_attr.type` of its own events (4 = `PERF_TYPE_RAW` for
    /// `cpu` and `cpu_core`; dynamic for the others).
    pub type_: u32,
    /// `cpus`: the CPUs it counts on; `None` (no such file) = every CPU.
    pub cpus: Option<Vec<u32>>,
    /// `caps/branches`: branch-record depth; `None` = no branch records.
    pub branches: Option<u32>,
    /// `caps/pmu_name` (Intel: the core's microarchitecture, e.g. `skylake`).
    pub pmu_name: Option<String>,
}

/// What of the machine its events are planned for ([`super::events::plan`]), from
/// [`Capabilities::processor`]; a session keeps it to plan again at a new rate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processor {
    /// Whose raw event codes.
    pub vendor: Vendor,
    /// [`Capabilities::core_pmus`].
    pub core_pmus: Vec<CorePmu>,
    /// [`Capabilities::brs`]: branch events are planned without branch types, which
    /// BRS refuses.
    pub brs: bool,
}

impl Processor {
    /// A `vendor` processor with one core PMU of the plain types and no BRS.
    pub fn of(vendor: Vendor) -> Self {
        Processor {
            vendor,
            core_pmus: Vec::new(),
            brs: false,
        }
    }
}

impl CorePmu {
    /// `cpu_atom (CPUs 16-23)`, or the name alone for a PMU of every CPU.
    pub fn describe(&self) -> String {
        match &self.cpus {
            Some(cpus) => format!("{} (CPUs {})", self.name, cpu_list(cpus)),
            None => self.name.clone(),
        }
    }
}

/// The instruction set, from `/proc/cpuinfo`'s layout: the analysis disassembles x86-64
/// only (`binary/`, iced-x86).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `vendor_id` lines.
    X86_64,
    /// `CPU implementer` lines (arm64's cpuinfo).
    Aarch64,
    /// Neither.
    Other,
}

/// Everything the probe found. Each field is one line of `cpi-bpf doctor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `uname -r` (`/proc/sys/kernel/osrelease` in a recorded tree).
    pub kernel: String,
    /// `/sys/bus/event_source/devices/*`.
    pub pmu_devices: Vec<String>,
    /// The core PMUs ([`CorePmu`]), by `type`: one on most machines, one per core kind
    /// on hybrid and big.LITTLE parts; none without a PMU.
    pub core_pmus: Vec<CorePmu>,
    /// From `/proc/cpuinfo`'s `vendor_id`.
    pub vendor: Vendor,
    /// From `/proc/cpuinfo`'s layout.
    pub arch: Arch,
    /// `/proc/cpuinfo`'s `model name`, when it has one.
    pub model: Option<String>,
    /// `/proc/cpuinfo` flags include `hypervisor`: a virtual machine.
    pub hypervisor: bool,
    /// Branch records come from Zen 3's Branch Sampling (flag `brs`, no `amd_lbr_v2`):
    /// the kernel (arch/x86/events/amd/brs.c, `amd_brs_hw_config`) lets only
    /// `ex_ret_brn_tkn` at a fixed period above the depth sample them, records all
    /// branches unfiltered, and its entries carry neither cycles nor mispredictions.
    pub brs: bool,
    /// `/proc/cpuinfo`'s first `cpu MHz`, in Hz.
    pub core_hz: Option<u64>,
    /// `/sys/devices/system/cpu/online`.
    pub online_cpus: Vec<u32>,
    /// `/sys/kernel/btf/vmlinux` exists.
    pub btf: bool,
    /// Effective user id (0 = root).
    pub euid: u32,
    /// `CAP_BPF` in the effective set (`/proc/self/status` `CapEff`).
    pub cap_bpf: bool,
    /// `CAP_PERFMON` in the effective set.
    pub cap_perfmon: bool,
    /// `CAP_SYS_ADMIN` in the effective set (stands for both on older kernels).
    pub cap_sys_admin: bool,
    /// `/proc/sys/kernel/perf_event_paranoid`.
    pub perf_event_paranoid: Option<i32>,
}

// Capability numbers (include/uapi/linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

const DEVICES: &str = "sys/bus/event_source/devices";

impl Capabilities {
    /// Probes the running machine.
    pub fn probe() -> Self {
        Self::probe_at(Path::new("/"), crate::fsafe::euid(), &kernel_release())
    }

    /// Probes a tree rooted at `root` (`/` on a real machine, a recorded machine's
    /// `/sys` and `/proc` in tests and `cpi-bpf doctor --root`). `kernel` stands where the
    /// tree has no `proc/sys/kernel/osrelease`.
    pub fn probe_at(root: &Path, euid: u32, kernel: &str) -> Self {
        let devices_dir = root.join(DEVICES);
        let mut pmu_devices: Vec<String> = std::fs::read_dir(&devices_dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        pmu_devices.sort();
        let mut core_pmus: Vec<CorePmu> = pmu_devices
            .iter()
            .filter_map(|name| core_pmu(&devices_dir.join(name), name))
            .collect();
        core_pmus.sort_by_key(|p| (p.type_, p.name.clone()));
        let cpuinfo = read_trim(&root.join("proc/cpuinfo")).unwrap_or_default();
        let field = |key: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        let flag =
            |name: &str| field("flags").is_some_and(|f| f.split_whitespace().any(|f| f == name));
        let arch = if field("vendor_id").is_some() {
            Arch::X86_64
        } else if field("CPU implementer").is_some() {
            Arch::Aarch64
        } else {
            Arch::Other
        };
        let cap_eff = read_trim(&root.join("proc/self/status"))
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(0);
        let has = |c: u32| cap_eff & (1u64 << c) != 0;
        Capabilities {
            kernel: read_trim(&root.join("proc/sys/kernel/osrelease"))
                .unwrap_or_else(|| kernel.to_string()),
            pmu_devices,
            core_pmus,
            vendor: Vendor::from_vendor_id(field("vendor_id").as_deref().unwrap_or("")),
            arch,
            model: field("model name"),
            hypervisor: flag("hypervisor"),
            brs: flag("brs") && !flag("amd_lbr_v2"),
            core_hz: super::events::core_hz_of(&cpuinfo),
            online_cpus: read_trim(&root.join("sys/devices/system/cpu/online"))
                .map(|t| super::target::parse_cpu_list(&t))
                .unwrap_or_default(),
            btf: root.join("sys/kernel/btf/vmlinux").exists(),
            euid,
            cap_bpf: has(CAP_BPF),
            cap_perfmon: has(CAP_PERFMON),
            cap_sys_admin: has(CAP_SYS_ADMIN),
            perf_event_paranoid: read_trim(&root.join("proc/sys/kernel/perf_event_paranoid"))
                .and_then(|s| s.parse().ok()),
        }
    }

    /// What the event plan needs of the probe.
    pub fn processor(&self) -> Processor {
        Processor {
            vendor: self.vendor,
            core_pmus: self.core_pmus.clone(),
            brs: self.brs,
        }
    }

    /// The branch-record depth every core PMU offers (the smallest), `None` when one
    /// has none: CPI needs branch records wherever the work runs.
    pub fn lbr_depth(&self) -> Option<u32> {
        if self.core_pmus.is_empty() {
            return None;
        }
        self.core_pmus.iter().map(|p| p.branches).min().flatten()
    }

    /// Loading perf_event BPF programs and sampling other processes needs root, or
    /// CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN). `Err` says what is missing.
    pub(crate) fn check_privileges(&self) -> Result<(), String> {
        if self.euid == 0 || self.cap_sys_admin || (self.cap_bpf && self.cap_perfmon) {
            return Ok(());
        }
        let mut missing = Vec::new();
        if !self.cap_bpf {
            missing.push("CAP_BPF");
        }
        if !self.cap_perfmon {
            missing.push("CAP_PERFMON");
        }
        Err(format!(
            "not root (euid {}) and missing {}: run with sudo",
            self.euid,
            missing.join(" and ")
        ))
    }

    /// The rung of the ladder this machine supports, and why, in one line.
    pub fn mode(&self) -> (Mode, String) {
        let devices = "/sys/bus/event_source/devices";
        let vm = if self.hypervisor {
            "; a virtual machine's PMU (cpuinfo flag hypervisor): no LBR passed through"
        } else {
            ""
        };
        let without = self.core_pmus.iter().find(|p| p.branches.is_none());
        let (mode, why) = match (self.core_pmus.as_slice(), without) {
            ([], _) => (
                Mode::TimeProfile,
                format!("no PMU ({devices}/cpu missing; a VM without PMU passthrough?)"),
            ),
            (_, Some(p)) => (
                Mode::IpSampling,
                format!(
                    "PMU {} has no branch records ({devices}/{}/caps/branches missing{vm})",
                    p.describe(),
                    p.name
                ),
            ),
            ([p], None) => (
                Mode::Cpi,
                format!(
                    "PMU {} with {}-deep branch records{}",
                    p.describe(),
                    p.branches.unwrap_or(0),
                    if self.brs {
                        " (AMD BRS, cpuinfo flag brs: sampled on ex_ret_brn_tkn at a fixed \
                         period only, no cycles in the entries, so no timed CPI)"
                    } else {
                        ""
                    }
                ),
            ),
            (all, None) => (
                Mode::Cpi,
                format!(
                    "PMUs {}",
                    all.iter()
                        .map(|p| format!(
                            "{} with {}-deep branch records",
                            p.describe(),
                            p.branches.unwrap_or(0)
                        ))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ),
        };
        let analysis = match (mode, self.arch) {
            (Mode::Cpi | Mode::IpSampling, Arch::Aarch64 | Arch::Other) => {
                "; samples are collected, but instructions and blocks need x86-64 \
                 disassembly, which this CPU's code is not"
            }
            _ => "",
        };
        (mode, format!("{why}: {}{analysis}", mode.measures()))
    }
}

/// The core PMU at `dir`, when `name` is one (perf's rule, [`CorePmu`]).
fn core_pmu(dir: &Path, name: &str) -> Option<CorePmu> {
    let cpus = read_trim(&dir.join("cpus")).map(|t| super::target::parse_cpu_list(&t));
    if name != "cpu" && cpus.is_none() {
        return None;
    }
    Some(CorePmu {
        name: name.to_string(),
        // `cpu` is PERF_TYPE_RAW on every x86 kernel; a tree may leave `type` out.
        type_: read_trim(&dir.join("type"))
            .and_then(|t| t.parse().ok())
            .unwrap_or(super::sys::PERF_TYPE_RAW),
        cpus,
        branches: read_trim(&dir.join("caps/branches"))
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|&d| d > 0),
        pmu_name: read_trim(&dir.join("caps/pmu_name")),
    })
}

/// `cpus` back in the kernel's list form (`0-15,20`).
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// What the running kernel's BPF offers of what cpi-bpf uses. Each is probed (aya's
/// `is_*_supported`: a tiny program or map the kernel accepts or refuses), never
/// inferred from the version: distributions backport. The floor and what each feature
/// decides are in docs/METHOD.md, "Kernels".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KernelFeatures {
    /// `BPF_PROG_TYPE_PERF_EVENT` (Linux 4.9): every program is one.
    pub perf_event_programs: bool,
    /// `BPF_MAP_TYPE_RINGBUF` (5.8): the only way samples come home.
    pub ring_buffer: bool,
    /// `bpf_read_branch_records` from perf_event programs (5.6): the `cpi` mode's
    /// branch stacks.
    pub read_branch_records: bool,
    /// `BPF_ENABLE_STATS` (5.8): the agent's measure of its programs' own run time.
    pub bpf_stats: bool,
    /// `bpf_get_current_task_btf` (5.11) and `bpf_task_pt_regs` (5.15): the user
    /// registers of a sample taken in kernel mode, so its user stack is copied and
    /// unwound like any other; without them such samples get the kernel's frame-pointer
    /// walk of the user stack ([`StackMode`]).
    pub task_pt_regs: bool,
    /// `bpf_get_current_ancestor_cgroup_id` in perf_event programs (not in 5.10): the
    /// `--cgroup` filter in the kernel (cpi-user/src/collect/filter.rs); without it,
    /// `--cgroup` filters in user space only.
    pub ancestor_cgroup_id: bool,
}

impl KernelFeatures {
    /// Probes the running kernel (needs the privileges collection needs).
    pub fn probe() -> Self {
        use aya::programs::ProgramType;
        use aya::sys::{is_helper_supported, is_map_supported, is_program_supported, BpfHelper};
        KernelFeatures {
            perf_event_programs: is_program_supported(ProgramType::PerfEvent).unwrap_or(false),
            ring_buffer: is_map_supported(aya::maps::MapType::RingBuf).unwrap_or(false),
            read_branch_records: is_helper_supported(
                ProgramType::PerfEvent,
                BpfHelper::BPF_FUNC_read_branch_records,
            )
            .unwrap_or(false),
            bpf_stats: super::sys::PerfSys::enable_bpf_stats(&super::sys::Linux).is_ok(),
            task_pt_regs: [
                BpfHelper::BPF_FUNC_get_current_task_btf,
                BpfHelper::BPF_FUNC_task_pt_regs,
            ]
            .into_iter()
            .all(|h| is_helper_supported(ProgramType::PerfEvent, h).unwrap_or(false)),
            ancestor_cgroup_id: is_helper_supported(
                ProgramType::PerfEvent,
                BpfHelper::BPF_FUNC_get_current_ancestor_cgroup_id,
            )
            .unwrap_or(false),
        }
    }

    /// How the kernel side takes stacks: none when `stacks` is off, else the best this
    /// kernel's helpers allow.
    pub(crate) fn stack_mode(&self, stacks: bool) -> StackMode {
        match (stacks, self.task_pt_regs) {
            (false, _) => StackMode::Off,
            (true, true) => StackMode::CopyStack,
            (true, false) => StackMode::CopyStackUserFramePointers,
        }
    }

    /// Each feature as `(name, "yes"/"missing" with the Linux version that added it and
    /// what depends on it)`: the lines of `cpi-bpf doctor`.
    pub fn lines(&self) -> [(&'static str, String); 6] {
        let say = |has: bool, since: &str, what: &str| {
            if has {
                format!("yes (Linux {since}; {what})")
            } else {
                format!("MISSING (Linux {since}; {what})")
            }
        };
        [
            (
                "perf_event programs",
                say(self.perf_event_programs, "4.9", "every mode"),
            ),
            (
                "BPF ring buffer",
                say(self.ring_buffer, "5.8", "every mode"),
            ),
            (
                "bpf_read_branch_records",
                say(self.read_branch_records, "5.6", "the cpi mode"),
            ),
            (
                "BPF run-time stats",
                say(self.bpf_stats, "5.8", "the agent's own BPF time"),
            ),
            (
                "bpf_task_pt_regs",
                say(
                    self.task_pt_regs,
                    "5.15",
                    "user stacks of kernel-mode samples unwound from .eh_frame",
                ),
            ),
            (
                "bpf_get_current_ancestor_cgroup_id",
                say(
                    self.ancestor_cgroup_id,
                    "after 5.10",
                    "the agent's --cgroup filtered in the kernel",
                ),
            ),
        ]
    }

    /// `Err`: one line saying that `kernel` is below what cpi-bpf supports, and which
    /// missing feature makes it so.
    pub(crate) fn check_floor(&self, kernel: &str) -> Result<(), String> {
        let missing = match (self.perf_event_programs, self.ring_buffer) {
            (false, _) => "perf_event BPF programs (Linux 4.9)",
            (true, false) => "the BPF ring buffer (Linux 5.8)",
            (true, true) => return Ok(()),
        };
        Err(format!(
            "kernel {kernel} lacks {missing}: cpi-bpf needs Linux 5.8 or later (tested from 5.10)"
        ))
    }

    /// The highest mode at or below `probed` (the PMU's answer, [`Capabilities::mode`])
    /// whose programs this kernel can load, and why, naming the missing feature when it
    /// is the kernel and not the PMU that decided.
    pub fn limit(&self, probed: (Mode, String)) -> (Mode, String) {
        match probed.0 {
            Mode::Cpi if !self.read_branch_records => {
                let mode = Mode::IpSampling;
                (
                    mode,
                    format!(
                        "the PMU has branch records but this kernel lacks the \
                         bpf_read_branch_records helper (Linux 5.6): {}",
                        mode.measures()
                    ),
                )
            }
            _ => probed,
        }
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

pub use super::sys::process::kernel_release;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake `/` holding `files`.
    fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("cpi-caps-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    const CPUINFO_INTEL: (&str, &str) = (
        "proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: GenuineIntel\n",
    );

    #[test]
    fn no_pmu_is_a_time_profile_with_the_reason() {
        let root = tree(
            "nopmu",
            &[
                ("sys/bus/event_source/devices/software/type", "1"),
                ("proc/cpuinfo", "vendor_id\t: AuthenticAMD\n"),
                ("proc/self/status", "CapEff:\t000001ffffffffff\n"),
            ],
        );
        let c = Capabilities::probe_at(&root, 0, "6.18.0");
        assert!(c.core_pmus.is_empty());
        assert_eq!(c.vendor, Vendor::Amd);
        assert!(!c.btf, "no /sys/kernel/btf/vmlinux in the tree");
        let (mode, why) = c.mode();
        assert_eq!(mode, Mode::TimeProfile);
        assert!(why.starts_with("no PMU"), "{why}");
        assert!(c.cap_bpf && c.cap_perfmon);
    }

    #[test]
    fn pmu_without_lbr_is_ip_sampling() {
        let root = tree(
            "nolbr",
            &[
                ("sys/bus/event_source/devices/cpu/type", "4"),
                CPUINFO_INTEL,
            ],
        );
        let c = Capabilities::probe_at(&root, 0, "6.18.0");
        assert_eq!(c.core_pmus[0].name, "cpu");
        assert_eq!(c.lbr_depth(), None);
        let (mode, why) = c.mode();
        assert_eq!(mode, Mode::IpSampling);
        assert!(why.contains("no branch records"), "{why}");
    }

    #[test]
    fn lbr_gives_cpi_mode() {
        let root = tree(
            "lbr",
            &[
                ("sys/bus/event_source/devices/cpu/caps/branches", "32\n"),
                ("sys/kernel/btf/vmlinux", ""),
                ("proc/sys/kernel/perf_event_paranoid", "2\n"),
                CPUINFO_INTEL,
            ],
        );
        let c = Capabilities::probe_at(&root, 0, "6.18.0");
        assert_eq!(c.lbr_depth(), Some(32));
        assert_eq!(c.vendor, Vendor::Intel);
        assert!(c.btf);
        assert_eq!(c.perf_event_paranoid, Some(2));
        assert_eq!(c.mode().0, Mode::Cpi);
    }

    const EVERYTHING: KernelFeatures = KernelFeatures {
        perf_event_programs: true,
        ring_buffer: true,
        read_branch_records: true,
        bpf_stats: true,
        task_pt_regs: true,
        ancestor_cgroup_id: true,
    };

    #[test]
    fn a_kernel_without_read_branch_records_steps_cpi_down_and_says_why() {
        let probed = (Mode::Cpi, "PMU cpu with 32-deep branch records".to_string());
        assert_eq!(EVERYTHING.limit(probed.clone()), probed);
        let old = KernelFeatures {
            read_branch_records: false,
            ..EVERYTHING
        };
        let (mode, why) = old.limit(probed);
        assert_eq!(mode, Mode::IpSampling);
        assert!(
            why.contains("lacks the bpf_read_branch_records helper (Linux 5.6)"),
            "{why}"
        );
        // Lower rungs need no branch records: the PMU's answer stands.
        let time = (Mode::TimeProfile, "no PMU".to_string());
        assert_eq!(old.limit(time.clone()), time);
        assert!(old.lines()[2].1.starts_with("MISSING (Linux 5.6"));
        let no_regs = KernelFeatures {
            task_pt_regs: false,
            ..EVERYTHING
        };
        assert_eq!(EVERYTHING.stack_mode(true), StackMode::CopyStack);
        assert_eq!(
            no_regs.stack_mode(true),
            StackMode::CopyStackUserFramePointers
        );
        assert_eq!(EVERYTHING.stack_mode(false), StackMode::Off);
        assert!(no_regs.lines()[4].1.starts_with("MISSING (Linux 5.15"));
        assert!(EVERYTHING.lines().iter().all(|(_, l)| l.starts_with("yes")));
    }

    #[test]
    fn below_the_floor_is_one_line_naming_the_missing_feature() {
        assert_eq!(EVERYTHING.check_floor("5.10.0"), Ok(()));
        let no_ring = KernelFeatures {
            ring_buffer: false,
            ..EVERYTHING
        };
        let err = no_ring.check_floor("5.4.0").unwrap_err();
        assert!(
            err.starts_with("kernel 5.4.0 lacks the BPF ring buffer (Linux 5.8)")
                && err.contains("Linux 5.8 or later")
                && !err.contains('\n'),
            "{err}"
        );
        let none = KernelFeatures {
            perf_event_programs: false,
            ..no_ring
        };
        assert!(none
            .check_floor("4.4.0")
            .unwrap_err()
            .contains("perf_event BPF programs"));
    }

    #[test]
    fn unprivileged_user_is_refused_with_what_is_missing() {
        let root = tree(
            "unpriv",
            &[("proc/self/status", "CapEff:\t0000000000000000\n")],
        );
        let c = Capabilities::probe_at(&root, 65534, "6.18.0");
        let err = c.check_privileges().unwrap_err();
        assert!(err.contains("not root") && err.contains("CAP_BPF"), "{err}");
        let root = tree(
            "capbpf",
            &[("proc/self/status", "CapEff:\t000000c000000000\n")],
        );
        let c = Capabilities::probe_at(&root, 1000, "6.18.0");
        assert!(
            c.check_privileges().is_ok(),
            "CAP_BPF + CAP_PERFMON suffice"
        );
    }

    #[test]
    fn core_pmus_are_cpu_or_those_with_a_cpus_file() {
        let root = tree(
            "hybrid",
            &[
                ("sys/bus/event_source/devices/cpu_atom/type", "8\n"),
                ("sys/bus/event_source/devices/cpu_atom/cpus", "16-23\n"),
                ("sys/bus/event_source/devices/cpu_core/type", "4\n"),
                ("sys/bus/event_source/devices/cpu_core/cpus", "0-15\n"),
                (
                    "sys/bus/event_source/devices/cpu_core/caps/branches",
                    "32\n",
                ),
                ("sys/bus/event_source/devices/uncore_imc_0/cpumask", "0\n"),
                CPUINFO_INTEL,
            ],
        );
        let c = Capabilities::probe_at(&root, 0, "6.18.0");
        let names: Vec<&str> = c.core_pmus.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["cpu_core", "cpu_atom"], "by type; uncore left out");
        assert_eq!(cpu_list(c.core_pmus[1].cpus.as_deref().unwrap()), "16-23");
        // One kind of core without branch records: no CPI anywhere, and which is said.
        assert_eq!(c.lbr_depth(), None);
        let (mode, why) = c.mode();
        assert_eq!(mode, Mode::IpSampling);
        assert!(
            why.starts_with("PMU cpu_atom (CPUs 16-23) has no branch records"),
            "{why}"
        );
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(
            crate::collect::target::parse_cpu_list("0-2,5,7-8\n"),
            [0, 1, 2, 5, 7, 8]
        );
    }
}
