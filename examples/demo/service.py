# spanprof's demo: a small Python service traced with OpenTelemetry, as a web service would be.
#
# Each request runs in a span named after its endpoint, as an OpenTelemetry HTTP
# instrumentation names them; `cargo xtask demo` profiles it with no change to this code and
# draws one flame graph per endpoint (`--group-by span-name`).
#
#   GET /orders     builds order rows in Python and encodes them with json
#   POST /checkout  prices a cart in pure Python, then compresses a receipt with zlib
#   GET /health     a trivial answer
#
# Usage: python3 service.py CPU_SECONDS  (stops after that much CPU time of its own)
import json
import sys
import time
import zlib

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("demo.service")


def load_orders(n):
    return [
        {"id": i, "sku": "SKU-%05d" % (i * 7919 % 100000), "qty": i % 5 + 1, "price": i % 97}
        for i in range(n)
    ]


def list_orders():
    return json.dumps(load_orders(400)).encode()


def price_cart(items):
    total = 0
    for i in range(items):
        price = (i * 2654435761) % 10007
        total += price * (i % 3 + 1) - (price // 10 if i % 7 == 0 else 0)
    return total


def write_receipt(total):
    lines = "".join("item %d: %d\n" % (i, total % (i + 1)) for i in range(600))
    return zlib.compress(lines.encode(), 9)


def checkout():
    return write_receipt(price_cart(3000))


def health():
    return b"ok"


ROUTES = [("GET /orders", list_orders), ("POST /checkout", checkout), ("GET /health", health)]


def serve(cpu_seconds):
    start = time.process_time()
    handled = 0
    while time.process_time() - start < cpu_seconds:
        name, handler = ROUTES[handled % len(ROUTES)]
        with tracer.start_as_current_span(name, kind=trace.SpanKind.SERVER):
            handler()
        handled += 1
    return handled


if __name__ == "__main__":
    print("handled %d requests" % serve(float(sys.argv[1]) if len(sys.argv) > 1 else 4.0))
