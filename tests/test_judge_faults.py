"""EndpointJudge under injected faults and load: a real server process on 127.0.0.1 answers with HTTP errors,
hangs, trickled and truncated bodies, malformed JSON, garbage text and endless answers (benchmarks/lib/fault_server.py)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time

import pytest
from mintrl_helpers import mintrl_args, role_reward

from benchmarks.lib.fault_server import FaultServer, run_mix
from trl_mintrl import MInTRLTrainer
from trl_mintrl.judges import EndpointJudge, ReviewRequest, Verdict
from trl_mintrl.judges.endpoint import FAILURE_KINDS

SCHEDULING_SLACK_S = 0.5  # event-loop wake-ups on a loaded 2-core machine; a trickled body overruns by seconds
# a request's whole budget (attempts, backoffs, deadlines) on a machine loaded beyond the suite (0.64 s over it seen
# with 6 runnable processes); a deadline that is not enforced overruns by seconds (the server hangs 3 s, trickles)
BUDGET_SLACK_S = 1.0


@pytest.fixture(scope="module")
def server():
    with FaultServer(hang_s=3.0, drip_s=0.2, retry_after="1", too_long_bytes=1 << 20) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


def _judge(server, **kwargs):
    defaults = dict(max_retries=1, backoff_s=0.01, max_backoff_s=0.05, max_response_bytes=256 << 10)
    return EndpointJudge(server.url, "judge-model", api_key_env=None, **{**defaults, **kwargs})


# At 64 in flight the client's one event loop spends ~5-10 ms of CPU per attempt (the openai client); on 2 busy cores an
# answer can wait over 1 s for the loop to read it, and would be counted as a timeout: the deadline is 2 s there.
@pytest.mark.parametrize(("concurrency", "per_fault", "timeout_s"), [(1, 1, 0.5), (16, 4, 1.0), (64, 12, 2.0)])
def test_every_fault_counted_by_kind_within_budget_without_leaks(server, concurrency, per_fault, timeout_s):
    judge = _judge(server, max_concurrency=concurrency, timeout_s=timeout_s)
    logging.disable(logging.WARNING)  # one line per batch is expected; keep the test output readable
    try:
        result = run_mix(judge, server, per_fault)
    finally:
        logging.disable(logging.NOTSET)
    assert result["wrong_results"] == []  # retried transients succeed, persistent faults fail, in request order
    assert result["injected"] == result["expected_injected"]  # the server really answered with each fault
    assert result["failures"] == result["expected_failures"]  # each fault counted once, as the right kind
    assert set(result["failures"]) == set(FAILURE_KINDS) - {"unexpected"}
    assert result["retries"] == result["expected_retries"]  # 4xx, malformed, too long, garbage: never retried
    assert result["max_latency_s"] <= judge.max_request_seconds + BUDGET_SLACK_S
    assert (result["thread_leak"], result["fd_leak"]) == (0, 0)
    assert judge.state_dict() == {"failures": dict(result["failures"]), "retries": dict(result["retries"])}


def test_retry_after_is_honoured_up_to_the_backoff_cap(server):
    request = [ReviewRequest("retry-after [fault=http_429_retry_after/once]", "", ["a\n\n", "b"], None)]
    start = time.monotonic()
    assert _judge(server, max_backoff_s=2.0).review(request) == [Verdict(0)]
    assert time.monotonic() - start >= 1.0  # the server asked for 1 s, more than the 0.01 s backoff

    request[0].question = request[0].question.replace("retry-after", "capped")
    start = time.monotonic()
    assert _judge(server, max_backoff_s=0.1).review(request) == [Verdict(0)]
    assert time.monotonic() - start < 0.1 + SCHEDULING_SLACK_S


def test_https_attempts_keep_their_deadline(tmp_path, monkeypatch):
    """Hosted APIs are HTTPS: the deadline reader must work on TLS sockets too (a trickled body still times out)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate for 127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted by urllib's default context, as a user's CA bundle is
    with FaultServer(hang_s=3.0, drip_s=0.2, tls_cert=str(cert), tls_key=str(key)) as server:
        assert server.url.startswith("https://")
        judge = _judge(server, timeout_s=0.5, max_concurrency=4)
        tags = ["ok", "slow_body", "closed_mid_body/once", "too_long"]
        start = time.monotonic()
        verdicts = judge.review([ReviewRequest(f"tls [fault={t}]", "", ["a\n\n", "b"], None) for t in tags])
        elapsed = time.monotonic() - start
    assert verdicts == [Verdict(0), Verdict(failed=True), Verdict(0), Verdict(failed=True)]
    assert judge.failures == {"timeout": 1, "too_long": 1} and judge.retries == {"timeout": 1, "connection": 1}
    assert elapsed <= judge.max_request_seconds + BUDGET_SLACK_S


def test_mintrl_step_completes_with_failures_in_the_metric(tiny_model_path, cpu_args, toy_dataset):
    """The endpoint judge built from config, against a server drawing a fault for most attempts."""
    mix = "ok=4,http_500=1,http_429_retry_after=1,hang=1,closed_mid_body=1,malformed_json=1,garbage_text=1,too_long=1"
    with FaultServer(hang_s=1.5, mix=mix, too_long_bytes=5 << 20) as server:  # over the default 4 MiB cap
        trainer = MInTRLTrainer(
            model=tiny_model_path,
            reward_funcs=role_reward,
            args=mintrl_args(
                cpu_args,
                judge="endpoint",
                judge_base_url=server.url,
                judge_model="judge",
                judge_timeout_s=0.5,
                judge_max_retries=1,
                max_steps=1,
                per_device_train_batch_size=8,
                max_reviews=3,
            ),
            train_dataset=toy_dataset,
        )
        trainer.train()
        injected = server.injected()
    judge = trainer.judge
    assert isinstance(judge, EndpointJudge) and trainer.state.global_step == 1
    assert injected["ok"] > 0 and sum(injected.values()) > injected["ok"]
    failed = sum(judge.failures.values())
    assert failed > 0
    log = trainer.state.log_history[0]
    assert log["mintrl/judge_failures"] == failed  # each failed request, once
    assert log["mintrl/intervention_rate"] > 0  # the answers that got through were used
