//! Issue 20, "A hostile host": what a local user who controls files, names and
//! connections can do to the root profiler. One test per row of the issue's table where
//! it can run here; each ends with the profiler alive, nothing root-only read or
//! overwritten, and nothing blocked beyond a stated bound.

use std::io::Write;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{
    compile_c, cpi_bpf, free_port, http_get, require_root, stderr, temp_dir, KillOnDrop,
};
use cpi_user::agent::store::{self, Store};
use cpi_user::binary::{Binary, BinaryError, SymbolizeError, Symbolizer, SymbolizerOptions};
use cpi_user::procmap::ProcessMaps;

use crate::report_fixture::time_profile;

/// Longest any hostile input may hold up a command here.
const BOUND: Duration = Duration::from_secs(20);

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o666) },
        0,
        "{}",
        p.display()
    );
}

/// Runs `cmd` to completion within [`BOUND`]; a command still running then is killed
/// and the test fails (it blocked).
fn run_bounded(cmd: &mut Command) -> std::process::Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t0 = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if t0.elapsed() > BOUND {
            // SAFETY: our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = waiter.join();
            panic!("{cmd:?} blocked for more than {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    waiter.join().unwrap()
}

/// `/proc/PID/maps` text for `bin` (at `path`, identity `dev:ino` as maps prints it)
/// mapped at its link-time addresses.
fn maps_of(path: &Path, bin: &Binary, dev_ino: &str) -> ProcessMaps {
    let text: String = bin
        .segments
        .iter()
        .filter(|s| s.executable)
        .map(|s| {
            format!(
                "{:x}-{:x} r-xp {:08x} {dev_ino} {}\n",
                s.vaddr & !0xfff,
                (s.vaddr + s.memsz + 0xfff) & !0xfff,
                s.offset & !0xfff,
                path.display()
            )
        })
        .collect();
    ProcessMaps::parse(&text).unwrap()
}

fn dev_ino(p: &Path) -> String {
    let m = std::fs::metadata(p).unwrap();
    format!(
        "{:x}:{:02x} {}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    )
}

/// Rows "replaced a library with a FIFO", "the same with a symlink to a root-only
/// file", and "a library upgraded by rename" (WRONG_fn): once the mapped path names
/// another file, the symbolizer refuses it (not the mapped file), without blocking, and
/// never names a sample from it.
#[test]
fn a_path_that_now_names_another_file_is_refused_not_read() {
    let dir = temp_dir("hostile-replaced");
    let Some(lib) = compile_c("analysis_loops.c", &dir, "lib.so", &[]) else {
        assert!(std::env::var_os("CI").is_none(), "gcc missing in CI");
        return;
    };
    let other = compile_c("hot_cold.c", &dir, "other", &[]).unwrap();
    let bin = Binary::open(&lib).unwrap();
    let maps = maps_of(&lib, &bin, &dev_ino(&lib));
    let f = bin.function_by_name("sum_loop").unwrap();
    let opts = SymbolizerOptions {
        use_proc: false,
        ..SymbolizerOptions::default()
    };
    // As mapped: resolves.
    let mut s = Symbolizer::new(opts.clone());
    assert_eq!(
        s.resolve(1, &maps, f.start + 1).unwrap().function.name,
        "sum_loop"
    );
    let secret = dir.join("secret.so");
    std::fs::copy(&other, &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let moved = dir.join("lib.so.old");
    std::fs::rename(&lib, &moved).unwrap();
    for (what, plant) in [
        ("fifo", &(|p: &Path| mkfifo(p)) as &dyn Fn(&Path)),
        ("symlink to a root-only file", &|p: &Path| {
            symlink(&secret, p).unwrap()
        }),
        ("upgrade by rename", &|p: &Path| {
            let tmp = p.with_extension("new");
            std::fs::copy(&other, &tmp).unwrap();
            std::fs::rename(&tmp, p).unwrap();
        }),
    ] {
        plant(&lib);
        let mut s = Symbolizer::new(opts.clone());
        let t0 = Instant::now();
        let r = s.resolve(1, &maps, f.start + 1);
        assert!(t0.elapsed() < Duration::from_secs(2), "{what}: blocked");
        match r {
            Err(SymbolizeError::Binary { source, .. }) => {
                let msg = source.to_string();
                assert!(
                    msg.contains("not a regular file") || msg.contains("not the mapped file"),
                    "{what}: {msg}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
        std::fs::remove_file(&lib).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "truncate -s 16384 lib.so on a library its own process has mapped": reads past
/// the new end are recovered (no SIGBUS), the binary is reported truncated and its
/// samples unusable, and this process lives on.
#[test]
fn a_library_truncated_under_the_mapping_does_not_kill() {
    let dir = temp_dir("hostile-truncate");
    let Some(lib) = compile_c("analysis_loops.c", &dir, "lib.so", &[]) else {
        assert!(std::env::var_os("CI").is_none(), "gcc missing in CI");
        return;
    };
    let mut s = Symbolizer::new(SymbolizerOptions {
        use_proc: false,
        ..SymbolizerOptions::default()
    });
    let bin = Binary::open(&lib).unwrap();
    let maps = maps_of(&lib, &bin, &dev_ino(&lib));
    let funcs: Vec<_> = bin.functions().collect();
    drop(bin);
    let first = s.resolve(1, &maps, funcs[0].start).unwrap();
    let len = std::fs::metadata(&lib).unwrap().len();
    assert!(len > 16384, "{len}");
    // Page cache dropped so the names must be read again from the (shrunk) file.
    s.trim(u64::MAX);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&lib)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let mut truncated = 0;
    for f in &funcs {
        let mut s2 = Symbolizer::new(SymbolizerOptions {
            use_proc: false,
            ..SymbolizerOptions::default()
        });
        // The binary `s` holds for this mapping: names read through its old mapping.
        match s.resolve(1, &maps, f.start) {
            Err(SymbolizeError::Binary { source, .. })
                if matches!(*source, BinaryError::Truncated { .. }) =>
            {
                truncated += 1
            }
            Ok(_) | Err(_) => {}
        }
        // A fresh open of the truncated file: an error, not a crash.
        assert!(s2.resolve(3, &maps, f.start).is_err());
    }
    assert!(truncated > 0, "no read past the new end was noticed");
    assert!(matches!(first.object, cpi_user::binary::CodeObject::Elf(_)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "planted a symlink at a --output path in a shared directory": the profile
/// replaces the link; the root-only file it pointed at is untouched.
#[test]
fn output_through_another_users_link_is_not_followed() {
    let dir = temp_dir("hostile-output");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = dir.join("root-only");
    std::fs::write(&victim, b"root's data").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let input = dir.join("in.json");
    std::fs::write(
        &input,
        cpi_user::report::file::to_json(&time_profile()).unwrap(),
    )
    .unwrap();
    let out = dir.join("profile.json");
    symlink(&victim, &out).unwrap();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // The link belongs to an unprivileged user, as in the attack.
        std::os::unix::fs::lchown(&out, Some(65534), Some(65534)).unwrap();
    }
    let r = run_bounded(
        Command::new(cpi_bpf())
            .arg("report")
            .arg(&input)
            .args(["--format", "json", "--output"])
            .arg(&out),
    );
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's data");
    let m = std::fs::symlink_metadata(&out).unwrap();
    assert!(m.is_file(), "the link was replaced by the profile");
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    assert!(cpi_user::report::file::read(&out).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "created the --store directory first (0777), then planted .tmp-w-… symlinks":
/// the agent's store refuses a directory others can write or another user owns, one line
/// saying so; in its own directory it writes windows through temp files of its own.
#[test]
fn the_store_must_be_private() {
    let dir = temp_dir("hostile-store");
    let s = dir.join("store");
    std::fs::create_dir(&s).unwrap();
    std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("writable by group or others"), "{msg}");
    assert_eq!(msg.lines().count(), 1);
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&s, Some(65534), Some(65534)).unwrap();
        let msg = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("owned by uid 65534"), "{msg}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "put a FIFO, a gzip bomb, … in the store" and "edited two store windows to hold
/// counts of 2^64−1": `report --store` skips the FIFO and the bomb (one warning each,
/// within the bound, memory capped by the profile limit) and refuses the forged sums with
/// one error line instead of printing wrapped numbers.
#[test]
fn report_store_survives_fifos_bombs_and_forged_counts() {
    let dir = temp_dir("hostile-report-store");
    let s = dir.join("store");
    let mut st = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None).unwrap();
    let t = |secs: u64| std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
    st.write(&cpi_user::agent::Window {
        start: t(0),
        end: t(10),
        profile: time_profile(),
    })
    .unwrap();
    mkfifo(&s.join("w-1700000010000-1700000020000.json.gz"));
    // 600 MiB of spaces (JSON's whitespace: the parser reads on) in a ~600 KB gzip:
    // decompression stops at the profile limit.
    let bomb = std::fs::File::create(s.join("w-1700000020000-1700000030000.json.gz")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(bomb, flate2::Compression::best());
    let spaces = vec![b' '; 1 << 20];
    for _ in 0..600 {
        gz.write_all(&spaces).unwrap();
    }
    gz.finish().unwrap();
    let r = run_bounded(
        Command::new(cpi_bpf())
            .args(["report", "--store"])
            .arg(&s)
            .args(["--format", "json"]),
    );
    let err = stderr(&r);
    assert!(r.status.success(), "{err}");
    assert_eq!(err.matches("warning: skipped").count(), 2, "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    assert!(err.contains("larger than"), "{err}");
    // Forged counts: two windows of 2^64-1 samples.
    let mut forged = time_profile();
    forged.processes[0].samples = u64::MAX;
    for i in 3..5 {
        st.write(&cpi_user::agent::Window {
            start: t(i * 10),
            end: t(i * 10 + 10),
            profile: forged.clone(),
        })
        .unwrap();
    }
    let r = run_bounded(Command::new(cpi_bpf()).args(["report", "--store"]).arg(&s));
    let err = stderr(&r);
    assert!(!r.status.success(), "wrapped sums printed: {err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("cpi-bpf: error: ") && l.contains("2^64-1")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "named its thread \x1b[2J\x1b[31mX\nFAKE\r": the table shows the name escaped,
/// on one line; the JSON keeps it raw.
#[test]
fn a_hostile_thread_name_cannot_drive_the_terminal() {
    if !require_root("profiling a process") {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let name = "\x1b[2J\x1b[31mX\nFAKE\r";
    let prog = "import ctypes,sys\n\
                ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n\
                while True: pass\n";
    let mut child = Command::new("python3")
        .args(["-c", prog, name])
        .uid(65534)
        .spawn()
        .map(KillOnDrop)
        .expect("python3");
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.0.id().to_string();
    let dir = temp_dir("hostile-comm");
    let json = dir.join("p.json");
    let r = run_bounded(
        Command::new(cpi_bpf())
            .args(["--pid", &pid, "--duration", "2", "--output"])
            .arg(&json)
            .args(["--format", "json"]),
    );
    assert!(r.status.success(), "{}", stderr(&r));
    let p = cpi_user::report::file::read(&json).unwrap();
    assert_eq!(p.processes[0].comm, &name[..15], "JSON keeps the raw name");
    let r = run_bounded(Command::new(cpi_bpf()).arg("report").arg(&json));
    let table = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(
        !table.contains('\x1b') && !table.contains('\r'),
        "{table:?}"
    );
    assert!(table.contains("\\x1b[2J\\x1b[31mX\\nFAK"), "{table}");
    assert!(!table.lines().any(|l| l.starts_with("FAKE")), "{table}");
    let _ = child.0.kill();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "handed over a `perf script` text whose MMAP2 records name a FIFO, or a --symfs
/// tree with one": `import-perf` finishes within the bound, the FIFO's samples unmapped.
#[test]
fn import_perf_does_not_wait_on_a_fifo() {
    let dir = temp_dir("hostile-import");
    let fifo = dir.join("prog");
    mkfifo(&fifo);
    let symfs = dir.join("symfs");
    std::fs::create_dir_all(symfs.join(dir.strip_prefix("/").unwrap())).unwrap();
    mkfifo(&symfs.join(fifo.strip_prefix("/").unwrap()));
    let p = fifo.display();
    let text = format!(
        "7/7 PERF_RECORD_MMAP2 7/7: [0x555555555000(0x2000) @ 0x1000 fe:00 12 0]: r-xp {p}\n\
         7/7 555555555136 f ({p}) 0x555555555136({p})/0x555555555120({p})/P/-/-/0 \
         0x555555555140({p})/0x555555555130({p})/P/-/-/0\n"
    );
    let input = dir.join("script.txt");
    std::fs::write(&input, text).unwrap();
    for symfs_args in [
        vec![],
        vec!["--symfs".to_string(), symfs.display().to_string()],
    ] {
        let r = run_bounded(
            Command::new(cpi_bpf())
                .arg("import-perf")
                .arg(&input)
                .args(&symfs_args)
                .args(["--format", "json"]),
        );
        let err = stderr(&r);
        assert!(r.status.success(), "{symfs_args:?}: {err}");
        let p: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        assert!(
            p["lost"]["unmapped_samples"].as_u64().unwrap_or(0) > 0
                || p["processes"].as_array().is_some_and(|v| v
                    .iter()
                    .all(|x| x["functions"].as_array().is_none_or(|f| f.is_empty()))),
            "{symfs_args:?}: the FIFO's samples were attributed: {p}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "mmapped 25 000 distinct small executable files in one process": with the
/// descriptor limit of that row (20 000), the agent holds at most its stated cap of
/// captured files (a quarter of the soft limit, cpi-user/src/procmap/captured.rs), the
/// least recently used closed and counted, every window is written (no "Too many open
/// files"), and the process is in the profile.
#[test]
fn twenty_five_thousand_mapped_files_cannot_exhaust_the_agent() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("hostile-manymaps");
    let prog = compile_c("manymaps.c", &dir, "manymaps", &[]).expect("gcc builds manymaps.c");
    let files = dir.join("files");
    std::fs::create_dir(&files).unwrap();
    let mut target = KillOnDrop(
        Command::new(&prog)
            .arg(&files)
            .args(["25000", "120"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Wait until every file is mapped (the program says so), within a hang guard.
    let mut said = String::new();
    let mut err = std::io::BufReader::new(target.0.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut err, &mut said).unwrap();
    assert_eq!(
        said.trim(),
        "mapped 25000",
        "the target could not map its files"
    );
    let store = dir.join("store");
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut agent = Command::new(cpi_bpf());
    agent
        .args(["agent", "--interval", "1", "--metrics-addr"])
        .arg(metrics.to_string())
        .arg("--pid")
        .arg(target.0.id().to_string())
        .arg("--store")
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit between fork and exec touches only the child.
    unsafe {
        agent.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 20_000,
                rlim_max: 20_000,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut agent = KillOnDrop(agent.spawn().unwrap());
    let mut agent_err = agent.0.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut agent_err, &mut s);
        s
    });
    let windows = || {
        std::fs::read_dir(&store)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("w-"))
                    .count()
            })
            .unwrap_or(0)
    };
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", agent.0.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let (t0, mut most_fds) = (Instant::now(), 0);
    // Hang guard, not a rate: windows come every second when the machine is idle.
    while windows() < 4 && t0.elapsed() < Duration::from_secs(90) {
        most_fds = most_fds.max(fds());
        std::thread::sleep(Duration::from_millis(200));
    }
    most_fds = most_fds.max(fds());
    let written = windows();
    // Where the agent is, should it have written too little: said on failure.
    let whereabouts = || {
        ["stack", "wchan", "status"]
            .map(|f| {
                std::fs::read_to_string(format!("/proc/{}/{f}", agent.0.id())).unwrap_or_default()
            })
            .join("\n")
    };
    let stuck = if written < 4 {
        whereabouts()
    } else {
        String::new()
    };
    // 25 000 files against a cap of 5 000: the least recently used were closed.
    let scraped = http_get(metrics, "/metrics").map(|(_, body)| body);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let t1 = Instant::now();
    while agent.0.try_wait().unwrap().is_none() {
        assert!(t1.elapsed() < BOUND, "the agent did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = log.join().unwrap();
    eprintln!("{written} windows; at most {most_fds} descriptors open; the agent said:\n{log}");
    assert!(
        written >= 4,
        "{written} windows in 90 s; the agent was at:\n{stuck}"
    );
    assert!(
        most_fds <= 20_000 / 4 + 64,
        "{most_fds} descriptors: more than the cap of captured files"
    );
    assert!(!log.contains("Too many open files"), "{log}");
    assert!(!log.contains("error:"), "{log}");
    let scraped = scraped.expect("/metrics answers");
    let evicted = scraped
        .lines()
        .find_map(|l| l.strip_prefix("cpi_bpf_captured_files_total{event=\"evicted\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(
        evicted.is_some_and(|n| n >= 25_000 - 20_000 / 4),
        "evictions counted: {evicted:?}"
    );
    let report = Command::new(cpi_bpf())
        .args(["report", "--format", "json", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", stderr(&report));
    let p: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let pid = target.0.id();
    assert!(
        p["processes"].as_array().is_some_and(|a| a
            .iter()
            .any(|pr| pr["pid"] == pid || pr["comm"] == "manymaps")),
        "manymaps in the merged profile"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
