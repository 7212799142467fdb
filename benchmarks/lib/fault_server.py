"""A fault-injecting OpenAI-style chat-completions server on 127.0.0.1, run in its own process, and a driver that
pushes tagged review/correction requests through a judge and tallies what came back.

The server answers each attempt with a chosen fault. A question tagged `[fault=KIND]` gets KIND on every attempt,
`[fault=KIND/once]` only on its first attempt (then a correct answer); untagged questions draw a fault per attempt
from `--mix` (seeded). It runs in a subprocess so the client's thread and socket counts are the client's alone,
and it exits by itself after `--lifetime-s`, so a crashed test never leaves it behind. Any HTTP client can be
tested against it (`python benchmarks/lib/fault_server.py --help`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# fault -> the failure kind a client should count for a review and for a correction when the fault persists on
# every attempt (None: the request succeeds).
EXPECTED_KIND = {
    "ok": (None, None),
    "http_500": ("http_5xx", "http_5xx"),
    "http_500_retry_after": ("http_5xx", "http_5xx"),
    "http_429": ("http_429", "http_429"),
    "http_429_retry_after": ("http_429", "http_429"),
    "http_400": ("http_4xx", "http_4xx"),
    "hang": ("timeout", "timeout"),
    "slow_body": ("timeout", "timeout"),
    "closed_mid_body": ("connection", "connection"),
    "malformed_json": ("malformed_response", "malformed_response"),
    "wrong_shape_json": ("malformed_response", "malformed_response"),  # valid JSON, content not a string
    "garbage_text": ("unparseable_verdict", None),  # a correction is free text: garbage is accepted as written
    "open_think": ("unparseable_verdict", "unparseable_correction"),  # "<think>..." never closed
    "cut_by_max_tokens": ("too_long", "too_long"),  # finish_reason "length"
    "too_long": ("too_long", "too_long"),  # a body far over any max_tokens
}
FAULTS = tuple(EXPECTED_KIND)
RETRYABLE = {"http_500", "http_500_retry_after", "http_429", "http_429_retry_after", "hang", "slow_body",
             "closed_mid_body"}  # fmt: skip
REVIEW_ANSWER = "Step 1 is wrong.\nVERDICT: REVISE 1"
CORRECTION_ANSWER = "Correction: 2+2=4."
GARBAGE_ANSWER = "I think it is probably fine, but I am not sure."
_RUNS = itertools.count()
_TAG = re.compile(r"\[fault=(\w+)(/once)?\]")


def _completion(text: str, finish_reason: str = "stop") -> bytes:
    message = {"role": "assistant", "content": text}
    return json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}).encode()


def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or `lifetime_s`; print the base URL on stdout once listening."""
    mix_kinds, mix_weights = zip(*((k, float(w)) for k, w in (p.split("=") for p in args.mix.split(","))), strict=True)
    unknown = set(mix_kinds) - set(FAULTS)
    if unknown:
        sys.exit(f"unknown fault(s) in --mix: {sorted(unknown)}; choose from {FAULTS}")
    rng = random.Random(args.seed)
    lock = threading.Lock()
    attempts_by_question = Counter()
    injected = Counter()  # attempts answered with each fault
    state = {"in_flight": 0, "max_in_flight": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if args.keep_alive else "HTTP/1.0"  # 1.1: a connection serves many requests
        disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms wait for a delayed ACK

        def do_GET(self):  # /stats: what was injected so far
            with lock:
                payload = json.dumps({"injected": injected, "max_in_flight": state["max_in_flight"]}).encode()
            self._send(200, payload)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = body["messages"][-1]["content"]
            question = prompt.split("## Problem\n", 1)[-1].split("\n", 1)[0]
            tag = _TAG.search(question)
            with lock:
                attempts_by_question[question] += 1
                if tag:
                    fault = "ok" if tag.group(2) and attempts_by_question[question] > 1 else tag.group(1)
                else:
                    fault = rng.choices(mix_kinds, mix_weights)[0]
                injected[fault] += 1
                state["in_flight"] += 1
                state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            try:
                self._answer(fault, REVIEW_ANSWER if "VERDICT" in prompt else CORRECTION_ANSWER)
            except OSError:
                pass  # the client gave up (timeout, body too long) and closed the connection
            finally:
                with lock:
                    state["in_flight"] -= 1

        def _answer(self, fault: str, answer: str) -> None:
            error = json.dumps({"error": {"message": fault}}).encode()
            time.sleep(args.delay_s)  # a judge model's latency (benchmarks/studies/cost.py --rollout)
            if fault == "ok":
                self._send(200, _completion(answer))
                return
            self.close_connection = True  # a faulty answer never leaves a connection to reuse
            if fault.startswith("http_"):
                status = int(fault[5:8])
                self._send(status, error, {"Retry-After": args.retry_after} if "retry_after" in fault else {})
            elif fault == "hang":  # nothing at all until well past the client's timeout
                time.sleep(args.hang_s)
            elif fault == "slow_body":  # a byte at a time, each within the client's socket timeout
                payload = _completion(answer)
                self._headers(200, len(payload))
                deadline = time.monotonic() + args.hang_s
                for i in range(len(payload)):
                    if time.monotonic() > deadline:
                        break
                    self.wfile.write(payload[i : i + 1])
                    self.wfile.flush()
                    time.sleep(args.drip_s)
            elif fault == "closed_mid_body":
                payload = _completion(answer)
                self._headers(200, len(payload))
                self.wfile.write(payload[: len(payload) // 2])
            elif fault == "malformed_json":
                self._send(200, b"<html><body>502 Bad Gateway</body></html>")
            elif fault == "wrong_shape_json":
                self._send(200, json.dumps({"choices": [{"message": {"content": [{"text": answer}]}}]}).encode())
            elif fault == "garbage_text":
                self._send(200, _completion(GARBAGE_ANSWER))
            elif fault == "open_think":
                self._send(200, _completion("<think>\nLet me check step 1 again, and then"))
            elif fault == "cut_by_max_tokens":
                self._send(200, _completion(answer, finish_reason="length"))
            elif fault == "too_long":  # a server ignoring max_tokens; no Content-Length, so only a cap stops it
                self._headers(200, None)
                chunk = b"x" * 65536
                for _ in range(args.too_long_bytes // len(chunk)):
                    self.wfile.write(chunk)

        def _headers(self, status: int, length: int | None, extra: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if length is not None:
                self.send_header("Content-Length", str(length))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()

        def _send(self, status: int, payload: bytes, extra: dict | None = None) -> None:
            self._headers(status, len(payload), extra)
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024  # the default backlog of 5 drops connects at concurrency 64

        def handle_error(self, request, client_address):
            pass

    httpd = Server(("127.0.0.1", args.port), Handler)
    scheme = "http"
    if args.tls_cert:  # the handshake happens in each handler thread, on its first read
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
        scheme = "https"
    threading.Timer(args.lifetime_s, lambda: os._exit(0)).start()
    print(f"{scheme}://127.0.0.1:{httpd.server_address[1]}/v1", flush=True)
    httpd.serve_forever(poll_interval=0.05)


class FaultServer:
    """Starts `serve` in a subprocess; `url` is its API root, `injected()` the attempts answered with each fault.
    With `tls_cert`/`tls_key` (PEM files for 127.0.0.1) it serves HTTPS."""

    def __init__(self, *, hang_s=3.0, drip_s=0.2, retry_after="1", too_long_bytes=8 << 20, mix="ok=1", seed=0,
                 lifetime_s=600.0, tls_cert=None, tls_key=None, keep_alive=False, delay_s=0.0):  # fmt: skip
        flags = {"hang-s": hang_s, "drip-s": drip_s, "retry-after": retry_after, "too-long-bytes": too_long_bytes,
                 "mix": mix, "seed": seed, "lifetime-s": lifetime_s, "delay-s": delay_s}  # fmt: skip
        if keep_alive:
            flags["keep-alive"] = 1
        if tls_cert:
            flags.update({"tls-cert": tls_cert, "tls-key": tls_key})
        self.tls_cert = tls_cert
        command = [sys.executable, __file__] + [f"--{name}={value}" for name, value in flags.items()]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith(("http://", "https://")):
            self.close()
            raise RuntimeError(f"fault server did not start (exit code {self.process.returncode})")

    def stats(self) -> dict:
        import urllib.request

        context = ssl.create_default_context(cafile=self.tls_cert) if self.tls_cert else None
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        with opener.open(self.url.removesuffix("/v1") + "/stats", timeout=10) as response:
            return json.loads(response.read())

    def injected(self) -> Counter:
        return Counter(self.stats()["injected"])

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def run_mix(judge, server: FaultServer, per_fault: int, seed: int = 0) -> dict:
    """Review and correct `per_fault` requests per fault, persistent and (retryable faults) transient, shuffled;
    return what was injected, what the judge counted and what it should have, leaks and latencies."""
    from trl_mintrl.judges import Correction, CorrectionRequest, ReviewRequest, Verdict

    if judge.max_retries < 1:
        raise ValueError("run_mix needs max_retries >= 1: transient faults must be retried to succeed")
    plans = [
        (f, once, i) for f in FAULTS for once in (False, True) if not once or f in RETRYABLE for i in range(per_fault)
    ]
    random.Random(seed).shuffle(plans)
    run = next(_RUNS)  # the server counts attempts per question: questions must not repeat across runs
    tags = [f"run{run} q{i} [fault={f}{'/once' if once else ''}]" for f, once, i in plans]
    expected_failures, expected_retries, expected_injected = Counter(), Counter(), Counter()
    expected_reviews, expected_corrections = [], []
    for fault, once, _ in plans:
        review_kind, correction_kind = EXPECTED_KIND[fault]
        if once or review_kind is None:
            expected_reviews.append(Verdict(0))
        else:
            expected_reviews.append(Verdict(failed=True))
            expected_failures[review_kind] += 1
        if once or correction_kind is None:
            expected_corrections.append(Correction(GARBAGE_ANSWER if fault == "garbage_text" else "2+2=4."))
        else:
            expected_corrections.append(Correction(failed=True))
            expected_failures[correction_kind] += 1
        if fault in RETRYABLE:  # a review and a correction each: attempts until success or out of retries
            expected_retries[review_kind] += 2 * (1 if once else judge.max_retries)
            expected_injected[fault] += 2 * (1 if once else judge.max_retries + 1)
            expected_injected["ok"] += 2 * once
        else:
            expected_injected[fault] += 2

    latencies = []
    request = judge._request

    async def timed_request(*args, **kwargs):  # the real attempt loop, timed from first attempt to outcome
        start = time.monotonic()
        try:
            return await request(*args, **kwargs)
        finally:
            latencies.append(time.monotonic() - start)

    judge._request = timed_request
    failures, retries, injected = Counter(judge.failures), Counter(judge.retries), server.injected()
    threads, fds = threading.active_count(), open_fds()
    start = time.monotonic()
    try:
        reviews = judge.review([ReviewRequest(f"review {t}", "", ["1+1=2\n\n", "2+2=5"], None) for t in tags])
        corrections = judge.correct([CorrectionRequest(f"correction {t}", "1+1=2\n\n", None) for t in tags])
    finally:
        del judge._request
    wall = time.monotonic() - start
    results = zip(tags * 2, reviews + corrections, expected_reviews + expected_corrections, strict=True)
    wrong = [(tag, got, want) for tag, got, want in results if got != want]
    return {
        "concurrency": judge.max_concurrency,
        "requests": len(tags) * 2,
        "wall_s": wall,
        "max_latency_s": max(latencies),
        "budget_s": judge.max_request_seconds,
        "injected": +(server.injected() - injected),
        "expected_injected": +expected_injected,
        "failures": +(judge.failures - failures),
        "expected_failures": +expected_failures,
        "retries": +(judge.retries - retries),
        "expected_retries": +expected_retries,
        "wrong_results": wrong,
        "thread_leak": threading.active_count() - threads,
        "fd_leak": open_fds() - fds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--hang-s", type=float, default=3.0, help="how long 'hang' and 'slow_body' hold a request")
    parser.add_argument("--drip-s", type=float, default=0.2, help="delay between the bytes of 'slow_body'")
    parser.add_argument("--retry-after", default="1", help="Retry-After header value of the *_retry_after faults")
    parser.add_argument("--too-long-bytes", type=int, default=8 << 20, help="body size of 'too_long'")
    parser.add_argument("--mix", default="ok=1", help="faults of untagged questions, e.g. ok=3,hang=1,http_500=1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay-s", type=float, default=0.0, help="answer every attempt after this long")
    parser.add_argument("--keep-alive", type=int, default=0, help="1: HTTP/1.1, connections reused after 'ok'")
    parser.add_argument("--lifetime-s", type=float, default=600.0, help="exit after this long, whatever happens")
    parser.add_argument("--tls-cert", help="PEM certificate: serve HTTPS")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
