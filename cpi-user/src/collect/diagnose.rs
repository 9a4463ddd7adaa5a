//! `cpi-bpf doctor`: every probe the capability ladder uses, then the mode cpi-bpf would
//! run in, as lines the binary prints; or what a recorded machine's tree shows.

use std::path::PathBuf;

use cpi_common::policy::KernelConfig;
use cpi_common::wire::EventRole;

use super::caps::{self, Capabilities, KernelFeatures};
use super::sys::{Follow, Linux, Placement, Placements};
use super::{events, ladder, perf_ring, Target, DEFAULT_FREQUENCY};
use crate::profile::Mode;

/// What the probes found, a line each (`(what, finding)`), and whether collection
/// can run here.
#[derive(Debug, Default)]
pub struct Diagnosis {
    /// `(what, finding)`, in the order probed.
    pub lines: Vec<(String, String)>,
    /// A mode was found that collection can run in (on a recorded machine: a mode).
    pub can_collect: bool,
}

impl Diagnosis {
    fn line(&mut self, what: &str, finding: &str) {
        self.lines.push((what.to_string(), finding.to_string()));
    }
}

/// `--root DIR` names no recorded machine.
#[derive(Debug, thiserror::Error)]
#[error("--root {}: no sys/bus/event_source/devices there (not a recorded machine)", .0.display())]
pub struct NotRecorded(pub PathBuf);

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The probe's lines that need no privileges: what a recorded tree shows too.
fn machine_lines(out: &mut Diagnosis, c: &Capabilities) {
    out.line(
        "perf_event_paranoid",
        &c.perf_event_paranoid
            .map_or("unreadable".to_string(), |p| p.to_string()),
    );
    out.line("PMU devices", &c.pmu_devices.join(", "));
    if c.core_pmus.is_empty() {
        out.line(
            "core PMU",
            "none (/sys/bus/event_source/devices/cpu missing)",
        );
    }
    for p in &c.core_pmus {
        let name = p
            .pmu_name
            .as_deref()
            .map_or(String::new(), |n| format!(", {n}"));
        out.line(
            "core PMU",
            &format!("{} type {}{name}", p.describe(), p.type_),
        );
    }
    out.line(
        "branch records",
        &match c.core_pmus.as_slice() {
            [] => "none (no core PMU)".to_string(),
            pmus => pmus
                .iter()
                .map(|p| match p.branches {
                    Some(d) => format!("{d} entries ({}/caps/branches)", p.name),
                    None => format!("none ({}/caps/branches missing)", p.name),
                })
                .collect::<Vec<_>>()
                .join("; "),
        },
    );
    let mut cpu = format!("{:?}, {:?}", c.vendor, c.arch);
    if let Some(m) = &c.model {
        cpu.push_str(&format!(", {m}"));
    }
    if c.hypervisor {
        cpu.push_str(", virtual machine (cpuinfo flag hypervisor)");
    }
    out.line("CPU vendor", &cpu);
    out.line(
        "BTF",
        if c.btf {
            "/sys/kernel/btf/vmlinux present"
        } else {
            "missing (/sys/kernel/btf/vmlinux)"
        },
    );
}

/// `doctor --root DIR`: the recorded machine's probe, mode and event plan.
pub fn diagnose_recorded(root: &std::path::Path) -> Result<Diagnosis, NotRecorded> {
    if !root.join("sys/bus/event_source/devices").is_dir() {
        return Err(NotRecorded(root.to_path_buf()));
    }
    let mut diagnosis = Diagnosis::default();
    let out = &mut diagnosis;
    let c = Capabilities::probe_at(root, 0, "unrecorded");
    out.line("kernel", &c.kernel);
    out.line("privileges", "not probed (a recorded machine)");
    machine_lines(out, &c);
    out.line("online CPUs", &caps::cpu_list(&c.online_cpus));
    let rate = events::Rate {
        frequency: DEFAULT_FREQUENCY,
        period: None,
        core_hz: c.core_hz.unwrap_or(events::DEFAULT_CORE_HZ),
    };
    let (mode, reason) = c.mode();
    out.line("mode", &format!("{} — {reason}", mode.name()));
    for spec in events::plan(mode, &c.processor(), &rate, false, false) {
        let on = spec
            .cpus
            .as_deref()
            .map_or("every CPU".to_string(), |cpus| {
                format!("CPUs {}", caps::cpu_list(cpus))
            });
        out.line(
            "planned event",
            &format!(
                "{}: type {}, config {:#x}, period {}, on {on}, program {}",
                spec.name, spec.attr.type_, spec.attr.config, spec.policy.base, spec.program
            ),
        );
    }
    out.can_collect = true;
    Ok(diagnosis)
}

/// The probes of this machine, as collection makes them (the ladder walked on this
/// process).
pub fn diagnose() -> Diagnosis {
    let mut diagnosis = Diagnosis::default();
    let out = &mut diagnosis;
    let c = Capabilities::probe();
    let privileged = privilege_lines(out, &c);
    machine_lines(out, &c);
    let rate = events::Rate {
        frequency: DEFAULT_FREQUENCY,
        period: None,
        core_hz: events::nominal_core_hz(),
    };
    let plan = |m: Mode| events::plan(m, &c.processor(), &rate, false, false);
    let probe = if privileged.is_ok() {
        load_programs(out, &c, &plan)
    } else {
        out.line("kernel features", "not probed (no privileges)");
        out.line("BPF load", "not tried (no privileges)");
        Probe {
            start: c.mode(),
            below_floor: false,
            bpf: None,
        }
    };
    event_lines(out, probe.bpf.as_ref(), &plan);
    // The ladder exactly as collection walks it, on this process.
    let attach = |name: &'static str| match &probe.bpf {
        Some(b) => ladder::program_fd(b, name),
        None => Ok(None),
    };
    let rung = ladder::walk(
        &Linux,
        probe.start,
        &plan,
        &Placements {
            at: vec![Placement::Me],
            follow: Follow::Placed,
        },
        &attach,
        &mut |_| {},
    );
    match rung {
        Ok(rung) if privileged.is_ok() && probe.bpf.is_some() && !probe.below_floor => {
            out.line("mode", &format!("{} — {}", rung.mode.name(), rung.reason));
            out.can_collect = true;
        }
        _ => out.line("mode", "none: cpi-bpf cannot collect here (see above)"),
    }
    diagnosis
}

/// The kernel and the process's privileges; why they are not enough, if not.
fn privilege_lines(out: &mut Diagnosis, c: &Capabilities) -> Result<(), String> {
    out.line("kernel", &c.kernel);
    out.line(
        "privileges",
        &format!(
            "euid {}; CAP_SYS_ADMIN {}, CAP_BPF {}, CAP_PERFMON {}",
            c.euid,
            yes(c.cap_sys_admin),
            yes(c.cap_bpf),
            yes(c.cap_perfmon)
        ),
    );
    let privileged = c.check_privileges();
    out.line("collection", &collection_path(c, privileged.is_ok()));
    if let Some(install) = std::env::current_exe().ok().and_then(|e| install_line(&e)) {
        out.line("install", &install);
    }
    privileged
}

/// Who may run a binary given file capabilities (`setcap`): every user, when others may
/// execute it, and then every user profiles every process and reads kernel addresses
/// (KASLR) and other users' heap and stack pointers; perf's documentation restricts such
/// a binary to one group. `None` for a binary without file capabilities.
fn install_line(exe: &std::path::Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let path = std::ffi::CString::new(exe.as_os_str().as_bytes()).ok()?;
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks for the
    // attribute's size only.
    let size = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    if size <= 0 {
        return None;
    }
    let exe_name = exe.display();
    let m = std::fs::metadata(exe).ok()?;
    Some(if m.mode() & 0o007 != 0 {
        format!(
            "{exe_name} has file capabilities and every user may run it: each can profile \
             every process and read kernel addresses; restrict it to one group as perf's \
             documentation does (`sudo groupadd -f perf_users; sudo chgrp perf_users \
             {exe_name}; sudo chmod o-rwx {exe_name}; sudo setcap cap_perfmon,cap_bpf+ep \
             {exe_name}`: chgrp clears the capabilities)"
        )
    } else {
        format!(
            "{exe_name} has file capabilities, for its owner and group {} only",
            m.gid()
        )
    })
}

/// Which path collection takes here: BPF with its privileges, else the kernel's perf
/// ring buffers where `perf_event_paranoid` allows, else what would allow either.
fn collection_path(c: &Capabilities, privileged: bool) -> String {
    if privileged {
        return "BPF programs (root or CAP_BPF + CAP_PERFMON): every mode, any process, \
                system-wide"
            .into();
    }
    match perf_ring::allowed(c, &Target::Command(Vec::new())) {
        Ok(()) => format!(
            "the kernel's perf ring buffers, your own processes only (-p PID, -- CMD); {}",
            perf_ring::MODE_NOTE
        ),
        Err(why) => why,
    }
}

/// What the kernel's BPF has: where the ladder starts, and the programs loaded.
struct Probe {
    start: (Mode, String),
    /// The kernel is older than the floor cpi-bpf supports.
    below_floor: bool,
    bpf: Option<aya::Ebpf>,
}

/// Probes the kernel's BPF features and loads every program it can run, so each event
/// is tried with its own.
fn load_programs(
    out: &mut Diagnosis,
    c: &Capabilities,
    plan: &dyn Fn(Mode) -> Vec<events::EventSpec>,
) -> Probe {
    let features = KernelFeatures::probe();
    for (name, has) in features.lines() {
        out.line(name, &has);
    }
    let start = features.limit(c.mode());
    let below_floor = match features.check_floor(&c.kernel) {
        Err(why) => {
            out.line("", &why);
            true
        }
        Ok(()) => false,
    };
    let all = features.limit((Mode::Cpi, String::new())).0;
    let programs = ladder::programs_from(all, plan);
    let bpf = match super::load(
        1 << 20,
        KernelConfig::default(),
        features.stack_mode(true),
        features.ancestor_cgroup_id,
        c.btf,
        &programs,
    ) {
        Ok(b) => {
            out.line(
                "BPF load",
                &format!(
                    "perf_event programs ({}) and a 1 MiB ring buffer load",
                    programs.join(", ")
                ),
            );
            Some(b)
        }
        Err(e) => {
            out.line("BPF load", &format!("fails: {e}"));
            None
        }
    };
    Probe {
        start,
        below_floor,
        bpf,
    }
}

/// Opens every core PMU's branch-stack and cycles events, then cpu-clock, each with its
/// program attached where it loaded.
fn event_lines(
    out: &mut Diagnosis,
    bpf: Option<&aya::Ebpf>,
    plan: &dyn Fn(Mode) -> Vec<events::EventSpec>,
) {
    let what = if bpf.is_some() {
        "opens, BPF attaches"
    } else {
        "opens"
    };
    let of_role = |m: Mode, role: EventRole| plan(m).into_iter().filter(move |s| s.role == role);
    for spec in of_role(Mode::Cpi, EventRole::Branches)
        .chain(of_role(Mode::IpSampling, EventRole::Cycles))
        .chain(plan(Mode::TimeProfile))
    {
        let label = match spec.role {
            EventRole::Branches => "branch-stack event",
            EventRole::Cycles => "cycles event",
            _ => "cpu-clock event",
        };
        // A program the kernel's features kept out is not attached: the event alone.
        let prog = bpf.filter(|b| ladder::program_fd(b, spec.program).is_ok());
        let what = match (prog, bpf) {
            (None, Some(_)) => "opens (its BPF program is not loaded: see the features above)",
            _ => what,
        };
        match super::try_event(&spec, prog) {
            Ok(()) => out.line(label, &format!("{} {what}", spec.name)),
            Err(e) => out.line(label, &format!("cannot: {e}")),
        }
    }
}
