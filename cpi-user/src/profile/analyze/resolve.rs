//! Address resolution: a process's runtime addresses (IP samples, taken branches,
//! ranges, stack frames) symbolised once each into the functions they hit, and the
//! per-function work gathered for [`super::function`]. What cannot be resolved is
//! counted in the loss report here, so nothing is dropped silently.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cpi_common::wire::EventRole;

use super::estimate::{role_index, Tally, ROLES};
use super::{sorted, Ctx};

use crate::binary::{Binary, CodeObject, Function, Resolved, Symbolizer};
use crate::fsafe::behalf::Owner;
use crate::procmap::ProcessMaps;
use crate::profile::aggregate::{ProcessSamples, RangeStat, TakenStat};
use crate::profile::flow::check_span;
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
    /// Ranges that run through several functions, by runtime (start, end): their
    /// pieces, `None` when invalid ([`ProcessResolver::range_pieces`]).
    spans: HashMap<(u64, u64), Option<Pieces>>,
}

/// A range cut at function ends: (function index, start, end in its binary) each.
pub(super) type Pieces = Vec<(usize, u64, u64)>;

/// Functions one range may run through: a straight line of code falls into a
/// next function only where that one is a continuation (assembly entry points, a
/// `.cold` part), so a few suffice; past this the range is taken for garbage.
const MAX_PIECES: usize = 16;

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

    /// Range `[start, end]` (runtime addresses) cut into one piece per function it ran
    /// in; `None` when it is invalid. A range inside one ELF function is that one piece,
    /// checked when the function is analysed ([`crate::profile::flow::count_ranges`]).
    /// One that starts and ends in different functions of one binary ran off the end of
    /// each function into the next, as hardware records code that ends without a jump
    /// (libc's assembly does): it is checked here, all pieces or none — every piece
    /// but the last must run to its function's end through instructions that fall
    /// through, and every piece must decode.
    pub(super) fn range_pieces(
        &mut self,
        sym: &mut Symbolizer,
        binaries: &mut BTreeMap<String, BinaryInfo>,
        start: u64,
        end: u64,
    ) -> Option<Pieces> {
        let (fs, vs) = self.resolve(sym, binaries, start)?;
        let (fe, ve) = self.resolve(sym, binaries, end)?;
        let CodeObject::Elf(bin) = &self.funcs[fs].object else {
            return None;
        };
        if fs == fe {
            return Some(vec![(fs, vs, ve)]);
        }
        let same_file = matches!(&self.funcs[fe].object, CodeObject::Elf(b) if Arc::ptr_eq(b, bin));
        // Both ends in one stretch of one mapping: the binary's addresses run as the
        // process's do.
        if !same_file || end < start || ve.checked_sub(vs) != Some(end - start) {
            return None;
        }
        if let Some(p) = self.spans.get(&(start, end)) {
            return p.clone();
        }
        let bin = Arc::clone(bin);
        let p = self.span(sym, binaries, &bin, (start, vs), ve);
        self.spans.insert((start, end), p.clone());
        p
    }

    /// The pieces of a range from `vs` (at runtime `start`) to `ve` in `bin`, which
    /// start and end in different functions; `None` if any piece is invalid.
    fn span(
        &mut self,
        sym: &mut Symbolizer,
        binaries: &mut BTreeMap<String, BinaryInfo>,
        bin: &Arc<Binary>,
        (start, vs): (u64, u64),
        ve: u64,
    ) -> Option<Pieces> {
        let mut pieces = Vec::new();
        let mut at = vs;
        while pieces.len() < MAX_PIECES {
            let f = bin.function_or_hole(at)?;
            let instructions = match sym.decode(bin, &f) {
                Ok(i) => i,
                Err(e) => {
                    log::debug!("{}", crate::chain(&e));
                    return None;
                }
            };
            let last_piece = ve < f.end();
            let piece_end = if last_piece {
                ve
            } else {
                instructions.last().filter(|i| i.next() == f.end())?.addr
            };
            check_span(&instructions, at, piece_end, !last_piece).ok()?;
            let (fi, v) = self.resolve(sym, binaries, start + (at - vs))?;
            (v == at && self.funcs[fi].function.start == f.start).then_some(())?;
            pieces.push((fi, at, piece_end));
            if last_piece {
                return Some(pieces);
            }
            at = f.end();
        }
        None
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
            spans: HashMap::new(),
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
            match res.range_pieces(self.sym, &mut self.binaries, start, end) {
                Some(pieces) => {
                    let stat = piece_stat(stat, pieces.len());
                    for (fi, vs, ve) in pieces {
                        // A range start is a branch target too (of the oldest entry,
                        // whose own edge lies outside the window).
                        res.funcs[fi].leaders.push(vs);
                        res.funcs[fi].ranges.push((vs, ve, stat));
                    }
                }
                None => self.lost.invalid_ranges += stat.hits,
            }
        }
    }
}

/// What each of a range's `pieces` counts: all of it, but a range over several
/// functions times none of them: its LBR cycles cannot be split between them (as a
/// block's timed CPI takes only ranges inside the block, `profile/flow.rs`).
fn piece_stat(stat: RangeStat, pieces: usize) -> RangeStat {
    if pieces == 1 {
        return stat;
    }
    RangeStat {
        timed_cycles: 0.0,
        timed_count: 0.0,
        timed_hits: 0,
        timed_samples: 0,
        timed_cycles_groups: Default::default(),
        timed_count_groups: Default::default(),
        ..stat
    }
}

fn note_binary(binaries: &mut BTreeMap<String, BinaryInfo>, r: &Resolved) {
    let (build_id, stripped, owner) = match &r.object {
        CodeObject::Elf(b) => (b.build_id.clone(), b.stripped(), b.owner),
        _ => (None, false, None),
    };
    if let Some(known) = binaries.get_mut(&r.object_name) {
        // Two files at one path (two processes' mount namespaces): whoever could have
        // written either.
        known.owner = Owner::both(known.owner, owner);
        return;
    }
    binaries.insert(
        r.object_name.clone(),
        BinaryInfo {
            path: r.object_name.clone(),
            build_id,
            deleted: r.deleted,
            stripped,
            owner,
        },
    );
}
