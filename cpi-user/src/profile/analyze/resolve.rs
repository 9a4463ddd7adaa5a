//! Address resolution: a process's runtime addresses (IP samples, taken branches,
//! ranges, stack frames) symbolised once each into the functions they hit, and the
//! per-function work gathered for [`super::function`]. What cannot be resolved is
//! counted in the loss report here, so nothing is dropped silently.

use std::collections::{BTreeMap, HashMap};

use cpi_common::wire::EventRole;

use super::estimate::{role_index, Tally, ROLES};
use super::{sorted, Ctx};
use crate::binary::{CodeObject, Function, Resolved, Symbolizer};
use crate::procmap::ProcessMaps;
use crate::profile::aggregate::{ProcessSamples, RangeStat, TakenStat};
use crate::profile::model::BinaryInfo;

/// A taken branch leaving a function: where it goes, if known.
pub(super) struct TakenWork {
    pub(super) from: u64,
    /// (function index, address in its binary).
    pub(super) to: Option<(usize, u64)>,
    pub(super) stat: TakenStat,
}

/// What was gathered for one function of one process.
pub(super) struct FunctionWork {
    pub(super) object: CodeObject,
    pub(super) object_name: String,
    pub(super) function: Function,
    /// The function's name as people read it (demangled once: profile functions, calls,
    /// edges and stack frames all use it).
    pub(super) name: String,
    /// vaddr → tallies per role.
    pub(super) ips: BTreeMap<u64, [Tally; ROLES]>,
    /// (start, end) in binary addresses.
    pub(super) ranges: Vec<(u64, u64, RangeStat)>,
    pub(super) taken: Vec<TakenWork>,
    /// Branch-record targets inside this function.
    pub(super) leaders: Vec<u64>,
}

impl FunctionWork {
    pub(super) fn key(&self) -> FuncKey {
        (self.object_name.clone(), self.function.start)
    }

    /// Anything of its own to report (not just a branch target seen at a window edge).
    pub(super) fn has_evidence(&self) -> bool {
        !(self.ips.is_empty() && self.ranges.is_empty() && self.taken.is_empty())
    }

    pub(super) fn total(&self, role: EventRole) -> Tally {
        let mut t = Tally::default();
        for v in self.ips.values() {
            t.add(&v[role_index(role)]);
        }
        t
    }
}

/// Key of a function within a process: (object name, start address).
pub(super) type FuncKey = (String, u64);

/// Symbolises one process's addresses once each and collects the functions they hit.
pub(super) struct ProcessResolver<'a> {
    pid: u32,
    maps: &'a ProcessMaps,
    cache: HashMap<u64, Option<(usize, u64)>>,
    index: HashMap<FuncKey, usize>,
    pub(super) funcs: Vec<FunctionWork>,
}

impl<'a> ProcessResolver<'a> {
    /// (function index, address in the binary) of a runtime address.
    pub(super) fn resolve(
        &mut self,
        sym: &mut Symbolizer,
        binaries: &mut BTreeMap<String, BinaryInfo>,
        addr: u64,
    ) -> Option<(usize, u64)> {
        if let Some(&r) = self.cache.get(&addr) {
            return r;
        }
        let r = match sym.resolve(self.pid, self.maps, addr) {
            Ok(r) => {
                note_binary(binaries, &r);
                let key = (r.object_name.clone(), r.function.start);
                let vaddr = r.vaddr;
                let i = *self.index.entry(key).or_insert_with(|| {
                    self.funcs.push(FunctionWork {
                        name: sym.display_name(&r),
                        object: r.object,
                        object_name: r.object_name,
                        function: r.function,
                        ips: BTreeMap::new(),
                        ranges: Vec::new(),
                        taken: Vec::new(),
                        leaders: Vec::new(),
                    });
                    self.funcs.len() - 1
                });
                Some((i, vaddr))
            }
            Err(e) => {
                log::debug!("{}", crate::chain(&e));
                None
            }
        };
        self.cache.insert(addr, r);
        r
    }
}

impl Ctx<'_> {
    /// Symbolises one process's samples into per-function work.
    pub(super) fn gather<'m>(
        &mut self,
        p: &ProcessSamples,
        maps: &'m ProcessMaps,
    ) -> ProcessResolver<'m> {
        self.lost.short_samples += p.branches.short_samples;
        self.lost.invalid_ranges += p.branches.backward_ranges;
        let mut res = ProcessResolver {
            pid: p.pid,
            maps,
            cache: HashMap::new(),
            index: HashMap::new(),
            funcs: Vec::new(),
        };
        for (&role, agg) in &p.ips {
            // Sorted: the aggregate's hash order must not change float sums between
            // two analyses of the same samples.
            for (&ip, (samples, weight, groups)) in sorted(&agg.by_ip) {
                match res.resolve(self.sym, &mut self.binaries, ip) {
                    Some((i, vaddr)) => res.funcs[i].ips.entry(vaddr).or_default()
                        [role_index(role)]
                    .add_parts(*samples, *weight, groups.as_deref()),
                    None => self.lost.unmapped_samples += samples,
                }
            }
        }
        if self.mode.uses_ranges() {
            self.gather_branches(p, &mut res);
        }
        res
    }

    /// Attaches taken edges and ranges to functions; ranges that do not start and end
    /// in one function are invalid.
    fn gather_branches(&mut self, p: &ProcessSamples, res: &mut ProcessResolver<'_>) {
        for (&(from, to), stat) in sorted(p.branches.taken()) {
            let src = res.resolve(self.sym, &mut self.binaries, from);
            let dst = res.resolve(self.sym, &mut self.binaries, to);
            if let Some((ti, vto)) = dst {
                res.funcs[ti].leaders.push(vto);
            }
            if let Some((fi, vfrom)) = src {
                res.funcs[fi].taken.push(TakenWork {
                    from: vfrom,
                    to: dst,
                    stat: *stat,
                });
            }
        }
        let mut ranges: Vec<_> = p.branches.ranges().collect();
        ranges.sort_unstable_by_key(|r| r.0);
        for ((start, end), stat) in ranges {
            let s = res.resolve(self.sym, &mut self.binaries, start);
            let e = res.resolve(self.sym, &mut self.binaries, end);
            match (s, e) {
                (Some((fs, vs)), Some((fe, ve)))
                    if fs == fe && matches!(res.funcs[fs].object, CodeObject::Elf(_)) =>
                {
                    // A range start is a branch target too (of the oldest entry,
                    // whose own edge lies outside the window).
                    res.funcs[fs].leaders.push(vs);
                    res.funcs[fs].ranges.push((vs, ve, stat));
                }
                _ => self.lost.invalid_ranges += stat.hits,
            }
        }
    }
}

fn note_binary(binaries: &mut BTreeMap<String, BinaryInfo>, r: &Resolved) {
    if binaries.contains_key(&r.object_name) {
        return;
    }
    let (build_id, stripped) = match &r.object {
        CodeObject::Elf(b) => (b.build_id.clone(), b.stripped()),
        _ => (None, false),
    };
    binaries.insert(
        r.object_name.clone(),
        BinaryInfo {
            path: r.object_name.clone(),
            build_id,
            deleted: r.deleted,
            stripped,
        },
    );
}
