//! Times as reports show them: RFC 3339 to the second (`2026-11-23T02:00:00Z`), as
//! `--since`/`--until` take them. A time outside what RFC 3339 can write (after year
//! 9999, before 1970: a store window's name, a `--since @SECS`, a series point of a
//! file) is written `@SECS`, the other form those options take, instead of panicking
//! in the formatter.

use std::time::{SystemTime, UNIX_EPOCH};

/// The last second RFC 3339 can write: 9999-12-31T23:59:59Z.
const LAST_RFC3339_SECOND: u64 = 253_402_300_799;

/// `t` as RFC 3339 to the second, else `@SECS` (`@-SECS` before 1970).
pub fn rfc3339_seconds(t: SystemTime) -> String {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.as_secs() <= LAST_RFC3339_SECOND => {
            humantime::format_rfc3339_seconds(t).to_string()
        }
        Ok(d) => format!("@{}", d.as_secs()),
        Err(e) => format!("@-{}", e.duration().as_secs()),
    }
}

/// `secs` since the epoch as [`rfc3339_seconds`] writes it; not a number (a file's
/// `NaN`) is the epoch, and beyond any time the system holds is `@SECS` still.
pub fn rfc3339_of_secs(secs: f64) -> String {
    let secs = if secs.is_nan() { 0.0 } else { secs };
    let d = std::time::Duration::try_from_secs_f64(secs.abs()).ok();
    let t = match (secs < 0.0, d) {
        (false, Some(d)) => UNIX_EPOCH.checked_add(d),
        (true, Some(d)) => UNIX_EPOCH.checked_sub(d),
        (_, None) => None,
    };
    t.map_or_else(|| format!("@{secs:.0}"), rfc3339_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn any_time_is_written_without_panicking() {
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(rfc3339_seconds(at(1_795_000_000)), "2026-11-18T11:06:40Z");
        assert_eq!(
            rfc3339_seconds(at(LAST_RFC3339_SECOND)),
            "9999-12-31T23:59:59Z"
        );
        assert_eq!(
            rfc3339_seconds(at(LAST_RFC3339_SECOND + 1)),
            "@253402300800"
        );
        assert_eq!(rfc3339_seconds(UNIX_EPOCH - Duration::from_secs(5)), "@-5");
        assert_eq!(rfc3339_of_secs(1_795_000_000.4), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339_of_secs(f64::NAN), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_of_secs(-3.0), "@-3");
        assert_eq!(rfc3339_of_secs(1e300), format!("@{:.0}", 1e300));
        assert_eq!(rfc3339_of_secs(f64::INFINITY), "@inf");
    }
}
