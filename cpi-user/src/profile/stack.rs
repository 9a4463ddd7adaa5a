//! Call stacks of samples, aggregated per process in runtime addresses.
//!
//! Every source of samples hands a sample's stack over as a [`CallStack`]: the collector
//! after unwinding (cpi-user/src/unwind/), the PMU model from its exact shadow stack
//! (cpi-user/src/sim/), the importers from recorded callchains (cpi-user/src/import/).
//! Analysis (cpi-user/src/profile/analyze.rs) symbolises the stacks into
//! [`crate::profile::model::StackProfile`]s.

use std::collections::{BTreeMap, HashMap};

use cpi_common::wire::EventRole;
use serde::{Deserialize, Serialize};

/// How unwinding a stack ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum StackEnd {
    /// The outermost frame was reached (no caller left to find).
    #[default]
    Complete,
    /// Stopped at the frame limit or the end of the copied stack bytes.
    Truncated,
    /// Stopped at code without unwind information (JIT, anonymous memory): the last
    /// frame is where it stopped; nothing past it is invented.
    UnknownCode,
    /// Unwinding failed (unreadable stack, corrupt unwind information, a cycle).
    Error,
}

/// One sample's call stack, leaf first, in runtime addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CallStack {
    /// Kernel frames, leaf first, as the kernel's unwinder reports them (entry 0 the
    /// interrupted kernel IP); empty for user-mode samples.
    pub kernel: Box<[u64]>,
    /// User frames, leaf first: entry 0 is the interrupted user IP, the rest return
    /// addresses (symbolise `addr - 1`, the call instruction).
    pub user: Box<[u64]>,
    /// How unwinding the user stack ended.
    pub end: StackEnd,
}

/// What ran under one call stack.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackStat {
    /// IP samples and Σ periods per event role.
    pub ips: BTreeMap<EventRole, (u64, u64)>,
    /// Branch samples taken under the stack.
    pub branch_samples: u64,
}

/// The stacks of one process.
#[derive(Clone, Debug, Default)]
pub struct StackAggregate {
    /// By stack.
    pub stacks: HashMap<CallStack, StackStat>,
    /// Samples that carried no stack (the writer could not take one).
    pub unstacked: u64,
}

impl StackAggregate {
    /// Counts an IP sample of `role` with weight `period` under `stack`.
    pub fn add_ip(&mut self, stack: &CallStack, role: EventRole, period: u64) {
        let e = self.stack(stack).ips.entry(role).or_default();
        e.0 += 1;
        e.1 += period;
    }

    /// Counts a branch sample under `stack`.
    pub fn add_branch(&mut self, stack: &CallStack) {
        self.stack(stack).branch_samples += 1;
    }

    fn stack(&mut self, stack: &CallStack) -> &mut StackStat {
        if !self.stacks.contains_key(stack) {
            self.stacks.insert(stack.clone(), StackStat::default());
        }
        self.stacks.get_mut(stack).expect("inserted above")
    }
}
