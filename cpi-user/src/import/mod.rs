//! Recordings made elsewhere → the same per-pid [`SampleSet`] as live samples, then
//! the normal analysis ([`crate::profile::analyze`]): `cpi-bpf import-perf`.
//!
//! Inputs: `perf script` branch-stack text ([`perf_script`]). Everything read is
//! bounded ([`MAX_TEXT_BYTES`], [`MAX_LINE_BYTES`]): a file that is not a recording
//! (`/dev/zero`) ends in one error, not in memory exhaustion.

pub mod perf_script;

use std::io::Read;
use std::path::Path;

use cpi_common::wire::{EventRole, IpSample, SampleHeader, SampleKind, WIRE_VERSION};

use crate::profile::model::{EventInfo, LossReport, Mode, Profile, RunInfo};
use crate::profile::{analyze, AnalysisOptions};
use perf_script::{PerfImport, PerfScriptError};

/// Largest `perf script` text read (it is held in memory while parsed).
pub const MAX_TEXT_BYTES: u64 = 512 << 20;
/// Longest text line: a 64-entry stack with long dso names is well under this.
pub const MAX_LINE_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: larger than {limit} bytes: not `perf script` text this tool reads whole")]
    TooLarge { what: String, limit: u64 },
    #[error(
        "{what}: line {line} is longer than {limit} bytes: not `perf script` text \
         (perf.data files start with PERFILE2)"
    )]
    LongLine {
        what: String,
        line: usize,
        limit: usize,
    },
    #[error("{what}: {source}")]
    PerfScript {
        what: String,
        #[source]
        source: PerfScriptError,
    },
}

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Newest ranges used per branch stack (seed 001's CBT window).
    pub window: usize,
    /// Text only: entries are `brstackoff` dso offsets rather than runtime addresses.
    pub offsets: bool,
    /// Text only: events each sample stands for (`perf record -c N`); 1 when unknown.
    pub period: u64,
    pub analysis: AnalysisOptions,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            window: 8,
            offsets: false,
            period: 1,
            analysis: AnalysisOptions::default(),
        }
    }
}

/// An imported recording, analysed.
#[derive(Clone, Debug)]
pub struct Imported {
    pub profile: Profile,
    /// What the user should know about the input (dropped lines, unplaced dsos, ...),
    /// one sentence each.
    pub notes: Vec<String>,
}

/// Imports `path` (`-` is standard input).
pub fn import_path(path: &Path, opts: &ImportOptions) -> Result<Imported, ImportError> {
    let what = path.display().to_string();
    let io = |source| ImportError::Io {
        what: what.clone(),
        source,
    };
    let text = if path.as_os_str() == "-" {
        read_text(std::io::stdin().lock(), &what)?
    } else {
        read_text(std::fs::File::open(path).map_err(io)?, &what)?
    };
    import_text(&text, &what, opts)
}

/// Reads text, bounded by [`MAX_TEXT_BYTES`] and [`MAX_LINE_BYTES`]; invalid UTF-8 is
/// replaced (comm names may hold anything).
fn read_text(mut r: impl Read, what: &str) -> Result<String, ImportError> {
    let mut data = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let (mut line, mut line_len) = (1usize, 0usize);
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(ImportError::Io {
                    what: what.into(),
                    source,
                })
            }
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                line += 1;
                line_len = 0;
            } else {
                line_len += 1;
                if line_len > MAX_LINE_BYTES {
                    return Err(ImportError::LongLine {
                        what: what.into(),
                        line,
                        limit: MAX_LINE_BYTES,
                    });
                }
            }
        }
        if (data.len() + n) as u64 > MAX_TEXT_BYTES {
            return Err(ImportError::TooLarge {
                what: what.into(),
                limit: MAX_TEXT_BYTES,
            });
        }
        data.extend_from_slice(&buf[..n]);
    }
    Ok(match String::from_utf8(data) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// Imports `perf script` text (`what` names it in messages and the mode line).
pub fn import_text(text: &str, what: &str, opts: &ImportOptions) -> Result<Imported, ImportError> {
    let parse_opts = perf_script::ImportOptions {
        offsets: opts.offsets,
        period: opts.period.max(1),
    };
    let import =
        perf_script::parse(text, parse_opts, &perf_script::elf_layout).map_err(|source| {
            ImportError::PerfScript {
                what: what.into(),
                source,
            }
        })?;
    let notes = text_notes(&import);
    // Each perf sample is also a cycles IP sample: `perf record -b` samples cycles.
    let ips: Vec<IpSample> = import
        .samples
        .iter()
        .map(|s| IpSample {
            header: SampleHeader {
                version: WIRE_VERSION,
                kind: SampleKind::Ip as u16,
                event: EventRole::Cycles as u32,
                nr: 0,
                ..s.header
            },
        })
        .collect();
    let n = import.samples.len() as u64;
    let mut set = import.into_sample_set(opts.window);
    for ip in &ips {
        set.process(ip.header.tgid)
            .ips
            .entry(EventRole::Cycles)
            .or_default()
            .add(ip);
    }
    let event = |role: &str| EventInfo {
        role: role.into(),
        name: "cycles (perf record -b)".into(),
        period: parse_opts.period,
        jitter: 0,
        thinning: 1,
        unit: "events".into(),
        samples: n,
    };
    let relative = if opts.period > 1 {
        String::new()
    } else {
        "; no --period: counts are relative".to_string()
    };
    let run = RunInfo {
        mode: Mode::Cpi,
        mode_reason: format!(
            "imported from perf script text {what}: cycles samples with branch stacks \
             (instruction counts scale with cycles, not taken branches){relative}"
        ),
        command: Vec::new(),
        duration_secs: 0.0,
        events: vec![event("branches"), event("cycles")],
        perturbation: "none".into(),
        lost: LossReport::default(),
    };
    Ok(Imported {
        profile: analyze(&set, run, &opts.analysis),
        notes,
    })
}

fn text_notes(import: &PerfImport) -> Vec<String> {
    let mut notes = Vec::new();
    if import.malformed_lines > 0 {
        notes.push(format!(
            "{} malformed lines dropped ({} samples read); the first at {}",
            import.malformed_lines,
            import.samples.len(),
            import.first_malformed.as_deref().unwrap_or("?")
        ));
    }
    for dso in &import.unplaced {
        notes.push(format!(
            "{dso}: cannot place its runtime addresses (PIE or shared library without mmap \
             events): re-run `perf script` with --show-mmap-events, or use brstackoff"
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
        let e = read_text(std::io::repeat(0).take(4 * MAX_LINE_BYTES as u64), "zeros").unwrap_err();
        assert!(matches!(e, ImportError::LongLine { line: 1, .. }), "{e}");
        let e = read_text(std::io::repeat(b'\n').take(MAX_TEXT_BYTES + 1), "newlines").unwrap_err();
        assert!(matches!(e, ImportError::TooLarge { .. }), "{e}");
    }
}
