//! The agent's calls into the C library: the glibc allocator's tuning
//! (`mallopt`, `malloc_trim`; on other C libraries they do nothing), and the clock tick
//! `/proc` counts CPU time in (`sysconf(_SC_CLK_TCK)`), and the process's and the calling
//! thread's own CPU time (`clock_gettime`).

use std::time::Duration;

/// Gives the heap pages a window's analysis freed back to the system. glibc keeps freed
/// memory in its arenas, so without this the agent's resident set would stay at the high
/// mark of its busiest window (seen: +15 MiB held after a burst of exiting processes,
/// tests/tests/it/agent_sinks.rs, the churn test).
pub(crate) fn release_free_heap() {
    // SAFETY: malloc_trim only returns free memory of the allocator to the system.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// One glibc arena for all the agent's threads (set before any is started). With one
/// per thread the analysis thread's arena kept its busiest window's pages and the
/// collector's its own: RssAnon median 37.5 MiB (p90 47.8) against 33.4 (p90 33.6) with
/// one, same CPU, side by side at default settings on a build host (BENCHMARKS.md,
/// "Agent memory: the ring and the allocator"). The threads allocate at different
/// moments (draining, analysing), so one lock costs little.
pub(crate) fn one_heap_arena() {
    // SAFETY: mallopt only changes the allocator's tuning; no allocation is affected.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Clock ticks a second: the unit of `/proc/PID/stat`'s utime and stime (100 on Linux
/// whatever the kernel's HZ; 100 if `sysconf` fails).
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// User + system CPU time of this process, every thread, in nanoseconds
/// (`CLOCK_PROCESS_CPUTIME_ID`, the scheduler's own count). `/proc/self/stat` rounds to
/// 10 ms clock ticks: half a tick a window at the default budget with `--interval 1`,
/// which made the governor read 0 % and 36 % by turns.
pub(crate) fn process_cpu_time() -> Option<Duration> {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// User + system CPU time of the calling thread, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`).
pub(crate) fn thread_cpu_time() -> Option<Duration> {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn cpu_clock(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    let r = unsafe { libc::clock_gettime(clock, &raw mut ts) };
    (r == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}
