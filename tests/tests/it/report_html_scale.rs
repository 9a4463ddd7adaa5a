//! A page that scales, in Debian's Chromium: a profile of 10 000 functions, one with a
//! 400-character C++ name, and one program run as three processes. The page holds no
//! cell wider than the window (the name shortened as the terminal shortens it, whole in
//! its tooltip), pages its long tables instead of drawing 5 000 rows, and lists the
//! three processes as the terminal does: one row, `3 pids`, with their summed share.

use std::process::Command;

use cpi_tests::browser::{screenshot_path, visit};
use cpi_tests::{cpi_bpf, output_ok, temp_dir, workspace_root};
use serde_json::{json, Value};

/// A demangled libstdc++ name of 400-odd characters.
fn long_cpp_name() -> String {
    let s = "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >";
    let it = format!("__gnu_cxx::__normal_iterator<char const*, {s}>");
    format!(
        "void std::__detail::_Executor<{it}, std::allocator<std::__cxx11::sub_match<{it}> >, \
         std::__cxx11::regex_traits<char>, true>::_M_dfs(std::__detail::_Executor<{it}, \
         std::allocator<std::__cxx11::sub_match<{it}> > >::_Match_mode, long)"
    )
}

/// The golden CPI profile grown: process `compile` three times (pids 101-103), its hot
/// function renamed to [`long_cpp_name`], and a process `big` of 10 000 functions.
fn big_profile() -> Value {
    let golden = std::fs::read(workspace_root().join("tests/golden/cpi_profile.json")).unwrap();
    let mut p: Value = serde_json::from_slice(&golden).unwrap();
    let mut compile = p["processes"][0].clone();
    compile["comm"] = "compile".into();
    compile["functions"][0]["name"] = long_cpp_name().into();
    let template = compile["functions"][1].clone();
    let mut processes: Vec<Value> = (101..104)
        .map(|pid| {
            let mut c = compile.clone();
            c["pid"] = pid.into();
            c
        })
        .collect();
    let functions: Vec<Value> = (0..10_000u64)
        .map(|i| {
            let mut f = template.clone();
            f["name"] = format!("fn_{i:05}").into();
            f["address"] = (0x100000 + 64 * i).into();
            f["samples"] = (1000 + i).into();
            f["cycles"] = json!(1.0e6 + i as f64);
            f["instructions"] = json!(5.0e5);
            f["blocks"] = json!([]);
            f["lines"] = json!([]);
            f["edges"] = json!([]);
            f
        })
        .collect();
    let mut big = compile.clone();
    big["comm"] = "big".into();
    big["pid"] = 7.into();
    big["samples"] = functions.len().into();
    big["cycles"] = json!(functions.len() as f64 * 1.005e6);
    big["functions"] = functions.into();
    processes.push(big);
    p["processes"] = processes.into();
    p
}

/// Measures Chromium's layout into the DOM (`data-` attributes of `<body>`), run last.
const MEASURE: &str = r##"<script>
const cells = [...document.querySelectorAll("td, th")].map(c => c.getBoundingClientRect().width);
const b = document.body.dataset;
b.widest = Math.max(...cells);
b.scrollWidth = document.documentElement.scrollWidth;
b.scrollHeight = document.documentElement.scrollHeight;
b.nameColumn = document.querySelector("#functions td.name").getBoundingClientRect().width;
b.rowsShown = [...document.querySelectorAll("#functions tbody tr")].filter(r => !r.hidden).length;
</script></body>"##;

fn body_number(dom: &str, key: &str) -> f64 {
    let re = regex::Regex::new(&format!(r#"<body[^>]* data-{key}="([0-9.e+-]+)""#)).unwrap();
    re.captures(dom)
        .unwrap_or_else(|| panic!("no data-{key} on <body>"))[1]
        .parse()
        .unwrap()
}

#[test]
fn a_page_of_10000_functions_fits_the_window() {
    let dir = temp_dir("report-html-scale");
    let (json, page) = (dir.join("big.json"), dir.join("big.html"));
    std::fs::write(&json, serde_json::to_vec(&big_profile()).unwrap()).unwrap();
    output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--quiet"])
            .arg(&json)
            .arg("-o")
            .arg(&page),
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let measured = dir.join("measured.html");
    std::fs::write(&measured, html.replacen("</body>", MEASURE, 1)).unwrap();
    let Some(v) = visit(&measured, Some(&screenshot_path("html-10000-functions"))) else {
        return;
    };
    let (widest, scroll_w) = (
        body_number(&v.dom, "widest"),
        body_number(&v.dom, "scroll-width"),
    );
    let (name_w, height) = (
        body_number(&v.dom, "name-column"),
        body_number(&v.dom, "scroll-height"),
    );
    let shown = body_number(&v.dom, "rows-shown");
    eprintln!(
        "widest cell {widest} px, page {scroll_w} px wide and {height} px tall, \
         name column {name_w} px, {shown} rows shown"
    );
    assert!(
        widest <= 1400.0 && scroll_w <= 1400.0,
        "{widest} {scroll_w}"
    );
    assert!(name_w <= 500.0, "function column {name_w} px");
    assert_eq!(shown, 100.0, "one page of the functions table");
    assert!(height < 20_000.0, "page {height} px tall");
    // The golden profile has no call stacks: each code section says so.
    assert!(
        v.dom
            .contains(r#"<p class="note no-stacks">No call stacks"#),
        "no word for a callers view without stacks"
    );

    // The C++ name: shortened in its cell as the terminal shortens it, whole in its
    // tooltip; the three `compile` processes one row of `3 pids`.
    let long = long_cpp_name();
    assert!(long.len() >= 400, "{}", long.len());
    let row = regex::Regex::new(concat!(
        r#"<tr[^>]*><td class="name"[^>]* title="([^"]*)"[^>]*><(?:a|span) [^>]*>([^<]*)</(?:a|span)></td>"#,
        r#"<td class="name"[^>]*>compile</td><td data-v="0">3 pids</td><td[^>]*>[^<]*</td>"#,
        r#"<td data-v="[0-9]+">[0-9]+</td><td data-v="([0-9.e-]+)">"#
    ))
    .unwrap();
    let c = row
        .captures(&v.dom)
        .unwrap_or_else(|| panic!("no merged compile row"));
    assert_eq!(unescape(&c[1]), long);
    assert_eq!(unescape(&c[2]), "std::__detail::_Executor<…>::_M_dfs(…)");
    // Its share: the three processes' cycles in it over every process's.
    let p = big_profile();
    let cycles = |v: &Value| v["cycles"].as_f64().unwrap();
    let procs = p["processes"].as_array().unwrap();
    let all: f64 = procs.iter().map(cycles).sum();
    let want = 3.0 * cycles(&procs[0]["functions"][0]) / all;
    let share: f64 = c[3].parse().unwrap();
    assert!((share - want).abs() <= 1e-9, "share {share}, want {want}");
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}
