//! The kernel matrix: Debian's own cloud kernels — bullseye 5.10, bookworm 6.1, trixie
//! 6.12, fetched by `cargo xtask setup` into `target/kernels/` (xtask/src/kernels.rs) —
//! booted in QEMU with TCG (KVM hangs in this nested VM) from an initramfs holding
//! busybox, this cpi-bpf with its shared libraries, `tests/programs/twofunc.c` (2/3 of its
//! time in `alpha_work`, 1/3 in `beta_work`) and a perf.data recording of it. The guest's
//! `/init` ([`GUEST_INIT`]) runs `doctor`, a one-shot time profile, `--pid`, a short
//! `agent --pid` read back with `report --store`, the agent's pod selectors on two fake
//! pods ([`PODS`]) with a kubelet served from inside the guest, and `import-perf`, and
//! writes every output on a second serial port (the first one carries the kernel's
//! console, which could interleave); the test parses it and asserts per kernel. The
//! host's own kernel runs the same checks through the other modules. Kernels boot one
//! after the other: a TCG guest with two busy vCPUs takes most of this 2-core machine,
//! and the tests of the other modules (the agent's, which take no [`cpu_heavy`] lock) run
//! meanwhile.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::perf_data::{self, build_id, exec_records, loop_of, loop_stack, taken_attr, Record};
use cpi_tests::{compile_c, cpi_bpf, cpu_heavy, pod_list, temp_dir, workspace_root};
use cpi_user::binary::Binary;
use cpi_user::profile::model::Profile;

/// (Debian suite, the release prefix its kernel must report, whether its perf_event
/// programs have `bpf_get_current_ancestor_cgroup_id`: where they do not (5.10), the
/// agent's pod selectors test the pods' cgroups in user space, after collection,
/// cpi-user/src/collect/filter.rs `cgroup_in_user_space`).
const KERNELS: [(&str, &str, bool); 3] = [
    ("bullseye", "5.10.", false),
    ("bookworm", "6.1.", true),
    ("trixie", "6.12.", true),
];

/// The guest's two pods (namespace, UID, container id), both named `web-1` as in
/// tests/tests/it/identity.rs; the agent selects the first, `--namespace shop --pod web-1`.
const PODS: [(&str, &str, &str); 2] = [
    (
        "shop",
        "5e1ec7ed-0a00-4000-8000-0000000000a1",
        "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1",
    ),
    (
        "test",
        "5e1ec7ed-0b00-4000-8000-0000000000b2",
        "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2",
    ),
];

/// One guest's whole run, boot to power-off, at most this long (≈ 30 s each measured on
/// an idle machine; TCG slows down a lot with both CPUs busy).
const GUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The guest's `/init`: each step's stdout between `@@begin NAME` and `@@end NAME rc=N`
/// on `/dev/ttyS1`, its stderr likewise as `NAME.stderr`. The profiled programs outlive
/// the profiler (killed after it), so a slow start under TCG still finds them running;
/// the agent is stopped once two windows are stored (the first one may be short: windows
/// end on multiples of the interval on the wall clock). The pods are made as a kubelet
/// with the systemd driver lays them out (cgroup2 at /sys/fs/cgroup, a burstable pod's
/// containerd container), one busy `twofunc` in each, from `/pods` (a line per [`PODS`]
/// entry); their list is the kubelet's `/pods` answer, `/www/pods`, served on loopback
/// by busybox's httpd.
const GUEST_INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
exec 3>/dev/ttyS1
step() {
  name=$1; shift
  echo "@@begin $name" >&3; "$@" >&3 2>/tmp/$name.err; echo "@@end $name rc=$?" >&3
  echo "@@begin $name.stderr" >&3; cat /tmp/$name.err >&3; echo "@@end $name.stderr rc=0" >&3
}
echo "@@kernel $(uname -r)" >&3
step doctor /cpi-bpf doctor
step oneshot /cpi-bpf --duration 10 --format json --output /tmp/one.json -- /twofunc 4
step oneshot-json cat /tmp/one.json
/twofunc 600 & P=$!
step pid /cpi-bpf --pid $P --duration 5 --format json --output /tmp/pid.json
kill $P
step pid-json cat /tmp/pid.json
# agent STORE ARGS: the agent until two windows are in STORE, then SIGTERM; its status.
agent() {
  store=$1; shift
  /cpi-bpf agent --store $store --interval 2 --metrics-addr off --overhead-budget 100 "$@" & a=$!
  i=0; while [ $i -lt 120 ] && [ "$(ls $store 2>/dev/null | wc -l)" -lt 2 ]; do sleep 1; i=$((i+1)); done
  kill -TERM $a; wait $a
}
/twofunc 600 & P=$!
step agent agent /tmp/store --pid $P
kill $P
step store /cpi-bpf report --store /tmp/store --format json
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
httpd -p 127.0.0.1:10255 -h /www
Q=/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice
while read ns uid id; do
  d=$Q/kubepods-burstable-pod$(echo $uid | tr - _).slice/cri-containerd-$id.scope
  mkdir -p $d
  sh -c 'echo $$ > "$1/cgroup.procs" && exec /twofunc 600' sh $d &
  echo "$ns $!" >> /tmp/pod-pids
done < /pods
step pod-pids cat /tmp/pod-pids
step pods-agent agent /tmp/pods --namespace shop --pod web-1 --kubelet-url http://127.0.0.1:10255
kill $(cut -d' ' -f2 /tmp/pod-pids)
step pods-store /cpi-bpf report --store /tmp/pods --format json
step import /cpi-bpf import-perf /rec.data --format json
echo "@@done" >&3
poweroff -f
"#;

/// Fails under CI (a missing tool there is a broken set-up), else says why and skips.
fn missing(what: &str) -> bool {
    assert!(
        std::env::var_os("CI").is_none(),
        "kernel matrix: {what} (CI must run it: `cargo xtask setup` installs it)"
    );
    cpi_tests::skip(format_args!(
        "kernel matrix: {what}; run `cargo xtask setup`"
    ));
    true
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The samples of `alpha_work` and `beta_work` in `twofunc`'s process of `p` must split
/// 2 : 1 within four binomial standard errors of the profile's own sample count.
fn check_split(p: &Profile, what: &str) -> Result<String, String> {
    let proc = p
        .processes
        .iter()
        .find(|p| p.comm == "twofunc")
        .ok_or(format!("{what}: no twofunc process"))?;
    let samples = |name: &str| {
        proc.functions
            .iter()
            .find(|f| f.name == name)
            .map_or(0, |f| f.samples)
    };
    let (a, b) = (samples("alpha_work"), samples("beta_work"));
    let n = (a + b) as f64;
    if n < 100.0 {
        return Err(format!(
            "{what}: only {n} samples in alpha_work + beta_work"
        ));
    }
    let share = a as f64 / n;
    let sigma = (2.0 / 9.0 / n).sqrt();
    let line = format!(
        "{what}: alpha_work {:.1} % of {n} samples (2/3 ± {:.1} points)",
        share * 100.0,
        400.0 * sigma
    );
    if (share - 2.0 / 3.0).abs() <= 4.0 * sigma {
        Ok(line)
    } else {
        Err(line)
    }
}

/// The guest's output: `@@kernel`, and each step's text and exit status.
struct GuestRun {
    kernel: String,
    steps: BTreeMap<String, (String, i32)>,
    done: bool,
    /// Why the guest stopped short, and the console's last lines ([`boot`]).
    stopped: Option<String>,
}

fn parse(text: &str) -> GuestRun {
    let mut run = GuestRun {
        kernel: String::new(),
        steps: BTreeMap::new(),
        done: false,
        stopped: None,
    };
    let (text, stopped) = match text.split_once("\n@@stopped ") {
        Some((results, why)) => (results, Some(why.to_string())),
        None => (text, None),
    };
    run.stopped = stopped;
    let mut current: Option<(String, String)> = None;
    for line in text.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(k) = line.strip_prefix("@@kernel ") {
            run.kernel = k.to_string();
        } else if let Some(name) = line.strip_prefix("@@begin ") {
            current = Some((name.to_string(), String::new()));
        } else if let Some(rest) = line.strip_prefix("@@end ") {
            let rc = rest
                .rsplit_once(" rc=")
                .and_then(|(_, rc)| rc.parse().ok())
                .unwrap_or(-1);
            if let Some((name, body)) = current.take() {
                run.steps.insert(name, (body, rc));
            }
        } else if line == "@@done" {
            run.done = true;
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    run
}

impl GuestRun {
    /// Step `name`'s output, if it exited 0.
    fn step(&self, name: &str) -> Result<&str, String> {
        match self.steps.get(name) {
            Some((body, 0)) => Ok(body),
            Some((body, rc)) => Err(format!("{name} exited {rc}:\n{body}{}", self.stderr(name))),
            None => Err(format!("{name} did not run (guest done: {})", self.done)),
        }
    }

    /// Step `name`'s stderr.
    fn stderr(&self, name: &str) -> &str {
        let err = self.steps.get(&format!("{name}.stderr"));
        err.map_or("", |(e, _)| e.as_str())
    }

    /// Step `name`'s output as a profile.
    fn json(&self, name: &str) -> Result<Profile, String> {
        Profile::from_json(self.step(name)?.as_bytes()).map_err(|e| format!("{name}: {e}"))
    }
}

/// Every check of one kernel (`cgroups_in_kernel` as in [`KERNELS`]): the lines that
/// passed, or the first failure.
fn check(
    run: &GuestRun,
    release: &str,
    cgroups_in_kernel: bool,
    import_share: f64,
) -> Result<Vec<String>, String> {
    if let Some(why) = &run.stopped {
        return Err(format!("the guest stopped short: {why}"));
    }
    let mut seen = vec![format!("kernel {}", run.kernel)];
    if !run.kernel.starts_with(release) {
        return Err(format!("booted {:?}, want {release}*", run.kernel));
    }
    let doctor = run.step("doctor")?;
    for (feature, want) in [
        ("perf_event programs", true),
        ("BPF ring buffer", true),
        ("bpf_read_branch_records", true),
        ("bpf_get_current_ancestor_cgroup_id", cgroups_in_kernel),
    ] {
        let line = doctor
            .lines()
            .find(|l| l.starts_with(feature))
            .ok_or(format!("doctor shows no {feature} line:\n{doctor}"))?;
        let has = line[feature.len()..].trim_start().starts_with("yes");
        if has != want {
            return Err(format!("doctor: {line}"));
        }
    }
    let mode = doctor
        .lines()
        .find(|l| l.starts_with("mode "))
        .ok_or(format!("doctor shows no mode:\n{doctor}"))?;
    // Guests have no PMU: the time profile is the mode every kernel must give.
    if !mode["mode".len()..]
        .trim_start()
        .starts_with("time-profile")
    {
        return Err(format!("doctor: {mode}"));
    }
    seen.push(format!(
        "doctor: {}",
        mode.split(" — ").next().unwrap_or(mode)
    ));
    // `-- CMD` and `--pid` count per CPU with the filter following the tree in the
    // kernel (raw tracepoints): a kernel that refused them would fall back to per-thread
    // events and say so in a note, and the split alone would not tell.
    for step in ["oneshot", "pid"] {
        if run.stderr(step).contains("cannot follow") {
            return Err(format!(
                "{step} fell back to per-thread events:\n{}",
                run.stderr(step)
            ));
        }
    }
    seen.push(check_split(&run.json("oneshot-json")?, "one-shot")?);
    seen.push(check_split(&run.json("pid-json")?, "--pid")?);
    run.step("agent")?;
    seen.push(check_split(
        &run.json("store")?,
        "agent windows via report --store",
    )?);
    seen.extend(check_pods(run, cgroups_in_kernel)?);
    let imported = run.json("import")?;
    let share = imported
        .processes
        .iter()
        .flat_map(|p| &p.functions)
        .find(|f| f.name == "alpha_work")
        .map(|f| f.share)
        .ok_or("import-perf: no alpha_work")?;
    if (share - import_share).abs() > 1e-9 {
        return Err(format!(
            "import-perf: alpha_work share {share}, the recording holds {import_share}"
        ));
    }
    seen.push(format!(
        "import-perf: alpha_work share {share:.4} as recorded"
    ));
    Ok(seen)
}

/// The agent's pod selectors: `--namespace shop --pod web-1` keeps the process of the
/// first of [`PODS`] alone, named by the kubelet, with the 2 : 1 split; the other pod's
/// process (same pod name, other namespace) never appears. Where the cgroups are tested
/// is the kernel's to decide: in the eBPF program, which drops every other process's
/// samples and counts them, or (`!cgroups_in_kernel`) after collection, which the
/// agent's log says and where the kernel drops nothing.
fn check_pods(run: &GuestRun, cgroups_in_kernel: bool) -> Result<Vec<String>, String> {
    let pids = run.step("pod-pids")?;
    let pid = |ns: &str| -> Result<u32, String> {
        pids.lines()
            .find_map(|l| l.strip_prefix(ns)?.trim().parse().ok())
            .ok_or(format!("no pid of pod {ns}/web-1 in {pids:?}"))
    };
    let (kept, other) = (pid(PODS[0].0)?, pid(PODS[1].0)?);
    run.step("pods-agent")?;
    let log = run.stderr("pods-agent");
    let p = run.json("pods-store")?;
    let what = "--namespace shop --pod web-1";
    let sampled: Vec<u32> = p.processes.iter().map(|p| p.pid).collect();
    if sampled.contains(&other) {
        return Err(format!(
            "{what}: the other pod's process {other} (test/web-1) was sampled: {sampled:?}"
        ));
    }
    if sampled != [kept] {
        return Err(format!(
            "{what}: processes {sampled:?}, want pod shop/web-1's {kept} alone"
        ));
    }
    let id = &p.processes[0].identity;
    if (id.pod.as_deref(), id.namespace.as_deref()) != (Some("web-1"), Some("shop")) {
        return Err(format!("{what}: the process is named {id:?}"));
    }
    let mut seen = vec![check_split(&p, &format!("{what}, {kept} alone"))?];
    if !log.contains(&format!("{what}: sampling 1 cgroup")) {
        return Err(format!(
            "{what}: the log says no cgroup was sampled:\n{log}"
        ));
    }
    let in_user_space = log.contains("filtered in user space, after collection");
    let dropped = p.lost.filtered_in_kernel;
    match (cgroups_in_kernel, in_user_space, dropped) {
        (true, false, 1..) => seen.push(format!(
            "{what}: in the kernel ({dropped} samples of other processes dropped)"
        )),
        (false, true, 0) => seen.push(format!(
            "{what}: in user space, after collection (as the log says)"
        )),
        _ => {
            return Err(format!(
                "{what}: want the cgroups tested {}, got {dropped} samples filtered in the \
                 kernel and the log:\n{log}",
                if cgroups_in_kernel {
                    "in the kernel"
                } else {
                    "in user space"
                }
            ))
        }
    }
    Ok(seen)
}

/// A recording of `exe` (as `/twofunc` in the guest) on the taken-branch event: 60
/// samples in alpha_work's loop, 30 in beta_work's, full 32-deep stacks. Returns the
/// alpha_work share of instructions it must import as.
fn recording(exe: &Path, out: &Path) -> f64 {
    const PID: u32 = 4242;
    let bin = Binary::open(exe).unwrap();
    let (alpha, beta) = (loop_of(&bin, "alpha_work"), loop_of(&bin, "beta_work"));
    let mut recs = exec_records(&bin, PID, "twofunc", "/twofunc");
    for i in 0..90 {
        let l = if i % 3 == 2 { beta } else { alpha };
        recs.push(Record::Sample {
            attr: 0,
            pid: PID,
            tid: PID,
            ip: l.head,
            period: 500_009,
            branches: loop_stack(l, 32, 0),
            callchain: vec![],
        });
    }
    perf_data::write(out, &[taken_attr(5)], &recs, &[build_id(&bin, "/twofunc")]);
    let (a, b) = (
        alpha.instructions as f64 * 60.0,
        beta.instructions as f64 * 30.0,
    );
    a / (a + b)
}

/// The initramfs (newc cpio, built with busybox's cpio): busybox, cpi-bpf without its
/// debug info, the libraries `ldd` lists for both executables, twofunc, the recording,
/// and the pods: `/pods` for the guest to make them, `/www/pods` for its kubelet.
fn initramfs(dir: &Path, busybox: &Path, twofunc: &Path, rec: &Path) -> PathBuf {
    let root = dir.join("root");
    for d in ["bin", "proc", "sys", "dev", "tmp", "www"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let pods: String = PODS
        .iter()
        .map(|(ns, uid, id)| format!("{ns} {uid} {id}\n"))
        .collect();
    std::fs::write(root.join("pods"), pods).unwrap();
    let listed: Vec<_> = PODS
        .iter()
        .map(|&(ns, uid, id)| (uid, "web-1", ns, id))
        .collect();
    std::fs::write(root.join("www/pods"), pod_list(&listed)).unwrap();
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    run_ok(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(cpi_bpf())
            .arg(root.join("cpi-bpf")),
    );
    std::fs::copy(twofunc, root.join("twofunc")).unwrap();
    std::fs::copy(rec, root.join("rec.data")).unwrap();
    for exe in [cpi_bpf(), twofunc] {
        let out = Command::new("ldd").arg(exe).output().expect("ldd");
        for lib in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let to = root.join(lib.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(lib, &to).unwrap_or_else(|e| panic!("{lib}: {e}"));
        }
    }
    let init = root.join("init");
    std::fs::write(&init, GUEST_INIT).unwrap();
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    let list = Command::new(busybox)
        .args(["find", "."])
        .current_dir(&root)
        .output()
        .unwrap();
    let cpio = dir.join("initrd.cpio");
    let mut child = Command::new(busybox)
        .args(["cpio", "-o", "-H", "newc"])
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&cpio).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &list.stdout).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "busybox cpio failed");
    cpio
}

/// Boots `kernel` with `initrd`: the guest's results port, and after it, when the guest
/// stopped short, `@@stopped` with why and the console's last lines.
fn boot(kernel: &Path, initrd: &Path, dir: &Path, name: &str) -> (String, Duration) {
    let console = dir.join(format!("{name}.console"));
    let results = dir.join(format!("{name}.results"));
    let started = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64")
        // One host thread for both vCPUs: multi-threaded TCG once oopsed at boot in
        // the kernel's own code patching (int3 in sched_clock_idle_wakeup_event, 6.12),
        // and one thread leaves the other core to the tests running beside this one.
        .args([
            "-accel",
            "tcg,thread=single",
            "-cpu",
            "max",
            "-m",
            "2048",
            "-smp",
            "2",
        ])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", results.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.qemu-stderr"))).unwrap())
        .spawn()
        .expect("qemu-system-x86_64");
    let exited = loop {
        if let Some(st) = qemu.try_wait().unwrap() {
            break Some(st);
        }
        if started.elapsed() > GUEST_TIMEOUT {
            let _ = qemu.kill();
            let _ = qemu.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    let mut text = std::fs::read_to_string(&results).unwrap_or_default();
    if exited.is_none() || !text.contains("@@done") {
        // Why the guest stopped short, for the failure message: the console's end.
        let console = std::fs::read_to_string(&console).unwrap_or_default();
        let tail: Vec<&str> = console.lines().rev().take(15).collect();
        let why = match exited {
            None => format!("no power-off within {GUEST_TIMEOUT:?}"),
            Some(st) => format!("qemu exited ({st}) before the guest was done"),
        };
        text.push_str(&format!(
            "\n@@stopped {why}; console ends:\n{}\n",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    (text, took)
}

#[test]
fn every_debian_kernel_collects_in_every_mode_its_guest_has() {
    let kernels_dir = workspace_root().join("target/kernels");
    let busybox = Path::new("/bin/busybox");
    let qemu_there = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !qemu_there && missing("qemu-system-x86_64 is not installed") {
        return;
    }
    if !busybox.exists() && missing("/bin/busybox (busybox-static) is not installed") {
        return;
    }
    for (suite, ..) in KERNELS {
        let k = kernels_dir.join(suite).join("vmlinuz");
        if !k.exists() && missing(&format!("{} is missing", k.display())) {
            return;
        }
    }
    let dir = temp_dir("kernels");
    let Some(twofunc) = compile_c("twofunc.c", &dir, "twofunc", &[]) else {
        assert!(missing("gcc is not installed"), "unreachable");
        return;
    };
    let rec = dir.join("rec.data");
    let import_share = recording(&twofunc, &rec);
    let initrd = initramfs(&dir, busybox, &twofunc, &rec);

    // No CPU-rate test of the other modules runs meanwhile.
    let _cpu = cpu_heavy();
    let started = Instant::now();
    let mut failures = Vec::new();
    for (suite, release, cgroups_in_kernel) in KERNELS {
        let (text, took) = boot(
            &kernels_dir.join(suite).join("vmlinuz"),
            &initrd,
            &dir,
            suite,
        );
        match check(&parse(&text), release, cgroups_in_kernel, import_share) {
            Ok(lines) => {
                eprintln!("{suite} ({took:.1?}):");
                for l in lines {
                    eprintln!("  {l}");
                }
            }
            Err(e) => failures.push(format!("{suite} ({took:.1?}): {e}")),
        }
    }
    eprintln!("kernel matrix: {:.1?} in all", started.elapsed());
    assert!(
        failures.is_empty(),
        "{}\n(guest outputs in {})",
        failures.join("\n\n"),
        dir.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
