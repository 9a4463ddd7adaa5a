//! What this machine can measure, and the capability ladder (`ladder.rs`):
//! LBR + cycles → [`Mode::Cpi`]; PMU without branch records → [`Mode::IpSampling`];
//! no PMU → [`Mode::TimeProfile`]. The file-system probes take a root directory so the
//! ladder is tested on fake `/sys` and `/proc` trees.

use std::path::Path;

use crate::profile::Mode;

pub use crate::profile::events::Vendor;

/// Everything the probe found. Each field is one line of `cpi-bpf doctor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `uname -r`.
    pub kernel: String,
    /// `/sys/bus/event_source/devices/*`.
    pub pmu_devices: Vec<String>,
    /// The core PMU (`cpu`, or `cpu_core` on hybrid parts), when there is one.
    pub cpu_pmu: Option<String>,
    /// LBR depth from `…/cpu*/caps/branches`; `None` = no branch records.
    pub lbr_depth: Option<u32>,
    /// From `/proc/cpuinfo`'s `vendor_id`.
    pub vendor: Vendor,
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

impl Capabilities {
    /// Probes the running machine.
    pub fn probe() -> Self {
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        Self::probe_at(Path::new("/"), euid, &kernel_release())
    }

    /// Probes a tree rooted at `root` (`/` on a real machine).
    pub fn probe_at(root: &Path, euid: u32, kernel: &str) -> Self {
        let devices_dir = root.join("sys/bus/event_source/devices");
        let mut pmu_devices: Vec<String> = std::fs::read_dir(&devices_dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        pmu_devices.sort();
        let cpu_pmu = ["cpu", "cpu_core"]
            .iter()
            .find(|n| pmu_devices.iter().any(|d| d == *n))
            .map(ToString::to_string);
        let lbr_depth = cpu_pmu.as_ref().and_then(|pmu| {
            read_trim(&devices_dir.join(pmu).join("caps/branches"))
                .and_then(|s| s.parse::<u32>().ok())
                .filter(|&d| d > 0)
        });
        let vendor = Vendor::from_vendor_id(
            read_trim(&root.join("proc/cpuinfo"))
                .and_then(|t| {
                    t.lines()
                        .find(|l| l.starts_with("vendor_id"))
                        .and_then(|l| l.split(':').nth(1))
                        .map(|v| v.trim().to_string())
                })
                .as_deref()
                .unwrap_or(""),
        );
        let cap_eff = read_trim(&root.join("proc/self/status"))
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(0);
        let has = |c: u32| cap_eff & (1u64 << c) != 0;
        Capabilities {
            kernel: kernel.to_string(),
            pmu_devices,
            cpu_pmu,
            lbr_depth,
            vendor,
            btf: root.join("sys/kernel/btf/vmlinux").exists(),
            euid,
            cap_bpf: has(CAP_BPF),
            cap_perfmon: has(CAP_PERFMON),
            cap_sys_admin: has(CAP_SYS_ADMIN),
            perf_event_paranoid: read_trim(&root.join("proc/sys/kernel/perf_event_paranoid"))
                .and_then(|s| s.parse().ok()),
        }
    }

    /// Loading perf_event BPF programs and sampling other processes needs root, or
    /// CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN). `Err` says what is missing.
    pub fn check_privileges(&self) -> Result<(), String> {
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
        let (mode, why) = match (&self.cpu_pmu, self.lbr_depth) {
            (None, _) => (
                Mode::TimeProfile,
                format!("no PMU ({devices}/cpu missing; a VM without PMU passthrough?)"),
            ),
            (Some(pmu), None) => (
                Mode::IpSampling,
                format!("PMU {pmu} has no branch records ({devices}/{pmu}/caps/branches missing)"),
            ),
            (Some(pmu), Some(depth)) => (
                Mode::Cpi,
                format!("PMU {pmu} with {depth}-deep branch records"),
            ),
        };
        (mode, format!("{why}: {}", mode.measures()))
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return "unknown".to_string();
    }
    // SAFETY: release is NUL-terminated by the kernel.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

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
        assert_eq!(c.cpu_pmu, None);
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
        assert_eq!(c.cpu_pmu.as_deref(), Some("cpu"));
        assert_eq!(c.lbr_depth, None);
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
        assert_eq!(c.lbr_depth, Some(32));
        assert_eq!(c.vendor, Vendor::Intel);
        assert!(c.btf);
        assert_eq!(c.perf_event_paranoid, Some(2));
        assert_eq!(c.mode().0, Mode::Cpi);
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
}
