# The C extension (the rest of the metadata is in pyproject.toml). -mtls-dialect=gnu2 makes the
# accesses to the exported TLS symbol otel_thread_ctx_v1 TLSDESC, the model OTEP 4947
# recommends (readers also handle general-dynamic and static TLS).
import os
import platform

from setuptools import Extension, setup

tls_dialect = []
if platform.machine() in ("x86_64", "AMD64", "i686", "i386"):
    tls_dialect = ["-mtls-dialect=gnu2"]
elif platform.machine() in ("aarch64", "arm64"):
    tls_dialect = ["-mtls-dialect=desc"]

# SPANPROF_CONTEXT_RECORD_IN_TLS=1 puts the records in the module's TLS block instead of the heap;
# the block then exceeds glibc's optional static TLS and the module gets dynamic TLS (DTV), the
# other case a reader must handle. For testing readers.
define_macros = []
if os.environ.get("SPANPROF_CONTEXT_RECORD_IN_TLS") == "1":
    define_macros.append(("SPANPROF_CONTEXT_RECORD_IN_TLS", "1"))

setup(
    ext_modules=[
        Extension(
            "spanprof_context._native",
            sources=["src/spanprof_context/_native.c"],
            define_macros=define_macros,
            extra_compile_args=tls_dialect + ["-O2", "-std=gnu11", "-fvisibility=default"],
        )
    ],
)
