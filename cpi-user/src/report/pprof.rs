//! pprof export: a gzip'd `profile.proto` (github.com/google/pprof/proto/profile.proto),
//! what `go tool pprof`, Pyroscope and Parca read.
//!
//! Samples labelled with `pid` and `comm`, and with the process's cgroup, container and
//! pod where known (`cgroup`, `container_id`, `pod_uid`, `qos`, `pod`, `namespace`,
//! `container`: cpi-user/src/procmap/cgroup.rs). Where samples carried stacks, each call path
//! of the profile ([`crate::profile::model::StackProfile`]) is one sample with its whole
//! location chain, leaf first (so `go tool pprof -traces`, flame graphs, Pyroscope and
//! Parca show the call tree), valued with the path's cycles and instructions (a CPI
//! flame graph is their ratio) or time; a function's samples that no path holds stay
//! leaf-only at its start. Without stacks, leaf-only samples: one per instruction with
//! data, plus one at the function's start for what the instructions do not account for.
//! Either way each function's totals are the table's and `pprof -top` shows the same
//! ranking. Sample types:
//! `cycles`, `instructions`, `samples` (counts); in a time profile `samples` and `cpu`
//! (nanoseconds), since there are no cycles to report.
//!
//! The calls-only call graph ([`crate::profile::model::CallEdge`]) travels as a fourth
//! sample type, `calls`, when the profile has call edges: one two-frame sample
//! [callee, caller] per edge whose `calls` value is the estimated calls and whose other
//! values are 0, so the other types' totals and `-top` are unchanged and
//! `go tool pprof -sample_index=calls -peek FUNC` lists FUNC's callers and callees.

use std::collections::HashMap;
use std::io::Write;

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use cpi_common::wire::EventRole;

use crate::profile::model::{FunctionProfile, Mode, ProcessProfile, Profile, StackProfile};
use crate::profile::paths;

// profile.proto, field for field (the parts we write). Hand-written so no protoc is
// needed at build time.

/// The `Profile` message: what [`build`] returns and [`gzip`] encodes; the tests decode
/// it back (tests/tests/it/report_pprof.rs). String fields are indices into
/// `string_table`.
#[derive(Clone, PartialEq, Message)]
pub struct PprofProfile {
    /// What each entry of [`Sample::value`] counts, in order (cycles, instructions,
    /// samples[, calls], or samples and cpu in a time profile).
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// Leaf-only samples (per instruction with data, plus each function's remainder at its
    /// start), then the two-frame call-edge samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// One per binary, spanning its sampled functions.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Instruction addresses (binary addresses, not runtime ones).
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions by name and binary; names are resolved already.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string the message refers to; index 0 is "" as the format requires.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Collection start: 0 from [`build`] (the profile keeps only its duration); the agent
    /// sets its window's start (cpi-agent/src/push.rs).
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// The profile's duration (`Profile::duration_secs`).
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// The sampling event's type and unit: cycles/count, or cpu/nanoseconds.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// The sampling event's period (from `Profile::events`), 0 if unknown.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// The tool version with the mode, and the mode's reason (string indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The sample type pprof shows by default: cycles, or cpu in a time profile.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// A sample type or period type: what is counted and in which unit.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    /// What is counted, e.g. "cycles" (string index).
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// Its unit, "count" or "nanoseconds" (string index).
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One sample: a stack of locations (leaf first) and one value per sample type.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// The stack, leaf first: one location, or [callee, caller] for a call edge.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per [`PprofProfile::sample_type`], same order.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// The process's `pid` and `comm`, so pprof can filter by them.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A sample label: a string (`str`) or a number (`num`) under a key.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    /// The label's name (string index).
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// A string value (string index), 0 for a numeric label.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// A numeric value, 0 for a string label.
    #[prost(int64, tag = "3")]
    pub num: i64,
}

/// A binary's address range among the profile's locations.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    /// Nonzero id that [`Location::mapping_id`] refers to.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Lowest address of its sampled functions (binary addresses).
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End of its highest sampled function.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// Always 0: addresses are already the binary's own.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// The binary's path (string index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// The binary's GNU build id in hex, "" if it has none (string index).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// True: names are resolved, so pprof must not symbolise again.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

/// One address in one binary, and the function it belongs to.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    /// Nonzero id that [`Sample::location_id`] refers to.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The binary's [`Mapping::id`]; 0 (none) for a call-graph frame of a function
    /// without samples.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// The instruction's address in its binary (function start for call frames).
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// The function at this address (one entry: no inlining, no line numbers).
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// The function a location belongs to, and its source line.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    /// The [`Function::id`].
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// The instruction's source line from the binary's DWARF; 0 when unknown.
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// A function by name and binary.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    /// Nonzero id that [`Line::function_id`] refers to.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its name as people read it: the profile's, demangled (string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Its symbol as the binary spells it, mangled (string index).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Its source file from the binary's DWARF, "" when unknown (string index); never
    /// the binary, which `go tool pprof -list` would print as source.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// Line of its first instruction; 0 when unknown.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// A function's source file (string index), 0 ("") when the profile has none.
fn source_file(st: &mut Strings, f: &FunctionProfile) -> i64 {
    f.source.as_ref().map_or(0, |s| st.id(&s.file))
}

/// The string table: index 0 is "" as the format requires (OTLP's too:
/// cpi-user/src/report/otlp.rs).
pub(crate) struct Strings {
    pub(crate) table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    pub(crate) fn new() -> Self {
        let mut s = Strings {
            table: Vec::new(),
            index: HashMap::new(),
        };
        s.id("");
        s
    }

    pub(crate) fn id(&mut self, v: &str) -> i64 {
        if let Some(&i) = self.index.get(v) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(v.to_string());
        self.index.insert(v.to_string(), i);
        i
    }
}

fn count(v: Option<f64>) -> i64 {
    v.map(|x| x.round().clamp(0.0, i64::MAX as f64) as i64)
        .unwrap_or(0)
}

/// A function's samples: one per instruction with data (so `pprof -disasm` and
/// address-level views work), plus what the instructions do not account for at the
/// function's start, so the function's totals are exactly the table's.
fn function_values(f: &FunctionProfile, time: bool) -> Vec<(u64, Vec<i64>)> {
    let total = if time {
        vec![f.samples as i64, count(f.measures.time_ns)]
    } else {
        vec![
            count(f.measures.cycles),
            count(f.measures.instructions),
            f.samples as i64,
        ]
    };
    // cpu-clock periods are (nearly) equal: an instruction's time is its share of
    // the function's samples.
    let ns_per_sample = match (f.measures.time_ns, f.samples) {
        (Some(t), n) if n > 0 => t / n as f64,
        _ => 0.0,
    };
    let mut out: Vec<(u64, Vec<i64>)> = f
        .lines
        .iter()
        .map(|l| {
            let v = if time {
                vec![
                    l.samples as i64,
                    count(Some(l.samples as f64 * ns_per_sample)),
                ]
            } else {
                vec![count(l.cycles), count(Some(l.count)), l.samples as i64]
            };
            (l.address, v)
        })
        .filter(|(_, v)| v.iter().any(|&x| x > 0))
        .collect();
    let mut rest = total;
    for (_, v) in &out {
        for (r, x) in rest.iter_mut().zip(v) {
            *r -= x;
        }
    }
    if rest.iter().any(|&r| r > 0) {
        out.push((f.address, rest.into_iter().map(|r| r.max(0)).collect()));
    }
    out
}

/// Widens `binary`'s span in `spans` to cover [start, end).
fn widen(spans: &mut Vec<(String, u64, u64)>, binary: &str, start: u64, end: u64) {
    match spans.iter_mut().find(|(b, _, _)| *b == binary) {
        Some(s) => {
            s.1 = s.1.min(start);
            s.2 = s.2.max(end);
        }
        None => spans.push((binary.to_string(), start, end)),
    }
}

/// A call path's values, in the order of the sample types.
fn path_values(s: &StackProfile, time: bool) -> Vec<i64> {
    if time {
        vec![s.samples as i64, count(s.time_ns)]
    } else {
        vec![count(s.cycles), count(s.instructions), s.samples as i64]
    }
}

/// The process's call paths that become samples: the `[dropped]` and `[no stack]`
/// pseudo paths, and the `[rare callees]` paths (whose leaf functions the profile does
/// not keep), stay in their functions' leaf-only remainders, so each function's totals
/// are counted once.
fn real_paths(proc: &ProcessProfile) -> impl Iterator<Item = &StackProfile> {
    proc.stacks.iter().filter(|s| {
        !(paths::is_remainder(s)
            || s.frames
                .first()
                .is_some_and(|f| f.function == paths::RARE_FRAME))
    })
}

/// Builds the (uncompressed) pprof message.
pub fn build(p: &Profile) -> PprofProfile {
    build_processes(p, &|_| true)
}

/// The pprof message of the processes `keep` selects (the agent pushes one per service:
/// cpi-agent/src/push.rs); mappings cover only their functions.
pub fn build_processes(p: &Profile, keep: &dyn Fn(&ProcessProfile) -> bool) -> PprofProfile {
    let mut st = Strings::new();
    let time = !p.mode.has_cpi();
    let with_calls = p
        .processes
        .iter()
        .any(|pr| keep(pr) && !pr.calls.is_empty());
    let sample_type = sample_types(&mut st, time, with_calls);
    let (mapping, mapping_ids) = mappings(&mut st, p, keep);
    let mut b = Samples {
        st,
        time,
        with_calls,
        types: sample_type.len(),
        unknown_mapping: mapping.len() as u64,
        mapping_ids,
        function: Vec::new(),
        location: Vec::new(),
        func_ids: HashMap::new(),
        loc_ids: HashMap::new(),
        call_locs: HashMap::new(),
        sample: Vec::new(),
    };
    let (pid_key, comm_key) = (b.st.id("pid"), b.st.id("comm"));
    for proc in p.processes.iter().filter(|pr| keep(pr)) {
        b.add_process(proc, pid_key, comm_key);
    }
    b.finish(p, sample_type, mapping)
}

/// The sample types, in the order of every sample's values: cycles, instructions and
/// samples (samples and cpu in a time profile), then calls when there are call edges.
fn sample_types(st: &mut Strings, time: bool, with_calls: bool) -> Vec<ValueType> {
    let mut types: Vec<(&str, &str)> = if time {
        vec![("samples", "count"), ("cpu", "nanoseconds")]
    } else {
        vec![
            ("cycles", "count"),
            ("instructions", "count"),
            ("samples", "count"),
        ]
    };
    if with_calls {
        types.push(("calls", "count"));
    }
    types
        .iter()
        .map(|(t, u)| ValueType {
            r#type: st.id(t),
            unit: st.id(u),
        })
        .collect()
}

/// Mappings: one per binary, spanning its sampled functions and its frames (binary
/// addresses), then `[unknown]` last; with each binary's mapping id.
fn mappings(
    st: &mut Strings,
    p: &Profile,
    keep: &dyn Fn(&ProcessProfile) -> bool,
) -> (Vec<Mapping>, HashMap<String, u64>) {
    let mut spans: Vec<(String, u64, u64)> = Vec::new();
    for f in p
        .processes
        .iter()
        .filter(|pr| keep(pr))
        .flat_map(|pr| pr.functions.iter())
    {
        let end = f.address + f.size.max(1);
        widen(&mut spans, &f.binary, f.address, end);
    }
    for fr in p
        .processes
        .iter()
        .filter(|pr| keep(pr))
        .flat_map(|pr| pr.stacks.iter().flat_map(|s| s.frames.iter()))
        .filter(|fr| !fr.binary.is_empty())
    {
        widen(&mut spans, &fr.binary, fr.address, fr.address + 1);
    }
    let mut mapping_ids = HashMap::new();
    let mut mapping = Vec::new();
    for (i, (bin, start, end)) in spans.iter().enumerate() {
        let id = i as u64 + 1;
        let build_id = p
            .binaries
            .iter()
            .find(|b| b.path == *bin)
            .and_then(|b| b.build_id.as_deref())
            .unwrap_or("");
        mapping.push(Mapping {
            id,
            memory_start: *start,
            memory_limit: *end,
            file_offset: 0,
            filename: st.id(bin),
            build_id: st.id(build_id),
            // Names are already resolved: pprof must not re-symbolise.
            has_functions: true,
        });
        mapping_ids.insert(bin.clone(), id);
    }
    // Frames without a binary (unmapped addresses, functions with no samples of their
    // own) still name a mapping: Pyroscope's ingestion refuses locations in none.
    mapping.push(Mapping {
        id: mapping.len() as u64 + 1,
        memory_start: 0,
        memory_limit: 0,
        file_offset: 0,
        filename: st.id("[unknown]"),
        build_id: 0,
        has_functions: true,
    });
    (mapping, mapping_ids)
}

/// The message's samples as they are built, with the functions, locations and strings
/// they refer to.
struct Samples<'p> {
    st: Strings,
    time: bool,
    with_calls: bool,
    /// Number of sample types.
    types: usize,
    /// The `[unknown]` mapping's id.
    unknown_mapping: u64,
    mapping_ids: HashMap<String, u64>,
    function: Vec<Function>,
    location: Vec<Location>,
    func_ids: HashMap<(&'p str, u64, &'p str), u64>,
    loc_ids: HashMap<(&'p str, u64), u64>,
    /// Call-graph frames by function id: their own locations, so a function's
    /// instruction-level locations keep only its own samples.
    call_locs: HashMap<u64, u64>,
    sample: Vec<Sample>,
}

impl<'p> Samples<'p> {
    /// The process's samples: its functions' own, its call paths, its call edges.
    fn add_process(&mut self, proc: &'p ProcessProfile, pid_key: i64, comm_key: i64) {
        let mut labels = vec![
            Label {
                key: pid_key,
                str: 0,
                num: proc.pid as i64,
            },
            Label {
                key: comm_key,
                str: self.st.id(&proc.comm),
                num: 0,
            },
        ];
        for (k, v) in proc.identity.fields() {
            labels.push(Label {
                key: self.st.id(k),
                str: self.st.id(v),
                num: 0,
            });
        }
        let leaf_totals = self.leaf_totals(proc);
        for f in &proc.functions {
            self.add_function(f, &labels, &leaf_totals);
        }
        for s in real_paths(proc) {
            self.add_path(proc, s, &labels);
        }
        self.add_call_edges(proc, &labels);
    }

    /// What the process's call paths hold per leaf function.
    fn leaf_totals(&self, proc: &'p ProcessProfile) -> HashMap<(&'p str, &'p str), Vec<i64>> {
        let mut leaf_totals: HashMap<(&str, &str), Vec<i64>> = HashMap::new();
        for s in real_paths(proc) {
            let leaf = &s.frames[0];
            let t = leaf_totals
                .entry((leaf.binary.as_str(), leaf.function.as_str()))
                .or_insert_with(|| vec![0; if self.time { 2 } else { 3 }]);
            t.iter_mut()
                .zip(path_values(s, self.time))
                .for_each(|(a, x)| *a += x);
        }
        leaf_totals
    }

    /// The function's leaf-only samples: per instruction, or, where call paths hold
    /// its samples as their leaf, what is left (samples without a stack) at its start.
    fn add_function(
        &mut self,
        f: &'p FunctionProfile,
        labels: &[Label],
        leaf_totals: &HashMap<(&'p str, &'p str), Vec<i64>>,
    ) {
        let fid = self.function_id(&f.binary, &f.name, Some(f));
        let lines = source_lines(f);
        let values = match leaf_totals.get(&(f.binary.as_str(), f.name.as_str())) {
            Some(held) => {
                let mut rest = function_values(f, self.time).into_iter().fold(
                    vec![0i64; held.len()],
                    |mut acc, (_, v)| {
                        acc.iter_mut().zip(v).for_each(|(a, x)| *a += x);
                        acc
                    },
                );
                rest.iter_mut()
                    .zip(held)
                    .for_each(|(r, h)| *r = (*r - h).max(0));
                if rest.iter().any(|&r| r > 0) {
                    vec![(f.address, rest)]
                } else {
                    Vec::new()
                }
            }
            None => function_values(f, self.time),
        };
        let mapping_id = self.mapping_ids[&f.binary];
        for (address, mut value) in values {
            if self.with_calls {
                value.push(0);
            }
            let line = lines.get(&address).copied().unwrap_or(0);
            let id = self.location(&f.binary, address, mapping_id, fid, line);
            self.sample.push(Sample {
                location_id: vec![id],
                value,
                label: labels.to_vec(),
            });
        }
    }

    /// A call path's samples: the whole chain, leaf first.
    fn add_path(&mut self, proc: &'p ProcessProfile, s: &'p StackProfile, labels: &[Label]) {
        let mut value = path_values(s, self.time);
        if self.with_calls {
            value.push(0);
        }
        let mut chain = Vec::with_capacity(s.frames.len());
        let mut leaf_split: Vec<(u64, f64)> = Vec::new();
        for (depth, fr) in s.frames.iter().enumerate() {
            let (binary, name) = (fr.binary.as_str(), fr.function.as_str());
            let found = sampled_function(proc, binary, name);
            let fid = self.function_id(binary, name, found);
            let mapping_id = self.mapping_of(binary);
            if let (0, Some(f)) = (depth, found) {
                if let Some(split) = self.leaf_split(f, binary, mapping_id, fid) {
                    leaf_split = split;
                    continue;
                }
            }
            chain.push(self.location(binary, fr.address, mapping_id, fid, 0));
        }
        if leaf_split.is_empty() {
            self.sample.push(Sample {
                location_id: chain,
                value,
                label: labels.to_vec(),
            });
            return;
        }
        let leaf_binary = s.frames[0].binary.as_str();
        for (address, share) in leaf_split {
            let mut location_id = vec![self.loc_ids[&(leaf_binary, address)]];
            location_id.extend(&chain);
            self.sample.push(Sample {
                location_id,
                value: value
                    .iter()
                    .map(|&x| (x as f64 * share).round() as i64)
                    .collect(),
                label: labels.to_vec(),
            });
        }
    }

    /// The leaf's sampled addresses (their locations added) and their share of its
    /// values, over which a path's values are spread (as the function's own samples
    /// are) so that `pprof -list` shows source lines; `None` when the function has no
    /// values. A path's own split is not recorded: this takes the function's, exact
    /// where the function has one caller path.
    fn leaf_split(
        &mut self,
        f: &FunctionProfile,
        binary: &'p str,
        mapping_id: u64,
        fid: u64,
    ) -> Option<Vec<(u64, f64)>> {
        let per_address = function_values(f, self.time);
        let total: i64 = per_address.iter().map(|(_, v)| v[0]).sum();
        if total <= 0 {
            return None;
        }
        let lines = source_lines(f);
        let mut split = Vec::with_capacity(per_address.len());
        for (address, v) in per_address {
            let line = lines.get(&address).copied().unwrap_or(0);
            self.location(binary, address, mapping_id, fid, line);
            split.push((address, v[0] as f64 / total as f64));
        }
        Some(split)
    }

    /// Call edges: [callee, caller] at the functions' starts, `calls` only.
    fn add_call_edges(&mut self, proc: &'p ProcessProfile, labels: &[Label]) {
        for c in &proc.calls {
            let mut value = vec![0; self.types];
            *value.last_mut().expect("calls is a type") = count(Some(c.count));
            let mut frames = Vec::with_capacity(2);
            for (binary, name) in [
                (c.callee_binary.as_str(), c.callee.as_str()),
                (c.caller_binary.as_str(), c.caller.as_str()),
            ] {
                let found = sampled_function(proc, binary, name);
                let fid = self.function_id(binary, name, found);
                // A function without samples has no mapping span of its own.
                let mapping_id = self.mapping_of(binary);
                let location = &mut self.location;
                frames.push(*self.call_locs.entry(fid).or_insert_with(|| {
                    let id = location.len() as u64 + 1;
                    location.push(Location {
                        id,
                        mapping_id,
                        address: found.map_or(0, |f| f.address),
                        line: vec![Line {
                            function_id: fid,
                            line: found
                                .and_then(|f| f.source.as_ref())
                                .map_or(0, |s| s.line.into()),
                        }],
                    });
                    id
                }));
            }
            self.sample.push(Sample {
                location_id: frames,
                value,
                label: labels.to_vec(),
            });
        }
    }

    /// The id of function `name` of `binary` (`found`: its profile, when it has samples),
    /// added when new: one per (binary, start, name), so the call edges, the call paths
    /// and the functions' own samples name one function alike.
    fn function_id(
        &mut self,
        binary: &'p str,
        name: &'p str,
        found: Option<&FunctionProfile>,
    ) -> u64 {
        let address = found.map_or(0, |f| f.address);
        let (function, st) = (&mut self.function, &mut self.st);
        *self
            .func_ids
            .entry((binary, address, name))
            .or_insert_with(|| {
                let id = function.len() as u64 + 1;
                let n = st.id(name);
                function.push(Function {
                    id,
                    name: n,
                    system_name: found.map_or(n, |f| st.id(f.symbol())),
                    filename: found.map_or(0, |f| source_file(st, f)),
                    start_line: found
                        .and_then(|f| f.source.as_ref())
                        .map_or(0, |s| s.line.into()),
                });
                id
            })
    }

    /// The location of `address` in `binary`, added when new.
    fn location(
        &mut self,
        binary: &'p str,
        address: u64,
        mapping_id: u64,
        fid: u64,
        line: i64,
    ) -> u64 {
        let location = &mut self.location;
        *self.loc_ids.entry((binary, address)).or_insert_with(|| {
            let id = location.len() as u64 + 1;
            location.push(Location {
                id,
                mapping_id,
                address,
                line: vec![Line {
                    function_id: fid,
                    line,
                }],
            });
            id
        })
    }

    /// `binary`'s mapping, `[unknown]` for a binary without one.
    fn mapping_of(&self, binary: &str) -> u64 {
        self.mapping_ids
            .get(binary)
            .copied()
            .unwrap_or(self.unknown_mapping)
    }

    /// The message: the samples with the sampling period and the mode as comments.
    fn finish(
        mut self,
        p: &Profile,
        sample_type: Vec<ValueType>,
        mapping: Vec<Mapping>,
    ) -> PprofProfile {
        let st = &mut self.st;
        let time = self.time;
        let period_role = if time {
            EventRole::CpuClock
        } else {
            EventRole::Cycles
        };
        let period = p
            .events
            .iter()
            .find(|e| e.serves(period_role))
            .map(|e| e.period as i64)
            .unwrap_or(0);
        let period_type = Some(if time {
            ValueType {
                r#type: st.id("cpu"),
                unit: st.id("nanoseconds"),
            }
        } else {
            ValueType {
                r#type: st.id("cycles"),
                unit: st.id("count"),
            }
        });
        let comment = vec![st.id(&mode_note(p)), st.id(&p.mode_reason)];
        let default_sample_type = st.id(if time { "cpu" } else { "cycles" });
        PprofProfile {
            sample_type,
            sample: self.sample,
            mapping,
            location: self.location,
            function: self.function,
            string_table: self.st.table,
            time_nanos: 0,
            duration_nanos: (p.duration_secs * 1e9).round() as i64,
            period_type,
            period,
            comment,
            default_sample_type,
        }
    }
}

/// The tool version with the mode, the message's first comment.
fn mode_note(p: &Profile) -> String {
    format!(
        "cpi-bpf {}: mode {}",
        p.tool_version,
        match p.mode {
            Mode::Cpi => "cpi",
            Mode::IpSampling => "ip-sampling (per-function CPI imprecise)",
            Mode::TimeProfile => "time-profile (no PMU: no cycles)",
            Mode::Simulated => "simulated (modelled cycles)",
            Mode::Instructions => "instructions (no cycles)",
        }
    )
}

/// The process's function `name` of `binary`, when it has samples.
fn sampled_function<'p>(
    proc: &'p ProcessProfile,
    binary: &str,
    name: &str,
) -> Option<&'p FunctionProfile> {
    proc.functions
        .iter()
        .find(|f| f.binary == binary && f.name == name)
}

/// The source line of each of the function's instructions that has one.
fn source_lines(f: &FunctionProfile) -> HashMap<u64, i64> {
    f.lines
        .iter()
        .filter_map(|l| Some((l.address, l.source.as_ref()?.line.into())))
        .collect()
}

/// The gzip'd protobuf bytes of [`build`].
pub fn encode(p: &Profile) -> std::io::Result<Vec<u8>> {
    gzip(&build(p))
}

/// The gzip'd protobuf bytes of a message from [`build`] or [`build_processes`] (or of
/// an OTLP request: cpi-agent/src/push.rs).
pub fn gzip(m: &impl Message) -> std::io::Result<Vec<u8>> {
    let raw = m.encode_to_vec();
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&raw)?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_table_starts_empty_and_dedups() {
        let mut s = Strings::new();
        assert_eq!(s.table[0], "");
        let a = s.id("cycles");
        assert_eq!(s.id("cycles"), a);
        assert_eq!(s.id(""), 0);
        assert_eq!(s.table.len(), 2);
    }
}
