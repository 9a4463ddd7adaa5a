//! Call paths a person reads at 80 columns: every table `cpi-bpf`
//! prints of a simulated profile of sim_mix (fib's recursion; qsort's merge sort in
//! Debian's libc calling back into `cmp`) fits `COLUMNS=80`; the call tree is indented
//! with recursion folded; `--callers` errs on an unknown name with a suggestion; a time
//! profile's shares carry their sampling error; C++ functions are found by short name.

use std::path::Path;
use std::process::Command;

use crate::report_fixture::{cpi_profile, time_profile};
use cpi_tests::tracer::{program, tool_dir};
use cpi_tests::{cpi_bpf, output_ok, temp_dir};
use cpi_user::report::table::{render, TableError, TableOptions};

/// `cpi-bpf ARGS` at `COLUMNS=80`: its standard output, after checking that no line of
/// it is wider than 80 characters.
fn at_80(args: &[&str], json: &Path) -> String {
    let out = output_ok(
        Command::new(cpi_bpf())
            .args(args)
            .arg(json)
            .env("COLUMNS", "80"),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_80(&format!("{args:?}"), &text);
    text
}

/// `cpi-bpf ARGS JSON` in a detached tmux pane of 80 columns, without `COLUMNS`: the
/// width comes from the terminal, as a user's would. The pane's text, wrapped lines
/// joined (a line too wide reads as one long line).
fn in_tmux_pane(args: &[&str], json: &Path) -> String {
    let session = format!("cpi-tree-{}", std::process::id());
    let done = format!("{session}-done");
    let mut cmd = vec![cpi_bpf().display().to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    cmd.push(json.display().to_string());
    let quoted: Vec<String> = cmd.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "env -u COLUMNS {}; tmux wait-for -S {done}; sleep 600",
        quoted.join(" ")
    );
    let tmux = |a: &[&str]| output_ok(Command::new("tmux").args(a));
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "80",
        "-y",
        "50",
        &script,
    ]);
    tmux(&["wait-for", &done]);
    let out = tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", &session]);
    tmux(&["kill-session", "-t", &session]);
    String::from_utf8(out.stdout).unwrap()
}

fn assert_80(what: &str, text: &str) {
    let wide: Vec<&str> = text.lines().filter(|l| l.chars().count() > 80).collect();
    assert!(
        wide.is_empty(),
        "{what}: lines over 80:\n{}\n\n{text}",
        wide.join("\n")
    );
}

/// The call tree section of a table: its rows under the header rule.
fn tree_rows(table: &str) -> Vec<&str> {
    let start = table.find("call tree").expect("a call tree section");
    table[start..]
        .lines()
        .skip_while(|l| !l.starts_with('═'))
        .skip(1)
        .take_while(|l| !l.starts_with('─'))
        .collect()
}

fn indent(row: &str) -> usize {
    row.chars().take_while(|c| *c == ' ').count()
}

#[test]
fn simulated_tables_fit_80_columns_with_a_folded_call_tree() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let dir = temp_dir("report-tree");
    let exe = program("sim_mix").unwrap();
    let json = |seed: &str| {
        let p = dir.join(format!("p{seed}.json"));
        output_ok(
            Command::new(cpi_bpf())
                .args(["simulate", "--seed", seed, "--format", "json", "--output"])
                .arg(&p)
                .arg("--")
                .arg(&exe)
                .arg("1"),
        );
        p
    };
    let (a, b) = (json("1"), json("2"));
    let table = at_80(&["report"], &a);
    for view in [
        &["report", "--per-process"][..],
        &["report", "--callers", "cmp"],
        &["report", "--callgraph"],
        &["report", "--annotate", "cmp", "--callgraph"],
        &["diff", b.to_str().unwrap()],
    ] {
        at_80(view, &a);
    }

    // A real 80-column terminal gives the same table as COLUMNS=80.
    let pane = in_tmux_pane(&["report"], &a);
    assert_80("report in an 80-column tmux pane", &pane);
    let trimmed = |rows: Vec<&str>| -> Vec<String> {
        rows.iter().map(|r| r.trim_end().to_string()).collect()
    };
    assert_eq!(
        trimmed(tree_rows(&pane)),
        trimmed(tree_rows(&table)),
        "the pane's call tree:\n{pane}"
    );

    // The tree: indented by depth, each recursion one row marked ↻.
    let rows = tree_rows(&table);
    let row = |name: &str| -> &str {
        let hits: Vec<&&str> = rows.iter().filter(|r| r.contains(name)).collect();
        assert_eq!(hits.len(), 1, "{name} once in the tree:\n{table}");
        hits[0]
    };
    let (qsort, msort, cmp) = (row("qsort"), row("msort_with_tmp"), row(" cmp "));
    assert!(
        msort.contains('↻'),
        "merge sort's recursion folded: {msort}"
    );
    assert!(row(" fib ").contains('↻'), "{table}");
    assert!(
        indent(qsort) < indent(msort) && indent(msort) < indent(cmp),
        "callees indented under callers:\n{table}"
    );
    assert!(!cmp.contains('↻'), "{cmp}");
    assert!(
        table.contains("branches under 0.5% not shown"),
        "the threshold is said:\n{table}"
    );

    // An unknown name errs with the nearest names, as --annotate does.
    let out = Command::new(cpi_bpf())
        .arg("report")
        .arg(&a)
        .args(["--callers", "cmq"])
        .env("COLUMNS", "80")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no function named \"cmq\"") && err.contains("cmp"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The golden profiles' tables at 80 columns, and a time profile's shares with their
/// sampling error (binomial over the samples behind the table).
#[test]
fn fixture_tables_fit_80_columns_and_time_shares_carry_errors() {
    let opts = |annotate: Option<&str>| TableOptions {
        width: Some(80),
        annotate: annotate.map(str::to_string),
        ..TableOptions::default()
    };
    for (p, hot) in [
        (cpi_profile(), "crc_update"),
        (time_profile(), "lzma_mf_bt4_find"),
    ] {
        assert_80("top", &render(&p, &opts(None)).unwrap());
        assert_80("annotate", &render(&p, &opts(Some(hot))).unwrap());
    }
    let t = render(&time_profile(), &opts(None)).unwrap();
    // lzma_mf_bt4_find: 1,900 of the fixture's samples.
    let row = t
        .lines()
        .find(|l| l.contains("lzma_mf_bt4_find"))
        .expect("the hot function's row");
    let total: u64 = time_profile().processes[0]
        .functions
        .iter()
        .map(|f| f.samples)
        .sum();
    let p = 1900.0 / total as f64;
    let se = (p * (1.0 - p) / total as f64).sqrt();
    let want = format!("±{:.1}", se * 100.0);
    assert!(row.contains(&want), "{want} in {row}\n{t}");
}

/// A C++ function is shown and found by its short name; a short name of two functions
/// is refused with both full names, and the tables keep the two apart by their
/// argument lists.
#[test]
fn cpp_functions_are_found_by_short_name() {
    let mut p = cpi_profile();
    let fns = &mut p.processes[0].functions;
    fns[0].name = "void fill<int>(std::vector<int, std::allocator<int> >&, int)".into();
    fns[1].name = "void fill<double>(std::vector<double, std::allocator<double> >&)".into();
    let with = |annotate: &str| TableOptions {
        annotate: Some(annotate.into()),
        ..TableOptions::default()
    };
    // On a terminal: the short names, distinct as long as the functions are.
    let wide = TableOptions {
        width: Some(120),
        ..TableOptions::default()
    };
    let top = render(&p, &wide).unwrap();
    assert!(top.contains("fill<…>(std::vector<…>&, int)"), "{top}");
    assert!(top.contains("fill<…>(std::vector<…>&)"), "{top}");
    assert!(!top.contains("allocator"), "{top}");
    let e = render(&p, &with("fill<…>")).unwrap_err();
    let TableError::Ambiguous { candidates, .. } = &e else {
        panic!("not refused as ambiguous: {e}");
    };
    assert_eq!(candidates.len(), 2, "{e}");
    assert!(candidates[0].starts_with("void fill<double>"), "{e}");
    let full = p.processes[0].functions[0].name.clone();
    let ann = render(&p, &with(&full)).unwrap();
    assert!(ann.contains("bytes,"), "the full name still works:\n{ann}");
    p.processes[0].functions[1].name = "crc_fold".into();
    let ann = render(&p, &with("fill<...>")).unwrap();
    assert!(ann.contains(&full), "{ann}");
    // Alone, the function is `fill<…>(…)` on a terminal.
    let top = render(&p, &wide).unwrap();
    assert!(top.contains("fill<…>(…)"), "{top}");
}

/// The rows of the first table under `title`: the lines between its header rule and
/// its closing rule.
fn table_rows<'t>(text: &'t str, title: &str) -> Vec<&'t str> {
    let start = text
        .find(title)
        .unwrap_or_else(|| panic!("no {title}:\n{text}"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('═'))
        .skip(1)
        .take_while(|l| !l.starts_with('─'))
        .collect()
}

/// `--callers` of the hottest memcmp of Debian's libc under Debian's sqlite3 (an index
/// insert and an index seek reach it through one comparator, apart only higher up) at
/// 80 columns, as COLUMNS=80 and as a tmux pane: every row reads differently, keeps
/// the leaf end, and the profile's accuracy section stays out of the view.
#[test]
fn sqlite_callers_of_memcmp_read_apart_at_80_columns() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    if !Path::new("/usr/bin/sqlite3").exists() {
        cpi_tests::skip("no /usr/bin/sqlite3 (apt install sqlite3)");
        return;
    }
    let dir = temp_dir("report-tree-sqlite");
    let json = dir.join("sqlite3.json");
    let sql = "CREATE TABLE t(a INTEGER, b TEXT); CREATE INDEX tb ON t(b); \
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 4000) \
        INSERT INTO t SELECT x, printf('row %d', (x * 7919) % 3001) FROM c; \
        SELECT count(*) FROM t x JOIN t y ON x.b = y.b WHERE x.a < 400; \
        UPDATE t SET a = a + 1 WHERE b > 'row 5'; DELETE FROM t WHERE b < 'row 2';";
    output_ok(
        Command::new(cpi_bpf())
            .args([
                "simulate", "--quiet", "--seed", "1", "--format", "json", "-o",
            ])
            .arg(&json)
            .args(["--", "/usr/bin/sqlite3", ":memory:", sql]),
    );
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let functions = profile["processes"][0]["functions"].as_array().unwrap();
    let memcmp = functions
        .iter()
        .filter(|f| f["binary"].as_str().unwrap().contains("libc.so"))
        .filter(|f| f["name"].as_str().unwrap().contains("memcmp"))
        .max_by(|a, b| {
            let cycles = |f: &serde_json::Value| f["cycles"].as_f64().unwrap_or(0.0);
            cycles(a).total_cmp(&cycles(b))
        })
        .expect("sqlite3's key compares call libc's memcmp");
    let name = memcmp["name"].as_str().unwrap();
    let title = format!("paths into {name}");
    for text in [
        at_80(&["report", "--callers", name], &json),
        in_tmux_pane(&["report", "--callers", name], &json),
    ] {
        assert_80("--callers", &text);
        let paths: Vec<&str> = table_rows(&text, &title)
            .iter()
            .map(|r| r.trim().split("  ").next().unwrap())
            .collect();
        assert!(paths.len() >= 2, "{text}");
        let distinct: std::collections::BTreeSet<&&str> = paths.iter().collect();
        assert_eq!(distinct.len(), paths.len(), "rows that read alike:\n{text}");
        for p in &paths {
            let leaf = p.rsplit(" → ").next().unwrap();
            let kept = leaf.trim_end_matches('…');
            assert!(
                kept.chars().count() >= 7 && name.starts_with(kept),
                "{p}\n{text}"
            );
        }
        assert!(!text.contains("accuracy against"), "{text}");
        if paths.iter().any(|p| p.contains('…')) {
            let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(words.contains("… in a path: frames"), "{text}");
        }
    }
}
