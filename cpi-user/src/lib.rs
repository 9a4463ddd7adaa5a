//! cpi-bpf user space, library first; the `cpi-bpf` binary is a thin CLI over it.
//!
//! Stages (docs/METHOD.md, "Architecture"): [`collect`] brings wire samples home from the kernel, [`sim`]
//! produces the same samples from an exact execution trace, [`profile`] aggregates them
//! per process and turns them into instruction/block/edge counts and CPI using
//! [`procmap`] and [`binary`], [`import`] reads recordings made elsewhere (`perf.data`,
//! `perf script` text) into the same samples, and [`report`] renders and exports the result.

#![warn(missing_docs)]

pub mod agent;
pub mod binary;
pub mod collect;
pub mod fsafe;
pub mod import;
pub mod procmap;
pub mod profile;
pub mod progress;
pub mod report;
pub mod sim;
pub(crate) mod unwind;
