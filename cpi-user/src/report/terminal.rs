//! A profile as the terminal shows it: every string of it escaped with
//! cpi-user/src/fsafe/text.rs, so a thread named `"\x1b[2J…\nFAKE"` prints as text.
//! Not only what another process controls (command, comm, function and binary names,
//! cgroup and pod names): a profile file handed to `report` sets every field, the mode's
//! reason and the event names included. The JSON file keeps the raw strings. Source file
//! names stay raw here, as the file is read by them; they are escaped where shown
//! (table/annotate.rs).

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
    let each_opt = |s: &mut Option<String>| s.iter_mut().for_each(each);
    each(&mut q.tool_version);
    each(&mut q.mode_reason);
    each_opt(&mut q.recorded_on);
    q.command.iter_mut().for_each(each);
    for e in &mut q.events {
        each(&mut e.name);
    }
    for b in &mut q.binaries {
        each(&mut b.path);
        each_opt(&mut b.build_id);
    }
    for proc in &mut q.processes {
        each(&mut proc.comm);
        proc.identity.strings_mut().for_each(each_opt);
        for f in &mut proc.functions {
            each(&mut f.name);
            each(&mut f.binary);
            each_opt(&mut f.mangled);
            each_opt(&mut f.bolt_name);
            for e in &mut f.edges {
                each_opt(&mut e.to_function);
                each_opt(&mut e.to_binary);
            }
            for l in &mut f.lines {
                each(&mut l.text);
            }
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
        for p in &mut a.paths {
            p.frames.iter_mut().for_each(each);
        }
    }
    q
}
