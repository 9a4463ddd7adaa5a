//! Hand-built profiles for the report tests, and small helpers (the `cpi-bpf` binary,
//! golden files). Numbers are chosen, not measured: the tests check rendering and
//! formats, not analysis.

use std::path::{Path, PathBuf};

use cpi_common::policy::Perturbation;
use cpi_common::wire::EventRole;
use cpi_user::profile::model::*;

pub fn est(value: f64, samples: u64) -> Option<Estimate> {
    Some(Estimate {
        value,
        rel_error: 1.0 / (samples as f64).sqrt(),
        samples,
    })
}

fn line(
    address: u64,
    count: f64,
    samples: u64,
    cycles: Option<f64>,
    text: &str,
) -> InstructionProfile {
    InstructionProfile {
        address,
        count,
        samples,
        cycles,
        // The hot loop's instructions are sampled enough for their own CPI.
        cpi: cycles
            .filter(|_| samples >= 1_000)
            .and_then(|c| est(c / count, samples)),
        text: text.to_string(),
        source: None,
    }
}

fn events(mode: Mode) -> Vec<EventInfo> {
    let ev = |role: EventRole, name: &str, period, samples| EventInfo {
        role,
        name: name.into(),
        period,
        jitter: if role == EventRole::CpuClock { 0 } else { 4093 },
        thinning: 1,
        unit: EventUnit::of_role(role),
        samples,
        also: Vec::new(),
    };
    match mode {
        Mode::TimeProfile => vec![ev(EventRole::CpuClock, "cpu-clock", 1_000_003, 2_480)],
        _ => vec![
            ev(EventRole::Branches, "cpu/r20c4/", 500_009, 41_220),
            ev(EventRole::Cycles, "cpu/cycles/", 1_000_003, 39_870),
        ],
    }
}

/// A CPI profile of one process: a hot loop function with blocks, edges and
/// disassembly, a cold one, and one below the sample floor.
pub fn cpi_profile() -> Profile {
    let bin = "/opt/bench/bin/bench".to_string();
    let hot = FunctionProfile {
        name: "crc_update".into(),
        mangled: None,
        binary: bin.clone(),
        address: 0x401200,
        size: 0x30,
        samples: 30_000,
        share: 0.752,
        measures: Measures {
            time_ns: None,
            cycles: Some(3.0e10),
            instructions: Some(1.25e10),
            cycles_rel_error: None,
            instructions_rel_error: None,
            cpi: est(2.4, 30_000),
        },
        timed_cpi: None,
        cpi_disagree: false,
        bolt_name: None,
        source: None,
        blocks: vec![
            BlockProfile {
                start: 0x401200,
                end: 0x401208,
                len: 2,
                count: 1.0e6,
                samples: 40,
                cycles: Some(4.1e7),
                cpi: est(2.05, 40),
                timed_cpi: None,
                cpi_disagree: false,
            },
            BlockProfile {
                start: 0x401208,
                end: 0x401224,
                len: 6,
                count: 2.08e9,
                samples: 29_900,
                cycles: Some(2.99e10),
                cpi: est(2.396, 29_900),
                timed_cpi: None,
                cpi_disagree: false,
            },
            BlockProfile {
                start: 0x401224,
                end: 0x401230,
                len: 2,
                count: 1.0e6,
                samples: 3,
                cycles: Some(3.0e6),
                cpi: None,
                timed_cpi: None,
                cpi_disagree: false,
            },
        ],
        edges: vec![
            EdgeProfile {
                from: 0x401220,
                to: 0x401208,
                kind: EdgeKind::Taken,
                count: 2.079e9,
                mispredicts: 1.0e6,
                to_function: None,
                to_binary: None,
            },
            EdgeProfile {
                from: 0x401220,
                to: 0x401224,
                kind: EdgeKind::FallThrough,
                count: 1.0e6,
                mispredicts: 0.0,
                to_function: None,
                to_binary: None,
            },
            EdgeProfile {
                from: 0x401206,
                to: 0x401208,
                kind: EdgeKind::FallThrough,
                count: 1.0e6,
                mispredicts: 0.0,
                to_function: None,
                to_binary: None,
            },
            EdgeProfile {
                from: 0x40122f,
                to: 0x401185,
                kind: EdgeKind::Taken,
                count: 1.0e6,
                mispredicts: 2.0e3,
                to_function: Some("main".into()),
                to_binary: None,
            },
        ],
        lines: vec![
            line(0x401200, 1.0e6, 20, Some(2.0e7), "mov eax,edi"),
            line(0x401203, 1.0e6, 20, Some(2.1e7), "xor ecx,ecx"),
            line(
                0x401208,
                2.08e9,
                5_000,
                Some(5.0e9),
                "movzx edx,byte ptr [rsi+rcx]",
            ),
            line(0x40120c, 2.08e9, 3_000, Some(3.0e9), "xor edx,eax"),
            line(0x40120e, 2.08e9, 14_000, Some(1.4e10), "shr eax,8"),
            line(
                0x401211,
                2.08e9,
                5_900,
                Some(5.9e9),
                "xor eax,dword ptr [rdx*4+0x402000]",
            ),
            line(0x401218, 2.08e9, 1_000, Some(1.0e9), "inc rcx"),
            line(0x401220, 2.08e9, 1_000, Some(1.0e9), "jb 0x401208"),
            line(0x401224, 1.0e6, 2, Some(2.0e6), "not eax"),
            line(0x40122f, 1.0e6, 1, Some(1.0e6), "ret"),
        ],
    };
    let main = FunctionProfile {
        name: "main".into(),
        mangled: None,
        binary: bin.clone(),
        address: 0x401160,
        size: 0x60,
        samples: 9_860,
        share: 0.247,
        measures: Measures {
            time_ns: None,
            cycles: Some(9.86e9),
            instructions: Some(1.12e10),
            cycles_rel_error: None,
            instructions_rel_error: None,
            cpi: est(0.88, 9_860),
        },
        timed_cpi: None,
        cpi_disagree: false,
        bolt_name: None,
        source: None,
        blocks: vec![BlockProfile {
            start: 0x401160,
            end: 0x401190,
            len: 12,
            count: 1.0e6,
            samples: 9_860,
            cycles: Some(9.86e9),
            cpi: est(0.88, 9_860),
            timed_cpi: None,
            cpi_disagree: false,
        }],
        edges: vec![EdgeProfile {
            from: 0x401180,
            to: 0x401200,
            kind: EdgeKind::Taken,
            count: 1.0e6,
            mispredicts: 0.0,
            to_function: Some("crc_update".into()),
            to_binary: None,
        }],
        lines: vec![],
    };
    let cold = FunctionProfile {
        name: "memcpy".into(),
        mangled: None,
        binary: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
        address: 0x9a0c0,
        size: 0x200,
        samples: 2,
        share: 0.0001,
        measures: Measures {
            time_ns: None,
            cycles: Some(2.0e6),
            instructions: Some(1.5e6),
            cycles_rel_error: None,
            instructions_rel_error: None,
            cpi: None,
        },
        timed_cpi: None,
        cpi_disagree: false,
        bolt_name: None,
        source: None,
        blocks: vec![],
        edges: vec![],
        lines: vec![],
    };
    Profile {
        format_version: PROFILE_FORMAT_VERSION,
        tool_version: "0.1.0".into(),
        mode: Mode::Cpi,
        mode_reason: "LBR (32 entries) and cycles available".into(),
        command: vec!["./bench".into(), "--size".into(), "64M".into()],
        duration_secs: 12.5,
        events: events(Mode::Cpi),
        perturbation: Perturbation::Both,
        range_window: 8,
        lost_samples: 15,
        lost: LossReport {
            ring_full: 12,
            branch_errors: 3,
            malformed: 0,
            thinned: 40,
            short_samples: 0,
            invalid_ranges: 117,
            unmapped_samples: 0,
            sideband_lost: 2,
            stacks_truncated: 0,
            stacks_unknown_code: 0,
            stacks_failed: 0,
            stacks_too_costly: 0,
            stacks_evicted: 0,
            filtered_in_kernel: 0,
            throttled: 0,
        },
        binaries: vec![
            BinaryInfo {
                path: bin,
                build_id: Some("5f0c3a2b9d1e4f60718293a4b5c6d7e8f9a0b1c2".into()),
                deleted: false,
                stripped: false,
                owner: None,
            },
            BinaryInfo {
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                build_id: Some("0123456789abcdef0123456789abcdef01234567".into()),
                deleted: false,
                stripped: true,
                owner: None,
            },
        ],
        accuracy: None,
        recorded_on: None,
        cpi_withheld: None,
        processes: vec![ProcessProfile {
            pid: 4242,
            comm: "bench".into(),
            identity: Default::default(),
            samples: 39_862,
            branch_samples: 41_220,
            measures: Measures {
                time_ns: None,
                cycles: Some(3.9862e10),
                instructions: Some(2.37e10),
                cycles_rel_error: None,
                instructions_rel_error: None,
                cpi: est(1.68, 39_862),
            },
            functions: vec![hot, main, cold],
            calls: Vec::new(),
            stacks: Vec::new(),
        }],
        unread: Vec::new(),
    }
}

/// A time profile (no PMU) of one process: samples and CPU time only.
pub fn time_profile() -> Profile {
    let bin = "/usr/bin/xz".to_string();
    let f = |name: &str, address, samples: u64, lines| FunctionProfile {
        name: name.into(),
        mangled: None,
        binary: bin.clone(),
        address,
        size: 0x40,
        samples,
        share: samples as f64 / 2_480.0,
        measures: Measures {
            time_ns: Some(samples as f64 * 1_000_003.0),
            cycles: None,
            instructions: None,
            cycles_rel_error: None,
            instructions_rel_error: None,
            cpi: None,
        },
        timed_cpi: None,
        cpi_disagree: false,
        bolt_name: None,
        source: None,
        blocks: vec![],
        edges: vec![],
        lines,
    };
    Profile {
        format_version: PROFILE_FORMAT_VERSION,
        tool_version: "0.1.0".into(),
        mode: Mode::TimeProfile,
        mode_reason: "no PMU: /sys/bus/event_source/devices/cpu missing".into(),
        command: vec!["xz".into(), "-9".into(), "data.tar".into()],
        duration_secs: 2.5,
        events: events(Mode::TimeProfile),
        perturbation: Perturbation::User,
        range_window: 0,
        lost_samples: 0,
        lost: LossReport::default(),
        binaries: vec![BinaryInfo {
            path: bin.clone(),
            build_id: Some("aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55".into()),
            deleted: false,
            stripped: true,
            owner: None,
        }],
        accuracy: None,
        recorded_on: None,
        cpi_withheld: None,
        processes: vec![ProcessProfile {
            pid: 777,
            comm: "xz".into(),
            identity: Default::default(),
            samples: 2_480,
            branch_samples: 0,
            measures: Measures {
                time_ns: Some(2_480.0 * 1_000_003.0),
                cycles: None,
                instructions: None,
                cycles_rel_error: None,
                instructions_rel_error: None,
                cpi: None,
            },
            functions: vec![
                f(
                    "lzma_mf_bt4_find",
                    0x10200,
                    1_900,
                    vec![
                        line(0x10200, 0.0, 300, None, "mov r8d,dword ptr [rdi+0x58]"),
                        line(0x10204, 0.0, 1_250, None, "cmp byte ptr [rax+rdx],cl"),
                        line(0x10208, 0.0, 350, None, "jne 0x10200"),
                    ],
                ),
                f("lzma_rc_encode", 0x12000, 500, vec![]),
                f("func_13a40", 0x13a40, 80, vec![]),
            ],
            calls: Vec::new(),
            stacks: Vec::new(),
        }],
        unread: Vec::new(),
    }
}

/// Compares `actual` with `tests/golden/NAME`; `CPI_BPF_BLESS=1` rewrites the file.
pub fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(name);
    if std::env::var_os("CPI_BPF_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
        eprintln!("blessed {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with CPI_BPF_BLESS=1 to create it)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs (CPI_BPF_BLESS=1 regenerates it after review)\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

/// A fresh scratch directory for one test, removed when dropped (failed tests too).
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("cpi-bpf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Whether a command can be run (`cmd --version` or similar succeeds).
pub fn have(cmd: &str, arg: &str) -> bool {
    std::process::Command::new(cmd)
        .arg(arg)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
