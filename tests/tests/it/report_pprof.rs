//! pprof export checked against its real reader, `go tool pprof` (Debian golang-go),
//! and decoded back to check types, mappings and build-ids.

use std::io::Read;
use std::process::Command;

use crate::report_fixture::{cpi_profile, have, scratch, time_profile};
use cpi_user::profile::model::Profile;
use cpi_user::report::pprof::{encode, PprofProfile};
use prost::Message;

fn decode(bytes: &[u8]) -> PprofProfile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut raw)
        .unwrap();
    PprofProfile::decode(raw.as_slice()).unwrap()
}

#[test]
fn sample_types_mappings_and_build_ids() {
    let p = cpi_profile();
    let pp = decode(&encode(&p).unwrap());
    let s = |i: i64| pp.string_table[i as usize].as_str();
    let types: Vec<_> = pp
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("cycles", "count"),
            ("instructions", "count"),
            ("samples", "count")
        ]
    );
    assert_eq!(s(pp.default_sample_type), "cycles");
    let maps: Vec<_> = pp
        .mapping
        .iter()
        .map(|m| (s(m.filename), s(m.build_id)))
        .collect();
    assert!(maps.contains(&(
        "/opt/bench/bin/bench",
        "5f0c3a2b9d1e4f60718293a4b5c6d7e8f9a0b1c2"
    )));
    // Per function, the samples add up to exactly the table's totals.
    for f in &p.processes[0].functions {
        let fid = pp.function.iter().find(|x| s(x.name) == f.name).unwrap().id;
        let locs: Vec<u64> = pp
            .location
            .iter()
            .filter(|l| l.line[0].function_id == fid)
            .map(|l| l.id)
            .collect();
        let sum = |k: usize| -> i64 {
            pp.sample
                .iter()
                .filter(|x| locs.contains(&x.location_id[0]))
                .map(|x| x.value[k])
                .sum()
        };
        assert_eq!(
            sum(0),
            f.measures.cycles.unwrap().round() as i64,
            "{}",
            f.name
        );
        assert_eq!(
            sum(1),
            f.measures.instructions.unwrap().round() as i64,
            "{}",
            f.name
        );
        assert_eq!(sum(2), f.samples as i64, "{}", f.name);
    }
    // Instruction-level locations exist for functions with disassembly.
    assert!(pp.location.iter().any(|l| l.address == 0x40120e));

    let t = decode(&encode(&time_profile()).unwrap());
    let ts = |i: i64| t.string_table[i as usize].as_str();
    let types: Vec<_> = t
        .sample_type
        .iter()
        .map(|v| (ts(v.r#type), ts(v.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
}

/// Function names of `go tool pprof -top` in order.
fn pprof_top(file: &std::path::Path, index: &str) -> Vec<String> {
    let out = Command::new("go")
        // -nodefraction=0: pprof hides nodes under 0.5% by default; the table does not.
        .args(["tool", "pprof", "-top", "-nodefraction=0"])
        .arg(format!("-sample_index={index}"))
        .arg(file)
        .env("PPROF_BINARY_PATH", "/nonexistent") // names come from the profile
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "go tool pprof failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Rows after the "flat  flat%  sum%  cum  cum%" header; the name is the last column.
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect()
}

fn table_order(p: &Profile) -> Vec<String> {
    let mut f: Vec<_> = p.processes[0].functions.iter().collect();
    if p.mode.has_cpi() {
        f.sort_by(|a, b| {
            b.measures
                .cycles
                .unwrap_or(0.0)
                .total_cmp(&a.measures.cycles.unwrap_or(0.0))
        });
    } else {
        f.sort_by_key(|f| std::cmp::Reverse(f.samples));
    }
    f.iter().map(|f| f.name.clone()).collect()
}

#[test]
fn go_tool_pprof_shows_the_tables_top_functions() {
    if !have("go", "version") {
        cpi_tests::skip(format_args!(
            "`go` not installed (Debian golang-go; cargo xtask setup installs it)"
        ));
        return;
    }
    let dir = scratch("pprof");
    for (name, p, index) in [
        ("cpi.pb.gz", cpi_profile(), "cycles"),
        ("time.pb.gz", time_profile(), "cpu"),
    ] {
        let file = dir.join(name);
        std::fs::write(&file, encode(&p).unwrap()).unwrap();
        let top = pprof_top(&file, index);
        let table = table_order(&p);
        assert_eq!(top, table, "{name}: pprof -top vs the table");
        // And the table really renders in that order.
        let rendered = cpi_user::report::table::render(&p, &Default::default()).unwrap();
        let pos: Vec<_> = table
            .iter()
            .map(|n| rendered.find(n.as_str()).unwrap())
            .collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{rendered}");
    }
    // Binaries have their own address spaces: two at the same addresses (two PIEs)
    // must stay apart.
    let mut p = cpi_profile();
    p.processes[0].functions[2].address = p.processes[0].functions[0].address;
    let file = dir.join("overlap.pb.gz");
    std::fs::write(&file, encode(&p).unwrap()).unwrap();
    assert_eq!(pprof_top(&file, "cycles"), table_order(&p));

    // Address granularity: the hottest instruction of the table's annotate view tops.
    let out = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-addresses",
            "-sample_index=cycles",
        ])
        .arg(dir.join("cpi.pb.gz"))
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        first.contains("40120e") && first.contains("crc_update"),
        "{text}"
    );
}
