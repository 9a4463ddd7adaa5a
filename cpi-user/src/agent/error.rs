//! Errors of the always-on agent (`cpi-bpf agent`) and its sinks
//! (cpi-user/src/agent/metrics.rs, cpi-user/src/agent/push.rs). Each is one line a user
//! can act on: printed at start, non-zero exit, nothing half-started.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// `--metrics-addr` could not be bound (port in use, address not local, ...).
    #[error("--metrics-addr {addr}: cannot listen: {source}")]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// `--push-pyroscope` is not a URL the pusher can send to.
    #[error("--push-pyroscope {url:?}: {reason}")]
    PushUrl { url: String, reason: String },
    /// `--push-tenant` cannot be sent as an HTTP header value.
    #[error("--push-tenant {tenant:?}: {reason}")]
    PushTenant { tenant: String, reason: String },
    /// A sink's worker thread could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
}
