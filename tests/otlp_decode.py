"""Decodes an OTLP ExportProfilesServiceRequest with the official `opentelemetry-proto`
package (PyPI; `cargo xtask setup` installs it in target/otlp-proto/), checks the rules
of profiles.proto that the bindings do not (dictionary entry 0 is each table's zero
value, every index in range, attribute keys unique), and prints what the tests compare
with the profile, as JSON: per resource its attributes, scope and profiles, each with
its sample type, period, times, value sum and stacks (function names, leaf first).

Usage: otlp_decode.py FILE  (FILE is the protobuf; `-` reads standard input).
Exit status 1 with the reason on standard error when a rule is broken."""

import json
import sys

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2


def fail(why):
    sys.stderr.write(f"otlp_decode: {why}\n")
    sys.exit(1)


def check_index(i, table, what):
    if not 0 <= i < len(table):
        fail(f"{what} index {i} outside its table of {len(table)}")


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def main():
    path = sys.argv[1]
    raw = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    req = profiles_service_pb2.ExportProfilesServiceRequest()
    req.ParseFromString(raw)
    d = req.dictionary
    zero = {
        "mapping_table": profiles_pb2.Mapping(),
        "location_table": profiles_pb2.Location(),
        "function_table": profiles_pb2.Function(),
        "stack_table": profiles_pb2.Stack(),
        "attribute_table": profiles_pb2.KeyValueAndUnit(),
    }
    if req.resource_profiles:
        for name, z in zero.items():
            table = getattr(d, name)
            if not table or table[0] != z:
                fail(f"{name}[0] is not the zero value")
        if not d.string_table or d.string_table[0] != "":
            fail('string_table[0] is not ""')
        if not d.link_table or any(d.link_table[0].trace_id) or any(d.link_table[0].span_id):
            fail("link_table[0] is not the zero value")
    s = d.string_table

    def string(i):
        check_index(i, s, "string")
        return s[i]

    def attributes(indices):
        out = {}
        for i in indices:
            check_index(i, d.attribute_table, "attribute")
            a = d.attribute_table[i]
            key = string(a.key_strindex)
            if key in out:
                fail(f"attribute {key} twice")
            out[key] = any_value(a.value)
        return out

    for m in d.mapping_table:
        string(m.filename_strindex)
        attributes(m.attribute_indices)

    def frame(loc_index):
        check_index(loc_index, d.location_table, "location")
        loc = d.location_table[loc_index]
        check_index(loc.mapping_index, d.mapping_table, "mapping")
        if len(loc.lines) != 1:
            fail(f"location {loc_index} has {len(loc.lines)} lines, want 1")
        check_index(loc.lines[0].function_index, d.function_table, "function")
        f = d.function_table[loc.lines[0].function_index]
        return string(f.name_strindex)

    resources = []
    for rp in req.resource_profiles:
        attrs = {}
        for kv in rp.resource.attributes:
            if kv.key in attrs:
                fail(f"resource attribute {kv.key} twice")
            attrs[kv.key] = any_value(kv.value)
        scopes = []
        for sp in rp.scope_profiles:
            profiles = []
            for p in sp.profiles:
                stacks = []
                for x in p.samples:
                    if len(x.values) != 1 or x.timestamps_unix_nano:
                        fail("a sample without exactly one aggregated value")
                    check_index(x.stack_index, d.stack_table, "stack")
                    st = d.stack_table[x.stack_index]
                    stacks.append(
                        {"frames": [frame(i) for i in st.location_indices], "value": x.values[0]}
                    )
                if len(p.profile_id) != 16 or not any(p.profile_id):
                    fail("profile_id is not 16 bytes, not all zero")
                profiles.append(
                    {
                        "type": string(p.sample_type.type_strindex),
                        "unit": string(p.sample_type.unit_strindex),
                        "period_type": string(p.period_type.type_strindex),
                        "period_unit": string(p.period_type.unit_strindex),
                        "period": p.period,
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                        "attributes": attributes(p.attribute_indices),
                        "sum": sum(x["value"] for x in stacks),
                        "stacks": stacks,
                    }
                )
            scopes.append({"scope": MessageToDict(sp.scope), "profiles": profiles})
        resources.append({"attributes": attrs, "scopes": scopes})
    build_ids = sorted(
        v
        for m in d.mapping_table
        for k, v in attributes(m.attribute_indices).items()
        if k == "process.executable.build_id.gnu"
    )
    json.dump({"resources": resources, "build_ids": build_ids}, sys.stdout)


main()
