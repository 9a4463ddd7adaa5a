//! `agent`: always-on profiling (cpi-agent/src/lib.rs). Flags → options over the
//! `--config` file → checked config → sinks, then collection; runs until SIGTERM/SIGINT.

use std::path::PathBuf;

use cpi_agent::config::{AgentConfig, AgentOptions};
use cpi_agent::Agent;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML file with the same keys as these flags (dist/agent.toml); flags win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Check the configuration (and that the store, metrics address and push URL are
    /// usable), print it, and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Only this process, all its threads (repeatable; dropped in the kernel, processes
    /// it forks later are not kept: use --cgroup for those). Default: system-wide.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Only processes whose name matches REGEX (applied to each window's samples).
    #[arg(long, value_name = "REGEX")]
    pub comm: Option<String>,
    /// Only processes in this cgroup v2 directory or below it, dropped in the kernel
    /// (a path under /sys/fs/cgroup, or relative to the cgroup v2 mount).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Only the pods of this name, dropped in the kernel by their cgroups (Kubernetes:
    /// names from the kubelet; pods that appear later are added at its refresh).
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
    /// Only the pods of this namespace (as --pod).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Only the containers of this name in the pods selected (as --pod).
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// Window length, seconds (windows end on multiples of it on the wall clock)
    /// [default: 10].
    #[arg(long, value_name = "SECS")]
    pub interval: Option<u64>,
    /// Samples per second per busy CPU, the most the governor uses [default: 999].
    #[arg(long, value_name = "HZ")]
    pub frequency: Option<u64>,
    /// The least the governor lowers the frequency to [default: 19].
    #[arg(long, value_name = "HZ")]
    pub min_frequency: Option<u64>,
    /// CPU budget of the agent plus its BPF programs, percent of one CPU [default: 0.5].
    #[arg(long, value_name = "PCT")]
    pub overhead_budget: Option<f64>,
    /// Bound of what outlives windows and what call stacks hold, MiB: each window's
    /// stacks an eighth, unwind-table pages resident a quarter, cached binaries and
    /// symbols the rest [default: 64].
    #[arg(long, value_name = "MIB")]
    pub cache_mib: Option<u64>,
    /// Store directory: one gzip'd profile per window [default: /var/lib/cpi-bpf].
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// Keep windows this long [default: 24h].
    #[arg(long, value_name = "DURATION")]
    pub retain: Option<String>,
    /// Keep at most this much in the store, MiB [default: 1024].
    #[arg(long, value_name = "MIB")]
    pub store_max_mib: Option<u64>,
    /// Let this group read the store (directory 0750, windows 0640) [default: root only,
    /// 0700/0600].
    #[arg(long, value_name = "GROUP")]
    pub store_group: Option<String>,
    /// Prometheus /metrics address, or `off` [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Comms with their own series; the rest are comm="other" [default: 20].
    #[arg(long, value_name = "N")]
    pub metrics_top_comms: Option<usize>,
    /// Functions with a cpi_bpf_function_cpi series [default: 20].
    #[arg(long, value_name = "N")]
    pub metrics_top_functions: Option<usize>,
    /// Push each window to Pyroscope at this URL: `http[s]://[USER@]host[:port][/path]`
    /// (a USER is basic auth, its password in --push-password-file).
    #[arg(long, value_name = "URL")]
    pub push_pyroscope: Option<String>,
    /// Push each window to an OpenTelemetry Collector as OTLP/HTTP profiles (protobuf,
    /// POST URL/v1development/profiles); the same TLS, credentials and queue flags.
    #[arg(long, value_name = "URL")]
    pub push_otlp: Option<String>,
    /// X-Scope-OrgID of the pushes.
    #[arg(long, value_name = "TENANT")]
    pub push_tenant: Option<String>,
    /// PEM CA certificates trusted for https pushes, beside the system's.
    #[arg(long, value_name = "FILE")]
    pub push_ca: Option<PathBuf>,
    /// File holding the password of the URL's user (never give it on the command line).
    #[arg(long, value_name = "FILE")]
    pub push_password_file: Option<PathBuf>,
    /// File holding a bearer token for the pushes.
    #[arg(long, value_name = "FILE")]
    pub push_token_file: Option<PathBuf>,
    /// service_name of pushed series: comm, cgroup, pod, namespace or container
    /// [default: comm].
    #[arg(long, value_name = "LABEL")]
    pub service_label: Option<String>,
    /// Pod, namespace and container names from the kubelet's read-only API [default:
    /// on when /var/lib/kubelet/pods exists].
    #[arg(long)]
    pub kubernetes: bool,
    /// The kubelet's read-only API [default: http://127.0.0.1:10255].
    #[arg(long, value_name = "URL")]
    pub kubelet_url: Option<String>,
    /// Windows waiting to be pushed at most (the oldest is dropped) [default: 8].
    #[arg(long, value_name = "N")]
    pub push_queue: Option<usize>,
    /// Deadline of one push request, seconds [default: 10].
    #[arg(long, value_name = "SECS")]
    pub push_timeout: Option<u64>,
    /// Sample kernel code too.
    #[arg(long)]
    pub include_kernel: bool,
    /// Leaf-only samples: no call stacks (less time in the kernel per sample).
    #[arg(long)]
    pub no_stacks: bool,
    /// Source file and line of each sampled instruction, from the binaries' DWARF, in
    /// the windows and pushes (costs CPU on hosts that run binaries with debug info).
    #[arg(long)]
    pub source_lines: bool,
    /// BPF ring buffer size, MiB (a power of two) [default: what holds 200 ms of samples
    /// at --frequency on every CPU, 1 to 16: 4 on 2 CPUs at 999 Hz].
    #[arg(long, value_name = "MIB")]
    pub ring_buffer_mib: Option<u32>,
    /// error, warn, info, debug or trace [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let flags = AgentOptions {
        pid: args.pids,
        comm: args.comm,
        cgroup: args.cgroup,
        pod: args.pod,
        namespace: args.namespace,
        container: args.container,
        interval: args.interval,
        frequency: args.frequency,
        min_frequency: args.min_frequency,
        overhead_budget: args.overhead_budget,
        cache_mib: args.cache_mib,
        store: args.store,
        retain: args.retain,
        store_max_mib: args.store_max_mib,
        store_group: args.store_group,
        metrics_addr: args.metrics_addr,
        metrics_top_comms: args.metrics_top_comms,
        metrics_top_functions: args.metrics_top_functions,
        push_pyroscope: args.push_pyroscope,
        push_otlp: args.push_otlp,
        push_tenant: args.push_tenant,
        push_ca: args.push_ca,
        push_password_file: args.push_password_file,
        push_token_file: args.push_token_file,
        service_label: args.service_label,
        kubernetes: args.kubernetes.then_some(true),
        kubelet_url: args.kubelet_url,
        push_queue: args.push_queue,
        push_timeout: args.push_timeout,
        include_kernel: args.include_kernel.then_some(true),
        stacks: args.no_stacks.then_some(false),
        source_lines: args.source_lines.then_some(true),
        ring_buffer_mib: args.ring_buffer_mib,
        log_level: args.log_level,
    };
    let options = match &args.config {
        Some(path) => flags.over(AgentOptions::from_file(path)?),
        None => flags,
    };
    let config = options.resolve()?;
    if args.check_config {
        cpi_agent::check(&config)?;
        eprintln!("cpi-bpf: config OK: {}", summary(&config));
        return Ok(0);
    }
    // The agent's messages and the rest of the library's (symbolising, pushing,
    // metrics) go through the `log` facade: `cpi-bpf: [error: |warning: ]MESSAGE`,
    // escaped, on stderr, up to `--log-level`.
    crate::init_logging(config.log_level);
    let a = Agent::new(config.clone())?;
    log::info!(
        "agent: {} windows of {} s into {}{}{}",
        a.mode().name(),
        config.interval.as_secs(),
        config.store.display(),
        config
            .metrics_addr
            .map(|m| format!(", metrics on http://{m}/metrics"))
            .unwrap_or_default(),
        [&config.push_url, &config.otlp_url]
            .into_iter()
            .flatten()
            .map(|u| format!(", pushing to {u}"))
            .collect::<String>(),
    );
    let summary = a.run()?;
    log::info!("agent: stopped after {} windows", summary.windows);
    Ok(0)
}

/// The checked configuration in one line, in the flags' words.
fn summary(c: &AgentConfig) -> String {
    let target = if c.pids.is_empty() {
        "system-wide".to_string()
    } else {
        let pids: Vec<String> = c.pids.iter().map(u32::to_string).collect();
        format!("--pid {}", pids.join(","))
    };
    let mut s = format!(
        "{target}, windows of {} s into {} (kept {}, at most {} MiB), {}-{} Hz within {} % \
         of a CPU",
        c.interval.as_secs(),
        c.store.display(),
        humantime::format_duration(c.retain),
        c.store_max_bytes >> 20,
        c.min_frequency,
        c.frequency,
        c.overhead_budget_pct
    );
    if let Some(re) = &c.comm {
        s += &format!(", --comm {}", re.as_str());
    }
    if let Some(cg) = &c.cgroup {
        s += &format!(", --cgroup {}", cg.display());
    }
    if !c.pods.is_empty() {
        s += &format!(", {}", c.pods.describe());
    }
    match c.metrics_addr {
        Some(m) => s += &format!(", metrics on http://{m}/metrics"),
        None => s += ", no metrics",
    }
    for u in [&c.push_url, &c.otlp_url].into_iter().flatten() {
        s += &format!(", pushing to {u}");
        if c.push_password_file.is_some() {
            s += " with basic auth";
        } else if c.push_token_file.is_some() {
            s += " with a bearer token";
        }
    }
    if let Some(g) = c.store_group {
        s += &format!(", store readable by group {g}");
    }
    if c.include_kernel {
        s += ", kernel included";
    }
    if !c.stacks {
        s += ", no call stacks";
    }
    if c.source_lines {
        s += ", source lines";
    }
    s
}
