//! Errors of the always-on agent (`cpi-bpf agent`) and its sinks
//! (cpi-agent/src/metrics.rs, cpi-agent/src/push.rs). Each is one line a user
//! can act on: printed at start, non-zero exit, nothing half-started.

use std::net::SocketAddr;

/// Why a sink of the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// `--metrics-addr` could not be bound (port in use, address not local, ...).
    // Causes here are part of the message, not `source()`: a chain says them once.
    #[error("--metrics-addr {addr}: cannot listen: {cause}")]
    MetricsBind {
        /// The address given.
        addr: SocketAddr,
        /// The cause.
        cause: std::io::Error,
    },
    /// `--push-pyroscope` or `--push-otlp` is not a URL the pusher can send to.
    #[error("{flag} {url:?}: {reason}")]
    PushUrl {
        /// The flag that gave it.
        flag: &'static str,
        /// The URL given.
        url: String,
        /// What is wrong with it (scheme, host, port).
        reason: String,
    },
    /// `--push-tenant` cannot be sent as an HTTP header value.
    #[error("--push-tenant {tenant:?}: {reason}")]
    PushTenant {
        /// The tenant given.
        tenant: String,
        /// Why: it must be non-empty printable ASCII without spaces.
        reason: String,
    },
    /// `--push-ca`, `--push-password-file` or `--push-token-file` cannot be used.
    #[error("{flag}: {detail}")]
    PushFile {
        /// The flag naming the file.
        flag: &'static str,
        /// Why (never the file's content).
        detail: String,
    },
    /// The push credentials given do not fit together or with the URL.
    #[error("push credentials: {reason}")]
    PushCredentials {
        /// What is wrong (never a secret).
        reason: String,
    },
    /// A sink's worker thread could not be started.
    #[error("cannot start the {what} thread: {cause}")]
    Thread {
        /// Which thread ("metrics server", "push").
        what: &'static str,
        /// The cause.
        cause: std::io::Error,
    },
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_chain_names_each_cause_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = crate::store::StoreError::Io {
            dir: "/s".into(),
            what: "cannot list it".into(),
            source: io(),
        };
        assert_eq!(e.to_string(), "store /s: cannot list it");
        assert_eq!(cpi_user::chain(&e), "store /s: cannot list it: gone");
        let e = crate::store::StoreError::Unsafe(cpi_user::fsafe::DirError::Io {
            dir: "/s".into(),
            cause: io(),
        });
        assert_eq!(cpi_user::chain(&e), "store /s: gone");
    }
}
