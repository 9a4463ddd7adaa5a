//! A hostile host: what a local user who controls files, names and
//! connections can do to the root profiler. One test per attack that can run
//! here; each ends with the profiler alive, nothing root-only read or
//! overwritten, and nothing blocked beyond a stated bound.

use std::io::Write;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_agent::store::{self, Store};
use cpi_tests::{
    agent_with_metrics, compile_c, cpi_bpf, free_port, http_get, metric, require_root, rss, stderr,
    temp_dir, KillOnDrop,
};
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
    wait_bounded(child, BOUND)
}

/// The output of `child` (spawned with its streams piped) once it ends within `limit`;
/// still running then, it is killed and the test fails (it blocked).
fn wait_bounded(child: std::process::Child, limit: Duration) -> std::process::Output {
    let pid = child.id();
    let t0 = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if t0.elapsed() > limit {
            // SAFETY: our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = waiter.join();
            panic!("pid {pid} blocked for more than {limit:?}");
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
    if cpi_user::fsafe::euid() == 0 {
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
    if cpi_user::fsafe::euid() == 0 {
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&s, Some(65534), Some(65534)).unwrap();
        let msg = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("owned by uid 65534"), "{msg}");

        // End to end: the user makes the store first, world-writable, in a shared
        // directory and plants links to a root-only file at temp-file names; the agent
        // refuses it with one line, within the bound, and writes nothing through them.
        let shared = dir.join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let victim = dir.join("root-only");
        std::fs::write(&victim, b"root's data").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let store = shared.join("store");
        let plant = format!(
            "mkdir -m 777 {s} && for n in .tmp-w-0 .w-0.json.gz.0.tmp w-0-1.json.gz; do \
             ln -s {v} {s}/$n; done",
            s = store.display(),
            v = victim.display()
        );
        let st = as_user(Command::new("sh").args(["-c", &plant]))
            .status()
            .unwrap();
        assert!(st.success(), "{plant}");
        let sleeper = KillOnDrop(Command::new("sleep").arg("600").spawn().unwrap());
        let r = run_bounded(
            Command::new(cpi_bpf())
                .args(["agent", "--interval", "1", "--metrics-addr", "off"])
                .args(["--pid", &sleeper.0.id().to_string(), "--store"])
                .arg(&store),
        );
        let err = stderr(&r);
        assert!(!r.status.success(), "the agent used the store: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("cpi-bpf: error: ") && err.contains("owned by uid 65534"),
            "{err}"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"root's data");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "put a FIFO, a gzip bomb, … in the store" and "edited two store windows to hold
/// counts of 2^64−1": `report --store` skips the FIFO and the bomb (one warning each,
/// within the bound, peak RSS under 128 MiB) and refuses the forged sums with
/// one error line instead of printing wrapped numbers.
#[test]
fn report_store_survives_fifos_bombs_and_forged_counts() {
    let dir = temp_dir("hostile-report-store");
    let s = dir.join("store");
    let mut st = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None).unwrap();
    let t = |secs: u64| std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
    st.write(&cpi_agent::Window {
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
    // Peak RSS from GNU time (see `a_million_files_in_the_store_cost_bounded_memory`).
    let r = run_bounded(
        Command::new("/usr/bin/time")
            .args(["-f", "peak-kib %M"])
            .arg(cpi_bpf())
            .args(["report", "--store"])
            .arg(&s)
            .args(["--format", "json"]),
    );
    let err = stderr(&r);
    assert!(r.status.success(), "{err}");
    assert_eq!(err.matches("warning: skipped").count(), 2, "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    assert!(err.contains("larger than"), "{err}");
    let peak_kib: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("peak-kib ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak from /usr/bin/time: {err}"));
    // The bomb is read as a stream and stops at the profile limit (1 GiB before).
    assert!(
        peak_kib <= 128 << 10,
        "report --store peaked at {peak_kib} KiB"
    );
    // Forged counts: two windows of 2^64-1 samples.
    let mut forged = time_profile();
    forged.processes[0].samples = u64::MAX;
    for i in 3..5 {
        st.write(&cpi_agent::Window {
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

/// Row "confused deputy: an unprivileged user hands root a `perf script` text whose
/// mappings name a root-only binary": as root, `import-perf --annotate` opens what the
/// text names only as its owner (uid 65534) could, so none of the binary's symbols are
/// printed and one line says it was refused; root's own copy of the text shows them.
#[test]
fn import_perf_as_root_opens_only_what_the_recordings_user_could() {
    if !require_root("acting as another user") {
        return;
    }
    let Some(exe) = cpi_tests::programs::compile("hot_cold.c", &["-O1", "-fno-pie", "-no-pie"])
    else {
        return;
    };
    let dir = temp_dir("hostile-deputy");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = dir.join("root-only");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let prog = private.join("prog");
    cpi_tests::copy_program(&exe, &prog);
    let hot = cpi_tests::symbol_address(&prog, "hot").unwrap();
    let cold = cpi_tests::symbol_address(&prog, "cold").unwrap();
    let p = prog.display();
    let mut text = String::from("# perf script -F comm,pid,tid,ip,sym,dso,brstack\n");
    for i in 0..40 {
        let ip = if i % 4 == 0 { cold } else { hot + 4 };
        let entry = format!("0x{:x}({p})/0x{hot:x}({p})/P/-/-/0/COND ", hot + 0x20);
        text += &format!("bench  4242/4242 {ip:x} f ({p}) {}\n", entry.repeat(4));
    }
    let input = dir.join("perf.txt");
    std::fs::write(&input, text).unwrap();
    let import = || {
        run_bounded(
            Command::new(cpi_bpf())
                .env_remove("SUDO_UID")
                .env_remove("SUDO_GID")
                .args(["import-perf", "--annotate", "hot"])
                .arg(&input),
        )
    };
    let own = import();
    let shown = String::from_utf8_lossy(&own.stdout);
    assert!(own.status.success(), "{}", stderr(&own));
    assert!(shown.contains("hot [") && shown.contains("ret"), "{shown}");
    std::os::unix::fs::chown(&input, Some(65534), Some(65534)).unwrap();
    let handed = import();
    let (out, err) = (String::from_utf8_lossy(&handed.stdout), stderr(&handed));
    for leak in ["hot [", "cold", "main", "imul", &format!("{hot:x}")] {
        assert!(!out.contains(leak), "{leak:?} printed: {out}");
    }
    let refusal = format!(
        "cpi-bpf: warning: {p}: not opened: uid 65534 cannot read it (recording owned by uid 65534)"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.iter().filter(|l| **l == refusal).count(), 1, "{err}");
    assert!(
        !err.contains("cannot place"),
        "one line for the file: {err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "FIFOs at the edges": `report` and `import-perf` of a FIFO nobody writes end with
/// one line within the FIFO wait (cpi-user/src/fsafe/mod.rs, `FIFO_WAIT`, 5 s), while a
/// pipe with a writer is read: `report <(zcat p.json.gz)`, a FIFO whose writer comes
/// late, and `import-perf <(cat perf.txt)`.
#[test]
fn report_and_import_of_a_fifo_without_a_writer_end_and_pipes_are_read() {
    let dir = temp_dir("hostile-fifo-input");
    let fifo = dir.join("p.json");
    mkfifo(&fifo);
    for cmd in ["report", "import-perf"] {
        let mut run = Command::new(cpi_bpf());
        run.arg(cmd).arg(&fifo);
        let t0 = Instant::now();
        let r = run_bounded(&mut run);
        cpi_tests::assert_one_error_line(&r, "a FIFO with no writer");
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{cmd}: {:?}",
            t0.elapsed()
        );
    }
    let gz = dir.join("p.json.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    enc.write_all(
        cpi_user::report::file::to_json(&time_profile())
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    enc.finish().unwrap();
    let bin = cpi_bpf().display().to_string();
    let piped = |script: String| {
        let r = run_bounded(Command::new("bash").args(["-c", &script]));
        assert!(r.status.success(), "{script}: {}", stderr(&r));
        String::from_utf8_lossy(&r.stdout).into_owned()
    };
    let g = gz.display();
    let table = piped(format!("{bin} report <(sleep 1; zcat {g})"));
    assert!(table.contains("lzma_rc_encode"), "{table}");
    let f = fifo.display();
    let table = piped(format!("(sleep 1; zcat {g} > {f}) & {bin} report {f}"));
    assert!(table.contains("lzma_rc_encode"), "{table}");
    let text = dir.join("perf.txt");
    std::fs::write(
        &text,
        "bench  7/7 401106 f (/bin/x) 0x401126(/bin/x)/0x401115(/bin/x)/P/-/-/0/COND\n",
    )
    .unwrap();
    let json = piped(format!(
        "{bin} import-perf --format json <(sleep 1; cat {})",
        text.display()
    ));
    assert!(json.contains("\"processes\""), "{json}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "mmapped 25 000 distinct small executable files in one process": with the
/// descriptor limit of that row (20 000), the agent holds at most its stated cap of
/// captured files (a quarter of the soft limit, cpi-user/src/procmap/captured.rs), the
/// least recently used closed and counted, every window is written (no "Too many open
/// files"), the process is in the profile, and the agent's anonymous RSS less its cache
/// stays within [`RSS_BOUND`] of what it was at start.
#[test]
fn twenty_five_thousand_mapped_files_cannot_exhaust_the_agent() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("hostile-manymaps");
    let prog = compile_c("manymaps.c", &dir, "manymaps", &[]).expect("gcc builds manymaps.c");
    let files = dir.join("files");
    std::fs::create_dir(&files).unwrap();
    std::os::unix::fs::chown(&files, Some(USER), Some(USER)).unwrap();
    // Alone: its 25 000 unusable files would reach any system-wide profile taken at the
    // same time (one CI run's replaced-libraries one-shot stopped naming files).
    let _cpu = cpi_tests::cpu_heavy();
    let mut target = KillOnDrop(
        as_user(&mut Command::new(&prog))
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
    // Anonymous RSS less the binary cache: first when /metrics answers (the agent
    // started, before its first window is analysed), and its peak after.
    let held = || {
        let (_, body) = http_get(metrics, "/metrics").ok()?;
        let cache = metric(&body, "cpi_bpf_cache_bytes")? as u64;
        Some(rss(agent.0.id()).saturating_sub(cache))
    };
    let (t0, mut most_fds, mut first, mut peak) = (Instant::now(), 0, None, 0);
    // Hang guard, not a rate: windows come every second when the machine is idle.
    while windows() < 4 && t0.elapsed() < Duration::from_secs(90) {
        most_fds = most_fds.max(fds());
        if let Some(now) = held() {
            first.get_or_insert(now);
            peak = peak.max(now);
        }
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
    eprintln!(
        "{written} windows; at most {most_fds} descriptors open; anonymous RSS less the \
         cache {first:?} B at start, {peak} B at most; the agent said:\n{log}"
    );
    assert!(
        written >= 4,
        "{written} windows in 90 s; the agent was at:\n{stuck}"
    );
    assert!(
        most_fds <= 20_000 / 4 + 64,
        "{most_fds} descriptors: more than the cap of captured files"
    );
    let first = first.expect("/metrics answered");
    assert!(
        peak <= first + RSS_BOUND,
        "anonymous RSS less the cache {peak} B, {first} B at start"
    );
    assert!(!log.contains("Too many open files"), "{log}");
    assert!(!log.contains("error:"), "{log}");
    windows_every_interval(&store);
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

/// Asserts that the agent wrote a window for every interval since its first: the
/// windows in `store` (`w-START-END`, ms) follow one another without a gap, so none was
/// lost ("Too many open files" once lost 21 of 25). Returns how many.
fn windows_every_interval(store: &Path) -> usize {
    let mut spans: Vec<(u64, u64)> = std::fs::read_dir(store)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (a, b) = name
                .strip_prefix("w-")?
                .split_once(".json")?
                .0
                .split_once('-')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert_eq!(
            w[0].1, w[1].0,
            "a window is missing between {:?} and {:?}",
            w[0], w[1]
        );
    }
    spans.len()
}

/// The unprivileged user of the end-to-end rows (nobody).
const USER: u32 = 65534;
/// How far an attacked agent's anonymous RSS, less its binary cache, may rise over its
/// steady state (the agent's 64 MiB memory target).
const RSS_BOUND: u64 = 64 << 20;
/// How long a one-shot `--system-wide` may take after its `--duration` (it analyses
/// everything the host ran, which on a busy host includes compilers).
const ANALYSIS_BOUND: Duration = Duration::from_secs(60);

/// `cmd` run as [`USER`].
fn as_user(cmd: &mut Command) -> &mut Command {
    cmd.uid(USER).gid(USER)
}

/// `dir/uselib`, and `dir/lib.so` and `dir/new.so`: tests/programs/hostlib.c as built
/// and as upgraded (WRONG_fn where lib_hot was). `None` after saying why (no gcc).
fn hostlib(dir: &Path) -> Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> {
    let Some(uselib) = compile_c("uselib.c", dir, "uselib", &["-ldl"]) else {
        assert!(std::env::var_os("CI").is_none(), "gcc missing in CI");
        return None;
    };
    let lib = compile_c("hostlib.c", dir, "lib.so", &["-shared", "-fPIC"])?;
    let new = compile_c(
        "hostlib.c",
        dir,
        "new.so",
        &["-shared", "-fPIC", "-DUPGRADED"],
    )?;
    Some((uselib, lib, new))
}

/// A `uselib LIB MS` process of [`USER`], once it says its library is loaded.
fn spin_in(uselib: &Path, lib: &Path, ms: u64) -> KillOnDrop {
    let mut child = KillOnDrop(
        as_user(Command::new(uselib).arg(lib).arg(ms.to_string()))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut said = String::new();
    let mut err = std::io::BufReader::new(child.0.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut err, &mut said).unwrap();
    assert_eq!(said.trim(), "loaded", "uselib {}", lib.display());
    child
}

/// Runs `n` processes of [`USER`] one after another, each loading `lib` and spinning in
/// it for 5 ms: most are gone before the profiler reads their `/proc` entry, so their
/// library is found by its path when their samples are analysed.
fn short_lived(uselib: &Path, lib: &Path, n: usize) {
    for _ in 0..n {
        let st = as_user(Command::new(uselib).arg(lib).arg("5"))
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "uselib {}: {st}", lib.display());
    }
}

/// A one-shot `cpi-bpf ARGS --format json --output FILE`, started.
fn one_shot(args: &[&str], out: &Path) -> std::process::Child {
    Command::new(cpi_bpf())
        .args(args)
        .args(["--format", "json", "--output"])
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// An agent under attack (`--interval 1`, tests/src/lib.rs `agent_with_metrics`), its
/// anonymous RSS less its binary cache followed from the moment the attack begins.
struct Watched {
    agent: KillOnDrop,
    metrics: std::net::SocketAddr,
    dir: std::path::PathBuf,
    steady: Option<u64>,
    peak: u64,
}

impl Watched {
    /// Starts the agent and waits for its first window (a hang guard, not a rate).
    fn start(dir: &Path, args: &[&str]) -> Watched {
        let args: Vec<&str> = ["--interval", "1"].iter().chain(args).copied().collect();
        let (agent, metrics) = agent_with_metrics(dir, &args);
        let mut w = Watched {
            agent,
            metrics,
            dir: dir.to_path_buf(),
            steady: None,
            peak: 0,
        };
        w.more_windows(1);
        w
    }

    fn scrape(&self) -> Option<String> {
        http_get(self.metrics, "/metrics")
            .ok()
            .filter(|(code, _)| *code == 200)
            .map(|(_, body)| body)
    }

    /// Anonymous RSS less the binary cache now (the peak follows it), with the scrape.
    fn sample(&mut self) -> Option<(u64, String)> {
        let body = self.scrape()?;
        let cache = metric(&body, "cpi_bpf_cache_bytes")? as u64;
        let now = rss(self.agent.0.id()).saturating_sub(cache);
        self.peak = self.peak.max(now);
        Some((now, body))
    }

    /// The steady state the attack is measured against: now.
    fn attack_begins(&mut self) {
        let (now, _) = self.sample().expect("the agent serves /metrics");
        self.steady = Some(now);
        self.peak = now;
    }

    fn windows(&self) -> usize {
        std::fs::read_dir(self.dir.join("store"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("w-"))
                    .count()
            })
            .unwrap_or(0)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// Waits for `n` more windows in the store, following the RSS; fails if the agent
    /// dies or writes none for 60 s (a hang guard: windows come every second).
    fn more_windows(&mut self, n: usize) {
        let (want, t0) = (self.windows() + n, Instant::now());
        let mut last = (self.windows(), Instant::now());
        while self.windows() < want {
            if let Some(st) = self.agent.0.try_wait().unwrap() {
                panic!("the agent ended ({st}): {}", self.log());
            }
            if self.windows() != last.0 {
                last = (self.windows(), Instant::now());
            }
            assert!(
                last.1.elapsed() < Duration::from_secs(60),
                "no window for 60 s ({} of {want} after {:?}): {}",
                self.windows(),
                t0.elapsed(),
                self.log()
            );
            self.sample();
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Ends the agent with one SIGTERM within [`BOUND`], checks that it exited cleanly
    /// and stayed within [`RSS_BOUND`] of its steady state; its log.
    fn stop(mut self) -> String {
        self.sample();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.agent.0.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = self.agent.0.try_wait().unwrap() {
                break st;
            }
            assert!(t0.elapsed() < BOUND, "SIGTERM did not end the agent");
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = self.log();
        assert!(st.success(), "the agent ended {st}: {log}");
        assert!(!log.contains("panicked"), "{log}");
        windows_every_interval(&self.dir.join("store"));
        let steady = self.steady.expect("attack_begins was called");
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        eprintln!(
            "agent anonymous RSS less its cache: {:.1} MiB steady, {:.1} MiB peak under attack",
            mib(steady),
            mib(self.peak)
        );
        assert!(
            self.peak <= steady + RSS_BOUND,
            "RSS {:.1} MiB, {:.1} MiB at the steady state",
            mib(self.peak),
            mib(steady)
        );
        log
    }
}

/// Row "truncate -s 16384 lib.so on a library its own process has mapped", end to
/// end: a process of an unprivileged user spins in its library
/// (tests/programs/hostlib.c: code in the first 16 KiB, symbols beyond), and the user
/// truncates the library to 16 KiB while the agent (`--pid`) and a one-shot `--pid`
/// profile the process. Neither dies of SIGBUS: the agent keeps writing windows and ends
/// on SIGTERM within its RSS bound; the one-shot writes its profile, the truncated file
/// named in a warning and its samples counted unmapped. The user's process runs on.
#[test]
fn a_library_truncated_by_its_user_kills_neither_profiler() {
    if !require_root("profiling a process") {
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let dir = temp_dir("hostile-truncate-e2e");
    let Some((uselib, lib, _)) = hostlib(&dir) else {
        return;
    };
    std::os::unix::fs::chown(&lib, Some(USER), Some(USER)).unwrap();
    let mut target = spin_in(&uselib, &lib, 600_000);
    let pid = target.0.id().to_string();
    let mut agent = Watched::start(&dir, &["--pid", &pid]);
    agent.more_windows(1);
    agent.attack_begins();
    let json = dir.join("one-shot.json");
    let run = one_shot(&["--pid", &pid, "--duration", "4"], &json);
    std::thread::sleep(Duration::from_millis(1500));
    let st = as_user(Command::new("truncate").args(["-s", "16384"]).arg(&lib))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(std::fs::metadata(&lib).unwrap().len(), 16384);
    let r = wait_bounded(run, Duration::from_secs(4) + BOUND);
    let err = stderr(&r);
    eprintln!("one-shot: {err}");
    assert!(r.status.success(), "{}: {err}", r.status);
    let p = cpi_user::report::file::read(&json).expect("the one-shot's profile");
    let text = std::fs::read_to_string(&json).unwrap();
    agent.more_windows(3);
    assert!(
        target.0.try_wait().unwrap().is_none(),
        "the user's process died: its code is in the first 16 KiB"
    );
    let log = agent.stop();
    eprintln!("agent: {log}");
    let named = text.contains("\"lib_hot\"");
    let lib_named = err.contains(&*lib.to_string_lossy());
    eprintln!(
        "one-shot: lib_hot named {named}, the file named in a warning {lib_named}, {} unmapped samples",
        p.lost.unmapped_samples
    );
    assert!(
        lib_named && p.lost.unmapped_samples > 0,
        "the truncated file is named and its samples counted: {err}"
    );
}

/// Rows "replaced a library of a short-lived process with a FIFO", "the same with
/// `ln -s` to a root-only file" and "a library upgraded by rename while short-lived
/// processes used it", end to end, under the agent (`--comm ^uselib$`) and a one-shot
/// `--system-wide` at once. Short-lived processes of an unprivileged user load three
/// libraries (tests/programs/hostlib.c) from a directory the user owns; the user then
/// replaces the first with a FIFO, the second with a link to a root-only build (the
/// upgraded one, whose WRONG_fn covers lib_hot's old offsets), and upgrades the third by
/// rename, after which more processes use the new build. Nothing blocks: the one-shot
/// ends within [`ANALYSIS_BOUND`] of its duration and writes its profile; the agent keeps
/// writing windows and ends on SIGTERM within its RSS bound. WRONG_fn (the root-only
/// file's symbol, and the new build's name for the old build's offsets) is in neither
/// profile; the FIFO and the link are either the files captured before the swap or
/// named as refused with their samples counted unmapped.
#[test]
fn libraries_replaced_under_short_lived_processes() {
    if !require_root("profiling system-wide") {
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let dir = temp_dir("hostile-replaced-e2e");
    let Some((uselib, lib, new)) = hostlib(&dir) else {
        return;
    };
    // The user's directory, its libraries, and a root-only copy of the new build.
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    let libs = ["fifo", "link", "upgrade"].map(|n| home.join(format!("{n}.so")));
    for l in &libs {
        std::fs::copy(&lib, l).unwrap();
        std::os::unix::fs::chown(l, Some(USER), Some(USER)).unwrap();
    }
    std::os::unix::fs::chown(&home, Some(USER), Some(USER)).unwrap();
    let secret_dir = dir.join("root-only");
    std::fs::create_dir(&secret_dir).unwrap();
    std::fs::set_permissions(&secret_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = secret_dir.join("secret.so");
    std::fs::copy(&new, &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    // The full rate whatever else runs (no governor): each process lives for 5 ms, and
    // at the governor's 19 Hz floor on a busy host the agent could sample none of them.
    let mut agent = Watched::start(&dir, &["--comm", "^uselib$", "--overhead-budget", "100"]);
    agent.attack_begins();
    let json = dir.join("one-shot.json");
    // Until Ctrl-C, sent when the attack is over: a fixed duration raced the attack on
    // a loaded host (its 120 processes once took 10 s).
    let run = one_shot(
        // -v: each refused file on a line of its own, with its reason.
        &["-v", "--system-wide"],
        &json,
    );
    std::thread::sleep(Duration::from_secs(1));
    for l in &libs {
        short_lived(&uselib, l, 40);
    }
    let script = format!(
        "rm {fifo} && mkfifo {fifo} && ln -sf {secret} {link} && cp {new} {upgrade}.tmp \
         && mv {upgrade}.tmp {upgrade}",
        fifo = libs[0].display(),
        link = libs[1].display(),
        upgrade = libs[2].display(),
        secret = secret.display(),
        new = new.display(),
    );
    let st = as_user(Command::new("sh").args(["-c", &script]))
        .status()
        .unwrap();
    assert!(st.success(), "{script}");
    short_lived(&uselib, &libs[2], 40);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let r = wait_bounded(run, ANALYSIS_BOUND);
    let err = stderr(&r);
    assert_eq!(r.status.code(), Some(130), "{}: {err}", r.status);
    let p = cpi_user::report::file::read(&json).expect("the one-shot's profile");
    agent.more_windows(3);
    let log = agent.stop();
    let store = run_bounded(
        Command::new(cpi_bpf())
            .args(["report", "--format", "json", "--store"])
            .arg(dir.join("store")),
    );
    assert!(store.status.success(), "{}", stderr(&store));
    let stored = String::from_utf8_lossy(&store.stdout).into_owned();
    let one = std::fs::read_to_string(&json).unwrap();
    eprintln!("one-shot: {err}\nagent: {log}");
    for (what, text) in [("one-shot", &one), ("agent", &stored)] {
        assert!(
            !text.contains("WRONG_fn"),
            "{what}: named from another file"
        );
        assert!(text.contains("\"lib_hot\""), "{what}: lib_hot not named");
    }
    let unmapped = p.lost.unmapped_samples;
    eprintln!("one-shot: {unmapped} samples unmapped");
    // A file captured while its processes ran (or opened by its recorded path as they
    // exited, device and inode checked) is the mapped one, swapped or not: its samples
    // are lib_hot's. One that was not is refused, with its reason, and its samples are
    // counted unmapped; never read as what now has its name.
    let mut refused = 0;
    for (l, why) in [
        (&libs[0], "not a regular file"),
        (&libs[1], "not the mapped file"),
    ] {
        let l = l.to_string_lossy();
        let named: Vec<&str> = err.lines().filter(|x| x.contains(&*l)).collect();
        assert!(
            named.iter().all(|x| x.contains(why)),
            "{l} named, but not as refused ({why}): {named:?}"
        );
        refused += usize::from(!named.is_empty());
    }
    assert!(
        refused == 0 || unmapped > 0,
        "the refused files' samples are counted"
    );
}

/// The agent's analysis thread, stopped by ptrace (`PTRACE_SEIZE` then
/// `PTRACE_INTERRUPT`: that thread alone) as if it were stuck; on drop the agent is
/// killed and the stopped thread reaped, so a failing test leaves nothing behind.
struct StoppedThread {
    pid: i32,
    tid: i32,
}

impl StoppedThread {
    fn analysis_of(pid: u32) -> StoppedThread {
        let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .find(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "cpi-bpf-analysi")
            })
            .and_then(|t| t.file_name().to_str()?.parse::<i32>().ok())
            .expect("the agent's thread cpi-bpf-analysis");
        // SAFETY: ptrace and waitpid on a thread of our own child, as root.
        unsafe {
            assert_eq!(
                libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0),
                0,
                "PTRACE_SEIZE"
            );
            assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0), 0);
            let mut status = 0;
            assert_eq!(libc::waitpid(tid, &raw mut status, libc::__WALL), tid);
            assert!(libc::WIFSTOPPED(status), "{status:#x}");
        }
        StoppedThread {
            pid: pid as i32,
            tid,
        }
    }

    /// Reaps the stopped thread once its process has ended (a traced thread waits for
    /// its tracer); false while it has not within `limit`.
    fn reaped_within(&self, limit: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            let mut status = 0;
            // SAFETY: waitpid on our tracee.
            let r =
                unsafe { libc::waitpid(self.tid, &raw mut status, libc::__WALL | libc::WNOHANG) };
            if r == self.tid && (libc::WIFEXITED(status) || libc::WIFSIGNALED(status)) {
                return true;
            }
            if r < 0 {
                return true; // already reaped
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for StoppedThread {
    fn drop(&mut self) {
        // SAFETY: our own child; a killed tracee exits, and is reaped here.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        self.reaped_within(BOUND);
    }
}

/// Item 6, "a stalled analysis is visible and stoppable": with the analysis thread
/// stuck (stopped from outside by ptrace; no file a user controls blocks it any more:
/// the FIFO of the rows above is refused without waiting), `/metrics` still answers and
/// `cpi_bpf_last_window_age_seconds` rises past the stall bound (two intervals, at least
/// `STALL_AFTER_MIN`, cpi-agent/src/lib.rs), the late window is logged, the agent's
/// RSS stays within its bound (collection drains one more interval, then goes on without
/// draining), a first SIGTERM is logged, and a second ends the process although the
/// analysis never finishes.
#[test]
fn a_stalled_analysis_is_visible_and_a_second_sigterm_ends_it() {
    if !require_root("the agent") {
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let dir = temp_dir("hostile-stall");
    let Some((uselib, lib, _)) = hostlib(&dir) else {
        return;
    };
    let target = spin_in(&uselib, &lib, 600_000);
    let pid = target.0.id().to_string();
    let mut agent = Watched::start(&dir, &["--pid", &pid]);
    agent.more_windows(1);
    agent.attack_begins();
    let age = |w: &mut Watched| {
        let (_, body) = w
            .sample()
            .expect("/metrics answers while the analysis is stuck");
        metric(&body, "cpi_bpf_last_window_age_seconds").expect("the window age is exported")
    };
    let before = age(&mut agent);
    let stall = cpi_agent::STALL_AFTER_MIN.as_secs_f64();
    assert!(before < stall, "window age {before} s before the stall");
    let stopped = StoppedThread::analysis_of(agent.agent.0.id());
    let windows = agent.windows();
    // Hang guard: the late window is logged about STALL_AFTER_MIN + 2 s after the stop.
    let t0 = Instant::now();
    let (mut oldest, mut told) = (0.0, false);
    while !(told && oldest > stall) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "after {:?}: window age {oldest} s, the log: {}",
            t0.elapsed(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(500));
        oldest = age(&mut agent);
        told = agent.log().contains("has not finished after");
    }
    assert!(
        agent.windows() <= windows + 1,
        "windows written while stopped"
    );
    eprintln!(
        "window age {before:.1} s before the stall, {oldest:.1} s after {:?}; the log: {}",
        t0.elapsed(),
        agent.log()
    );
    let id = agent.agent.0.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(id, libc::SIGTERM) };
    let t1 = Instant::now();
    while !agent.log().contains("stopping (SIGTERM received)") {
        assert!(
            t1.elapsed() < BOUND,
            "first SIGTERM not seen: {}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The first SIGTERM waits for the analysis, which is stuck: the second ends it.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        agent.agent.0.try_wait().unwrap().is_none(),
        "ended on the first SIGTERM: {}",
        agent.log()
    );
    // SAFETY: as above.
    unsafe { libc::kill(id, libc::SIGTERM) };
    assert!(
        stopped.reaped_within(BOUND),
        "the second SIGTERM did not end the agent"
    );
    let st = agent.agent.0.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGTERM),
        "{st}"
    );
    let steady = agent.steady.unwrap();
    assert!(
        agent.peak <= steady + RSS_BOUND,
        "RSS {} B, {steady} B at the steady state",
        agent.peak
    );
    drop(target);
}

/// Row "put … 1 000 000 empty files in the store": `report --store` and the agent's
/// index of it are bounded (cpi-agent/src/store.rs: the newest `MAX_INDEX`
/// windows listed, the rest counted; unreadable windows named up to `MAX_NAMED_SKIPS`,
/// the rest counted). On tmpfs (`/dev/shm`), one real window and a million empty ones
/// before it: `report` merges the real one within [`BOUND`], says the skipped in a few
/// lines, and peaks under 128 MiB (372 MB before); the agent on that store writes its
/// windows with its anonymous RSS less its cache under [`RSS_BOUND`] (249 MB before).
#[test]
fn a_million_files_in_the_store_cost_bounded_memory() {
    if !require_root("the agent") {
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        let d = shm.join(format!("cpi-tests-{}-store1m", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    } else {
        temp_dir("hostile-store1m")
    };
    let s = dir.join("store");
    let mut st = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None).unwrap();
    let now = std::time::SystemTime::now();
    let ms =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    // A million 1 ms windows in the 2 000 s before now (inside retention), all empty.
    let oldest = ms(now) - 2_000_000;
    let t0 = Instant::now();
    for i in 0..1_000_000u128 {
        let start = oldest + 2 * i;
        std::fs::File::create(s.join(format!("w-{start}-{}.json.gz", start + 1))).unwrap();
    }
    let made = t0.elapsed();
    st.write(&cpi_agent::Window {
        start: now,
        end: now + Duration::from_secs(1),
        profile: time_profile(),
    })
    .unwrap();
    drop(st);
    // Peak RSS from GNU time, which forks the report itself: the rusage of a child this
    // test spawned directly would count the test binary's own peak (the kernel keeps
    // the pre-exec memory's high-water mark: 277 MiB with the whole suite running).
    let t1 = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "peak-kib %M"])
        .arg(cpi_bpf())
        .args(["report", "--format", "json", "--store"])
        .arg(&s)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("/usr/bin/time (cargo xtask setup installs it)");
    let took = t1.elapsed();
    let all = String::from_utf8_lossy(&out.stderr);
    let (timed, said): (Vec<&str>, Vec<&str>) =
        all.lines().partition(|l| l.starts_with("peak-kib "));
    let peak: u64 = timed
        .last()
        .and_then(|l| l["peak-kib ".len()..].trim().parse().ok())
        .map(|kib: u64| kib * 1024)
        .unwrap_or_else(|| panic!("no peak from /usr/bin/time: {all}"));
    let err = said.join("\n");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "1 000 000 files made in {made:?}; report --store: {took:?}, peak RSS {:.1} MiB, \
         {} lines on stderr:\n{err}",
        mib(peak),
        err.lines().count()
    );
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(took < BOUND, "report --store took {took:?}");
    assert!(err.lines().count() <= 30, "{err}");
    assert!(
        peak <= 128 << 20,
        "report --store peaked at {:.1} MiB",
        mib(peak)
    );

    let sleeper = KillOnDrop(Command::new("sleep").arg("600").spawn().unwrap());
    let (agent, metrics) = agent_with_metrics(
        &dir,
        &["--interval", "2", "--pid", &sleeper.0.id().to_string()],
    );
    let (t2, mut most) = (Instant::now(), 0u64);
    loop {
        let body = http_get(metrics, "/metrics").ok().map(|(_, b)| b);
        if let Some(b) = &body {
            if let Some(cache) = metric(b, "cpi_bpf_cache_bytes") {
                most = most.max(rss(agent.0.id()).saturating_sub(cache as u64));
            }
        }
        if body
            .as_deref()
            .and_then(|b| metric(b, "cpi_bpf_windows_total"))
            .is_some_and(|w| w >= 3.0)
        {
            break;
        }
        let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
        assert!(
            t2.elapsed() < Duration::from_secs(60),
            "three windows not written in 60 s: {log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "agent on that store: three windows after {:?}, anonymous RSS less the cache at \
         most {:.1} MiB",
        t2.elapsed(),
        mib(most)
    );
    assert!(most <= RSS_BOUND, "{:.1} MiB", mib(most));
    drop(agent);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Row "held 200 idle TCP connections to the metrics port; 20 slow one-byte clients",
/// end to end: while a process of [`USER`] holds 200 idle connections to the agent's
/// `/metrics` and drips 20 requests a byte every half second, a scrape is answered
/// within the per-connection timeout (cpi-agent/src/metrics.rs `CLIENT_TIMEOUT`,
/// plus a second), the agent keeps writing a window every interval and ends on SIGTERM
/// within its RSS bound.
#[test]
fn idle_and_slow_clients_of_a_user_cannot_stall_the_agents_metrics() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("hostile-metrics");
    let sleeper = KillOnDrop(Command::new("sleep").arg("600").spawn().unwrap());
    let mut agent = Watched::start(&dir, &["--pid", &sleeper.0.id().to_string()]);
    agent.attack_begins();
    let clients = "import socket, sys, threading, time\n\
        addr = ('127.0.0.1', int(sys.argv[1]))\n\
        idle = [socket.create_connection(addr) for _ in range(200)]\n\
        def drip():\n\
        \x20   try:\n\
        \x20       c = socket.create_connection(addr)\n\
        \x20       for b in b'GET /metrics HTTP/1.1\\r\\n':\n\
        \x20           c.send(bytes([b]))\n\
        \x20           time.sleep(0.5)\n\
        \x20   except OSError:\n\
        \x20       pass\n\
        for _ in range(20):\n\
        \x20   threading.Thread(target=drip, daemon=True).start()\n\
        print('ready', flush=True)\n\
        time.sleep(600)\n";
    let mut attack = KillOnDrop(
        as_user(Command::new("python3").args(["-c", clients]))
            .arg(agent.metrics.port().to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3"),
    );
    let mut said = String::new();
    let mut out = std::io::BufReader::new(attack.0.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut out, &mut said).unwrap();
    assert_eq!(said.trim(), "ready", "the clients could not connect");
    let bound = cpi_agent::metrics::CLIENT_TIMEOUT + Duration::from_secs(1);
    for _ in 0..3 {
        let t0 = Instant::now();
        assert!(agent.scrape().is_some(), "/metrics did not answer");
        let took = t0.elapsed();
        eprintln!("scrape under attack: {took:?}");
        assert!(took < bound, "a scrape took {took:?} (bound {bound:?})");
        agent.more_windows(1);
    }
    assert!(
        attack.0.try_wait().unwrap().is_none(),
        "the clients ended early"
    );
    drop(attack);
    agent.stop();
}

/// Bad input: a local user's binary whose unwind rules cost milliseconds to
/// evaluate (tests/programs/wide_unwind.c built with `-DCOSTLY`: 600 functions, each
/// FDE 30,000 remember/restore pairs) blinded the root agent sampling it: the collector, unwinding
/// sample after sample, cut no 5 s window for 20–40 s. The agent at its full rate
/// (`--overhead-budget 50`: 999 Hz) must cut every window at its boundary (none spans
/// more than two intervals, the first one included), flag the stacks it would not
/// unwind and count them, and never put a frame past the refused one.
#[test]
fn unwind_rules_that_cost_too_much_cannot_blind_the_agent() {
    if !require_root("the agent") {
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let dir = temp_dir("hostile-costly-unwind");
    let prog = compile_c("wide_unwind.c", &dir, "costly_unwind", &["-DCOSTLY"])
        .expect("gcc builds wide_unwind.c -DCOSTLY");
    let mut target = KillOnDrop(
        as_user(&mut Command::new(&prog))
            .arg("600")
            .spawn()
            .unwrap(),
    );
    let interval = Duration::from_secs(5);
    let pid = target.0.id().to_string();
    let (mut agent, metrics) = agent_with_metrics(
        &dir,
        &["--pid", &pid, "--interval", "5", "--overhead-budget", "50"],
    );
    let store = dir.join("store");
    // Four windows stored; the wait is a hang guard, not a rate.
    let t0 = Instant::now();
    let mut too_costly = None;
    while cpi_tests::store_windows(&store).len() < 4 && t0.elapsed() < Duration::from_secs(120) {
        if let Ok((_, body)) = http_get(metrics, "/metrics") {
            too_costly = cpi_tests::labelled(
                &body,
                "cpi_bpf_samples_lost_total",
                "reason",
                "stacks_too_costly",
            )
            .or(too_costly);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let t1 = Instant::now();
    while agent.0.try_wait().unwrap().is_none() {
        assert!(t1.elapsed() < BOUND, "the agent did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    target.0.kill().unwrap();
    target.0.wait().unwrap();
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let windows = cpi_tests::store_windows(&store);
    let spans: Vec<u64> = windows.iter().map(|(s, e, _)| e - s).collect();
    eprintln!("windows (ms): {spans:?}; stacks too costly: {too_costly:?}; the agent said:\n{log}");
    assert!(windows.len() >= 4, "{} windows in 120 s", windows.len());
    // The last one is cut by SIGTERM, at no boundary.
    let max = 2 * interval.as_millis() as u64;
    assert!(
        spans[..spans.len() - 1].iter().all(|&s| s <= max),
        "a window spans more than two intervals: {spans:?}"
    );
    assert!(
        too_costly.is_some_and(|n| n > 0.0),
        "stacks too costly: {too_costly:?}"
    );
    // Samples in the functions whose rules were refused: their stacks end there.
    let (mut ending, mut past) = (0, Vec::new());
    // Read as the library reads a window (a file's frames are numbers into its table).
    let profiles: Vec<cpi_user::profile::Profile> = windows
        .iter()
        .map(|(_, _, w)| cpi_user::profile::Profile::from_json(w.to_string().as_bytes()).unwrap())
        .collect();
    for st in profiles
        .iter()
        .flat_map(|p| &p.processes)
        .flat_map(|p| &p.stacks)
    {
        let names: Vec<&str> = st.frames.iter().map(|f| f.function.as_str()).collect();
        if let Some(i) = names.iter().position(|n| n.starts_with("wide_")) {
            if i + 1 == names.len() {
                ending += 1;
            } else {
                past.push(names.join(";"));
            }
        }
    }
    assert!(ending > 0, "no stack through the costly functions");
    assert!(past.is_empty(), "frames past a refused one: {past:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The unwind rules the agent checked (cpi-user/src/unwind/cost.rs) must be
/// the rules it evaluates. A process of an unprivileged user spins in its own library
/// (tests/programs/hostlib.c built with `-DPATCHABLE`: lib_hot's CFA a DWARF expression,
/// evaluated at every unwind); once the agent (`--pid`) has read and checked the
/// library, the user rewrites that expression in place, same length, into one that
/// branches back to itself (`DW_OP_skip -3`), as `dd conv=notrunc` does to a library its
/// process has mapped. Evaluated, it never ends and the collector cuts no more windows
/// for any process. The agent must keep cutting windows, its stacks through lib_hot
/// still unwound past it to main (the rules as checked), and end on SIGTERM.
#[test]
fn unwind_rules_rewritten_after_the_check_cannot_blind_the_agent() {
    if !require_root("profiling a process") {
        return;
    }
    let _cpu = cpi_tests::cpu_heavy();
    let dir = temp_dir("hostile-unwind-rewrite");
    let Some(uselib) = compile_c("uselib.c", &dir, "uselib", &["-ldl"]) else {
        assert!(std::env::var_os("CI").is_none(), "gcc missing in CI");
        return;
    };
    let lib = compile_c(
        "hostlib.c",
        &dir,
        "lib.so",
        &["-shared", "-fPIC", "-DPATCHABLE"],
    )
    .expect("gcc builds hostlib.c -DPATCHABLE");
    std::os::unix::fs::chown(&lib, Some(USER), Some(USER)).unwrap();
    // DW_CFA_def_cfa_expression, 3 bytes: DW_OP_breg7 8, DW_OP_nop.
    let (checked, looping) = ([0x0f, 3, 0x77, 8, 0x96], [0x0f, 3, 0x2f, 0xfd, 0xff]);
    let bytes = std::fs::read(&lib).unwrap();
    let at: Vec<usize> = bytes
        .windows(checked.len())
        .enumerate()
        .filter(|(_, w)| *w == checked)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "lib_hot's CFA expression, once in lib.so");
    let target = spin_in(&uselib, &lib, 600_000);
    let pid = target.0.id().to_string();
    let mut agent = Watched::start(&dir, &["--pid", &pid]);
    agent.more_windows(2);
    agent.attack_begins();
    let mut dd = as_user(Command::new("dd").arg(format!("of={}", lib.display())))
        .args(["bs=1", "conv=notrunc", "status=none"])
        .arg(format!("seek={}", at[0]))
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    dd.stdin.take().unwrap().write_all(&looping).unwrap();
    assert!(dd.wait().unwrap().success(), "the owner rewrites lib.so");
    assert_eq!(std::fs::read(&lib).unwrap()[at[0]..at[0] + 5], looping);
    let first_after = agent.windows();
    // A hang guard of 60 s without a window (KillOnDrop ends the agent if it fires).
    agent.more_windows(3);
    let log = agent.stop();
    eprintln!("agent: {log}");
    // The windows cut after the rewrite: stacks in lib_hot go on past it.
    let windows = cpi_tests::store_windows(&dir.join("store"));
    let (mut through, mut ending) = (0, 0);
    for (_, _, w) in windows.iter().skip(first_after) {
        let p = cpi_user::profile::Profile::from_json(w.to_string().as_bytes()).unwrap();
        for st in p.processes.iter().flat_map(|p| &p.stacks) {
            let names: Vec<&str> = st.frames.iter().map(|f| f.function.as_str()).collect();
            match names.iter().position(|&n| n == "lib_hot") {
                Some(i) if names[i + 1..].contains(&"main") => through += 1,
                Some(_) => ending += 1,
                None => {}
            }
        }
    }
    eprintln!("stacks in lib_hot after the rewrite: {through} to main, {ending} not");
    assert!(
        through > 0,
        "no stack through lib_hot to main after the rewrite"
    );
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
