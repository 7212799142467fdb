"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 for judge tests (no mocks of urllib)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedServer:
    """An OpenAI-style chat-completions server. `respond(question, attempt, body)` returns (status, reply, delay_s):
    `reply` is the message content (str), a dict sent as JSON, or bytes sent raw; `attempt` counts from 1 per
    question. It speaks HTTP/1.1, so a client may reuse a connection, as with vLLM or a hosted API. It records every
    request (headers as a case-insensitive `http.client.HTTPMessage`), each client connection (address and port),
    and the most requests it ever had in flight. With `models`, `GET /v1/models` lists those model names, as vLLM
    does; without, it is not served (HTTP 501, as a server that does not list its models)."""

    def __init__(self, respond, models: list[str] | None = None):
        self.respond = respond
        self.requests = []  # (headers, body)
        self.connections = set()  # (host, port) of each client connection
        self.attempts = Counter()
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
            disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms wait for a delayed ACK

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                question = body["messages"][0]["content"].split("## Problem\n")[1].split("\n")[0]
                with server.lock:
                    server.connections.add(self.client_address)
                    server.requests.append((self.headers, body))  # looked up case-insensitively, as HTTP names are
                    server.attempts[question] += 1
                    attempt = server.attempts[question]
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, reply, delay = server.respond(question, attempt, body)
                    time.sleep(delay)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                if isinstance(reply, str):
                    reply = {
                        "choices": [{"message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]
                    }
                payload = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            if models is not None:

                def do_GET(self):
                    listed = [{"id": name, "object": "model", "created": 0, "owned_by": "test"} for name in models]
                    payload = json.dumps({"object": "list", "data": listed}).encode()
                    self.send_response(200 if self.path == "/v1/models" else 404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # clients that timed out closed the socket
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
