//! The HTML page of each real recording (tests/data/README.md) in Debian's Chromium,
//! checked against perf 6.1 and against the terminal's own numbers: the page names the
//! recording's events with the samples `perf script` gives each, its duration is the
//! samples' span, its functions table holds the functions the profile (and so the
//! terminal) holds, its flame graph draws them, and no frame carries a CPI or a colour
//! that its function's row does not have.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::browser::{elements, visit};
use cpi_tests::{cpi_bpf, output_ok, temp_dir, workspace_root};
use cpi_user::profile::model::Profile;

use crate::import_real::{perf_events, with_128_byte_attrs};

fn data(name: &str) -> PathBuf {
    workspace_root().join("tests/data/autofdo").join(name)
}

/// The text of each cell of each row of the `<table>` that follows `marker` in
/// `dom`: the header row's `<th>` names first.
fn table_after(dom: &str, marker: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let start = dom.find(marker).unwrap_or_else(|| panic!("no {marker}"));
    let end = dom[start..].find("</table>").unwrap() + start;
    let table = &dom[start..end];
    let tags = regex::Regex::new(r"<[^>]*>").unwrap();
    let text = |s: &str| {
        tags.replace_all(s, "")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .trim()
            .to_string()
    };
    let th = regex::Regex::new(r"(?s)<th[^>]*>(.*?)</th>").unwrap();
    let td = regex::Regex::new(r"(?s)<td[^>]*>(.*?)</td>").unwrap();
    let head = th.captures_iter(table).map(|c| text(&c[1])).collect();
    let rows = table
        .split("<tr")
        .map(|r| td.captures_iter(r).map(|c| text(&c[1])).collect::<Vec<_>>())
        .filter(|r| !r.is_empty())
        .collect();
    (head, rows)
}

/// A recording, the path perf 6.1 reads it at, and the recorded binary's name and file.
struct Recording {
    file: PathBuf,
    perf_input: PathBuf,
    binary: (&'static str, PathBuf),
}

/// The page of `r` and its profile, made with the same arguments.
fn page_and_profile(r: &Recording, dir: &Path) -> (PathBuf, Profile) {
    let given = format!("{}={}", r.binary.0, r.binary.1.display());
    let page = dir.join(format!(
        "{}.html",
        r.file.file_name().unwrap().to_string_lossy()
    ));
    let import = |extra: &[&str]| {
        output_ok(
            Command::new(cpi_bpf())
                .args(["import-perf", "--binary", &given])
                .args(extra)
                .arg(&r.file),
        )
    };
    import(&["--format", "html", "-o", page.to_str().unwrap()]);
    let json = import(&["--format", "json"]);
    (page, Profile::from_json(&json.stdout).unwrap())
}

/// Every real recording's page says what `perf` and the profile say: its events (perf
/// evlist's names, perf script's samples each, the samples' span), a functions table
/// and flame graph of the functions the terminal shows (the Westmere recording, whose
/// only event is taken branches, had an empty graph and table and "no hardware
/// counters"), and a CPI or colour on a frame only where its function has a CPI (the
/// Haswell recording's stacks sampled on cycles give relative counts: frames were
/// coloured CPI 0.16 and 0.059 where the table said "too few samples").
#[test]
fn recording_pages_show_perfs_events_and_the_terminals_functions() {
    let dir = temp_dir("real-html");
    let haswell = data("hierarchical_discriminator_test.x86_64.perf.data");
    let haswell_128 = dir.join("attrs128.data");
    with_128_byte_attrs(&haswell, &haswell_128);
    let recordings = [
        Recording {
            file: data("propeller_sample_1.perfdata1"),
            perf_input: data("propeller_sample_1.perfdata1"),
            binary: (
                crate::import_real::SKYLAKE_BIN,
                data("propeller_sample_1.bin"),
            ),
        },
        Recording {
            file: haswell,
            perf_input: haswell_128,
            binary: (
                "/local/home/kvivekananda/hierarchical_discriminator_test",
                data("hierarchical_discriminator_test.x86_64"),
            ),
        },
        Recording {
            file: data("test.lbr"),
            perf_input: data("test.lbr"),
            binary: ("/export/hda3/tmp/test.binary", data("test.binary")),
        },
    ];
    for r in &recordings {
        let (page, p) = page_and_profile(r, &dir);
        let Some(v) = visit(&page, None) else {
            return;
        };
        assert!(v.requests.is_empty(), "requests: {:?}", v.requests);
        let what = r.file.display();
        assert_events(&v.dom, &r.perf_input, &what.to_string());
        assert_functions(&v.dom, &p, &what.to_string());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The page's events and duration are perf's.
fn assert_events(dom: &str, perf_input: &Path, what: &str) {
    let (names, counts, (first, last)) = perf_events(perf_input);
    let (head, rows) = table_after(dom, r#"<table class="facts events">"#);
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    let (event, records) = (col("event"), col("records"));
    assert!(!rows.is_empty(), "{what}: no events on the page");
    let mut listed = BTreeSet::new();
    for row in &rows {
        let of: Vec<&String> = names
            .iter()
            .filter(|n| row[event] == **n || row[event].starts_with(&format!("{n} (")))
            .collect();
        assert_eq!(
            of.len(),
            1,
            "{what}: {} vs perf evlist {names:?}",
            row[event]
        );
        assert!(listed.insert(of[0].clone()), "{what}: {} twice", of[0]);
        assert_eq!(
            row[records],
            counts[of[0]].to_string(),
            "{what}: {} records, perf script's",
            of[0]
        );
    }
    let (_, facts) = table_after(dom, r#"<table class="facts">"#);
    let duration = format!("{:.2} s", last - first);
    assert!(
        dom.contains(&format!("<th>duration</th><td>{duration}</td>")),
        "{what}: not {duration}: {facts:?}"
    );
    // These recordings were made with hardware counters, which the page names.
    assert!(!dom.contains("no hardware counters"), "{what}");
    if dom.contains("Frames are not coloured") {
        let legend = &dom[dom.find("Frames are not coloured").unwrap()..];
        let legend = &legend[..legend.find("</p>").unwrap()];
        assert!(
            listed.iter().any(|n| legend.contains(n.as_str())) || legend.contains("relative"),
            "{what}: the legend says neither the events nor why: {legend}"
        );
    }
}

/// The page's functions table holds the profile's functions, its flame graph draws
/// them, and a frame's CPI and colour are only where its function's row has a CPI.
fn assert_functions(dom: &str, p: &Profile, what: &str) {
    let (head, rows) = table_after(dom, r#"<section id="functions">"#);
    let col = |name: &str| head.iter().position(|h| h == name);
    let (name, cpi) = (col("function").unwrap(), col("CPI"));
    let table: BTreeMap<&str, &str> = rows
        .iter()
        .map(|r| (r[name].as_str(), cpi.map_or("", |c| r[c].as_str())))
        .collect();
    let shown: BTreeSet<&str> = p
        .processes
        .iter()
        .flat_map(|pr| &pr.functions)
        .filter(|f| {
            let m = &f.measures;
            f.samples > 0
                || [m.cycles, m.instructions, m.time_ns]
                    .iter()
                    .any(|v| v.is_some_and(|v| v > 0.0))
        })
        .map(|f| f.name.as_str())
        .collect();
    assert!(!shown.is_empty(), "{what}: no functions in the profile");
    assert_eq!(
        table.keys().copied().collect::<BTreeSet<_>>(),
        shown,
        "{what}: the page's functions, the profile's"
    );
    let start = dom.find(r#"class="graph main""#).expect("a flame graph");
    let end = dom[start..].find("</svg>").unwrap() + start;
    let frames = elements(&dom[start..end], "g", "f");
    // Each frame's fill, in frame order (its `<rect>`).
    let fill = regex::Regex::new(r#"(?s)<g class="f"[^>]*>.*?<rect [^>]*fill="([^"]*)""#).unwrap();
    let fills: Vec<String> = fill
        .captures_iter(&dom[start..end])
        .map(|c| c[1].to_string())
        .collect();
    assert_eq!(fills.len(), frames.len(), "{what}: one rect per frame");
    let drawn: BTreeSet<&str> = frames
        .iter()
        .filter(|f| f["data-depth"] == "2")
        .map(|f| f["data-name"].as_str())
        .collect();
    let hottest = p.processes[0].functions.first().map(|f| f.name.as_str());
    assert!(
        hottest.is_some_and(|h| drawn.contains(h)),
        "{what}: the flame graph does not draw {hottest:?}: {drawn:?}"
    );
    // Recorded without -g: each frame over a process is one function, the unit its
    // row describes.
    assert!(
        p.processes.iter().all(|pr| pr.stacks.is_empty()),
        "{what}: call stacks in a recording made without them"
    );
    for (f, fill) in frames.iter().zip(&fills) {
        let Some(&row_cpi) = table.get(f["data-name"].as_str()) else {
            continue;
        };
        let has_cpi = row_cpi
            .split(' ')
            .next()
            .is_some_and(|v| v.parse::<f64>().is_ok());
        assert!(
            has_cpi || !f.contains_key("data-cpi"),
            "{what}: frame {} has CPI {} where its row says {row_cpi:?}",
            f["data-name"],
            f["data-cpi"]
        );
        assert!(
            has_cpi || !fill.starts_with("hsl("),
            "{what}: frame {} coloured {fill} where its row says {row_cpi:?}",
            f["data-name"]
        );
    }
    if p.cpi_withheld.is_some() {
        assert!(
            frames.iter().all(|f| !f.contains_key("data-cpi")),
            "{what}: a frame has a CPI the profile withholds"
        );
        assert!(
            !dom[start..end].contains("fill=\"hsl("),
            "{what}: CPI colours"
        );
    }
}

/// Cells of a terminal table's line: its columns are two or more spaces apart.
fn terminal_cells(line: &str) -> Vec<String> {
    let gap = regex::Regex::new(r"\s{2,}").unwrap();
    gap.split(line.trim()).map(str::to_string).collect()
}

/// The Skylake recording's LBR entries carry cycle counts (timed LBR): the page shows
/// the timed CPI the terminal shows, the same text for each function in its functions
/// table and in the function's code section, and each hot block's timed CPI as the
/// profile holds it, `≠` where the two estimates disagree (two blocks of `main` here).
/// It is the one recording here with timed entries (the Haswell and Westmere ones
/// carry no cycles in their LBR entries, as the terminal says of the first).
#[test]
fn timed_cpi_on_the_page_is_the_terminals() {
    let dir = temp_dir("real-html-timed");
    let r = Recording {
        file: data("propeller_sample_1.perfdata1"),
        perf_input: data("propeller_sample_1.perfdata1"),
        binary: (
            crate::import_real::SKYLAKE_BIN,
            data("propeller_sample_1.bin"),
        ),
    };
    let (page, p) = page_and_profile(&r, &dir);
    let given = format!("{}={}", r.binary.0, r.binary.1.display());
    let terminal = output_ok(
        Command::new(cpi_bpf())
            .args(["import-perf", "--binary", &given])
            .arg(&r.file),
    );
    let terminal = String::from_utf8(terminal.stdout).unwrap();
    let head = terminal
        .lines()
        .find(|l| l.contains("timed CPI"))
        .unwrap_or_else(|| panic!("no timed CPI in the terminal's table: {terminal}"));
    let timed_col = terminal_cells(head)
        .iter()
        .position(|c| c == "timed CPI")
        .unwrap();
    let Some(v) = visit(&page, None) else {
        return;
    };
    let (head, rows) = table_after(&v.dom, r#"<section id="functions">"#);
    let col = |name: &str| head.iter().position(|h| h == name);
    let timed = col("timed CPI").expect("a timed CPI column in the page's functions table");
    let mut compared = 0;
    for row in &rows {
        let name = &row[col("function").unwrap()];
        let line = terminal
            .lines()
            .find(|l| terminal_cells(l).first() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in the terminal's table: {terminal}"));
        assert_eq!(
            row[timed],
            terminal_cells(line)[timed_col],
            "{name}: the page's timed CPI, the terminal's"
        );
        if row[timed] != "-" {
            // The code section's headline says the same.
            let at = v
                .dom
                .find(&format!(r#"data-function="{name}""#))
                .unwrap_or_else(|| panic!("no code section for {name}"));
            let section = &v.dom[at..at + v.dom[at..].find("</article>").unwrap()];
            assert!(
                section.contains(&format!("timed CPI {}", row[timed])),
                "{name}: {section}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 2, "{compared} functions with a timed CPI");

    let (head, rows) = table_after(&v.dom, r#"<section id="blocks">"#);
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    let (range, timed) = (col("address range"), col("timed CPI"));
    let blocks: Vec<_> = p
        .processes
        .iter()
        .flat_map(|pr| &pr.functions)
        .flat_map(|f| &f.blocks)
        .collect();
    let (mut with_timed, mut differ) = (0, 0);
    for row in &rows {
        let b = blocks
            .iter()
            .find(|b| format!("{:x}-{:x}", b.start, b.end) == row[range])
            .unwrap_or_else(|| panic!("block {} not in the profile", row[range]));
        let want = b.timed_cpi.map_or(String::new(), |e| {
            let mark = if b.cpi_disagree { " ≠" } else { "" };
            format!("{:.2} ±{:.1}%{mark}", e.value, e.rel_error * 100.0)
        });
        assert_eq!(row[timed], want, "block {}", row[range]);
        with_timed += usize::from(!want.is_empty());
        differ += usize::from(b.cpi_disagree);
    }
    eprintln!("{compared} functions and {with_timed} hot blocks with a timed CPI, {differ} ≠");
    assert!(
        with_timed >= 2 && differ >= 1,
        "{with_timed} timed, {differ} ≠"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
