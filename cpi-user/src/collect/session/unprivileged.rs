//! [`Session::open`] without BPF privileges: the mode's events opened per thread and CPU
//! with their samples in the kernel's own ring buffers (cpi-user/src/collect/perf_ring.rs),
//! where `perf_event_paranoid` lets a user profile their own processes.

use std::io;

use crate::collect::sys;
use cpi_common::policy::Thinning;
use tokio::signal::unix::{signal, SignalKind};

use super::{
    assemble, check_fd_room, plan, range_window, resolve_target, tell_notes, Parts, Session, Source,
};
use crate::collect::caps::Capabilities;
use crate::collect::filter::KernelFilter;
use crate::collect::perf_ring::{self, SampleRings};
use crate::collect::sideband::SidebandReader;
use crate::collect::sys::{Follow, Linux, Placement, Placements};
use crate::collect::target::{self, Target};
use crate::collect::{events, ladder, CollectError, CollectOptions, Notice};
use crate::fsafe::page_size;

/// Opens `opts` through the perf ring buffers, or says in one line why it may not be
/// and what would allow it.
pub(super) fn open(
    opts: &CollectOptions,
    caps: &Capabilities,
    notify: &mut dyn FnMut(Notice<'_>),
) -> Result<Session, CollectError> {
    perf_ring::allowed(caps, &opts.target).map_err(CollectError::NotPrivileged)?;
    let mut opts = opts.clone();
    let pid_notes = resolve_target(&mut opts)?;
    if let Target::Pids(pids) = &opts.target {
        for &pid in pids {
            perf_ring::own_process(pid, caps.euid).map_err(CollectError::NotPrivileged)?;
        }
    }
    events::check_rate(&opts.rate)?;
    let (mode, reason) = caps.mode();
    let start = (mode, format!("{reason}; {}", perf_ring::MODE_NOTE));
    let cpu = caps.processor();
    let wake = (page_size() * perf_ring::DATA_PAGES / 4) as u32;
    let plan_ring = |m| perf_ring::specs(plan(m, &cpu, &opts, &opts.rate), opts.stacks, wake);
    let cpus = target::online_cpus();
    check_fd_room(
        &opts.target,
        (plan_ring(mode).len() * cpus.len()) as u64,
        false,
    )?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let entered = rt.enter();
    let signals = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    );
    // From the fork on, dropping `suspended` (any `?` below) kills and reaps it.
    let suspended = match opts.target.command() {
        Some(argv) => Some(target::spawn_suspended(argv)?),
        None => None,
    };
    let places = places(&opts.target, suspended.as_ref(), &cpus)?;
    // The mode line says so in its short form too.
    let mut say = |n: Notice<'_>| match n.brief.strip_prefix("mode: ") {
        Some(_) => notify(Notice {
            brief: &format!("{} ({})", n.brief, perf_ring::MODE_NOTE),
            full: n.full,
        }),
        None => notify(n),
    };
    let rung = ladder::walk(&Linux, start, &plan_ring, &places, &|_| Ok(None), &mut say)
        .map_err(refused)?;
    tell_notes(&mut say, &pid_notes, &rung, &opts.rate);
    let mut rings = SampleRings::map(&Linux, &rung.open, &rung.specs).map_err(map_refused)?;
    let ready = (rings.take_ready_fds().into_iter())
        .map(sys::watch)
        .collect::<Result<Vec<_>, _>>()?;
    let window = range_window(&opts, caps);
    let live = assemble(Parts {
        opts,
        cpu,
        rung,
        thinning: Thinning::OFF,
        window,
        cpus: cpus.len(),
        sideband: SidebandReader::default(),
        sideband_ready: ready,
        filter: KernelFilter::default(),
        signals,
        suspended,
        source: Source::Perf(rings),
    })?;
    drop(entered);
    Ok(Session { live, rt })
}

/// Every thread of the target on every CPU: the kernel maps an inherited event's buffer
/// only when it counts on one CPU (`perf_mmap`), as `perf record` opens them.
fn places(
    target: &Target,
    child: Option<&target::Suspended>,
    cpus: &[u32],
) -> Result<Placements, CollectError> {
    let threads = match (target, child) {
        (_, Some(c)) => vec![c.pid()],
        (Target::Pids(pids), None) => {
            let mut v = Vec::new();
            for &pid in pids {
                v.extend(target::threads(pid)?);
            }
            v
        }
        _ => return Err(CollectError::NoTarget),
    };
    let at = threads
        .iter()
        .flat_map(|&tid| {
            cpus.iter()
                .map(move |&cpu| Placement::ThreadOnCpu { tid, cpu })
        })
        .collect();
    let follow = match child {
        Some(_) => Follow::ChildrenFromExec,
        None => Follow::Children,
    };
    Ok(Placements { at, follow })
}

/// A buffer the kernel would not map, in one line: what a user may lock of perf buffers
/// is spent (other perf sessions of the same user).
fn map_refused(e: io::Error) -> CollectError {
    match e.raw_os_error() {
        Some(libc::EPERM) => CollectError::NotPrivileged(format!(
            "mapping the perf buffers ({e}): the memory a user may lock for them \
             (kernel.perf_event_mlock_kb, `ulimit -l`) is spent; {}",
            perf_ring::remedy()
        )),
        _ => CollectError::Io(e),
    }
}

/// A refusal of the kernel's (a process it will not let this user sample) as the one
/// line that says what would allow it.
fn refused(e: CollectError) -> CollectError {
    match e {
        CollectError::Open { event, on, cause }
            if matches!(cause.raw_os_error(), Some(libc::EACCES | libc::EPERM)) =>
        {
            CollectError::NotPrivileged(format!(
                "the kernel refused {event} on {on} ({cause}): without root cpi-bpf profiles \
                 only your own processes; {}",
                perf_ring::remedy()
            ))
        }
        e => e,
    }
}
