//! The orders a profile's functions and calls are written in: one definition, so an
//! analysed profile and a merged one (`profile/merge.rs`) list them alike.

use crate::profile::model::{CallEdge, FunctionProfile};

/// The order of a process's functions: most cycles first, then most samples (a time
/// profile has no cycles), then name, binary and address so equal ones sort the same
/// on every run. Merging (`profile/merge.rs`) orders by it too.
pub(in crate::profile) fn hottest_first(
    a: &FunctionProfile,
    b: &FunctionProfile,
) -> std::cmp::Ordering {
    b.measures
        .cycles
        .unwrap_or(0.0)
        .total_cmp(&a.measures.cycles.unwrap_or(0.0))
        .then(b.samples.cmp(&a.samples))
        .then(a.name.cmp(&b.name))
        .then(a.binary.cmp(&b.binary))
        .then(a.address.cmp(&b.address))
}

/// The order of a process's call edges: most calls first, then by caller and callee
/// (names, then binaries) so equal ones sort the same on every run. Merging orders by
/// it too.
pub(in crate::profile) fn hottest_call_first(a: &CallEdge, b: &CallEdge) -> std::cmp::Ordering {
    b.count
        .total_cmp(&a.count)
        .then_with(|| (&a.caller, &a.callee).cmp(&(&b.caller, &b.callee)))
        .then_with(|| {
            (&a.caller_binary, &a.callee_binary).cmp(&(&b.caller_binary, &b.callee_binary))
        })
}
