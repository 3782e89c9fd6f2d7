"""Tests of spanprof_context: the OTEP 4947 thread records and the OTEP 4719 process context.

Run with the package and the tracing libraries on the path, e.g.

    PYTHONPATH=target/span-libs/3.11 python3.11 -m unittest discover -s python/spanprof-context/tests

The OpenTelemetry and OSProfiler tests are skipped when those libraries are not importable.
"""

import ctypes
import os
import platform
import shutil
import struct
import subprocess
import threading
import time
import unittest
import uuid

import spanprof_context
from spanprof_context import _native

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
except ImportError:  # pragma: no cover
    trace = None

try:
    from osprofiler import profiler as osp
except ImportError:  # pragma: no cover
    osp = None

MAPPING_NAMES = ("[anon_shmem:OTEL_CTX]", "[anon:OTEL_CTX]", "/memfd:OTEL_CTX")
KEY_MAP = [
    "osprofiler.base_id",
    "osprofiler.trace_id",
    "osprofiler.parent_id",
    "spanprof.python_context",
]
# The key of the Python context address published with the OpenTelemetry ids.
KEY_PY_CONTEXT = 3


# ---------------------------------------------------------------------------------------------
# Independent decoders (not the package's code)


def parse_record(raw):
    """(trace_id int, span_id int, valid, flags, {key_idx: str}) of an OTEP 4947 record."""
    assert len(raw) >= 28, raw
    trace_id = int.from_bytes(raw[0:16], "big")
    span_id = int.from_bytes(raw[16:24], "big")
    valid, flags = raw[24], raw[25]
    (size,) = struct.unpack("=H", raw[26:28])
    attrs_raw = raw[28 : 28 + size]
    assert len(attrs_raw) == size, (len(attrs_raw), size)
    attrs = {}
    i = 0
    while i + 2 <= size:
        key, n = attrs_raw[i], attrs_raw[i + 1]
        assert i + 2 + n <= size
        attrs[key] = attrs_raw[i + 2 : i + 2 + n].decode("utf-8")
        i += 2 + n
    assert i == size, "trailing bytes in attrs_data"
    return trace_id, span_id, valid, flags, attrs


def read_memory(address, size):
    with open("/proc/self/mem", "rb") as f:
        f.seek(address)
        return f.read(size)


def current_record():
    """This thread's record, read through the TLS pointer (not through record_bytes())."""
    ptr = _native.address()
    if ptr == 0:
        return None
    head = read_memory(ptr, 28)
    (size,) = struct.unpack("=H", head[26:28])
    raw = read_memory(ptr, 28 + size)
    assert raw == _native.record_bytes(), "record_bytes() differs from the memory at address()"
    trace_id, span_id, valid, flags, attrs = parse_record(raw)
    # With OpenTelemetry ids (and room for it), the address of the thread's Python context; the
    # tests compare the other attributes.
    context = attrs.pop(KEY_PY_CONTEXT, None)
    if span_id and valid == 1:
        # (0 in a thread that never used contextvars)
        assert context is not None and len(context) == 16 and int(context, 16) >= 0, context
    else:
        assert context is None, context
    return trace_id, span_id, valid, flags, attrs


def pb_fields(buf):
    """Protobuf wire format -> list of (field number, wire type, value)."""
    out = []
    i = 0
    while i < len(buf):
        key, i = pb_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = pb_varint(buf, i)
        elif wire == 1:
            v = buf[i : i + 8]
            i += 8
        elif wire == 2:
            n, i = pb_varint(buf, i)
            v = buf[i : i + n]
            assert len(v) == n
            i += n
        elif wire == 5:
            v = buf[i : i + 4]
            i += 4
        else:
            raise AssertionError("wire type %d" % wire)
        out.append((field, wire, v))
    return out


def pb_varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def pb_any_value(buf):
    (field, wire, v), = pb_fields(buf)
    if field == 1:
        return v.decode("utf-8")
    if field == 2:
        return bool(v)
    if field == 3:
        return v - (1 << 64) if v >= 1 << 63 else v
    if field == 4:
        return struct.unpack("<d", v)[0]
    if field == 5:
        return [pb_any_value(x) for f, _, x in pb_fields(v) if f == 1]
    if field == 7:
        return bytes(v)
    raise AssertionError("AnyValue field %d" % field)


def pb_key_values(items):
    out = {}
    for buf in items:
        kv = {f: v for f, _, v in pb_fields(buf)}
        out[kv[1].decode("utf-8")] = pb_any_value(kv[2])
    return out


def decode_process_context(payload):
    """(resource attributes, attributes) of a ProcessContext message."""
    fields = pb_fields(payload)
    resources = [v for f, w, v in fields if f == 1 and w == 2]
    assert len(resources) == 1, fields
    res_attrs = pb_key_values(v for f, w, v in pb_fields(resources[0]) if f == 1 and w == 2)
    attrs = pb_key_values(v for f, w, v in fields if f == 2 and w == 2)
    return res_attrs, attrs


def context_mapping():
    """(start, end, name) of this process's OTEL_CTX mapping, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            name = parts[5].strip() if len(parts) == 6 else ""
            if name.startswith(MAPPING_NAMES):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                return start, end, name
    return None


def boottime_ns():
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def read_process_context():
    """(header fields, payload) read through /proc/self/mem like an outside reader."""
    found = context_mapping()
    assert found, "no OTEL_CTX mapping in /proc/self/maps"
    start, _, name = found
    header = read_memory(start, 32)
    sig, version, size, ts, ptr = struct.unpack("=8sIIQQ", header)
    payload = read_memory(ptr, size)
    return {"start": start, "name": name, "signature": sig, "version": version, "size": size,
            "ts": ts, "payload_ptr": ptr}, payload


def uuids(n):
    return [str(uuid.uuid4()) for _ in range(n)]


# ---------------------------------------------------------------------------------------------


class TlsSymbol(unittest.TestCase):
    @unittest.skipUnless(shutil.which("readelf"), "no readelf")
    def test_in_dynsym_with_type_tls(self):
        out = subprocess.run(
            ["readelf", "-Ws", "--dyn-syms", _native.__file__],
            check=True, stdout=subprocess.PIPE, universal_newlines=True,
        ).stdout
        section = None
        found = []
        for line in out.splitlines():
            if line.startswith("Symbol table"):
                section = line.split("'")[1]
                continue
            cols = line.split()
            # Num: Value Size Type Bind Vis Ndx Name
            if len(cols) == 8 and cols[7] == "otel_thread_ctx_v1":
                found.append((section, cols))
        dyn = [cols for sec, cols in found if sec == ".dynsym"]
        self.assertEqual(len(dyn), 1, out)
        _, _, size, typ, bind, vis, ndx, _ = dyn[0]
        self.assertEqual(int(size), 8)
        self.assertEqual(typ, "TLS")
        self.assertEqual(bind, "GLOBAL")
        self.assertEqual(vis, "DEFAULT")
        self.assertNotEqual(ndx, "UND")

    @unittest.skipUnless(shutil.which("readelf") and platform.machine() == "x86_64", "x86_64")
    def test_tlsdesc_relocation(self):
        out = subprocess.run(
            ["readelf", "-rW", _native.__file__],
            check=True, stdout=subprocess.PIPE, universal_newlines=True,
        ).stdout
        relocs = [l.split()[2] for l in out.splitlines() if "otel_thread_ctx_v1" in l]
        self.assertEqual(relocs, ["R_X86_64_TLSDESC"], out)

    def test_tls_slot_is_this_threads(self):
        slot, tp = _native.tls_info()
        _native.set(1, 2, 1)
        try:
            self.assertEqual(ctypes.c_uint64.from_address(slot).value, _native.address())
        finally:
            _native.clear()
        self.assertEqual(ctypes.c_uint64.from_address(slot).value, 0)


class Record(unittest.TestCase):
    def tearDown(self):
        _native.clear()

    def test_nothing_published(self):
        _native.clear()
        self.assertEqual(_native.address(), 0)
        self.assertIsNone(_native.record_bytes())

    def test_set_layout(self):
        trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
        span_id = 0x00F067AA0BA902B7
        _native.set(trace_id, span_id, 1)
        raw = _native.record_bytes()
        self.assertEqual(
            raw[:28],
            bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736" "00f067aa0ba902b7") + b"\x01\x01\x12\x00",
        )
        # One attribute: the Python context's address, 16 hex digits under key 3.
        self.assertEqual(len(raw), 28 + 18)
        self.assertEqual(raw[28:30], bytes([KEY_PY_CONTEXT, 16]))
        int(raw[30:46].decode("ascii"), 16)
        self.assertEqual(_native.address() % 8, 0)
        self.assertEqual(current_record(), (trace_id, span_id, 1, 1, {}))

    def test_max_ids(self):
        _native.set((1 << 128) - 1, (1 << 64) - 1, 0xFF)
        self.assertEqual(current_record(), ((1 << 128) - 1, (1 << 64) - 1, 1, 0xFF, {}))
        with self.assertRaises(OverflowError):
            _native.set(1 << 128, 1, 0)
        with self.assertRaises(OverflowError):
            _native.set(1, -1, 0)
        with self.assertRaises(TypeError):
            _native.set("1", 1, 0)
        # A failed call leaves the record as it was.
        self.assertEqual(current_record(), ((1 << 128) - 1, (1 << 64) - 1, 1, 0xFF, {}))

    def test_clear_and_zero_ids(self):
        _native.set(5, 6, 1)
        address = _native.address()
        self.assertNotEqual(address, 0)
        _native.clear()
        self.assertEqual(_native.address(), 0)
        self.assertIsNone(_native.record_bytes())
        # The buffer was marked invalid before the pointer went away.
        self.assertEqual(read_memory(address, 28)[24], 0)
        _native.set(5, 6, 1)
        self.assertEqual(_native.address(), address, "a thread keeps its buffer")
        _native.set(0, 0, 0)  # an invalid span: nothing left to publish
        self.assertEqual(_native.address(), 0)

    def test_halves_are_independent(self):
        base, point, parent = uuids(3)
        _native.set_osprofiler(base, point, parent)
        self.assertEqual(current_record(), (0, 0, 1, 0, {0: base, 1: point, 2: parent}))
        _native.set(7, 8, 1)
        self.assertEqual(current_record(), (7, 8, 1, 1, {0: base, 1: point, 2: parent}))
        _native.set_osprofiler(base, parent, None)
        self.assertEqual(current_record(), (7, 8, 1, 1, {0: base, 1: parent}))
        _native.clear_otel()
        self.assertEqual(current_record(), (0, 0, 1, 0, {0: base, 1: parent}))
        _native.set(9, 10, 0)
        _native.clear_osprofiler()
        self.assertEqual(current_record(), (9, 10, 1, 0, {}))
        _native.set_osprofiler(None, None, None)
        _native.clear_otel()
        self.assertEqual(_native.address(), 0)
        _native.set_all(11, 12, 1, base, point, None)
        self.assertEqual(current_record(), (11, 12, 1, 1, {0: base, 1: point}))
        _native.set_all(0, 0, 0, None, None, None)
        self.assertEqual(_native.address(), 0)

    def test_long_values_stay_within_640_bytes(self):
        long_value = "x" * 300
        _native.set_osprofiler(long_value, long_value, long_value)
        raw = _native.record_bytes()
        self.assertLessEqual(len(raw), _native.RECORD_MAX)
        _, _, valid, _, attrs = current_record()
        self.assertEqual(valid, 1)
        self.assertEqual(attrs, {0: "x" * 255, 1: "x" * 255})  # the third does not fit

    def test_two_threads_have_separate_records(self):
        barrier = threading.Barrier(3)
        results = {}

        def worker(n):
            _native.set(1000 + n, 2000 + n, n)
            _native.set_osprofiler("base-%d" % n, None, None)
            barrier.wait()  # both published
            results[n] = (_native.address(), _native.tls_info()[0], current_record())
            barrier.wait()  # main has read
            barrier.wait()  # main checked
            _native.clear()

        threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 2)]
        for t in threads:
            t.start()
        barrier.wait()
        self.assertEqual(_native.address(), 0, "the main thread published nothing")
        barrier.wait()
        try:
            (a1, s1, r1), (a2, s2, r2) = results[1], results[2]
            self.assertNotEqual(a1, a2)
            self.assertNotEqual(s1, s2)
            self.assertEqual(r1, (1001, 2001, 1, 1, {0: "base-1"}))
            self.assertEqual(r2, (1002, 2002, 1, 2, {0: "base-2"}))
            # What an outside reader sees: each thread's TLS slot points to its own record.
            for n, (addr, slot, _) in results.items():
                self.assertEqual(ctypes.c_uint64.from_address(slot).value, addr)
                raw = read_memory(addr, 28 + 2 + len("base-%d" % n) + 2 + 16)
                trace_id, span_id, valid, flags, attrs = parse_record(raw)
                self.assertEqual(len(attrs.pop(KEY_PY_CONTEXT)), 16)
                self.assertEqual(
                    (trace_id, span_id, valid, flags, attrs),
                    (1000 + n, 2000 + n, 1, n, {0: "base-%d" % n}),
                )
        finally:
            barrier.wait()
            for t in threads:
                t.join()


@unittest.skipIf(trace is None, "opentelemetry-sdk not importable")
class OpenTelemetryHook(unittest.TestCase):
    def setUp(self):
        spanprof_context.install(otel=True, osprofiler=False, process_context=False)
        self.tracer = TracerProvider().get_tracer("spanprof-context-test")

    def tearDown(self):
        spanprof_context.uninstall()

    def expect_span(self, span):
        sc = span.get_span_context()
        rec = current_record()
        self.assertIsNotNone(rec)
        self.assertEqual(rec[:4], (sc.trace_id, sc.span_id, 1, int(sc.trace_flags)))

    def test_sdk_spans(self):
        self.assertIsNone(current_record())
        with self.tracer.start_as_current_span("outer") as outer:
            self.expect_span(outer)
            with self.tracer.start_as_current_span("inner") as inner:
                self.assertEqual(inner.get_span_context().trace_id, outer.get_span_context().trace_id)
                self.expect_span(inner)
            self.expect_span(outer)
            # A context without a span made current: nothing published.
            token = otel_context.attach(otel_context.Context())
            self.assertIsNone(current_record())
            otel_context.detach(token)
            self.expect_span(outer)
        self.assertIsNone(current_record())

    def test_unsampled_span_keeps_its_ids(self):
        tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("unsampled")
        with tracer.start_as_current_span("s") as span:
            self.assertTrue(span.get_span_context().is_valid)
            self.expect_span(span)
            self.assertEqual(current_record()[3] & 1, 0, "not sampled")

    def test_invalid_and_remote_spans(self):
        with trace.use_span(trace.INVALID_SPAN):
            self.assertIsNone(current_record())
        remote = trace.NonRecordingSpan(
            trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1))
        )
        token = otel_context.attach(trace.set_span_in_context(remote))
        try:
            self.assertEqual(current_record(), (0xABC, 0xDEF, 1, 1, {}))
        finally:
            otel_context.detach(token)
        self.assertIsNone(current_record())

    def test_threads(self):
        seen = {}

        def worker(name):
            with self.tracer.start_as_current_span(name) as span:
                sc = span.get_span_context()
                seen[name] = (current_record(), (sc.trace_id, sc.span_id, 1, int(sc.trace_flags), {}))
            seen[name + "-after"] = current_record()

        with self.tracer.start_as_current_span("main") as main_span:
            threads = [threading.Thread(target=worker, args=("t%d" % i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.expect_span(main_span)
        for name in ("t0", "t1"):
            self.assertEqual(seen[name][0], seen[name][1])
            self.assertIsNone(seen[name + "-after"])
        self.assertNotEqual(seen["t0"][0][0], seen["t1"][0][0], "new threads start new traces")

    def test_uninstall_restores_and_clears_every_thread(self):
        import opentelemetry.context as ctxmod

        wrapper = ctxmod._RUNTIME_CONTEXT
        self.assertIsInstance(wrapper, spanprof_context._PublishingRuntimeContext)
        published, cleared, done = threading.Event(), threading.Event(), threading.Event()
        seen = {}

        def worker():
            with self.tracer.start_as_current_span("w"):
                published.set()
                cleared.wait()
                seen["after"] = _native.address()
            done.set()

        t = threading.Thread(target=worker)
        t.start()
        published.wait()
        spanprof_context.uninstall()
        self.assertIsNot(ctxmod._RUNTIME_CONTEXT, wrapper)
        cleared.set()
        done.wait()
        t.join()
        self.assertEqual(seen["after"], 0)
        with self.tracer.start_as_current_span("not published"):
            self.assertIsNone(current_record())
        spanprof_context.install(otel=True, osprofiler=False, process_context=False)

    def test_install_inside_a_span(self):
        spanprof_context.uninstall()
        with self.tracer.start_as_current_span("already") as span:
            spanprof_context.install(otel=True, osprofiler=False, process_context=False)
            self.expect_span(span)
        self.assertIsNone(current_record())


@unittest.skipIf(osp is None, "osprofiler not importable")
class OSProfilerHook(unittest.TestCase):
    def setUp(self):
        spanprof_context.install(otel=False, osprofiler=True, process_context=False)

    def tearDown(self):
        osp.clean()
        spanprof_context.uninstall()

    def expect(self, prof):
        stack = list(prof._trace_stack)
        want = {0: stack[0], 1: stack[-1]}
        if len(stack) >= 2:
            want[2] = stack[-2]
        self.assertEqual(want, {0: prof.get_base_id(), 1: prof.get_id(), 2: prof.get_parent_id()})
        self.assertEqual(current_record(), (0, 0, 1, 0, want))

    def test_trace_points(self):
        base, parent = uuids(2)
        prof = osp.init("key", base_id=base, parent_id=parent)
        self.assertEqual(current_record(), (0, 0, 1, 0, {0: base, 1: parent, 2: base}))
        osp.start("wsgi", info={"a": 1})
        p1 = prof.get_id()
        self.assertEqual(current_record(), (0, 0, 1, 0, {0: base, 1: p1, 2: parent}))
        osp.start("db")
        p2 = prof.get_id()
        self.assertEqual(current_record(), (0, 0, 1, 0, {0: base, 1: p2, 2: p1}))
        self.expect(prof)
        osp.stop()
        self.assertEqual(current_record(), (0, 0, 1, 0, {0: base, 1: p1, 2: parent}))
        osp.stop()
        self.expect(prof)
        osp.clean()
        self.assertIsNone(current_record())

    def test_traced_function(self):
        osp.init("key")

        @osp.trace("traced")
        def traced():
            return current_record(), osp.get().get_id()

        rec, point = traced()
        self.assertEqual(rec[4][1], point)
        self.expect(osp.get())

    @unittest.skipIf(trace is None, "opentelemetry-sdk not importable")
    def test_with_otel_span(self):
        spanprof_context.install(otel=True, osprofiler=True, process_context=False)
        tracer = TracerProvider().get_tracer("both")
        prof = osp.init("key")
        with tracer.start_as_current_span("s") as span:
            osp.start("rpc")
            sc = span.get_span_context()
            rec = current_record()
            self.assertEqual(rec[:2], (sc.trace_id, sc.span_id))
            self.assertEqual(rec[4], {0: prof.get_base_id(), 1: prof.get_id(), 2: prof.get_parent_id()})
        # The span ended: the OSProfiler half stays.
        self.expect(prof)
        osp.stop()
        osp.clean()
        self.assertIsNone(current_record())

    def test_uninstall_restores(self):
        start = osp._Profiler.start
        init = osp.init
        spanprof_context.uninstall()
        self.assertIsNot(osp._Profiler.start, start)
        self.assertIsNot(osp.init, init)
        self.assertFalse(hasattr(osp._Profiler.start, "_spanprof_context"))
        osp.init("key")
        osp.start("x")
        self.assertIsNone(current_record())
        osp.stop()
        osp.clean()
        spanprof_context.install(otel=False, osprofiler=True, process_context=False)


class ProcessContext(unittest.TestCase):
    def tearDown(self):
        spanprof_context.unpublish_process_context()

    def test_mapping_header_and_payload(self):
        before = boottime_ns()
        address = spanprof_context.publish_process_context(service_name="svc-test")
        header, payload = read_process_context()
        self.assertEqual(header["start"], address)
        self.assertIn(header["name"], ("[anon_shmem:OTEL_CTX]", "[anon:OTEL_CTX]",
                                       "/memfd:OTEL_CTX", "/memfd:OTEL_CTX (deleted)"))
        self.assertEqual(header["signature"], b"OTEL_CTX")
        self.assertEqual(header["version"], 2)
        self.assertEqual(header["size"], len(payload))
        self.assertTrue(before <= header["ts"] <= boottime_ns())
        res, attrs = decode_process_context(payload)
        self.assertEqual(res["service.name"], "svc-test")
        self.assertEqual(res["process.pid"], os.getpid())
        self.assertEqual(attrs["threadlocal.schema_version"], "tlsdesc_v1_dev")
        self.assertEqual(attrs["threadlocal.attribute_key_map"], KEY_MAP)

        # An update: same mapping, a later timestamp, the new payload.
        again = spanprof_context.publish_process_context(service_name="svc-renamed")
        header2, payload2 = read_process_context()
        self.assertEqual(again, address)
        self.assertGreater(header2["ts"], header["ts"])
        self.assertEqual(decode_process_context(payload2)[0]["service.name"], "svc-renamed")

        spanprof_context.unpublish_process_context()
        self.assertIsNone(context_mapping())

    def test_mapping_is_not_inherited_and_child_republishes(self):
        spanprof_context.publish_process_context(service_name="svc-fork")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                header, payload = read_process_context()
                res, _ = decode_process_context(payload)
                ok = res["process.pid"] == os.getpid() and res["service.name"] == "svc-fork"
                code = 0 if ok else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(code)
        os.close(w)
        code = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        self.assertEqual(code, b"\x00")

    def test_payload_encoding_matches_opentelemetry_proto(self):
        try:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
            from opentelemetry.proto.common.v1 import common_pb2
            from opentelemetry.proto.resource.v1 import resource_pb2
        except ImportError:
            self.skipTest("opentelemetry-proto not importable")
        from spanprof_context import _process_context as pc

        res = {"service.name": "svc", "b": True, "f": False, "i": -5, "big": 1 << 40, "d": 1.5,
               "arr": ["x", "y"], "raw": b"\x00\x01", "empty": ""}
        attrs = pc.thread_context_attributes()
        ours = pc.encode(res, attrs)

        # ProcessContext {Resource resource = 1; repeated KeyValue attributes = 2;}, declared here
        # against the package's own Resource and KeyValue (opentelemetry-proto has no
        # processcontext module yet).
        pool = descriptor_pool.Default()
        fdp = descriptor_pb2.FileDescriptorProto(
            name="spanprof_test/process_context.proto",
            package="spanprof_test.processcontext",
            syntax="proto3",
            dependency=[common_pb2.DESCRIPTOR.name, resource_pb2.DESCRIPTOR.name],
        )
        msg = fdp.message_type.add(name="ProcessContext")
        msg.field.add(name="resource", number=1, type=11, label=1,
                      type_name=".opentelemetry.proto.resource.v1.Resource")
        msg.field.add(name="attributes", number=2, type=11, label=3,
                      type_name=".opentelemetry.proto.common.v1.KeyValue")
        try:
            fd = pool.FindFileByName(fdp.name)
        except KeyError:
            pool.AddSerializedFile(fdp.SerializeToString())
            fd = pool.FindFileByName(fdp.name)
        desc = fd.message_types_by_name["ProcessContext"]
        cls = (message_factory.GetMessageClass(desc) if hasattr(message_factory, "GetMessageClass")
               else message_factory.MessageFactory(pool).GetPrototype(desc))
        parsed = cls()
        parsed.ParseFromString(ours)
        got = {kv.key: kv.value for kv in parsed.resource.attributes}
        self.assertEqual(got["service.name"].string_value, "svc")
        self.assertTrue(got["b"].bool_value)
        self.assertEqual(got["f"].WhichOneof("value"), "bool_value")
        self.assertEqual(got["i"].int_value, -5)
        self.assertEqual(got["big"].int_value, 1 << 40)
        self.assertEqual(got["d"].double_value, 1.5)
        self.assertEqual([v.string_value for v in got["arr"].array_value.values], ["x", "y"])
        self.assertEqual(got["raw"].bytes_value, b"\x00\x01")
        self.assertEqual(got["empty"].WhichOneof("value"), "string_value")
        pattrs = {kv.key: kv.value for kv in parsed.attributes}
        self.assertEqual(pattrs["threadlocal.schema_version"].string_value, "tlsdesc_v1_dev")
        self.assertEqual([v.string_value for v in pattrs["threadlocal.attribute_key_map"].array_value.values], KEY_MAP)
        # Byte for byte what protobuf serializes for the same message.
        self.assertEqual(parsed.SerializeToString(), ours)

    @unittest.skipIf(trace is None, "opentelemetry-sdk not importable")
    def test_sdk_resource(self):
        from opentelemetry.sdk.resources import Resource

        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(TracerProvider(resource=Resource.create({"service.name": "from-sdk"})))
        expected = dict(trace.get_tracer_provider().resource.attributes)
        spanprof_context.install(otel=False, osprofiler=False)
        try:
            res, _ = decode_process_context(read_process_context()[1])
            self.assertEqual(res["service.name"], expected["service.name"])
            self.assertEqual(res["telemetry.sdk.language"], "python")
            self.assertIn("telemetry.sdk.version", res)
        finally:
            spanprof_context.uninstall()


if __name__ == "__main__":
    unittest.main()
