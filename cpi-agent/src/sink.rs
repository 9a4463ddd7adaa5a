//! Where the agent's finished windows go: one interface for the store
//! (cpi-agent/src/store.rs), the Prometheus metrics (cpi-agent/src/metrics.rs)
//! and each push (cpi-agent/src/push.rs), after the OpenTelemetry eBPF profiler's
//! reporter interface. The agent hands every window to its sinks in order — the store
//! first, whose bytes and failures are part of the status the metrics export — and logs
//! what failed, with its causes.

use std::time::Duration;

use super::{AgentStatus, Window};

/// Why a sink lost a window: logged as an error with its causes ([`cpi_user::chain`]).
pub(crate) type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// A destination of analysed windows.
pub(crate) trait Sink: Send {
    /// Takes a finished window and the agent's status after it; never waits for the
    /// network. A sink whose state is part of the status (the store: its bytes and failed
    /// writes) fills its fields in, for the sinks after it.
    fn report(&mut self, window: &Window, status: &mut AgentStatus) -> Result<(), SinkError>;

    /// The agent is stopping: delivers what is queued, within `within`.
    fn flush(&mut self, _within: Duration) {}
}
