//! Shared between the eBPF programs (`cpi-ebpf`), the collector and the PMU model
//! (`cpi-user`): the wire format of samples and the perturbation policy.
//!
//! Everything here is `no_std`, allocation-free and verifier-friendly (no loops whose
//! bound the verifier cannot see, no floating point), because the eBPF program compiles
//! the same source.
#![no_std]
#![warn(missing_docs)]

pub mod policy;
pub mod wire;

pub use policy::{KernelConfig, PeriodPolicy, Perturbation, Rng, ThinState, Thinning};
pub use wire::{BranchEntry, BranchSample, EventRole, IpSample, SampleHeader, SampleKind};
