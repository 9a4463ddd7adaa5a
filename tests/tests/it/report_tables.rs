//! Golden-file tests of the table views (`CPI_BPF_BLESS=1` regenerates the files).

use crate::report_fixture::{cpi_profile, golden, time_profile};
use cpi_user::report::table::{render, TableError, TableOptions};

fn opts(top: usize, annotate: Option<&str>) -> TableOptions {
    TableOptions {
        top,
        annotate: annotate.map(str::to_string),
        callgraph: false,
    }
}

#[test]
fn cpi_top_functions_and_hot_blocks() {
    let out = render(&cpi_profile(), &opts(20, None)).unwrap();
    golden("cpi_top.txt", &out);
    // Mode and losses come first; the floor is words, not a number.
    assert!(out.starts_with("mode:"));
    assert!(out.contains("lost samples: 15"));
    assert!(out.contains("below floor"));
}

#[test]
fn top_n_limits_rows_and_says_so() {
    let out = render(&cpi_profile(), &opts(1, None)).unwrap();
    golden("cpi_top1.txt", &out);
    assert!(out.contains("top functions by cycles (top 1 of 3)"));
    assert!(!out.contains("memcpy"));
}

#[test]
fn cpi_annotate_marks_hottest_and_block_cpi() {
    let out = render(&cpi_profile(), &opts(20, Some("crc_update"))).unwrap();
    golden("cpi_annotate.txt", &out);
    let hot = out
        .lines()
        .find(|l| l.contains('▶') && l.contains("40120e"));
    assert!(hot.is_some(), "the 14k-sample shr is the hottest:\n{out}");
}

#[test]
fn time_profile_views_say_what_they_are() {
    let p = time_profile();
    let out = render(&p, &opts(20, None)).unwrap();
    golden("time_top.txt", &out);
    assert!(out.contains("time profile (no PMU"));
    assert!(!out.contains("CPI ±"), "no CPI column without cycles");
    let ann = render(&p, &opts(20, Some("lzma_mf_bt4_find"))).unwrap();
    golden("time_annotate.txt", &ann);
}

#[test]
fn unknown_function_is_an_error_with_suggestions() {
    let e = render(&cpi_profile(), &opts(20, Some("crc"))).unwrap_err();
    let TableError::NoSuchFunction { similar, .. } = &e;
    assert_eq!(similar, &["crc_update".to_string()]);
    assert_eq!(
        e.to_string(),
        "no function named \"crc\" in the profile (similar: crc_update)"
    );
}

#[test]
fn minor_processes_are_summarised_hottest_first() {
    let mut p = time_profile();
    let main = p.processes[0].clone();
    let mut helper = main.clone();
    (helper.pid, helper.comm, helper.samples) = (9001, String::new(), 3);
    let mut second = main.clone();
    (second.pid, second.comm, second.samples) = (9002, "second".into(), main.samples / 10);
    p.processes = vec![helper, main.clone(), second];
    let out = render(&p, &opts(20, None)).unwrap();
    let first = out
        .find(&format!("pid {} (", main.pid))
        .expect("main process shown");
    let next = out
        .find("pid 9002 (second)")
        .expect("a 10 % process is shown");
    assert!(first < next, "hottest first:\n{out}");
    assert!(
        !out.contains("pid 9001"),
        "a 3-sample helper is summarised:\n{out}"
    );
    assert!(
        out.contains("1 more processes below 1% of the samples each, 3 samples in all"),
        "{out}"
    );
}

/// `--callgraph` where there can be none says why instead of an empty table.
#[test]
fn callgraph_says_why_there_is_none() {
    let with = |p| {
        render(
            &p,
            &TableOptions {
                callgraph: true,
                ..TableOptions::default()
            },
        )
        .unwrap()
    };
    let t = with(time_profile());
    assert!(
        t.contains("no call graph: time-profile mode has no branch records"),
        "{t}"
    );
    let c = with(cpi_profile());
    assert!(
        c.contains("no call graph: no sampled branch record of this process is a call"),
        "{c}"
    );
}
