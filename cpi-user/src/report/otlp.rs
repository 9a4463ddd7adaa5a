//! OTLP profiles export: an `ExportProfilesServiceRequest`
//! (`opentelemetry/proto/collector/profiles/v1development/profiles_service.proto`), what
//! an OpenTelemetry Collector's OTLP receiver and Pyroscope's OTLP ingestion take.
//!
//! Pinned to opentelemetry-proto [`PROTO_VERSION`]: profiles are `v1development` there, so
//! the schema may still change incompatibly; what v1.10.0 and v1.11.0 define is what is
//! written (one `sample_type` per `Profile`, one `ProfilesDictionary` per request). A
//! Collector that knows the `OTLP-Profiles-Development-Version` header reads a request
//! without it as development version 1, which is this schema.
//!
//! Built from the pprof message of each process (cpi-user/src/report/pprof.rs), so both
//! exports hold the same call paths, locations and values: one `ResourceProfiles` per
//! process, its attributes by the semantic conventions (`service.name`,
//! `process.executable.name` — the comm —, `process.pid`, and where known `container.id`,
//! `k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name`, `k8s.container.name`); one
//! `Profile` per pprof sample type (`cycles`, `instructions`, `samples`, and `calls` for
//! the call edges, whose two-frame stacks are [callee, caller], not call paths; `samples`
//! and `cpu` in a time profile), each sample one stack with its one aggregated value. Frames, functions, mappings (with the GNU build id as
//! `process.executable.build_id.gnu`) and stacks are shared by every profile through the
//! dictionary, whose entry 0 is each table's zero value as the format requires.

use std::collections::HashMap;

use prost::Message;

use crate::profile::model::{ProcessProfile, Profile};
use crate::report::pprof::{self, PprofProfile, Strings};

/// The opentelemetry-proto release whose profiles schema this writes.
pub const PROTO_VERSION: &str = "v1.11.0";
/// OTLP/HTTP's path for profiles (the Collector's OTLP receiver serves it).
pub const EXPORT_PATH: &str = "/v1development/profiles";
/// OTLP/HTTP's binary encoding.
pub const CONTENT_TYPE: &str = "application/x-protobuf";
/// The instrumentation scope's name.
pub(crate) const SCOPE_NAME: &str = "cpi-bpf";

// The messages, field for field (the parts written), hand-written as pprof's are so no
// protoc is needed at build time.

/// `ExportProfilesServiceRequest`: the request body.
#[derive(Clone, PartialEq, Message)]
pub struct ExportProfilesServiceRequest {
    /// One per process.
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    /// The tables every profile's indices point into.
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<ProfilesDictionary>,
}

/// `ProfilesDictionary`: entry 0 of each table is its zero value.
#[derive(Clone, PartialEq, Message)]
pub struct ProfilesDictionary {
    /// Binaries' address ranges.
    #[prost(message, repeated, tag = "1")]
    pub mapping_table: Vec<Mapping>,
    /// Addresses and their functions.
    #[prost(message, repeated, tag = "2")]
    pub location_table: Vec<Location>,
    /// Functions by name.
    #[prost(message, repeated, tag = "3")]
    pub function_table: Vec<Function>,
    /// Links to trace spans: only the zero entry (no samples carry one).
    #[prost(message, repeated, tag = "4")]
    pub link_table: Vec<Link>,
    /// Every string the message refers to by index; entry 0 is "".
    #[prost(string, repeated, tag = "5")]
    pub string_table: Vec<String>,
    /// Attributes of mappings and profiles.
    #[prost(message, repeated, tag = "6")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    /// Call stacks, leaf first.
    #[prost(message, repeated, tag = "7")]
    pub stack_table: Vec<Stack>,
}

/// `ResourceProfiles`: one process's profiles.
#[derive(Clone, PartialEq, Message)]
pub struct ResourceProfiles {
    /// The process, by the semantic conventions.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// One scope, cpi-bpf's.
    #[prost(message, repeated, tag = "2")]
    pub scope_profiles: Vec<ScopeProfiles>,
}

/// `opentelemetry.proto.resource.v1.Resource`.
#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    /// Its attributes, keys unique.
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `opentelemetry.proto.common.v1.KeyValue`.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `opentelemetry.proto.common.v1.AnyValue` (the kinds written).
#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    /// The value.
    #[prost(oneof = "Value", tags = "1, 3")]
    pub value: Option<Value>,
}

/// `AnyValue`'s `value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    /// `string_value`.
    #[prost(string, tag = "1")]
    String(String),
    /// `int_value`.
    #[prost(int64, tag = "3")]
    Int(i64),
}

/// `opentelemetry.proto.common.v1.InstrumentationScope`.
#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    /// `SCOPE_NAME`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The tool's version.
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `ScopeProfiles`.
#[derive(Clone, PartialEq, Message)]
pub struct ScopeProfiles {
    /// cpi-bpf and its version.
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// One per sample type with samples.
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<OtlpProfile>,
}

/// `Profile`: one sample type's samples.
#[derive(Clone, PartialEq, Message)]
pub struct OtlpProfile {
    /// What every sample's value counts, and its unit.
    #[prost(message, optional, tag = "1")]
    pub sample_type: Option<ValueType>,
    /// One per distinct stack.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    /// Collection start; 0 when unknown (a profile file keeps only its duration).
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    /// Collection length.
    #[prost(uint64, tag = "4")]
    pub duration_nano: u64,
    /// The sampling event: cycles/count, or cpu/nanoseconds.
    #[prost(message, optional, tag = "5")]
    pub period_type: Option<ValueType>,
    /// The sampling event's period, 0 if unknown.
    #[prost(int64, tag = "6")]
    pub period: i64,
    /// 16 random bytes.
    #[prost(bytes = "vec", tag = "7")]
    pub profile_id: Vec<u8>,
    /// `cpi_bpf.mode`: what the numbers can mean (e.g. simulated cycles).
    #[prost(int32, repeated, tag = "11")]
    pub attribute_indices: Vec<i32>,
}

/// `ValueType` (string indices).
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    /// What is counted.
    #[prost(int32, tag = "1")]
    pub type_strindex: i32,
    /// Its unit.
    #[prost(int32, tag = "2")]
    pub unit_strindex: i32,
}

/// `Sample`: a stack and its aggregated value.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Index into the stack table.
    #[prost(int32, tag = "1")]
    pub stack_index: i32,
    /// One value, of the profile's sample type.
    #[prost(int64, repeated, tag = "4")]
    pub values: Vec<i64>,
}

/// `Mapping`.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    /// Lowest address of the binary's sampled functions (binary addresses).
    #[prost(uint64, tag = "1")]
    pub memory_start: u64,
    /// End of its highest sampled function.
    #[prost(uint64, tag = "2")]
    pub memory_limit: u64,
    /// 0: addresses are the binary's own.
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    /// The binary's path (string index).
    #[prost(int32, tag = "4")]
    pub filename_strindex: i32,
    /// Its build id, where it has one.
    #[prost(int32, repeated, tag = "5")]
    pub attribute_indices: Vec<i32>,
}

/// `Stack`: location indices, leaf first.
#[derive(Clone, PartialEq, Message)]
pub struct Stack {
    /// Indices into the location table.
    #[prost(int32, repeated, tag = "1")]
    pub location_indices: Vec<i32>,
}

/// `Location`.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    /// Index into the mapping table (0: none).
    #[prost(int32, tag = "1")]
    pub mapping_index: i32,
    /// The instruction's address in its binary.
    #[prost(uint64, tag = "2")]
    pub address: u64,
    /// Its function and source line.
    #[prost(message, repeated, tag = "3")]
    pub lines: Vec<Line>,
}

/// `Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    /// Index into the function table.
    #[prost(int32, tag = "1")]
    pub function_index: i32,
    /// Source line, 0 when unknown.
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function` (string indices).
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    /// Demangled name.
    #[prost(int32, tag = "1")]
    pub name_strindex: i32,
    /// The symbol as the binary spells it.
    #[prost(int32, tag = "2")]
    pub system_name_strindex: i32,
    /// Source file, "" when unknown.
    #[prost(int32, tag = "3")]
    pub filename_strindex: i32,
    /// Line of its first instruction, 0 when unknown.
    #[prost(int64, tag = "4")]
    pub start_line: i64,
}

/// `Link` (only the zero entry is written).
#[derive(Clone, PartialEq, Message)]
pub struct Link {
    /// 16 zero bytes in the zero entry, as the format recommends.
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    /// 8 zero bytes in the zero entry.
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
}

/// `KeyValueAndUnit`: a dictionary attribute.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValueAndUnit {
    /// The key (string index).
    #[prost(int32, tag = "1")]
    pub key_strindex: i32,
    /// The value.
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// A dictionary table: entry 0 the zero value, each distinct message once (keyed by its
/// encoding, so equal messages share an index).
struct Table<T> {
    items: Vec<T>,
    index: HashMap<Vec<u8>, i32>,
}

impl<T: Message + Default> Table<T> {
    fn new() -> Self {
        let mut t = Table {
            items: Vec::new(),
            index: HashMap::new(),
        };
        t.id(T::default());
        t
    }

    fn id(&mut self, v: T) -> i32 {
        let items = &mut self.items;
        *self.index.entry(v.encode_to_vec()).or_insert_with(|| {
            items.push(v);
            items.len() as i32 - 1
        })
    }
}

/// The request's dictionary while it is built.
struct Dictionary {
    strings: Strings,
    mappings: Table<Mapping>,
    locations: Table<Location>,
    functions: Table<Function>,
    attributes: Table<KeyValueAndUnit>,
    stacks: Table<Stack>,
}

impl Dictionary {
    fn string(&mut self, s: &str) -> i32 {
        self.strings.id(s) as i32
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let key_strindex = self.string(key);
        self.attributes.id(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue { value: Some(value) }),
        })
    }

    /// The profiles of one process's pprof message `m`, one per sample type with samples.
    fn profiles(&mut self, m: &PprofProfile, common: &OtlpProfile) -> Vec<OtlpProfile> {
        let s: Vec<i32> = m.string_table.iter().map(|x| self.string(x)).collect();
        let at = |i: i64| s.get(i as usize).copied().unwrap_or(0);
        let build_id_key = "process.executable.build_id.gnu";
        let mappings: HashMap<u64, i32> = m
            .mapping
            .iter()
            .map(|x| {
                let build_id = &m.string_table[x.build_id as usize];
                let attribute_indices = if build_id.is_empty() {
                    Vec::new()
                } else {
                    vec![self.attribute(build_id_key, Value::String(build_id.clone()))]
                };
                let mapping = Mapping {
                    memory_start: x.memory_start,
                    memory_limit: x.memory_limit,
                    file_offset: x.file_offset,
                    filename_strindex: at(x.filename),
                    attribute_indices,
                };
                (x.id, self.mappings.id(mapping))
            })
            .collect();
        let functions: HashMap<u64, i32> = m
            .function
            .iter()
            .map(|f| {
                let function = Function {
                    name_strindex: at(f.name),
                    system_name_strindex: at(f.system_name),
                    filename_strindex: at(f.filename),
                    start_line: f.start_line,
                };
                (f.id, self.functions.id(function))
            })
            .collect();
        let locations: HashMap<u64, i32> = m
            .location
            .iter()
            .map(|l| {
                let location = Location {
                    mapping_index: mappings.get(&l.mapping_id).copied().unwrap_or(0),
                    address: l.address,
                    lines: l
                        .line
                        .iter()
                        .map(|x| Line {
                            function_index: functions.get(&x.function_id).copied().unwrap_or(0),
                            line: x.line,
                        })
                        .collect(),
                };
                (l.id, self.locations.id(location))
            })
            .collect();
        // Per sample type, (stack, value) in first-seen order; one sample per stack, as
        // the format asks of samples with the same identity.
        let mut per_type: Vec<(Vec<i32>, HashMap<i32, i64>)> =
            vec![Default::default(); m.sample_type.len()];
        for x in &m.sample {
            let stack = self.stacks.id(Stack {
                location_indices: x.location_id.iter().map(|id| locations[id]).collect(),
            });
            for ((order, sums), &v) in per_type.iter_mut().zip(&x.value) {
                if v == 0 {
                    continue;
                }
                *sums.entry(stack).or_insert_with(|| {
                    order.push(stack);
                    0
                }) += v;
            }
        }
        m.sample_type
            .iter()
            .zip(per_type)
            .filter(|(_, (order, _))| !order.is_empty())
            .map(|(t, (order, sums))| OtlpProfile {
                sample_type: Some(ValueType {
                    type_strindex: at(t.r#type),
                    unit_strindex: at(t.unit),
                }),
                samples: order
                    .iter()
                    .map(|&stack_index| Sample {
                        stack_index,
                        values: vec![sums[&stack_index]],
                    })
                    .collect(),
                profile_id: rand::random::<[u8; 16]>().to_vec(),
                ..common.clone()
            })
            .collect()
    }
}

/// Where and when the profile was taken, beyond what [`Profile`] keeps, and how its
/// processes are named.
pub struct Context<'a> {
    /// Collection start, nanoseconds since the epoch; 0 when unknown.
    pub start_unix_nanos: u64,
    /// Collection length, nanoseconds.
    pub duration_nanos: u64,
    /// `service.name` of a process.
    pub service: &'a dyn Fn(&ProcessProfile) -> String,
}

/// The semantic-convention resource attributes of process `pr`.
fn resource(pr: &ProcessProfile, service: String) -> Resource {
    let id = &pr.identity;
    let text = |k: &str, v: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::String(v.into())),
        }),
    };
    let mut attributes = vec![
        text("service.name", &service),
        text("process.executable.name", &pr.comm),
        KeyValue {
            key: "process.pid".into(),
            value: Some(AnyValue {
                value: Some(Value::Int(pr.pid.into())),
            }),
        },
    ];
    for (key, v) in [
        ("container.id", &id.container_id),
        ("k8s.pod.uid", &id.pod_uid),
        ("k8s.pod.name", &id.pod),
        ("k8s.namespace.name", &id.namespace),
        ("k8s.container.name", &id.container),
    ] {
        if let Some(v) = v {
            attributes.push(text(key, v));
        }
    }
    Resource { attributes }
}

/// The request for `p`; `None` when no process has a sample.
pub fn build(p: &Profile, ctx: &Context) -> Option<ExportProfilesServiceRequest> {
    let mut d = Dictionary {
        strings: Strings::new(),
        mappings: Table::new(),
        locations: Table::new(),
        functions: Table::new(),
        attributes: Table::new(),
        stacks: Table::new(),
    };
    let reference = pprof::build_processes(p, &|_| false);
    let common = OtlpProfile {
        time_unix_nano: ctx.start_unix_nanos,
        duration_nano: ctx.duration_nanos,
        period_type: reference.period_type.as_ref().map(|t| ValueType {
            type_strindex: d.string(&reference.string_table[t.r#type as usize]),
            unit_strindex: d.string(&reference.string_table[t.unit as usize]),
        }),
        period: reference.period,
        attribute_indices: vec![d.attribute("cpi_bpf.mode", Value::String(p.mode.name().into()))],
        ..Default::default()
    };
    let scope = InstrumentationScope {
        name: SCOPE_NAME.into(),
        version: p.tool_version.clone(),
    };
    let mut resource_profiles = Vec::new();
    for pr in &p.processes {
        let m = pprof::build_processes(p, &|x| std::ptr::eq(x, pr));
        let profiles = d.profiles(&m, &common);
        if profiles.is_empty() {
            continue;
        }
        resource_profiles.push(ResourceProfiles {
            resource: Some(resource(pr, (ctx.service)(pr))),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(scope.clone()),
                profiles,
            }],
        });
    }
    if resource_profiles.is_empty() {
        return None;
    }
    Some(ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(ProfilesDictionary {
            mapping_table: d.mappings.items,
            location_table: d.locations.items,
            function_table: d.functions.items,
            link_table: vec![Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            string_table: d.strings.table,
            attribute_table: d.attributes.items,
            stack_table: d.stacks.items,
        }),
    })
}

/// The protobuf bytes of a profile file's request (`--format otlp`): processes named by
/// their comm, the start unknown (0); an empty request when no process has a sample.
pub fn encode(p: &Profile) -> Vec<u8> {
    let ctx = Context {
        start_unix_nanos: 0,
        duration_nanos: (p.duration_secs.max(0.0) * 1e9).round() as u64,
        service: &|pr| pr.comm.clone(),
    };
    build(p, &ctx).unwrap_or_default().encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_start_with_the_zero_value_and_share_equal_entries() {
        let mut t: Table<Stack> = Table::new();
        assert_eq!(t.items, [Stack::default()]);
        let a = t.id(Stack {
            location_indices: vec![1, 2],
        });
        assert_eq!(a, 1);
        assert_eq!(
            t.id(Stack {
                location_indices: vec![1, 2]
            }),
            a
        );
        assert_eq!(t.id(Stack::default()), 0);
        assert_eq!(t.items.len(), 2);
    }
}
