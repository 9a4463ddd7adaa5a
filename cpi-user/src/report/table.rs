//! Human tables.

use std::fmt::Write;

use crate::profile::model::Profile;

/// Placeholder rendering: one line per function (replaced by the table views).
pub fn render(p: &Profile) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "mode: {:?} ({})", p.mode, p.mode_reason);
    let _ = writeln!(s, "lost samples: {}", p.lost_samples);
    for proc in &p.processes {
        let _ = writeln!(
            s,
            "pid {} ({}): {} samples",
            proc.pid, proc.comm, proc.samples
        );
        for f in &proc.functions {
            let _ = writeln!(
                s,
                "  {:>8} {:6.2}%  {}  [{}]",
                f.samples,
                f.share * 100.0,
                f.name,
                f.binary
            );
        }
    }
    s
}
