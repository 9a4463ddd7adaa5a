//! User stacks of `perf record --call-graph dwarf` samples, unwound here: each sample's
//! registers and copied stack bytes (cpi-user/src/import/perf_data.rs) go through the
//! collector's unwinder (cpi-user/src/unwind/, `.eh_frame` or frame pointers) over the
//! recording's mappings, each file the local copy import located and checked by
//! build-id (cpi-user/src/import/locate.rs). The kernel part of the stack is the
//! sample's recorded callchain. Where unwinding stops is kept with the stack and
//! counted, as for live stacks.

use std::collections::HashMap;

use cpi_common::wire::MAX_USER_FRAMES;

use super::perf_data::Sample;
use super::perf_records::RecordedProcesses;
use super::{ImportError, Relocator};
use crate::procmap::ProcessMaps;
use crate::profile::model::LossReport;
use crate::profile::stack::{CallStack, StackEnd};
use crate::unwind::{StackUnwinder, UnwoundStack, DEFAULT_BYTE_BOUND};

/// How the unwound stacks ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Unwound {
    /// Samples whose user stack was unwound from bytes.
    pub samples: u64,
    /// Of those, reaching the outermost frame.
    pub complete: u64,
    /// Cut at the frame limit or at the end of the copied bytes.
    pub truncated: u64,
    /// Stopped at code with no file behind it, or whose file was not found here.
    pub unknown_code: u64,
    /// Unreadable stack, or unwind rules that led nowhere.
    pub failed: u64,
}

impl Unwound {
    /// Puts the incomplete stacks into a loss account.
    pub(crate) fn into_losses(self, lost: &mut LossReport) {
        lost.stacks_truncated += self.truncated;
        lost.stacks_unknown_code += self.unknown_code;
        lost.stacks_failed += self.failed;
    }

    /// The line an import prints, `None` when no sample carried stack bytes.
    pub fn note(&self) -> Option<String> {
        (self.samples > 0).then(|| {
            format!(
                "{} samples carry their user stack as bytes (perf record --call-graph \
                 dwarf), unwound here over the binaries found: {} complete, {} truncated \
                 (frame limit or end of the copy), {} at code without a binary here, {} \
                 failed",
                self.samples, self.complete, self.truncated, self.unknown_code, self.failed
            )
        })
    }
}

/// Unwinds the dwarf samples of one pass.
pub(crate) struct Unwinder<'a, 'r> {
    /// What the recording said of each process: its executable mappings, as recorded.
    recorded: &'a RecordedProcesses,
    relocator: &'a mut Relocator<'r>,
    /// Relocated mappings per pid, made at its first sample with stack bytes.
    maps: HashMap<u32, ProcessMaps>,
    unwinder: StackUnwinder,
    /// The first error locating a binary: the import fails with it.
    pub error: Option<ImportError>,
    pub counts: Unwound,
}

impl<'a, 'r> Unwinder<'a, 'r> {
    pub fn new(recorded: &'a RecordedProcesses, relocator: &'a mut Relocator<'r>) -> Self {
        Unwinder {
            recorded,
            relocator,
            maps: HashMap::new(),
            unwinder: StackUnwinder::for_recordings(MAX_USER_FRAMES, DEFAULT_BYTE_BOUND),
            error: None,
            counts: Unwound::default(),
        }
    }

    /// The call stack of `s`, a sample of an event that records user stacks: its
    /// recorded kernel frames and its user frames unwound here.
    pub fn stack(&mut self, s: &Sample) -> CallStack {
        let kernel = s
            .stack
            .as_ref()
            .map(|c| c.kernel.clone())
            .unwrap_or_default();
        let Some(regs) = s.user_regs else {
            // No user registers (a kernel thread): nothing of user space to unwind.
            return CallStack {
                kernel,
                user: Box::default(),
                end: StackEnd::Complete,
            };
        };
        if !self.maps.contains_key(&s.pid) {
            let mut maps = (self.recorded.get(s.pid))
                .map(|r| r.maps.clone())
                .unwrap_or_default();
            if let Err(e) = self.relocator.relocate(maps.mappings.iter_mut()) {
                self.error.get_or_insert(e);
            }
            self.maps.insert(s.pid, maps);
        }
        let UnwoundStack { frames, stop, .. } = self.unwinder.unwind(
            s.pid,
            &self.maps[&s.pid],
            &HashMap::new(),
            regs,
            &s.user_stack,
            s.user_stack_full,
        );
        let end = StackEnd::from(stop);
        let c = &mut self.counts;
        c.samples += 1;
        *match end {
            StackEnd::Complete => &mut c.complete,
            StackEnd::Truncated => &mut c.truncated,
            StackEnd::UnknownCode => &mut c.unknown_code,
            StackEnd::Error => &mut c.failed,
        } += 1;
        CallStack {
            kernel,
            user: frames.into(),
            end,
        }
    }
}
