"""EndpointJudge under injected faults at concurrency 1, 16 and 64: prints the markdown tables of docs/reliability.md.

A fault server process on 127.0.0.1 (benchmarks/lib/fault_server.py) answers every fault kind, on every attempt (persistent)
or only the first (transient, retryable kinds). Each row checks, per request, that the outcome is the expected one,
that each failure is counted once as the right kind, that retries match the retry policy, that no thread or socket
is left open, and the slowest request against `max_request_seconds`. `--before REV` also times the faults that the
judge's code at git revision REV mishandled. About 1 minute on 2 CPU cores.

    python -m benchmarks.studies.judge_faults [--quick] [--before 0ee3850]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import tracemalloc
from collections import Counter

from benchmarks.lib.fault_server import EXPECTED_KIND, RETRYABLE, FaultServer, run_mix
from benchmarks.lib.judge_revision import load_judge_class
from trl_mintrl.judges import EndpointJudge, ReviewRequest
from trl_mintrl.judges.endpoint import FAILURE_KINDS

os.environ["NO_PROXY"] = "127.0.0.1"

SERVER = dict(hang_s=3.0, drip_s=0.2, retry_after="1", too_long_bytes=8 << 20)
JUDGE = dict(max_retries=1, backoff_s=0.01, max_backoff_s=0.05)  # default max_response_bytes (4 MiB)


def _check(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def before_after(rev: str, server: FaultServer, timeout_s: float) -> list[str]:
    """One review per fault that the code at `rev` mishandled: time, peak memory and outcome, old code vs now."""
    rows = ["| fault | code | seconds (budget) | peak memory (MiB) | outcome |", "|---|---|---|---:|---|"]
    budget = 2 * timeout_s + JUDGE["max_backoff_s"]
    for fault in ("slow_body", "too_long"):
        for label, judge_class in ((rev, load_judge_class(rev)), ("now", EndpointJudge)):
            judge = judge_class(server.url, "m", api_key_env=None, timeout_s=timeout_s, **JUDGE)
            request = ReviewRequest(f"before-after {label} [fault={fault}]", "", ["a\n\n", "b"], None)
            tracemalloc.start()
            start = time.monotonic()
            verdict = judge.review([request])[0]
            seconds = time.monotonic() - start
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            counted = dict(getattr(judge, "failures", {}))
            shown = f"failed, counted {counted}" if counted else "failed" if verdict.failed else "accepted"
            rows.append(f"| {fault} | {label} | {seconds:.2f} ({budget:.2f}) | {peak:.1f} | {shown} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--before", metavar="REV", help="also time the old code of git revision REV")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # one warning per failing batch; the tables say it all
    scale = 4 if args.quick else 1
    runs = [(1, max(1, 2 // scale), 0.5), (16, 16 // scale, 1.0), (64, 64 // scale, 2.0)]  # as the tests
    results = []
    with FaultServer(**SERVER) as server:
        for concurrency, per_fault, timeout_s in runs:
            judge = EndpointJudge(server.url, "m", api_key_env=None, timeout_s=timeout_s, max_concurrency=concurrency,
                                  **JUDGE)  # fmt: skip
            results.append(run_mix(judge, server, per_fault))
        before = before_after(args.before, server, 0.5) if args.before else []

    print(
        "| concurrency | requests | attempts | faults injected | failed (counted = expected) | retried (counted = "
        "expected) | wrong results | threads leaked | sockets leaked | max latency / budget (s) | wall (s) | req/s |"
    )
    print("|---:|---:|---:|---:|---|---|---:|---:|---:|---|---:|---:|")
    for r in results:
        failed, retried = sum(r["failures"].values()), sum(r["retries"].values())
        print(
            f"| {r['concurrency']} | {r['requests']} | {sum(r['injected'].values())} | "
            f"{sum(r['injected'].values()) - r['injected']['ok']} | "
            f"{failed} ({_check(r['failures'] == r['expected_failures'])}) | "
            f"{retried} ({_check(r['retries'] == r['expected_retries'])}) | {len(r['wrong_results'])} | "
            f"{r['thread_leak']} | {r['fd_leak']} | {r['max_latency_s']:.2f} / {r['budget_s']:.2f} | "
            f"{r['wall_s']:.1f} | {r['requests'] / r['wall_s']:.0f} |"
        )
    injected, failures, expected, retries = Counter(), Counter(), Counter(), Counter()
    for r in results:
        injected += r["injected"]
        failures += r["failures"]
        expected += r["expected_failures"]
        retries += r["retries"]
    print("\n| fault injected | attempts | client counts it as (review / correction) | retried |")
    print("|---|---:|---|---|")
    for fault, kinds in EXPECTED_KIND.items():
        shown = " / ".join(k or "success" for k in kinds)
        print(f"| {fault} | {injected[fault]} | {shown} | {'yes' if fault in RETRYABLE else 'no'} |")
    print("\n| failure kind | counted | expected | retried attempts |")
    print("|---|---:|---:|---:|")
    for kind in FAILURE_KINDS:
        print(f"| {kind} | {failures[kind]} | {expected[kind]} | {retries[kind]} |")
    if before:
        print("\n" + "\n".join(before))
    bad = [r for r in results if r["wrong_results"] or r["failures"] != r["expected_failures"]
           or r["retries"] != r["expected_retries"] or r["thread_leak"] or r["fd_leak"]
           or r["max_latency_s"] > r["budget_s"] + 0.5]  # fmt: skip
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
