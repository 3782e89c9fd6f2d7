# A thread-per-request HTTP server under a client loop: http.server's ThreadingHTTPServer
# runs each request in a new threading.Thread (`Thread-N (process_request_thread)` from 3.10)
# that lives about as long as its request, and a client thread of the same process sends
# REQUESTS requests, one after another. Each handler computes for about 1 ms of CPU.
#
# Usage: python3 py_thread_server.py REQUESTS
# Prints `ready PID` on stderr at the start and one JSON line when done: the requests served
# and each request thread's name by its native thread id (`threads`).
import http.client
import http.server
import json
import os
import sys
import threading
import time

names = {}
names_lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with names_lock:
            names[threading.get_native_id()] = threading.current_thread().name
        start = time.thread_time()
        x = 1
        while time.thread_time() - start < 0.001:
            for _ in range(100):
                x = (x * 1103515245 + 12345) % 2147483648
        body = b"%d" % x
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def client(port, requests):
    for _ in range(requests):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("GET", "/")
        conn.getresponse().read()
        conn.close()


def main():
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serving = threading.Thread(target=server.serve_forever, name="server")
    serving.start()
    c = threading.Thread(target=client, args=(server.server_address[1], requests), name="client")
    c.start()
    c.join()
    server.shutdown()
    serving.join()
    print(json.dumps({"requests": requests, "threads": names}), flush=True)


main()
