//! The always-on agent (`cpi-bpf agent`): windows of profile, and the sinks they go to.
//!
//! This file holds only what the sinks need from the agent loop (the agent loop, store,
//! governor and config land beside it); [`metrics`] exports Prometheus metrics and
//! [`push`] sends each window to Pyroscope.

pub mod error;
pub mod metrics;
pub mod push;

pub use error::AgentError;

use crate::profile::model::{Mode, Profile};

/// The agent's own state after a window, as the metrics export it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentStatus {
    pub mode: Mode,
    /// Windows completed since start.
    pub windows: u64,
    /// Analysis time of the last window.
    pub analysis_seconds: f64,
    pub tracked_processes: usize,
    pub cache_bytes: u64,
    pub store_bytes: u64,
    pub sampling_frequency_hz: u64,
    /// Cumulative in-kernel run time of the agent's BPF programs.
    pub bpf_run_seconds: f64,
}

/// One window of collection, analysed.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub start: std::time::SystemTime,
    pub end: std::time::SystemTime,
    pub profile: Profile,
}
