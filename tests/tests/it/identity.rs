//! Who a process is (issue 18 item 2): a test process moved into a cgroup named like a
//! containerd pod's container under the cgroup2 mount gets its pod UID, QoS class and
//! container id, and from a fake kubelet on loopback its pod name, namespace and
//! container name, in the agent's pushed Pyroscope series and their pprof sample labels,
//! and in the store's windows read back by `report --store` (root: cgroups and BPF).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::pyroscope::Receiver;
use cpi_tests::{compile_c, cpi_bpf, require_root, temp_dir, KillOnDrop};

/// Where cgroup2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
/// host), from /proc/self/mountinfo: `… MOUNTPOINT … - cgroup2 …`.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mount = left.split(' ').nth(4)?;
        (right.split(' ').next() == Some("cgroup2")).then(|| PathBuf::from(mount))
    })
}

/// The cgroups a test made, removed innermost first when dropped (after its processes).
struct Cgroups(Vec<PathBuf>);

impl Drop for Cgroups {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A kubelet that answers every request with `body` (a `/pods` list).
fn fake_kubelet(body: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&b[..n]),
                }
            }
            let ok = head.starts_with(b"GET /pods ");
            let answer = if ok { body.as_str() } else { "" };
            let status = if ok { "200 OK" } else { "404 Not Found" };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    url
}

fn label<'a>(labels: &'a [(String, String)], name: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn pod_container_and_names_reach_every_output() {
    if !require_root("creating cgroups and running the agent") {
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        cpi_tests::skip("no cgroup2 mount in /proc/self/mountinfo");
        return;
    };
    let dir = temp_dir("identity");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &[]) else {
        return;
    };
    // Unique per run, so a leftover of a killed run is never reused.
    let tag = format!("{:08x}", std::process::id());
    let uid = format!("{tag}-5a00-11e9-b385-42010a80018d");
    let id = format!("{tag}{}", "0123456789abcdef".repeat(4).get(8..).unwrap());
    assert_eq!(id.len(), 64);
    let parts = [
        "kubepods.slice".to_string(),
        "kubepods-burstable.slice".to_string(),
        format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
        format!("cri-containerd-{id}.scope"),
    ];
    let mut made = Cgroups(Vec::new());
    let mut d = mount.clone();
    for p in &parts {
        d.push(p);
        if !d.exists() {
            std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            made.0.push(d.clone());
        }
    }
    let leaf = d;
    let kubelet = fake_kubelet(format!(
        r#"{{"kind":"PodList","items":[{{"metadata":{{"name":"web-1","namespace":"shop","uid":"{uid}"}},
           "status":{{"containerStatuses":[{{"name":"app","containerID":"containerd://{id}"}}]}}}}]}}"#
    ));
    // The shell joins the cgroup, then becomes the busy program: every sample of it is
    // taken in the cgroup.
    let target = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2" 8"#)
        .arg("sh")
        .arg(&leaf)
        .arg(&busy)
        .spawn()
        .unwrap();
    let target = KillOnDrop(target);
    let pid = target.0.id().to_string();
    let rx = Receiver::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let store = dir.join("store");
    let agent = Command::new(cpi_bpf())
        .args([
            "agent",
            "--pid",
            &pid,
            "--interval",
            "1",
            "--metrics-addr",
            "off",
        ])
        .args(["--service-label", "pod", "--kubelet-url", &kubelet])
        .arg("--push-pyroscope")
        .arg(rx.url())
        .arg("--store")
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("agent.log")).unwrap())
        .spawn()
        .unwrap();
    let agent = KillOnDrop(agent);
    let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let t0 = Instant::now();
    let series = loop {
        let found = rx.accepted().into_iter().flat_map(|p| p.series).find(|s| {
            label(&s.labels, "pod_uid") == Some(&uid) && label(&s.labels, "pod").is_some()
        });
        if let Some(s) = found {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no series of pod {uid} with its name pushed; agent log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(agent);
    drop(target);
    assert_eq!(rx.violations(), Vec::<String>::new());
    // The series: named by the pod (--service-label pod), labelled with the rest.
    assert_eq!(series.service, "web-1");
    for (k, v) in [
        ("pod", "web-1"),
        ("namespace", "shop"),
        ("container", "app"),
        ("container_id", id.as_str()),
        ("qos", "burstable"),
    ] {
        assert_eq!(
            label(&series.labels, k),
            Some(v),
            "{k} in {:?}",
            series.labels
        );
    }
    // Its pprof: every sample labelled with the cgroup path and the same identity.
    let prof = &series.profile;
    let st = |i: i64| prof.string_table[i as usize].as_str();
    assert!(!prof.sample.is_empty());
    let want_cgroup = format!("/{}", parts.join("/"));
    for s in &prof.sample {
        let labels: Vec<(String, String)> = s
            .label
            .iter()
            .filter(|l| l.str != 0)
            .map(|l| (st(l.key).to_string(), st(l.str).to_string()))
            .collect();
        assert_eq!(
            label(&labels, "cgroup"),
            Some(want_cgroup.as_str()),
            "{labels:?}"
        );
        assert_eq!(label(&labels, "pod_uid"), Some(uid.as_str()));
        assert_eq!(label(&labels, "container_id"), Some(id.as_str()));
        assert_eq!(label(&labels, "qos"), Some("burstable"));
        assert_eq!(label(&labels, "namespace"), Some("shop"));
    }
    // The store's windows, merged by `report --store`, keep every field.
    let out = cpi_tests::output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--format", "json", "--store"])
            .arg(&store),
    );
    let json = cpi_tests::stdout_json(&out);
    let procs = json["processes"].as_array().unwrap();
    let me = procs
        .iter()
        .find(|p| p["comm"] == "busy")
        .unwrap_or_else(|| panic!("no busy process in the store: {json}"));
    for (k, v) in [
        ("cgroup", want_cgroup.as_str()),
        ("container_id", id.as_str()),
        ("pod_uid", uid.as_str()),
        ("qos", "burstable"),
        ("pod", "web-1"),
        ("namespace", "shop"),
        ("container", "app"),
    ] {
        assert_eq!(me[k], v, "{k} in {me}");
    }
    drop(made);
    assert!(!leaf.exists(), "{} left behind", leaf.display());
}

/// On this host's own cgroup (no container), the one-shot profile carries the cgroup
/// path and nothing it does not know.
#[test]
fn plain_host_process_has_its_cgroup_only() {
    if !require_root("recording a profile") {
        return;
    }
    let dir = temp_dir("identity-plain");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &[]) else {
        return;
    };
    let out = cpi_tests::output_ok(
        Command::new(cpi_bpf())
            .args(["--format", "json", "--"])
            .arg(&busy)
            .arg("1"),
    );
    let json = cpi_tests::stdout_json(&out);
    let p = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["comm"] == "busy")
        .expect("busy in the profile")
        .clone();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    // The child inherits our cgroup: the unified line's path.
    let want = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    assert_eq!(p["cgroup"], want.trim(), "{p}");
    for k in ["pod", "namespace", "container"] {
        assert!(p.get(k).is_none(), "{k} in {p}");
    }
}
