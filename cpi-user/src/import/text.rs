//! `perf script` text: read in two passes (mappings, comms and what the stacks carry,
//! then the samples), each line bounded by [`MAX_LINE_BYTES`].

use super::*;

/// Calls `f` with each line of `r` (1-based number, text without its line end; invalid
/// UTF-8 replaced: comm names may hold anything); a line over [`MAX_LINE_BYTES`] ends
/// the read with an error.
pub(super) fn for_each_line(
    mut r: impl BufRead,
    what: &str,
    mut f: impl FnMut(usize, &str),
) -> Result<(), ImportError> {
    let mut buf = Vec::new();
    for n in 1.. {
        buf.clear();
        let got = (&mut r)
            .take(MAX_LINE_BYTES as u64 + 2)
            .read_until(b'\n', &mut buf)
            .map_err(ImportError::io(what))?;
        if got == 0 {
            break;
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(ImportError::LongLine {
                what: what.into(),
                line: n,
                limit: MAX_LINE_BYTES,
            });
        }
        f(n, &String::from_utf8_lossy(&buf));
    }
    Ok(())
}

/// Imports `perf script` text (`what` names it in messages and the mode line).
///
/// Text without a single branch stack is refused with one line saying what was
/// expected:
///
/// ```
/// use cpi_user::import::{import_text, ImportError, ImportOptions};
///
/// let text = "gzip 4242/4242: 401136 deflate+0x16 (/usr/bin/gzip)\n";
/// let err = import_text(text, "gzip.txt", &ImportOptions::default()).unwrap_err();
/// assert!(matches!(err, ImportError::PerfScript { .. }));
/// let line = cpi_user::chain(&err);
/// assert!(line.contains("no branch stacks found"), "{line}");
/// ```
pub fn import_text(text: &str, what: &str, opts: &ImportOptions) -> Result<Imported, ImportError> {
    Ok(load_text(text, what, opts)?.analyze(&opts.analysis))
}

/// Reads `perf script` text held in memory into samples ([`import_text`] without the
/// analysis).
pub fn load_text(text: &str, what: &str, opts: &ImportOptions) -> Result<Loaded, ImportError> {
    load_lines(|| Ok(text.as_bytes()), what, opts)
}

/// Reads `perf script` text in two passes over `open()`'s lines: the mappings, comms
/// and what the stacks carry, then the samples straight into the aggregate.
pub(super) fn load_lines<R: BufRead>(
    mut open: impl FnMut() -> std::io::Result<R>,
    what: &str,
    opts: &ImportOptions,
) -> Result<Loaded, ImportError> {
    let io = ImportError::io(what);
    let parse_opts = perf_script::ImportOptions {
        offsets: opts.offsets,
        period: opts.period.max(1),
        period_field: opts.period_field,
    };
    let mut scan = perf_script::Scan::new(parse_opts);
    for_each_line(open().map_err(io)?, what, |n, l| scan.line(n, l))?;
    let (mut placed, refused) = finish_scan(scan, what)?;
    let est = opts.text_event;
    let (n, timed, per_sample) = (placed.samples, placed.timed, placed.per_sample);
    let weighting =
        stack_weighting(opts.stack_weighting, est, timed).map_err(|why| ImportError::Unusable {
            what: what.into(),
            why,
        })?;
    let corrected = est == Estimator::Cycles && weighting == StackWeighting::CyclesSpanned;
    let mut set = SampleSet::new(opts.window);
    set.weighting = weighting;
    let mut add = |(mut s, stack): perf_script::StackedSample| {
        match est {
            // Cycles: each perf sample is also a cycles IP sample.
            Estimator::Cycles => {
                let ip = IpSample {
                    header: SampleHeader {
                        version: WIRE_VERSION,
                        kind: SampleKind::Ip as u16,
                        event: EventRole::Cycles as u32,
                        nr: 0,
                        ..s.header
                    },
                };
                // A known role: the aggregate refuses only unknown ones.
                let _ = set.add_ip_with_stack(&ip, stack.as_ref());
            }
            Estimator::Other => s.header.period = 1,
            Estimator::TakenBranches => {}
        }
        set.add_branch_with_stack(&s, stack.as_ref());
    };
    for_each_line(open().map_err(io)?, what, |_, l| placed.line(l, &mut add))?;
    placed.finish(&mut add);
    let import = placed.import;
    let mut notes = text_notes(&import, n, &refused);
    import.place(&mut set);
    let said = relocate(&mut set, &opts.locator, &BTreeMap::new(), what)?;
    notes.extend(said.notes);
    let events = text_events(est, parse_opts.period, n);
    let periods = if per_sample {
        "each sample's own period (-F period)"
    } else if opts.period > 1 {
        "period from --period"
    } else {
        "no period in the text and no --period: each sample weighs 1, counts are relative"
    };
    let meaning = text_meaning(est, corrected);
    let timed_note = timed_note(timed);
    let run = RunInfo {
        mode: if est == Estimator::Cycles {
            Mode::Cpi
        } else {
            Mode::Instructions
        },
        mode_reason: format!(
            "imported from perf script text {what} ({periods}): {meaning}{timed_note}"
        ),
        command: Vec::new(),
        duration_secs: 0.0,
        events,
        perturbation: Perturbation::None,
        lost: LossReport::default(),
    };
    notes.extend(untimed_note(&set));
    let withheld = cpi_withheld(
        est,
        &run.events[0].name,
        corrected,
        est == Estimator::Cycles,
    );
    Ok(Loaded {
        set,
        run,
        notes,
        details: said.details,
        unusable: said.files,
        // perf script names no build-id: its kernel is taken as this one, as perf does.
        other_kernel: false,
        arch: None,
        cpi_withheld: withheld,
        by_instructions: est != Estimator::Cycles,
    })
}

/// The event of a perf script import whose stacks count `est`, sampled with `period`:
/// `n` samples, their cycles too where the stacks were sampled on cycles.
fn text_events(est: Estimator, period: u64, n: u64) -> Vec<EventInfo> {
    let (name, also) = match est {
        Estimator::TakenBranches => ("taken branches (--event)", Vec::new()),
        Estimator::Cycles => ("cycles (perf record -b)", vec![EventRole::Cycles]),
        Estimator::Other => ("another event (--event)", Vec::new()),
    };
    vec![EventInfo {
        role: EventRole::Branches,
        name: name.into(),
        period,
        jitter: 0,
        thinning: 1,
        unit: EventUnit::Events,
        samples: n,
        also,
    }]
}

/// What a perf script import whose stacks count `est` says, for its mode line.
fn text_meaning(est: Estimator, corrected: bool) -> &'static str {
    match est {
        Estimator::Cycles if corrected => {
            "taken as cycles (perf record -b's default; --event says \
             otherwise): cycles per function from the periods; instruction counts from the \
             stacks weighted by period / cycles each window spans (timed entries; corrects \
             cycle sampling's bias towards slow code); CPI = cycles / those counts"
        }
        Estimator::Cycles => {
            "taken as cycles (perf record -b's default; --event says \
             otherwise): cycles per function from the periods; the instruction profile is \
             relative (stacks sampled on cycles): no CPI from it"
        }
        Estimator::TakenBranches => {
            "taken-branch event (--event): instruction counts from \
             the periods, shares of instructions; the text holds no cycles: no cycles, no CPI"
        }
        Estimator::Other => {
            "another event (--event): a relative instruction profile (each \
             sample weighs 1), shares of instructions; no cycles, no CPI"
        }
    }
}

/// The mode line's note on timed branch entries, where the stacks had any.
pub(super) fn timed_note(timed: bool) -> &'static str {
    if timed {
        "; timed CPI from the cycles the branch entries carry (timed LBR)"
    } else {
        ""
    }
}

/// Places the text's dsos by their ELF headers ([`perf_script::Scan::finish`]); with,
/// by dso, the refusal of each one the recording's user cannot read (as root:
/// cpi-user/src/fsafe/behalf.rs).
fn finish_scan(
    scan: perf_script::Scan,
    what: &str,
) -> Result<(perf_script::Placed, BTreeMap<String, String>), ImportError> {
    use crate::{binary::BinaryError, fsafe::OpenError};
    let refused = std::cell::RefCell::new(BTreeMap::new());
    let read_elf = |p: &Path| match perf_script::elf_layout(p) {
        Ok(l) => Some(l),
        Err(BinaryError::Open(e @ OpenError::NotReadable { .. })) => {
            let dso = p.display().to_string();
            refused.borrow_mut().insert(dso, e.to_string());
            None
        }
        Err(_) => None,
    };
    let placed = scan
        .finish(&read_elf)
        .map_err(|source| ImportError::PerfScript {
            what: what.into(),
            source,
        })?;
    Ok((placed, refused.into_inner()))
}

/// What to say about the text; `refused`: dsos not opened, and why ([`finish_scan`]).
fn text_notes(
    import: &PerfImport,
    samples: u64,
    refused: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if import.malformed_lines > 0 {
        notes.push(format!(
            "{} malformed lines dropped ({samples} samples read); the first at {}",
            import.malformed_lines,
            import.first_malformed.as_deref().unwrap_or("?")
        ));
    }
    for dso in &import.unplaced {
        if let Some(why) = refused.get(dso) {
            notes.push(why.clone());
            continue;
        }
        notes.push(format!(
            "{dso}: cannot place its runtime addresses (PIE or shared library without mmap \
             events): re-run `perf script` with --show-mmap-events, or use brstackoff"
        ));
    }
    if import.unplaced_frames > 0 {
        notes.push(format!(
            "{} callchain frames lie in no mapping of their dso: kept as printed (re-run \
             `perf script` with --show-mmap-events)",
            import.unplaced_frames
        ));
    }
    if import.ips_at_branch_target > 0 {
        notes.push(format!(
            "{} sample ips are runtime addresses no mapping holds (brstackoff without mmap \
             events): each is taken at its newest branch target",
            import.ips_at_branch_target
        ));
    }
    if import.truncated_stacks > 0 {
        notes.push(format!(
            "{} branch stacks were deeper than {} entries; the newest were kept",
            import.truncated_stacks,
            cpi_common::wire::MAX_BRANCH_ENTRIES
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endless_input_is_bounded() {
        let zeros = std::io::BufReader::new(std::io::repeat(0));
        let e = for_each_line(zeros, "zeros", |_, _| {}).unwrap_err();
        assert!(matches!(e, ImportError::LongLine { line: 1, .. }), "{e}");
        // Lines of exactly the limit pass, with and without their line end.
        let max = "x".repeat(MAX_LINE_BYTES);
        let text = format!("{max}\r\n\n{max}");
        let mut lines = Vec::new();
        for_each_line(text.as_bytes(), "t", |n, l| lines.push((n, l.len()))).unwrap();
        assert_eq!(lines, [(1, MAX_LINE_BYTES), (2, 0), (3, MAX_LINE_BYTES)]);
        let long = format!("a\n{max}y\n");
        let e = for_each_line(long.as_bytes(), "t", |_, _| {}).unwrap_err();
        assert!(matches!(e, ImportError::LongLine { line: 2, .. }), "{e}");
    }
}
