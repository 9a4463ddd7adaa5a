//! The Grafana dashboard (dist/grafana/cpi-bpf.json) queries only what the agent exports:
//! every metric a query names is in the agent's exposition (its metrics registry fed a
//! cpi-mode window, so every family has series), and every label a query groups or
//! selects by is one the agent sets, or Prometheus's own `instance` and `job`.

use std::collections::BTreeSet;
use std::time::SystemTime;

use crate::agent_sinks::{status, window};
use cpi_agent::metrics::{Metrics, MetricsLimits};
use cpi_agent::push::PushStats;

/// (metric names, label names) of an exposition text.
fn exported(body: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut labels = BTreeSet::from(["instance".to_string(), "job".to_string()]);
    for l in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = l.find(['{', ' ']).unwrap_or(l.len());
        names.insert(l[..end].to_string());
        if let Some(inner) = l[end..].strip_prefix('{') {
            for pair in inner.split("\",") {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
    (names, labels)
}

/// The identifiers of a PromQL expression, in order.
fn identifiers(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
        .collect()
}

/// Label names in `by (…)`, `on (…)` and `{…}` selectors of `expr`.
fn label_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for clause in ["by (", "by(", "on (", "on("] {
        for part in expr.split(clause).skip(1) {
            let inner = part.split(')').next().unwrap_or("");
            out.extend(inner.split(',').map(|l| l.trim().to_string()));
        }
    }
    for part in expr.split('{').skip(1) {
        let inner = part.split('}').next().unwrap_or("");
        for m in inner.split(',') {
            let name = m.split(['=', '!']).next().unwrap_or("").trim();
            out.push(name.to_string());
        }
    }
    out.retain(|l| !l.is_empty());
    out
}

/// Every PromQL query of the dashboard: panel targets and template variables.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => queries(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

#[test]
fn dashboard_queries_name_only_exported_metrics() {
    let m = Metrics::serve("127.0.0.1:0".parse().unwrap(), MetricsLimits::default()).unwrap();
    m.observe(
        &window(&[(10, "alpha"), (11, "beta")], SystemTime::now()),
        &status(1),
    );
    m.set_push_stats(&PushStats {
        ok: 1,
        errors: 1,
        rejected: 1,
        refused: 1,
        dropped_windows: 1,
        queued: 0,
    });
    let (names, labels) = exported(&m.render());
    let path = cpi_tests::workspace_root().join("dist/grafana/cpi-bpf.json");
    let dash: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("the dashboard is JSON");
    let mut all = Vec::new();
    queries(&dash, &mut all);
    assert!(all.len() >= 10, "{all:?}");
    let mut used = BTreeSet::new();
    for q in &all {
        let metrics: Vec<&str> = identifiers(q)
            .into_iter()
            .filter(|t| t.starts_with("cpi_bpf_") || t.starts_with("process_"))
            .collect();
        assert!(!metrics.is_empty(), "a query without an agent metric: {q}");
        for name in metrics {
            assert!(
                names.contains(name),
                "{q}: {name} is not exported; it exports {names:?}"
            );
            used.insert(name);
        }
        for l in label_names(q) {
            assert!(
                labels.contains(&l),
                "{q}: label {l} is not exported ({labels:?})"
            );
        }
    }
    // What the dashboard must show: the per-comm CPI series and the agent's cost.
    for want in [
        "cpi_bpf_cycles_total",
        "cpi_bpf_instructions_total",
        "cpi_bpf_cpu_seconds_total",
        "cpi_bpf_function_cpi",
        "cpi_bpf_sampling_frequency_hz",
        "cpi_bpf_samples_lost_total",
        "process_cpu_seconds_total",
        "cpi_bpf_bpf_run_seconds_total",
        "process_resident_memory_bytes",
        "cpi_bpf_last_window_age_seconds",
    ] {
        assert!(used.contains(want), "the dashboard does not show {want}");
    }
}
