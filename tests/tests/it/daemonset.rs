//! dist/kubernetes/daemonset.yaml checked offline: against the Kubernetes schemas
//! (`kubernetes-validate --strict`, PyPI, with its bundled schemas; `cargo xtask setup`
//! installs it in a venv at `target/k8s-validate/`), and against what the rest of dist/
//! says: the systemd unit's capabilities and memory backstop, the agent's own config
//! check, the metrics port its liveness probe asks, on the pod's address, behind the
//! NetworkPolicy.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cpi_tests::{cpi_bpf, output_ok, stderr, temp_dir, workspace_root};
use serde_json::Value;

fn manifest() -> PathBuf {
    workspace_root().join("dist/kubernetes/daemonset.yaml")
}

/// The validator's venv; `None` after saying why (it fails under CI).
fn venv() -> Option<PathBuf> {
    let v = workspace_root().join("target/k8s-validate/bin");
    if v.join("kubernetes-validate").exists() {
        return Some(v);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} missing: run `cargo xtask setup`",
        v.display()
    );
    cpi_tests::skip(format_args!(
        "kubernetes-validate not installed (cargo xtask setup installs it)"
    ));
    None
}

/// `kubernetes-validate --strict FILE` with every proxy pointing at a closed port: the
/// schemas must come from the package, not the network.
fn validate(venv: &Path, file: &Path) -> Output {
    let mut cmd = Command::new(venv.join("kubernetes-validate"));
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        cmd.env(var, "http://127.0.0.1:9");
    }
    cmd.arg("--strict").arg(file).output().unwrap()
}

/// The manifest's documents as JSON (PyYAML, which the validator brings).
fn documents(venv: &Path) -> Vec<Value> {
    let out = output_ok(
        Command::new(venv.join("python"))
            .args([
                "-c",
                "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            ])
            .arg(manifest()),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn daemonset_passes_the_kubernetes_schemas() {
    let Some(venv) = venv() else { return };
    let out = validate(&venv, &manifest());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{text}");
    for resource in [
        "namespace/cpi-bpf",
        "configmap/cpi-bpf-agent",
        "daemonset/cpi-bpf",
        "networkpolicy/cpi-bpf-metrics",
    ] {
        assert!(
            text.contains(&format!("passed for resource {resource}")),
            "{resource}: {text}"
        );
    }
    // The same validator refuses a wrong type where the manifest has a boolean.
    let dir = temp_dir("daemonset-bad");
    let bad = dir.join("bad.yaml");
    let yaml = std::fs::read_to_string(manifest()).unwrap();
    assert!(yaml.contains("hostPID: true"));
    std::fs::write(&bad, yaml.replace("hostPID: true", "hostPID: \"yes\"")).unwrap();
    let out = validate(&venv, &bad);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("hostPID"), "{text}");
}

#[test]
fn daemonset_agrees_with_the_unit_and_the_agent() {
    let Some(venv) = venv() else { return };
    let docs = documents(&venv);
    let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap();
    let pod = &kind("DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    let c = &pod["containers"][0];

    // The capabilities of dist/cpi-bpf.service, no more.
    let unit = std::fs::read_to_string(workspace_root().join("dist/cpi-bpf.service")).unwrap();
    let line = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} in the unit"))
    };
    let mut want: Vec<&str> = line("CapabilityBoundingSet=")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_"))
        .collect();
    let caps = &c["securityContext"]["capabilities"];
    let mut got: Vec<&str> = caps["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]));
    assert_eq!(c["securityContext"]["privileged"], false);
    // Memory backstop as the unit's MemoryMax (M there, Mi here: both MiB).
    let max = line("MemoryMax=").trim_end_matches('M');
    assert_eq!(c["resources"]["limits"]["memory"], format!("{max}Mi"));

    // The args: the store on a hostPath, metrics on the port the probe asks.
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let arg = |flag: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(flag))
            .unwrap_or_else(|| panic!("{flag} in {args:?}"))
    };
    let mount = |name: &str| {
        let m = c["volumeMounts"].as_array().unwrap();
        let m = m.iter().find(|m| m["name"] == name).unwrap();
        let v = pod["volumes"].as_array().unwrap();
        (
            m["mountPath"].as_str().unwrap().to_string(),
            v.iter().find(|v| v["name"] == name).unwrap().clone(),
        )
    };
    let (store, vol) = mount("store");
    assert_eq!(arg("--store="), store);
    assert_eq!(vol["hostPath"]["path"], "/var/lib/cpi-bpf");
    // Metrics on the pod's own address (the downward API's), not every address.
    let (host, port) = arg("--metrics-addr=").rsplit_once(':').unwrap();
    assert_eq!(host, "$(POD_IP)");
    let env = c["env"].as_array().unwrap();
    let pod_ip = env.iter().find(|e| e["name"] == "POD_IP").unwrap();
    assert_eq!(pod_ip["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
    let probe = &c["livenessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/metrics");
    let named = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == probe["port"])
        .expect("the probe's port is a named container port");
    assert_eq!(named["containerPort"].to_string(), port);
    // Only what the NetworkPolicy lets in reaches that port: the agent's pods, ingress
    // on the metrics port from the pods it names.
    let policy = &kind("NetworkPolicy")["spec"];
    assert_eq!(
        policy["podSelector"]["matchLabels"],
        kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    );
    assert_eq!(policy["policyTypes"], serde_json::json!(["Ingress"]));
    let ingress = policy["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert_eq!(ingress[0]["ports"][0]["port"], named["name"]);
    let from = ingress[0]["from"].as_array().unwrap();
    assert!(
        from.iter()
            .all(|f| f["podSelector"]["matchLabels"].is_object()),
        "a source without a pod selector lets every pod in: {from:?}"
    );
    let (config, _) = mount("config");
    let (binary, _) = mount("binary");
    assert_eq!(c["command"][0], binary);

    // The agent itself accepts the ConfigMap's config and the args (paths made local).
    let dir = temp_dir("daemonset-agent");
    let toml = dir.join("agent.toml");
    std::fs::write(
        &toml,
        kind("ConfigMap")["data"]["agent.toml"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(arg("--config="), format!("{config}/agent.toml"));
    let st = dir.join("store");
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(args.iter().map(|a| {
                if a.starts_with("--config=") {
                    format!("--config={}", toml.display())
                } else if a.starts_with("--store=") {
                    format!("--store={}", st.display())
                } else if a.starts_with("--metrics-addr=") {
                    "--metrics-addr=127.0.0.1:0".into()
                } else {
                    a.to_string()
                }
            }))
            .arg("--check-config"),
    );
    assert!(stderr(&out).contains("config OK"), "{}", stderr(&out));
}
