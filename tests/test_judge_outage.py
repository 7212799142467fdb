"""A judge that cannot answer: an endpoint checked before the model loads, requests that got no answer counted apart
from unusable answers, and a run that stops (or warns) when the judge stays unreachable (`judge_outage_policy`).
Servers run on 127.0.0.1: tests/openai_server.py in a thread, benchmarks/lib/fault_server.py in a process of its own."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest
from conftest import free_port, run_process_group
from mintrl_helpers import CORRECTION, mintrl_args, role_reward
from openai_server import ScriptedServer

from benchmarks.lib.fault_server import FaultServer
from trl_mintrl import MInTRLTrainer
from trl_mintrl.cli.train import main
from trl_mintrl.mintrl.judge_factory import check_judge_endpoint
from trl_mintrl.mintrl.judge_watch import JudgeOutageError
from trl_mintrl.mintrl.trainer import STATE_FILE
from trl_mintrl.resume import checkpoint_problem

REPO = Path(__file__).resolve().parent.parent
FACTORY_LOG = "trl_mintrl.mintrl.judge_factory"
WATCH_LOG = "trl_mintrl.mintrl.judge_watch"


@pytest.fixture(autouse=True)
def _local_servers(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def closed_url() -> str:
    """The API root of a port nobody listens on: every connection is refused."""
    return f"http://127.0.0.1:{free_port()}/v1"


def endpoint_args(cpu_args, url: str, **overrides):
    endpoint = dict(judge="endpoint", judge_base_url=url, judge_model="judge", judge_max_retries=0)
    return mintrl_args(cpu_args, **{**endpoint, **overrides})


def answering(question, attempt, body):
    """A judge that revises the first step and writes CORRECTION."""
    prompt = body["messages"][0]["content"]
    return (200, "VERDICT: REVISE 1", 0) if "VERDICT" in prompt else (200, CORRECTION, 0)


# ----- before the model loads -----


def test_unreachable_endpoint_is_refused_before_the_model_loads(cpu_args, toy_dataset, closed_url):
    message = (
        rf"judge_base_url='{re.escape(closed_url)}': the judge server cannot be reached "
        r"\(.*ConnectionRefusedError.*\)\. "
        r"Start the server, or correct judge_base_url.*set judge_check_endpoint=False"
    )
    with pytest.raises(ValueError, match=message):  # not an error about the model path: raised before loading it
        MInTRLTrainer(
            model="/nonexistent/model", reward_funcs=role_reward, args=endpoint_args(cpu_args, closed_url),
            train_dataset=toy_dataset,
        )  # fmt: skip


def test_endpoint_serving_another_model_is_refused(cpu_args, toy_dataset, caplog):
    server = ScriptedServer(answering, models=["other-model"])
    try:
        message = r"judge_model='judge' is not served at judge_base_url='.*', which serves \['other-model'\]"
        with pytest.raises(ValueError, match=message):
            MInTRLTrainer(
                model="/nonexistent/model", reward_funcs=role_reward, args=endpoint_args(cpu_args, server.url),
                train_dataset=toy_dataset,
            )  # fmt: skip
        check_judge_endpoint(endpoint_args(cpu_args, server.url, judge_model="other-model"))  # served: passes
    finally:
        server.close()
    unlisted = ScriptedServer(answering)  # answers chat completions but does not list its models (HTTP 501)
    try:
        with caplog.at_level(logging.WARNING, logger=FACTORY_LOG):
            check_judge_endpoint(endpoint_args(cpu_args, unlisted.url))
    finally:
        unlisted.close()
    assert "does not list its models" in caplog.text and "judge_model='judge' was not checked" in caplog.text


def test_cli_refuses_an_unreachable_judge_before_loading_the_model(tiny_model_path, tmp_path, monkeypatch, closed_url):
    """`trl-mintrl train` ends with one line naming judge_base_url, before any data or model is loaded."""
    no_weights = tmp_path / "no-weights"  # the tiny model's config and tokenizer only: loading the model fails
    shutil.copytree(tiny_model_path, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    lines = (REPO / "recipes/cpu/mintrl.yaml").read_text().splitlines(keepends=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(line for line in lines if not line.startswith("judge_function:")))
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["mintrl", "--config", str(recipe), "--model_name_or_path", str(no_weights), "--output_dir", str(out),
              "--judge", "endpoint", "--judge_base_url", closed_url, "--judge_model", "judge"])  # fmt: skip
    text = str(exit_info.value.code)
    assert text.startswith("trl-mintrl train: error: judge_base_url=") and "cannot be reached" in text, text
    assert not out.exists()


# ----- during training -----


def test_transport_and_parse_failures_are_counted_apart(tiny_model_path, cpu_args, toy_dataset):
    """Every other review request gets HTTP 400 (no answer), the others an answer without a verdict (unusable):
    each is counted in its own metric, and the two add up to mintrl/judge_failures."""
    requests = itertools.count()
    lock = threading.Lock()

    def respond(question, attempt, body):
        with lock:
            refused = next(requests) % 2 == 0
        return (400, {"error": "bad request"}, 0) if refused else (200, "I am not sure.", 0)

    server = ScriptedServer(respond)
    try:
        trainer = MInTRLTrainer(
            model=tiny_model_path, reward_funcs=role_reward, train_dataset=toy_dataset,
            args=endpoint_args(cpu_args, server.url, judge_check_endpoint=False, max_steps=1, max_reviews=1),
        )  # fmt: skip
        trainer.train()
    finally:
        server.close()
    log, failures = trainer.state.log_history[0], trainer.judge.failures
    assert failures["http_4xx"] > 0 and failures["unparseable_verdict"] > 0
    assert log["mintrl/judge_transport_failures"] == failures["http_4xx"]
    assert log["mintrl/judge_parse_failures"] == failures["unparseable_verdict"]
    assert log["mintrl/judge_failures"] == failures["http_4xx"] + failures["unparseable_verdict"]


def test_unreachable_judge_with_continue_policy_warns_loudly(
    tiny_model_path, cpu_args, toy_dataset, closed_url, caplog
):
    """A server that comes up later (check skipped) never does: every request is refused. The run goes on
    ("continue"), the once-per-run warning names the refused connection (not the token cap), and the outage warning
    repeats every judge_outage_steps steps."""
    args = endpoint_args(
        cpu_args, closed_url, judge_check_endpoint=False, judge_outage_policy="continue", judge_outage_steps=1
    )
    trainer = MInTRLTrainer(model=tiny_model_path, reward_funcs=role_reward, args=args, train_dataset=toy_dataset)
    with caplog.at_level(logging.WARNING, logger=WATCH_LOG):
        trainer.train()
    assert trainer.state.global_step == 2 and trainer.schedule.judge_outage.failed_steps == 2
    messages = [r.getMessage() for r in caplog.records if r.name == WATCH_LOG]
    failure_warnings = [m for m in messages if "judge requests got no answer this step" in m]
    assert len(failure_warnings) == 1 and "ConnectionRefusedError" in failure_warnings[0]
    assert "judge_base_url=" in failure_warnings[0] and "token cap" not in " ".join(messages)
    outage_warnings = [m for m in messages if "training steps in a row" in m]
    assert len(outage_warnings) == 2 and "judge_outage_policy='continue'" in outage_warnings[0]
    steps = [e for e in trainer.state.log_history if "mintrl/judge_transport_failures" in e]
    assert all(e["mintrl/judge_transport_failures"] > 0 and e["mintrl/judge_parse_failures"] == 0 for e in steps)
    assert all(e["mintrl/intervention_rate"] == 0.0 for e in steps)


def test_outage_stops_the_run_with_a_checkpoint_that_resumes(tiny_model_path, cpu_args, toy_dataset, tmp_path):
    """Against the fault server answering HTTP 500 to every request: after judge_outage_steps=2 steps the run saves
    checkpoint-2 (save_strategy='no' notwithstanding) and raises; once the judge answers again, it resumes from there
    and the outage count starts afresh."""
    output_dir = tmp_path / "run"
    with FaultServer(mix="http_500=1", lifetime_s=300) as server:
        args = endpoint_args(cpu_args, server.url, output_dir=str(output_dir), max_steps=6, judge_outage_steps=2)
        trainer = MInTRLTrainer(model=tiny_model_path, reward_funcs=role_reward, args=args, train_dataset=toy_dataset)
        checkpoint = output_dir / "checkpoint-2"
        message = (
            rf"no judge request was answered for 2 training steps in a row .*HTTP 500.*{re.escape(str(checkpoint))}"
        )
        with pytest.raises(JudgeOutageError, match=message):
            trainer.train()
    assert trainer.state.global_step == 2
    assert sorted(p.name for p in output_dir.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]
    assert checkpoint_problem(str(checkpoint), [STATE_FILE]) is None  # complete: weights, optimizer, trainer state
    assert json.loads((checkpoint / STATE_FILE).read_text())["judge_outage_steps"] == 2
    assert all(e["mintrl/judge_transport_failures"] > 0 for e in trainer.state.log_history if "loss" in e)

    server = ScriptedServer(answering)
    try:
        args = endpoint_args(cpu_args, server.url, output_dir=str(output_dir), max_steps=3, judge_outage_steps=2)
        resumed = MInTRLTrainer(model=tiny_model_path, reward_funcs=role_reward, args=args, train_dataset=toy_dataset)
        resumed.train(resume_from_checkpoint=True)
    finally:
        server.close()
    assert resumed.state.global_step == 3 and resumed.schedule.judge_outage.failed_steps == 0
    assert resumed.state.log_history[-2]["mintrl/intervention_rate"] > 0  # the judge is back


@pytest.mark.slow
def test_outage_decision_is_taken_on_every_process(tiny_model_path, tmp_path, closed_url):
    """Two processes where rank 0 holds only controls (it never calls the judge) and rank 1 the intervened
    rollouts, whose requests are all refused: both ranks stop after step 1 and write one checkpoint together."""
    tests = Path(__file__).parent
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(tests / "judge_outage_ddp_script.py"), tiny_model_path, str(tmp_path), closed_url]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tests.parent), "NO_PROXY": "127.0.0.1"}
    result = run_process_group(command, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["judge_sent"] == 0 and ranks[1]["judge_sent"] > 0
    assert all(r["steps"] == 1 and "no judge request was answered" in r["error"] for r in ranks)
    assert checkpoint_problem(str(tmp_path / "checkpoint-1"), [STATE_FILE]) is None
