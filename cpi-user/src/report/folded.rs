//! Folded (collapsed) stacks, Brendan Gregg's format as `stackcollapse-perf.pl` writes
//! it and flamegraph.pl, inferno and speedscope read it: one line per call path,
//! `comm;root;…;leaf COUNT`, frames root first, the process name as the outermost frame,
//! kernel frames marked `_[k]`.
//!
//! COUNT is the path's **IP samples** (cycles samples, or `cpu-clock` samples in a time
//! profile): integers, as the format wants; each sample stands for about one period.
//! Samples without a stack are the `[no stack]` path; a caller's narrow paths beyond the
//! profile's bound, and its stacks evicted by the memory bound, its `[rare callees]`
//! path (cpi-user/src/profile/paths.rs); evicted stacks with no caller held the
//! `[dropped]` path, so the counts sum
//! to the process's samples. A process whose samples carried no stacks at all is written
//! leaf-only, `comm;function COUNT` per function.
//!
//! Names are foreign strings: control characters are escaped (cpi-user/src/fsafe/text.rs),
//! `;` (the separator) becomes `:`, and a line never breaks.

use std::fmt::Write;

use crate::fsafe::escape;
use crate::profile::model::{Profile, StackFrame};

/// A frame or process name made safe for one field of a folded line.
fn field(name: &str) -> String {
    escape(name).replace(';', ":")
}

fn frame(f: &StackFrame) -> String {
    let name = field(&f.function);
    if f.binary == "[kernel]" {
        format!("{name}_[k]")
    } else {
        name
    }
}

/// The folded text of every process of `p`, hottest path first within each process.
pub fn render(p: &Profile) -> String {
    let mut out = String::new();
    for proc in &p.processes {
        let comm = field(if proc.comm.is_empty() {
            "?"
        } else {
            &proc.comm
        });
        if proc.stacks.is_empty() {
            for f in proc.functions.iter().filter(|f| f.samples > 0) {
                let _ = writeln!(out, "{comm};{} {}", field(&f.name), f.samples);
            }
            continue;
        }
        for s in proc.stacks.iter().filter(|s| s.samples > 0) {
            out.push_str(&comm);
            for f in s.frames.iter().rev() {
                out.push(';');
                out.push_str(&frame(f));
            }
            let _ = writeln!(out, " {}", s.samples);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_break_the_format() {
        let f = StackFrame {
            function: "a;b\nc".into(),
            binary: "[kernel]".into(),
            address: 0,
        };
        assert_eq!(frame(&f), "a:b\\nc_[k]");
    }
}
