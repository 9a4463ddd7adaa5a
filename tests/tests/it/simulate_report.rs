//! A simulate profile read back with `cpi-bpf report`: the accuracy is part of the
//! profile (kept in JSON, shown in the table), and `.fdata` comes from the profile alone
//! (BOLT's local-symbol names resolved during analysis, not from the files present when
//! the report is rendered).

use std::process::Command;

use cpi_tests::tracer::{program, tool_dir};
use cpi_tests::{cpi_bpf, output_ok, temp_dir};

#[test]
fn report_keeps_accuracy_and_writes_fdata_without_the_binary() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let dir = temp_dir("sim-report");
    // A copy of the program that can be deleted after the run.
    let exe = dir.join("sim_mix");
    cpi_tests::copy_program(&program("sim_mix").unwrap(), &exe);
    let json = dir.join("p.json");
    output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--format", "json", "--output"])
            .arg(&json)
            .arg("--")
            .arg(&exe)
            .arg("1"),
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let acc = &written["accuracy"];
    assert!(acc["overlap_instruction"].as_f64().is_some(), "{acc}");

    // report --format json keeps the accuracy as written.
    let again = output_ok(
        Command::new(cpi_bpf())
            .arg("report")
            .arg(&json)
            .args(["--format", "json"]),
    );
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["accuracy"], *acc);

    // The table shows it.
    let table = output_ok(Command::new(cpi_bpf()).arg("report").arg(&json));
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("accuracy against the exact trace"),
        "{table}"
    );
    let overlap = format!(
        "instruction {:.4}",
        acc["overlap_instruction"].as_f64().unwrap()
    );
    assert!(table.contains(&overlap), "{overlap} in\n{table}");

    // .fdata with the binary present, then without it: the same, local symbols named
    // as BOLT names them (sim_mix's static functions).
    let fdata = || {
        let out = output_ok(
            Command::new(cpi_bpf())
                .arg("report")
                .arg(&json)
                .args(["--format", "fdata"]),
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let with_binary = fdata();
    assert!(
        with_binary.contains("1 fib/1 "),
        "local symbol named as BOLT does:\n{with_binary}"
    );
    std::fs::remove_file(&exe).unwrap();
    assert_eq!(fdata(), with_binary);
    let _ = std::fs::remove_dir_all(&dir);
}
