//! `report`: show a profile file written with `--output` again, in any format.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use cpi_agent::store;
use cpi_user::fsafe::escape;
use cpi_user::profile::Profile;
use cpi_user::report::file;
use cpi_user::report::time::rfc3339_seconds;

use crate::output::{emit, emit_range, OutputArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A profile file written with `--format json -o FILE`, or one window of an
    /// agent's store (`w-….json.gz`); `-` reads standard input.
    #[arg(value_name = "FILE", conflicts_with = "store")]
    pub file: Option<PathBuf>,
    /// Merge the windows of an agent's store (cpi-bpf agent --store DIR) instead.
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// With --store: windows since TIME, or since DURATION ago (1h, 30m, 2d).
    #[arg(long, value_name = "TIME|DURATION", requires = "store", value_parser = store_time)]
    pub since: Option<SystemTime>,
    /// With --store: windows until TIME, or until DURATION ago.
    #[arg(long, value_name = "TIME|DURATION", requires = "store", value_parser = store_time)]
    pub until: Option<SystemTime>,
    /// With --store: only processes named NAME.
    #[arg(long, value_name = "NAME", requires = "store")]
    pub comm: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let Some(file) = args.file else {
        let Some(dir) = args.store else {
            anyhow::bail!(
                "report: which profile? give FILE (written with --format json -o FILE), `-` \
                 for standard input, or --store DIR (an agent's store)"
            );
        };
        let q = store::RangeQuery {
            since: args.since,
            until: args.until,
            comm: args.comm,
        };
        let r = read_store_range(&dir, &q)?;
        emit_range(&r.profile, &r.series, &args.output)?;
        return Ok(0);
    };
    let input = crate::open_recording(&file, Vec::new(), Vec::new())?;
    let origin = if file.as_os_str() == "-" {
        "on standard input".to_string()
    } else {
        file.display().to_string()
    };
    let profile = file::read_stream(input, &origin)?;
    warn_unread(&profile, &origin);
    emit(&profile, &args.output)?;
    Ok(0)
}

/// Reads the profile file `path`, saying on stderr which of its processes were left out.
pub fn read_profile(path: &Path) -> anyhow::Result<Profile> {
    let p = file::read(path)?;
    warn_unread(&p, &path.display().to_string());
    Ok(p)
}

/// A line on stderr for each process of `origin` the reader left out, over its bounds.
fn warn_unread(p: &Profile, origin: &str) {
    for why in &p.unread {
        eprintln!("cpi-bpf: warning: {}", escape(&format!("{origin}: {why}")));
    }
}

/// The merged windows of `dir` that `q` selects, saying on stderr what was skipped and
/// what was merged (`report --store`, `diff --store`).
pub fn read_store(dir: &Path, q: &store::RangeQuery) -> anyhow::Result<Profile> {
    Ok(read_store_range(dir, q)?.profile)
}

/// [`read_store`], with each window's totals.
fn read_store_range(dir: &Path, q: &store::RangeQuery) -> anyhow::Result<store::RangeProfile> {
    let r = store::read_range(dir, q)?;
    for (path, why) in &r.skipped {
        let line = format!("skipped {}: {why}", path.display());
        eprintln!("cpi-bpf: warning: {}", escape(&line));
    }
    if r.skipped_unnamed > 0 {
        eprintln!(
            "cpi-bpf: warning: skipped {} more unreadable windows",
            r.skipped_unnamed
        );
    }
    if r.not_indexed > 0 {
        eprintln!(
            "cpi-bpf: warning: the store holds more than {} windows: the {} oldest were not read",
            store::MAX_INDEX,
            r.not_indexed
        );
    }
    eprintln!(
        "cpi-bpf: {} windows from {} to {} merged ({})",
        r.windows,
        rfc3339_seconds(r.first_start),
        rfc3339_seconds(r.last_end),
        dir.display()
    );
    Ok(r)
}

/// `--since`/`--until`: an RFC 3339 time (`2026-11-23T02:00:00Z`), `@UNIX_SECONDS`, or
/// a duration ago (`1h`, `90m`).
pub fn store_time(s: &str) -> Result<SystemTime, String> {
    if let Some(secs) = s.strip_prefix('@') {
        let n: u64 = secs.parse().map_err(|_| format!("not Unix seconds: {s}"))?;
        return SystemTime::UNIX_EPOCH
            .checked_add(std::time::Duration::from_secs(n))
            .ok_or_else(|| format!("beyond the times this system can hold: {s}"));
    }
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t);
    }
    let ago = humantime::parse_duration(s)
        .map_err(|_| format!("not a time (2026-11-23T02:00:00Z, @SECS) or a duration (1h): {s}"))?;
    SystemTime::now()
        .checked_sub(ago)
        .ok_or_else(|| format!("too far back: {s}"))
}
