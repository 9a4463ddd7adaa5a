//! Call paths (see "Call paths" in [`super`]'s doc): a process's stacks symbolised
//! frame by frame, summed by the functions they name, their ranges' instructions given
//! to the path that ran them, then ranked and bounded ([`crate::profile::paths`]).

use std::collections::{BTreeMap, HashMap};

use cpi_common::wire::EventRole;

use super::estimate::estimate;
use super::resolve::ProcessResolver;
use super::{sample_role, sorted, Ctx};
use crate::profile::aggregate::ProcessSamples;
use crate::profile::error::{self, Groups};
use crate::profile::model::{StackFrame, StackProfile};
use crate::profile::paths::{
    bound_paths, fold_plan, pseudo_path, rare_frames, Fold, DROPPED_FRAME, MAX_PATHS,
    NO_STACK_FRAME,
};
use crate::profile::stack::{CallStack, StackEnd, StackStat, FOLDED_LEAF};

impl Ctx<'_> {
    /// The process's call paths (see "Call paths" in the module doc).
    pub(super) fn stacks(
        &mut self,
        p: &ProcessSamples,
        res: &mut ProcessResolver<'_>,
        lens: &HashMap<(usize, u64, u64), u64>,
    ) -> Vec<StackProfile> {
        let agg = &p.stacks;
        if agg.is_empty() && agg.dropped.samples() == 0 {
            return Vec::new();
        }
        let role = sample_role(self.mode);
        let ranged = self.mode.uses_ranges();
        // Paths are summed and ranked by compact frames (a function's index, an
        // address); names are written out only for the paths the profile keeps: deep
        // stacks named frame by frame cost ~20× their addresses (seen: +60 MiB for a
        // moment in an agent sampling rustc).
        let mut names = FrameNames::default();
        let mut paths: BTreeMap<Vec<u32>, PathAcc> = BTreeMap::new();
        let mut entries: Vec<(CallStack, &StackStat)> = agg.iter().collect();
        entries.sort_unstable_by(|a, b| {
            (&a.0.kernel, &a.0.user, a.0.end as u8).cmp(&(&b.0.kernel, &b.0.user, b.0.end as u8))
        });
        let mut stacked = PathAcc::default();
        // Every stack's own path first, so a path keeps the frames (addresses) of a
        // stack that ran it rather than of a callee path a range implied.
        let mut symbolised = Vec::with_capacity(entries.len());
        for (mut stack, stat) in entries {
            // What evicted stacks held under these callers (cpi-user/src/profile/stack.rs
            // `evict_used_by`): every range and sample of it is its own.
            let folded = stack.user.first() == Some(&FOLDED_LEAF);
            if folded {
                stack.user = stack.user[1..].into();
            }
            let frames = self.frames(&stack, res);
            stacked.add_ips(stat, role);
            let acc = path_acc(&mut paths, &mut names, res, &frames, stack.end, folded);
            acc.add_ips(stat, role);
            acc.branch_samples += stat.branch_samples;
            symbolised.push((stack.end, stat, frames, folded));
        }
        for (end_of_stack, stat, frames, folded) in symbolised {
            if !ranged {
                break;
            }
            for (&(start, end), r) in sorted(agg.ranges_of(stat)) {
                // Ranges the process drops (counted in `lost.invalid_ranges`) are
                // dropped here too; one over several functions gives each its piece.
                let pieces = res
                    .range_pieces(self.sym, &mut self.binaries, start, end)
                    .unwrap_or_default();
                // The frame of the range's functions that the stack holds: a function
                // run into from it (or into it) ran in that same call.
                let held = pieces
                    .iter()
                    .find_map(|p| frames.iter().position(|f| f.func == Some(p.0)));
                for &(fs, vs, ve) in &pieces {
                    let Some(&n) = lens.get(&(fs, vs, ve)) else {
                        continue;
                    };
                    let target = match folded {
                        true => frames.clone(),
                        false => range_path(&frames, fs, held, res),
                    };
                    let acc = path_acc(&mut paths, &mut names, res, &target, end_of_stack, folded);
                    acc.instructions += r.count * n as f64;
                    acc.instruction_groups.add_scaled(&r.groups, n as f64);
                    acc.range_hits += r.hits;
                }
            }
        }
        // What no stack holds: evicted stacks, and samples without a stack (the
        // process's IP samples less those under stacks, kept or evicted).
        let mut dropped = PathAcc::default();
        dropped.add_ips(&agg.dropped, role);
        dropped.branch_samples = agg.dropped.branch_samples;
        // The widest paths keep their frames (room left for `[dropped]` and
        // `[no stack]`); the rest fold into `[rare callees]` paths under their callers.
        let floor = self.opts.sample_floor;
        let mut out: Vec<StackProfile> = fold_rare(paths)
            .into_iter()
            .map(|a| {
                let named: Vec<StackFrame> = a.frames.iter().map(|f| f.named(res)).collect();
                let frames = if a.rare { rare_frames(&named) } else { named };
                a.into_path(frames, ranged, floor)
            })
            .collect();
        let no_stack = no_stack(p, &stacked, role);
        for (name, mut a) in [(DROPPED_FRAME, dropped), (NO_STACK_FRAME, no_stack)] {
            if a.samples + a.branch_samples > 0 {
                a.end = StackEnd::Truncated;
                out.push(a.into_path(pseudo_path(name).frames, ranged, floor));
            }
        }
        bound_paths(&mut out, floor);
        out
    }

    /// The frames of `stack`, leaf first (kernel, then user): each one's function (index
    /// into `res.funcs`) and address in its binary; `None` and the runtime address where
    /// an address maps to nothing.
    fn frames(&mut self, stack: &CallStack, res: &mut ProcessResolver<'_>) -> Vec<FrameRef> {
        let user = stack.user.iter().enumerate().map(|(i, &a)| (a, i > 0));
        let all = stack.kernel.iter().map(|&a| (a, false)).chain(user);
        all.map(|(addr, is_return)| {
            // A return address follows its call: look the call up.
            let at = if is_return {
                addr.saturating_sub(1)
            } else {
                addr
            };
            match res.resolve(self.sym, &mut self.binaries, at) {
                Some((i, vaddr)) => FrameRef {
                    func: Some(i),
                    address: vaddr + u64::from(is_return),
                },
                None => FrameRef {
                    func: None,
                    address: addr,
                },
            }
        })
        .collect()
    }
}

/// One frame of a path being summed: its function (an index into the resolver's
/// functions; `None`: no function, `[unknown]`) and address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameRef {
    func: Option<usize>,
    address: u64,
}

impl FrameRef {
    fn named(&self, res: &ProcessResolver<'_>) -> StackFrame {
        match self.func {
            Some(i) => StackFrame {
                function: res.funcs[i].name.clone(),
                binary: res.funcs[i].object_name.clone(),
                address: self.address,
            },
            None => StackFrame {
                function: "[unknown]".into(),
                binary: String::new(),
                address: self.address,
            },
        }
    }
}

/// Paths are summed by (function name, binary) frame by frame, as the profile names
/// them: one id per distinct pair.
#[derive(Default)]
struct FrameNames {
    by_func: HashMap<Option<usize>, u32>,
    by_name: HashMap<(String, String), u32>,
}

impl FrameNames {
    fn id(&mut self, f: &FrameRef, res: &ProcessResolver<'_>) -> u32 {
        if let Some(&id) = self.by_func.get(&f.func) {
            return id;
        }
        let named = f.named(res);
        let next = self.by_name.len() as u32;
        let id = *self
            .by_name
            .entry((named.function, named.binary))
            .or_insert(next);
        self.by_func.insert(f.func, id);
        id
    }
}

/// One call path being summed from the stacks.
#[derive(Default)]
struct PathAcc {
    frames: Vec<FrameRef>,
    /// A `[rare callees]` path: `frames` are its callers'.
    rare: bool,
    end: StackEnd,
    /// IP samples and Σ periods per role.
    ips: BTreeMap<EventRole, (u64, u64)>,
    samples: u64,
    cycles_groups: Groups,
    branch_samples: u64,
    instructions: f64,
    instruction_groups: Groups,
    range_hits: u64,
}

impl PathAcc {
    /// Adds the IP samples of a stack; `role` counts as the path's samples.
    fn add_ips(&mut self, stat: &StackStat, role: EventRole) {
        for (&r, &(n, w)) in &stat.ips {
            let e = self.ips.entry(r).or_default();
            e.0 += n;
            e.1 += w;
            if r == role {
                self.samples += n;
            }
        }
        self.cycles_groups.add_scaled(&stat.cycles_groups, 1.0);
    }

    /// What the path weighs in orderings: cycles, else time, else samples (as
    /// cpi-user/src/profile/paths.rs `weight` ranks the named paths).
    fn weight(&self) -> f64 {
        [EventRole::Cycles, EventRole::CpuClock]
            .iter()
            .find_map(|r| self.ips.get(r).map(|v| v.1 as f64))
            .unwrap_or(self.samples as f64)
    }

    /// Adds everything of `o` (a path folded into this one) but its frames and end.
    fn absorb(&mut self, o: PathAcc) {
        for (r, (n, w)) in o.ips {
            let e = self.ips.entry(r).or_default();
            e.0 += n;
            e.1 += w;
        }
        self.samples += o.samples;
        self.cycles_groups.add_scaled(&o.cycles_groups, 1.0);
        self.branch_samples += o.branch_samples;
        self.instructions += o.instructions;
        self.instruction_groups
            .add_scaled(&o.instruction_groups, 1.0);
        self.range_hits += o.range_hits;
    }

    fn into_path(self, frames: Vec<StackFrame>, ranged: bool, floor: u64) -> StackProfile {
        let weight = |r: EventRole| self.ips.get(&r).map(|v| v.1 as f64);
        let cycles = weight(EventRole::Cycles);
        let cycles_rel_error = cycles.map(|c| error::relative(c, self.cycles_groups.variance()));
        let n = self.instructions;
        let (instructions, instructions_rel_error) = if ranged && self.range_hits > 0 {
            (
                Some(n),
                Some(error::relative(n, self.instruction_groups.variance())),
            )
        } else {
            (None, None)
        };
        let cpi = match (cycles, cycles_rel_error, instructions_rel_error) {
            (Some(c), Some(rc), Some(ri)) => {
                let cycle_samples = self.ips.get(&EventRole::Cycles).map_or(0, |v| v.0);
                estimate(
                    c,
                    n,
                    error::quotient(rc, ri),
                    cycle_samples.min(self.range_hits),
                    floor,
                )
            }
            _ => None,
        };
        StackProfile {
            frames,
            end: self.end,
            samples: self.samples,
            branch_samples: self.branch_samples,
            time_ns: weight(EventRole::CpuClock),
            cycles,
            instructions,
            cpi,
            cycles_rel_error,
            instructions_rel_error,
            range_hits: self.range_hits,
        }
    }
}

/// `paths` (keyed by their frames' name ids, leaf first) bounded by
/// [`crate::profile::paths::fold_plan`]: the paths kept, and a `[rare callees]` path
/// (`rare`, its frames those of the callers) for each caller the others fold under.
fn fold_rare(paths: BTreeMap<Vec<u32>, PathAcc>) -> Vec<PathAcc> {
    let keyed: Vec<(Vec<u32>, PathAcc)> = paths.into_iter().collect();
    let plan = {
        let weighed: Vec<(&[u32], f64)> = keyed.iter().map(|(k, a)| (&k[..], a.weight())).collect();
        fold_plan(&weighed, MAX_PATHS - 2)
    };
    let mut out = Vec::new();
    let mut rare: BTreeMap<Vec<u32>, PathAcc> = BTreeMap::new();
    for ((key, acc), fold) in keyed.into_iter().zip(plan) {
        // A `[rare callees]` path of the stacks (evicted ones) joins the plan's under
        // the same callers.
        let n = match fold {
            Fold::Keep if acc.rare => key.len() - 1,
            Fold::Keep => {
                out.push(acc);
                continue;
            }
            Fold::Into(n) => n,
        };
        let sum = rare
            .entry(key[key.len() - n..].to_vec())
            .or_insert_with(|| PathAcc {
                frames: acc.frames[acc.frames.len() - n..].to_vec(),
                rare: true,
                ..Default::default()
            });
        if sum.end == StackEnd::Complete {
            sum.end = acc.end;
        }
        sum.absorb(acc);
    }
    out.extend(rare.into_values());
    out
}

/// The path a range of function `fs` goes to, under a stack of `frames` (see "Call
/// paths" in [`super`]'s doc). `held`: the frame of a function the same range also ran
/// in (one range over several functions ran off the end of each into the next, all in
/// one call).
fn range_path(
    frames: &[FrameRef],
    fs: usize,
    held: Option<usize>,
    res: &ProcessResolver<'_>,
) -> Vec<FrameRef> {
    let own = FrameRef {
        func: Some(fs),
        address: res.funcs[fs].function.start,
    };
    match (frames.iter().position(|f| f.func == Some(fs)), held) {
        // The leaf's function, or a caller's: that frame's path.
        (Some(k), _) => frames[k..].to_vec(),
        // Run into from (or into) the function of frame `k`: in its call, under its
        // callers.
        (None, Some(k)) => std::iter::once(own)
            .chain(frames[k + 1..].iter().copied())
            .collect(),
        // A function not on the stack: a callee of the leaf that returned within the
        // window.
        (None, None) => std::iter::once(own).chain(frames.iter().copied()).collect(),
    }
}

/// The samples without a stack: the process's IP samples less those under its stacks
/// (`stacked`, kept, or evicted), and its branch samples that had none.
fn no_stack(p: &ProcessSamples, stacked: &PathAcc, role: EventRole) -> PathAcc {
    let agg = &p.stacks;
    let mut no_stack = PathAcc::default();
    for (&r, a) in &p.ips {
        let (n, w) = stacked.ips.get(&r).copied().unwrap_or_default();
        let (dn, dw) = agg.dropped.ips.get(&r).copied().unwrap_or_default();
        let mut one = StackStat::default();
        one.ips.insert(
            r,
            (
                a.samples.saturating_sub(n + dn),
                a.weight.saturating_sub(w + dw),
            ),
        );
        no_stack.add_ips(&one, role);
    }
    // `unstacked` counts samples of both kinds.
    let ip_unstacked: u64 = no_stack.ips.values().map(|v| v.0).sum();
    no_stack.branch_samples = agg.unstacked.saturating_sub(ip_unstacked);
    no_stack
}

/// The frame id of a `[rare callees]` leaf in a path's key (names' ids count up from 0).
const RARE_ID: u32 = u32::MAX;

/// The path of `frames` in `paths`, added empty when new; with `rare`, the
/// `[rare callees]` path under them.
fn path_acc<'p>(
    paths: &'p mut BTreeMap<Vec<u32>, PathAcc>,
    names: &mut FrameNames,
    res: &ProcessResolver<'_>,
    frames: &[FrameRef],
    end: StackEnd,
    rare: bool,
) -> &'p mut PathAcc {
    let leaf = rare.then_some(RARE_ID);
    let key = leaf
        .into_iter()
        .chain(frames.iter().map(|f| names.id(f, res)))
        .collect();
    let acc = paths.entry(key).or_insert_with(|| PathAcc {
        frames: frames.to_vec(),
        rare,
        end,
        ..Default::default()
    });
    if acc.end == StackEnd::Complete {
        acc.end = end;
    }
    acc
}
