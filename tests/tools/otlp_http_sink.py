#!/usr/bin/env python3
"""An OTLP/HTTP profiles receiver for the spanprof tests.

Listens on 127.0.0.1 and accepts `POST /v1development/profiles` the way an
OpenTelemetry collector does: the body must be `application/x-protobuf`
(else 415), gzipped when `Content-Encoding: gzip`, and parse as an
`ExportProfilesServiceRequest` of PyPI `opentelemetry-proto` (else 400 with a
text body). Each accepted request is saved in DIR as

    NNNN.bin            the request body, decompressed (NNNN from 0001)
    NNNN.headers.json   the request headers, keys in lower case

(written under temporary names and renamed, the headers first, so a reader
that sees NNNN.bin sees whole files), and answered with 200 and a serialized
`ExportProfilesServiceResponse`.

`POST /v1/traces` (what tracers' OTLP/HTTP span exporters send) is accepted
too, protobuf only: each request must parse as an `ExportTraceServiceRequest`
(else 400), and its spans are appended to DIR/spans.jsonl, one JSON object a
line: {"trace_id": "32 hex", "span_id": "16 hex", "parent_span_id": "16 hex"
or "", "name": "..."}; the answer is an `ExportTraceServiceResponse`. The mode
file does not apply to it. Other paths are 404.

The file DIR/mode, read at every request, makes the endpoint misbehave:

    down        answer 503 (no Retry-After), save nothing, and count the
                request in DIR/rejected.count (rewritten each time)
    reject N    answer 200 with partial_success.rejected_profiles = N and
                error_message "test rejection" (the request is still saved)

Usage: otlp_http_sink.py --out DIR [--port PORT] [--exit-on-stdin-eof]

The first line on stdout is `listening PORT` (PORT 0, the default, picks a
free port). SIGTERM and SIGINT stop it cleanly (exit 0); so does the end of
stdin with --exit-on-stdin-eof, which lets a parent that dies take the sink
with it. Requests are logged on stderr only when OTLP_SINK_VERBOSE is set.
Exit status 3 when `opentelemetry-proto` cannot be imported.
"""

import argparse
import gzip
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    from opentelemetry.proto.collector.profiles.v1development import (
        profiles_service_pb2,
    )
except ImportError as e:  # pragma: no cover - reported to the Rust helper
    sys.stderr.write(
        "error: cannot import the OTLP profiles messages of PyPI opentelemetry-proto "
        f"(pip install opentelemetry-proto==1.45.2): {e}\n"
    )
    sys.exit(3)

PATH = "/v1development/profiles"
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
VERBOSE = bool(os.environ.get("OTLP_SINK_VERBOSE"))


class Store:
    """The output directory: numbering, atomic writes and the mode file."""

    def __init__(self, out_dir):
        self.dir = out_dir
        self.lock = threading.Lock()
        self.saved = 0
        self.rejected = 0

    def mode(self):
        """("normal"|"down"|"reject", N) from DIR/mode."""
        try:
            with open(os.path.join(self.dir, "mode"), encoding="utf-8") as f:
                words = f.read().split()
        except FileNotFoundError:
            return ("normal", 0)
        if words == ["down"]:
            return ("down", 0)
        if len(words) == 2 and words[0] == "reject" and words[1].isdigit():
            return ("reject", int(words[1]))
        return ("normal", 0)

    def _write(self, name, data):
        path = os.path.join(self.dir, name)
        tmp = os.path.join(self.dir, f".{name}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def save(self, body, headers):
        with self.lock:
            self.saved += 1
            stem = f"{self.saved:04d}"
            self._write(
                f"{stem}.headers.json",
                json.dumps(headers, indent=1, sort_keys=True).encode() + b"\n",
            )
            self._write(f"{stem}.bin", body)
            return stem

    def append_spans(self, lines):
        with self.lock:
            with open(os.path.join(self.dir, "spans.jsonl"), "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))

    def count_rejected(self):
        with self.lock:
            self.rejected += 1
            self._write("rejected.count", f"{self.rejected}\n".encode())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "spanprof-otlp-sink/1"

    # -- helpers ------------------------------------------------------------

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        if VERBOSE:
            sys.stderr.write(f"otlp_http_sink: {self.address_string()} {format % args}\n")

    def reply(self, code, body=b"", content_type="text/plain; charset=utf-8"):
        """Sends a response; the Content-Type goes with a body or a protobuf (even empty) one."""
        self.send_response(code)
        if body or content_type == PROTOBUF:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def read_body(self):
        """The raw request body (Content-Length or chunked); None after replying 400/411."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size_line = self.rfile.readline(65537)
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    self.close_connection = True
                    self.reply(400, b"bad chunked encoding\n")
                    return None
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)  # CRLF after the chunk
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            self.reply(411, b"Content-Length required\n")
            return None
        try:
            n = int(length)
        except ValueError:
            n = -1
        if n < 0:
            self.close_connection = True
            self.reply(400, b"bad Content-Length\n")
            return None
        return self.rfile.read(n)

    # -- methods ------------------------------------------------------------

    def do_POST(self):  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        body = self.read_body()
        if body is None:
            return
        if path == TRACES_PATH:
            self.traces(body)
            return
        if path != PATH:
            self.reply(404, f"no such path {path}; POST to {PATH}\n".encode())
            return
        store = self.server.store
        mode, rejected = store.mode()
        if mode == "down":
            store.count_rejected()
            self.reply(503, b"the test took the endpoint down\n")
            return
        media_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media_type != PROTOBUF:
            self.reply(415, f"Content-Type must be {PROTOBUF}, not {media_type!r}\n".encode())
            return
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding == "gzip":
            try:
                body = gzip.decompress(body)
            except (EOFError, OSError) as e:
                self.reply(400, f"bad gzip body: {e}\n".encode())
                return
        elif encoding not in ("", "identity"):
            self.reply(415, f"unsupported Content-Encoding {encoding!r}\n".encode())
            return
        try:
            profiles_service_pb2.ExportProfilesServiceRequest.FromString(body)
        except Exception as e:  # google.protobuf.message.DecodeError and friends
            self.reply(400, f"body is not an ExportProfilesServiceRequest: {e}\n".encode())
            return
        headers = {}
        for key, value in self.headers.items():
            key = key.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        store.save(body, headers)
        response = profiles_service_pb2.ExportProfilesServiceResponse()
        if mode == "reject":
            response.partial_success.rejected_profiles = rejected
            response.partial_success.error_message = "test rejection"
        self.reply(200, response.SerializeToString(), PROTOBUF)

    def traces(self, body):
        """An OTLP/HTTP span export: its spans into spans.jsonl."""
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        media_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media_type != PROTOBUF:
            self.reply(415, f"Content-Type must be {PROTOBUF}, not {media_type!r}\n".encode())
            return
        if self.headers.get("Content-Encoding", "").strip().lower() == "gzip":
            try:
                body = gzip.decompress(body)
            except (EOFError, OSError) as e:
                self.reply(400, f"bad gzip body: {e}\n".encode())
                return
        try:
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        except Exception as e:  # google.protobuf.message.DecodeError and friends
            self.reply(400, f"body is not an ExportTraceServiceRequest: {e}\n".encode())
            return
        lines = [
            json.dumps(
                {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                }
            )
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        self.server.store.append_spans(lines)
        response = trace_service_pb2.ExportTraceServiceResponse()
        self.reply(200, response.SerializeToString(), PROTOBUF)

    def not_posted(self):
        path = self.path.split("?", 1)[0]
        if path == PATH:
            self.send_response(405)
            self.send_header("Allow", "POST")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.reply(404, f"no such path {path}\n".encode())

    do_GET = not_posted  # noqa: N815
    do_HEAD = not_posted  # noqa: N815
    do_PUT = not_posted  # noqa: N815
    do_DELETE = not_posted  # noqa: N815


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, store):
        super().__init__(address, Handler)
        self.store = store


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, help="directory of the saved requests")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="stop when stdin reaches its end"
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    server = Server(("127.0.0.1", args.port), Store(args.out))
    stopping = threading.Event()

    def stop(*_):
        if not stopping.is_set():
            stopping.set()
            # shutdown() waits for serve_forever(), which runs in the main
            # thread: call it from another one.
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.exit_on_stdin_eof:

        def watch_stdin():
            while sys.stdin.buffer.read(4096):
                pass
            stop()

        threading.Thread(target=watch_stdin, daemon=True).start()

    sys.stdout.write(f"listening {server.server_address[1]}\n")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
