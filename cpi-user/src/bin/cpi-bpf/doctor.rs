//! `doctor`: every probe the capability ladder uses, then the mode cpi-bpf would run in.

use cpi_common::policy::KernelConfig;
use cpi_common::wire::EventRole;
use cpi_user::collect::caps::{self, Capabilities, KernelFeatures};
use cpi_user::collect::sys::Linux;
use cpi_user::collect::{self, events, ladder, perf_ring, Target, DEFAULT_FREQUENCY};
use cpi_user::profile::Mode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Probe a recorded machine instead of this one: DIR holds its `sys/` and `proc/`
    /// (`sys/bus/event_source/devices/*`, `sys/devices/system/cpu/online`,
    /// `proc/cpuinfo`, `proc/sys/kernel/osrelease`; tests/data/machines/ has some).
    /// Prints what cpi-bpf finds there, the mode and the events it would open, on
    /// which CPUs; nothing is opened or loaded.
    #[arg(long, value_name = "DIR")]
    root: Option<std::path::PathBuf>,
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn line(k: &str, v: &str) {
    println!("{k:<22} {v}");
}

/// The probe's lines that need no privileges: what a recorded tree shows too.
fn machine_lines(c: &Capabilities) {
    line(
        "perf_event_paranoid",
        &c.perf_event_paranoid
            .map_or("unreadable".to_string(), |p| p.to_string()),
    );
    line("PMU devices", &c.pmu_devices.join(", "));
    if c.core_pmus.is_empty() {
        line(
            "core PMU",
            "none (/sys/bus/event_source/devices/cpu missing)",
        );
    }
    for p in &c.core_pmus {
        let name = p
            .pmu_name
            .as_deref()
            .map_or(String::new(), |n| format!(", {n}"));
        line(
            "core PMU",
            &format!("{} type {}{name}", p.describe(), p.type_),
        );
    }
    line(
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
    line("CPU vendor", &cpu);
    line(
        "BTF",
        if c.btf {
            "/sys/kernel/btf/vmlinux present"
        } else {
            "missing (/sys/kernel/btf/vmlinux)"
        },
    );
}

/// `doctor --root DIR`: the recorded machine's probe, mode and event plan.
fn recorded(root: &std::path::Path) -> anyhow::Result<i32> {
    if !root.join("sys/bus/event_source/devices").is_dir() {
        anyhow::bail!(
            "--root {}: no sys/bus/event_source/devices there (not a recorded machine)",
            root.display()
        );
    }
    let c = Capabilities::probe_at(root, 0, "unrecorded");
    line("kernel", &c.kernel);
    line("privileges", "not probed (a recorded machine)");
    machine_lines(&c);
    line("online CPUs", &caps::cpu_list(&c.online_cpus));
    let rate = events::Rate {
        frequency: DEFAULT_FREQUENCY,
        period: None,
        core_hz: c.core_hz.unwrap_or(events::DEFAULT_CORE_HZ),
    };
    let (mode, reason) = c.mode();
    line("mode", &format!("{} — {reason}", mode.name()));
    for spec in events::plan(mode, &c.processor(), &rate, false, false) {
        let on = spec
            .cpus
            .as_deref()
            .map_or("every CPU".to_string(), |cpus| {
                format!("CPUs {}", caps::cpu_list(cpus))
            });
        line(
            "planned event",
            &format!(
                "{}: type {}, config {:#x}, period {}, on {on}, program {}",
                spec.name, spec.attr.type_, spec.attr.config, spec.policy.base, spec.program
            ),
        );
    }
    Ok(0)
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(root) = &args.root {
        return recorded(root);
    }
    let c = Capabilities::probe();
    let privileged = privilege_lines(&c);
    machine_lines(&c);
    let rate = events::Rate {
        frequency: DEFAULT_FREQUENCY,
        period: None,
        core_hz: events::nominal_core_hz(),
    };
    let plan = |m: Mode| events::plan(m, &c.processor(), &rate, false, false);
    let probe = if privileged.is_ok() {
        load_programs(&c, &plan)
    } else {
        line("kernel features", "not probed (no privileges)");
        line("BPF load", "not tried (no privileges)");
        Probe {
            start: c.mode(),
            below_floor: false,
            bpf: None,
        }
    };
    event_lines(probe.bpf.as_ref(), &plan);
    // The ladder exactly as collection walks it, on this process.
    let attach = |name: &'static str| match &probe.bpf {
        Some(b) => ladder::program_fd(b, name),
        None => Ok(None),
    };
    let rung = ladder::walk(
        &Linux,
        probe.start,
        &plan,
        &[(0, -1)],
        0,
        &attach,
        &mut |_| {},
    );
    match rung {
        Ok(rung) if privileged.is_ok() && probe.bpf.is_some() && !probe.below_floor => {
            line("mode", &format!("{} — {}", rung.mode.name(), rung.reason));
            Ok(0)
        }
        _ => {
            line("mode", "none: cpi-bpf cannot collect here (see above)");
            Ok(1)
        }
    }
}

/// The kernel and the process's privileges; why they are not enough, if not.
fn privilege_lines(c: &Capabilities) -> Result<(), String> {
    line("kernel", &c.kernel);
    line(
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
    line("collection", &collection_path(c, privileged.is_ok()));
    privileged
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
fn load_programs(c: &Capabilities, plan: &dyn Fn(Mode) -> Vec<events::EventSpec>) -> Probe {
    let features = KernelFeatures::probe();
    for (name, has) in features.lines() {
        line(name, &has);
    }
    let start = features.limit(c.mode());
    let below_floor = match features.check_floor(&c.kernel) {
        Err(why) => {
            line("", &why);
            true
        }
        Ok(()) => false,
    };
    let all = features.limit((Mode::Cpi, String::new())).0;
    let programs = ladder::programs_from(all, plan);
    let bpf = match collect::load(
        1 << 20,
        KernelConfig::default(),
        features.stack_mode(true),
        features.ancestor_cgroup_id,
        c.btf,
        &programs,
    ) {
        Ok(b) => {
            line(
                "BPF load",
                &format!(
                    "perf_event programs ({}) and a 1 MiB ring buffer load",
                    programs.join(", ")
                ),
            );
            Some(b)
        }
        Err(e) => {
            line("BPF load", &format!("fails: {e}"));
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
fn event_lines(bpf: Option<&aya::Ebpf>, plan: &dyn Fn(Mode) -> Vec<events::EventSpec>) {
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
        match collect::try_event(&spec, prog) {
            Ok(()) => line(label, &format!("{} {what}", spec.name)),
            Err(e) => line(label, &format!("cannot: {e}")),
        }
    }
}
