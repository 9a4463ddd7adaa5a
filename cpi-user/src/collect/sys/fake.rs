//! A scripted [`PerfSys`] for unit tests (aya's `sys/fake.rs` pattern): every call is
//! recorded, `perf_event_open` fails with whatever errno the test's closure says, and
//! event fds are `/dev/null` so they are real, closable descriptors.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::LazyLock;

use super::{FilterMaps, Follow, PerfEventAttr, PerfSys, Placement};

/// One recorded call; fds are raw numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Open {
        type_: u32,
        config: u64,
        branch_sample_type: u64,
        at: Placement,
        follow: Follow,
    },
    SetBpf(i32, i32),
    Enable(i32),
    Disable(i32),
    SetPeriod(i32, u64),
    Read(i32),
    PidfdOpen(u32),
    EnableStats,
}

type OpenScript = Box<dyn Fn(&PerfEventAttr, Placement) -> Option<i32>>;

/// A program fd for the tests to attach (`/dev/null`, open for the whole run).
pub fn program() -> BorrowedFd<'static> {
    static NULL: LazyLock<std::fs::File> =
        LazyLock::new(|| std::fs::File::open("/dev/null").expect("open /dev/null"));
    NULL.as_fd()
}

pub(crate) struct FakeSys {
    /// `Some(errno)`: `perf_event_open(attr, at)` fails with it.
    open_errno: OpenScript,
    /// `Some(errno)`: `PERF_EVENT_IOC_SET_BPF` fails with it.
    pub set_bpf_errno: Option<i32>,
    /// What `read_count` returns next (the tests move it forward).
    pub count: Cell<u64>,
    pub calls: RefCell<Vec<Call>>,
}

impl FakeSys {
    pub fn new(open_errno: impl Fn(&PerfEventAttr, Placement) -> Option<i32> + 'static) -> Self {
        FakeSys {
            open_errno: Box::new(open_errno),
            set_bpf_errno: None,
            count: Cell::new(0),
            calls: RefCell::new(Vec::new()),
        }
    }

    fn record(&self, c: Call) {
        self.calls.borrow_mut().push(c);
    }

    /// The recorded calls that match `f`.
    pub(crate) fn calls_where(&self, f: impl Fn(&Call) -> bool) -> Vec<Call> {
        self.calls
            .borrow()
            .iter()
            .filter(|c| f(c))
            .cloned()
            .collect()
    }
}

fn dev_null() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/dev/null")?.into())
}

impl PerfSys for FakeSys {
    fn perf_event_open(
        &self,
        attr: &PerfEventAttr,
        at: Placement,
        follow: Follow,
    ) -> io::Result<OwnedFd> {
        self.record(Call::Open {
            type_: attr.type_,
            config: attr.config,
            branch_sample_type: attr.branch_sample_type,
            at,
            follow,
        });
        match (self.open_errno)(attr, at) {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => dev_null(),
        }
    }
    fn set_bpf(&self, fd: &OwnedFd, prog: BorrowedFd<'_>) -> io::Result<()> {
        self.record(Call::SetBpf(fd.as_raw_fd(), prog.as_raw_fd()));
        match self.set_bpf_errno {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
    fn enable(&self, fd: &OwnedFd) -> io::Result<()> {
        self.record(Call::Enable(fd.as_raw_fd()));
        Ok(())
    }
    fn disable(&self, fd: &OwnedFd) -> io::Result<()> {
        self.record(Call::Disable(fd.as_raw_fd()));
        Ok(())
    }
    fn set_period(&self, fd: &OwnedFd, period: u64) -> io::Result<()> {
        self.record(Call::SetPeriod(fd.as_raw_fd(), period));
        Ok(())
    }
    fn read_count(&self, fd: &OwnedFd) -> io::Result<u64> {
        self.record(Call::Read(fd.as_raw_fd()));
        Ok(self.count.get())
    }
    fn pidfd_open(&self, pid: u32) -> io::Result<OwnedFd> {
        self.record(Call::PidfdOpen(pid));
        Err(io::Error::from_raw_os_error(libc::ESRCH))
    }
    fn set_output(&self, _: &OwnedFd, _: &OwnedFd) -> io::Result<()> {
        Ok(())
    }
    fn event_id(&self, fd: &OwnedFd) -> io::Result<u64> {
        Ok(fd.as_raw_fd() as u64)
    }
    fn enable_bpf_stats(&self) -> io::Result<OwnedFd> {
        self.record(Call::EnableStats);
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }
}

/// One recorded filter-map update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MapCall {
    AllowTgid(u32),
    RemoveTgid(u32),
    AllowCgroup(u64),
    RemoveCgroup(u64),
    Levels(u32),
    FilterBits(u32),
}

/// Records filter-map updates; `fail_remove`: removals fail as a kernel's could.
#[derive(Debug, Default)]
pub(crate) struct FakeMaps {
    pub calls: Vec<MapCall>,
    pub fail_remove: bool,
}

impl FakeMaps {
    /// The tgids the map would hold after the recorded calls.
    pub(crate) fn allowed_tgids(&self) -> Vec<u32> {
        let mut held = std::collections::BTreeSet::new();
        for c in &self.calls {
            match *c {
                MapCall::AllowTgid(t) => {
                    held.insert(t);
                }
                MapCall::RemoveTgid(t) => {
                    held.remove(&t);
                }
                MapCall::AllowCgroup(_)
                | MapCall::RemoveCgroup(_)
                | MapCall::Levels(_)
                | MapCall::FilterBits(_) => {}
            }
        }
        held.into_iter().collect()
    }
}

impl FilterMaps for FakeMaps {
    fn allow_tgid(&mut self, tgid: u32) -> io::Result<()> {
        self.calls.push(MapCall::AllowTgid(tgid));
        Ok(())
    }
    fn remove_tgid(&mut self, tgid: u32) -> io::Result<()> {
        if self.fail_remove {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        self.calls.push(MapCall::RemoveTgid(tgid));
        Ok(())
    }
    fn allow_cgroup(&mut self, id: u64) -> io::Result<()> {
        self.calls.push(MapCall::AllowCgroup(id));
        Ok(())
    }
    fn remove_cgroup(&mut self, id: u64) -> io::Result<()> {
        self.calls.push(MapCall::RemoveCgroup(id));
        Ok(())
    }
    fn set_cgroup_levels(&mut self, levels: u32) -> io::Result<()> {
        self.calls.push(MapCall::Levels(levels));
        Ok(())
    }
    fn set_filter_bits(&mut self, bits: u32) -> io::Result<()> {
        self.calls.push(MapCall::FilterBits(bits));
        Ok(())
    }
    fn tgids_held(&mut self) -> io::Result<Vec<u32>> {
        Ok(self.allowed_tgids())
    }
}
