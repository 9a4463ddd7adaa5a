//! Golden-file tests of the table views (`CPI_BPF_BLESS=1` regenerates the files).

use crate::report_fixture::{cpi_profile, golden, time_profile};
use cpi_user::report::table::{render, GroupBy, SortKey, TableError, TableOptions};

fn opts(top: usize, annotate: Option<&str>) -> TableOptions {
    TableOptions {
        top,
        annotate: annotate.map(str::to_string),
        ..TableOptions::default()
    }
}

#[test]
fn cpi_top_functions_and_hot_blocks() {
    let out = render(&cpi_profile(), &opts(20, None)).unwrap();
    golden("cpi_top.txt", &out);
    // Mode and losses come first; the floor is words, not a number.
    assert!(out.starts_with("mode:"));
    assert!(out.contains("15 lost"));
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
    let TableError::NoSuchFunction { similar, .. } = &e else {
        panic!("not an unknown name: {e}");
    };
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
    let out = render(
        &p,
        &TableOptions {
            per_process: true,
            ..TableOptions::default()
        },
    )
    .unwrap();
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
        out.contains("1 more process below 1% of the samples each, 3 samples in all"),
        "{out}"
    );
    // Grouped, the summary counts groups and says what they are.
    let out = render(
        &p,
        &TableOptions {
            per_process: true,
            group_by: GroupBy::Comm,
            ..TableOptions::default()
        },
    )
    .unwrap();
    assert!(
        out.contains("1 more command below 1% of the samples each, 3 samples in all"),
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
        t.contains("no call graph: time-profile mode has no branch records and this process no call stacks"),
        "{t}"
    );
    let c = with(cpi_profile());
    assert!(
        c.contains("no call graph: no sampled branch record of this process is a call"),
        "{c}"
    );
}

/// Several processes are one list by default (perf's `--sort comm,dso,sym`): processes
/// of one name merged, comm and pid columns, shares of the whole profile.
#[test]
fn processes_are_one_list_with_comm_and_pid() {
    let mut p = time_profile();
    let main = p.processes[0].clone();
    let mut twin = main.clone();
    twin.pid = 9003;
    let mut other = main.clone();
    (other.pid, other.comm) = (9004, "other".into());
    p.processes = vec![main.clone(), twin, other];
    let out = render(&p, &opts(50, None)).unwrap();
    assert_eq!(
        out.matches("top functions").count(),
        1,
        "one table, not one per process:\n{out}"
    );
    let hot = &main.functions[0].name;
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(hot.as_str())).collect();
    assert_eq!(rows.len(), 2, "{hot} once per comm:\n{out}");
    assert!(
        rows[0].contains(&main.comm) && rows[0].contains("2 pids"),
        "{out}"
    );
    assert!(
        rows[1].contains("other") && rows[1].contains("9004"),
        "{out}"
    );
    // The two processes of one name hold 2/3 of the time: the shares add up to 100 %.
    // (The share is the last percentage; its sampling error follows it.)
    let share = |row: &str| -> f64 {
        row.split_whitespace()
            .rfind(|s| s.ends_with('%'))
            .and_then(|s| s.trim_end_matches('%').parse().ok())
            .unwrap()
    };
    let one = main.functions[0].share * 100.0;
    assert!((share(rows[0]) - one * 2.0 / 3.0).abs() < 0.06, "{out}");
    assert!((share(rows[1]) - one / 3.0).abs() < 0.06, "{out}");
}

/// A 300-character C++ name in an 80-column table: every line fits, the name is cut
/// with an ellipsis, and the JSON keeps it whole.
#[test]
fn long_names_fit_the_width_with_an_ellipsis() {
    let long = format!(
        "_ZN{}std6vectorIiSaIiEE9push_backERKi",
        "very_long_namespace_component".repeat(10)
    );
    assert!(long.len() >= 300);
    for mut p in [cpi_profile(), time_profile()] {
        p.processes[0].functions[0].name = long.clone();
        p.command = vec!["./prog".into(), long.clone()];
        let name = long.clone();
        for o in [
            opts(20, None),
            opts(20, Some(name.as_str())),
            TableOptions {
                verbose: true,
                ..opts(20, None)
            },
        ] {
            let out = render(
                &p,
                &TableOptions {
                    width: Some(80),
                    ..o
                },
            )
            .unwrap();
            for l in out.lines() {
                assert!(
                    l.chars().count() <= 80,
                    "{} wide: {l}\n{out}",
                    l.chars().count()
                );
            }
            assert!(out.contains("_ZNvery_l") && out.contains('…'), "{out}");
        }
        let json = cpi_user::report::file::to_json(&p).unwrap();
        assert!(json.contains(&long), "the JSON keeps the whole name");
    }
}

/// `--sort` by a column other than the share, and the legend for the CPI notation.
#[test]
fn sort_by_any_column_and_a_legend() {
    let p = cpi_profile();
    let by = |sort| {
        render(
            &p,
            &TableOptions {
                sort,
                ..opts(20, None)
            },
        )
        .unwrap()
    };
    let names = by(SortKey::Function);
    assert!(names.contains("sorted by function"), "{names}");
    let mut fns: Vec<&str> = p.processes[0]
        .functions
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    fns.sort();
    let at: Vec<usize> = fns.iter().map(|f| names.find(f).unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "A to Z:\n{names}");
    assert!(names.contains("±: one standard error"), "{names}");
    assert!(names.contains("below floor: too few samples"), "{names}");
}

/// The legend explains the notation the tables wrote, not text that looks like it: a
/// function whose name holds `±`, "below floor" and `≠` adds nothing to it.
#[test]
fn the_legend_is_what_the_tables_wrote_not_what_names_say() {
    let mut p = time_profile();
    let plain = render(&p, &opts(20, None)).unwrap();
    p.processes[0].functions[0].name = "decoy ± below floor ≠ timed CPI".into();
    let out = render(&p, &opts(20, None)).unwrap();
    assert!(out.contains("decoy ± below floor"), "{out}");
    let legend = |t: &str| t.lines().last().unwrap_or_default().to_string();
    assert_eq!(legend(&out), legend(&plain), "{out}");
    for words in ["below floor: too few", "timed CPI: from", "≠: the two"] {
        assert!(!out.contains(words), "{words}:\n{out}");
    }
}

/// `--group-by pod`: the processes of one pod are one row group named `namespace/pod`;
/// a process in no pod is `[no pod]`; the functions' samples add up.
#[test]
fn group_by_pod_merges_a_pods_processes() {
    let mut p = time_profile();
    let one = p.processes[0].clone();
    let in_pod = |pid: u32| {
        let mut pr = one.clone();
        pr.pid = pid;
        pr.identity.pod_uid = Some("74c13223-5a00-11e9-b385-42010a80018d".into());
        pr.identity.pod = Some("web-1".into());
        pr.identity.namespace = Some("shop".into());
        pr
    };
    p.processes = vec![in_pod(10), in_pod(11), one.clone()];
    let by = |g| {
        render(
            &p,
            &TableOptions {
                group_by: g,
                ..TableOptions::default()
            },
        )
        .unwrap()
    };
    let pods = by(GroupBy::Pod);
    assert!(pods.contains("shop/web-1"), "{pods}");
    assert!(pods.contains("[no pod]"), "{pods}");
    // Two processes of the pod, one group: twice the one process's samples.
    let hot = &one.functions[0];
    let doubled = (hot.samples * 2).to_string();
    let row = pods
        .lines()
        .find(|l| l.contains("shop/web-1") && l.contains(&hot.name))
        .unwrap_or_else(|| panic!("no shop/web-1 row for {}:\n{pods}", hot.name));
    assert!(
        row.replace(',', "").contains(&doubled) && row.contains("2 pids"),
        "{row}"
    );
    // The default is per process: the comm as before.
    assert!(by(GroupBy::Process).contains(&one.comm));
    // With --per-process, a table per group: the pod's two processes are one table
    // with their samples summed, the process in no pod another.
    let tables = render(
        &p,
        &TableOptions {
            group_by: GroupBy::Pod,
            per_process: true,
            ..TableOptions::default()
        },
    )
    .unwrap();
    let heads: Vec<String> = tables
        .lines()
        .filter(|l| l.contains(" samples") && (l.starts_with("shop/") || l.starts_with("pid ")))
        .map(|l| l.replace(',', ""))
        .collect();
    assert_eq!(heads.len(), 2, "{tables}");
    let pod_head = format!("shop/web-1 (2 pids): {} samples", one.samples * 2);
    let other_head = format!("pid {} ([no pod]): {} samples", one.pid, one.samples);
    assert!(heads[0].starts_with(&pod_head), "{pod_head:?} in\n{tables}");
    assert!(
        heads[1].starts_with(&other_head),
        "{other_head:?} in\n{tables}"
    );
    let row = tables
        .lines()
        .skip_while(|l| !l.starts_with("shop/web-1"))
        .find(|l| l.contains(&hot.name))
        .unwrap_or_else(|| panic!("no {} row in the pod's table:\n{tables}", hot.name));
    assert!(row.replace(',', "").contains(&doubled), "{row}");
}
