//! `cpi-bpf diff`: two `simulate` seeds of one program flag nothing; a build where one
//! function does 30 % more work flags that function and not the unchanged one, from
//! files and from two ranges of a store.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use cpi_tests::diff_pair::{self, simulate};
use cpi_tests::tracer::tool_dir;
use cpi_tests::{assert_one_error_line, compile_c, cpi_bpf, output_ok, stdout_json, temp_dir};
use flate2::{write::GzEncoder, Compression};

fn diff(base: &Path, new: &Path, extra: &[&str]) -> std::process::Output {
    output_ok(
        Command::new(cpi_bpf())
            .arg("diff")
            .arg(base)
            .arg(new)
            .args(extra),
    )
}

/// The function `name`'s unit in a `diff --format json`.
fn function<'v>(d: &'v serde_json::Value, name: &str) -> &'v serde_json::Value {
    d["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["kind"] == "function" && u["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {d}"))
}

/// The units a `diff --format json` flagged, one line each (kind, name, in which
/// profiles): what a failure says first, before the whole diff.
fn flagged(d: &serde_json::Value) -> String {
    (d["units"].as_array().unwrap().iter())
        .filter(|u| u["significant"] == true)
        .map(|u| {
            format!(
                "{} {} (base {}, new {})",
                u["kind"], u["name"], u["in_base"], u["in_new"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn diff_tells_thirty_percent_more_work_from_seed_noise() {
    let dir = temp_dir("report-diff");
    let Some([a1, a2, b1]) = diff_pair::profiles(&dir) else {
        return;
    };
    // Two seeds of one program: nothing significant.
    let same = stdout_json(&diff(&a1, &a2, &["--format", "json"]));
    assert_eq!(same["significant"], 0, "{same:#}");
    assert!(same["tests"].as_u64().unwrap() >= 6, "{same:#}");
    let alpha = function(&same, "alpha_work");
    assert_eq!(alpha["significant"], false);
    assert!(
        alpha["cycles"]["z"].as_f64().unwrap().abs() < 4.0,
        "{alpha:#}"
    );

    // alpha_work does 30 % more: flagged (cycles and instructions), beta_work not.
    let changed = stdout_json(&diff(&a1, &b1, &["--format", "json"]));
    let alpha = function(&changed, "alpha_work");
    assert_eq!(alpha["significant"], true, "{changed:#}");
    for q in ["cycles", "instructions"] {
        assert_eq!(alpha[q]["significant"], true, "{q}: {alpha:#}");
        let rel = alpha[q]["delta_rel"].as_f64().unwrap();
        assert!((0.25..0.35).contains(&rel), "{q} {rel}: {alpha:#}");
        assert!(alpha[q]["base_error"].as_f64().unwrap() > 0.0, "{alpha:#}");
    }
    let beta = function(&changed, "beta_work");
    assert_eq!(beta["significant"], false, "{beta:#}");
    // Call paths too: alpha_work's path flagged, beta_work's not.
    let path = |leaf: &str| {
        changed["units"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| {
                u["kind"] == "path"
                    && u["name"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("{leaf} ← main"))
            })
            .unwrap_or_else(|| panic!("no path of {leaf} in {changed}"))
            .clone()
    };
    assert_eq!(path("alpha_work")["significant"], true);
    assert_eq!(path("beta_work")["significant"], false);

    // The table: alpha_work marked, every line within 80 columns.
    let table = diff(&a1, &b1, &[]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with("* alpha_work")),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("* beta_work")),
        "{text}"
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{line}");
    }

    // The same as two ranges of a store: a1 the window of second 1, b1 that of second 3.
    let store = dir.join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (profile, window) in [(&a1, "w-1000-2000.json.gz"), (&b1, "w-3000-4000.json.gz")] {
        let mut gz = GzEncoder::new(
            File::create(store.join(window)).unwrap(),
            Compression::fast(),
        );
        gz.write_all(&std::fs::read(profile).unwrap()).unwrap();
        gz.finish().unwrap();
    }
    let ranges = output_ok(
        Command::new(cpi_bpf())
            .args(["diff", "--format", "json", "--store"])
            .arg(&store)
            .args(["--base-until", "@2", "--since", "@3"]),
    );
    let ranges = stdout_json(&ranges);
    assert_eq!(
        function(&ranges, "alpha_work")["significant"],
        true,
        "{ranges:#}"
    );
    assert_eq!(
        function(&ranges, "beta_work")["significant"],
        false,
        "{ranges:#}"
    );
}

/// One program built twice under two file names (slow_a, and slow_b whose alpha_work
/// does 130 % of the work), each simulated: the two main processes are matched with
/// each other and their functions by name (said in the header), and only alpha_work is
/// flagged; its instructions rise by 30 % within the error the profiles give the
/// change. Without the pairing (`--match comm`) nothing matches. The page's table
/// writes values in their units and σ, and each frame's hover its Δ %.
#[test]
fn diff_of_two_builds_under_two_names_flags_only_the_changed_function() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let dir = temp_dir("report-diff-names");
    let (Some(a), Some(b)) = (
        compile_c("diff_pair.c", &dir, "slow_a", &[]),
        compile_c("diff_pair.c", &dir, "slow_b", &["-DALPHA_PERCENT=130"]),
    ) else {
        return;
    };
    let (ja, jb) = (dir.join("slow_a.json"), dir.join("slow_b.json"));
    std::thread::scope(|s| {
        s.spawn(|| simulate(&a, diff_pair::ROUNDS, 1, &ja));
        s.spawn(|| simulate(&b, diff_pair::ROUNDS, 2, &jb));
    });
    let d = stdout_json(&diff(&ja, &jb, &["--format", "json"]));
    assert_eq!(d["pairing"]["base_comm"], "slow_a", "{d:#}");
    assert_eq!(d["pairing"]["new_comm"], "slow_b", "{d:#}");
    let functions = (d["units"].as_array().unwrap().iter()).filter(|u| u["kind"] == "function");
    let flagged: Vec<&str> = functions
        .filter(|u| u["significant"] == true)
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(flagged, ["alpha_work"], "{}\n{d:#}", self::flagged(&d));
    for name in ["alpha_work", "beta_work", "main"] {
        let f = function(&d, name);
        assert!(f["in_base"] == true && f["in_new"] == true, "{f:#}");
    }
    let ins = &function(&d, "alpha_work")["instructions"];
    let num = |k: &str| ins[k].as_f64().unwrap();
    assert!(
        (num("delta") - 0.3 * num("base")).abs() <= 4.0 * num("delta_error"),
        "alpha_work's instructions {} → {}, expected +30 %: {ins:#}",
        num("base"),
        num("new")
    );
    let beta = &function(&d, "beta_work")["cycles"];
    assert!(beta["z"].as_f64().unwrap().abs() < 4.0, "{beta:#}");

    let table = String::from_utf8(diff(&ja, &jb, &[]).stdout).unwrap();
    let words = table.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("slow_a (base) with slow_b (new)"), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with("* alpha_work")),
        "{table}"
    );
    assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
    let by_comm = stdout_json(&diff(&ja, &jb, &["--format", "json", "--match", "comm"]));
    assert!(by_comm.get("pairing").is_none(), "{by_comm:#}");
    let betas = (by_comm["units"].as_array().unwrap().iter())
        .filter(|u| u["kind"] == "function" && u["name"] == "beta_work");
    assert!(
        betas
            .map(|u| (u["in_base"] == true, u["in_new"] == true))
            .all(|(b, n)| b != n),
        "{by_comm:#}"
    );

    let html = dir.join("diff.html");
    let _ = diff(
        &ja,
        &jb,
        &["--format", "html", "-o", html.to_str().unwrap()],
    );
    let page = std::fs::read_to_string(&html).unwrap();
    let matching = (page.split(r#"<p class="pairing">Matching: "#).nth(1))
        .and_then(|p| p.split("</p>").next())
        .expect("the page says how units were matched");
    assert!(
        matching.contains("slow_a (base) with slow_b (new)"),
        "{matching}"
    );
    let cells: Vec<&str> = (page.split("<td").skip(1))
        .filter_map(|c| c.split_once('>')?.1.split_once("</td>").map(|t| t.0))
        .collect();
    assert!(cells.len() > 20, "{page}");
    // A number in exponent form (`1.361e+09`), not a name that holds "e-" or "e+"
    // (`[vgpreload_core-amd64-linux.so]+0x1048`).
    let exponent = |c: &str| {
        c.as_bytes().windows(4).any(|w| {
            w[0].is_ascii_digit()
                && w[1].eq_ignore_ascii_case(&b'e')
                && (w[2] == b'+' || w[2] == b'-')
                && w[3].is_ascii_digit()
        })
    };
    for c in &cells {
        assert!(!exponent(c), "an unreadable cell {c:?}");
    }
    assert!(cells.iter().any(|c| c.starts_with("± ")), "no σ column");
    // The frame's name is a number in the page's string table, its tooltip the numbers.
    let alpha = cpi_tests::browser::page_strings(&page)
        .iter()
        .position(|s| s == "alpha_work")
        .expect("alpha_work in the page's strings");
    let alpha_tip = page
        .split(&format!(r#"<g class="f" data-n="{alpha}""#))
        .nth(1)
        .and_then(|f| f.split("<title>").nth(1))
        .expect("alpha_work's frame");
    assert!(
        alpha_tip.starts_with("base ") && alpha_tip.contains(": Δ +"),
        "{alpha_tip}"
    );
}

/// Live profiles (a time profile where there is no PMU), compared by share
/// (`--by share`): how long a run takes follows what else the machine runs (two runs of
/// the base build under the suite's load differed by 6.5 % of absolute time, a real
/// change `--by absolute` rightly flags), while each function's share of its process
/// does not. Two runs of the base build flag nothing; the build with alpha_work at
/// 130 % flags alpha_work's share up (0.5 → 0.565) and so beta_work's down, and no
/// other function. 6000 rounds are ≈ 1.2 s of CPU: at 4999 Hz a share's error is
/// ≈ 0.006, a difference's ≈ 0.0085, so the change is ≈ 7.6 σ. Both diffs test at
/// `--alpha 0.0001`: at the default 0.01 two runs of one build flag something in ≈ 1 %
/// of runs by design (one `.ci/run` met it: alpha_work 0.517 → 0.493), which a
/// test must not; the change stays far beyond the 4 σ that level asks. How often the
/// level holds is the 20 seed pairs' test below. User space only: the kernel's share
/// (interrupts, scheduling) follows what else the machine runs.
#[test]
fn diff_of_live_profiles_flags_the_changed_share_only() {
    if !cpi_tests::require_root("live profiles") {
        return;
    }
    let dir = temp_dir("report-diff-live");
    let Some((base, changed)) = diff_pair::builds(&dir) else {
        return;
    };
    let _cpus = cpi_tests::cpu_heavy();
    let record = |exe: &Path, out: &Path| {
        output_ok(
            Command::new(cpi_bpf())
                .args(["-q", "-F", "4999", "--user-only", "--format", "json", "-o"])
                .arg(out)
                .arg("--")
                .arg(exe)
                .arg("6000"),
        );
    };
    let out = [
        dir.join("a1.json"),
        dir.join("a2.json"),
        dir.join("b1.json"),
    ];
    record(&base, &out[0]);
    record(&base, &out[1]);
    record(&changed, &out[2]);
    let by_share = ["--format", "json", "--by", "share", "--alpha", "0.0001"];
    let same = stdout_json(&diff(&out[0], &out[1], &by_share));
    assert_eq!(same["significant"], 0, "{}\n{same:#}", flagged(&same));
    let changed = stdout_json(&diff(&out[0], &out[2], &by_share));
    let share = |name: &str| function(&changed, name)["time_ns_share"].clone();
    let (alpha, beta) = (share("alpha_work"), share("beta_work"));
    assert_eq!(alpha["significant"], true, "{changed:#}");
    assert_eq!(beta["significant"], true, "{changed:#}");
    // 30 % more of alpha_work's time: its share a becomes 1.3a / (1.3a + 1 − a), within
    // the error the two profiles give the change.
    let num = |k: &str| alpha[k].as_f64().unwrap();
    let a = num("base");
    let expected = 1.3 * a / (1.3 * a + 1.0 - a) - a;
    assert!(
        (num("delta") - expected).abs() <= 4.0 * num("delta_error"),
        "alpha_work's share {a} → {}, expected +{expected}: {alpha:#}",
        num("new")
    );
    assert!(beta["delta"].as_f64().unwrap() < 0.0, "{beta:#}");
    let flagged: Vec<&str> = changed["units"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["kind"] == "function" && u["significant"] == true)
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert!(
        flagged
            .iter()
            .all(|n| ["alpha_work", "beta_work"].contains(n)),
        "{flagged:?}"
    );
}

/// Over 20 pairs of seeds of one program, the share of diffs that flag anything is
/// within the level: at most α = 1 % per pair. Two or more in 20 would happen with
/// probability 1.7 % at exactly that rate, three or more 0.1 %: the bound is 2, which a
/// broken error model (errors understated twofold flag nearly every pair) far exceeds.
#[test]
fn diff_false_positives_over_20_seed_pairs_are_within_the_level() {
    if let Err(why) = tool_dir() {
        cpi_tests::skip(&why);
        return;
    }
    let dir = temp_dir("report-diff-fp");
    let Some(exe) = compile_c("diff_pair.c", &dir, "diff_pair", &[]) else {
        return;
    };
    let out = |seed: u64| dir.join(format!("s{seed}.json"));
    // 40 simulations of 0.5 s, two at a time (the CPUs of a small CI machine).
    std::thread::scope(|s| {
        for half in [0u64, 1] {
            let (exe, out) = (&exe, &out);
            s.spawn(move || {
                (0..20)
                    .for_each(|i| simulate(exe, "20", 100 + 2 * i + half, &out(100 + 2 * i + half)))
            });
        }
    });
    let flagged: Vec<u64> = (0..20)
        .filter(|i| {
            let (a, b) = (out(100 + 2 * i), out(101 + 2 * i));
            stdout_json(&diff(&a, &b, &["--format", "json"]))["significant"] != 0
        })
        .collect();
    eprintln!("pairs with a significant change: {flagged:?} of 20");
    assert!(flagged.len() <= 2, "{flagged:?}");
}

#[test]
fn diff_refuses_missing_and_foreign_files_in_one_line() {
    let dir = temp_dir("report-diff-bad");
    let missing = dir.join("missing.json");
    let foreign = dir.join("foreign.json");
    std::fs::write(&foreign, "{\"hello\": 1}").unwrap();
    for (base, needle) in [
        (&missing, "missing.json"),
        (&foreign, "not a cpi-bpf profile"),
    ] {
        let out = Command::new(cpi_bpf())
            .arg("diff")
            .arg(base)
            .arg(&foreign)
            .output()
            .unwrap();
        assert_one_error_line(&out, needle);
    }
    // `diff` is a command, not a program to profile.
    let help = output_ok(Command::new(cpi_bpf()).args(["diff", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Benjamini") && help.contains("-diff_base"),
        "{help}"
    );
}
