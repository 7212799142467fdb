"""Requests per second of `EndpointJudge` against a local OpenAI-style server with no faults, at concurrency 1, 8
and 64, against a server closing each connection (HTTP/1.0) and one keeping it open (HTTP/1.1): the judge of
this checkout, and with `--before REV` the judge at git revision REV (e.g. the urllib client).
Prints the markdown table of docs/judges.md. The server (benchmarks/lib/fault_server.py) runs in its own process on 127.0.0.1.

    python -m benchmarks.studies.endpoint_rate [--requests 400] [--before 3f1a4bb]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from benchmarks.lib.fault_server import FaultServer
from benchmarks.lib.judge_revision import load_judge_class
from trl_mintrl.judges import EndpointJudge, ReviewRequest, Verdict

os.environ["NO_PROXY"] = "127.0.0.1"

CONCURRENCY = (1, 8, 64)


def rate(judge_class, url: str, concurrency: int, requests: int, run: str) -> float:
    """Reviews per second of one batch of `requests` reviews, every one answered (checked)."""
    judge = judge_class(url, "m", api_key_env=None, timeout_s=30.0, max_retries=0, max_concurrency=concurrency)
    batch = [ReviewRequest(f"{run} c{concurrency} q{i}", "", ["1+1=2\n\n", "2+2=5"], None) for i in range(requests)]
    start = time.monotonic()
    verdicts = judge.review(batch)
    seconds = time.monotonic() - start
    if verdicts != [Verdict(0)] * requests:
        raise RuntimeError(f"{run}: {sum(v.failed for v in verdicts)} of {requests} reviews failed")
    return requests / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="reviews per batch")
    parser.add_argument("--repeats", type=int, default=3, help="batches per cell; the best is reported")
    parser.add_argument("--before", metavar="REV", help="also measure the judge of git revision REV")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    clients = ([(args.before, load_judge_class(args.before))] if args.before else []) + [("now", EndpointJudge)]
    rows = {}
    for keep_alive in (False, True):  # HTTP/1.0: a connection per request; HTTP/1.1: reused (vLLM, SGLang, APIs)
        server_label = "HTTP/1.1 keep-alive" if keep_alive else "HTTP/1.0 (closes)"
        with FaultServer(mix="ok=1", keep_alive=keep_alive) as server:
            for label, judge_class in clients:
                rate(judge_class, server.url, 8, 16, f"warm-{label}-{keep_alive}")  # imports, first connections
                rows[label, server_label] = [
                    max(
                        rate(judge_class, server.url, c, args.requests, f"{label}-{keep_alive}-{r}")
                        for r in range(args.repeats)
                    )
                    for c in CONCURRENCY
                ]
    print(f"| client | server | {' | '.join(f'concurrency {c} (req/s)' for c in CONCURRENCY)} |")
    print(f"|---|---|{'---:|' * len(CONCURRENCY)}")
    for (label, server_label), rates in rows.items():
        print(f"| {label} | {server_label} | {' | '.join(f'{r:.0f}' for r in rates)} |")


if __name__ == "__main__":
    main()
