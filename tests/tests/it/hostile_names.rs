//! What a local user's long names cost root: a function named with 1 MiB, reached from
//! 600 callers, in a window of the agent's store. Names are cut to their budget
//! (cpi-user/src/fsafe/text.rs) as they are read, before they are written out into every
//! call path that names them: the window is read (it was skipped whole, its names over
//! the reader's 256 MiB), its page stays small, and the cut says how much was cut.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use cpi_agent::store::{self, Store};
use cpi_tests::{
    agent, cpi_bpf, require_root, stderr, stop_agent, store_windows, temp_dir, vm_hwm,
    workspace_root, KillOnDrop,
};

use crate::report_fixture::time_profile;

/// The golden time profile with `callers` call paths, each a caller's frame under one
/// function named with `name_bytes` bytes, in format 2 (a frame table); the paths hold
/// most of the time, so the flame graph draws every one.
fn long_named_window(name_bytes: usize, callers: usize) -> Vec<u8> {
    let golden = std::fs::read(workspace_root().join("tests/golden/time_profile.json")).unwrap();
    let mut p: serde_json::Value = serde_json::from_slice(&golden).unwrap();
    let long = "L".repeat(name_bytes);
    let mut functions = vec![serde_json::json!({"name": long, "binary": "/usr/bin/x"})];
    let mut frames = vec![serde_json::json!({"function": 0, "address": 16})];
    let mut paths = Vec::new();
    for i in 0..callers {
        functions.push(serde_json::json!({"name": format!("caller{i}"), "binary": "/usr/bin/x"}));
        frames.push(serde_json::json!({"function": i + 1, "address": 4096 + i}));
        paths.push(serde_json::json!({
            "frames": [0, i + 1],
            "end": "complete",
            "samples": 1000,
            "time_ns": 1e9,
        }));
    }
    p["processes"][0]["stacks"] = paths.into();
    p["stack_functions"] = functions.into();
    p["stack_frames"] = frames.into();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    serde_json::to_writer(&mut gz, &p).unwrap();
    gz.finish().unwrap()
}

#[test]
fn a_window_of_long_names_is_read_with_its_names_cut() {
    let dir = temp_dir("hostile-long-names");
    let s = dir.join("store");
    let mut st = Store::open(&s, store::DEFAULT_RETAIN, 1 << 30, None).unwrap();
    let t = |secs: u64| std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
    st.write(&cpi_agent::Window {
        start: t(0),
        end: t(10),
        profile: time_profile(),
    })
    .unwrap();
    let window = s.join("w-1700000010000-1700000020000.json.gz");
    let mut f = std::fs::File::create(&window).unwrap();
    f.write_all(&long_named_window(1 << 20, 600)).unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    drop(f);
    let page = dir.join("page.html");
    let r = Command::new("/usr/bin/time")
        .args(["-f", "peak-kib %M"])
        .arg(cpi_bpf())
        .args(["report", "--format", "html", "--output"])
        .arg(&page)
        .arg("--store")
        .arg(&s)
        .output()
        .unwrap();
    let err = stderr(&r);
    assert!(r.status.success(), "{err}");
    assert!(!err.contains("skipped"), "a window was skipped: {err}");
    let peak_kib: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("peak-kib ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak from /usr/bin/time: {err}"));
    let html = std::fs::read_to_string(&page).unwrap();
    eprintln!("page {} bytes, peak RSS {peak_kib} KiB", html.len());
    // The name is drawn cut, saying how much of its 1 MiB was cut.
    let cut = html.find("…[+").expect("a cut name on the page");
    assert!(
        html[cut..].starts_with("…[+1040416 bytes]"),
        "{}",
        &html[cut..cut + 40]
    );
    assert!(html.contains("caller599"), "every caller is on the page");
    // The cut name is held once, in the page's string table, however many frames
    // name it: it was written into each of its 600 frames twice (name and tooltip), a
    // 10.4 MB page with the cut name 1 200 times; now 0.6 MB. The bound: the cut name
    // once, and for each caller its two frames (flame graph and callers view) and rows
    // in 2 KiB (≈ 1 KiB seen), over the golden window's page (a 64 KiB allowance).
    let kept = html[..cut].bytes().rev().take_while(|&b| b == b'L').count();
    assert_eq!(kept + 1040416, 1 << 20, "the cut says the full length");
    let held = html.matches(&"L".repeat(kept)).count();
    assert_eq!(held, 1, "the cut name is on the page {held} times");
    let bound = kept + 600 * 2048 + (64 << 10);
    assert!(
        html.len() < bound,
        "a page of {} bytes, over {bound}",
        html.len()
    );
    assert!(peak_kib < 512 << 10, "peak RSS {peak_kib} KiB");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bytes of the long name in [`long_named_program`]: 256 KiB, far past any
/// name a terminal or a metrics label should carry whole.
const LONG_NAME: usize = 256 << 10;

/// A C program whose hot function is named with [`LONG_NAME`] bytes (an `asm` label)
/// and called from 200 functions in turn, built into `dir`; `None` without gcc.
fn long_named_program(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut src = format!(
        "void hot(void) __asm__(\"{}\");\n\
         __attribute__((noinline)) void hot(void) {{ for (volatile int i = 0; i < 2000; i++); }}\n",
        "L".repeat(LONG_NAME)
    );
    for i in 0..200 {
        src += &format!("__attribute__((noinline)) void caller{i}(void) {{ hot(); }}\n");
    }
    src += "int main(void) { for (;;) {\n";
    for i in 0..200 {
        src += &format!("caller{i}();\n");
    }
    src += "} }\n";
    let c = dir.join("long.c");
    std::fs::write(&c, src).unwrap();
    let exe = dir.join("long");
    let built = Command::new("gcc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&c)
        .status();
    match built {
        Ok(s) if s.success() => Some(exe),
        _ => {
            cpi_tests::skip("gcc cannot build the long-named program");
            None
        }
    }
}

/// The agent beside a process whose hot function has a 256 KiB name reached from 200
/// callers (its VmHWM was 923 MiB before names were cut on reading): its peak resident
/// set stays within its `--cache-mib` bound plus its own base (25 MiB seen), and each
/// window names the function cut, saying how much was cut.
#[test]
fn the_agent_stays_within_its_cache_bound_beside_long_names() {
    if !require_root("the agent") {
        return;
    }
    let dir = temp_dir("hostile-long-names-agent");
    let Some(exe) = long_named_program(&dir) else {
        return;
    };
    let target = KillOnDrop(Command::new(&exe).spawn().unwrap());
    let store = dir.join("store");
    let mut a = agent(
        &store,
        &["--pid", &target.0.id().to_string(), "--cache-mib", "64"],
    );
    let t0 = std::time::Instant::now();
    while store_windows(&store).len() < 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "fewer than 5 windows in 60 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let hwm = vm_hwm(a.id()).expect("the agent runs");
    stop_agent(&mut a);
    eprintln!("agent VmHWM {:.1} MiB", hwm as f64 / f64::from(1 << 20));
    assert!(
        hwm < 128 << 20,
        "agent VmHWM {hwm} bytes over 64 MiB of cache and 64 of base"
    );
    let names: Vec<String> = store_windows(&store)
        .iter()
        .flat_map(|(_, _, w)| w["processes"].as_array().cloned().unwrap_or_default())
        .flat_map(|p| p["functions"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .filter(|n| n.starts_with("LLLL"))
        .collect();
    assert!(!names.is_empty(), "the hot function is in no window");
    for n in &names {
        let kept = n.bytes().take_while(|&b| b == b'L').count();
        let cut: usize = n[kept..]
            .strip_prefix("…[+")
            .and_then(|r| r.strip_suffix(" bytes]"))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not cut as said: …{}", &n[kept..]));
        assert_eq!(kept + cut, LONG_NAME, "the cut says the full length");
    }
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
