//! Debian's Chromium, headless, on a page from disk: the DOM after the page's scripts
//! ran (`--dump-dom`), a screenshot, and every connection the page tried to open. All
//! of Chromium's traffic goes to a proxy on loopback that only notes the request line
//! and closes, so "no network request" is something a test can see fail. Chromium's
//! own calls home (its updater and account service, made whatever the page and flags)
//! are told apart by host and left out.

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";

/// What Chromium made of a page.
pub struct Visit {
    /// The serialised DOM after load.
    pub dom: String,
    /// The request lines of connections made for the page (`GET http://…`,
    /// `CONNECT host:443`), Chromium's own left out.
    pub requests: Vec<String>,
}

/// Hosts Chromium calls on its own at every start (component updater, network time,
/// accounts), seen here with every background-networking flag given.
const CHROMIUMS_OWN: &[&str] = &[
    "update.googleapis.com",
    "clients2.google.com",
    "accounts.google.com",
];

/// A proxy that notes the first line of each request made to it and answers none.
/// A connection closed without a byte sent asked for nothing (Chromium exiting
/// between its connect and its request line): it is not noted. One silent for
/// [`SILENT`] is, as "(nothing sent)" (this waited 500 ms and noted an empty close too,
/// and the suite failed once under its own load on such a connection). Each
/// connection is read on its own thread, so a silent one holds up no other; the count
/// says how many are still being read.
fn noting_proxy() -> (u16, Arc<Mutex<Vec<String>>>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().unwrap().port();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let reading = Arc::new(AtomicUsize::new(0));
    let (seen, open) = (Arc::clone(&lines), Arc::clone(&reading));
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            open.fetch_add(1, Ordering::SeqCst);
            let (seen, open) = (Arc::clone(&seen), Arc::clone(&open));
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(SILENT));
                let mut buf = [0u8; 4096];
                let line = match conn.read(&mut buf) {
                    Ok(0) => None,
                    Ok(n) => Some(
                        (String::from_utf8_lossy(&buf[..n]).lines().next())
                            .unwrap_or_default()
                            .to_string(),
                    ),
                    Err(_) => Some("(nothing sent)".to_string()),
                };
                seen.lock().unwrap().extend(line);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (port, lines, reading)
}

/// How long a connection to the proxy may stay open without sending its request
/// line before it is noted as a request anyway (long enough for a loaded machine).
const SILENT: Duration = Duration::from_secs(5);

/// Opens `page` headless: the DOM (`--dump-dom`) and, when `screenshot` is given, a
/// picture of its first 1400×1000 pixels. `None` after [`crate::skip`] when Chromium
/// is not installed.
pub fn visit(page: &Path, screenshot: Option<&Path>) -> Option<Visit> {
    if !Path::new(CHROMIUM).exists() {
        crate::skip(format_args!(
            "{CHROMIUM} is not installed; run `cargo xtask setup`"
        ));
        return None;
    }
    let (port, requests, reading) = noting_proxy();
    // A profile directory per visit: Chromium refuses one another instance holds.
    static VISITS: AtomicUsize = AtomicUsize::new(0);
    let n = VISITS.fetch_add(1, Ordering::Relaxed);
    let profile = crate::temp_dir(&format!("chromium-profile-{n}"));
    let run = |extra: &[String]| {
        let out = Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--no-service-autorun",
                "--disable-domain-reliability",
                "--no-pings",
                "--disable-client-side-phishing-detection",
                "--window-size=1400,1000",
                "--proxy-bypass-list=<-loopback>",
            ])
            .arg(format!("--proxy-server=http://127.0.0.1:{port}"))
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(format!("file://{}", page.display()))
            .output()
            .expect("running chromium");
        assert!(out.status.success(), "chromium: {}", crate::stderr(&out));
        out
    };
    let dom = String::from_utf8(run(&["--dump-dom".into()]).stdout).expect("UTF-8 DOM");
    if let Some(png) = screenshot {
        run(&[format!("--screenshot={}", png.display())]);
        assert!(
            png.metadata().is_ok_and(|m| m.len() > 10_000),
            "{}",
            png.display()
        );
    }
    let _ = std::fs::remove_dir_all(&profile);
    // Let the proxy's accept loop see a connection made just before exit, then let
    // every connection it accepted be read (Chromium's exit closed them all).
    std::thread::sleep(Duration::from_millis(300));
    let read_by = Instant::now() + SILENT + Duration::from_secs(1);
    while reading.load(Ordering::SeqCst) > 0 && Instant::now() < read_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let requests = requests
        .lock()
        .unwrap()
        .iter()
        .filter(|l| {
            !CHROMIUMS_OWN
                .iter()
                .any(|h| l.contains(&format!("{h}/")) || l.contains(&format!("{h}:")))
        })
        .cloned()
        .collect();
    Some(Visit { dom, requests })
}

/// The elements of `dom` with tag `tag` and a `class` of exactly `class`, each as its
/// attributes (entities decoded) plus its text up to the next tag as `#text`.
pub fn elements(dom: &str, tag: &str, class: &str) -> Vec<HashMap<String, String>> {
    let open = regex::Regex::new(&format!(r#"<{tag}\b([^>]*)>([^<]*)"#)).unwrap();
    let attr = regex::Regex::new(r#"([a-zA-Z_:][-a-zA-Z0-9_:.]*)="([^"]*)""#).unwrap();
    open.captures_iter(dom)
        .filter_map(|c| {
            let mut m: HashMap<String, String> = attr
                .captures_iter(&c[1])
                .map(|a| (a[1].to_string(), unescape(&a[2])))
                .collect();
            (m.get("class").map(String::as_str) == Some(class)).then(|| {
                m.insert("#text".into(), unescape(&c[2]));
                m
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&#x2f;", "/")
        .replace("&amp;", "&")
}

/// Where a test leaves its screenshots: `target/screenshots/NAME.png`.
pub fn screenshot_path(name: &str) -> PathBuf {
    let dir = crate::workspace_root().join("target/screenshots");
    std::fs::create_dir_all(&dir).expect("target/screenshots");
    dir.join(format!("{name}.png"))
}

/// The string table of a page as written (report/html/mod.rs `Strings`): the names,
/// binaries and comms its frames and rows refer to by number.
pub fn page_strings(html: &str) -> Vec<String> {
    let open = r#"<script type="application/json" id="strings">"#;
    let at = html.find(open).expect("a string table") + open.len();
    let end = html[at..].find("</script>").expect("the table's end") + at;
    serde_json::from_str(&html[at..end]).expect("the string table is JSON")
}
