//! The flame graph's colour on a program nobody here wrote: Debian's sqlite3 under the
//! PMU model (`cpi-bpf simulate`), its page in Debian's Chromium. By default a frame is
//! coloured by its self CPI against its process's CPI (report/html/colour.rs, written
//! again here from the legend): the colours spread, the reddest frame of ≥ 2 % is the
//! one whose self CPI is highest among those its error separates from the process's,
//! and the process's CPI is the one the profile states. `#absolute` turns the page to
//! the absolute scale of each frame's subtree CPI.

use std::path::Path;
use std::process::Command;

use cpi_tests::browser::{elements, screenshot_path, visit};
use cpi_tests::tracer::tool_dir;
use cpi_tests::{cpi_bpf, output_ok, temp_dir};
use serde_json::Value;

use crate::corpus::SQLITE_SQL;
use crate::report_html::{main_frames, num, Frame};

const SQLITE: &str = "/usr/bin/sqlite3";

/// The relative scale as the legend states it: coloured only where the error bars
/// (± one relative error each) do not overlap; red above, blue below, lightness
/// 82 − 32 × min(|log₂ ratio| / 2, 1); beige within the error or without samples of
/// its own, grey with samples but too few for a self CPI.
fn stated_relative(f: &Frame) -> String {
    let (Some(c), Some(r)) = (f.get("data-self-cpi"), f.get("data-reference-cpi")) else {
        let own = f["data-self-samples"] != "0";
        return if own { "#d4d4d4" } else { "hsl(40,30%,88%)" }.into();
    };
    let (c, r): (f64, f64) = (c.parse().unwrap(), r.parse().unwrap());
    let (rc, rr) = (
        num(f, "data-self-cpi-error"),
        num(f, "data-reference-cpi-error"),
    );
    if (c - r).abs() <= c * rc + r * rr {
        return "hsl(40,30%,88%)".into();
    }
    let light = 82.0 - 32.0 * ((c / r).log2().abs() / 2.0).min(1.0);
    if c > r {
        format!("hsl(8,80%,{light:.1}%)")
    } else {
        format!("hsl(215,70%,{light:.1}%)")
    }
}

/// How red a fill is: 92 − lightness for the red hue, negative for blue, 0 otherwise.
fn redness(fill: &str) -> f64 {
    let light = |s: &str| {
        s.trim_end_matches("%)")
            .rsplit(',')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    if fill.starts_with("hsl(8,") {
        92.0 - light(fill)
    } else if fill.starts_with("hsl(215,") {
        light(fill) - 92.0
    } else {
        0.0
    }
}

/// The main graph's frames with each one's `<rect>` fill as Chromium holds it.
fn frames_with_fills(dom: &str) -> Vec<Frame> {
    let start = dom.find(r#"class="graph main""#).unwrap();
    let end = dom[start..].find("</svg>").unwrap() + start;
    let rects = regex::Regex::new(r#"<rect [^>]*fill="([^"]+)""#).unwrap();
    let fills: Vec<String> = rects
        .captures_iter(&dom[start..end])
        .map(|c| c[1].to_string())
        .collect();
    let mut frames = main_frames(dom);
    assert_eq!(frames.len(), fills.len(), "one rect per frame");
    for (f, fill) in frames.iter_mut().zip(fills) {
        f.insert("rect-fill".into(), fill);
    }
    frames
}

/// sqlite3's profile under the PMU model and its page; `None` (skipped) without the
/// tracer or sqlite3.
fn sqlite_page(dir: &Path) -> Option<(Value, std::path::PathBuf)> {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return None;
    }
    if !Path::new(SQLITE).exists() {
        cpi_tests::skip(format_args!("{SQLITE} is not installed"));
        return None;
    }
    let (json, page) = (dir.join("sqlite.json"), dir.join("sqlite.html"));
    output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--quiet", "-o"])
            .arg(&json)
            .args(["--", SQLITE, ":memory:", SQLITE_SQL]),
    );
    output_ok(
        Command::new(cpi_bpf())
            .args(["report", "--quiet"])
            .arg(&json)
            .arg("-o")
            .arg(&page),
    );
    let profile = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    Some((profile, page))
}

#[test]
fn sqlite_flame_colours_find_the_highest_self_cpi() {
    let dir = temp_dir("report-html-colour");
    let Some((profile, page)) = sqlite_page(&dir) else {
        return;
    };
    let Some(v) = visit(&page, Some(&screenshot_path("html-sqlite-relative"))) else {
        return;
    };
    assert!(v.requests.is_empty(), "requests: {:?}", v.requests);
    let frames = frames_with_fills(&v.dom);
    let process_cpi = profile["processes"][0]["cpi"]["value"].as_f64().unwrap();
    for f in &frames {
        assert_eq!(f["rect-fill"], stated_relative(f), "{f:?}");
        if let Some(r) = f.get("data-reference-cpi") {
            let r: f64 = r.parse().unwrap();
            assert!(
                (r - process_cpi).abs() <= 1e-9 * process_cpi,
                "{r} vs {process_cpi}"
            );
        }
    }
    // Spread: frames of ≥ 1 % take several shades, both red and blue.
    let big: Vec<&Frame> = frames
        .iter()
        .filter(|f| num(f, "data-share") >= 0.01)
        .collect();
    let shades: std::collections::BTreeSet<&str> =
        big.iter().map(|f| f["rect-fill"].as_str()).collect();
    assert!(shades.len() >= 5, "{} shades: {shades:?}", shades.len());
    assert!(big.iter().any(|f| redness(&f["rect-fill"]) > 0.0), "no red");
    assert!(
        big.iter().any(|f| redness(&f["rect-fill"]) < 0.0),
        "no blue"
    );

    // The reddest frame of ≥ 2 % is the highest self CPI of those separated.
    let hot: Vec<&Frame> = frames
        .iter()
        .filter(|f| num(f, "data-share") >= 0.02)
        .collect();
    let reddest = hot
        .iter()
        .map(|f| redness(&f["rect-fill"]))
        .fold(f64::MIN, f64::max);
    let slowest = hot
        .iter()
        .filter(|f| redness(&f["rect-fill"]) > 0.0)
        .max_by(|a, b| num(a, "data-self-cpi").total_cmp(&num(b, "data-self-cpi")))
        .expect("a red frame of ≥ 2 %");
    assert_eq!(redness(&slowest["rect-fill"]), reddest, "{slowest:?}");
    eprintln!(
        "sqlite3: process CPI {process_cpi:.3}; reddest of ≥ 2 %: {} self CPI {} ± {}, {} shades of {} frames ≥ 1 %",
        slowest["data-name"],
        slowest["data-self-cpi"],
        slowest["data-self-cpi-error"],
        shades.len(),
        big.len()
    );

    assert_callers_keep_labels(&dir, &page);

    // #absolute: every frame on the absolute scale of its subtree's CPI.
    let abs = visit(&dir.join("sqlite.html#absolute"), None).unwrap();
    for f in frames_with_fills(&abs.dom) {
        assert_eq!(f["rect-fill"], f["data-abs-fill"], "{f:?}");
    }
}

/// Each code section's callers icicle has its function as the root, at the top; and
/// "reset zoom" (clicked by a script added to the page, before any section is opened)
/// leaves every icicle's labels as they were.
fn assert_callers_keep_labels(dir: &Path, page: &Path) {
    let html = std::fs::read_to_string(page).unwrap();
    let count =
        r#"[...document.querySelectorAll("svg.callers text")].filter(t => t.textContent).length"#;
    let script = format!(
        "<script>document.body.dataset.before = {count}; \
         document.getElementById(\"reset\").click(); \
         document.body.dataset.after = {count};</script></body>"
    );
    let clicked = dir.join("reset.html");
    std::fs::write(&clicked, html.replacen("</body>", &script, 1)).unwrap();
    let v = visit(&clicked, None).unwrap();
    let labels = |key: &str| -> usize {
        let re = regex::Regex::new(&format!(r#"<body[^>]* data-{key}="([0-9]+)""#)).unwrap();
        re.captures(&v.dom).expect(key)[1].parse().unwrap()
    };
    let (before, after) = (labels("before"), labels("after"));
    assert!(before > 10, "{before} icicle labels");
    assert_eq!(after, before, "labels lost on reset zoom");
    let sections =
        regex::Regex::new(r#"(?s)<article class="code" [^>]*data-function="([^"]*)".*?</article>"#)
            .unwrap();
    let mut n = 0;
    for c in sections.captures_iter(&v.dom) {
        let Some(at) = c[0].find(r#"<svg class="graph callers""#) else {
            continue;
        };
        let root = &elements(&c[0][at..], "g", "f")[0];
        assert_eq!(
            (root["data-name"].as_str(), root["data-depth"].as_str()),
            (&c[1], "0"),
            "the icicle's root"
        );
        n += 1;
    }
    assert!(n >= 5, "{n} callers icicles");
}
