//! The command line as a perf user types it: perf's short flags, a command with or
//! without `--`, the workload's exit status, one-line errors with clap's suggestions.

use std::process::Command;

use cpi_tests::{assert_one_error_line, busy, cpi_bpf, cpu_heavy, require_root, stderr, temp_dir};

fn run(args: &[&str]) -> std::process::Output {
    Command::new(cpi_bpf())
        .args(args)
        .output()
        .expect("running cpi-bpf")
}

#[test]
fn misspelt_flags_and_values_get_suggestions_in_one_line() {
    let out = run(&["--duraton", "1", "--", "true"]);
    assert_one_error_line(&out, "did you mean '--duration'?");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = run(&["--format", "csv", "--", "true"]);
    assert_one_error_line(
        &out,
        "possible values: table, json, pprof, otlp, folded, fdata, html",
    );
    let out = run(&["report", "--formt", "json", "x.json"]);
    assert_one_error_line(&out, "did you mean '--format'?");
}

#[test]
fn report_without_a_profile_and_top_zero_say_what_to_give() {
    let out = run(&["report"]);
    assert_one_error_line(&out, "give FILE (written with --format json -o FILE)");
    let out = run(&["report", "--top", "0", "x.json"]);
    assert_one_error_line(&out, "--top <N>': tables need at least 1 row");
}

#[test]
fn a_command_without_dashes_runs_and_its_exit_status_is_ours() {
    if !require_root("the exit-status cases") {
        return;
    }
    // perf's exit statuses: the workload's own, with or without `--`.
    let out = run(&["--", "false"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = run(&["sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("command exited with status 3"),
        "{}",
        stderr(&out)
    );
    // A signal that ends the workload is 128+N, as a shell shows it.
    let out = run(&["-F", "99", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    // A command that does not exist is an error, not a profile of nothing.
    let out = run(&["./no-such-program-here"]);
    assert_one_error_line(&out, "command not found: ./no-such-program-here");
}

#[test]
fn g_is_the_default_and_e_names_only_the_ladders_events() {
    if !require_root("-g and -e") {
        return;
    }
    // Stacks are on by default: -g is perf's habit, accepted quietly; --no-stacks turns
    // them off, and both at once is a one-line error.
    for flag in ["-g", "--no-stacks"] {
        let out = run(&[flag, "-F", "99", "--", "true"]);
        assert!(out.status.success(), "{flag}: {}", stderr(&out));
        assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    }
    let out = run(&["-g", "--no-stacks", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // The event the ladder picks here is accepted; others are one clear error.
    let doctor = String::from_utf8_lossy(&run(&["doctor"]).stdout).into_owned();
    let (ok, other) = if doctor.contains("time-profile") {
        ("cpu-clock", "cycles")
    } else {
        ("cycles", "cpu-clock")
    };
    let out = run(&["-e", ok, "-F", "99", "--", "true"]);
    assert!(out.status.success(), "-e {ok}: {}", stderr(&out));
    let out = run(&["-e", other, "--", "true"]);
    assert_one_error_line(
        &out,
        &format!("-e {other}: on this machine cpi-bpf samples"),
    );
}

#[test]
fn short_flags_profile_a_pid_into_a_file_and_keep_the_old_one() {
    if !require_root("-p PID -F 499 -o FILE") {
        return;
    }
    let Some(exe) = busy("cli-pid", &[]) else {
        panic!("gcc is needed to build tests/programs/busy.c (cargo xtask setup installs it)");
    };
    let _cpu = cpu_heavy();
    let dir = temp_dir("cli-pid-out");
    let file = dir.join("f.json");
    std::fs::write(&file, "the previous run\n").unwrap();
    let mut child = cpi_tests::KillOnDrop(Command::new(&exe).arg("3").spawn().unwrap());
    let pid = child.0.id();
    let out = run(&[
        "-p",
        &pid.to_string(),
        "-F",
        "499",
        "--duration",
        "1",
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = child.0.kill();
    // No --format: `-o f.json` asks for JSON by its name.
    let p: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).expect("-o f.json wrote JSON");
    let procs = p["processes"].as_array().expect("processes");
    assert!(
        procs.iter().any(|pr| pr["pid"] == pid),
        "pid {pid} in {procs:?}"
    );
    // Lines for sampled instructions only: the profile grows with the samples, not
    // with the code the sampled functions hold.
    let lines: Vec<&serde_json::Value> = procs
        .iter()
        .flat_map(|pr| pr["functions"].as_array().unwrap())
        .flat_map(|f| f["lines"].as_array().unwrap())
        .collect();
    assert!(!lines.is_empty());
    assert!(
        lines
            .iter()
            .all(|l| l["samples"].as_u64() > Some(0) || l["count"].as_f64() > Some(0.0)),
        "a line without samples or counts"
    );
    // perf keeps perf.data.old: the file that was there is kept beside it.
    let old = std::fs::read_to_string(dir.join("f.json.old")).expect("f.json.old kept");
    assert_eq!(old, "the previous run\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_with_a_command_profiles_the_system_while_it_runs() {
    if !require_root("-a -- sleep 1") {
        return;
    }
    let _cpu = cpu_heavy();
    let Some(exe) = busy("cli-a", &[]) else {
        panic!("gcc is needed to build tests/programs/busy.c (cargo xtask setup installs it)");
    };
    // A process that is not the command: system-wide sees it, while `sleep` runs.
    let mut other = cpi_tests::KillOnDrop(Command::new(&exe).arg("10").spawn().unwrap());
    let out = run(&["-a", "-F", "199", "--format", "json", "--", "sleep", "1"]);
    let _ = other.0.kill();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("command exited with status 0"),
        "stopped when sleep exited: {}",
        stderr(&out)
    );
    let p = cpi_tests::stdout_json(&out);
    let pid = other.0.id();
    assert!(
        p["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|pr| pr["pid"] == pid),
        "the busy process {pid} is in a system-wide profile"
    );
    let secs = p["duration_secs"].as_f64().unwrap();
    assert!(
        secs < 8.0,
        "ended with sleep 1, not the busy program: {secs} s"
    );
}

#[test]
fn a_300_character_name_fits_an_80_column_table() {
    if !require_root("profiling a program with a long name") {
        return;
    }
    let dir = temp_dir("cli-long");
    let name = format!("hot_{}", "template_argument_".repeat(17));
    assert!(name.len() >= 300);
    let src = dir.join("long.c");
    std::fs::write(
        &src,
        format!(
            "#include <time.h>\n\
             __attribute__((noinline)) unsigned long {name}(unsigned long n) {{\n\
               unsigned long x = 1; for (unsigned long i = 0; i < n; i++) x = x * 31 + i;\n\
               return x; }}\n\
             int main(void) {{ volatile unsigned long s = 0; time_t t = time(0);\n\
               while (time(0) - t < 1) s += {name}(1000000); return 0; }}\n"
        ),
    )
    .unwrap();
    let exe = dir.join("long");
    let built = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("gcc (cargo xtask setup installs it)");
    assert!(built.success());
    let _cpu = cpu_heavy();
    let out = Command::new(cpi_bpf())
        .env("COLUMNS", "80")
        .args(["-F", "499"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    for l in table.lines() {
        assert!(
            l.chars().count() <= 80,
            "{} wide: {l}\n{table}",
            l.chars().count()
        );
    }
    assert!(
        table.contains("hot_template_argument_") && table.contains('…'),
        "the name, shortened:\n{table}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// perf's default where it is allowed: kernel samples are kept (`[kernel]`), so `dd`
/// from /dev/zero shows where its CPU time goes, the summary line states the kernel's
/// share, and the totals add up; `--user-only` leaves the kernel out.
#[test]
fn kernel_time_is_shown_and_totals_add_up() {
    if !require_root("kernel samples") {
        return;
    }
    let _cpu = cpu_heavy();
    let dd = [
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=64k",
        "count=300000",
    ];
    let out = Command::new(cpi_bpf())
        .args(["--format", "json", "--"])
        .args(dd)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let p = cpi_tests::stdout_json(&out);
    let procs = p["processes"].as_array().unwrap();
    let dd_proc = procs
        .iter()
        .find(|pr| pr["comm"] == "dd")
        .unwrap_or_else(|| panic!("dd in {procs:?}"));
    let fns = dd_proc["functions"].as_array().unwrap();
    let samples = |kernel: bool| -> u64 {
        fns.iter()
            .filter(|f| (f["binary"] == "[kernel]") == kernel)
            .map(|f| f["samples"].as_u64().unwrap())
            .sum()
    };
    let (k, u) = (samples(true), samples(false));
    assert_eq!(
        k + u,
        dd_proc["samples"].as_u64().unwrap(),
        "every sample is in a function"
    );
    // Reading /dev/zero is the kernel zeroing pages: most of dd's time by far.
    assert!(k > u, "kernel {k} samples, user {u}");
    let shares: f64 = fns.iter().map(|f| f["share"].as_f64().unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-6, "shares add up to {shares}");
    // The table says the share on its summary line.
    let out = Command::new(cpi_bpf()).arg("--").args(dd).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("% in the kernel"), "{table}");
    let out = Command::new(cpi_bpf())
        .args(["--user-only", "--format", "json", "--"])
        .args(dd)
        .output()
        .unwrap();
    let p = cpi_tests::stdout_json(&out);
    assert!(
        !p.to_string().contains("\"[kernel]\""),
        "--user-only has no kernel samples"
    );
}

/// `--version` names the commit; `--help` speaks the user's words, not the design's.
#[test]
fn version_has_the_commit_and_help_no_internal_words() {
    let out = run(&["--version"]);
    let v = String::from_utf8_lossy(&out.stdout);
    let commit = v
        .trim()
        .strip_prefix(&format!("cpi-bpf {} (", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{v}"));
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        hash == "unknown" || (hash.len() == 12 && hash.chars().all(|c| c.is_ascii_hexdigit())),
        "{v}"
    );
    for cmd in [
        &["--help"][..],
        &["simulate", "--help"],
        &["import-perf", "--help"],
    ] {
        let help = String::from_utf8_lossy(&run(cmd).stdout).to_lowercase();
        for word in ["seed 00", "on a timer"] {
            assert!(!help.contains(word), "{cmd:?} says {word:?}");
        }
    }
}

/// Each main flag (`-p`, `-a`, `-F`, `-o`, `--format`) as the man page and each shell's
/// completions declare an option: the page's entry, zsh's spec, fish's `-s`/`-l`, bash's
/// word list.
fn assert_docs_name_the_main_flags(dir: &std::path::Path) {
    let read = |rel: &str| {
        std::fs::read_to_string(dir.join(rel))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(rel).display()))
    };
    // roff escapes every dash.
    let man = read("man/cpi-bpf.1").replace("\\-", "-");
    let bash = read("completions/cpi-bpf.bash");
    let bash_words: Vec<&str> = bash
        .split(|c: char| c.is_whitespace() || c == '"')
        .collect();
    let zsh = read("completions/_cpi-bpf");
    let fish = read("completions/cpi-bpf.fish");
    for (short, long) in [
        (Some('p'), "pid"),
        (Some('a'), "system-wide"),
        (Some('F'), "frequency"),
        (Some('o'), "output"),
        (None, "format"),
    ] {
        let (man_entry, zsh_spec, fish_spec) = match short {
            Some(s) => (
                format!("\\fB-{s}\\fR, \\fB--{long}\\fR"),
                format!("-{s}"),
                format!("-s {s} -l {long} "),
            ),
            None => (
                format!("\\fB--{long}\\fR"),
                format!("--{long}"),
                format!("-l {long} "),
            ),
        };
        assert!(man.contains(&man_entry), "man page lacks {man_entry}");
        assert!(
            ["+[", "[", "=["]
                .iter()
                .any(|end| zsh.contains(&format!("{zsh_spec}{end}"))),
            "zsh completions lack {zsh_spec}"
        );
        assert!(
            fish.contains(&fish_spec),
            "fish completions lack {fish_spec}"
        );
        for flag in short
            .map(|s| format!("-{s}"))
            .into_iter()
            .chain([format!("--{long}")])
        {
            assert!(
                bash_words.contains(&flag.as_str()),
                "bash completions lack {flag}"
            );
        }
    }
}

/// The man page and completions come from the CLI definition (`generate-docs`), and
/// `cargo xtask setup` has put them beside the binary (target/release/man, completions).
#[test]
fn man_page_and_completions_name_the_main_flags() {
    let dir = temp_dir("docs");
    let out = run(&["generate-docs", &dir.to_string_lossy()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_docs_name_the_main_flags(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let installed = cpi_bpf().parent().expect("the binary's folder");
    if installed.join("man/cpi-bpf.1").exists() {
        assert_docs_name_the_main_flags(installed);
    } else {
        let msg = format!(
            "no man page in {}: `cargo xtask setup` (or `cargo xtask docs`) writes it",
            installed.display()
        );
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        cpi_tests::skip(&msg);
    }
}

/// Every flag README's Usage block shows for a command is one that command's `--help`
/// lists, so the two cannot drift apart.
#[test]
fn every_flag_in_readme_usage_is_in_help() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let usage = readme
        .split_once("\n## Usage\n")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("README has a ## Usage section with a code block");
    // A line starting `cpi-bpf SUB` opens SUB's synopsis; the indented lines continue it.
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut sub = String::new();
    for line in usage.lines() {
        if let Some(rest) = line.strip_prefix("cpi-bpf") {
            sub = rest
                .split_whitespace()
                .next()
                .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                .unwrap_or("")
                .to_string();
        }
        for word in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
            let name = word.trim_start_matches('-');
            let dashes = word.len() - name.len();
            let is_flag = match dashes {
                1 => name.len() == 1,
                2 => name.len() > 1,
                _ => false,
            };
            if is_flag && name.starts_with(|c: char| c.is_ascii_alphabetic()) {
                flags.push((sub.clone(), word.to_string()));
            }
        }
    }
    assert!(
        flags.len() > 40 && flags.iter().any(|(s, f)| s.is_empty() && f == "-p"),
        "parsed too little of README's Usage: {flags:?}"
    );
    let mut help = std::collections::HashMap::new();
    for (sub, flag) in &flags {
        let text = help.entry(sub.clone()).or_insert_with(|| {
            let args: Vec<&str> = [sub.as_str(), "--help"]
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect();
            String::from_utf8_lossy(&run(&args).stdout).into_owned()
        });
        // `--help` lists each as `-p, --pid <PID>` or `--format <FORMAT>`.
        let listed = text
            .lines()
            .any(|l| l.trim_start().split([',', ' ']).any(|w| w == flag.as_str()));
        assert!(
            listed,
            "README's Usage shows `cpi-bpf {sub} … {flag}`; its --help does not list {flag}"
        );
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headings of a Markdown file (outside code blocks).
fn headings(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && l.starts_with('#') {
            out.push(l.trim_start_matches('#').trim().to_string());
        }
    }
    out
}

/// The user's documents link to files and sections that exist, and every section a
/// source comment cites (`README.md, "Usage"`, `docs/METHOD.md, "Perturbation"`,
/// `BENCHMARKS.md, "Analysis"`) is a heading of that document: moving the method out of
/// README, or a benchmark's figures, leaves no dead reference.
#[test]
fn doc_links_and_cited_sections_resolve() {
    let root = cpi_tests::workspace_root();
    let read = |rel: &str| {
        std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    for doc in ["README.md", "docs/METHOD.md", "BENCHMARKS.md"] {
        let text = read(doc);
        let dir = std::path::Path::new(doc)
            .parent()
            .unwrap_or(std::path::Path::new(""));
        let mut links = 0;
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let Some(target) = rest.split(')').next() else {
                continue;
            };
            if target.starts_with("http") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            links += 1;
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                doc.to_string()
            } else {
                dir.join(file).to_string_lossy().into_owned()
            };
            let path = root.join(&file);
            assert!(
                path.exists(),
                "{doc} links to {target}: {} does not exist",
                path.display()
            );
            if !frag.is_empty() {
                let anchors: Vec<String> =
                    headings(&read(&file)).iter().map(|h| anchor(h)).collect();
                assert!(
                    anchors.iter().any(|a| a == frag),
                    "{doc} links to {target}: no such section in {file}"
                );
            }
        }
        assert!(
            doc == "BENCHMARKS.md" || links > 0,
            "{doc}: no links parsed"
        );
    }
    // Comments cite a section as `DOC, "Title` (the title may continue on the next
    // comment line); the heading starts with the cited words.
    let mut sources = Vec::new();
    let mut dirs = vec![
        root.join("cpi-user/src"),
        root.join("cpi-agent/src"),
        root.join("cpi-bpf/src"),
        root.join("cpi-common/src"),
        root.join("cpi-ebpf/src"),
        root.join("tests"),
        root.join("xtask/src"),
    ];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                sources.push(p);
            }
        }
    }
    sources.extend([root.join("Cargo.toml"), root.join("BENCHMARKS.md")]);
    let docs = [
        ("docs/METHOD.md", headings(&read("docs/METHOD.md"))),
        ("README.md", headings(&read("README.md"))),
        ("BENCHMARKS.md", headings(&read("BENCHMARKS.md"))),
    ];
    let mut cited = 0;
    for src in &sources {
        let text = std::fs::read_to_string(src).unwrap();
        // One line per comment sentence: continuation markers folded into spaces.
        let flat: String = text
            .lines()
            .map(|l| {
                l.trim_start()
                    .trim_start_matches("//!")
                    .trim_start_matches("///")
                    .trim_start_matches("//")
                    .trim_start_matches('#')
                    .trim()
            })
            .collect::<Vec<_>>()
            .join(" ");
        for (doc, heads) in &docs {
            for form in [format!("{doc}, \""), format!("{doc} \"")] {
                for (i, _) in flat.match_indices(&form) {
                    let title = flat[i + form.len()..].split('"').next().unwrap_or("");
                    cited += 1;
                    assert!(
                        heads.iter().any(|h| h.starts_with(title)),
                        "{} cites {doc}, \"{title}\": no such section",
                        src.display()
                    );
                }
            }
        }
    }
    assert!(cited > 10, "found only {cited} cited sections");
}

/// A process that maps thousands of files that are not code: one warning says how many
/// and names the first few (not a line per file), their samples are in the loss account,
/// and `-v` names each with its reason.
#[test]
fn unusable_mapped_files_are_one_warning_with_each_under_v() {
    if !require_root("profiling a process") {
        return;
    }
    let dir = temp_dir("cli-manymaps");
    // None: the compiler is missing, said (and failed under CI) by compile_c.
    let Some(prog) = cpi_tests::compile_c("manymaps.c", &dir, "manymaps", &[]) else {
        return;
    };
    let files = dir.join("files");
    std::fs::create_dir(&files).unwrap();
    let _cpu = cpu_heavy();
    let run_on = |extra: &[&str], json: &std::path::Path| {
        let out = Command::new(cpi_bpf())
            .args(["-F", "999", "-o"])
            .arg(json)
            .args(extra)
            .arg(&prog)
            .arg(&files)
            .args(["2000", "3"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    // The summary's count: `cpi-bpf: warning: N mapped files unusable, …`.
    let summary = |err: &str| -> Option<u64> {
        err.lines()
            .find_map(|l| l.strip_prefix("cpi-bpf: warning: "))
            .and_then(|l| {
                l.split_once(" mapped files unusable, their samples counted as unmapped: ")
            })
            .map(|(n, _)| n.parse().unwrap())
    };
    let json = dir.join("p.json");
    let err = run_on(&[], &json);
    let per_file = |err: &str| {
        err.lines()
            .filter(|l| l.contains("not an ELF file"))
            .count() as u64
    };
    let n = summary(&err).unwrap_or_else(|| panic!("no summary warning:\n{err}"));
    assert!(n >= 2, "{err}");
    assert_eq!(per_file(&err), 0, "a line per file without -v:\n{err}");
    if n > 3 {
        assert!(
            err.contains(&format!(" and {} more (each with its reason: -v)", n - 3)),
            "{err}"
        );
    }
    // Counted, but not one per file: a file can also be found unusable through a stack
    // frame of a sample placed elsewhere (a kernel sample whose user frames start there);
    // seen once under load: 53 files, 51 unmapped samples.
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let unmapped = p["lost"]["unmapped_samples"].as_u64().unwrap();
    assert!(unmapped > 0, "{n} unusable files, no unmapped samples");

    let err = run_on(&["-v"], &json);
    let n = summary(&err).unwrap_or_else(|| panic!("no summary warning with -v:\n{err}"));
    assert_eq!(per_file(&err), n, "-v names each file once:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
