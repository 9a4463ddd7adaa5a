//! Who a process is: a test process moved into a cgroup named like a
//! containerd pod's container under the cgroup2 mount gets its pod UID, QoS class and
//! container id, and from a fake kubelet on loopback its pod name, namespace and
//! container name, in the agent's pushed Pyroscope series and their pprof sample labels,
//! and in the store's windows read back by `report --store` (root: cgroups and BPF).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cpi_tests::pyroscope::Receiver;
use cpi_tests::{
    agent, compile_c, cpi_bpf, cpu_heavy, pod_list, require_root, stop_agent, store_windows,
    temp_dir, KillOnDrop,
};
use serde_json::Value;

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

/// Makes the cgroup directories `parts` (each inside the one before) under `mount`;
/// the innermost is the last. Two tests may share the outer ones.
fn make_cgroups(mount: &Path, parts: &[String]) -> Cgroups {
    let mut made = Cgroups(Vec::new());
    let mut d = mount.to_path_buf();
    for p in parts {
        d.push(p);
        match std::fs::create_dir(&d) {
            Ok(()) => made.0.push(d.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("{}: {e}", d.display()),
        }
    }
    made
}

/// The cgroup path parts of a burstable pod's containerd container.
fn pod_parts(uid: &str, id: &str) -> [String; 4] {
    [
        "kubepods.slice".to_string(),
        "kubepods-burstable.slice".to_string(),
        format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
        format!("cri-containerd-{id}.scope"),
    ]
}

/// The same below a kind node (a kubelet with `--cgroup-root=/kubelet` and the systemd
/// driver, in a node cgroup `node`), a best-effort pod: where the agent must look for
/// the kubelet's pods cgroup itself.
fn nested_pod_parts(node: &str, uid: &str, id: &str) -> [String; 6] {
    [
        node.to_string(),
        "kubelet.slice".to_string(),
        "kubelet-kubepods.slice".to_string(),
        "kubelet-kubepods-besteffort.slice".to_string(),
        format!(
            "kubelet-kubepods-besteffort-pod{}.slice",
            uid.replace('-', "_")
        ),
        format!("cri-containerd-{id}.scope"),
    ]
}

/// `busy SECS` started in cgroup `dir`: the shell joins it, then becomes the busy
/// program, so every sample of it is taken in the cgroup.
fn busy_in(dir: &Path, busy: &Path, secs: &str) -> KillOnDrop {
    KillOnDrop(
        Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2" "$3""#)
            .arg("sh")
            .arg(dir)
            .arg(busy)
            .arg(secs)
            .spawn()
            .unwrap(),
    )
}

/// A kubelet on loopback that answers `GET /pods` with the list it holds then.
struct FakeKubelet {
    url: String,
    body: Arc<Mutex<String>>,
    served: Arc<AtomicUsize>,
}

/// A listener on a free loopback port whose socket belongs to `fsuid`: made by a thread
/// that takes that fsuid for the `socket` call (the kernel gives a socket its creator's
/// fsuid; setfsuid changes only the calling thread's), as another user's would be.
fn listen_as(fsuid: u32) -> TcpListener {
    std::thread::spawn(move || {
        // SAFETY: setfsuid changes this thread's fsuid only; no memory is touched.
        let was = unsafe { libc::syscall(libc::SYS_setfsuid, fsuid) };
        let l = TcpListener::bind("127.0.0.1:0");
        // SAFETY: as above, back to what it was.
        unsafe { libc::syscall(libc::SYS_setfsuid, was) };
        l.unwrap()
    })
    .join()
    .unwrap()
}

impl FakeKubelet {
    fn start(body: String) -> FakeKubelet {
        Self::start_as(body, 0)
    }

    /// The same, its socket `fsuid`'s.
    fn start_as(body: String, fsuid: u32) -> FakeKubelet {
        let l = listen_as(fsuid);
        let url = format!("http://{}", l.local_addr().unwrap());
        let body = Arc::new(Mutex::new(body));
        let served = Arc::new(AtomicUsize::new(0));
        let (list, count) = (body.clone(), served.clone());
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
                let answer = if ok {
                    list.lock().unwrap().clone()
                } else {
                    String::new()
                };
                let status = if ok { "200 OK" } else { "404 Not Found" };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        FakeKubelet { url, body, served }
    }

    /// From now on, the list is `body`.
    fn set(&self, body: String) {
        *self.body.lock().unwrap() = body;
    }

    /// Requests answered so far.
    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
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
    let parts = pod_parts(&uid, &id);
    let made = make_cgroups(&mount, &parts);
    let leaf = mount.join(parts.join("/"));
    let kubelet = FakeKubelet::start(pod_list(&[(&uid, "web-1", "shop", &id)]));
    let target = busy_in(&leaf, &busy, "8");
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
        .args(["--service-label", "pod", "--kubelet-url", &kubelet.url])
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

/// The pids of a stored window's processes.
fn pids(w: &Value) -> Vec<u64> {
    w["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}

/// Waits (at most 60 s) until the store holds a window after the first `after` for
/// which `want` holds; its index.
fn wait_window(store: &Path, after: usize, want: impl Fn(&Value) -> bool) -> usize {
    let t0 = Instant::now();
    loop {
        let ws = store_windows(store);
        if let Some(i) = ws.iter().skip(after).position(|w| want(&w.2)) {
            return after + i;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no such window in 60 s: {:?}",
            ws.iter().map(|w| pids(&w.2)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The Kubernetes selectors filter in the kernel: two busy processes in
/// two pods of the same name in two namespaces, and an agent with `--namespace shop
/// --pod web-1`. The kept pod sits below a kind-style node cgroup (the kubelet's pods
/// cgroup nested, `kubelet-kubepods.slice`), the other at the top (`kubepods.slice`). While the kubelet lists only the other pod, nothing is sampled (one log
/// line, however many refreshes); once it lists the pod, its process alone fills the
/// windows, named, and the other's samples are dropped in the kernel; once the pod is
/// gone from the list, nothing again.
#[test]
fn pod_selectors_keep_one_pod_in_the_kernel() {
    if !require_root("creating cgroups and running the agent") {
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        cpi_tests::skip("no cgroup2 mount in /proc/self/mountinfo");
        return;
    };
    let _cpu = cpu_heavy();
    let dir = temp_dir("identity-select");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &[]) else {
        return;
    };
    let tag = format!("{:08x}", std::process::id());
    let pod = |n: u32| {
        let uid = format!("{tag}-5a01-11e9-b385-42010a80018{n}");
        let id = format!("{tag}{n}{}", &"0123456789abcdef".repeat(4)[9..]);
        (uid, id)
    };
    let ((ua, ia), (ub, ib)) = (pod(1), pod(2));
    let (pa, pb) = (
        nested_pod_parts(&format!("cpi-test-node-{tag}.scope"), &ua, &ia),
        pod_parts(&ub, &ib),
    );
    let (made_a, made_b) = (make_cgroups(&mount, &pa), make_cgroups(&mount, &pb));
    let kept = busy_in(&mount.join(pa.join("/")), &busy, "120");
    let other = busy_in(&mount.join(pb.join("/")), &busy, "120");
    let (kept_pid, other_pid) = (kept.0.id() as u64, other.0.id() as u64);
    let only_other = pod_list(&[(&ub, "web-1", "test", &ib)]);
    let kubelet = FakeKubelet::start(only_other.clone());
    let store = dir.join("store");
    let mut a = KillOnDrop(agent(
        &store,
        &[
            "--no-stacks",
            "--kubelet-url",
            &kubelet.url,
            "--namespace",
            "shop",
            "--pod",
            "web-1",
        ],
    ));
    // Not yet listed: nothing kept, over two kubelet refreshes (the start's and one).
    let filtered = |w: &Value| w["lost"]["filtered_in_kernel"].as_u64().unwrap() > 0;
    wait_window(&store, 0, |w| filtered(w) && pids(w).is_empty());
    let t0 = Instant::now();
    while kubelet.served() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent asked the kubelet once"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = store_windows(&store).len();
    kubelet.set(pod_list(&[
        (&ua, "web-1", "shop", &ia),
        (&ub, "web-1", "test", &ib),
    ]));
    let came = wait_window(&store, before, |w| pids(w).contains(&kept_pid));
    // Kept, and the other pod's process dropped in the kernel, window after window.
    let full = wait_window(&store, came + 2, |_| true);
    for (_, _, w) in &store_windows(&store)[came + 1..=full] {
        assert_eq!(pids(w), [kept_pid], "{w}");
        assert!(filtered(w), "nothing dropped in the kernel: {}", w["lost"]);
        let p = &w["processes"][0];
        assert_eq!(
            (p["pod"].as_str(), p["namespace"].as_str()),
            (Some("web-1"), Some("shop"))
        );
    }
    // Gone from the list: out of the filter at the next refresh, for good (three
    // windows in a row without it; a window before that could lack it by chance).
    kubelet.set(only_other);
    let t0 = Instant::now();
    let gone = loop {
        let ws = store_windows(&store);
        let run = (full + 1..ws.len().saturating_sub(2)).find(|&i| {
            ws[i..i + 3]
                .iter()
                .all(|w| pids(&w.2).is_empty() && filtered(&w.2))
        });
        if let Some(i) = run {
            break i;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "pod {ua} never left the filter"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = stop_agent(&mut a.0);
    let ws = store_windows(&store);
    // Nothing of the pod after it left.
    for (_, _, w) in &ws[gone..] {
        assert!(!pids(w).contains(&kept_pid), "{w}");
    }
    // The other pod was never sampled.
    assert!(ws.iter().all(|w| !pids(&w.2).contains(&other_pid)));
    let lines = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        lines("--namespace shop --pod web-1: no such pod"),
        2,
        "{log}"
    );
    assert_eq!(
        lines("--namespace shop --pod web-1: sampling 1 cgroup"),
        1,
        "{log}"
    );
    drop((kept, other));
    drop((made_a, made_b));
}

/// A dead kubelet is visible: pointed at a port nothing listens on, the agent (with a
/// pod selector, so it asks at start and at every refresh) counts each failed request in
/// `cpi_bpf_kubelet_requests_total{result="failed"}` on `/metrics`, and says so in one
/// log line, not one per request.
#[test]
fn dead_kubelet_is_counted_on_metrics_and_logged_once() {
    if !require_root("running the agent") {
        return;
    }
    if cgroup2_mount().is_none() {
        cpi_tests::skip("no cgroup2 mount in /proc/self/mountinfo");
        return;
    }
    let dir = temp_dir("identity-dead-kubelet");
    let dead = format!("http://127.0.0.1:{}", cpi_tests::free_port());
    let (agent, metrics) = cpi_tests::agent_with_metrics(
        &dir,
        &["--interval", "1", "--kubelet-url", &dead, "--pod", "web-1"],
    );
    let count = |result: &str| {
        let (_, body) = cpi_tests::http_get(metrics, "/metrics").ok()?;
        cpi_tests::labelled(&body, "cpi_bpf_kubelet_requests_total", "result", result)
    };
    let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let t0 = Instant::now();
    // The start's request, then a refresh's: the counter rises.
    while count("failed").unwrap_or(0.0) < 2.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "failed kubelet requests {:?} after 60 s; agent log:\n{}",
            count("failed"),
            log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(count("ok"), Some(0.0));
    drop(agent);
    let log = log();
    let told: Vec<&str> = log.lines().filter(|l| l.contains(&dead)).collect();
    assert_eq!(told.len(), 1, "{log}");
    assert!(told[0].starts_with("cpi-bpf: warning: kubelet "), "{log}");
}

/// Hostile host: where the kubelet's read-only port is off, a user listening on it must not
/// name root's pods. A kubelet whose socket belongs to uid 65534 lists the busy
/// process's pod as `attacker-says-this-is-idle` in `attacker-ns`: no window carries a
/// name from it (the cgroup-derived ids stay), each request is counted refused, and
/// one line says why.
#[test]
fn a_kubelet_port_another_user_listens_on_names_nothing() {
    if !require_root("creating cgroups, a socket as another user, and running the agent") {
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        cpi_tests::skip("no cgroup2 mount in /proc/self/mountinfo");
        return;
    };
    let dir = temp_dir("identity-foreign-kubelet");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &[]) else {
        return;
    };
    let tag = format!("{:08x}", std::process::id());
    let uid = format!("{tag}-5a00-11e9-b385-42010a80018e");
    let id = format!("{tag}{}", "fedcba9876543210".repeat(4).get(8..).unwrap());
    let parts = pod_parts(&uid, &id);
    let made = make_cgroups(&mount, &parts);
    let leaf = mount.join(parts.join("/"));
    let list = pod_list(&[(&uid, "attacker-says-this-is-idle", "attacker-ns", &id)]);
    let kubelet = FakeKubelet::start_as(list, 65534);
    // Built (on first use) before the busy process's time starts.
    cpi_bpf();
    let target = busy_in(&leaf, &busy, "15");
    let pid = target.0.id().to_string();
    let (agent, metrics) = cpi_tests::agent_with_metrics(
        &dir,
        &[
            "--pid",
            &pid,
            "--interval",
            "1",
            "--kubelet-url",
            &kubelet.url,
        ],
    );
    let refused = || {
        let (_, body) = cpi_tests::http_get(metrics, "/metrics").ok()?;
        cpi_tests::labelled(&body, "cpi_bpf_kubelet_requests_total", "result", "refused")
    };
    let store = dir.join("store");
    let busy_pid: u64 = pid.parse().unwrap();
    let ours = |w: &Value| {
        w["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["pid"] == busy_pid && p["pod_uid"] == uid.as_str())
    };
    // Each window with the pod's process asked the kubelet (a miss) while analysed.
    let at = wait_window(&store, 0, ours);
    wait_window(&store, at + 1, ours);
    for (_, _, w) in store_windows(&store) {
        for p in w["processes"].as_array().into_iter().flatten() {
            for k in ["pod", "namespace", "container"] {
                assert!(p.get(k).is_none(), "{k} from uid 65534's kubelet: {p}");
            }
        }
    }
    let t0 = Instant::now();
    while refused().unwrap_or(0.0) < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "no refusal counted");
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(agent);
    drop(target);
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap();
    let told: Vec<&str> = log.lines().filter(|l| l.contains(&kubelet.url)).collect();
    assert_eq!(told.len(), 1, "{log}");
    assert!(told[0].contains("by uid 65534, not root"), "{log}");
    drop(made);
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
