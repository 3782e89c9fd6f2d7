#!/usr/bin/env python3
"""Writes a hand-made pprof profile, as spanprof writes them, for the tests of
`spanprof check`, `report` and `diff` on profiles whose shares are known.

It builds the message with Python `protobuf` from the profile.proto beside
this file (the decoder's, `decode_pprof.load_profile_pb2`), not with spanprof's
encoder, and follows the conventions spanprof's reader asks for: sample types
`samples/count`, period `cpu/nanoseconds`, a `target: ...` comment.

    craft_pprof.py SPEC.json OUT.pb.gz

SPEC is {"target": "crafted", "frequency": 100,
         "stacks": [[["main", "work", "leaf"], 30], ...]}   (root first)

A stack may have a third element, string labels of its sample, e.g. a span:
    [["main", "handle"], 4, {"trace_id": "4bf9...", "span_id": "00f0...",
                            "span.name": "GET /servers"}]
"""

import gzip
import json
import sys

import decode_pprof


def craft(pb2, spec):
    prof = pb2.Profile()
    strings = [""]
    index = {"": 0}

    def s(text):
        if text not in index:
            index[text] = len(strings)
            strings.append(text)
        return index[text]

    prof.sample_type.add(type=s("samples"), unit=s("count"))
    prof.period_type.type = s("cpu")
    prof.period_type.unit = s("nanoseconds")
    prof.period = 1_000_000_000 // spec.get("frequency", 100)
    prof.time_nanos = 1_700_000_000_000_000_000
    prof.duration_nanos = 2_000_000_000
    prof.comment.append(s("target: " + spec.get("target", "crafted")))
    prof.mapping.add(id=1, filename=s("/usr/bin/crafted"), memory_start=0x1000,
                     memory_limit=0x100000, has_functions=True)
    locations = {}
    for entry in spec["stacks"]:
        stack, count = entry[0], entry[1]
        labels = entry[2] if len(entry) > 2 else {}
        ids = []
        for name in reversed(stack):  # pprof: leaf first
            if name not in locations:
                n = len(locations) + 1
                prof.function.add(id=n, name=s(name), system_name=s(name))
                loc = prof.location.add(id=n, mapping_id=1, address=0x1000 + 16 * n)
                loc.line.add(function_id=n, line=n)
                locations[name] = n
            ids.append(locations[name])
        sample = prof.sample.add(location_id=ids, value=[count])
        sample.label.add(key=s("thread.id"), num=42)
        sample.label.add(key=s("thread.name"), str=s("crafted"))
        sample.label.add(key=s("process.id"), num=42)
        for key, value in labels.items():
            sample.label.add(key=s(key), str=s(value))
    prof.string_table.extend(strings)
    return prof


def main():
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    prof = craft(decode_pprof.load_profile_pb2(), spec)
    with open(sys.argv[2], "wb") as f:
        f.write(gzip.compress(prof.SerializeToString()))


if __name__ == "__main__":
    main()
