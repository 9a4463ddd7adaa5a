//! The agent's configuration: command-line flags and `--config FILE` (TOML, the same keys
//! as the flags without the dashes in front, e.g. `overhead-budget = 0.5`; an unknown key
//! is an error). Flags win over the file, the file over the defaults. Everything is
//! checked here, before anything starts; each problem is one line.
//!
//! Example: dist/agent.toml.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;

use super::kubelet;
use super::pods::PodSelector;
use super::push::ServiceLabel;
use super::store;
use cpi_user::collect::{self, filter, StackMemory};

/// `--interval` default, seconds.
pub(crate) const DEFAULT_INTERVAL_SECS: u64 = 10;
/// `--cache-mib` default.
pub(crate) const DEFAULT_CACHE_MIB: u64 = 64;
/// `--overhead-budget` default, percent of one CPU.
pub(crate) const DEFAULT_BUDGET_PCT: f64 = 0.5;
/// `--min-frequency` default, Hz: parca-agent's and Grafana Alloy's `pyroscope.ebpf`
/// default rate. At 49 Hz the stacks agent took ≈ 0.7 % of a core on a host running
/// builds, over the 0.5 % budget; at 19 Hz the governor holds it (BENCHMARKS.md, "Agent
/// CPU on a build host").
pub(crate) const DEFAULT_MIN_FREQUENCY: u64 = 19;
/// `--metrics-addr` default: loopback only, the port OpenTelemetry's Prometheus exporter
/// uses.
pub(crate) const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
/// `--metrics-top-comms` / `--metrics-top-functions` default.
pub(crate) const DEFAULT_TOP: usize = 20;
/// `--push-queue` default, windows.
pub(crate) const DEFAULT_PUSH_QUEUE: usize = 8;
/// `--push-timeout` default, seconds.
pub(crate) const DEFAULT_PUSH_TIMEOUT_SECS: u64 = 10;
/// What the default ring buffer holds at `--frequency` on every online CPU, all records
/// of the longest kind ([`collect::default_ring_mib`]): two of the agent's 100 ms drain
/// intervals. A drain interval made longer at low rates must stay under
/// `ring_holds(ring, rate, cpus) / 2` to keep this margin. On 2 CPUs at 999 Hz:
/// 9,568 B × 999 /s × 2 × 0.2 s = 3.6 MiB, so 4 MiB (8 MiB before: VmRSS counts the
/// ring twice, its pages being mapped twice, so each MiB here is 2 MiB of VmRSS).
/// Margin besides: the kernel side wakes the collector when a quarter is full.
pub const RING_HOLDS: Duration = Duration::from_millis(200);
/// Longest `--interval`: a day.
const MAX_INTERVAL_SECS: u64 = 86_400;

/// A configuration the agent refuses to start with: one line naming the file or key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--config FILE` cannot be read or is not valid TOML of known keys.
    #[error("config {}: {detail}", .path.display())]
    File {
        /// The file given to `--config`.
        path: PathBuf,
        /// What is wrong, with the line number when TOML gives one.
        detail: String,
    },
    /// A setting (flag or file) is out of range or malformed.
    #[error("{key}: {detail}")]
    Value {
        /// The setting's name without dashes, e.g. `min-frequency`.
        key: &'static str,
        /// What is allowed, and what was given.
        detail: String,
    },
}

fn bad(key: &'static str, detail: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        key,
        detail: detail.into(),
    }
}

/// Every setting, each optional: what the flags gave, or the file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentOptions {
    /// Only these processes (all threads); default: system-wide.
    #[serde(default)]
    pub pid: Vec<u32>,
    /// Only processes whose comm matches this regular expression.
    pub comm: Option<String>,
    /// Only processes in this cgroup (v2 path, under /sys/fs/cgroup) or below it.
    pub cgroup: Option<PathBuf>,
    /// Only the pods of this name (Kubernetes, cpi-agent/src/pods.rs).
    pub pod: Option<String>,
    /// Only the pods of this namespace.
    pub namespace: Option<String>,
    /// Only the containers of this name in the pods selected.
    pub container: Option<String>,
    /// Window length, seconds.
    pub interval: Option<u64>,
    /// Sampling frequency, Hz per busy CPU (the governor's ceiling).
    pub frequency: Option<u64>,
    /// The governor's floor, Hz.
    pub min_frequency: Option<u64>,
    /// Percent of one CPU for the agent and its BPF programs.
    pub overhead_budget: Option<f64>,
    /// Cache bound (binaries, symbols), MiB.
    pub cache_mib: Option<u64>,
    /// Store directory, one gzip'd profile per window (cpi-agent/src/store.rs).
    pub store: Option<PathBuf>,
    /// Keep windows this long (`24h`, `90m`, `7d`).
    pub retain: Option<String>,
    /// Bound of the store's size, MiB; the oldest windows go first.
    pub store_max_mib: Option<u64>,
    /// Group given read access to the store (name or gid); default: root only.
    pub store_group: Option<String>,
    /// `/metrics` address; `off` disables the endpoint.
    pub metrics_addr: Option<String>,
    /// Comms with series of their own; the rest are summed as comm="other".
    pub metrics_top_comms: Option<usize>,
    /// Functions with a `cpi_bpf_function_cpi` series.
    pub metrics_top_functions: Option<usize>,
    /// Pyroscope base URL each window is pushed to (`http://host:4040`).
    pub push_pyroscope: Option<String>,
    /// OpenTelemetry Collector base URL each window is pushed to as OTLP/HTTP
    /// (`http://host:4318`).
    pub push_otlp: Option<String>,
    /// `X-Scope-OrgID` header of the pushes (multi-tenant Pyroscope).
    pub push_tenant: Option<String>,
    /// PEM file of CA certificates trusted for https pushes, beside the system's.
    pub push_ca: Option<PathBuf>,
    /// File holding the password of the push URL's user (basic auth).
    pub push_password_file: Option<PathBuf>,
    /// File holding a bearer token for the pushes.
    pub push_token_file: Option<PathBuf>,
    /// `service_name` of pushed series: `comm`, `cgroup`, `pod`, `namespace` or
    /// `container`.
    pub service_label: Option<String>,
    /// Pod names from the kubelet (default: when /var/lib/kubelet/pods exists).
    pub kubernetes: Option<bool>,
    /// The kubelet's read-only API (`http://127.0.0.1:10255`).
    pub kubelet_url: Option<String>,
    /// Windows waiting to be pushed at most; beyond it the oldest is dropped.
    pub push_queue: Option<usize>,
    /// Deadline of one push request, seconds.
    pub push_timeout: Option<u64>,
    /// Sample kernel code too.
    pub include_kernel: Option<bool>,
    /// Take call stacks (default true; `false`: leaf-only, cheaper).
    pub stacks: Option<bool>,
    /// Source file and line of each sampled instruction (default false: costly).
    pub source_lines: Option<bool>,
    /// BPF ring buffer size, MiB (a power of two).
    pub ring_buffer_mib: Option<u32>,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: Option<String>,
}

/// The agent's checked configuration.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Processes to sample (all their threads); empty: system-wide.
    pub pids: Vec<u32>,
    /// Only processes whose comm matches.
    pub comm: Option<Regex>,
    /// Absolute cgroup v2 directory: only processes in it or below.
    pub cgroup: Option<PathBuf>,
    /// Only the pods (and containers) it selects, in the kernel (cpi-agent/src/pods.rs); empty:
    /// any.
    pub pods: PodSelector,
    /// Window length: one profile, one store file, one push per window.
    pub interval: Duration,
    /// Sampling frequency, Hz per busy CPU: the governor's ceiling.
    pub frequency: u64,
    /// The governor's floor, Hz (at most `frequency`).
    pub min_frequency: u64,
    /// Percent of one CPU the agent and its BPF programs may use (cpi-agent/src/governor.rs).
    pub overhead_budget_pct: f64,
    /// Bound of the caches that outlive windows (binaries, symbols), bytes; a quarter of
    /// it bounds the unwind sections mapped and an eighth each window's call stacks
    /// ([`Self::stack_memory`]).
    pub cache_bytes: u64,
    /// Store directory (cpi-agent/src/store.rs).
    pub store: PathBuf,
    /// Windows older than this are deleted from the store.
    pub retain: Duration,
    /// Bound of the store's size, bytes; the oldest windows go first.
    pub store_max_bytes: u64,
    /// Group that may read the store (directory 0750, windows 0640); `None`: 0700/0600.
    pub store_group: Option<u32>,
    /// `/metrics` listen address; `None`: no endpoint (cpi-agent/src/metrics.rs).
    pub metrics_addr: Option<SocketAddr>,
    /// Comms with series of their own; the rest are summed as comm="other".
    pub metrics_top_comms: usize,
    /// Functions with a `cpi_bpf_function_cpi` series.
    pub metrics_top_functions: usize,
    /// Pyroscope base URL; `None`: no pushes (cpi-agent/src/push.rs).
    pub push_url: Option<String>,
    /// OTLP base URL; `None`: no OTLP pushes (cpi-agent/src/push.rs).
    pub otlp_url: Option<String>,
    /// `X-Scope-OrgID` header of the pushes.
    pub push_tenant: Option<String>,
    /// Extra CA certificates for https pushes (PEM).
    pub push_ca: Option<PathBuf>,
    /// Password file of basic auth (the URL names the user).
    pub push_password_file: Option<PathBuf>,
    /// Bearer token file.
    pub push_token_file: Option<PathBuf>,
    /// What pushed series are named by (`service_name`).
    pub service_label: ServiceLabel,
    /// The kubelet asked for pod names (cpi-agent/src/kubelet.rs); `None`: not on Kubernetes.
    pub kubelet_url: Option<String>,
    /// Windows waiting to be pushed at most; beyond it the oldest is dropped.
    pub push_queue: usize,
    /// Deadline of one push request.
    pub push_timeout: Duration,
    /// Sample kernel code too.
    pub include_kernel: bool,
    /// Take call stacks.
    pub stacks: bool,
    /// Look up source lines in each binary's DWARF.
    pub source_lines: bool,
    /// BPF ring buffer size, bytes (a power of two).
    pub ring_bytes: u32,
    /// The least important messages shown (`error` … `trace`).
    pub log_level: log::LevelFilter,
}

impl AgentOptions {
    /// Reads a TOML config file.
    pub fn from_file(path: &Path) -> Result<AgentOptions, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            ConfigError::File {
                path: path.to_path_buf(),
                detail: match line {
                    Some(l) => format!("line {l}: {}", e.message()),
                    None => e.message().to_string(),
                },
            }
        })
    }

    /// `self` (the flags) over `file`.
    pub fn over(self, file: AgentOptions) -> AgentOptions {
        AgentOptions {
            pid: if self.pid.is_empty() {
                file.pid
            } else {
                self.pid
            },
            comm: self.comm.or(file.comm),
            cgroup: self.cgroup.or(file.cgroup),
            pod: self.pod.or(file.pod),
            namespace: self.namespace.or(file.namespace),
            container: self.container.or(file.container),
            interval: self.interval.or(file.interval),
            frequency: self.frequency.or(file.frequency),
            min_frequency: self.min_frequency.or(file.min_frequency),
            overhead_budget: self.overhead_budget.or(file.overhead_budget),
            cache_mib: self.cache_mib.or(file.cache_mib),
            store: self.store.or(file.store),
            retain: self.retain.or(file.retain),
            store_max_mib: self.store_max_mib.or(file.store_max_mib),
            store_group: self.store_group.or(file.store_group),
            metrics_addr: self.metrics_addr.or(file.metrics_addr),
            metrics_top_comms: self.metrics_top_comms.or(file.metrics_top_comms),
            metrics_top_functions: self.metrics_top_functions.or(file.metrics_top_functions),
            push_pyroscope: self.push_pyroscope.or(file.push_pyroscope),
            push_otlp: self.push_otlp.or(file.push_otlp),
            push_tenant: self.push_tenant.or(file.push_tenant),
            push_ca: self.push_ca.or(file.push_ca),
            push_password_file: self.push_password_file.or(file.push_password_file),
            push_token_file: self.push_token_file.or(file.push_token_file),
            service_label: self.service_label.or(file.service_label),
            kubernetes: self.kubernetes.or(file.kubernetes),
            kubelet_url: self.kubelet_url.or(file.kubelet_url),
            push_queue: self.push_queue.or(file.push_queue),
            push_timeout: self.push_timeout.or(file.push_timeout),
            include_kernel: self.include_kernel.or(file.include_kernel),
            stacks: self.stacks.or(file.stacks),
            source_lines: self.source_lines.or(file.source_lines),
            ring_buffer_mib: self.ring_buffer_mib.or(file.ring_buffer_mib),
            log_level: self.log_level.or(file.log_level),
        }
    }

    /// Defaults filled in and every value checked, in this order (a command line with
    /// several mistakes is told about the first).
    pub fn resolve(self) -> Result<AgentConfig, ConfigError> {
        let rates = self.rates()?;
        let cache_mib = self.cache_mib()?;
        let (retain, store_max_mib, store_group) = self.storage(rates.interval)?;
        let comm = self
            .comm
            .as_deref()
            .map(|c| Regex::new(c).map_err(|e| bad("comm", one_line(&e.to_string()))))
            .transpose()?;
        let cgroup = self.cgroup.as_deref().map(cgroup_dir).transpose()?;
        let metrics_addr = self.metrics_addr()?;
        let service_label = self.service_label()?;
        let pods = self.pods()?;
        let kubelet_url = self.kubelet_url(&pods)?;
        let (push_queue, push_timeout) = self.push_limits()?;
        let ring_bytes = self.ring_bytes(rates.frequency)?;
        let log_level = self.log_level()?;
        Ok(AgentConfig {
            pids: self.pid,
            comm,
            cgroup,
            pods,
            interval: Duration::from_secs(rates.interval),
            frequency: rates.frequency,
            min_frequency: rates.min_frequency,
            overhead_budget_pct: rates.budget,
            cache_bytes: cache_mib << 20,
            store: self.store.unwrap_or_else(|| store::DEFAULT_DIR.into()),
            retain,
            store_max_bytes: store_max_mib << 20,
            store_group,
            metrics_addr,
            metrics_top_comms: self.metrics_top_comms.unwrap_or(DEFAULT_TOP),
            metrics_top_functions: self.metrics_top_functions.unwrap_or(DEFAULT_TOP),
            push_url: self.push_pyroscope,
            otlp_url: self.push_otlp,
            push_tenant: self.push_tenant,
            push_ca: self.push_ca,
            push_password_file: self.push_password_file,
            push_token_file: self.push_token_file,
            service_label,
            kubelet_url,
            push_queue,
            push_timeout: Duration::from_secs(push_timeout),
            include_kernel: self.include_kernel.unwrap_or(false),
            stacks: self.stacks.unwrap_or(true),
            source_lines: self.source_lines.unwrap_or(false),
            ring_bytes,
            log_level,
        })
    }

    /// The window interval, the sampling frequency with its floor, and the overhead budget.
    fn rates(&self) -> Result<Rates, ConfigError> {
        let interval = self.interval.unwrap_or(DEFAULT_INTERVAL_SECS);
        if !(1..=MAX_INTERVAL_SECS).contains(&interval) {
            return Err(bad(
                "interval",
                format!("must be 1 to {MAX_INTERVAL_SECS} seconds, not {interval}"),
            ));
        }
        let frequency = self
            .frequency
            .unwrap_or(cpi_user::collect::DEFAULT_FREQUENCY);
        if frequency == 0 {
            return Err(bad("frequency", "must be at least 1 Hz"));
        }
        let min_frequency = self
            .min_frequency
            .unwrap_or(DEFAULT_MIN_FREQUENCY.min(frequency));
        if min_frequency == 0 || min_frequency > frequency {
            return Err(bad(
                "min-frequency",
                format!("must be 1 to --frequency ({frequency}) Hz, not {min_frequency}"),
            ));
        }
        let budget = self.overhead_budget.unwrap_or(DEFAULT_BUDGET_PCT);
        if !(budget > 0.0 && budget <= 100.0) {
            return Err(bad(
                "overhead-budget",
                format!("must be a percentage of one CPU above 0 and at most 100, not {budget}"),
            ));
        }
        Ok(Rates {
            interval,
            frequency,
            min_frequency,
            budget,
        })
    }

    fn cache_mib(&self) -> Result<u64, ConfigError> {
        let cache_mib = self.cache_mib.unwrap_or(DEFAULT_CACHE_MIB);
        if !(1..=65_536).contains(&cache_mib) {
            return Err(bad(
                "cache-mib",
                format!("must be 1 to 65536, not {cache_mib}"),
            ));
        }
        Ok(cache_mib)
    }

    /// The store's retention (at least one `interval`), size in MiB and group.
    fn storage(&self, interval: u64) -> Result<(Duration, u64, Option<u32>), ConfigError> {
        let retain = match &self.retain {
            Some(s) => humantime::parse_duration(s)
                .map_err(|e| bad("retain", format!("{s:?} is not a duration like 24h: {e}")))?,
            None => store::DEFAULT_RETAIN,
        };
        if retain < Duration::from_secs(interval) {
            return Err(bad(
                "retain",
                format!("must be at least one interval ({interval} s)"),
            ));
        }
        let store_max_mib = self.store_max_mib.unwrap_or(store::DEFAULT_MAX_MIB);
        if store_max_mib == 0 {
            return Err(bad("store-max-mib", "must be at least 1"));
        }
        let store_group = self
            .store_group
            .as_deref()
            .map(|g| cpi_user::fsafe::group_id(g).map_err(|detail| bad("store-group", detail)))
            .transpose()?;
        Ok((retain, store_max_mib, store_group))
    }

    fn metrics_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        Ok(
            match self.metrics_addr.as_deref().unwrap_or(DEFAULT_METRICS_ADDR) {
                "off" => None,
                a => Some(a.parse::<SocketAddr>().map_err(|_| {
                    bad(
                        "metrics-addr",
                        format!("{a:?} is not an IP:PORT address (or off)"),
                    )
                })?),
            },
        )
    }

    fn service_label(&self) -> Result<ServiceLabel, ConfigError> {
        let label = self.service_label.as_deref().unwrap_or("comm");
        ServiceLabel::parse(label).ok_or_else(|| {
            bad(
                "service-label",
                format!(
                    "must be one of {}, not {label:?}",
                    ServiceLabel::NAMES.join(", ")
                ),
            )
        })
    }

    /// The pod selectors, and that what they need is there: no --cgroup beside them,
    /// the kubelet not turned off, cgroup v2 mounted.
    fn pods(&self) -> Result<PodSelector, ConfigError> {
        let pods = PodSelector {
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
            container: self.container.clone(),
        };
        for (key, v) in [
            ("pod", &pods.pod),
            ("namespace", &pods.namespace),
            ("container", &pods.container),
        ] {
            if v.as_deref().is_some_and(str::is_empty) {
                return Err(bad(key, "must not be empty"));
            }
        }
        if !pods.is_empty() {
            if self.cgroup.is_some() {
                return Err(bad(
                    "cgroup",
                    "cannot be combined with --pod, --namespace or --container (each names \
                     the cgroups to keep)",
                ));
            }
            if self.kubernetes == Some(false) {
                return Err(bad(
                    "kubernetes",
                    "is off, but --pod, --namespace and --container need the kubelet's pod list",
                ));
            }
            if filter::cgroup2_root().is_none() {
                return Err(bad(
                    "pod",
                    format!(
                        "pods are selected by cgroup v2, and none is mounted under {CGROUP_ROOT}"
                    ),
                ));
            }
        }
        Ok(pods)
    }

    /// The kubelet to ask for pods: none off Kubernetes; on it (said, or guessed from a
    /// URL, pod selectors or the kubelet's pod folder) the given URL or the default.
    fn kubelet_url(&self, pods: &PodSelector) -> Result<Option<String>, ConfigError> {
        let on_kubernetes = self.kubernetes.unwrap_or_else(|| {
            self.kubelet_url.is_some() || !pods.is_empty() || Path::new(kubelet::PODS_DIR).is_dir()
        });
        match (on_kubernetes, self.kubelet_url.clone()) {
            (false, _) => Ok(None),
            (true, None) => Ok(Some(kubelet::DEFAULT_URL.to_string())),
            (true, Some(u)) if u.starts_with("http://") || u.starts_with("https://") => Ok(Some(u)),
            (true, Some(u)) => Err(bad(
                "kubelet-url",
                format!("{u:?} is not an http:// or https:// URL"),
            )),
        }
    }

    /// The push queue's length in windows and a push's timeout in seconds.
    fn push_limits(&self) -> Result<(usize, u64), ConfigError> {
        let push_queue = self.push_queue.unwrap_or(DEFAULT_PUSH_QUEUE);
        if push_queue == 0 {
            return Err(bad("push-queue", "must be at least 1 window"));
        }
        let push_timeout = self.push_timeout.unwrap_or(DEFAULT_PUSH_TIMEOUT_SECS);
        if !(1..=600).contains(&push_timeout) {
            return Err(bad("push-timeout", "must be 1 to 600 seconds"));
        }
        Ok((push_queue, push_timeout))
    }

    /// The ring buffer's bytes per CPU: as given, or what holds [`RING_HOLDS`] at
    /// `frequency` on this machine's CPUs.
    fn ring_bytes(&self, frequency: u64) -> Result<u32, ConfigError> {
        let ring_mib = self.ring_buffer_mib.unwrap_or_else(|| {
            let cpus = collect::target::online_cpus().len() as u64;
            collect::default_ring_mib(RING_HOLDS, frequency, cpus)
        });
        collect::ring_bytes(ring_mib).map_err(|e| bad("ring-buffer-mib", e.to_string()))
    }

    fn log_level(&self) -> Result<log::LevelFilter, ConfigError> {
        let log_level = self.log_level.clone().unwrap_or_else(|| "info".into());
        ["error", "warn", "info", "debug", "trace"]
            .contains(&log_level.as_str())
            .then(|| log_level.parse().ok())
            .flatten()
            .ok_or_else(|| {
                bad(
                    "log-level",
                    format!("must be error, warn, info, debug or trace, not {log_level:?}"),
                )
            })
    }
}

/// The sampling rates [`AgentOptions::resolve`] checks first.
struct Rates {
    interval: u64,
    frequency: u64,
    min_frequency: u64,
    budget: f64,
}

impl AgentConfig {
    /// How much the call stacks may hold, from [`Self::cache_bytes`]: the unwind
    /// sections mapped (file pages) a quarter, each window's stacks an eighth (at most
    /// three windows are held at once: collecting, queued, analysed).
    pub fn stack_memory(&self) -> StackMemory {
        StackMemory {
            window_bytes: (self.cache_bytes / 8) as usize,
            unwind_bytes: self.cache_bytes / 4,
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where the cgroup file systems are mounted.
pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// `--cgroup`: a cgroup v2 directory, given as a path under [`CGROUP_ROOT`] or relative
/// to the cgroup v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
/// layout: cpi-user/src/collect/filter.rs).
fn cgroup_dir(p: &Path) -> Result<PathBuf, ConfigError> {
    let dir = match p.strip_prefix(CGROUP_ROOT) {
        Ok(rel) => Path::new(CGROUP_ROOT).join(rel),
        Err(_) => {
            let root = filter::cgroup2_root().ok_or_else(|| {
                bad(
                    "cgroup",
                    format!("no cgroup v2 file system is mounted under {CGROUP_ROOT}"),
                )
            })?;
            root.join(p.strip_prefix("/").unwrap_or(p))
        }
    };
    filter::CgroupV2::at(&dir).map_err(|e| bad("cgroup", e.to_string()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<AgentOptions, ConfigError> {
        let dir = std::env::temp_dir().join(format!("cpi-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("{}.toml", toml_text.len()));
        std::fs::write(&p, toml_text).unwrap();
        let r = AgentOptions::from_file(&p);
        std::fs::remove_file(&p).unwrap();
        r
    }

    #[test]
    fn defaults() {
        let c = AgentOptions::default().resolve().unwrap();
        assert_eq!(c.interval, Duration::from_secs(10));
        assert_eq!((c.frequency, c.min_frequency), (999, 19));
        assert_eq!(c.overhead_budget_pct, 0.5);
        assert!(c.stacks && !c.source_lines);
        assert_eq!(c.cache_bytes, 64 << 20);
        assert_eq!(c.store, Path::new("/var/lib/cpi-bpf"));
        assert_eq!(c.retain, Duration::from_secs(86_400));
        assert_eq!(c.store_max_bytes, 1024 << 20);
        assert_eq!(c.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(c.pids.is_empty() && c.comm.is_none() && c.push_url.is_none());
    }

    #[test]
    fn the_default_ring_holds_two_drain_intervals_of_the_longest_records() {
        let default_ring_mib = |hz, cpus| collect::default_ring_mib(RING_HOLDS, hz, cpus);
        // 2 CPUs at 999 Hz: 3.6 MiB needed; 2 MiB would hold 110 ms.
        assert_eq!(default_ring_mib(999, 2), 4);
        assert_eq!(default_ring_mib(999, 4), 8);
        assert_eq!(default_ring_mib(99, 2), 1);
        assert_eq!(default_ring_mib(999, 64), collect::MAX_DEFAULT_RING_MIB);
        let flag = AgentOptions {
            ring_buffer_mib: Some(32),
            ..Default::default()
        };
        assert_eq!(flag.resolve().unwrap().ring_bytes, 32 << 20);
    }

    #[test]
    fn file_keys_are_the_flags_and_flags_win() {
        let file = parse(
            "interval = 5\nfrequency = 499\noverhead-budget = 0.5\nretain = \"2h\"\n\
             metrics-addr = \"off\"\ncomm = \"^py\"\npid = [1]\n",
        )
        .unwrap();
        let flags = AgentOptions {
            frequency: Some(199),
            ..Default::default()
        };
        let c = flags.over(file).resolve().unwrap();
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.frequency, 199, "the flag wins");
        assert_eq!(c.overhead_budget_pct, 0.5);
        assert_eq!(c.retain, Duration::from_secs(7200));
        assert_eq!(c.metrics_addr, None);
        assert!(c.comm.unwrap().is_match("python3"));
        assert_eq!(c.pids, [1]);
    }

    #[test]
    fn pod_selectors_are_keys_and_ask_the_kubelet() {
        let file = parse("namespace = \"shop\"\npod = \"web-1\"\n").unwrap();
        let c = file.clone().resolve().unwrap();
        assert_eq!(c.pods.describe(), "--namespace shop --pod web-1");
        assert_eq!(c.kubelet_url.as_deref(), Some(kubelet::DEFAULT_URL));
        // Both name the cgroups to keep: one or the other.
        let e = AgentOptions {
            cgroup: Some("/".into()),
            ..Default::default()
        }
        .over(file)
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("cgroup: cannot be combined with --pod"),
            "{e}"
        );
    }

    #[test]
    fn bad_input_is_one_line() {
        let e = parse("interval = 5\nfrobnicate = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("unknown field `frobnicate`"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = parse("interval = \"x\"\n").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        let resolve = |o: AgentOptions| o.resolve().unwrap_err().to_string();
        for (o, want) in [
            (
                AgentOptions {
                    overhead_budget: Some(0.0),
                    ..Default::default()
                },
                "overhead-budget: must be",
            ),
            (
                AgentOptions {
                    overhead_budget: Some(150.0),
                    ..Default::default()
                },
                "overhead-budget: must be",
            ),
            (
                AgentOptions {
                    interval: Some(0),
                    ..Default::default()
                },
                "interval: must be",
            ),
            (
                AgentOptions {
                    min_frequency: Some(2000),
                    ..Default::default()
                },
                "min-frequency: must be",
            ),
            (
                AgentOptions {
                    comm: Some("(".into()),
                    ..Default::default()
                },
                "comm: ",
            ),
            (
                AgentOptions {
                    metrics_addr: Some("localhost".into()),
                    ..Default::default()
                },
                "metrics-addr: ",
            ),
            (
                AgentOptions {
                    // The log crate would take "off" (and any case): the agent does not.
                    log_level: Some("off".into()),
                    ..Default::default()
                },
                "log-level: must be",
            ),
            (
                AgentOptions {
                    retain: Some("soon".into()),
                    ..Default::default()
                },
                "retain: ",
            ),
            (
                AgentOptions {
                    cgroup: Some("/sys/fs/cgroup/no/such/cgroup".into()),
                    ..Default::default()
                },
                "cgroup: /sys/fs/cgroup/no/such/cgroup is not a cgroup v2 directory",
            ),
            (
                AgentOptions {
                    pod: Some("web-1".into()),
                    kubernetes: Some(false),
                    ..Default::default()
                },
                "kubernetes: is off, but --pod",
            ),
            (
                AgentOptions {
                    ring_buffer_mib: Some(3),
                    ..Default::default()
                },
                "ring-buffer-mib: must be a power of two between 1 and 1024",
            ),
            (
                AgentOptions {
                    namespace: Some(String::new()),
                    ..Default::default()
                },
                "namespace: must not be empty",
            ),
            (
                // A v1 hierarchy's directory (hybrid layout) also holds cgroup.procs.
                AgentOptions {
                    cgroup: Some("/sys/fs/cgroup/cpu".into()),
                    ..Default::default()
                },
                "cgroup: /sys/fs/cgroup/cpu is not a cgroup v2 directory",
            ),
        ] {
            let e = resolve(o);
            assert!(e.starts_with(want) && !e.contains('\n'), "{e}");
        }
        let level = |l: &str| {
            AgentOptions {
                log_level: Some(l.into()),
                ..Default::default()
            }
            .resolve()
            .map(|c| c.log_level)
        };
        assert_eq!(level("debug").ok(), Some(log::LevelFilter::Debug));
        assert_eq!(level("trace").ok(), Some(log::LevelFilter::Trace));
    }
}
