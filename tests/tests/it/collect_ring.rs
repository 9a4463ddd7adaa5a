//! The kernel side's accounting, for real on `cpu-clock`: a ring buffer nobody drains
//! fills, and every overflow is then either emitted or counted as lost (never silent);
//! the user-space period re-draw ioctl works on the events we open. Root only.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aya::maps::RingBuf;
use cpi_common::policy::KernelConfig;
use cpi_common::wire::{Counter, EventRole};
use cpi_tests::{busy, cpu_seconds, require_root};
use cpi_user::collect::caps::{Processor, Vendor};
use cpi_user::collect::sys::{self, PerfSys};
use cpi_user::collect::{self, events, ladder};
use cpi_user::profile::Mode;

#[test]
fn full_ring_buffer_is_counted_and_nothing_is_silent() {
    if !require_root("loading BPF programs") {
        return;
    }
    let Some(exe) = busy("ring", &[]) else {
        return;
    };
    let mut busy = Command::new(&exe)
        .arg("60")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // One page of ring: room for about 70 IP records.
    let mut bpf = collect::load(
        4096,
        KernelConfig::default(),
        cpi_common::wire::StackMode::Off,
        false,
        true,
        &["ip_cpu_clock"],
    )
    .expect("load");
    let rate = events::Rate {
        frequency: 10_000,
        period: None,
        core_hz: 0,
    };
    let spec = events::plan(
        Mode::TimeProfile,
        &Processor::of(Vendor::Other),
        &rate,
        false,
        false,
    )
    .remove(0);
    assert_eq!(spec.role, EventRole::CpuClock);
    let linux = sys::Linux;
    let attach = |name: &'static str| ladder::program_fd(&bpf, name);
    let fd = ladder::open_attached(
        &linux,
        &spec,
        (
            sys::Placement::Thread { tid: busy.id() },
            sys::Follow::Children,
        ),
        &attach,
    )
    .expect("open cpu-clock on busy");
    linux.enable(&fd).unwrap();
    // Re-draws go through on our own fds (what the collector's re-draws do).
    linux
        .set_period(&fd, spec.policy.base + 2)
        .expect("PERF_EVENT_IOC_PERIOD");
    // Nobody drains meanwhile. Until busy has had 0.7 s of CPU, not 0.7 s of wall time:
    // on a loaded machine it once had 24 ms of a 700 ms sleep.
    let cpu = || cpu_seconds(busy.id()).expect("busy's CPU time");
    let (from, t0) = (cpu(), Instant::now());
    while cpu() - from < 0.7 {
        assert!(
            t0.elapsed() < Duration::from_secs(50),
            "busy got no CPU in 50 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let counted = linux.read_count(&fd).expect("read the event's count");
    assert!(
        counted > 100_000_000,
        "busy ran ≈ 0.7 s of cpu-clock, counted {counted} ns"
    );
    linux.disable(&fd).unwrap();
    let _ = busy.kill();
    let _ = busy.wait();

    let c = collect::read_counters(&bpf);
    let (seen, emitted, full) = (
        c[Counter::Seen as usize],
        c[Counter::Emitted as usize],
        c[Counter::RingFull as usize],
    );
    eprintln!("seen {seen}, emitted {emitted}, ring full {full}");
    assert!(full > 0, "a one-page ring must overflow at 10 kHz in 0.7 s");
    assert_eq!(seen, emitted + full, "every overflow is emitted or counted");
    let mut ring = RingBuf::try_from(bpf.take_map("SAMPLES").unwrap()).unwrap();
    let mut drained = 0;
    while ring.next().is_some() {
        drained += 1;
    }
    assert_eq!(drained, emitted, "every emitted record is in the ring");
    assert!(
        drained < 80,
        "a page holds at most ~73 records, got {drained}"
    );
}
