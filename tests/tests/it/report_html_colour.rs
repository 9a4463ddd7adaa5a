//! The flame graph's colour on programs nobody here wrote: Debian's sqlite3 and xz
//! under the PMU model (`cpi-bpf simulate`), each page in Debian's Chromium. By default
//! a frame is coloured by its self CPI against its process's CPI
//! (report/html/colour.rs, written again here from the legend): the colours spread,
//! the reddest frame of ≥ 2 % is the one whose self CPI is highest among those its
//! error separates from the process's, and the process's CPI is the one the profile
//! states. The legend's switch (and `#absolute`) turns the page to the absolute scale
//! of each frame's subtree CPI and back, the legend saying which; the callers icicles
//! keep their labels through "reset zoom", and no cell is wider than the window.

use std::path::{Path, PathBuf};
use std::process::Command;

use cpi_tests::browser::{elements, screenshot_path, visit};
use cpi_tests::tracer::{tool_dir, words_text};
use cpi_tests::{cpi_bpf, output_ok, temp_dir};
use serde_json::Value;

use crate::corpus::SQLITE_SQL;
use crate::report_html::{main_frames, num, Frame};

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

/// `command`'s profile under the PMU model and its page, named for `name`; `None`
/// (skipped) without the tracer or the program.
fn simulated_page(dir: &Path, name: &str, command: &[&str]) -> Option<(Value, PathBuf)> {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return None;
    }
    if !Path::new(command[0]).exists() {
        cpi_tests::skip(format_args!("{} is not installed", command[0]));
        return None;
    }
    let (json, page) = (
        dir.join(format!("{name}.json")),
        dir.join(format!("{name}.html")),
    );
    output_ok(
        Command::new(cpi_bpf())
            .args(["simulate", "--quiet", "-o"])
            .arg(&json)
            .arg("--")
            .args(command),
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
    let sqlite = ["/usr/bin/sqlite3", ":memory:", SQLITE_SQL];
    colours_find_the_highest_self_cpi(&dir, "sqlite", &sqlite);
    let _ = std::fs::remove_dir_all(&dir);
}

/// xz compressing 300 kB of text at `-6` (as the corpus test runs it): match finding
/// and range coding, a program of a different shape.
#[test]
fn xz_flame_colours_find_the_highest_self_cpi() {
    let dir = temp_dir("report-html-colour-xz");
    let input = dir.join("input.txt");
    std::fs::write(&input, words_text(300_000)).unwrap();
    let xz = ["/usr/bin/xz", "-c", "-6", input.to_str().unwrap()];
    colours_find_the_highest_self_cpi(&dir, "xz", &xz);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The checks of the module's header on `command`'s page.
fn colours_find_the_highest_self_cpi(dir: &Path, name: &str, command: &[&str]) {
    let Some((profile, page)) = simulated_page(dir, name, command) else {
        return;
    };
    let shot = screenshot_path(&format!("html-{name}-relative"));
    let Some(v) = visit(&page, Some(&shot)) else {
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
    assert!(
        shades.len() >= 5,
        "{name}: {} shades: {shades:?}",
        shades.len()
    );
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
        "{name}: process CPI {process_cpi:.3}; reddest of ≥ 2 %: {} self CPI {} ± {}, {} shades of {} frames ≥ 1 %",
        slowest["data-name"],
        slowest["data-self-cpi"],
        slowest["data-self-cpi-error"],
        shades.len(),
        big.len()
    );

    let clicked = clicked_through(dir, &page);
    assert_callers_keep_labels(&clicked);
    assert_switch_changes_the_scale(&clicked, &frames);

    // #absolute: every frame on the absolute scale of its subtree's CPI.
    let abs = visit(&page.with_extension("html#absolute"), None).unwrap();
    for f in frames_with_fills(&abs.dom) {
        assert_eq!(f["rect-fill"], f["data-abs-fill"], "{f:?}");
    }
}

/// What a reader's clicks do, run by a script added after the page's own, each step's
/// result kept in the DOM: the callers icicles' labels before and after "reset zoom"
/// (before any section is opened), then the legend, every main frame's fill and the
/// scale each table's CPI cell is painted on, after each click on the visible colour
/// switch (to the absolute scale, and back); and the widest table cell against the
/// window.
const CLICKS: &str = r##"<script>
const count = () => [...document.querySelectorAll("svg.callers text")].filter(t => t.textContent).length;
const b = document.body.dataset;
b.before = count(); document.getElementById("reset").click(); b.after = count();
const probe = document.createElement("i").style;
const as = (key, fill) => { probe[key] = ""; probe[key] = fill; return probe[key]; };
const scale = c => {
  const key = c.dataset.paint ? "borderLeftColor" : "backgroundColor", now = c.style[key];
  const r = now === as(key, c.dataset.fill), a = now === as(key, c.dataset.absFill);
  return r && a ? "both" : r ? "relative" : a ? "absolute" : "neither: " + now;
};
const shown = to => ({
  to,
  legend: [...document.querySelectorAll("#scale .scale")].filter(s => !s.hidden).map(s => s.querySelector("b").textContent),
  fills: [...document.querySelectorAll("svg.graph.main g.f rect")].map(r => r.getAttribute("fill")),
  cells: [...document.querySelectorAll("td[data-abs-fill]")].map(scale),
});
const steps = [shown(null)];
for (let i = 0; i < 2; i++) {
  const button = [...document.querySelectorAll("button.colour-mode")].find(x => !x.closest(".scale").hidden);
  button.click(); steps.push(shown(button.dataset.to));
}
b.widest = Math.max(...[...document.querySelectorAll("td, th")].map(c => c.getBoundingClientRect().width));
b.scrollWidth = document.documentElement.scrollWidth;
const out = document.createElement("pre"); out.className = "clicks"; out.hidden = true;
out.textContent = JSON.stringify(steps); document.body.append(out);
</script></body>"##;

/// The DOM of `page` after [`CLICKS`].
fn clicked_through(dir: &Path, page: &Path) -> String {
    let html = std::fs::read_to_string(page).unwrap();
    let clicked = dir.join("clicked.html");
    std::fs::write(&clicked, html.replacen("</body>", CLICKS, 1)).unwrap();
    visit(&clicked, None).unwrap().dom
}

/// A number [`CLICKS`] left on `<body>`.
fn body_number(dom: &str, key: &str) -> f64 {
    let re = regex::Regex::new(&format!(r#"<body[^>]* data-{key}="([0-9.e+-]+)""#)).unwrap();
    re.captures(dom).unwrap_or_else(|| panic!("no data-{key}"))[1]
        .parse()
        .unwrap()
}

/// The legend names the scale shown, before and after each click, and the frames and
/// the tables' CPI cells take the fills of that scale: relative (each one's
/// `data-fill`), absolute (`data-abs-fill`), relative again. The two scales differ on
/// most frames, so the click is seen. No cell is wider than the 1 400 px window, nor
/// the page.
fn assert_switch_changes_the_scale(dom: &str, frames: &[Frame]) {
    let pre = &elements(dom, "pre", "clicks")[0]["#text"];
    let steps: Value = serde_json::from_str(pre).unwrap();
    let relative = "Colour: self CPI against its process's";
    let absolute = "Colour: CPI of the frame's subtree, absolute scale";
    for (i, (to, legend, key)) in [
        (Value::Null, relative, "data-fill"),
        ("absolute".into(), absolute, "data-abs-fill"),
        ("relative".into(), relative, "data-fill"),
    ]
    .into_iter()
    .enumerate()
    {
        let step = &steps[i];
        assert_eq!(step["to"], to, "click {i}");
        assert_eq!(step["legend"], serde_json::json!([legend]), "click {i}");
        let fills = step["fills"].as_array().unwrap();
        assert_eq!(fills.len(), frames.len(), "click {i}");
        for (f, fill) in frames.iter().zip(fills) {
            assert_eq!(fill, f[key].as_str(), "click {i}: {f:?}");
        }
        // The tables' CPI cells follow the same switch.
        let cells = step["cells"].as_array().unwrap();
        let shown = if key == "data-fill" {
            "relative"
        } else {
            "absolute"
        };
        for c in cells {
            assert!(c == shown || c == "both", "click {i}: a CPI cell {c}");
        }
        let apart = cells.iter().filter(|c| *c == shown).count();
        assert!(apart > 0, "click {i}: no CPI cell tells the scales apart");
    }
    let changed = (steps[0]["fills"].as_array().unwrap().iter())
        .zip(steps[1]["fills"].as_array().unwrap())
        .filter(|(a, b)| a != b)
        .count();
    eprintln!(
        "{changed} of {} frames change colour on the switch",
        frames.len()
    );
    assert!(
        2 * changed > frames.len(),
        "{changed} of {} frames changed",
        frames.len()
    );
    let (widest, page) = (body_number(dom, "widest"), body_number(dom, "scroll-width"));
    assert!(
        widest <= 1400.0 && page <= 1400.0,
        "cell {widest} px, page {page} px"
    );
}

/// Each code section's callers icicle has its function as the root, at the top; and
/// "reset zoom" (clicked by [`CLICKS`], before any section is opened) leaves every
/// icicle's labels as they were.
fn assert_callers_keep_labels(dom: &str) {
    let (before, after) = (body_number(dom, "before"), body_number(dom, "after"));
    assert!(before > 10.0, "{before} icicle labels");
    assert_eq!(after, before, "labels lost on reset zoom");
    let sections =
        regex::Regex::new(r#"(?s)<article class="code" [^>]*data-function="([^"]*)".*?</article>"#)
            .unwrap();
    let mut n = 0;
    for c in sections.captures_iter(dom) {
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
