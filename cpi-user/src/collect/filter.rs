//! The kernel filter: which processes the eBPF program keeps when the events are
//! system-wide ([`super::Target::Filtered`], the agent's `--pid`, `--cgroup` and pod
//! selectors). The program drops every other sample first thing and only counts it
//! (`Counter::Filtered`), so an unwanted process costs a map lookup per sample, never a
//! record, a drain or an unwinding (cpi-ebpf/src/main.rs `wanted`; docs/METHOD.md,
//! "Filtering in the kernel").
//!
//! Processes are named by tgid: their threads, started before or after, are kept;
//! processes they fork later are not (a cgroup keeps those), except in a filter that
//! follows its processes' tree (`KernelFilter::following`: `-p` and `-- CMD` as root,
//! on per-CPU events), where the eBPF program itself adds each child at its fork and
//! takes it out at its exit (`FILTER_FOLLOW`). A named process that exits
//! leaves the map when the session sees its pidfd ready (`KernelFilter::exited`), so
//! a later process given the same pid is not kept. Cgroups are cgroup v2 directories,
//! kept with everything below them: one given at start (`--cgroup`), or a set replaced
//! while the session runs (`KernelFilter::set_cgroups`: the agent's pods, which come
//! and go), empty until the first is given.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cpi_common::policy::{FILTER_CGROUP, FILTER_FOLLOW, FILTER_TGID};
use cpi_common::wire::{MAX_CGROUP_LEVEL, MAX_FILTER_CGROUPS, MAX_FILTER_TGIDS};

use super::sys::{self, FilterMaps};
use super::CollectError;

/// What a filtered session keeps (a sample must pass each part that is given).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// These processes (all their threads); empty: any process.
    pub pids: Vec<u32>,
    /// This cgroup v2 directory and everything below it; `None`: any cgroup (unless
    /// `cgroups_later`).
    pub cgroup: Option<PathBuf>,
    /// The cgroups are given while the session runs (`Session::set_cgroups`); none is
    /// kept until then.
    pub cgroups_later: bool,
}

/// Where the systemd layouts mount cgroup v2: the unified layout at the first, the
/// hybrid one (v1 controllers beside it) at the second.
const CGROUP2_MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// The cgroup v2 mount point of this machine, `None` when there is none where systemd
/// puts it.
pub fn cgroup2_root() -> Option<&'static Path> {
    CGROUP2_MOUNTS
        .iter()
        .map(Path::new)
        .find(|p| sys::is_cgroup2(p).unwrap_or(false))
}

/// A cgroup v2 directory as the kernel names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupV2 {
    /// The cgroup id (`bpf_get_current_cgroup_id`): the directory's inode number.
    pub id: u64,
    /// Depth below the root cgroup (the root is 0).
    pub level: u32,
    /// Path from the root cgroup, as `/proc/PID/cgroup`'s `0::` line writes it (`/a/b`).
    pub path: String,
}

impl CgroupV2 {
    /// The cgroup at directory `dir`: its level is the number of parents on the same
    /// cgroup2 file system (the mount's parent is on another).
    pub fn at(dir: &Path) -> Result<CgroupV2, CollectError> {
        let not = || CollectError::NotCgroup(dir.to_path_buf());
        if !sys::is_cgroup2(dir).map_err(|_| not())? {
            return Err(not());
        }
        let meta = std::fs::metadata(dir).map_err(|_| not())?;
        let mut parts = Vec::new();
        let mut at = dir;
        while let Some(parent) = at.parent() {
            let same_fs = std::fs::metadata(parent).is_ok_and(|m| m.dev() == meta.dev())
                && sys::is_cgroup2(parent).unwrap_or(false);
            if !same_fs {
                break;
            }
            parts.push(
                at.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
            );
            at = parent;
        }
        parts.reverse();
        Ok(CgroupV2 {
            id: meta.ino(),
            level: parts.len() as u32,
            path: format!("/{}", parts.join("/")),
        })
    }
}

/// The allow-lists of a filtered session, as installed in the eBPF maps.
#[derive(Debug, Default)]
pub(crate) struct KernelFilter {
    tgids: BTreeSet<u32>,
    cgroup_check: CgroupCheck,
    cgroups: BTreeMap<u64, CgroupV2>,
    /// The processes' children are kept too, followed in the kernel.
    follow: bool,
}

/// Where samples are tested against the filter's `cgroups`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum CgroupCheck {
    /// Not filtered by cgroup.
    #[default]
    Off,
    InKernel,
    /// After collection, where the kernel cannot: [`KernelFilter::cgroup_in_user_space`].
    InUserSpace,
}

impl KernelFilter {
    /// The filter for `f` (its pids already resolved to processes).
    pub fn new(f: &Filter) -> Result<KernelFilter, CollectError> {
        if f.pids.len() > MAX_FILTER_TGIDS as usize {
            return Err(CollectError::Range(format!(
                "at most {MAX_FILTER_TGIDS} processes can be filtered in the kernel, not {}",
                f.pids.len()
            )));
        }
        let cgroups = f.cgroup.as_deref().map(CgroupV2::at).transpose()?;
        check_cgroups(cgroups.as_slice())?;
        Ok(KernelFilter {
            tgids: f.pids.iter().copied().collect(),
            cgroup_check: if f.cgroup.is_some() || f.cgroups_later {
                CgroupCheck::InKernel
            } else {
                CgroupCheck::Off
            },
            cgroups: cgroups.into_iter().map(|g| (g.id, g)).collect(),
            follow: false,
        })
    }

    /// The filter of `-p PIDS` (or, with none, of a command whose pid [`KernelFilter::allow`]
    /// adds once it is started) that keeps every process they fork from then on.
    pub fn following(pids: &[u32]) -> Result<KernelFilter, CollectError> {
        let mut f = KernelFilter::new(&Filter {
            pids: pids.to_vec(),
            ..Filter::default()
        })?;
        f.follow = true;
        Ok(f)
    }

    /// Keeps process `pid` too (a command started after the maps were filled).
    pub fn allow(&mut self, maps: &mut dyn FilterMaps, pid: u32) -> io::Result<()> {
        maps.allow_tgid(pid)?;
        self.tgids.insert(pid);
        Ok(())
    }

    /// Whether the eBPF program follows the processes' forks and exits.
    pub fn follows(&self) -> bool {
        self.follow
    }

    /// Filters nothing any more (the kernel could not follow the tree, so the events
    /// are per thread and follow it themselves).
    pub fn unfollow(&mut self, maps: &mut dyn FilterMaps) -> io::Result<()> {
        maps.set_filter_bits(0)?;
        *self = KernelFilter::default();
        Ok(())
    }

    /// Takes the processes gone (`alive` false) out of the tgid map, those the eBPF
    /// program added included, so the map holds the live part of the tree and a pid
    /// reused later is not kept; the number taken out. Only a following filter sweeps:
    /// the named processes of others leave by [`KernelFilter::exited`].
    pub fn sweep(
        &mut self,
        maps: &mut dyn FilterMaps,
        alive: &dyn Fn(u32) -> bool,
    ) -> io::Result<usize> {
        if !self.follow {
            return Ok(0);
        }
        let gone: Vec<u32> = maps
            .tgids_held()?
            .into_iter()
            .filter(|&t| !alive(t))
            .collect();
        for &t in &gone {
            // Already out (a removal racing ours) is as good.
            let _ = maps.remove_tgid(t);
            self.tgids.remove(&t);
        }
        Ok(gone.len())
    }

    fn in_kernel(&self) -> bool {
        self.cgroup_check == CgroupCheck::InKernel
    }

    /// `KernelConfig`'s `(filter, cgroup_levels)` for this filter.
    pub fn config(&self) -> (u32, u32) {
        let mut bits = 0;
        if !self.tgids.is_empty() || self.follow {
            bits |= FILTER_TGID;
        }
        if self.follow {
            bits |= FILTER_FOLLOW;
        }
        if self.in_kernel() {
            bits |= FILTER_CGROUP;
        }
        (bits, levels(self.cgroups.values()))
    }

    /// Writes the allow-lists into the maps (before the events are enabled).
    pub fn install(&self, maps: &mut dyn FilterMaps) -> io::Result<()> {
        for &t in &self.tgids {
            maps.allow_tgid(t)?;
        }
        if self.in_kernel() {
            for &id in self.cgroups.keys() {
                maps.allow_cgroup(id)?;
            }
        }
        Ok(())
    }

    /// Process `pid` exited: out of the tgid map, so a new process reusing its pid is
    /// not kept. A pid the filter does not name changes nothing.
    pub fn exited(&mut self, maps: &mut dyn FilterMaps, pid: u32) -> io::Result<()> {
        if self.tgids.remove(&pid) {
            maps.remove_tgid(pid)?;
        }
        Ok(())
    }

    /// Replaces the cgroups kept by `set` (a filter made with `cgroups_later`). A
    /// cgroup in both the old and the new set is kept throughout: the new ones and
    /// their levels go in before the old ones go out.
    pub fn set_cgroups(
        &mut self,
        maps: &mut dyn FilterMaps,
        set: Vec<CgroupV2>,
    ) -> Result<(), CollectError> {
        check_cgroups(&set)?;
        let new: BTreeMap<u64, CgroupV2> = set.into_iter().map(|g| (g.id, g)).collect();
        if self.in_kernel() {
            let (old_levels, new_levels) = (levels(self.cgroups.values()), levels(new.values()));
            maps.set_cgroup_levels(old_levels | new_levels)?;
            for id in new.keys().filter(|id| !self.cgroups.contains_key(id)) {
                maps.allow_cgroup(*id)?;
            }
            for id in self.cgroups.keys().filter(|id| !new.contains_key(id)) {
                maps.remove_cgroup(*id)?;
            }
            maps.set_cgroup_levels(new_levels)?;
        }
        self.cgroups = new;
        Ok(())
    }

    /// Leaves the cgroups to the user-space test: for kernels whose perf_event programs
    /// lack `bpf_get_current_ancestor_cgroup_id` (5.10). The note to show, if any.
    pub fn cgroup_in_user_space(&mut self) -> Option<String> {
        if self.cgroup_check == CgroupCheck::Off {
            return None;
        }
        self.cgroup_check = CgroupCheck::InUserSpace;
        let what = match self.cgroups.values().next() {
            Some(g) => format!("cgroup {}", g.path),
            None => "the cgroups of the pods selected".to_string(),
        };
        Some(format!(
            "note: this kernel lacks bpf_get_current_ancestor_cgroup_id for perf_event \
             programs: {what} filtered in user space, after collection"
        ))
    }

    /// The processes still kept by tgid.
    pub(crate) fn tgids(&self) -> impl Iterator<Item = u32> + '_ {
        self.tgids.iter().copied()
    }
}

/// Bit L set for each cgroup at level L.
fn levels<'a>(gs: impl Iterator<Item = &'a CgroupV2>) -> u32 {
    gs.fold(0, |bits, g| bits | 1 << g.level)
}

/// Whether the kernel filter can hold `set`: few enough, none too deep.
fn check_cgroups(set: &[CgroupV2]) -> Result<(), CollectError> {
    if set.len() > MAX_FILTER_CGROUPS as usize {
        return Err(CollectError::Range(format!(
            "at most {MAX_FILTER_CGROUPS} cgroups can be filtered in the kernel, not {}",
            set.len()
        )));
    }
    match set.iter().find(|g| g.level > MAX_CGROUP_LEVEL) {
        Some(g) => Err(CollectError::Range(format!(
            "cgroup {} is {} levels deep; the kernel filter reaches {MAX_CGROUP_LEVEL}",
            g.path, g.level
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::sys::fake::{FakeMaps, MapCall};

    #[test]
    fn an_exited_process_leaves_the_tgid_map_once() {
        let mut f = KernelFilter::new(&Filter {
            pids: vec![100, 200],
            ..Filter::default()
        })
        .unwrap();
        assert_eq!(f.config(), (FILTER_TGID, 0));
        let mut maps = FakeMaps::default();
        f.install(&mut maps).unwrap();
        assert_eq!(
            maps.calls,
            [MapCall::AllowTgid(100), MapCall::AllowTgid(200)]
        );
        f.exited(&mut maps, 100).unwrap();
        // Seen again (or a pid the filter never named): nothing to remove.
        f.exited(&mut maps, 100).unwrap();
        f.exited(&mut maps, 300).unwrap();
        assert_eq!(maps.calls[2..], [MapCall::RemoveTgid(100)]);
        assert_eq!(f.tgids().collect::<Vec<_>>(), [200]);
        assert_eq!(maps.allowed_tgids(), [200]);
    }

    #[test]
    fn a_following_filter_keeps_by_tgid_before_its_command_is_known() {
        // A command's filter is made before the command exists: the program must still
        // filter by tgid (keeping nothing), and follow forks from the pid added later.
        let mut f = KernelFilter::following(&[]).unwrap();
        assert!(f.follows());
        assert_eq!(f.config(), (FILTER_TGID | FILTER_FOLLOW, 0));
        let mut maps = FakeMaps::default();
        f.install(&mut maps).unwrap();
        assert!(maps.calls.is_empty());
        f.allow(&mut maps, 42).unwrap();
        assert_eq!(maps.allowed_tgids(), [42]);
        assert_eq!(f.tgids().collect::<Vec<_>>(), [42]);
        // The agent's filter by pid does not follow.
        let named = KernelFilter::new(&Filter {
            pids: vec![42],
            ..Filter::default()
        })
        .unwrap();
        assert!(!named.follows());
        assert_eq!(named.config(), (FILTER_TGID, 0));
    }

    #[test]
    fn a_sweep_takes_out_only_the_processes_gone() {
        let mut f = KernelFilter::following(&[10]).unwrap();
        let mut maps = FakeMaps::default();
        f.install(&mut maps).unwrap();
        // Children the kernel added: 11 and 12; 10 and 12 have exited.
        maps.calls.push(MapCall::AllowTgid(11));
        maps.calls.push(MapCall::AllowTgid(12));
        let alive = |t: u32| t == 11;
        assert_eq!(f.sweep(&mut maps, &alive).unwrap(), 2);
        assert_eq!(maps.allowed_tgids(), [11]);
        assert_eq!(f.tgids().count(), 0);
        assert_eq!(f.sweep(&mut maps, &alive).unwrap(), 0);
        // The agent's named processes are not swept: they leave at their pidfd.
        let mut named = KernelFilter::new(&Filter {
            pids: vec![10],
            ..Filter::default()
        })
        .unwrap();
        named.install(&mut maps).unwrap();
        assert_eq!(named.sweep(&mut maps, &|_| false).unwrap(), 0);
        // Unfollowing clears the program's bits.
        f.unfollow(&mut maps).unwrap();
        assert_eq!(maps.calls.last(), Some(&MapCall::FilterBits(0)));
        assert_eq!(f.config(), (0, 0));
    }

    #[test]
    fn a_removal_the_kernel_refuses_is_an_error() {
        let mut f = KernelFilter::new(&Filter {
            pids: vec![7],
            ..Filter::default()
        })
        .unwrap();
        let mut maps = FakeMaps {
            fail_remove: true,
            ..FakeMaps::default()
        };
        f.install(&mut maps).unwrap();
        assert!(f.exited(&mut maps, 7).is_err());
    }

    #[test]
    fn a_cgroup_is_its_inode_and_depth_below_the_cgroup2_mount() {
        let Some(root) = cgroup2_root() else {
            // Every machine of this kind mounts cgroup2 (ENVIRONMENT.md); elsewhere say so.
            assert!(std::env::var_os("CI").is_none(), "no cgroup2 mount");
            eprintln!("skipped: no cgroup2 mount");
            return;
        };
        let g = CgroupV2::at(root).unwrap();
        assert_eq!((g.level, g.path.as_str()), (0, "/"));
        assert_eq!(g.id, std::fs::metadata(root).unwrap().ino());
        // Our own cgroup, as /proc/self/cgroup names it, is found at its depth.
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let dir = root.join(own.trim_start_matches('/'));
        let g = CgroupV2::at(&dir).unwrap();
        assert_eq!(g.path, own);
        assert_eq!(
            g.level as usize,
            own.split('/').filter(|s| !s.is_empty()).count()
        );
        let k = KernelFilter::new(&Filter {
            cgroup: Some(dir),
            ..Filter::default()
        })
        .unwrap();
        assert_eq!(k.config(), (FILTER_CGROUP, 1 << g.level));
        let mut maps = FakeMaps::default();
        k.install(&mut maps).unwrap();
        assert_eq!(maps.calls, [MapCall::AllowCgroup(g.id)]);
        assert!(matches!(
            CgroupV2::at(Path::new("/proc")),
            Err(CollectError::NotCgroup(_))
        ));
    }

    fn cg(id: u64, level: u32) -> CgroupV2 {
        CgroupV2 {
            id,
            level,
            path: format!("/c{id}"),
        }
    }

    #[test]
    fn cgroups_given_later_replace_the_set_without_a_gap() {
        let mut f = KernelFilter::new(&Filter {
            cgroups_later: true,
            ..Filter::default()
        })
        .unwrap();
        // Nothing kept until the first set.
        assert_eq!(f.config(), (FILTER_CGROUP, 0));
        let mut maps = FakeMaps::default();
        f.install(&mut maps).unwrap();
        assert!(maps.calls.is_empty());
        f.set_cgroups(&mut maps, vec![cg(10, 2), cg(11, 3)])
            .unwrap();
        assert_eq!(
            maps.calls,
            [
                MapCall::Levels(0b1100),
                MapCall::AllowCgroup(10),
                MapCall::AllowCgroup(11),
                MapCall::Levels(0b1100),
            ]
        );
        maps.calls.clear();
        // 11 stays, 10 goes, 12 (level 4) comes: levels widen first, narrow last.
        f.set_cgroups(&mut maps, vec![cg(11, 3), cg(12, 4)])
            .unwrap();
        assert_eq!(
            maps.calls,
            [
                MapCall::Levels(0b11100),
                MapCall::AllowCgroup(12),
                MapCall::RemoveCgroup(10),
                MapCall::Levels(0b11000),
            ]
        );
        assert_eq!(f.config(), (FILTER_CGROUP, 0b11000));
        // Bounded: too many, or too deep, is refused and changes nothing.
        let many: Vec<CgroupV2> = (0..=MAX_FILTER_CGROUPS as u64).map(|i| cg(i, 1)).collect();
        assert!(f.set_cgroups(&mut maps, many).is_err());
        assert!(f.set_cgroups(&mut maps, vec![cg(1, 40)]).is_err());
        assert_eq!(f.config(), (FILTER_CGROUP, 0b11000));
        // A kernel without the ancestor helper: the set is kept for user space only.
        let mut f = KernelFilter::new(&Filter {
            cgroups_later: true,
            ..Filter::default()
        })
        .unwrap();
        assert!(f.cgroup_in_user_space().unwrap().contains("pods selected"));
        maps.calls.clear();
        f.set_cgroups(&mut maps, vec![cg(10, 2)]).unwrap();
        assert!(maps.calls.is_empty());
        assert_eq!(f.config(), (0, 0b100));
    }
}
