//! Per-process aggregation of wire samples and the analysis that turns them into a
//! [`Profile`]: LBR ranges → instruction/block/edge counts, cycles, CPI.

pub(crate) mod aggregate;
pub mod analyze;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod flow;
pub mod merge;
pub mod model;
pub mod paths;
pub mod stack;

pub use aggregate::{BranchAggregate, IpAggregate, ProcessSamples, SampleSet, StackWeighting};
pub use analyze::{analyze, AnalysisOptions};
pub use model::{Mode, Profile, RunInfo};
pub use stack::{CallStack, StackAggregate, StackEnd};
