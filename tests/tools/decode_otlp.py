#!/usr/bin/env python3
"""Independent decoder of OTLP profiles for the spanprof tests.

Parses an OTLP `ExportProfilesServiceRequest` (OpenTelemetry proto v1.10.0,
package `opentelemetry.proto.collector.profiles.v1development`) with the
message classes of PyPI `opentelemetry-proto`, so it shares no code with
spanprof's encoder, checks the format's invariants, and prints ONE JSON
object on stdout:

    {"dictionary": {"mapping": N, "location": N, "function": N, "link": N,
                    "string": N, "attribute": N, "stack": N},   # table sizes
     "problems": ["...", ...],          # invariants broken; [] when valid
     "resources": [{
        "attributes": {KEY: VALUE},
        "schema_url": "...",
        "scopes": [{
           "name": "...", "version": "...", "schema_url": "...",
           "profiles": [{
              "sample_type": "TYPE/UNIT", "period_type": "TYPE/UNIT" or null,
              "period": INT, "time_unix_nano": INT, "duration_nano": INT,
              "attributes": {KEY: VALUE},
              "samples": [{
                 "frames": [{"function": "...", "system_name": "...",
                             "file": "...", "line": INT, "address": INT,
                             "mapping": "FILENAME" or "",
                             "attributes": {KEY: VALUE},
                             "mapping_attributes": {KEY: VALUE}}, ...],
                 "values": [INT, ...], "timestamps": [INT, ...],
                 "attributes": {KEY: VALUE},
                 "link": {"trace_id": "32 hex", "span_id": "16 hex"} or null}]}]}]}]}

Frames are leaf first: the locations of the sample's stack in order (the
stack table's first entry is the leaf), each expanded into one frame per
Line, innermost (inlined) first. A location without lines is one frame with
empty function, system_name and file and line 0. A frame's "attributes" are
its location's, its "mapping_attributes" its mapping's. Attribute values are JSON strings, numbers and booleans;
`string_value_strindex` is resolved through the string table, bytes become
hex, arrays lists and key-value lists objects. Where an index is out of
range the decoded text is "<bad index N>" (and a problem says so).

Exit status: 0 when the input parsed (even with problems: the caller asserts
that the list is empty); 1 when it does not parse as an
ExportProfilesServiceRequest (the JSON then has problems ["decode: ..."]);
2 on usage errors; 3 when `opentelemetry-proto` cannot be imported.

    decode_otlp.py FILE     FILE may be `-` for stdin; gzip is undone when
                            the bytes start with 1f 8b
"""

import gzip
import json
import math
import sys

try:
    from google.protobuf import unknown_fields as _unknown_fields
    from opentelemetry.proto.collector.profiles.v1development import (
        profiles_service_pb2,
    )
    from opentelemetry.proto.profiles.v1development import profiles_pb2
except ImportError as e:  # pragma: no cover - reported to the Rust helper
    sys.stderr.write(
        "error: cannot import the OTLP profiles messages of PyPI opentelemetry-proto "
        f"(pip install opentelemetry-proto==1.45.2): {e}\n"
    )
    sys.exit(3)

# At most this many problems are listed; the rest are counted in a last entry.
MAX_PROBLEMS = 200

TABLES = [
    # (JSON name, field of ProfilesDictionary)
    ("mapping", "mapping_table"),
    ("location", "location_table"),
    ("function", "function_table"),
    ("link", "link_table"),
    ("string", "string_table"),
    ("attribute", "attribute_table"),
    ("stack", "stack_table"),
]


class Problems:
    """The list of broken invariants, capped at MAX_PROBLEMS entries."""

    def __init__(self):
        self.items = []
        self.more = 0

    def add(self, text):
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(text)
        else:
            self.more += 1

    def as_list(self):
        if self.more:
            return self.items + [f"... and {self.more} more problems"]
        return list(self.items)


def read_input(path):
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as f:
        return f.read()


def parse_request(data):
    """The ExportProfilesServiceRequest in `data` (gzipped or not); raises ValueError."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError) as e:
            raise ValueError(f"bad gzip data: {e}") from e
    request = profiles_service_pb2.ExportProfilesServiceRequest()
    try:
        request.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise ValueError(f"not an ExportProfilesServiceRequest: {e}") from e
    return request


def unknown_field_problems(request, problems):
    """Reports every message that carries fields the v1.10.0 schema does not know."""
    clean = type(request)()
    clean.CopyFrom(request)
    clean.DiscardUnknownFields()
    if clean.ByteSize() == request.ByteSize():
        return

    def walk(message, where):
        unknown = _unknown_fields.UnknownFieldSet(message)
        if len(unknown):
            numbers = sorted({f.field_number for f in unknown})
            problems.add(f"unknown fields in {where} (field numbers {numbers})")
        for field, value in message.ListFields():
            if field.message_type is None:
                continue
            if field.message_type.GetOptions().map_entry:
                continue  # the schema has no maps
            if _is_repeated(field):
                for i, item in enumerate(value):
                    walk(item, f"{where}.{field.name}[{i}]")
            else:
                walk(value, f"{where}.{field.name}")

    walk(request, "request")


def _is_repeated(field):
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return is_repeated
    return field.label == field.LABEL_REPEATED


class Decoder:
    """Resolves the request through its dictionary, collecting problems."""

    def __init__(self, request, problems):
        self.request = request
        self.problems = problems
        d = request.dictionary
        self.dictionary = d
        self.strings = list(d.string_table)
        self.mappings = d.mapping_table
        self.locations = d.location_table
        self.functions = d.function_table
        self.links = d.link_table
        self.attributes = d.attribute_table
        self.stacks = d.stack_table
        self.stack_cache = {}
        self.attribute_cache = {}

    # -- index checks -------------------------------------------------------

    def index_ok(self, table_name, size, index, where, zero_allowed=True):
        """True when `index` addresses an entry; reports a problem otherwise."""
        if index < 0 or index >= size:
            self.problems.add(
                f"{where}: {table_name} index {index} out of range (table has {size} entries)"
            )
            return False
        if index == 0 and not zero_allowed:
            self.problems.add(
                f"{where}: {table_name} index 0 (the unset entry) where a real entry is required"
            )
            return False
        return True

    def string(self, index, where):
        if self.index_ok("string", len(self.strings), index, where):
            return self.strings[index]
        return f"<bad index {index}>"

    # -- dictionary ---------------------------------------------------------

    def check_dictionary(self):
        d = self.dictionary
        for _, field in TABLES:
            table = getattr(d, field)
            if len(table) == 0:
                self.problems.add(
                    f"dictionary.{field} is empty: its index 0 must hold the zero entry"
                )
                continue
            zero = table[0]
            if field == "string_table":
                if zero != "":
                    self.problems.add(f'dictionary.string_table[0] is {zero!r}, must be ""')
            elif zero != type(zero)():
                self.problems.add(
                    f"dictionary.{field}[0] is not the zero entry: {_short(zero)}"
                )

        seen = {}
        for i, s in enumerate(self.strings):
            if s in seen:
                self.problems.add(
                    f"dictionary.string_table[{i}] repeats string_table[{seen[s]}] {s!r}"
                )
            else:
                seen[s] = i

        for i, m in enumerate(self.mappings):
            where = f"dictionary.mapping_table[{i}]"
            self.string(m.filename_strindex, f"{where}.filename_strindex")
            self.attribute_map(m.attribute_indices, f"{where}.attribute_indices")
            if m.memory_limit and m.memory_limit < m.memory_start:
                self.problems.add(f"{where}: memory_limit < memory_start")

        for i, f in enumerate(self.functions):
            where = f"dictionary.function_table[{i}]"
            self.string(f.name_strindex, f"{where}.name_strindex")
            self.string(f.system_name_strindex, f"{where}.system_name_strindex")
            self.string(f.filename_strindex, f"{where}.filename_strindex")

        for i, loc in enumerate(self.locations):
            where = f"dictionary.location_table[{i}]"
            self.index_ok("mapping", len(self.mappings), loc.mapping_index, f"{where}.mapping_index")
            for j, line in enumerate(loc.lines):
                self.index_ok(
                    "function",
                    len(self.functions),
                    line.function_index,
                    f"{where}.lines[{j}].function_index",
                    zero_allowed=False,
                )
            self.attribute_map(loc.attribute_indices, f"{where}.attribute_indices")

        for i, link in enumerate(self.links):
            if i == 0:
                continue  # checked as the zero entry above
            where = f"dictionary.link_table[{i}]"
            if len(link.trace_id) != 16:
                self.problems.add(f"{where}: trace_id has {len(link.trace_id)} bytes, not 16")
            elif link.trace_id == bytes(16):
                self.problems.add(f"{where}: trace_id is all zero")
            if len(link.span_id) != 8:
                self.problems.add(f"{where}: span_id has {len(link.span_id)} bytes, not 8")
            elif link.span_id == bytes(8):
                self.problems.add(f"{where}: span_id is all zero")

        for i, kv in enumerate(self.attributes):
            where = f"dictionary.attribute_table[{i}]"
            key = self.string(kv.key_strindex, f"{where}.key_strindex")
            if i != 0 and kv.key_strindex == 0:
                self.problems.add(f"{where}: empty key (key_strindex 0)")
            self.string(kv.unit_strindex, f"{where}.unit_strindex")
            self.any_value(kv.value, f"{where}.value ({key})")

        for i, stack in enumerate(self.stacks):
            where = f"dictionary.stack_table[{i}]"
            for j, loc in enumerate(stack.location_indices):
                self.index_ok(
                    "location",
                    len(self.locations),
                    loc,
                    f"{where}.location_indices[{j}]",
                    zero_allowed=False,
                )

    # -- values -------------------------------------------------------------

    def any_value(self, value, where):
        """The JSON form of an AnyValue."""
        kind = value.WhichOneof("value")
        if kind is None:
            return None
        if kind == "string_value_strindex":
            return self.string(value.string_value_strindex, f"{where}.string_value_strindex")
        if kind == "bytes_value":
            return value.bytes_value.hex()
        if kind == "array_value":
            return [
                self.any_value(v, f"{where}.array_value[{i}]")
                for i, v in enumerate(value.array_value.values)
            ]
        if kind == "kvlist_value":
            return self.key_values(value.kvlist_value.values, f"{where}.kvlist_value")
        if kind == "double_value" and not math.isfinite(value.double_value):
            return repr(value.double_value)  # JSON has no NaN or infinity
        return getattr(value, kind)

    def key_values(self, key_values, where):
        """A {key: value} object of KeyValue messages (key or key_strindex)."""
        out = {}
        for i, kv in enumerate(key_values):
            here = f"{where}[{i}]"
            if kv.key_strindex:
                if kv.key:
                    self.problems.add(f"{here}: both key {kv.key!r} and key_strindex are set")
                key = self.string(kv.key_strindex, f"{here}.key_strindex")
            else:
                key = kv.key
            if key == "":
                self.problems.add(f"{here}: empty key")
            if key in out:
                self.problems.add(f"{here}: repeated key {key!r}")
            out[key] = self.any_value(kv.value, f"{here}.value ({key})")
        return out

    def attribute_map(self, indices, where):
        """A {key: value} object of attribute_table entries; checks indices and unique keys."""
        out = {}
        for i, index in enumerate(indices):
            here = f"{where}[{i}]"
            if not self.index_ok(
                "attribute", len(self.attributes), index, here, zero_allowed=False
            ):
                continue
            key, value = self._attribute(index)
            if key in out:
                self.problems.add(f"{where}: repeated attribute key {key!r}")
            out[key] = value
        return out

    def _attribute(self, index):
        """(key, value) of attribute_table[index], a valid index. The entry itself
        was checked (and its problems reported) by check_dictionary."""
        cached = self.attribute_cache.get(index)
        if cached is None:
            kv = self.attributes[index]
            cached = (self._quiet_string(kv.key_strindex), self._quiet_value(kv.value))
            self.attribute_cache[index] = cached
        return cached

    def value_type(self, vt):
        return f"{self._quiet_string(vt.type_strindex)}/{self._quiet_string(vt.unit_strindex)}"

    def _quiet_string(self, index):
        # For text that was already checked (and reported) by check_*.
        if 0 <= index < len(self.strings):
            return self.strings[index]
        return f"<bad index {index}>"

    # -- stacks -------------------------------------------------------------

    def frames(self, stack_index):
        cached = self.stack_cache.get(stack_index)
        if cached is not None:
            return cached
        frames = []
        if 0 <= stack_index < len(self.stacks):
            for loc_index in self.stacks[stack_index].location_indices:
                frames.extend(self.location_frames(loc_index))
        self.stack_cache[stack_index] = frames
        return frames

    def location_frames(self, loc_index):
        # Indices were checked in check_dictionary; resolve quietly here.
        if not 0 <= loc_index < len(self.locations):
            return [_frame(f"<bad index {loc_index}>", "", "", 0, 0, "", {}, {})]
        loc = self.locations[loc_index]
        mapping = ""
        mapping_attrs = {}
        if loc.mapping_index and 0 <= loc.mapping_index < len(self.mappings):
            m = self.mappings[loc.mapping_index]
            mapping = self._quiet_string(m.filename_strindex)
            mapping_attrs = self._quiet_attributes(m.attribute_indices)
        attrs = self._quiet_attributes(loc.attribute_indices)
        if not loc.lines:
            return [_frame("", "", "", 0, loc.address, mapping, attrs, mapping_attrs)]
        out = []
        for line in loc.lines:
            if 0 < line.function_index < len(self.functions):
                fn = self.functions[line.function_index]
                name = self._quiet_string(fn.name_strindex)
                system_name = self._quiet_string(fn.system_name_strindex)
                file = self._quiet_string(fn.filename_strindex)
            else:
                name, system_name, file = f"<bad index {line.function_index}>", "", ""
            out.append(
                _frame(name, system_name, file, line.line, loc.address, mapping, attrs, mapping_attrs)
            )
        return out

    def _quiet_attributes(self, indices):
        out = {}
        for index in indices:
            if 0 < index < len(self.attributes):
                key, value = self._attribute(index)
                out[key] = value
        return out

    def _quiet_value(self, value):
        saved = self.problems
        self.problems = Problems()  # already reported by check_dictionary
        try:
            return self.any_value(value, "")
        finally:
            self.problems = saved

    # -- the request --------------------------------------------------------

    def resources(self):
        out = []
        for r, rp in enumerate(self.request.resource_profiles):
            where = f"resource_profiles[{r}]"
            resource = {
                "attributes": self.key_values(
                    rp.resource.attributes, f"{where}.resource.attributes"
                ),
                "schema_url": rp.schema_url,
                "scopes": [],
            }
            for s, sp in enumerate(rp.scope_profiles):
                here = f"{where}.scope_profiles[{s}]"
                self.key_values(sp.scope.attributes, f"{here}.scope.attributes")
                resource["scopes"].append(
                    {
                        "name": sp.scope.name,
                        "version": sp.scope.version,
                        "schema_url": sp.schema_url,
                        "profiles": [
                            self.profile(p, f"{here}.profiles[{i}]")
                            for i, p in enumerate(sp.profiles)
                        ],
                    }
                )
            out.append(resource)
        return out

    def profile(self, p, where):
        self.string(p.sample_type.type_strindex, f"{where}.sample_type.type_strindex")
        self.string(p.sample_type.unit_strindex, f"{where}.sample_type.unit_strindex")
        period_type = None
        if p.HasField("period_type"):
            self.string(p.period_type.type_strindex, f"{where}.period_type.type_strindex")
            self.string(p.period_type.unit_strindex, f"{where}.period_type.unit_strindex")
            period_type = self.value_type(p.period_type)
        if p.profile_id and (len(p.profile_id) != 16 or p.profile_id == bytes(16)):
            self.problems.add(
                f"{where}.profile_id: {len(p.profile_id)} bytes {p.profile_id.hex()}, "
                "must be 16 bytes, not all zero (or empty)"
            )
        start = p.time_unix_nano
        end = start + p.duration_nano
        samples = []
        for i, sample in enumerate(p.samples):
            here = f"{where}.samples[{i}]"
            self.index_ok(
                "stack",
                len(self.stacks),
                sample.stack_index,
                f"{here}.stack_index",
                zero_allowed=False,
            )
            link = None
            if self.index_ok("link", len(self.links), sample.link_index, f"{here}.link_index"):
                if sample.link_index:
                    entry = self.links[sample.link_index]
                    link = {"trace_id": entry.trace_id.hex(), "span_id": entry.span_id.hex()}
            values = list(sample.values)
            timestamps = list(sample.timestamps_unix_nano)
            if not values and not timestamps:
                self.problems.add(f"{here}: neither values nor timestamps")
            elif values and timestamps and len(values) != len(timestamps):
                self.problems.add(
                    f"{here}: {len(values)} values but {len(timestamps)} timestamps"
                )
            # The proto: timestamps fall in [time_unix_nano, time_unix_nano + duration_nano).
            outside = [t for t in timestamps if t < start or t >= end]
            if outside:
                self.problems.add(
                    f"{here}: {len(outside)} timestamps outside the profile's "
                    f"[{start}, {end}) (first {outside[0]})"
                )
            samples.append(
                {
                    "frames": self.frames(sample.stack_index),
                    "values": values,
                    "timestamps": timestamps,
                    "attributes": self.attribute_map(
                        sample.attribute_indices, f"{here}.attribute_indices"
                    ),
                    "link": link,
                }
            )
        return {
            "sample_type": self.value_type(p.sample_type),
            "period_type": period_type,
            "period": p.period,
            "time_unix_nano": p.time_unix_nano,
            "duration_nano": p.duration_nano,
            "attributes": self.attribute_map(p.attribute_indices, f"{where}.attribute_indices"),
            "samples": samples,
        }


def _frame(function, system_name, file, line, address, mapping, attributes, mapping_attributes):
    return {
        "function": function,
        "system_name": system_name,
        "file": file,
        "line": line,
        "address": address,
        "mapping": mapping,
        "attributes": attributes,
        "mapping_attributes": mapping_attributes,
    }


def _short(message):
    text = str(message).replace("\n", " ").strip()
    return text if len(text) <= 120 else text[:117] + "..."


def decode(data):
    """(JSON object, exit status) for the serialized request in `data`."""
    problems = Problems()
    try:
        request = parse_request(data)
    except ValueError as e:
        return {"dictionary": {}, "problems": [f"decode: {e}"], "resources": []}, 1
    unknown_field_problems(request, problems)
    decoder = Decoder(request, problems)
    decoder.check_dictionary()
    resources = decoder.resources()
    sizes = {name: len(getattr(request.dictionary, field)) for name, field in TABLES}
    return {"dictionary": sizes, "problems": problems.as_list(), "resources": resources}, 0


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        sys.stderr.write("usage: decode_otlp.py FILE   (FILE `-` reads stdin)\n")
        return 2
    try:
        data = read_input(argv[1])
    except OSError as e:
        out, status = {"dictionary": {}, "problems": [f"decode: cannot read {argv[1]}: {e}"],
                       "resources": []}, 1
    else:
        out, status = decode(data)
    # One write: json.dump's many small writes are slow on a pipe.
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
