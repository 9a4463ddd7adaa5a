//! OTLP profiles (`--format otlp`, `agent --push-otlp`) decoded by the official
//! `opentelemetry-proto` package (tests/src/otlp.rs), not by the project's own types:
//! sample types, values summing to the profile's totals, the frames' function names,
//! the resource attributes; and the push against a local receiver that enforces
//! OTLP/HTTP's wire contract (a local receiver, not a Collector).

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::report_fixture::{cpi_profile, scratch, time_profile};
use cpi_agent::push::{PushConfig, Pusher, ServiceLabel};
use cpi_agent::Window;
use cpi_tests::otlp::{decode, Receiver};
use cpi_user::profile::model::*;
use cpi_user::profile::stack::StackEnd;
use serde_json::Value;

/// The CPI fixture with a container and pod, a call path main → crc_update and the
/// call edge behind it.
fn profile_with_paths() -> Profile {
    let mut p = cpi_profile();
    let pr = &mut p.processes[0];
    pr.identity.container_id = Some("c0ffee".repeat(10) + "c0ff");
    pr.identity.pod = Some("web-7d4f".into());
    pr.identity.namespace = Some("shop".into());
    let bin = pr.functions[0].binary.clone();
    let frame = |function: &str, address| StackFrame {
        function: function.into(),
        binary: bin.clone(),
        address,
    };
    pr.stacks.push(StackProfile {
        frames: vec![frame("crc_update", 0x401200), frame("main", 0x401185)],
        end: StackEnd::Complete,
        samples: 12_000,
        branch_samples: 0,
        time_ns: None,
        cycles: Some(1.2e10),
        instructions: Some(5.0e9),
        cpi: None,
        cycles_rel_error: None,
        instructions_rel_error: None,
        range_hits: 0,
    });
    pr.calls.push(CallEdge {
        caller: "main".into(),
        caller_binary: bin.clone(),
        callee: "crc_update".into(),
        callee_binary: bin,
        count: 1.0e6,
        samples: 100,
    });
    p
}

/// A resource attribute of a decoded resource.
fn attr<'a>(resource: &'a Value, key: &str) -> &'a Value {
    &resource["attributes"][key]
}

/// The decoded profiles of the first resource, by sample type.
fn profiles(resource: &Value) -> Vec<&Value> {
    let scopes = resource["scopes"].as_array().unwrap();
    assert_eq!(scopes.len(), 1);
    scopes[0]["profiles"].as_array().unwrap().iter().collect()
}

/// The sum of `profile`'s values whose stack's leaf is `function`, and the rounding it
/// may carry: a call path's value is spread over its leaf's sampled addresses, each
/// share rounded (cpi-user/src/report/pprof.rs), so up to 0.5 per such sample.
fn leaf_sum(profile: &Value, function: &str) -> (i64, i64) {
    let mut sum = 0;
    let mut split = 0;
    for s in profile["stacks"].as_array().unwrap() {
        let frames = s["frames"].as_array().unwrap();
        if frames[0] == function {
            sum += s["value"].as_i64().unwrap();
            split += i64::from(frames.len() > 1);
        }
    }
    (sum, split)
}

/// Checks a decoded CPI request against `p` (one process): what the resource says, the
/// sample types, each function's and the process's totals, the call path and edge.
fn check_cpi(decoded: &Value, p: &Profile) {
    let resources = decoded["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 1, "{decoded}");
    let r = &resources[0];
    let pr = &p.processes[0];
    assert_eq!(attr(r, "service.name"), "bench");
    assert_eq!(attr(r, "process.executable.name"), "bench");
    assert_eq!(attr(r, "process.pid"), &Value::from(pr.pid));
    assert_eq!(
        attr(r, "container.id").as_str(),
        pr.identity.container_id.as_deref()
    );
    assert_eq!(attr(r, "k8s.pod.name"), "web-7d4f");
    assert_eq!(attr(r, "k8s.namespace.name"), "shop");
    let scope = &r["scopes"][0]["scope"];
    assert_eq!(
        (&scope["name"], &scope["version"]),
        (
            &Value::from("cpi-bpf"),
            &Value::from(p.tool_version.as_str())
        )
    );
    let ps = profiles(r);
    let types: Vec<(&str, &str)> = ps
        .iter()
        .map(|x| (x["type"].as_str().unwrap(), x["unit"].as_str().unwrap()))
        .collect();
    assert_eq!(
        types,
        [
            ("cycles", "count"),
            ("instructions", "count"),
            ("samples", "count"),
            ("calls", "count")
        ]
    );
    for x in &ps {
        assert_eq!(
            (&x["period_type"], &x["period"]),
            (&"cycles".into(), &1_000_003.into())
        );
        assert_eq!(x["attributes"]["cpi_bpf.mode"], "cpi");
    }
    // Per function, its samples as leaf hold its totals, and over the process what the
    // functions hold, each to the rounding of the call path's split.
    type Total = fn(&FunctionProfile) -> f64;
    let totals: [Total; 3] = [
        |f| f.measures.cycles.unwrap(),
        |f| f.measures.instructions.unwrap(),
        |f| f.samples as f64,
    ];
    for (x, total) in ps.iter().zip(totals) {
        for f in &pr.functions {
            let (sum, rounding) = leaf_sum(x, &f.name);
            let want = total(f).round() as i64;
            assert!(
                (sum - want).abs() <= rounding,
                "{} {}: {sum} vs {want}",
                x["type"],
                f.name
            );
        }
        let want: i64 = pr.functions.iter().map(|f| total(f).round() as i64).sum();
        let rounding: i64 = pr.functions.iter().map(|f| leaf_sum(x, &f.name).1).sum();
        let sum = x["sum"].as_i64().unwrap();
        assert!(
            (sum - want).abs() <= rounding,
            "{}: {sum} vs {want}",
            x["type"]
        );
    }
    let cycles = ps[0]["sum"].as_i64().unwrap() - pr.measures.cycles.unwrap().round() as i64;
    assert!(cycles.abs() <= 1, "cycles off by {cycles}");
    // The call path, leaf first, in every type but calls; the edge as [callee, caller].
    let has = |x: &Value, frames: &[&str]| {
        x["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["frames"] == serde_json::json!(frames))
    };
    for x in &ps[..3] {
        assert!(has(x, &["crc_update", "main"]), "{}: {x}", x["type"]);
    }
    assert!(has(ps[3], &["crc_update", "main"]));
    assert_eq!(ps[3]["sum"], 1_000_000);
    let build_ids = decoded["build_ids"].as_array().unwrap();
    assert!(
        build_ids.contains(&"5f0c3a2b9d1e4f60718293a4b5c6d7e8f9a0b1c2".into()),
        "{build_ids:?}"
    );
}

/// `cpi-bpf report --format otlp`: a CPI profile with a call path, and a time profile.
#[test]
fn otlp_file_decodes_with_the_official_package() {
    let dir = scratch("otlp-file");
    let p = profile_with_paths();
    let write = |name: &str, p: &Profile| {
        let json = dir.join(format!("{name}.json"));
        let f = std::fs::File::create(&json).unwrap();
        cpi_user::report::file::write_json(p, f).unwrap();
        let out = dir.join(format!("{name}.otlp"));
        let run = Command::new(cpi_tests::cpi_bpf())
            .arg("report")
            .arg(&json)
            .args(["--format", "otlp", "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::read(out).unwrap()
    };
    let Some(decoded) = decode(&write("cpi", &p)).unwrap() else {
        return;
    };
    check_cpi(&decoded, &p);
    let r = &decoded["resources"][0];
    for x in profiles(r) {
        // A file keeps no start time; its duration is the profile's.
        assert_eq!(x["time_unix_nano"], 0);
        assert_eq!(x["duration_nano"], (p.duration_secs * 1e9).round() as u64);
    }

    let t = time_profile();
    let decoded = decode(&write("time", &t)).unwrap().unwrap();
    let r = &decoded["resources"][0];
    assert_eq!(
        attr(r, "process.executable.name"),
        t.processes[0].comm.as_str()
    );
    assert_eq!(attr(r, "container.id"), &Value::Null);
    let ps = profiles(r);
    let types: Vec<(&str, &str)> = ps
        .iter()
        .map(|x| (x["type"].as_str().unwrap(), x["unit"].as_str().unwrap()))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let fs = &t.processes[0].functions;
    let samples: u64 = fs.iter().map(|f| f.samples).sum();
    let cpu: i64 = fs
        .iter()
        .map(|f| f.measures.time_ns.unwrap().round() as i64)
        .sum();
    assert_eq!(
        (&ps[0]["sum"], &ps[1]["sum"]),
        (&samples.into(), &cpu.into())
    );
    assert_eq!(ps[1]["period_type"], "cpu");
    for f in fs {
        assert_eq!(
            leaf_sum(ps[0], &f.name),
            (f.samples as i64, 0),
            "{}",
            f.name
        );
    }
}

/// The agent's OTLP push: one request per window, under the wire contract, whose body
/// the official package reads as the window's profile with its start and length.
#[test]
fn otlp_push_meets_the_wire_contract() {
    let rx = Receiver::start().unwrap();
    let pusher = Pusher::otlp(PushConfig {
        url: rx.url(),
        tenant: None,
        service_label: ServiceLabel::Comm,
        queue_windows: 4,
        timeout: Duration::from_secs(20),
        ca_file: None,
        password_file: None,
        token_file: None,
    })
    .unwrap();
    let p = profile_with_paths();
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    pusher.submit(&Window {
        start,
        end: start + Duration::from_secs(10),
        profile: p.clone(),
    });
    pusher.flush(Duration::from_secs(60));
    assert_eq!(rx.violations(), Vec::<String>::new());
    let accepted = rx.accepted();
    assert_eq!(accepted.len(), 1);
    let stats = pusher.stats();
    assert_eq!((stats.ok, stats.dropped_windows), (1, 0));
    if accepted[0].is_null() {
        return; // decoding skipped (said why)
    }
    check_cpi(&accepted[0], &p);
    for x in profiles(&accepted[0]["resources"][0]) {
        assert_eq!(x["time_unix_nano"], 1_000_000_000_000u64);
        assert_eq!(x["duration_nano"], 10_000_000_000u64);
    }

    // The receiver enforces the contract: a JSON body is refused and recorded.
    let mut c = std::net::TcpStream::connect(rx.url().trim_start_matches("http://")).unwrap();
    let body = "{}";
    write!(
        c,
        "POST /v1development/profiles HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        rx.violations()[0].contains("content type"),
        "{:?}",
        rx.violations()
    );
}

/// `cpi-bpf agent --push-otlp URL` (root): a busy test program's windows reach the
/// local receiver under the contract, its process a resource of its own.
#[test]
fn agent_pushes_otlp() {
    if !cpi_tests::require_root("running the agent") {
        return;
    }
    let dir = cpi_tests::temp_dir("agent-otlp");
    let comm = format!("botlp{}", std::process::id());
    let Some(busy) = cpi_tests::compile_c("busy.c", &dir, &comm, &[]) else {
        return;
    };
    let rx = Receiver::start().unwrap();
    let filter = format!("^{comm}$");
    let (_agent, _metrics) = cpi_tests::agent_with_metrics(
        &dir,
        &[
            "--interval",
            "1",
            "--comm",
            &filter,
            "--push-otlp",
            &rx.url(),
        ],
    );
    let run = Command::new(&busy).arg("4").output().unwrap();
    assert!(run.status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let resource = loop {
        assert_eq!(rx.violations(), Vec::<String>::new());
        let found = rx.accepted().into_iter().find_map(|req| {
            req["resources"]
                .as_array()?
                .iter()
                .find(|r| attr(r, "process.executable.name") == comm.as_str())
                .cloned()
        });
        if let Some(r) = found {
            break r;
        }
        if rx.accepted().first().is_some_and(Value::is_null) {
            return; // decoding skipped (said why)
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no OTLP request with {comm}; agent log: {}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(attr(&resource, "service.name"), comm.as_str());
    assert!(attr(&resource, "process.pid")
        .as_u64()
        .is_some_and(|p| p > 0));
    let ps = profiles(&resource);
    assert!(!ps.is_empty() && ps.iter().all(|x| x["sum"].as_i64() > Some(0)));
    let functions: Vec<&Value> = ps[0]["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .collect();
    assert!(
        functions.contains(&&Value::from("hot_spin")),
        "{functions:?}"
    );
}
