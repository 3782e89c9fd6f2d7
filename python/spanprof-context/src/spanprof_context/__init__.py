"""spanprof-context: publish a Python service's current trace context for out-of-process
profilers (spanprof, the OpenTelemetry eBPF profiler), in the OpenTelemetry formats:

- OTEP 4947 thread context: each thread's OpenTelemetry span (trace id, span id, flags) and
  OSProfiler ids (attributes 0 = osprofiler.base_id, 1 = osprofiler.trace_id,
  2 = osprofiler.parent_id) in a record pointed to by the exported TLS symbol
  ``otel_thread_ctx_v1`` of the ``spanprof_context._native`` extension;
- OTEP 4719 process context: the OTEL_CTX mapping, holding the service's resource and the
  attribute key map of the thread records.

Usage, after the OpenTelemetry SDK is set up::

    import spanprof_context
    spanprof_context.install()

The thread context is per OS thread: asyncio tasks that switch on one thread do not attach or
detach contexts when they switch, so the published span may be another task's. For asyncio
services, let spanprof read the interpreter's own context (its default) instead.
"""

import os
import threading

from . import _native
from . import _process_context

__all__ = [
    "install",
    "uninstall",
    "installed",
    "publish_process_context",
    "unpublish_process_context",
]  # not the low-level set/clear/...: `import *` must not shadow the builtin set

__version__ = "0.1.0"

# The low-level per-thread API, for code that manages its context itself.
set = _native.set  # noqa: A001 - set(trace_id, span_id, trace_flags)
set_osprofiler = _native.set_osprofiler
set_all = _native.set_all
clear = _native.clear
record_bytes = _native.record_bytes
address = _native.address

_lock = threading.RLock()
_state = {
    "otel": None,  # (context module, inner runtime context, our wrapper)
    "osprofiler": None,  # (profiler module, {name: original})
    "process_context": None,  # (service_name,) while published
    "fork_hook": False,
}


# --------------------------------------------------------------------------------------------
# OpenTelemetry


class _PublishingRuntimeContext(object):
    """Wraps OpenTelemetry's runtime context: after attach() and detach() the thread's
    published span is the span of the context that is now current. get_current() and
    everything else go straight to the wrapped one (bound methods set on the instance, so no
    extra Python frame). No __getattr__ delegation: it would slow down every attribute lookup
    on the object, i.e. every context.attach/detach/get_current.

    No __slots__: the attributes live in the instance's __dict__, where a profiler reading the
    process's memory (spanprof, when a span was opened before install()) follows `_inner` to
    the wrapped runtime context and its ContextVar."""

    def __init__(self, inner, span_key):
        self._inner = inner
        self.get_current = inner.get_current
        # Builtin functions (C): the inner attach/detach, then _native.publish_span of the
        # context's span. Errors of publishing never reach the application.
        self.attach, self.detach = _native.make_hooks(
            inner.attach, inner.detach, inner.get_current, span_key
        )



def _install_otel():
    import opentelemetry.context as otel_context
    from opentelemetry.trace.propagation import _SPAN_KEY

    inner = otel_context._RUNTIME_CONTEXT
    if isinstance(inner, _PublishingRuntimeContext):
        return
    wrapper = _PublishingRuntimeContext(inner, _SPAN_KEY)
    otel_context._RUNTIME_CONTEXT = wrapper
    _state["otel"] = (otel_context, inner, wrapper)
    # The span already current in this thread (install() inside a span).
    _native.publish_span(inner.get_current().get(_SPAN_KEY))


def _uninstall_otel():
    entry = _state["otel"]
    if entry is None:
        return
    otel_context, inner, wrapper = entry
    if otel_context._RUNTIME_CONTEXT is wrapper:
        otel_context._RUNTIME_CONTEXT = inner
    _state["otel"] = None


# --------------------------------------------------------------------------------------------
# OSProfiler


def _publish_profiler(prof):
    """This thread's OSProfiler ids from its _Profiler (None: clear them)."""
    if prof is None:
        _native.clear_osprofiler()
        return
    try:
        base = prof.get_base_id()
        point = prof.get_id()
    except (IndexError, AttributeError):
        _native.clear_osprofiler()
        return
    try:
        parent = prof.get_parent_id()
    except (IndexError, AttributeError):
        parent = None
    _native.set_osprofiler(base, point, parent)


def _install_osprofiler():
    from osprofiler import profiler as osp

    if _state["osprofiler"] is not None:
        return
    cls = osp._Profiler
    originals = {
        "start": cls.__dict__["start"],
        "stop": cls.__dict__["stop"],
        "init": osp.init,
        "clean": osp.clean,
    }
    orig_start, orig_stop = originals["start"], originals["stop"]
    orig_init, orig_clean = originals["init"], originals["clean"]
    get = osp.get

    def start(self, *args, **kwargs):
        try:
            return orig_start(self, *args, **kwargs)
        finally:
            _publish_profiler(self)

    def stop(self, *args, **kwargs):
        try:
            return orig_stop(self, *args, **kwargs)
        finally:
            _publish_profiler(self)

    def init(*args, **kwargs):
        try:
            return orig_init(*args, **kwargs)
        finally:
            _publish_profiler(get())

    def clean(*args, **kwargs):
        try:
            return orig_clean(*args, **kwargs)
        finally:
            _publish_profiler(get())

    for wrapper, orig in ((start, orig_start), (stop, orig_stop), (init, orig_init), (clean, orig_clean)):
        wrapper.__name__ = orig.__name__
        wrapper.__qualname__ = getattr(orig, "__qualname__", orig.__name__)
        wrapper.__doc__ = orig.__doc__
        wrapper.__wrapped__ = orig
        wrapper._spanprof_context = True
    cls.start = start
    cls.stop = stop
    osp.init = init
    osp.clean = clean
    _state["osprofiler"] = (osp, originals, {"start": start, "stop": stop, "init": init, "clean": clean})
    # A trace already running in this thread (install() inside one).
    _publish_profiler(get())


def _uninstall_osprofiler():
    entry = _state["osprofiler"]
    if entry is None:
        return
    osp, originals, wrappers = entry
    cls = osp._Profiler
    if cls.__dict__.get("start") is wrappers["start"]:
        cls.start = originals["start"]
    if cls.__dict__.get("stop") is wrappers["stop"]:
        cls.stop = originals["stop"]
    if osp.init is wrappers["init"]:
        osp.init = originals["init"]
    if osp.clean is wrappers["clean"]:
        osp.clean = originals["clean"]
    _state["osprofiler"] = None


# --------------------------------------------------------------------------------------------
# Process context


def publish_process_context(service_name=None, resource_attributes=None, attributes=None):
    """Publishes (or updates) the OTEP 4719 process context: the resource (the OpenTelemetry
    SDK TracerProvider's when one is set, else a default naming the process; service_name
    replaces service.name; resource_attributes, a dict, replaces it all) and the thread-record
    attribute key map (plus `attributes`). Returns the mapping's address."""
    with _lock:
        if resource_attributes is None:
            res = _process_context.resource_attributes(service_name)
        else:
            res = dict(resource_attributes)
            if service_name:
                res["service.name"] = service_name
        attrs = _process_context.thread_context_attributes()
        if attributes:
            attrs.update(attributes)
        payload = _process_context.encode(res, attrs)
        address = _native.publish_process_context(payload)
        _state["process_context"] = (service_name, resource_attributes, attributes)
        _register_fork_hook()
        return address


def unpublish_process_context():
    """Removes the OTEL_CTX mapping."""
    with _lock:
        _native.unpublish_process_context()
        _state["process_context"] = None


def _after_fork_in_child():
    # The mapping is not inherited (MADV_DONTFORK); the child has a new pid.
    global _lock
    _lock = threading.RLock()
    args = _state["process_context"]
    if args is not None:
        try:
            publish_process_context(*args)
        except Exception:
            pass


def _register_fork_hook():
    if not _state["fork_hook"] and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _state["fork_hook"] = True


# --------------------------------------------------------------------------------------------


def install(otel=True, osprofiler=True, service_name=None, process_context=True):
    """Starts publishing: hooks OpenTelemetry's context attach/detach (otel=True) and
    OSProfiler's start/stop/init/clean (osprofiler=True), each only if the library is
    importable, and publishes the process context (service_name: its service.name). Call it
    after the OpenTelemetry SDK's TracerProvider is set, so the process context carries its
    resource. Idempotent. Returns a dict saying what was hooked."""
    done = {"otel": False, "osprofiler": False, "process_context": False}
    with _lock:
        if otel:
            try:
                _install_otel()
                done["otel"] = True
            except ImportError:
                pass
        if osprofiler:
            try:
                _install_osprofiler()
                done["osprofiler"] = True
            except ImportError:
                pass
        if process_context:
            publish_process_context(service_name)
            done["process_context"] = True
    return done


def uninstall():
    """Undoes install(): restores the hooked functions, unpublishes every thread's record and
    the process context."""
    with _lock:
        _uninstall_otel()
        _uninstall_osprofiler()
        _native.clear_all_threads()
        unpublish_process_context()


def installed():
    """What is hooked and published now."""
    return {
        "otel": _state["otel"] is not None,
        "osprofiler": _state["osprofiler"] is not None,
        "process_context": _native.process_context_info() is not None,
    }
