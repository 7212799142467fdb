"""EndpointJudge against a real HTTP server on 127.0.0.1 with scripted responses (no mocks of the HTTP client)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time

import pytest
from mintrl_helpers import mintrl_args, role_reward
from openai_server import ScriptedServer

from trl_mintrl import MInTRLTrainer
from trl_mintrl.judges import Correction, CorrectionRequest, EndpointJudge, ReviewRequest, Verdict
from trl_mintrl.judges.templates import STUDENT_NOTATION

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def serve(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    servers = []

    def start(respond):
        servers.append(ScriptedServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _judge(server, **kwargs):
    defaults = dict(timeout_s=2.0, max_retries=2, max_concurrency=4, backoff_s=0.01, max_backoff_s=0.05)
    return EndpointJudge(server.url, "judge-model", **{**defaults, **kwargs})


def _reviews(*questions, steps=("a\n\n", "b\n\n", "c")):
    return [ReviewRequest(q, "", list(steps), "the reference") for q in questions]


def test_results_in_order_and_request_bodies(serve):
    replies = {
        "keep": "Fine.\nVERDICT: KEEP",
        "revise": "Step 2 is wrong.\nVERDICT: REVISE 2",
        "garbage": "I am not sure.",
        "range": "VERDICT: REVISE 7",
        "cut": {"choices": [{"message": {"content": "VERDICT: REVISE 1"}, "finish_reason": "length"}]},  # truncated
        "malformed": b"<html>not json</html>",
        "fix": "Correction: 2+3=5.",
        "empty": "",
    }
    delays = {"keep": 0.15, "revise": 0.0, "fix": 0.1}  # later requests finish first: order must still hold
    server = serve(lambda q, attempt, body: (200, replies[q], delays.get(q, 0.0)))
    judge = _judge(server, temperature=0.3, max_review_tokens=100, max_correction_tokens=48)
    verdicts = judge.review(_reviews("keep", "revise", "garbage", "range", "cut", "malformed"))
    assert verdicts == [Verdict(None), Verdict(1)] + [Verdict(failed=True)] * 4
    corrections = judge.correct([CorrectionRequest("fix", "x", None), CorrectionRequest("empty", "y", None)])
    assert corrections == [Correction("2+3=5."), Correction("")]
    bodies = {b["messages"][0]["content"].split("## Problem\n")[1].split("\n")[0]: b for _, b in server.requests}
    assert bodies["keep"]["model"] == "judge-model" and bodies["keep"]["temperature"] == 0.3
    assert bodies["keep"]["max_tokens"] == 100 and bodies["fix"]["max_tokens"] == 48
    assert bodies["keep"]["messages"] == [
        {"role": "user", "content": judge.templates.render_review(_reviews("keep")[0])}
    ]
    assert "the reference" in bodies["keep"]["messages"][0]["content"]
    assert STUDENT_NOTATION in bodies["fix"]["messages"][0]["content"]  # corrections in the student's notation
    assert server.attempts["malformed"] == 1  # a malformed 200 is not retried
    assert "Authorization" not in server.requests[0][0]  # no key in the environment: no header


def test_concurrency_never_exceeds_max_concurrency(serve):
    server = serve(lambda q, attempt, body: (200, "VERDICT: KEEP", 0.1))
    verdicts = _judge(server, max_concurrency=3).review(_reviews(*(f"q{i}" for i in range(12))))
    assert verdicts == [Verdict(None)] * 12
    assert server.max_in_flight == 3  # bounded, and the bound is actually used


def test_connections_are_reused_within_a_batch(serve):
    """The client pools connections: 12 requests, 3 at a time, over 3 kept-alive connections, not 12 new ones."""
    server = serve(lambda q, attempt, body: (200, "VERDICT: KEEP", 0.02))
    assert _judge(server, max_concurrency=3).review(_reviews(*(f"q{i}" for i in range(12)))) == [Verdict(None)] * 12
    assert len(server.requests) == 12 and len(server.connections) == 3


def test_review_from_inside_a_running_event_loop(serve):
    """A caller already running an event loop (a notebook, async code) still gets a synchronous answer."""
    server = serve(lambda q, attempt, body: (200, "VERDICT: REVISE 2", 0))
    judge = _judge(server)

    async def caller():
        return judge.review(_reviews("q"))

    assert asyncio.run(caller()) == [Verdict(1)]


def test_without_openai_the_endpoint_judge_names_the_extra_before_the_model_loads(monkeypatch, cpu_args, toy_dataset):
    monkeypatch.setitem(sys.modules, "openai", None)  # as if not installed: `import openai` raises ImportError
    install = r'pip install -e "\.\[openai\]"'
    with pytest.raises(ImportError, match=install):
        EndpointJudge("http://127.0.0.1:8000/v1", "m")
    args = mintrl_args(cpu_args, judge="endpoint", judge_base_url="http://127.0.0.1:8000/v1", judge_model="judge")
    with pytest.raises(ImportError, match=install):  # not an error about the model path: raised before loading it
        MInTRLTrainer(model="/nonexistent/model", reward_funcs=role_reward, args=args, train_dataset=toy_dataset)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_retry_after_server_error_then_success(serve, status):
    server = serve(
        lambda q, attempt, body: (status, {"error": "busy"}, 0) if attempt == 1 else (200, "VERDICT: KEEP", 0)
    )
    assert _judge(server).review(_reviews("q")) == [Verdict(None)]
    assert server.attempts["q"] == 2


def test_persistent_errors_fail_after_max_retries(serve, caplog):
    server = serve(lambda q, attempt, body: (502, {"error": "bad gateway"}, 0))
    with caplog.at_level(logging.WARNING, logger="trl_mintrl.judges.endpoint"):
        assert _judge(server, max_retries=2).review(_reviews("q")) == [Verdict(failed=True)]
    assert server.attempts["q"] == 3
    assert "1 of 1 judge review requests" in caplog.text and "HTTP 502" in caplog.text and "3 attempts" in caplog.text


def test_timeout_fails_the_item_after_retrying(serve):
    server = serve(lambda q, attempt, body: (200, "VERDICT: KEEP", 0.6 if q == "slow" else 0))
    start = time.monotonic()
    verdicts = _judge(server, timeout_s=0.2, max_retries=1).review(_reviews("slow", "fast"))
    assert verdicts == [Verdict(failed=True), Verdict(None)]
    assert server.attempts["slow"] == 2  # a timeout is retried
    assert time.monotonic() - start < 1.5


def test_failure_counts_survive_a_checkpoint(serve):
    """Failures and retries by kind are judge state: saved with checkpoints, restored on resume."""
    server = serve(lambda q, attempt, body: (503, {"error": "busy"}, 0) if q == "busy" else (200, "no verdict", 0))
    judge = _judge(server, max_retries=1)
    assert judge.review(_reviews("busy", "chatty")) == [Verdict(failed=True)] * 2
    state = json.loads(json.dumps(judge.state_dict()))  # as mintrl_state.json stores it
    assert state == {"failures": {"http_5xx": 1, "unparseable_verdict": 1}, "retries": {"http_5xx": 1}}
    resumed = _judge(server)
    resumed.load_state_dict(state)
    resumed.review(_reviews("busy"))
    assert resumed.failures == {"http_5xx": 2, "unparseable_verdict": 1} and resumed.retries == {"http_5xx": 3}


def test_client_error_fails_without_retry(serve):
    server = serve(lambda q, attempt, body: (400, {"error": "bad request"}, 0))
    assert _judge(server).correct([CorrectionRequest("q", "x")]) == [Correction(failed=True)]
    assert server.attempts["q"] == 1


def test_connection_refused_fails_the_item():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    judge = EndpointJudge(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff_s=0.01, timeout_s=1.0)
    assert judge.review(_reviews("q")) == [Verdict(failed=True)]


def test_api_key_is_sent_but_never_shown(serve, monkeypatch, caplog):
    monkeypatch.setenv("JUDGE_TEST_KEY", KEY)

    def respond(question, attempt, body):
        if question == "echo":  # some APIs echo the key they rejected
            return 401, {"error": f"Incorrect API key provided: {KEY}"}, 0
        return 200, "VERDICT: KEEP", 0

    server = serve(respond)
    judge = _judge(server, api_key_env="JUDGE_TEST_KEY")
    with caplog.at_level(logging.DEBUG):
        assert judge.review(_reviews("ok", "echo")) == [Verdict(None), Verdict(failed=True)]
    assert {h["Authorization"] for h, _ in server.requests} == {f"Bearer {KEY}"}
    assert server.attempts["echo"] == 1  # 401 is not retried
    assert "HTTP 401" in caplog.text and "[REDACTED]" in caplog.text
    assert KEY not in caplog.text and KEY not in repr(judge) and KEY not in str(vars(judge))
    assert "JUDGE_TEST_KEY" in repr(judge)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(base_url="127.0.0.1:8000/v1"), "judge_base_url"),
        (dict(model=""), "model"),
        (dict(max_concurrency=0), "max_concurrency"),
        (dict(max_retries=-1), "max_retries"),
        (dict(timeout_s=0), "timeout_s"),
        (dict(max_response_bytes=0), "max_response_bytes"),
        (dict(review_template="{steps} {oops}"), r"unknown field\(s\) \{oops\}"),
    ],
)
def test_misconfiguration_raises_at_construction(kwargs, message):
    args = {"base_url": "http://127.0.0.1:8000/v1", "model": "m", **kwargs}
    with pytest.raises(ValueError, match=message):
        EndpointJudge(**args)
