//! Which process of BASE is which of NEW when their names differ: one program built
//! twice under two file names (`slow_a`, `slow_b`) runs as two comms from two binaries,
//! and matching by comm and binary file name would find nothing in common. pprof's
//! `-diff_base` matches by function name; so does the diff here, for the *main*
//! processes: each side's comm holding more than half of its profile's amount (with
//! [`Matching::Function`], each side's largest). Those two are listed as one
//! (`slow_a → slow_b`), and the functions and call-path frames of the binaries found on
//! one side only (within the main processes) as one binary: a function is then matched
//! by its name, a path by its chain of names. Binaries both sides map (libc) keep their
//! names, so a name in two of them (`_init`) stays two functions.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::file_name;
use crate::profile::model::{Mode, ProcessProfile, Profile};

/// How processes and functions are matched across the two profiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Matching {
    /// By comm and binary file name, except that two main processes (each over half
    /// of its profile) are matched with each other and their functions by name.
    #[default]
    Auto,
    /// By comm and binary file name only.
    Comm,
    /// Each side's largest comm with the other's, their functions by name.
    Function,
}

/// Two main processes matched with each other (the diff's header says so).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pairing {
    /// BASE's main comm.
    pub base_comm: String,
    /// NEW's main comm.
    pub new_comm: String,
    /// The name both are listed under: the comm, or `base → new` where they differ.
    pub comm: String,
    /// The file names of the binaries only BASE's main processes map.
    pub base_binaries: Vec<String>,
    /// The file names of the binaries only NEW's main processes map.
    pub new_binaries: Vec<String>,
    /// The name those binaries are listed under (`slow_a → slow_b`).
    pub binary: String,
}

/// Each comm's amount (cycles, or time in a time profile), summed over its processes.
fn amounts(p: &Profile) -> BTreeMap<&str, f64> {
    let mut out = BTreeMap::new();
    for pr in &p.processes {
        let m = &pr.measures;
        let amount = match p.mode {
            Mode::TimeProfile => m.time_ns,
            _ => m.cycles,
        };
        *out.entry(pr.comm.as_str()).or_insert(0.0) += amount.unwrap_or(0.0);
    }
    out
}

/// The comm with the largest amount, when `majority` only if it holds more than half.
fn main_comm(p: &Profile, majority: bool) -> Option<&str> {
    let a = amounts(p);
    let total: f64 = a.values().sum();
    let (comm, amount) = a.into_iter().max_by(|x, y| x.1.total_cmp(&y.1))?;
    (amount > 0.0 && (!majority || amount > total / 2.0)).then_some(comm)
}

/// The binary file names of `comm`'s functions and call-path frames.
fn binaries<'p>(p: &'p Profile, comm: &str) -> BTreeSet<&'p str> {
    let mut out = BTreeSet::new();
    for pr in p.processes.iter().filter(|pr| pr.comm == comm) {
        out.extend(pr.functions.iter().map(|f| file_name(&f.binary)));
        let frames = pr.stacks.iter().flat_map(|s| &s.frames);
        out.extend(frames.map(|f| file_name(&f.binary)));
    }
    out.remove("");
    out
}

/// The pairing of BASE's and NEW's main processes under `matching`; `None` where
/// comm matching already finds everything (one name, the same binaries) or there is
/// no main process.
pub fn pair(base: &Profile, new: &Profile, matching: Matching) -> Option<Pairing> {
    let majority = match matching {
        Matching::Comm => return None,
        Matching::Auto => true,
        Matching::Function => false,
    };
    let (bc, nc) = (main_comm(base, majority)?, main_comm(new, majority)?);
    let (bb, nb) = (binaries(base, bc), binaries(new, nc));
    let only = |a: &BTreeSet<&str>, b: &BTreeSet<&str>| -> Vec<String> {
        a.difference(b).map(|s| s.to_string()).collect()
    };
    let (base_binaries, new_binaries) = (only(&bb, &nb), only(&nb, &bb));
    if bc == nc && (base_binaries.is_empty() || new_binaries.is_empty()) {
        return None;
    }
    let arrow = |a: &str, b: &str| match (a, b) {
        (a, b) if a == b || b.is_empty() => a.to_string(),
        ("", b) => b.to_string(),
        (a, b) => format!("{a} → {b}"),
    };
    let binary = arrow(&base_binaries.join(", "), &new_binaries.join(", "));
    Some(Pairing {
        comm: arrow(bc, nc),
        base_comm: bc.to_string(),
        new_comm: nc.to_string(),
        base_binaries,
        new_binaries,
        binary,
    })
}

impl Pairing {
    /// `p` (BASE when `base`, else NEW) with its main processes renamed to
    /// [`Pairing::comm`] and their one-sided binaries to [`Pairing::binary`].
    pub fn apply(&self, p: &Profile, base: bool) -> Profile {
        let (comm, only) = if base {
            (&self.base_comm, &self.base_binaries)
        } else {
            (&self.new_comm, &self.new_binaries)
        };
        let mut out = p.clone();
        for pr in out.processes.iter_mut().filter(|pr| &pr.comm == comm) {
            self.rename(pr, only);
        }
        out
    }

    fn rename(&self, pr: &mut ProcessProfile, only: &[String]) {
        pr.comm = self.comm.clone();
        let one_sided = |b: &str| only.iter().any(|o| o == file_name(b));
        for f in pr.functions.iter_mut().filter(|f| one_sided(&f.binary)) {
            f.binary = self.binary.clone();
        }
        for s in &mut pr.stacks {
            for f in s.frames.iter_mut().filter(|f| one_sided(&f.binary)) {
                f.binary = self.binary.clone();
            }
        }
    }

    /// The header's sentence.
    pub fn describe(&self) -> String {
        let names = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        format!(
            "main processes matched across names: {} (base) with {} (new), listed as {}; \
             their functions in binaries one side maps (base: {}; new: {}) by function \
             name, call paths by their names",
            self.base_comm,
            self.new_comm,
            self.comm,
            names(&self.base_binaries),
            names(&self.new_binaries),
        )
    }
}

/// BASE and NEW as the diff `pairing` compares them.
pub fn aligned<'p>(
    base: &'p Profile,
    new: &'p Profile,
    pairing: Option<&Pairing>,
) -> (Cow<'p, Profile>, Cow<'p, Profile>) {
    match pairing {
        Some(p) => (
            Cow::Owned(p.apply(base, true)),
            Cow::Owned(p.apply(new, false)),
        ),
        None => (Cow::Borrowed(base), Cow::Borrowed(new)),
    }
}
