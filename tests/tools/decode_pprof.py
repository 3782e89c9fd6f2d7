#!/usr/bin/env python3
"""Independent pprof decoder for the spanprof tests.

Decodes a pprof profile (gzipped or not) with Python `protobuf` and the
profile.proto beside this file, written from the public format description,
so it shares no code with spanprof's encoder. The Python module is generated
at run time with `python -m grpc_tools.protoc` (PyPI `grpcio-tools`).

It validates the format's invariants and prints the resolved profile as JSON
on stdout:

    {"sample_types": [{"type": "samples", "unit": "count"}],
     "period_type": {"type": "cpu", "unit": "nanoseconds"}, "period": 10101010,
     "totals": {"samples": 1234}, "total_values": [1234],
     "samples": [{"values": [3],
                  "stack": [{"function": "hot_alpha", "file": ".../cpu_split.c",
                             "line": 36, ...}, ...],          # leaf first
                  "stack_leaf_first": ["hot_alpha", "dispatcher", "main", ...],
                  "stack_root_first": [..., "main", "dispatcher", "hot_alpha"],
                  "labels": [{"key": "thread.id", "num": 4242}, ...]}],
     "mappings": [...], "functions": [...], "locations": [...], ...}

A location without lines (an address no name was given for) is one frame with
"function", "file" and "line" null, named `[0xADDRESS in BASENAME]` in the
stack_* lists.

An invalid profile makes it print `invalid pprof: ...` lines on stderr and
exit with status 1. Usage errors exit with 2.

    decode_pprof.py PROFILE.pb.gz     decode and print JSON
    decode_pprof.py --self-test       check the decoder on hand-made profiles
"""

import gzip
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = "profile.proto"


class InvalidProfile(Exception):
    """The profile breaks one or more invariants of the pprof format."""

    def __init__(self, problems):
        super().__init__("; ".join(problems))
        self.problems = problems


def load_profile_pb2():
    """Generate profile_pb2.py from profile.proto into a temporary directory and import it."""
    with tempfile.TemporaryDirectory(prefix="spanprof-pprof-") as out_dir:
        return _generate_and_import(out_dir)


def _generate_and_import(out_dir):
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={HERE}",
        f"--python_out={out_dir}",
        os.path.join(HERE, PROTO),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(
            "error: failed to generate profile_pb2 with grpc_tools.protoc "
            f"(is grpcio-tools installed?): {result.stderr.strip()}\n"
        )
        sys.exit(2)
    sys.path.insert(0, out_dir)
    try:
        import profile_pb2  # noqa: E402  (generated just above)
    finally:
        sys.path.remove(out_dir)
    return profile_pb2


def decode(pb2, data):
    """Parse, validate and resolve a serialized Profile, gzipped or not. Raises InvalidProfile."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError) as e:
            raise InvalidProfile([f"bad gzip data: {e}"]) from e
    prof = pb2.Profile()
    try:
        prof.ParseFromString(data)
    except Exception as e:  # DecodeError and friends
        raise InvalidProfile([f"not a Profile message: {e}"]) from e
    return resolve(prof)


def _unnamed(frame):
    """The name of a location without lines (an address left for a tool to symbolize):
    `[0xADDRESS in BASENAME]`, `[0xADDRESS]` without a mapping."""
    mapping = frame["mapping"]
    if mapping:
        return f"[{hex(frame['address'])} in {mapping.rsplit('/', 1)[-1]}]"
    return f"[{hex(frame['address'])}]"


def resolve(prof):
    problems = []
    strings = list(prof.string_table)

    if not strings:
        problems.append("string_table is empty (string_table[0] must be \"\")")
    elif strings[0] != "":
        problems.append(f"string_table[0] is {strings[0]!r}, must be \"\"")

    def s(index, what):
        if index < 0 or index >= len(strings):
            problems.append(f"{what}: string index {index} out of range (table has {len(strings)})")
            return None
        return strings[index]

    def value_type(vt, what):
        return {"type": s(vt.type, f"{what}.type"), "unit": s(vt.unit, f"{what}.unit")}

    sample_types = [value_type(vt, f"sample_type[{i}]") for i, vt in enumerate(prof.sample_type)]
    period_type = value_type(prof.period_type, "period_type") if prof.HasField("period_type") else None

    def index_by_id(items, kind):
        table = {}
        for i, item in enumerate(items):
            if item.id == 0:
                problems.append(f"{kind}[{i}] has id 0 (ids must be nonzero)")
            elif item.id in table:
                problems.append(f"{kind}[{i}] repeats id {item.id}")
            else:
                table[item.id] = item
        return table

    mappings = index_by_id(prof.mapping, "mapping")
    functions = index_by_id(prof.function, "function")
    locations = index_by_id(prof.location, "location")

    mapping_out = {}
    for m in prof.mapping:
        mapping_out[m.id] = {
            "id": m.id,
            "memory_start": m.memory_start,
            "memory_limit": m.memory_limit,
            "file_offset": m.file_offset,
            "filename": s(m.filename, f"mapping {m.id} filename"),
            "build_id": s(m.build_id, f"mapping {m.id} build_id"),
            "has_functions": m.has_functions,
            "has_filenames": m.has_filenames,
            "has_line_numbers": m.has_line_numbers,
            "has_inline_frames": m.has_inline_frames,
        }
        if m.memory_limit and m.memory_limit < m.memory_start:
            problems.append(f"mapping {m.id}: memory_limit < memory_start")

    function_out = {}
    for f in prof.function:
        function_out[f.id] = {
            "id": f.id,
            "name": s(f.name, f"function {f.id} name"),
            "system_name": s(f.system_name, f"function {f.id} system_name"),
            "filename": s(f.filename, f"function {f.id} filename"),
            "start_line": f.start_line,
        }

    location_out = {}
    for loc in prof.location:
        if loc.mapping_id != 0 and loc.mapping_id not in mappings:
            problems.append(f"location {loc.id}: mapping_id {loc.mapping_id} does not exist")
        lines = []
        for j, line in enumerate(loc.line):
            if line.function_id == 0:
                problems.append(f"location {loc.id} line[{j}]: function_id is 0")
            elif line.function_id not in functions:
                problems.append(f"location {loc.id} line[{j}]: function_id {line.function_id} does not exist")
            lines.append({"function_id": line.function_id, "line": line.line, "column": line.column})
        location_out[loc.id] = {
            "id": loc.id,
            "mapping_id": loc.mapping_id,
            "address": loc.address,
            "lines": lines,
            "is_folded": loc.is_folded,
        }

    def frames_of(loc_id):
        """Frames of one location, innermost (inlined) first."""
        loc = location_out.get(loc_id)
        if loc is None:
            return []
        mapping = mapping_out.get(loc["mapping_id"])
        base = {
            "location_id": loc_id,
            "address": loc["address"],
            "mapping": mapping["filename"] if mapping else None,
        }
        if not loc["lines"]:
            return [dict(base, function=None, system_name=None, file=None, line=None, start_line=None)]
        out = []
        for line in loc["lines"]:
            fn = function_out.get(line["function_id"], {})
            out.append(
                dict(
                    base,
                    function=fn.get("name"),
                    system_name=fn.get("system_name"),
                    file=fn.get("filename"),
                    line=line["line"],
                    start_line=fn.get("start_line"),
                )
            )
        return out

    totals = [0] * len(sample_types)
    samples_out = []
    for i, sample in enumerate(prof.sample):
        if len(sample.value) != len(sample_types):
            problems.append(
                f"sample[{i}] has {len(sample.value)} values for {len(sample_types)} sample types"
            )
        stack = []
        for loc_id in sample.location_id:
            if loc_id == 0:
                problems.append(f"sample[{i}]: location_id 0")
            elif loc_id not in locations:
                problems.append(f"sample[{i}]: location_id {loc_id} does not exist")
            stack.extend(frames_of(loc_id))
        labels = []
        for j, label in enumerate(sample.label):
            what = f"sample[{i}] label[{j}]"
            if label.key == 0:
                problems.append(f"{what}: key is string 0 (empty)")
            if label.str != 0 and label.num != 0:
                problems.append(f"{what}: both str and num are set")
            entry = {"key": s(label.key, f"{what} key")}
            if label.str != 0:
                entry["str"] = s(label.str, f"{what} str")
            else:
                entry["num"] = label.num
                if label.num_unit != 0:
                    entry["num_unit"] = s(label.num_unit, f"{what} num_unit")
            labels.append(entry)
        for k, v in enumerate(sample.value):
            if k < len(totals):
                totals[k] += v
        names = [frame["function"] if frame["function"] is not None else _unnamed(frame) for frame in stack]
        samples_out.append(
            {
                "values": list(sample.value),
                "stack": stack,
                "stack_leaf_first": names,
                "stack_root_first": list(reversed(names)),
                "labels": labels,
            }
        )

    drop_frames = s(prof.drop_frames, "drop_frames")
    keep_frames = s(prof.keep_frames, "keep_frames")
    comments = [s(c, f"comment[{i}]") for i, c in enumerate(prof.comment)]
    default_sample_type = s(prof.default_sample_type, "default_sample_type")
    doc_url = s(prof.doc_url, "doc_url")

    if problems:
        raise InvalidProfile(problems)

    return {
        "sample_types": sample_types,
        "period_type": period_type,
        "period": prof.period,
        "time_nanos": prof.time_nanos,
        "duration_nanos": prof.duration_nanos,
        "default_sample_type": default_sample_type,
        "drop_frames": drop_frames,
        "keep_frames": keep_frames,
        "doc_url": doc_url,
        "comments": comments,
        "totals": {vt["type"]: totals[k] for k, vt in enumerate(sample_types)},
        "total_values": totals,
        "samples": samples_out,
        "mappings": list(mapping_out.values()),
        "functions": list(function_out.values()),
        "locations": list(location_out.values()),
        "string_table_size": len(strings),
    }


def self_test(pb2):
    """Check the decoder on a hand-made valid profile and on broken variants of it."""

    def valid():
        p = pb2.Profile()
        p.string_table.extend(
            ["", "samples", "count", "cpu", "nanoseconds", "hot_alpha", "main",
             "/src/cpu_split.c", "/bin/cpu_split", "thread.id", "thread.name", "worker"]
        )
        p.sample_type.add(type=1, unit=2)
        p.period_type.type = 3
        p.period_type.unit = 4
        p.period = 10101010
        p.mapping.add(id=1, memory_start=0x1000, memory_limit=0x2000, filename=8, has_functions=True)
        p.function.add(id=1, name=5, system_name=5, filename=7, start_line=30)
        p.function.add(id=2, name=6, system_name=6, filename=7, start_line=60)
        p.location.add(id=1, mapping_id=1, address=0x1100).line.add(function_id=1, line=33)
        p.location.add(id=2, mapping_id=1, address=0x1200).line.add(function_id=2, line=64)
        s = p.sample.add(location_id=[1, 2], value=[3])
        s.label.add(key=9, num=77)
        s.label.add(key=10, str=11)
        p.sample.add(location_id=[2], value=[1])
        return p

    out = resolve(valid())
    assert out["sample_types"] == [{"type": "samples", "unit": "count"}], out["sample_types"]
    assert out["period_type"] == {"type": "cpu", "unit": "nanoseconds"}
    assert out["totals"] == {"samples": 4}, out["totals"]
    first = out["samples"][0]
    assert first["stack_leaf_first"] == ["hot_alpha", "main"]
    assert first["stack_root_first"] == ["main", "hot_alpha"]
    assert first["stack"][0]["file"] == "/src/cpu_split.c" and first["stack"][0]["line"] == 33
    assert first["stack"][0]["mapping"] == "/bin/cpu_split"
    assert first["labels"] == [{"key": "thread.id", "num": 77}, {"key": "thread.name", "str": "worker"}]
    roundtrip = decode(pb2, gzip.compress(valid().SerializeToString()))
    assert roundtrip == out

    def broken(name, mutate, expect):
        p = valid()
        mutate(p)
        try:
            resolve(p)
        except InvalidProfile as e:
            assert any(expect in problem for problem in e.problems), (name, e.problems)
            return
        raise AssertionError(f"{name}: accepted an invalid profile")

    broken("string 0", lambda p: p.string_table.__setitem__(0, "x"), "string_table[0]")
    broken("no strings", lambda p: p.ClearField("string_table"), "string_table is empty")
    broken("sample location 0", lambda p: p.sample[0].location_id.append(0), "location_id 0")
    broken("missing location", lambda p: p.sample[0].location_id.append(9), "location_id 9 does not exist")
    broken("location id 0", lambda p: setattr(p.location[0], "id", 0), "id 0")
    broken("duplicate function", lambda p: setattr(p.function[1], "id", 1), "repeats id 1")
    broken("missing function", lambda p: setattr(p.location[0].line[0], "function_id", 5), "function_id 5")
    broken("function 0", lambda p: setattr(p.location[0].line[0], "function_id", 0), "function_id is 0")
    broken("missing mapping", lambda p: setattr(p.location[0], "mapping_id", 4), "mapping_id 4")
    broken("mapping id 0", lambda p: setattr(p.mapping[0], "id", 0), "mapping[0] has id 0")
    broken("string range", lambda p: setattr(p.function[0], "name", 99), "out of range")
    broken("values", lambda p: p.sample[0].value.append(1), "values for 1 sample types")
    broken("label key", lambda p: setattr(p.sample[0].label[0], "key", 0), "key is string 0")
    broken("label both", lambda p: setattr(p.sample[0].label[1], "num", 5), "both str and num")

    for garbage in (b"\xff\xff\xff", b"\x1f\x8b\x08\x00trunc"):
        try:
            decode(pb2, garbage)
        except InvalidProfile:
            pass
        else:
            raise AssertionError(f"garbage bytes accepted: {garbage!r}")
    print("decode_pprof self-test: ok")


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    pb2 = load_profile_pb2()
    if argv[1] == "--self-test":
        self_test(pb2)
        return 0
    try:
        with open(argv[1], "rb") as f:
            data = f.read()
    except OSError as e:
        sys.stderr.write(f"error: cannot read {argv[1]}: {e}\n")
        return 2
    try:
        out = decode(pb2, data)
    except InvalidProfile as e:
        for problem in e.problems:
            sys.stderr.write(f"invalid pprof: {problem}\n")
        return 1
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
