//! The exact truth per call path, and the profile's paths judged by it.
//!
//! A path is its chain of function names, leaf first, cut at `MAX_USER_FRAMES` frames
//! as a sampled stack is; its exact instructions and cycles are those of the
//! instructions that ran in the leaf function with that stack (the replay's calling
//! contexts, cpi-user/src/sim/shadow.rs).
//!
//! Memory is linear in the calling contexts: each context's caller chain is interned
//! as a representative context (chains compared by walking the context tree, found by
//! a hash of the chain), so a path is two numbers, never a chain of names per context
//! or per path (a 10 000-deep recursion through changing functions made a distinct
//! 127-name chain per context: 5.8 GiB for twenty chains, BENCHMARKS.md "Call paths of
//! cc1 and python3 under `simulate`"). Names are written out only for the paths a
//! report lists.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use cpi_common::wire::MAX_USER_FRAMES;
use hashbrown::HashTable;

use super::replay::Truth;
use crate::binary::Symbolizer;

/// The name of a frame whose address no mapping covers.
const UNKNOWN_FUNCTION: &str = "[unknown]";

/// Callers a path keeps: a stack is cut at `MAX_USER_FRAMES` frames, its leaf among them.
const MAX_CALLERS: usize = MAX_USER_FRAMES - 1;

/// A path of the truth: (leaf name, caller chain), indices into [`PathTruth`]'s tables.
pub(crate) type PathKey = (u32, u32);

/// Exact (instructions, cycles) per call path.
#[derive(Default)]
pub struct PathTruth {
    names: Vec<String>,
    ids: HashMap<String, u32>,
    /// Each context's parent and the name of the function its call is in (the root's
    /// name is never read).
    contexts: Vec<(u32, u32)>,
    /// A context of each distinct caller chain, with the chain's hash.
    chains: Vec<(u32, u64)>,
    /// Indices into `chains`, by hash.
    table: HashTable<u32>,
    paths: HashMap<PathKey, (u64, u64)>,
}

impl PathTruth {
    /// The truth's paths, each return address named by the function of its call
    /// instruction (`ret - 1`) as analysis names sampled stacks.
    pub(crate) fn new(sym: &mut Symbolizer, truth: &Truth) -> Self {
        let mut t = PathTruth {
            contexts: Vec::with_capacity(truth.contexts.len()),
            ..Default::default()
        };
        for (n, &(parent, ret)) in truth.contexts.iter().enumerate() {
            let name = if n == 0 {
                0
            } else {
                t.name_at(sym, truth, ret.saturating_sub(1))
            };
            t.contexts.push((parent, name));
        }
        let mut leaf: HashMap<u64, u32> = HashMap::new();
        let mut chain_of = vec![u32::MAX; t.contexts.len()];
        truth.contexts_ran.for_each(|ctx, addr, count, cycles| {
            let f = match leaf.get(&addr) {
                Some(&f) => f,
                None => {
                    let f = t.name_at(sym, truth, addr);
                    leaf.insert(addr, f);
                    f
                }
            };
            let c = match chain_of[ctx as usize] {
                u32::MAX => {
                    let c = t.intern_chain(ctx);
                    chain_of[ctx as usize] = c;
                    c
                }
                c => c,
            };
            let e = t.paths.entry((f, c)).or_default();
            e.0 += count;
            e.1 += cycles;
        });
        t
    }

    fn name_at(&mut self, sym: &mut Symbolizer, truth: &Truth, addr: u64) -> u32 {
        let name = sym
            .resolve(truth.pid, &truth.maps, addr)
            .map_or_else(|_| UNKNOWN_FUNCTION.to_string(), |r| sym.display_name(&r));
        self.intern(name)
    }

    fn intern(&mut self, name: String) -> u32 {
        if let Some(&id) = self.ids.get(&name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.clone());
        self.ids.insert(name, id);
        id
    }

    /// The caller names of context `ctx`, innermost first, cut as a stack is.
    fn callers(&self, ctx: u32) -> impl Iterator<Item = u32> + '_ {
        Callers {
            contexts: &self.contexts,
            ctx,
        }
        .take(MAX_CALLERS)
    }

    /// The caller chain of `ctx`: its index in `chains`, added when new.
    fn intern_chain(&mut self, ctx: u32) -> u32 {
        let hash = chain_hash(self.callers(ctx));
        let (contexts, chains) = (&self.contexts, &self.chains);
        let walk = |c: u32| Callers { contexts, ctx: c }.take(MAX_CALLERS);
        if let Some(&i) = self
            .table
            .find(hash, |&i| walk(chains[i as usize].0).eq(walk(ctx)))
        {
            return i;
        }
        let i = self.chains.len() as u32;
        self.chains.push((ctx, hash));
        let chains = &self.chains;
        self.table.insert_unique(hash, i, |&j| chains[j as usize].1);
        i
    }

    /// The key of the path whose names (leaf first) are `names`, if the truth has
    /// every name of it.
    pub(crate) fn key_of(&self, names: &[&str]) -> Option<PathKey> {
        let (leaf, callers) = names.split_first()?;
        let leaf = *self.ids.get(*leaf)?;
        let ids: Vec<u32> = callers
            .iter()
            .take(MAX_CALLERS)
            .map(|n| self.ids.get(*n).copied())
            .collect::<Option<_>>()?;
        let hash = chain_hash(ids.iter().copied());
        let chain = self.table.find(hash, |&i| {
            self.callers(self.chains[i as usize].0)
                .eq(ids.iter().copied())
        })?;
        Some((leaf, *chain))
    }

    /// The names of path `key`, leaf first.
    pub(crate) fn names(&self, key: PathKey) -> Vec<&str> {
        let ctx = self.chains[key.1 as usize].0;
        std::iter::once(key.0)
            .chain(self.callers(ctx))
            .map(|i| self.names[i as usize].as_str())
            .collect()
    }

    /// The name ids of path `key`, root first, into `out`.
    pub(crate) fn ids_root_first(&self, key: PathKey, out: &mut Vec<u32>) {
        out.clear();
        out.push(key.0);
        out.extend(self.callers(self.chains[key.1 as usize].0));
        out.reverse();
    }

    /// The id of `name`, if a path names it.
    pub(crate) fn id(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// Distinct names (ids are below it).
    pub(crate) fn name_count(&self) -> usize {
        self.names.len()
    }

    /// The name of id `i`.
    pub(crate) fn name(&self, i: u32) -> &str {
        &self.names[i as usize]
    }

    /// Every path's key and (instructions, cycles).
    pub(crate) fn keyed(&self) -> impl Iterator<Item = (PathKey, (u64, u64))> + '_ {
        self.paths.iter().map(|(&k, &v)| (k, v))
    }

    /// Every path: its names, leaf first, and (instructions, cycles).
    pub fn iter(&self) -> impl Iterator<Item = (Vec<&str>, (u64, u64))> + '_ {
        self.paths.iter().map(|(&k, &v)| (self.names(k), v))
    }

    /// Distinct paths.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether no instruction ran under a known context.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }
}

/// Walks a context's callers, innermost first, borrowing only the contexts.
struct Callers<'a> {
    contexts: &'a [(u32, u32)],
    ctx: u32,
}

impl Iterator for Callers<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        (self.ctx != 0).then(|| {
            let (parent, name) = self.contexts[self.ctx as usize];
            self.ctx = parent;
            name
        })
    }
}

fn chain_hash(ids: impl Iterator<Item = u32>) -> u64 {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    let mut n = 0u32;
    for id in ids {
        h.write_u32(id);
        n += 1;
    }
    h.write_u32(n);
    h.finish()
}

#[cfg(test)]
impl PathTruth {
    /// A truth of the paths given (names leaf first), each under contexts of its own
    /// callers.
    pub(crate) fn of(paths: &[(&[&str], (u64, u64))]) -> Self {
        let mut t = PathTruth {
            contexts: vec![(0, 0)],
            ..Default::default()
        };
        let mut at: HashMap<(u32, u32), u32> = HashMap::new();
        for &(names, v) in paths {
            let (leaf, callers) = names.split_first().expect("a leaf");
            let mut ctx = 0;
            for c in callers.iter().rev() {
                let id = t.intern(c.to_string());
                let next = t.contexts.len() as u32;
                let n = *at.entry((ctx, id)).or_insert(next);
                if n == next {
                    t.contexts.push((ctx, id));
                }
                ctx = n;
            }
            let leaf = t.intern(leaf.to_string());
            let chain = t.intern_chain(ctx);
            t.paths.insert((leaf, chain), v);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chains past the cut compare by their innermost callers only; equal chains of
    /// other contexts are one chain, and names come back as they went in.
    #[test]
    fn chains_intern_by_their_names_as_cut() {
        let deep: Vec<String> = (0..MAX_USER_FRAMES + 40)
            .map(|i| format!("f{}", i % 3))
            .collect();
        let deep: Vec<&str> = deep.iter().map(String::as_str).collect();
        let mut other = deep.clone();
        // Differs past the cut only.
        *other.last_mut().unwrap() = "main";
        let t = PathTruth::of(&[
            (&deep[..], (1, 2)),
            (&["leaf", "a", "main"], (3, 4)),
            (&["leaf", "b", "main"], (5, 6)),
        ]);
        let u = PathTruth::of(&[(&other[..], (1, 2))]);
        assert_eq!(t.len(), 3);
        let cut = &deep[..MAX_USER_FRAMES];
        assert_eq!(t.key_of(cut).map(|k| t.names(k)), Some(cut.to_vec()));
        assert_eq!(u.iter().next().unwrap().0, cut.to_vec());
        assert_eq!(
            t.key_of(&["leaf", "b", "main"]).map(|k| t.paths[&k]),
            Some((5, 6))
        );
        assert_eq!(t.key_of(&["leaf", "c", "main"]), None);
        assert_eq!(t.key_of(&["leaf", "main"]), None, "a chain the truth lacks");
        // One chain per distinct name chain: deep, a-main, b-main.
        assert_eq!(t.chains.len(), 3);
    }
}
