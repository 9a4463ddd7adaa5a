//! Which perf events a mode samples, and the `perf_event_attr` of each.

use cpi_common::policy::PeriodPolicy;
use cpi_common::wire::EventRole;

use super::caps::{CorePmu, Processor, Vendor};
use super::sys::{self, flag, PerfEventAttr};
use crate::profile::events::retired_taken;
use crate::profile::model::role_name;
use crate::profile::Mode;

/// How often to sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Samples per second per busy CPU (periods derive from it).
    pub frequency: u64,
    /// Overrides every event's base period (events, or ns for cpu-clock).
    pub period: Option<u64>,
    /// Nominal core clock, Hz: turns `frequency` into a cycles period.
    pub core_hz: u64,
}

impl Rate {
    /// Base period for an event counting `per_second` events per busy second.
    fn period(&self, per_second: u64) -> u64 {
        self.period
            .unwrap_or(per_second / self.frequency.max(1))
            .max(1)
    }
}

/// The kernel fires `cpu-clock` at most every 10 µs (`perf_swevent_start_hrtimer`
/// raises shorter periods to 10000 ns), so a shorter period would weight each sample
/// with less time than it stands for; and at 100 kHz (the default
/// `kernel.perf_event_max_sample_rate`) the event is throttled for the rest of each
/// tick. Periods below are raised to 12.5 µs (80 kHz).
pub(crate) const CPU_CLOCK_MIN_PERIOD_NS: u64 = 12_500;

/// Largest `--period` (events, or ns: ≈ 18 minutes of cpu-clock): beyond it no sample
/// would ever come, and rounding up to a prime would take seconds.
pub const MAX_PERIOD: u64 = 1 << 40;

/// Rejects a rate no event can sample at, in one line.
pub(crate) fn check_rate(rate: &Rate) -> Result<(), super::CollectError> {
    match rate.period {
        Some(p) if p == 0 || p > MAX_PERIOD => Err(super::CollectError::Range(format!(
            "the period must be between 1 and {MAX_PERIOD}, not {p}"
        ))),
        _ if rate.frequency == 0 => Err(super::CollectError::Range(
            "the sampling frequency must be at least 1 Hz".to_string(),
        )),
        _ => Ok(()),
    }
}

/// What the cpu-clock floor did to `rate`, when it did anything.
pub(crate) fn cpu_clock_floor_note(rate: &Rate) -> Option<String> {
    let asked = rate.period(1_000_000_000);
    (asked < CPU_CLOCK_MIN_PERIOD_NS).then(|| {
        let used = PeriodPolicy::around(CPU_CLOCK_MIN_PERIOD_NS).base;
        format!(
            "cpu-clock fires at most every 10 µs and is throttled near 100 kHz: \
             period {asked} ns raised to {used} ns (≈ {} samples per CPU-second)",
            1_000_000_000 / used
        )
    })
}

/// One event to open (per thread or per CPU) and the program to attach to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// What the event measures; its period's unit is
    /// [`crate::profile::model::EventUnit::of_role`].
    pub role: EventRole,
    /// What a user would pass to `perf -e`, e.g. `cpu/r20c4/`.
    pub name: String,
    /// The attributes `perf_event_open` gets (disabled, sampling at `policy.base`).
    pub attr: PerfEventAttr,
    /// Base period and jitter of the user-space re-draws.
    pub policy: PeriodPolicy,
    /// Name of the eBPF program in `cpi-ebpf/src/main.rs` attached to it.
    pub program: &'static str,
    /// The CPUs its PMU counts on (its `cpus` file): a per-CPU placement elsewhere is
    /// not opened. `None`: every CPU.
    pub cpus: Option<Vec<u32>>,
}

impl EventSpec {
    /// Whether its branch records carry their types (`PERF_SAMPLE_BRANCH_TYPE_SAVE`).
    pub fn saves_branch_types(&self) -> bool {
        self.attr.branch_sample_type & sys::PERF_SAMPLE_BRANCH_TYPE_SAVE != 0
    }

    /// Without branch types: only call-path attribution uses them, and Intel's
    /// model-specific LBR decodes every entry's instruction in the interrupt to give them.
    pub(crate) fn without_branch_types(&mut self) {
        self.attr.branch_sample_type &= !sys::PERF_SAMPLE_BRANCH_TYPE_SAVE;
    }
}

fn sampling_attr(type_: u32, config: u64, period: u64, include_kernel: bool) -> PerfEventAttr {
    let mut flags = flag::DISABLED | flag::EXCLUDE_HV;
    if !include_kernel {
        flags |= flag::EXCLUDE_KERNEL;
    }
    PerfEventAttr {
        type_,
        size: sys::PERF_ATTR_SIZE,
        config,
        sample_period: period,
        // Nothing reads the perf ring buffer (the program returns 0 and writes its own
        // records); these describe what the program reads from the sample.
        sample_type: sys::PERF_SAMPLE_IP
            | sys::PERF_SAMPLE_TID
            | sys::PERF_SAMPLE_TIME
            | sys::PERF_SAMPLE_PERIOD,
        flags,
        ..Default::default()
    }
}

/// The branch-stack event: retired taken branches where the vendor's code is known,
/// else cycles with a branch stack (BOLT's choice), said in the name. With `pmu` (one
/// of several core PMUs, [`plan`]), the event of that PMU: its own `type`, its core's
/// code (Intel E-cores: `crate::profile::events::INTEL_ATOM_RETIRED_TAKEN`), on its CPUs.
pub fn branch_event(
    vendor: Vendor,
    pmu: Option<&CorePmu>,
    rate: &Rate,
    include_kernel: bool,
) -> EventSpec {
    // ~1 taken branch per 8 cycles in typical code: about the cycles event's rate.
    let period = rate.period(rate.core_hz / 8);
    let raw = retired_taken(vendor, pmu.map(|p| p.name.as_str()));
    let (type_, config, name) = match (raw, pmu) {
        (Some(code), None) if vendor == Vendor::Amd => (
            sys::PERF_TYPE_RAW,
            code,
            format!("cpu/ex_ret_brn_tkn/ (r{code:x})"),
        ),
        (Some(code), None) => (sys::PERF_TYPE_RAW, code, format!("cpu/r{code:x}/")),
        (Some(code), Some(p)) => (p.type_, code, format!("{}/r{code:x}/", p.name)),
        (None, _) => {
            let (config, name) = hardware(sys::PERF_COUNT_HW_CPU_CYCLES, "cycles", pmu);
            (
                sys::PERF_TYPE_HARDWARE,
                config,
                format!("{name} (no retired-taken-branch event known for this CPU)"),
            )
        }
    };
    let policy = PeriodPolicy::around(period);
    let mut attr = sampling_attr(type_, config, policy.base, include_kernel);
    attr.sample_type |= sys::PERF_SAMPLE_BRANCH_STACK;
    // Typed entries let call-path analysis rebuild the stack each range ran under
    // (cpi-user/src/profile/stack.rs `add_branch`); BRS, which refuses the bit, is planned
    // without it ([`plan`]), another PMU that refuses it is opened again without it
    // (collect/ladder.rs `walk`), and so is every session without stacks
    // (collect/session.rs `plan`).
    attr.branch_sample_type = sys::PERF_SAMPLE_BRANCH_USER
        | sys::PERF_SAMPLE_BRANCH_ANY
        | sys::PERF_SAMPLE_BRANCH_TYPE_SAVE;
    if include_kernel {
        attr.branch_sample_type |= sys::PERF_SAMPLE_BRANCH_KERNEL;
    }
    EventSpec {
        role: EventRole::Branches,
        name,
        attr,
        policy,
        program: "branch_sample",
        cpus: pmu.and_then(|p| p.cpus.clone()),
    }
}

/// The config of generic hardware event `id` (named `name`) on `pmu`, with the PMU's
/// type in bits 63..32 as perf passes `cpu_atom/cycles/`
/// (tools/perf/Documentation/intel-hybrid.txt), and its name as perf spells it.
fn hardware(id: u64, name: &str, pmu: Option<&CorePmu>) -> (u64, String) {
    match pmu {
        Some(p) => (
            u64::from(p.type_) << sys::PERF_PMU_TYPE_SHIFT | id,
            format!("{}/{name}/", p.name),
        ),
        None => (id, name.to_string()),
    }
}

fn ip_event(
    role: EventRole,
    pmu: Option<&CorePmu>,
    rate: &Rate,
    include_kernel: bool,
) -> EventSpec {
    let (type_, config, per_second, program) = match role {
        EventRole::Cycles => (
            sys::PERF_TYPE_HARDWARE,
            sys::PERF_COUNT_HW_CPU_CYCLES,
            rate.core_hz,
            "ip_cycles",
        ),
        EventRole::Instructions => (
            sys::PERF_TYPE_HARDWARE,
            sys::PERF_COUNT_HW_INSTRUCTIONS,
            rate.core_hz,
            "ip_instructions",
        ),
        EventRole::CpuClock | EventRole::Branches => (
            sys::PERF_TYPE_SOFTWARE,
            sys::PERF_COUNT_SW_CPU_CLOCK,
            1_000_000_000,
            "ip_cpu_clock",
        ),
    };
    let mut period = rate.period(per_second);
    let (config, name, pmu) = if type_ == sys::PERF_TYPE_SOFTWARE {
        period = period.max(CPU_CLOCK_MIN_PERIOD_NS);
        (config, role_name(role).to_string(), None)
    } else {
        let (config, name) = hardware(config, role_name(role), pmu);
        (config, name, pmu)
    };
    let policy = PeriodPolicy::around(period);
    EventSpec {
        role,
        name,
        attr: sampling_attr(type_, config, policy.base, include_kernel),
        policy,
        program,
        cpus: pmu.and_then(|p| p.cpus.clone()),
    }
}

/// The events a mode samples; with `cpu_time`, the hardware modes sample `cpu-clock`
/// too, at the same rate, so CPU seconds are measured in every mode (cycles are not
/// time: the clock rate changes under them).
///
/// With several core PMUs (`cpu.core_pmus`: Intel hybrid `cpu_core` + `cpu_atom`, Arm
/// big.LITTLE), each hardware event is planned once per PMU, in that PMU's own type and
/// on its CPUs: a raw type-4 event binds to `cpu_core` alone, and time on the other
/// cores would never be sampled. With one (or none), the events of the plain types.
pub fn plan(
    mode: Mode,
    cpu: &Processor,
    rate: &Rate,
    include_kernel: bool,
    cpu_time: bool,
) -> Vec<EventSpec> {
    let clock = || ip_event(EventRole::CpuClock, None, rate, include_kernel);
    let each: Vec<Option<&CorePmu>> = match cpu.core_pmus.as_slice() {
        pmus @ [_, _, ..] => pmus.iter().map(Some).collect(),
        _ => vec![None],
    };
    let mut specs = Vec::new();
    for &pmu in &each {
        match mode {
            Mode::Cpi => {
                let mut branches = branch_event(cpu.vendor, pmu, rate, include_kernel);
                // BRS records its branches untyped and refuses TYPE_SAVE with EINVAL
                // (arch/x86/events/amd/brs.c `amd_brs_setup_filter`): never asked, so no
                // open is refused.
                if cpu.brs {
                    branches.without_branch_types();
                }
                specs.extend([
                    branches,
                    ip_event(EventRole::Cycles, pmu, rate, include_kernel),
                ]);
            }
            Mode::IpSampling => specs.extend([
                ip_event(EventRole::Cycles, pmu, rate, include_kernel),
                ip_event(EventRole::Instructions, pmu, rate, include_kernel),
            ]),
            Mode::TimeProfile | Mode::Simulated | Mode::Instructions => return vec![clock()],
        }
    }
    if cpu_time {
        specs.push(clock());
    }
    specs
}

/// The core clock assumed where `/proc/cpuinfo` gives none (arm64's never does).
pub const DEFAULT_CORE_HZ: u64 = 2_000_000_000;

/// Nominal core clock from `/proc/cpuinfo` (`core_hz_of`), [`DEFAULT_CORE_HZ`] when
/// absent.
pub fn nominal_core_hz() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| core_hz_of(&t))
        .unwrap_or(DEFAULT_CORE_HZ)
}

/// The first `cpu MHz` of a `/proc/cpuinfo` text, in Hz.
pub(crate) fn core_hz_of(cpuinfo: &str) -> Option<u64> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|mhz| (mhz * 1e6) as u64)
        .filter(|&hz| hz > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::EventUnit;
    use cpi_common::policy::is_prime;
    use std::collections::BTreeMap;

    const RATE: Rate = Rate {
        frequency: 1000,
        period: None,
        core_hz: 3_000_000_000,
    };

    #[test]
    fn intel_branch_stack_attr() {
        let e = branch_event(Vendor::Intel, None, &RATE, false);
        let a = &e.attr;
        assert_eq!(a.type_, 4, "PERF_TYPE_RAW");
        assert_eq!(a.config, 0x20c4, "BR_INST_RETIRED.NEAR_TAKEN");
        assert_eq!(a.size, 136);
        assert_ne!(a.sample_type & (1 << 11), 0, "PERF_SAMPLE_BRANCH_STACK");
        assert_eq!(a.sample_type & 1, 1, "PERF_SAMPLE_IP");
        assert_eq!(
            a.branch_sample_type,
            1 | 8 | 1 << 16,
            "USER | ANY | TYPE_SAVE"
        );
        // 3 GHz / 8 / 1000 Hz = 375000, rounded up to a prime.
        assert_eq!(a.sample_period, 375_017);
        assert!(is_prime(a.sample_period));
        assert_eq!(e.policy.base, a.sample_period);
        assert_eq!(e.policy.jitter, a.sample_period >> 4);
        assert_eq!(
            a.flags & flag::DISABLED,
            flag::DISABLED,
            "enabled after attach"
        );
        assert_eq!(a.flags & flag::EXCLUDE_KERNEL, flag::EXCLUDE_KERNEL);
        assert_eq!(a.flags & flag::FREQ, 0, "fixed period, re-drawn by us");
        assert_eq!(a.flags & flag::INHERIT, 0, "inherit is per target");
        assert_eq!(e.program, "branch_sample");
        assert_eq!(e.role, EventRole::Branches);
    }

    #[test]
    fn amd_and_unknown_vendor_branch_events() {
        let amd = branch_event(Vendor::Amd, None, &RATE, true);
        assert_eq!((amd.attr.type_, amd.attr.config), (4, 0xc4));
        assert_eq!(
            amd.attr.branch_sample_type,
            1 | 2 | 8 | 1 << 16,
            "USER | KERNEL | ANY | TYPE_SAVE"
        );
        assert_eq!(amd.attr.flags & flag::EXCLUDE_KERNEL, 0);
        let other = branch_event(Vendor::Other, None, &RATE, false);
        assert_eq!((other.attr.type_, other.attr.config), (0, 0), "HW cycles");
        assert!(other.name.contains("no retired-taken-branch event"));
        assert_ne!(other.attr.sample_type & sys::PERF_SAMPLE_BRANCH_STACK, 0);
    }

    #[test]
    fn plans_follow_the_ladder() {
        let roles = |m, cpu_time| {
            plan(m, &Processor::of(Vendor::Intel), &RATE, false, cpu_time)
                .iter()
                .map(|e| e.role)
                .collect::<Vec<_>>()
        };
        use EventRole::*;
        assert_eq!(roles(Mode::Cpi, false), [Branches, Cycles]);
        assert_eq!(roles(Mode::IpSampling, false), [Cycles, Instructions]);
        assert_eq!(roles(Mode::TimeProfile, false), [CpuClock]);
        // CPU seconds in every mode (the agent): one cpu-clock event more, never two.
        assert_eq!(roles(Mode::Cpi, true), [Branches, Cycles, CpuClock]);
        assert_eq!(
            roles(Mode::IpSampling, true),
            [Cycles, Instructions, CpuClock]
        );
        assert_eq!(roles(Mode::TimeProfile, true), [CpuClock]);
        let clock = &plan(
            Mode::TimeProfile,
            &Processor::of(Vendor::Other),
            &RATE,
            false,
            false,
        )[0];
        assert_eq!((clock.attr.type_, clock.attr.config), (1, 0), "cpu-clock");
        assert_eq!(clock.attr.sample_period, 1_000_003, "≈ 1 ms, prime");
        assert_eq!(EventUnit::of_role(clock.role), EventUnit::Ns);
        assert_eq!(Mode::Cpi.step_down(), Some(Mode::IpSampling));
        assert_eq!(Mode::TimeProfile.step_down(), None);
    }

    #[test]
    fn cpu_clock_periods_have_a_floor_and_periods_a_range() {
        let fast = Rate {
            frequency: 10_000_000,
            ..RATE
        };
        let clock = &plan(
            Mode::TimeProfile,
            &Processor::of(Vendor::Other),
            &fast,
            false,
            false,
        )[0];
        assert_eq!(clock.policy.base, 12_503, "raised to the floor, prime");
        let note = cpu_clock_floor_note(&fast).unwrap();
        assert!(note.contains("period 100 ns raised to 12503 ns"), "{note}");
        assert_eq!(cpu_clock_floor_note(&RATE), None);
        // Cycles are not bound by the hrtimer floor.
        let cycles = &plan(
            Mode::IpSampling,
            &Processor::of(Vendor::Intel),
            &fast,
            false,
            false,
        )[0];
        assert_eq!(cycles.policy.base, 307, "3 GHz / 10 MHz, prime");
        for bad in [0, MAX_PERIOD + 1, u64::MAX] {
            let r = Rate {
                period: Some(bad),
                ..RATE
            };
            assert!(check_rate(&r).unwrap_err().to_string().contains("period"));
        }
        assert!(check_rate(&Rate {
            period: Some(MAX_PERIOD),
            ..RATE
        })
        .is_ok());
    }

    /// `perf_event_attr` as `perf record -vv` prints it: non-zero fields by name, flag
    /// and bit-set fields as perf spells them.
    fn perf_fields(a: &PerfEventAttr) -> BTreeMap<String, String> {
        fn bits(v: u64, names: &[&str]) -> String {
            let set: Vec<&str> = (0..64)
                .filter(|b| v >> b & 1 == 1)
                .map(|b| names.get(b).copied().unwrap_or("?"))
                .collect();
            set.join("|")
        }
        const SAMPLE: &[&str] = &[
            "IP",
            "TID",
            "TIME",
            "ADDR",
            "READ",
            "CALLCHAIN",
            "ID",
            "CPU",
            "PERIOD",
            "STREAM_ID",
            "RAW",
            "BRANCH_STACK",
        ];
        const FLAGS: &[&str] = &[
            "disabled",
            "inherit",
            "pinned",
            "exclusive",
            "exclude_user",
            "exclude_kernel",
            "exclude_hv",
            "exclude_idle",
            "mmap",
            "comm",
            "freq",
            "inherit_stat",
            "enable_on_exec",
            "task",
            "watermark",
            "precise_ip",
            "precise_ip",
            "mmap_data",
            "sample_id_all",
            "exclude_host",
            "exclude_guest",
            "exclude_callchain_kernel",
            "exclude_callchain_user",
            "mmap2",
            "comm_exec",
            "use_clockid",
            "context_switch",
            "write_backward",
            "namespaces",
            "ksymbol",
            "bpf_event",
        ];
        const BRANCH: &[&str] = &[
            "USER",
            "KERNEL",
            "HV",
            "ANY",
            "ANY_CALL",
            "ANY_RETURN",
            "IND_CALL",
            "ABORT_TX",
            "IN_TX",
            "NO_TX",
            "COND",
            "CALL_STACK",
            "IND_JUMP",
            "CALL",
            "NO_FLAGS",
            "NO_CYCLES",
            "TYPE_SAVE",
        ];
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            if !matches!(v.as_str(), "" | "0" | "0x0") {
                m.insert(k.to_string(), v);
            }
        };
        put("type", a.type_.to_string());
        put("size", a.size.to_string());
        put("config", format!("{:#x}", a.config));
        put(
            "{ sample_period, sample_freq }",
            a.sample_period.to_string(),
        );
        put("sample_type", bits(a.sample_type, SAMPLE));
        put("read_format", a.read_format.to_string());
        put("branch_sample_type", bits(a.branch_sample_type, BRANCH));
        for (b, name) in FLAGS.iter().enumerate() {
            if a.flags >> b & 1 == 1 {
                put(name, "1".into());
            }
        }
        m
    }

    /// What `perf record` passes for the same event (its `-vv` print, kept in
    /// tests/data/perf-attrs/) equals what the collector opens for a started command
    /// (the plan's attr with `inherit | enable_on_exec`, as session.rs adds), field by
    /// field, but for these differences, each for a reason.
    #[test]
    fn attrs_equal_perf_records_but_for_documented_differences() {
        const SIDE_BAND: &str = "side-band records come from one dummy event per placement \
                                 (collect/sideband.rs), not from every sampling event";
        let documented: &[(&str, &str, &str, &str)] = &[
            (
                "size",
                "128",
                "136",
                "perf 6.1 passes its own struct (PERF_ATTR_SIZE_VER7); \
              ours is VER8 (config3); the kernel reads either",
            ),
            (
                "read_format",
                "ID|LOST",
                "",
                "perf reads counts with ids to tell events \
              apart in perf.data; the collector reads the count alone (sys.rs read_count)",
            ),
            ("mmap", "1", "", SIDE_BAND),
            ("comm", "1", "", SIDE_BAND),
            ("task", "1", "", SIDE_BAND),
            ("mmap2", "1", "", SIDE_BAND),
            ("comm_exec", "1", "", SIDE_BAND),
            ("ksymbol", "1", "", SIDE_BAND),
            ("bpf_event", "1", "", SIDE_BAND),
            ("sample_id_all", "1", "", SIDE_BAND),
            (
                "exclude_guest",
                "1",
                "",
                "perf's default without a :G/:H modifier; the \
              collector does not set it, so on a KVM host time in guests is sampled too \
              (a known difference, harmless where no guests run)",
            ),
        ];
        // Ours adds PERIOD: the period is re-drawn while sampling, so each sample's own
        // period is its weight (perf's fixed -c period needs none).
        let period_bit = |perf: &str| match perf.split_once("|BRANCH_STACK") {
            Some((head, _)) => format!("{head}|PERIOD|BRANCH_STACK"),
            None => format!("{perf}|PERIOD"),
        };
        let rate = |p| Rate {
            period: Some(p),
            ..RATE
        };
        let (r, clock) = (rate(500_009), rate(1_000_003));
        let plan_of = |m, v, r: &Rate| plan(m, &Processor::of(v), r, false, false);
        let cases = [
            (
                "intel-taken-branches",
                branch_event(Vendor::Intel, None, &r, false),
            ),
            (
                "amd-taken-branches",
                branch_event(Vendor::Amd, None, &r, false),
            ),
            (
                "cycles-branch-stack",
                branch_event(Vendor::Other, None, &r, false),
            ),
            (
                "cycles",
                plan_of(Mode::IpSampling, Vendor::Intel, &r)[0].clone(),
            ),
            (
                "instructions",
                plan_of(Mode::IpSampling, Vendor::Intel, &r)[1].clone(),
            ),
            (
                "cpu-clock",
                plan_of(Mode::TimeProfile, Vendor::Other, &clock)[0].clone(),
            ),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/perf-attrs");
        for (name, spec) in cases {
            let text = std::fs::read_to_string(dir.join(format!("{name}.txt"))).unwrap();
            let perf: BTreeMap<String, String> = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    // Names may hold spaces (`{ sample_period, sample_freq }`).
                    let l = l.trim();
                    let at = l.rfind(char::is_whitespace)?;
                    Some((l[..at].trim().to_string(), l[at..].trim().to_string()))
                })
                .collect();
            assert!(perf.len() > 10, "{name}: {text}");
            let mut attr = spec.attr;
            attr.flags |= flag::INHERIT | flag::ENABLE_ON_EXEC;
            let ours = perf_fields(&attr);
            let keys: std::collections::BTreeSet<&String> =
                perf.keys().chain(ours.keys()).collect();
            for k in keys {
                let (p, o) = (
                    perf.get(k).map_or("", String::as_str),
                    ours.get(k).map_or("", String::as_str),
                );
                if p == o {
                    continue;
                }
                let ok = documented
                    .iter()
                    .any(|(f, dp, dopt, _)| f == k && *dp == p && *dopt == o)
                    || (k == "sample_type" && o == period_bit(p));
                assert!(
                    ok,
                    "{name}: {k}: perf record passes {p:?}, the collector {o:?}"
                );
            }
        }
    }

    #[test]
    fn explicit_period_overrides_frequency() {
        let r = Rate {
            period: Some(500_000),
            ..RATE
        };
        assert_eq!(
            branch_event(Vendor::Intel, None, &r, false)
                .attr
                .sample_period,
            500_009
        );
    }

    #[test]
    fn one_event_per_core_pmu_on_hybrid_parts() {
        let pmu = |name: &str, type_, cpus: std::ops::Range<u32>| CorePmu {
            name: name.to_string(),
            type_,
            cpus: Some(cpus.collect()),
            branches: Some(32),
            pmu_name: None,
        };
        let pmus = [pmu("cpu_core", 4, 0..16), pmu("cpu_atom", 8, 16..24)];
        let hybrid = Processor {
            core_pmus: pmus.to_vec(),
            ..Processor::of(Vendor::Intel)
        };
        let specs = plan(Mode::Cpi, &hybrid, &RATE, false, true);
        let got: Vec<(&str, u32, u64, Option<u32>)> = specs
            .iter()
            .map(|s| {
                let first = s.cpus.as_ref().map(|c| c[0]);
                (s.name.as_str(), s.attr.type_, s.attr.config, first)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("cpu_core/r20c4/", 4, 0x20c4, Some(0)),
                ("cpu_core/cycles/", 0, 4 << 32, Some(0)),
                ("cpu_atom/rc0c4/", 8, 0xc0c4, Some(16)),
                ("cpu_atom/cycles/", 0, 8 << 32, Some(16)),
                ("cpu-clock", 1, 0, None),
            ]
        );
        assert!(specs[..4]
            .iter()
            .step_by(2)
            .all(|s| s.attr.branch_sample_type != 0));
        // One PMU: the plain types, as before (perf's own attributes, above).
        let one_pmu = Processor {
            core_pmus: pmus[..1].to_vec(),
            ..Processor::of(Vendor::Amd)
        };
        let one = plan(Mode::IpSampling, &one_pmu, &RATE, false, false);
        assert_eq!((one[0].attr.type_, one[0].attr.config), (0, 0));
        assert_eq!(one[0].cpus, None);
        // Arrow Lake-H's low-power E-cores count taken branches as the E-cores do.
        let lp = pmu("cpu_lowpower", 9, 24..26);
        let e = branch_event(Vendor::Intel, Some(&lp), &RATE, false);
        assert_eq!(
            (e.attr.type_, e.attr.config, e.name.as_str()),
            (9, 0xc0c4, "cpu_lowpower/rc0c4/")
        );
        // A hybrid part of another vendor: cycles with a branch stack on that PMU, said
        // in the name.
        let little = pmu("armv8_pmuv3_1", 11, 0..4);
        let e = branch_event(Vendor::Other, Some(&little), &RATE, false);
        assert_eq!((e.attr.type_, e.attr.config), (0, 11 << 32));
        assert!(e
            .name
            .starts_with("armv8_pmuv3_1/cycles/ (no retired-taken"));
    }
}
