//! `doctor`: every probe the capability ladder uses, then the mode cpi-bpf would run in.

use cpi_common::policy::KernelConfig;
use cpi_common::wire::EventRole;
use cpi_user::collect::caps::{Capabilities, KernelFeatures};
use cpi_user::collect::sys::Linux;
use cpi_user::collect::{self, events, ladder, DEFAULT_FREQUENCY};
use cpi_user::profile::Mode;

#[derive(clap::Args, Debug)]
pub struct Args {}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    let c = Capabilities::probe();
    let line = |k: &str, v: &str| println!("{k:<22} {v}");
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
    if let Err(why) = &privileged {
        line("", why);
    }
    line(
        "perf_event_paranoid",
        &c.perf_event_paranoid
            .map_or("unreadable".to_string(), |p| p.to_string()),
    );
    line("PMU devices", &c.pmu_devices.join(", "));
    line(
        "core PMU",
        c.cpu_pmu
            .as_deref()
            .unwrap_or("none (/sys/bus/event_source/devices/cpu missing)"),
    );
    line(
        "branch records",
        &match (&c.cpu_pmu, c.lbr_depth) {
            (Some(p), Some(d)) => format!("{d} entries ({p}/caps/branches)"),
            (Some(p), None) => format!("none ({p}/caps/branches missing)"),
            (None, _) => "none (no core PMU)".to_string(),
        },
    );
    line("CPU vendor", &format!("{:?}", c.vendor));
    line(
        "BTF",
        if c.btf {
            "/sys/kernel/btf/vmlinux present"
        } else {
            "missing (/sys/kernel/btf/vmlinux)"
        },
    );
    let rate = events::Rate {
        frequency: DEFAULT_FREQUENCY,
        period: None,
        core_hz: events::nominal_core_hz(),
    };
    let plan = |m: Mode| events::plan(m, c.vendor, &rate, false, false);
    // What the kernel's BPF has decides which programs load and where the ladder starts.
    let mut start = c.mode();
    let mut below_floor = false;
    let bpf = if privileged.is_ok() {
        let features = KernelFeatures::probe();
        for (name, has) in features.lines() {
            line(name, &has);
        }
        start = features.limit(start);
        if let Err(why) = features.check_floor(&c.kernel) {
            line("", &why);
            below_floor = true;
        }
        // Every program the kernel can run, so each event below is tried with its own.
        let all = features.limit((Mode::Cpi, String::new())).0;
        let programs = ladder::programs_from(all, &plan);
        match collect::load(
            1 << 20,
            KernelConfig::default(),
            features.stack_mode(true),
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
        }
    } else {
        line("kernel features", "not probed (no privileges)");
        line("BPF load", "not tried (no privileges)");
        None
    };
    let what = if bpf.is_some() {
        "opens, BPF attaches"
    } else {
        "opens"
    };
    for spec in [
        events::branch_event(c.vendor, &rate, false),
        events::plan(Mode::IpSampling, c.vendor, &rate, false, false).remove(0),
        events::plan(Mode::TimeProfile, c.vendor, &rate, false, false).remove(0),
    ] {
        let label = match spec.role {
            EventRole::Branches => "branch-stack event",
            EventRole::Cycles => "cycles event",
            _ => "cpu-clock event",
        };
        // A program the kernel's features kept out is not attached: the event alone.
        let prog = bpf
            .as_ref()
            .filter(|b| ladder::program_fd(b, spec.program).is_ok());
        let what = match (prog, &bpf) {
            (None, Some(_)) => "opens (its BPF program is not loaded: see the features above)",
            _ => what,
        };
        match collect::try_event(&spec, prog) {
            Ok(()) => line(label, &format!("{} {what}", spec.name)),
            Err(e) => line(label, &format!("cannot: {e}")),
        }
    }
    // The ladder exactly as collection walks it, on this process.
    let attach = |name: &'static str| match &bpf {
        Some(b) => ladder::program_fd(b, name),
        None => Ok(None),
    };
    let rung = ladder::walk(&Linux, start, &plan, &[(0, -1)], 0, &attach, &mut |_| {});
    match rung {
        Ok(rung) if privileged.is_ok() && bpf.is_some() && !below_floor => {
            line("mode", &format!("{} — {}", rung.mode.name(), rung.reason));
            Ok(0)
        }
        _ => {
            line("mode", "none: cpi-bpf cannot collect here (see above)");
            Ok(1)
        }
    }
}
