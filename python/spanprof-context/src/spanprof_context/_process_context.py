"""The OTEP 4719 process-context payload: an opentelemetry.proto.processcontext.v1development
ProcessContext message, hand-encoded (no protobuf dependency).

    message ProcessContext {
      opentelemetry.proto.resource.v1.Resource resource = 1;    // Resource{attributes = 1}
      repeated opentelemetry.proto.common.v1.KeyValue attributes = 2;
    }
    KeyValue{key = 1, value = 2}
    AnyValue{string_value = 1, bool_value = 2, int_value = 3, double_value = 4,
             array_value = 5, kvlist_value = 6, bytes_value = 7}
    ArrayValue{values = 1}, KeyValueList{values = 1}
"""

import os
import struct
import sys

# OTEP 4947: the thread-local record's schema and its attribute keys, by index. Append only.
THREADLOCAL_SCHEMA_VERSION = "tlsdesc_v1_dev"
# Index i is the key index of the thread context records' attributes (_native.c KEY_*); the
# last is spanprof's own: the Python context the OpenTelemetry ids belong to.
ATTRIBUTE_KEY_MAP = (
    "osprofiler.base_id",
    "osprofiler.trace_id",
    "osprofiler.parent_id",
    "spanprof.python_context",
)

_LEN = 2  # wire type: length-delimited
_VARINT = 0
_I64 = 1


def _varint(n):
    if n < 0:
        n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negative int64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field, wire):
    return _varint(field << 3 | wire)


def _len_field(field, data):
    return _tag(field, _LEN) + _varint(len(data)) + data


def any_value(v):
    """An AnyValue message for a Python value (str, bool, int, float, bytes, sequence, mapping)."""
    if isinstance(v, str):
        return _len_field(1, v.encode("utf-8"))
    if isinstance(v, bool):
        return _tag(2, _VARINT) + _varint(1 if v else 0)
    if isinstance(v, int):
        return _tag(3, _VARINT) + _varint(v)
    if isinstance(v, float):
        return _tag(4, _I64) + struct.pack("<d", v)
    if isinstance(v, (bytes, bytearray)):
        return _len_field(7, bytes(v))
    if isinstance(v, dict):
        return _len_field(6, b"".join(_len_field(1, key_value(k, x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return _len_field(5, b"".join(_len_field(1, any_value(x)) for x in v))
    return _len_field(1, str(v).encode("utf-8"))


def key_value(key, value):
    """A KeyValue message."""
    return _len_field(1, str(key).encode("utf-8")) + _len_field(2, any_value(value))


def encode(resource_attributes, attributes):
    """A ProcessContext message: the resource's attributes and the process attributes."""
    resource = b"".join(_len_field(1, key_value(k, v)) for k, v in resource_attributes.items())
    return _len_field(1, resource) + b"".join(
        _len_field(2, key_value(k, v)) for k, v in attributes.items()
    )


def thread_context_attributes():
    """The ProcessContext attributes that describe the thread-local records (OTEP 4947)."""
    return {
        "threadlocal.schema_version": THREADLOCAL_SCHEMA_VERSION,
        "threadlocal.attribute_key_map": list(ATTRIBUTE_KEY_MAP),
    }


def _process_name():
    try:
        with open("/proc/self/comm") as f:
            name = f.read().strip()
    except OSError:
        name = ""
    return name or os.path.basename(sys.executable) or "python"


def _sdk_resource_attributes():
    """The global OpenTelemetry SDK TracerProvider's resource attributes, or None."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        resource = getattr(trace.get_tracer_provider(), "resource", None)
        attrs = getattr(resource, "attributes", None)
        return dict(attrs) if attrs else None
    except Exception:  # a proxy or custom provider: fall back to our own resource
        return None


def resource_attributes(service_name=None):
    """The SDK resource when an SDK TracerProvider is set, else a default one; service_name,
    when given, replaces service.name."""
    attrs = _sdk_resource_attributes()
    if attrs is None:
        attrs = {
            # The OpenTelemetry default for an unnamed service.
            "service.name": "unknown_service:" + _process_name(),
            "telemetry.sdk.language": "python",
            "process.runtime.name": sys.implementation.name,
            "process.runtime.version": "%d.%d.%d" % sys.version_info[:3],
            "process.executable.name": _process_name(),
        }
    attrs["process.pid"] = os.getpid()
    if service_name:
        attrs["service.name"] = service_name
    return attrs
