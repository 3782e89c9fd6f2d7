#!/usr/bin/env python3
"""Writes the seed inputs of spanprof's fuzz targets into fuzz/corpus/<target>/.

    python3 fuzz/make_seeds.py

The seeds are committed; this script says how they were made. pprof_profile's seeds are real
profiles (spanprof runs of tests' workloads, gzipped and plain) and one made by
tests/tools/craft_pprof.py with span labels; they are not rewritten here.

- otel_process_ctx: a valid OTEP 4719 header at the input's start (the fuzz target maps the
  input at 0x10000) pointing at a ProcessContext payload right after it.
- otel_thread_ctx_elf: a small shared library and a small executable defining the TLS symbol
  otel_thread_ctx_v1 (gcc, stripped).
- python_line_table: real line tables of pyenv's CPython 3.8 (co_lnotab), 3.10 (PEP 626) and
  3.12 (locations), behind the target's selector byte, first line and instruction offset.
- python_memory: a real code object of CPython 3.8 and 3.12, copied out of a running
  interpreter with its name, file name and line table objects, relocated to the fuzz target's
  base address so that its pointers lead back into the input.
"""

import glob
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
BASE = 0x10000  # spanprof_fuzz::BASE


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data)


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def any_string(s):
    return field(1, s.encode())


def key_value(key, any_value):
    return field(1, key.encode()) + field(2, any_value)


def process_ctx():
    resource = field(1, key_value("service.name", any_string("nova-api")))
    keys = b"".join(field(1, any_string(k)) for k in
                    ["osprofiler.base_id", "osprofiler.trace_id", "osprofiler.parent_id"])
    attrs = (field(2, key_value("threadlocal.schema_version", any_string("tlsdesc_v1_dev")))
             + field(2, key_value("threadlocal.attribute_key_map", field(5, keys))))
    payload = field(1, resource) + attrs
    header = b"OTEL_CTX" + struct.pack("<IIQQ", 2, len(payload), 123456789, BASE + 32)
    write("otel_process_ctx", "valid", header + payload)
    write("otel_process_ctx", "payload_only", payload)


def tls_elfs():
    src = "__thread void *otel_thread_ctx_v1;\nvoid *get(void) { return otel_thread_ctx_v1; }\n"
    small = ["-Os", "-Wl,-z,max-page-size=0x1000", "-Wl,-z,noseparate-code", "-s"]
    with tempfile.TemporaryDirectory() as d:
        c = os.path.join(d, "tls.c")
        with open(c, "w") as f:
            f.write(src)
        lib = os.path.join(d, "libtls.so")
        subprocess.run(["gcc", "-shared", "-fPIC", "-mtls-dialect=gnu2", "-nostdlib", *small,
                        "-o", lib, c], check=True)
        with open(lib, "rb") as f:
            write("otel_thread_ctx_elf", "shared_tlsdesc", f.read())
        lib2 = os.path.join(d, "libtls_gd.so")
        subprocess.run(["gcc", "-shared", "-fPIC", "-mtls-dialect=gnu", "-nostdlib", *small,
                        "-o", lib2, c], check=True)
        with open(lib2, "rb") as f:
            write("otel_thread_ctx_elf", "shared_gd", f.read())
        exe = os.path.join(d, "exe")
        with open(c, "a") as f:
            f.write("int main(void) { return get() != 0; }\n")
        subprocess.run(["gcc", "-no-pie", "-rdynamic", *small, "-o", exe, c], check=True)
        with open(exe, "rb") as f:
            write("otel_thread_ctx_elf", "executable_local_exec", f.read())


def pyenv(minor):
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")))
    if not found:
        sys.exit(f"make_seeds: no pyenv CPython 3.{minor}")
    return found[-1]


SAMPLE = '''
def handle(request):
    total = 0
    for item in request:
        if item % 3:
            total += item * 2
        else:
            total -= 1
    return total
'''


def line_tables():
    for minor, selector, attr in [(8, 0, "co_lnotab"), (10, 1, "co_linetable"),
                                  (12, 2, "co_linetable")]:
        code = SAMPLE + f"import sys\nc = handle.__code__\nsys.stdout.write(c.{attr}.hex())\n"
        out = subprocess.run([pyenv(minor), "-c", code], check=True, capture_output=True,
                             text=True).stdout
        table = bytes.fromhex(out)
        for offset in (0, 10, 24):
            write("python_line_table", f"3_{minor}_at_{offset}",
                  bytes([selector]) + struct.pack("<II", 2, offset) + table)


# (name, qualname, filename, firstlineno, linetable) offsets in PyCodeObject, the str data
# offset of a compact ASCII str, and the index of the version in symbolizer's offsets::ALL.
CODE_LAYOUT = {
    8: dict(name=112, qualname=None, filename=104, linetable=120, size=160, index=0),
    12: dict(name=120, qualname=128, filename=112, linetable=136, size=200, index=4),
}

DUMP = '''
import ctypes, sys
SAMPLE
code = handle.__code__
size, fields = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",") if x]
def obj(o, n):
    return ctypes.string_at(id(o), n).hex()
ptrs = [ctypes.c_uint64.from_address(id(code) + f).value for f in fields]
objs = []
for p, f in zip(ptrs, fields):
    o = ctypes.cast(p, ctypes.py_object).value
    n = sys.getsizeof(o)
    objs.append(obj(o, n))
print(obj(code, size))
print(" ".join(objs))
'''.replace("SAMPLE", SAMPLE)


def code_objects():
    for minor, layout in CODE_LAYOUT.items():
        fields = [layout[k] for k in ("name", "qualname", "filename", "linetable") if layout[k]]
        out = subprocess.run([pyenv(minor), "-c", DUMP, str(layout["size"]),
                              ",".join(map(str, fields))],
                             check=True, capture_output=True, text=True).stdout.split("\n")
        code = bytearray(bytes.fromhex(out[0]))
        blobs = [bytes.fromhex(h) for h in out[1].split()]
        image = bytearray(code)
        for f, blob in zip(fields, blobs):
            image += b"\0" * (-len(image) % 16)
            struct.pack_into("<Q", image, f, BASE + len(image))
            image += blob
        write("python_memory", f"code_3_{minor}", bytes([layout["index"]]) + bytes(image))


def main():
    process_ctx()
    tls_elfs()
    line_tables()
    code_objects()


if __name__ == "__main__":
    main()
