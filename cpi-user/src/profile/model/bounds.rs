//! Per-process bounds of a profile file's reader (cpi-user/src/report/file.rs): a
//! process listing more functions or call paths than [`Bounds`] allows is read past,
//! its rest skipped as it streams by, and left out with one line saying so, while the
//! file's other processes are read. A window the agent wrote holds every process of a
//! host: one process's oversized list (a hostile program's, or a corrupt copy) costs
//! that process, not the window.
//!
//! The bounds hold only while a file is read (`collect`); any other deserialisation
//! of a profile reads every list whole. The lines are few: each process left out took
//! more than a bound's worth of the file's bounded text.

use std::cell::RefCell;
use std::fmt;

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::{frame_numbers, FunctionProfile, ProcessProfile, StackProfile};
use crate::fsafe::budget_in_place;

/// The most of each list one process of a file may hold.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Functions.
    pub functions: usize,
    /// Call paths.
    pub paths: usize,
}

/// The reader's state while a file is read.
struct Reading {
    bounds: Bounds,
    /// Why the process being read is over a bound.
    over: Option<String>,
    /// One line per process left out.
    unread: Vec<String>,
}

thread_local! {
    static READING: RefCell<Option<Reading>> = const { RefCell::new(None) };
}

/// Runs `read` (a profile file's deserialisation) with `bounds` on each process; the
/// lines saying which processes were left out, and why.
pub(crate) fn collect<R>(bounds: Bounds, read: impl FnOnce() -> R) -> (R, Vec<String>) {
    struct TakeBack;
    impl Drop for TakeBack {
        fn drop(&mut self) {
            READING.with(|r| *r.borrow_mut() = None);
        }
    }
    let reading = Reading {
        bounds,
        over: None,
        unread: Vec::new(),
    };
    READING.with(|r| *r.borrow_mut() = Some(reading));
    let take_back = TakeBack;
    let read = read();
    let unread = READING.with(|r| r.borrow_mut().take()).map(|r| r.unread);
    drop(take_back);
    (read, unread.unwrap_or_default())
}

/// A list of at most `bound(bounds)` elements while a file is read: past it, the rest
/// is skipped unread and the process marked over its bound (`what`: the list's name).
fn bounded<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
    d: D,
    bound: fn(&Bounds) -> usize,
    what: &'static str,
) -> Result<Vec<T>, D::Error> {
    struct List<T> {
        max: Option<usize>,
        what: &'static str,
        element: std::marker::PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for List<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of {}", self.what)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let max = self.max.unwrap_or(usize::MAX);
            let mut out = Vec::new();
            while out.len() < max {
                match seq.next_element()? {
                    Some(x) => out.push(x),
                    None => return Ok(out),
                }
            }
            let mut more = 0u64;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                more += 1;
            }
            if more > 0 {
                let why = format!(
                    "more than {max} {} ({} listed)",
                    self.what,
                    max as u64 + more
                );
                READING.with(|r| r.borrow_mut().as_mut().map(|r| r.over = Some(why)));
            }
            Ok(out)
        }
    }
    let max = READING.with(|r| r.borrow().as_ref().map(|r| bound(&r.bounds)));
    d.deserialize_seq(List {
        max,
        what,
        element: std::marker::PhantomData,
    })
}

/// A process's functions, bounded while a file is read.
pub(super) fn functions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<FunctionProfile>, D::Error> {
    bounded(d, |b| b.functions, "functions")
}

/// A process's call paths, bounded while a file is read.
pub(super) fn paths<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<StackProfile>, D::Error> {
    bounded(d, |b| b.paths, "call paths")
}

/// The processes of a file, each over a bound left out (its frames forgotten by
/// [`frame_numbers`], as if never listed) with a line saying so.
pub(super) fn processes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ProcessProfile>, D::Error> {
    struct Processes;
    impl<'de> Visitor<'de> for Processes {
        type Value = Vec<ProcessProfile>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of processes")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            loop {
                let frames = frame_numbers::mark();
                let Some(mut p) = seq.next_element::<ProcessProfile>()? else {
                    return Ok(out);
                };
                let over = READING.with(|r| r.borrow_mut().as_mut().and_then(|r| r.over.take()));
                let Some(why) = over else {
                    out.push(p);
                    continue;
                };
                frame_numbers::rewind(frames);
                budget_in_place(&mut p.comm);
                let line = format!("process {} ({}) not read: {why}", p.pid, p.comm);
                READING.with(|r| r.borrow_mut().as_mut().map(|r| r.unread.push(line)));
            }
        }
    }
    d.deserialize_seq(Processes)
}
