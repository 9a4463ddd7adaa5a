//! A hostile host: a user who, in `unshare -rm`, mounts a tmpfs sized to exactly the
//! pages written and runs a copy of a binary whose `.symtab` alternates 40 000 written
//! pages with holes, end to end as the unprivileged user. Each hole read on the full tmpfs is a `SIGBUS`;
//! the guard (cpi-user/src/fsafe/sys/map.rs) once mapped a page of zeros per fault, each a
//! new mapping, until `vm.max_map_count` (65 530) made the next fail and the fault
//! killed the root profiler (exit 135; a system-wide test of the suite died so once).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpi_tests::{compile_c, cpi_bpf, cpu_heavy, require_root, stderr, temp_dir, KillOnDrop};

/// Holes in the forged symbol table: with the written pages between them, twice as
/// many mappings as `vm.max_map_count` allows were one page replaced per fault.
const HOLES: usize = 40_000;
const PAGE: usize = 4096;
/// The unprivileged user.
const USER: u32 = 65534;

/// `elf` with its `.symtab` moved to the end of the file (page-aligned) and grown to
/// `pages` pages: the returned header bytes, padded to a page, come first in the file.
fn with_huge_symtab(mut elf: Vec<u8>, pages: usize) -> Vec<u8> {
    let u16_at = |b: &[u8], o: usize| usize::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let shoff = usize::try_from(u64_at(&elf, 0x28)).unwrap();
    let (shentsize, shnum) = (u16_at(&elf, 0x3a), u16_at(&elf, 0x3c));
    elf.resize(elf.len().next_multiple_of(PAGE), 0);
    let symtab = (0..shnum)
        .map(|i| shoff + i * shentsize)
        .find(|&h| u32::from_le_bytes(elf[h + 4..h + 8].try_into().unwrap()) == 2)
        .expect("busy has a symbol table (SHT_SYMTAB)");
    let size = (pages * PAGE) / 24 * 24;
    let end = elf.len() as u64;
    elf[symtab + 24..symtab + 32].copy_from_slice(&end.to_le_bytes());
    elf[symtab + 32..symtab + 40].copy_from_slice(&(size as u64).to_le_bytes());
    elf
}

#[test]
fn holes_on_a_full_tmpfs_kill_no_profiler() {
    if !require_root("profiling another user's process") {
        return;
    }
    let _cpu = cpu_heavy();
    // Built (on first use) before the user's program starts its 60 s.
    let profiler = cpi_bpf();
    let dir = temp_dir("hostile-tmpfs");
    let Some(busy) = compile_c("busy.c", &dir, "busy", &["-lpthread"]) else {
        assert!(std::env::var_os("CI").is_none(), "gcc missing in CI");
        return;
    };
    let head = with_huge_symtab(std::fs::read(&busy).unwrap(), 2 * HOLES);
    std::fs::write(dir.join("head"), &head).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // The user writes the header, then one page of zeros (valid, empty symbols) and one
    // hole, HOLES times, on a tmpfs exactly as large as what is written, and runs it.
    let size = head.len() + HOLES * PAGE;
    let script = format!(
        "mount -t tmpfs -o size={size} none {m} && python3 -c '
import sys
f = open(\"{m}/busy\", \"wb\")
f.write(open(\"{d}/head\", \"rb\").read())
z = bytes({PAGE})
for _ in range({HOLES}):
    f.write(z)
    f.seek({PAGE}, 1)
f.truncate(f.tell())
f.close()
' && chmod 755 {m}/busy && exec {m}/busy 60",
        m = mnt.display(),
        d = dir.display()
    );
    let target = KillOnDrop(
        Command::new("unshare")
            .args(["-rm", "sh", "-c", &script])
            .uid(USER)
            .gid(USER)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = target.0.id();
    let t0 = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "busy") {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the user's program never ran"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let json = dir.join("p.json");
    let out = Command::new(profiler)
        .args([
            "-p",
            &pid.to_string(),
            "--duration",
            "3",
            "--format",
            "json",
            "-o",
        ])
        .arg(&json)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&out);
    eprintln!("one-shot: {err}");
    assert!(out.status.success(), "{}: {err}", out.status);
    let p = cpi_user::report::file::read(&json).expect("the one-shot's profile");
    assert!(
        p.processes.iter().any(|q| q.pid == pid),
        "the user's process is in the profile"
    );
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok(),
        "the user's process runs on"
    );
}
