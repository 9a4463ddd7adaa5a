//! A profile as the terminal shows it: every string another process controls (command,
//! comm, function and binary names) escaped with cpi-user/src/fsafe/text.rs, so a thread
//! named `"\x1b[2J…\nFAKE"` prints as text. The JSON file keeps the raw strings.

use std::borrow::Cow;

use crate::fsafe::escape;
use crate::profile::Profile;

/// A copy of `p` with its foreign strings escaped (a table is rendered once: the copy
/// costs less than the rendering).
pub fn escaped(p: &Profile) -> Profile {
    let mut q = p.clone();
    let each = |s: &mut String| {
        if let Cow::Owned(e) = escape(s) {
            *s = e;
        }
    };
    q.command.iter_mut().for_each(each);
    for b in &mut q.binaries {
        each(&mut b.path);
    }
    for proc in &mut q.processes {
        each(&mut proc.comm);
        for f in &mut proc.functions {
            each(&mut f.name);
            each(&mut f.binary);
        }
        for c in &mut proc.calls {
            for s in [
                &mut c.caller,
                &mut c.caller_binary,
                &mut c.callee,
                &mut c.callee_binary,
            ] {
                each(s);
            }
        }
        for fr in proc.stacks.iter_mut().flat_map(|s| s.frames.iter_mut()) {
            each(&mut fr.function);
            each(&mut fr.binary);
        }
    }
    if let Some(a) = &mut q.accuracy {
        for f in &mut a.functions {
            each(&mut f.name);
            each(&mut f.binary);
        }
    }
    q
}
