//! The capability ladder as collection walks it: open the mode's events at every
//! placement, and while they cannot be opened step down one rung (`Mode::step_down`)
//! and say why. `cpi-bpf doctor` walks the same ladder on its own process.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::events::EventSpec;
use super::sys::{Follow, PerfSys, Placement, Placements};
use super::{CollectError, Notice};
use crate::profile::Mode;

/// An open event: the fd keeps the program attached; closing it detaches.
#[derive(Debug)]
pub struct OpenEvent {
    /// The perf event; enabled, disabled and re-periodised through [`PerfSys`].
    pub fd: OwnedFd,
    /// Index into the specs it was opened from.
    pub spec_index: usize,
    /// Where it counts.
    pub place: Placement,
}

/// The program fd to attach to an event (by program name), borrowed from the loaded
/// object; `Ok(None)` opens the event without attaching anything (doctor, when the
/// object did not load).
pub(crate) type Attach<'a> =
    &'a dyn Fn(&'static str) -> Result<Option<BorrowedFd<'a>>, CollectError>;

/// The program of a loaded object, as an `Attach` answer.
pub fn program_fd<'a>(
    bpf: &'a aya::Ebpf,
    name: &str,
) -> Result<Option<BorrowedFd<'a>>, CollectError> {
    let missing = || CollectError::Load {
        hint: "",
        cause: format!("program {name} missing").into(),
    };
    let p: &aya::programs::PerfEvent = bpf
        .program(name)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(missing)?;
    let fd = p.fd().map_err(|e| CollectError::Load {
        hint: "",
        cause: e.into(),
    })?;
    Ok(Some(fd.as_fd()))
}

/// Opens `spec` at `at`, following `follow`, and attaches the spec's program. The fd
/// keeps the program attached.
pub fn open_attached(
    sys: &dyn PerfSys,
    spec: &EventSpec,
    (at, follow): (Placement, Follow),
    attach: Attach,
) -> Result<OwnedFd, CollectError> {
    let fd = sys
        .perf_event_open(&spec.attr, at, follow)
        .map_err(|cause| CollectError::Open {
            event: spec.name.clone(),
            on: at.to_string(),
            cause,
        })?;
    if let Some(prog) = attach(spec.program)? {
        sys.set_bpf(&fd, prog)
            .map_err(|cause| CollectError::Attach {
                event: spec.name.clone(),
                cause,
            })?;
    }
    Ok(fd)
}

/// What `open_events` opened.
#[derive(Debug)]
pub struct Opened {
    /// Every event at every placement it opened on, its program attached.
    pub open: Vec<OpenEvent>,
    /// One line per event that failed on some CPUs but opened on others: those CPUs
    /// go unsampled by it, the rest collect.
    pub notes: Vec<String>,
}

/// Opens every event of `specs` at every placement and attaches its program. A
/// per-CPU placement outside the event's PMU ([`EventSpec::cpus`]) is not tried. A thread that exited since it was listed (ESRCH) is skipped; when every
/// thread is gone, the target is. An event that fails on some CPUs but opens on others
/// is kept and said ([`Opened::notes`]); one that opens on no CPU is the error.
pub(crate) fn open_events(
    sys: &dyn PerfSys,
    specs: &[EventSpec],
    places: &Placements,
    attach: Attach,
) -> Result<Opened, CollectError> {
    let mut open = Vec::new();
    let mut notes = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let mut failed: Vec<(u32, CollectError)> = Vec::new();
        let opened_before = open.len();
        for &place in &places.at {
            let on_its_pmu = match (&spec.cpus, place.cpu()) {
                (Some(cpus), Some(cpu)) => cpus.contains(&cpu),
                _ => true,
            };
            if !on_its_pmu {
                continue;
            }
            match open_attached(sys, spec, (place, places.follow), attach) {
                Ok(fd) => open.push(OpenEvent {
                    fd,
                    spec_index: i,
                    place,
                }),
                Err(CollectError::Open { cause, .. })
                    if cause.raw_os_error() == Some(libc::ESRCH) && place.tid().is_some() => {}
                Err(e @ CollectError::Open { .. }) => match place {
                    Placement::Cpu { cpu } => failed.push((cpu, e)),
                    _ => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
        if let Some((_, first)) = failed.first() {
            if open.len() == opened_before {
                return Err(failed.swap_remove(0).1);
            }
            let cpus: Vec<u32> = failed.iter().map(|&(c, _)| c).collect();
            let cause = match first {
                CollectError::Open { cause, .. } => cause.to_string(),
                e => e.to_string(),
            };
            notes.push(format!(
                "{} cannot be opened on CPU {} ({cause}): not sampled there; the other CPUs \
                 collect",
                spec.name,
                super::caps::cpu_list(&cpus)
            ));
        }
    }
    match places.at.first().and_then(|p| p.tid()) {
        Some(tid) if open.is_empty() => Err(CollectError::NoSuchProcess(tid)),
        _ => Ok(Opened { open, notes }),
    }
}

/// The programs the ladder may attach walking down from `start`: those of
/// `plan(mode)` for `start` and every rung below it, each once, the only ones
/// [`super::load`] needs to load.
pub(crate) fn programs_from(
    start: Mode,
    plan: &dyn Fn(Mode) -> Vec<EventSpec>,
) -> Vec<&'static str> {
    let mut names = Vec::new();
    let mut mode = Some(start);
    while let Some(m) = mode {
        for spec in plan(m) {
            if !names.contains(&spec.program) {
                names.push(spec.program);
            }
        }
        mode = m.step_down();
    }
    names
}

/// Whether opening `event` of `specs` failed for its `PERF_SAMPLE_BRANCH_TYPE_SAVE`
/// bit as far as the errno can tell (EINVAL, EOPNOTSUPP): worth one retry without it.
fn refuses_branch_types(specs: &[EventSpec], event: &str, cause: &std::io::Error) -> bool {
    matches!(cause.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
        && specs
            .iter()
            .any(|s| s.name == event && s.saves_branch_types())
}

/// Where the ladder settled.
#[derive(Debug)]
pub struct Rung {
    /// The mode whose events all opened.
    pub mode: Mode,
    /// Why this mode, in one line (the probe's reason, or the step-downs').
    pub reason: String,
    /// That mode's events ([`super::events::plan`]).
    pub specs: Vec<EventSpec>,
    /// Every event opened, at every placement, with its program attached.
    pub open: Vec<OpenEvent>,
}

/// Walks the ladder from `start` (the probed mode and why): opens `plan(mode)`'s events,
/// and while one cannot be opened steps down a rung, saying which event failed and what
/// the new mode measures. Every mode line goes to `notify` as it is decided.
pub fn walk(
    sys: &dyn PerfSys,
    start: (Mode, String),
    plan: &dyn Fn(Mode) -> Vec<EventSpec>,
    places: &Placements,
    attach: Attach,
    notify: &mut dyn FnMut(Notice<'_>),
) -> Result<Rung, CollectError> {
    let (mut mode, mut reason) = start;
    notify(Notice {
        brief: &format!("mode: {} — {}", mode.name(), mode.brief()),
        full: &format!("mode: {} — {reason}", mode.name()),
    });
    let mut specs = plan(mode);
    // Said once the retry without branch types has opened.
    let mut untyped: Option<String> = None;
    loop {
        match open_events(sys, &specs, places, attach) {
            Ok(Opened { open, notes }) => {
                // CPUs an event could not be opened on while it opened on others, one
                // line per event, and branch events opened without branch types.
                for n in untyped.iter().chain(&notes) {
                    notify(Notice::plain(n));
                }
                return Ok(Rung {
                    mode,
                    reason,
                    specs,
                    open,
                });
            }
            Err(CollectError::Open { event, cause, .. })
                if refuses_branch_types(&specs, &event, &cause) =>
            {
                // AMD BRS takes no branch-stack bit but the privilege levels and ANY
                // (arch/x86/events/amd/brs.c `amd_brs_setup_filter`: EINVAL); a kernel
                // before 4.14 knows no TYPE_SAVE (EINVAL). The mode holds without it.
                for s in specs.iter_mut().filter(|s| s.name == event) {
                    s.without_branch_types();
                }
                untyped = Some(format!(
                    "{event} takes no branch types here (PERF_SAMPLE_BRANCH_TYPE_SAVE: \
                     {cause}): opened without them, so ranges under call stacks are \
                     assigned by function"
                ));
            }
            Err(CollectError::Open { event, cause, .. }) if mode.step_down().is_some() => {
                mode = mode.step_down().unwrap_or(Mode::TimeProfile);
                specs = plan(mode);
                untyped = None;
                reason = format!(
                    "{event} cannot be opened here ({cause}); stepped down to {}: {}",
                    mode.name(),
                    mode.measures()
                );
                notify(Notice {
                    brief: &format!(
                        "mode: {} — stepped down: {event} cannot be opened",
                        mode.name()
                    ),
                    full: &format!("mode: {} — {reason}", mode.name()),
                });
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::caps::{Processor, Vendor};
    use crate::collect::events::{self, Rate};
    use crate::collect::sys::fake::{self, Call, FakeSys};
    use crate::collect::sys::{self, PERF_TYPE_HARDWARE, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE};
    use std::os::fd::AsRawFd;

    const RATE: Rate = Rate {
        frequency: 999,
        period: None,
        core_hz: 2_000_000_000,
    };

    fn plan(mode: Mode) -> Vec<EventSpec> {
        events::plan(mode, &Processor::of(Vendor::Intel), &RATE, false, false)
    }

    fn attach_prog(_: &'static str) -> Result<Option<BorrowedFd<'static>>, CollectError> {
        Ok(Some(fake::program()))
    }

    /// Every event at `at`, following nothing more.
    fn at(at: &[Placement]) -> Placements {
        Placements {
            at: at.to_vec(),
            follow: Follow::Placed,
        }
    }

    /// Every CPU of `caps`.
    fn every_cpu(caps: &crate::collect::caps::Capabilities) -> Placements {
        let cpus: Vec<_> = caps
            .online_cpus
            .iter()
            .map(|&cpu| Placement::Cpu { cpu })
            .collect();
        at(&cpus)
    }

    /// This machine: no PMU. Branch stacks fail with ENOENT, hardware events too.
    fn no_pmu(attr: &crate::collect::sys::PerfEventAttr, _: Placement) -> Option<i32> {
        (attr.type_ != PERF_TYPE_SOFTWARE).then_some(libc::ENOENT)
    }

    #[test]
    fn steps_down_from_cpi_to_time_profile_saying_why() {
        let sys = FakeSys::new(no_pmu);
        let (mut lines, mut briefs) = (Vec::new(), Vec::new());
        let rung = walk(
            &sys,
            (Mode::Cpi, "probe says LBR".into()),
            &plan,
            &at(&[Placement::Thread { tid: 1234 }]),
            &attach_prog,
            &mut |l| {
                lines.push(l.to_string());
                briefs.push(format!("cpi-bpf: {}", l.brief));
            },
        )
        .unwrap();
        // On a terminal: each line alone, in 80 columns; the full lines say why.
        assert_eq!(
            briefs,
            [
                "cpi-bpf: mode: cpi — CPI per function, block and instruction",
                "cpi-bpf: mode: ip-sampling — stepped down: cpu/r20c4/ cannot be opened",
                "cpi-bpf: mode: time-profile — stepped down: cycles cannot be opened",
            ]
        );
        for b in briefs.iter().chain(lines.iter().take(1)) {
            assert!(b.chars().count() <= 80, "{b}");
        }
        assert_eq!(rung.mode, Mode::TimeProfile);
        assert_eq!(rung.open.len(), 1);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].starts_with("mode: cpi — probe says LBR"));
        assert!(
            lines[1].starts_with("mode: ip-sampling — cpu/r20c4/ cannot be opened here"),
            "{lines:?}"
        );
        assert!(lines[2].contains("stepped down to time-profile: cpu-clock time profile"));
        assert_eq!(
            rung.reason,
            lines[2].trim_start_matches("mode: time-profile — ")
        );
        let opens = sys.calls_where(|c| matches!(c, Call::Open { .. }));
        let types: Vec<u32> = opens
            .iter()
            .map(|c| match c {
                Call::Open { type_, .. } => *type_,
                _ => unreachable!(),
            })
            .collect();
        // Cpi: the branch event fails first; IP sampling: cycles fails; then cpu-clock.
        assert_eq!(
            types,
            [PERF_TYPE_RAW, PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE]
        );
        assert_eq!(
            sys.calls_where(
                |c| matches!(c, Call::SetBpf(_, p) if *p == fake::program().as_raw_fd())
            )
            .len(),
            1
        );
    }

    /// `branch_sample_type` of every open, in order.
    fn branch_types(sys: &FakeSys) -> Vec<u64> {
        sys.calls_where(|c| matches!(c, Call::Open { .. }))
            .into_iter()
            .map(|c| match c {
                Call::Open {
                    branch_sample_type, ..
                } => branch_sample_type,
                _ => unreachable!(),
            })
            .collect()
    }

    const SAVE: u64 = crate::collect::sys::PERF_SAMPLE_BRANCH_TYPE_SAVE;

    #[test]
    fn branch_records_ask_for_branch_types() {
        let sys = FakeSys::new(|_, _| None);
        let mut lines = Vec::new();
        let rung = walk(
            &sys,
            (Mode::Cpi, "LBR".into()),
            &plan,
            &at(&[Placement::Thread { tid: 1234 }]),
            &attach_prog,
            &mut |l| lines.push(l.to_string()),
        )
        .unwrap();
        assert_eq!(rung.mode, Mode::Cpi);
        assert_eq!(lines.len(), 1, "the mode line alone: {lines:?}");
        // The branch event with USER | ANY | TYPE_SAVE, cycles with no branch stack.
        assert_eq!(branch_types(&sys), [1 | 8 | SAVE, 0]);
    }

    /// A PMU that refuses TYPE_SAVE with EINVAL (a kernel before 4.14; BRS, had the
    /// probe not recognised it): the branch event is opened again without it, the mode
    /// holds, and the line says so.
    #[test]
    fn a_pmu_refusing_branch_types_keeps_the_mode_without_them() {
        let plan = |m| events::plan(m, &Processor::of(Vendor::Amd), &RATE, false, false);
        let sys = FakeSys::new(|a, _| (a.branch_sample_type & SAVE != 0).then_some(libc::EINVAL));
        let mut lines = Vec::new();
        let rung = walk(
            &sys,
            (Mode::Cpi, "BRS".into()),
            &plan,
            &at(&[Placement::Cpu { cpu: 0 }, Placement::Cpu { cpu: 1 }]),
            &attach_prog,
            &mut |l| lines.push(l.to_string()),
        )
        .unwrap();
        assert_eq!(rung.mode, Mode::Cpi, "{lines:?}");
        assert_eq!(rung.open.len(), 4, "branches and cycles on both CPUs");
        // Refused on both CPUs; then without the bit on both, then cycles.
        assert_eq!(
            branch_types(&sys),
            [1 | 8 | SAVE, 1 | 8 | SAVE, 1 | 8, 1 | 8, 0, 0]
        );
        assert_eq!(rung.specs[0].attr.branch_sample_type, 1 | 8);
        let einval = std::io::Error::from_raw_os_error(libc::EINVAL);
        let said = format!(
            "cpu/ex_ret_brn_tkn/ (rc4) takes no branch types here \
             (PERF_SAMPLE_BRANCH_TYPE_SAVE: {einval}): opened without them, so ranges \
             under call stacks are assigned by function"
        );
        assert_eq!(lines[1..], *std::slice::from_ref(&said));
        // A branch stack refused outright still steps down, after the one retry.
        let sys = FakeSys::new(|a, _| (a.branch_sample_type != 0).then_some(libc::EINVAL));
        let rung = walk(
            &sys,
            (Mode::Cpi, "no LBR".into()),
            &plan,
            &at(&[Placement::Thread { tid: 1234 }]),
            &attach_prog,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(rung.mode, Mode::IpSampling);
        assert_eq!(branch_types(&sys), [1 | 8 | SAVE, 1 | 8, 0, 0]);
    }

    #[test]
    fn only_the_programs_of_the_start_rung_and_below_load() {
        assert_eq!(programs_from(Mode::TimeProfile, &plan), ["ip_cpu_clock"]);
        assert_eq!(
            programs_from(Mode::IpSampling, &plan),
            ["ip_cycles", "ip_instructions", "ip_cpu_clock"]
        );
        assert_eq!(
            programs_from(Mode::Cpi, &plan),
            [
                "branch_sample",
                "ip_cycles",
                "ip_instructions",
                "ip_cpu_clock"
            ]
        );
    }

    #[test]
    fn bottom_rung_failure_is_the_error() {
        let sys = FakeSys::new(|_, _| Some(libc::EINVAL));
        let err = walk(
            &sys,
            (Mode::TimeProfile, "no PMU".into()),
            &plan,
            &at(&[Placement::Thread { tid: 1234 }]),
            &attach_prog,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(&err, CollectError::Open { cause, .. } if cause.raw_os_error() == Some(libc::EINVAL)),
            "{err}"
        );
        assert!(err
            .to_string()
            .starts_with("opening cpu-clock on pid 1234:"));
    }

    #[test]
    fn attach_failure_does_not_step_down() {
        let mut sys = FakeSys::new(|_, _| None);
        sys.set_bpf_errno = Some(libc::EACCES);
        let err = walk(
            &sys,
            (Mode::Cpi, "LBR".into()),
            &plan,
            &at(&[Placement::Me]),
            &attach_prog,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(matches!(err, CollectError::Attach { .. }), "{err}");
    }

    #[test]
    fn exited_threads_are_skipped_and_all_gone_is_no_such_process() {
        // Thread 11 exited after /proc/PID/task was listed.
        let sys = FakeSys::new(|_, at| (at.tid() == Some(11)).then_some(libc::ESRCH));
        let open = open_events(
            &sys,
            &plan(Mode::TimeProfile),
            &at(&[
                Placement::Thread { tid: 10 },
                Placement::Thread { tid: 11 },
                Placement::Thread { tid: 12 },
            ]),
            &attach_prog,
        )
        .unwrap()
        .open;
        assert_eq!(open.len(), 2);
        let sys = FakeSys::new(|_, _| Some(libc::ESRCH));
        let err = open_events(
            &sys,
            &plan(Mode::TimeProfile),
            &at(&[Placement::Thread { tid: 10 }, Placement::Thread { tid: 11 }]),
            &attach_prog,
        )
        .unwrap_err();
        assert!(matches!(err, CollectError::NoSuchProcess(10)), "{err}");
        // ESRCH on a CPU placement is an error, not an exited thread.
        let err = open_events(
            &sys,
            &plan(Mode::TimeProfile),
            &at(&[Placement::Cpu { cpu: 0 }]),
            &attach_prog,
        )
        .unwrap_err();
        assert!(matches!(err, CollectError::Open { .. }), "{err}");
    }

    #[test]
    fn opening_without_a_program_attaches_nothing() {
        let sys = FakeSys::new(|_, _| None);
        let none = |_: &'static str| Ok(None);
        let open = open_events(&sys, &plan(Mode::Cpi), &at(&[Placement::Me]), &none)
            .unwrap()
            .open;
        assert_eq!(open.len(), 2);
        assert!(sys
            .calls_where(|c| matches!(c, Call::SetBpf(..)))
            .is_empty());
    }

    /// The recorded Alder Lake (tests/data/machines/README.md): `cpu_core` (type 4,
    /// CPUs 0-15) and `cpu_atom` (type 8, CPUs 16-23), both with branch records.
    /// A recorded machine (tests/data/machines/).
    fn machine(name: &str) -> crate::collect::caps::Capabilities {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/machines")
            .join(name);
        crate::collect::caps::Capabilities::probe_at(&root, 0, "")
    }

    fn alderlake() -> crate::collect::caps::Capabilities {
        machine("alderlake-hybrid")
    }

    /// `(type, config, placement)` of every open, in order.
    fn opens(sys: &FakeSys) -> Vec<(u32, u64, Placement)> {
        sys.calls_where(|c| matches!(c, Call::Open { .. }))
            .into_iter()
            .map(|c| match c {
                Call::Open {
                    type_, config, at, ..
                } => (type_, config, at),
                _ => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn hybrid_events_open_in_each_pmus_type_on_its_cpus() {
        let caps = alderlake();
        let plan = |m| events::plan(m, &caps.processor(), &RATE, false, false);
        let cpus = every_cpu(&caps);
        assert_eq!(cpus.at.len(), 24);
        let sys = FakeSys::new(|_, _| None);
        let mut lines = Vec::new();
        let rung = walk(&sys, caps.mode(), &plan, &cpus, &attach_prog, &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
        assert_eq!(rung.mode, Mode::Cpi);
        assert_eq!(lines.len(), 1, "the mode line alone: {lines:?}");
        // P-cores: BR_INST_RETIRED.NEAR_TAKEN (umask 0x20) as cpu_core's raw type, cycles
        // with cpu_core's type in config[63:32]; E-cores the same on cpu_atom (type 8,
        // umask 0xc0). No event is opened on the other kind's CPUs.
        let mut want = Vec::new();
        for (type_, config, range) in [
            (4, 0x20c4, 0..16),
            (0, 4 << 32, 0..16),
            (8, 0xc0c4, 16..24),
            (0, 8 << 32, 16..24),
        ] {
            want.extend(range.map(|cpu| (type_, config, Placement::Cpu { cpu })));
        }
        assert_eq!(opens(&sys), want);
        assert_eq!(rung.open.len(), 48);
        // A process: each PMU's events once, on any CPU (the kernel counts each where
        // its PMU's cores run the threads).
        let sys = FakeSys::new(|_, _| None);
        walk(
            &sys,
            caps.mode(),
            &plan,
            &at(&[Placement::Thread { tid: 1234 }]),
            &attach_prog,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(
            opens(&sys),
            [
                (4, 0x20c4, Placement::Thread { tid: 1234 }),
                (0, 4 << 32, Placement::Thread { tid: 1234 }),
                (8, 0xc0c4, Placement::Thread { tid: 1234 }),
                (0, 8 << 32, Placement::Thread { tid: 1234 })
            ]
        );
    }

    /// The Zen 3 BRS server: every event opens at the first try, on each of its 128
    /// CPUs, against a kernel that takes a branch stack only as `amd_brs_hw_config` and
    /// `amd_brs_setup_filter` (arch/x86/events/amd/brs.c) allow: `ex_ret_brn_tkn`
    /// (0xc4), a fixed period, no branch-stack bit but ANY and the privilege levels.
    #[test]
    fn zen3_brs_opens_every_event_without_a_refusal() {
        let caps = machine("amd-zen3-epyc-brs");
        assert!(caps.brs);
        let plm_any = sys::PERF_SAMPLE_BRANCH_USER
            | sys::PERF_SAMPLE_BRANCH_KERNEL
            | 1 << 2 // PERF_SAMPLE_BRANCH_HV
            | sys::PERF_SAMPLE_BRANCH_ANY;
        let brs_kernel = move |a: &sys::PerfEventAttr, _| {
            let refused = a.sample_type & sys::PERF_SAMPLE_BRANCH_STACK != 0
                && (a.branch_sample_type & !plm_any != 0
                    || a.config != 0xc4
                    || a.flags & sys::flag::FREQ != 0);
            refused.then_some(libc::EINVAL)
        };
        let cpus = every_cpu(&caps);
        for include_kernel in [false, true] {
            let plan = |m| events::plan(m, &caps.processor(), &RATE, include_kernel, false);
            let sys = FakeSys::new(brs_kernel);
            let mut lines = Vec::new();
            let rung = walk(&sys, caps.mode(), &plan, &cpus, &attach_prog, &mut |l| {
                lines.push(l.to_string())
            })
            .unwrap();
            assert_eq!(rung.mode, Mode::Cpi, "{lines:?}");
            assert_eq!(lines.len(), 1, "the mode line alone: {lines:?}");
            // Branches and cycles on each CPU, each opened once.
            assert_eq!(rung.open.len(), 2 * 128);
            assert_eq!(opens(&sys).len(), rung.open.len(), "an open was refused");
            let plm = if include_kernel { 1 | 2 } else { 1 };
            let mut types = branch_types(&sys);
            types.dedup();
            assert_eq!(types, [plm | 8, 0], "branches on every CPU, then cycles");
        }
    }

    #[test]
    fn a_cpu_whose_open_fails_is_said_once_per_event_and_the_rest_collect() {
        let caps = alderlake();
        let plan = |m| events::plan(m, &caps.processor(), &RATE, false, false);
        let cpus = every_cpu(&caps);
        // CPU 17 (an E-core) refuses both of cpu_atom's events.
        let sys = FakeSys::new(|_, at| (at.cpu() == Some(17)).then_some(libc::ENODEV));
        let mut lines = Vec::new();
        let rung = walk(&sys, caps.mode(), &plan, &cpus, &attach_prog, &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
        assert_eq!(rung.mode, Mode::Cpi, "{lines:?}");
        assert_eq!(rung.open.len(), 46);
        assert!(rung.open.iter().all(|e| e.place.cpu() != Some(17)));
        let enodev = std::io::Error::from_raw_os_error(libc::ENODEV);
        let said = [
            format!(
                "cpu_atom/rc0c4/ cannot be opened on CPU 17 ({enodev}): not sampled there; \
                 the other CPUs collect"
            ),
            format!(
                "cpu_atom/cycles/ cannot be opened on CPU 17 ({enodev}): not sampled there; \
                 the other CPUs collect"
            ),
        ];
        assert_eq!(lines[1..], said, "the mode line, then one line per event");
    }

    #[test]
    fn an_e_core_event_that_opens_on_no_cpu_steps_the_ladder_down() {
        let caps = alderlake();
        let plan = |m| events::plan(m, &caps.processor(), &RATE, false, false);
        let cpus = every_cpu(&caps);
        // cpu_atom takes no branch stack anywhere: CPI would miss every E-core.
        let sys = FakeSys::new(|attr, _| {
            (attr.type_ == 8 && attr.branch_sample_type != 0).then_some(libc::EOPNOTSUPP)
        });
        let mut lines = Vec::new();
        let rung = walk(&sys, caps.mode(), &plan, &cpus, &attach_prog, &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
        assert_eq!(rung.mode, Mode::IpSampling);
        assert!(
            lines[1].starts_with("mode: ip-sampling — cpu_atom/rc0c4/ cannot be opened here"),
            "{lines:?}"
        );
        // Cycles and instructions, each PMU on its own CPUs.
        assert_eq!(rung.open.len(), 2 * 24);
    }
}
