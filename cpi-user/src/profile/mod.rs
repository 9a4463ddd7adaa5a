//! Per-process aggregation of wire samples and the analysis that turns them into a
//! [`Profile`]: LBR ranges → instruction/block/edge counts, cycles, CPI.

pub(crate) mod aggregate;
pub mod analyze;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod flow;
mod intern;
pub mod merge;
pub mod model;
pub(crate) mod paths;
pub mod stack;

pub use aggregate::{BranchAggregate, IpAggregate, ProcessSamples, SampleSet, StackWeighting};
pub use analyze::{analyze, AnalysisOptions};
pub use model::{Mode, Profile, RunInfo};
pub use stack::{CallStack, StackAggregate, StackEnd};

/// The maps every sample updates (ranges, taken branches, IPs, call stacks): hashbrown
/// with foldhash, seeded per map, over keys other processes choose. SipHash was ≈ 30 %
/// of aggregating a branch sample (BENCHMARKS.md, "PMU model / aggregation").
pub(crate) type FastMap<K, V> = hashbrown::HashMap<K, V>;
