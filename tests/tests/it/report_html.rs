//! `--format html` in Debian's Chromium: the flame graph's frames are as wide as their
//! cycles, a high-CPI and a low-CPI function carry their CPI and its colour on the
//! page's stated scale, the hot function's annotated code is there, and the page opens
//! no connection. Screenshots go to target/screenshots/ (README's pictures).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use cpi_tests::browser::{elements, screenshot_path, visit};
use cpi_tests::diff_pair;
use cpi_tests::tracer::tool_dir;
use cpi_tests::{compile_c, cpi_bpf, output_ok, temp_dir};
use serde_json::Value;

pub(crate) type Frame = HashMap<String, String>;

pub(crate) fn num(f: &Frame, key: &str) -> f64 {
    f.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("frame without {key}: {f:?}"))
}

/// `cpi-bpf report PROFILE -o PAGE`: the page of a saved profile.
fn page_of(profile: &Path, page: &Path) {
    output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--quiet"])
            .arg(profile)
            .arg("-o")
            .arg(page),
    );
}

/// The stated scale (README, report/html/colour.rs), written again here: t =
/// log₂(CPI)/2 in [−1, 1]; red hue 8 above CPI 1, blue hue 215 below; lightness 92 − 42|t|.
fn stated_colour(cpi: f64) -> String {
    let t = (cpi.log2() / 2.0).clamp(-1.0, 1.0);
    let light = 92.0 - 42.0 * t.abs();
    if t >= 0.0 {
        format!("hsl(8,80%,{light:.1}%)")
    } else {
        format!("hsl(215,70%,{light:.1}%)")
    }
}

/// The main flame graph's frames (the callers views follow it in the page).
pub(crate) fn main_frames(dom: &str) -> Vec<Frame> {
    let start = dom
        .find(r#"class="graph main""#)
        .expect("a main flame graph");
    let end = dom[start..].find("</svg>").unwrap() + start;
    elements(&dom[start..end], "g", "f")
}

/// Each frame as wide as its share of the root (±1 % of its width), and a frame's
/// numbers those of the JSON profile's stacks through it.
fn assert_widths(frames: &[Frame], measure: &str) {
    let root = frames
        .iter()
        .find(|f| f["data-depth"] == "0")
        .expect("a root frame");
    let total = num(root, measure);
    for f in frames {
        let share = num(f, measure) / total;
        // The rect's width as Chromium holds it in the DOM, in the 1200-unit viewBox.
        let rect_w = num(f, "rect-width") / 1200.0;
        assert!(
            (rect_w - share).abs() <= 0.01 * share + 1e-4,
            "{f:?}: {rect_w} vs {share}"
        );
        assert!(
            (num(f, "data-fw") - share).abs() <= 0.01 * share + 1e-9,
            "{f:?}"
        );
    }
}

/// Frames with each one's `<rect>` width folded in as `rect-width`.
fn frames_with_rects(dom: &str) -> Vec<Frame> {
    let start = dom.find(r#"class="graph main""#).unwrap();
    let end = dom[start..].find("</svg>").unwrap() + start;
    let rects = regex::Regex::new(r#"<rect [^>]*width="([0-9.]+)""#).unwrap();
    let widths: Vec<String> = rects
        .captures_iter(&dom[start..end])
        .map(|c| c[1].to_string())
        .collect();
    let mut frames = main_frames(dom);
    assert_eq!(frames.len(), widths.len(), "one rect per frame");
    for (f, w) in frames.iter_mut().zip(widths) {
        f.insert("rect-width".into(), w);
    }
    frames
}

/// Σ cycles and instructions of the frames named `prefix…`, against the JSON
/// function's; returns the frames' CPI and its relative error.
fn frames_cpi(frames: &[Frame], json: &Value, prefix: &str) -> (f64, f64) {
    let mine: Vec<&Frame> = frames
        .iter()
        .filter(|f| f["data-name"].starts_with(prefix))
        .collect();
    assert!(!mine.is_empty(), "no frame named {prefix}…");
    for f in &mine {
        assert!(f.contains_key("data-cpi"), "{prefix}: no CPI in {f:?}");
    }
    let cycles: f64 = mine.iter().map(|f| num(f, "data-cycles")).sum();
    // The frames' cycles are those of the profile's stacks through the function (the
    // file lists a stack's frames by number, README "Call paths").
    let name_of = |frame: &Value| {
        let f = &json["stack_frames"][frame.as_u64().unwrap() as usize];
        json["stack_functions"][f["function"].as_u64().unwrap() as usize]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let stacks: f64 = json["processes"][0]["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| name_of(f).starts_with(prefix))
        })
        .map(|s| s["cycles"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(
        (cycles - stacks).abs() <= 0.01 * stacks,
        "{prefix}: frames {cycles}, stacks {stacks}"
    );
    let instructions: f64 = mine.iter().map(|f| num(f, "data-instructions")).sum();
    let function = json["processes"][0]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"].as_str().unwrap().starts_with(prefix))
        .unwrap();
    let want = function["cpi"]["value"].as_f64().unwrap();
    let err = function["cpi"]["rel_error"].as_f64().unwrap();
    let got = cycles / instructions;
    // Frames hold the function's instructions once (it is a leaf on each path).
    assert!(
        (got - want).abs() <= 4.0 * err * want,
        "{prefix}: frames {got}, function {want} ±{err}"
    );
    (got, err)
}

#[test]
fn html_of_a_simulated_profile_in_chromium() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let dir = temp_dir("report-html");
    let Some(exe) = compile_c("sim_mix.c", &dir, "sim_mix", &[]) else {
        return;
    };
    let (json, page) = (dir.join("p.json"), dir.join("p.html"));
    output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--quiet", "-o"])
            .arg(&json)
            .arg("--")
            .arg(&exe)
            .arg("1"),
    );
    page_of(&json, &page);
    let profile: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let shot = screenshot_path("html-simulated");
    let Some(v) = visit(&page, Some(&shot)) else {
        return;
    };
    assert!(
        v.requests.is_empty(),
        "the page made requests: {:?}",
        v.requests
    );

    let frames = frames_with_rects(&v.dom);
    assert!(frames.len() > 10, "{} frames", frames.len());
    assert_widths(&frames, "data-cycles");
    let process = &profile["processes"][0];
    let proc_frame = frames.iter().find(|f| f["data-depth"] == "1").unwrap();
    assert_eq!(
        num(proc_frame, "data-cycles"),
        process["cycles"].as_f64().unwrap()
    );

    // cmp (a libc qsort callback, loads) against dispatch (a jump table): each frame's
    // CPI is its function's, cmp's the higher, and each frame's colour on the absolute
    // scale is the stated scale's for its CPI.
    let (high, high_err) = frames_cpi(&frames, &profile, "cmp");
    let (low, low_err) = frames_cpi(&frames, &profile, "dispatch");
    assert!(
        high - low > 3.0 * (high * high_err).hypot(low * low_err),
        "{high} vs {low}"
    );
    let fills = regex::Regex::new(
        r#"(?s)<g class="f" [^>]*data-cpi="([0-9.e-]+)"[^>]*data-abs-fill="([^"]+)""#,
    )
    .unwrap();
    let mut coloured = 0;
    for c in fills.captures_iter(&v.dom) {
        assert_eq!(&c[2], stated_colour(c[1].parse().unwrap()), "{}", &c[0]);
        coloured += 1;
    }
    assert!(
        coloured >= frames.len() / 2,
        "{coloured} of {} frames coloured",
        frames.len()
    );
    assert!(
        v.dom.contains("red = more cycles per instruction"),
        "the scale is stated"
    );

    // The hottest function's annotated code: instructions, blocks, the hottest marked.
    let hottest = process["functions"][0]["name"].as_str().unwrap();
    let at = v
        .dom
        .find(&format!(r#"data-function="{hottest}""#))
        .unwrap_or_else(|| panic!("no code section for {hottest}"));
    let section = &v.dom[at..at + v.dom[at..].find("</article>").unwrap()];
    assert!(section.contains(r#"class="graph callers""#), "callers view");
    assert!(
        section.contains(r#"<tr class="insn hot">"#),
        "hottest instruction marked"
    );
    assert!(section.contains(r#"<tr class="block">"#), "blocks outlined");
    // sim_mix.c's lines interleaved with their text, as the terminal's annotate gives
    // them (the test compiled it with -g from a file it can read).
    let source = regex::Regex::new(r#"<tr class="source"><td[^>]*>sim_mix\.c:[0-9]+  [^<\s]"#);
    assert!(
        source.unwrap().is_match(&v.dom),
        "no source text in the code"
    );

    assert_store_range_chart(&dir, &json, &profile);
}

/// `report --store DIR --format html`: the page charts each window's cycles per second
/// and CPI per comm. Two windows of the same profile, 1 s and 2 s long: the line's
/// values are the process's cycles over each window's length, its CPI the process's.
fn assert_store_range_chart(dir: &Path, json: &Path, profile: &Value) {
    use std::io::Write;
    let store = dir.join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    for window in ["w-1000-2000.json.gz", "w-3000-5000.json.gz"] {
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(store.join(window)).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(&std::fs::read(json).unwrap()).unwrap();
        gz.finish().unwrap();
    }
    let page = dir.join("range.html");
    output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--quiet", "--format", "html", "-o"])
            .arg(&page)
            .arg("--store")
            .arg(&store),
    );
    let v = visit(&page, None).unwrap();
    let line = |class: &str| {
        let at = v
            .dom
            .find(&format!(r#"class="series {class}""#))
            .unwrap_or_else(|| panic!("no {class} chart"));
        let values =
            regex::Regex::new(r#"<polyline data-comm="sim_mix" data-values="([^"]*)""#).unwrap();
        let c = values.captures(&v.dom[at..]).expect("a sim_mix line");
        c[1].split(',')
            .map(|x| x.parse::<f64>().unwrap())
            .collect::<Vec<f64>>()
    };
    let process = &profile["processes"][0];
    let cycles = process["cycles"].as_f64().unwrap();
    let cpi = process["cpi"]["value"].as_f64().unwrap();
    let (cpu, cpis) = (line("cpu"), line("cpi"));
    assert_eq!(cpu.len(), 2, "{cpu:?}");
    assert!(
        (cpu[0] - cycles).abs() <= 1e-5 * cycles,
        "{cpu:?} vs {cycles}"
    );
    assert!(
        (cpu[1] - cycles / 2.0).abs() <= 1e-5 * cycles,
        "{cpu:?} vs {cycles}/2"
    );
    for c in cpis {
        assert!((c - cpi).abs() <= 1e-5 * cpi, "{c} vs {cpi}");
    }
}

/// A time profile: frames as wide as their CPU time, one neutral colour and the page
/// saying why, no CPI anywhere.
#[test]
fn html_of_a_time_profile_says_why_it_has_no_colours() {
    if !cpi_tests::require_root("a live time profile") {
        return;
    }
    let Some(busy) = cpi_tests::busy("report-html-live", &[]) else {
        return;
    };
    let dir = temp_dir("report-html-live-out");
    let (json, page) = (dir.join("t.json"), dir.join("t.html"));
    output_ok(
        Command::new(cpi_bpf())
            .args(["-q", "-F", "999", "--format", "json", "-o"])
            .arg(&json)
            .arg("--")
            .arg(&busy)
            .arg("0.5"),
    );
    page_of(&json, &page);
    let Some(v) = visit(&page, Some(&screenshot_path("html-time-profile"))) else {
        return;
    };
    assert!(
        v.requests.is_empty(),
        "the page made requests: {:?}",
        v.requests
    );
    let frames = frames_with_rects(&v.dom);
    assert!(frames.len() >= 3, "{} frames", frames.len());
    assert_widths(&frames, "data-width");
    assert!(
        frames.iter().all(|f| !f.contains_key("data-cpi")),
        "no CPI in a time profile"
    );
    assert!(!v.dom.contains("fill=\"hsl("), "no CPI colours");
    assert!(
        v.dom.contains("Frames are not coloured"),
        "the page says why"
    );
}

/// The proxy sees what a page that does fetch asks for: a page's zero is a real zero.
#[test]
fn the_browser_check_sees_a_page_that_fetches() {
    let dir = temp_dir("report-html-control");
    let page = dir.join("fetches.html");
    std::fs::write(
        &page,
        r#"<html><body><img src="http://203.0.113.9/x.png"></body></html>"#,
    )
    .unwrap();
    let Some(v) = visit(&page, None) else {
        return;
    };
    assert!(
        v.requests.iter().any(|r| r.contains("203.0.113.9")),
        "the proxy saw no request of a page that makes one: {:?}",
        v.requests
    );
}

/// `diff --format html`: NEW's frames coloured by their tested change. Two seeds of one
/// program flag no frame; the build whose alpha_work does 30 % more flags alpha_work's
/// frame (red: more) and not beta_work's.
#[test]
fn differential_flame_graph_flags_the_changed_function_only() {
    let dir = temp_dir("report-html-diff");
    let Some(profiles) = diff_pair::profiles(&dir) else {
        return;
    };
    let page = |new: &Path, name: &str| {
        let html = dir.join(name);
        output_ok(
            Command::new(cpi_bpf())
                .args(["diff", "--format", "html", "-o"])
                .arg(&html)
                .arg(&profiles[0])
                .arg(new),
        );
        visit(&html, None)
    };
    let Some(same) = page(&profiles[1], "same.html") else {
        return;
    };
    assert!(same.requests.is_empty(), "{:?}", same.requests);
    let frames = main_frames(&same.dom);
    assert!(frames.len() > 5 && frames.iter().all(|f| f.contains_key("data-z")));
    assert!(
        frames.iter().all(|f| f["data-significant"] == "false"),
        "a frame flagged between two seeds: {:?}",
        frames.iter().find(|f| f["data-significant"] == "true")
    );
    let changed = page(&profiles[2], "changed.html").unwrap();
    let frames = main_frames(&changed.dom);
    let named = |n: &str| {
        frames
            .iter()
            .find(|f| f["data-name"] == n)
            .unwrap_or_else(|| panic!("no {n}"))
    };
    let alpha = named("alpha_work");
    assert_eq!(alpha["data-significant"], "true", "{alpha:?}");
    let rel = num(alpha, "data-delta") / num(alpha, "data-base");
    assert!((0.25..0.35).contains(&rel), "alpha_work +{rel}");
    assert_eq!(named("beta_work")["data-significant"], "false");
    assert!(changed.dom.contains("alpha_work"), "the table lists it");
}
