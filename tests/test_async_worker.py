"""The asynchronous trainer's rollout worker (mintrl/async_/worker.py) and its HTTP generation engine
(engines/vllm_http.py), without a vLLM server: a scripted engine (the scheduler tests' FakeLM) and judge, the trainer's
side played by `train`, and a local recording completions server for the HTTP engine."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch
from conftest import free_port, toy_rows
from mintrl_helpers import CORRECTION, mintrl_args, revise_first_step_judge, role_reward
from test_mintrl_continuous import FakeLM, FakeStream
from trl.experimental.async_grpo.async_grpo_trainer import _reduce_metric

from trl_mintrl.engines.base import Generation
from trl_mintrl.engines.vllm_http import VLLMHTTPEngine
from trl_mintrl.mintrl.async_ import SampleMetrics
from trl_mintrl.mintrl.async_.worker import THREAD_NAME, MInTRLRolloutWorker
from trl_mintrl.text import prompt_token_ids

GROUPS = 2  # groups per optimizer step: per_device_train_batch_size 8, groups of 2 controls + 2 intervened
STEP = 8  # rollouts per optimizer step


def worker_args(cpu_args, max_staleness=1, weight_sync_steps=1, **mintrl_fields):
    """MInTRLConfig's fields plus the AsyncGRPOConfig fields the worker reads."""
    config = mintrl_args(cpu_args, **{"per_device_train_batch_size": STEP, **mintrl_fields})
    return SimpleNamespace(**vars(config), max_staleness=max_staleness, weight_sync_steps=weight_sync_steps)


def foreign_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads started since `before` that are still alive, but for TRL's trace logger and the test server's."""
    return [
        t
        for t in threading.enumerate()
        if t not in before
        and t.name != "rollout-trace-logger"
        and not t.name.startswith("test-server")
        and "process_request_thread" not in t.name
    ]


@contextlib.contextmanager
def stopped_at_exit(stop):
    """A list to register workers or engines in; at exit each is stopped with `stop(item)`, and no thread started
    meanwhile may be left."""
    before, started = set(threading.enumerate()), []
    yield started
    for item in started:
        stop(item)
    assert not foreign_threads(before)


@pytest.fixture
def make_worker(tiny_tokenizer):
    """Builds workers with the scripted engine, judge and reward (each overridable), stopped at teardown."""
    with stopped_at_exit(MInTRLRolloutWorker.stop) as workers:

        def build(args, engine=None, judge="revise", dataset=None, reward_funcs=(role_reward,)):
            judge = revise_first_step_judge() if judge == "revise" else judge
            engine = engine or FakeLM(tiny_tokenizer)
            worker = MInTRLRolloutWorker(
                args, tiny_tokenizer, dataset or toy_rows(), list(reward_funcs), judge, engine
            )
            workers.append(worker)
            return worker

        yield build


def train(worker, steps: int, *, step_seconds: float = 0.0, weight_sync_steps: int = 1) -> list[list]:
    """The trainer's side: the cold sync, then per optimizer step one step's samples (with the staleness TRL's
    dataset sees when it takes them) and a weight sync every `weight_sync_steps` steps."""
    worker.update_model_version(worker.model_version + 1)
    worker.start()
    consumed = []
    for step in range(steps):
        batch = [worker.rollout_buffer.get(timeout=60) for _ in range(STEP)]
        consumed.append([(worker.model_version - sample.model_version, sample) for sample in batch])
        time.sleep(step_seconds)
        if (step + 1) % weight_sync_steps == 0:
            worker.update_model_version(worker.model_version + 1)
    return consumed


def wait_for(condition, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def drain_metrics(worker) -> list[dict]:
    items = []
    while not worker.metrics_queue.empty():
        items.append(worker.metrics_queue.get_nowait())
    return items


def completion(sample, tokenizer) -> tuple[int, list[int]]:
    """(prompt length, completion token ids) of a sample, its prompt templated as the trainer does."""
    prompt_ids = prompt_token_ids(tokenizer, sample.prompt)
    assert sample.input_ids[: len(prompt_ids)].tolist() == prompt_ids
    return len(prompt_ids), sample.input_ids[len(prompt_ids) :].tolist()


# ---------------------------------------------------------------------------------------------------------------
# the samples


def batch_position_reward(completions, **kwargs):
    """Each rollout's position in its batch: the controls of a group score differently, so their mean is a real
    baseline (the greedy fake engine writes a group's controls alike)."""
    return [float(i) for i in range(len(completions))]


def test_groups_controls_intervened_baseline_judge_mask_and_sampled_logprobs(make_worker, cpu_args, tiny_tokenizer):
    args = worker_args(cpu_args, reward_weights=[1.0, 0.5])
    worker = make_worker(args, dataset=toy_rows()[1:], reward_funcs=(role_reward, batch_position_reward))
    (batch,) = train(worker, 1)
    samples = [sample for _, sample in batch]
    correction_ids = tiny_tokenizer(CORRECTION, add_special_tokens=False)["input_ids"]
    assert [s.group_id for s in samples] == [0] * 4 + [1] * 4  # whole groups, the prompts in dataset order
    for g, group in enumerate((samples[:4], samples[4:])):
        roles = [s.metrics.extras["is_control"] for s in group]
        assert roles == [True, True, False, False]  # 2 controls, then 2 intervened
        rewards = []
        for i, (sample, control) in enumerate(zip(group, roles, strict=True)):
            assert isinstance(sample.metrics, SampleMetrics) and sample.model_version == 1
            assert sample.metrics.extras["model_version"] == 1
            prompt_len, ids = completion(sample, tiny_tokenizer)
            assert sample.completion_mask.tolist() == [0] * prompt_len + [1] * len(ids)
            judge_mask = sample.metrics.extras["judge_mask"]
            assert judge_mask.shape == sample.input_ids.shape
            # the judge revised the first chunk of each intervened rollout from its first step: its correction
            # opens the completion, and exactly its tokens are judge tokens
            n_judge = 0 if control else len(correction_ids)
            assert (control or ids[:n_judge] == correction_ids) and len(ids) > n_judge
            assert judge_mask.tolist() == [0] * prompt_len + [1] * n_judge + [0] * (len(ids) - n_judge)
            # the behaviour policy's log-probs on policy tokens (FakeLM samples token t at -(t % 7) / 10), 0 elsewhere
            expected = [0.0] * (prompt_len + n_judge) + [-(t % 7) / 10 for t in ids[n_judge:]]
            assert sample.old_log_probs.tolist() == pytest.approx(expected)
            role = 1.0 if not control else (len(ids) % 4) / 4  # role_reward
            rewards.append(role + 0.5 * (4 * g + i))  # weighted by reward_weights
            assert sample.metrics["rewards/role_reward"] == pytest.approx(role)
            assert sample.metrics["reward"] == pytest.approx(rewards[-1])
        baseline = sum(rewards[:2]) / 2  # the mean reward of the controls
        assert [s.advantage for s in group] == pytest.approx([r - baseline for r in rewards])


def test_truncated_rollouts_leave_the_regression_but_stay_in_the_baseline(make_worker, cpu_args, tiny_tokenizer):
    worker = make_worker(worker_args(cpu_args, mask_truncated_completions=True, max_completion_length=4))
    (batch,) = train(worker, 1)
    for _, sample in batch:
        _, ids = completion(sample, tiny_tokenizer)
        assert sample.completion_mask.sum() == (len(ids) if ids[-1] == worker.engine.eos_token_ids[0] else 0)
    assert sum(sample.completion_mask.sum() == 0 for _, sample in batch) > 0  # some were cut at 4 tokens
    assert len(batch) == STEP  # still one step's rollouts: the step boundary stays where the trainer expects it
    # every sample carries the step's count of rollouts in the regression: the loss is the mean over them
    in_regression = sum(bool(sample.completion_mask.any()) for _, sample in batch)
    assert {sample.metrics.extras["step_regression_rows"] for _, sample in batch} == {in_regression}


def test_metrics_are_pushed_per_batch_in_trls_format(make_worker, cpu_args):
    worker = make_worker(worker_args(cpu_args))
    (batch,) = train(worker, 1)
    (metrics,) = drain_metrics(worker)
    for key, value in metrics.items():  # TRL's `log` reduces them
        assert isinstance(value, float) or (isinstance(value, tuple) and len(value) == 2), key
        assert not isinstance(_reduce_metric(key, [value]), tuple)
    samples = [sample for _, sample in batch]
    judge_tokens = sum(int(s.metrics.extras["judge_mask"].sum()) for s in samples)
    completion_tokens = sum(int(s.completion_mask.sum()) for s in samples)
    assert _reduce_metric("mintrl/judge_token_frac", [metrics["mintrl/judge_token_frac"]]) == pytest.approx(
        judge_tokens / completion_tokens
    )
    intervened = [s for s in samples if not s.metrics.extras["is_control"]]
    revised = sum(s.metrics.extras["judge_mask"].any() for s in intervened) / len(intervened)
    assert revised == 0.5  # the first prompt's rollouts end at once (EOS): nothing to revise
    assert _reduce_metric("mintrl/intervention_rate", [metrics["mintrl/intervention_rate"]]) == revised
    controls = [s for s in samples if s.metrics.extras["is_control"]]
    for name, rows in [("length_control", controls), ("length_intervened", intervened)]:
        length = sum(int(s.completion_mask.sum()) for s in rows) / len(rows)
        assert _reduce_metric(f"mintrl/{name}", [metrics[f"mintrl/{name}"]]) == pytest.approx(length), name
    after = []  # per revised rollout: the policy's tokens after the judge's last one
    for s in intervened:
        judge = torch.as_tensor(s.metrics.extras["judge_mask"])
        if judge.any():
            last = int(judge.nonzero().max())
            after.append(int(torch.as_tensor(s.completion_mask)[last + 1 :].sum()))
    assert min(after) > 0  # the fake policy writes on after the correction
    written_on = _reduce_metric("mintrl/policy_tokens_after_correction", [metrics["mintrl/policy_tokens_after_correction"]])  # fmt: skip
    assert written_on == pytest.approx(sum(after) / len(after))
    assert metrics["mintrl/reward_intervened"] == 1.0 and metrics["mintrl/interventions_active"] == 1.0
    assert metrics["mintrl/judge_failures"] == 0.0 and metrics["mintrl/staleness"] == 0.0
    assert {"mintrl/reward_control", "mintrl/admission_wait_s", "completions/mean_length"} <= set(metrics)


# ---------------------------------------------------------------------------------------------------------------
# staleness: version-gated admission


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_a_batch_starts_only_once_the_server_holds_its_weight_version(make_worker, cpu_args, max_staleness):
    """After the cold sync (version 1), batch s trains with version s + 1: it may start at version
    s + 1 - max_staleness. So max_staleness + 1 batches are written ahead, then one per weight sync."""
    worker = make_worker(worker_args(cpu_args, max_staleness=max_staleness))
    worker.update_model_version(1)
    worker.start()
    for version in (1, 2, 3):
        written = (version + max_staleness) * STEP
        wait_for(lambda: worker.rollout_buffer.qsize() == written, what=f"{written} samples")  # noqa: B023
        time.sleep(0.3)  # time enough for the fake engine to write another batch, were it admitted
        assert worker.rollout_buffer.qsize() == written and worker.next_step == version + max_staleness
        worker.update_model_version(version + 1)


@pytest.mark.parametrize("weight_sync_steps", [1, 2])
@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_staleness_never_exceeds_max_staleness(make_worker, cpu_args, max_staleness, weight_sync_steps):
    """A slow trainer: the worker runs ahead as far as it may, so the bound is reached but never passed; with
    max_staleness=0 every rollout is trained by the weights that wrote it (synchronous training)."""
    args = worker_args(cpu_args, max_staleness=max_staleness, weight_sync_steps=weight_sync_steps)
    worker = make_worker(args)
    consumed = train(worker, 6, step_seconds=0.15, weight_sync_steps=weight_sync_steps)
    staleness = [s for batch in consumed for s, _ in batch]
    assert max(staleness) == max_staleness and min(staleness) >= 0
    assert [sample.group_id for batch in consumed for _, sample in batch] == [i // 4 for i in range(6 * STEP)]
    planned = [m["mintrl/staleness"] for m in drain_metrics(worker)[:6]]
    assert planned == [max(s for s, _ in batch) for batch in consumed]  # what the worker planned is what happened


# ---------------------------------------------------------------------------------------------------------------
# the schedule counts optimizer steps


def interventions_per_batch(consumed) -> list[bool]:
    return [any(not sample.metrics.extras["is_control"] for _, sample in batch) for batch in consumed]


def test_interventions_stop_at_intervention_steps_though_the_worker_runs_ahead(make_worker, cpu_args):
    worker = make_worker(worker_args(cpu_args, max_staleness=2, intervention_steps=2))
    consumed = train(worker, 4, step_seconds=0.1)
    assert interventions_per_batch(consumed) == [True, True, False, False]
    for _, sample in consumed[3]:  # all controls: no judge token, one baseline over the whole group
        assert sample.metrics.extras["judge_mask"].sum() == 0


def test_the_adaptive_switch_off_stops_interventions_from_the_next_batch(make_worker, cpu_args):
    worker = make_worker(worker_args(cpu_args, max_staleness=2, intervention_stop_gap=10.0))
    consumed = train(worker, 3)
    assert interventions_per_batch(consumed) == [True, False, False]
    assert worker.schedule.interventions_stopped_at == 0 and worker.schedule.reward_gap_ema is not None


def test_a_resumed_worker_writes_the_batch_the_first_one_would_have(make_worker, cpu_args):
    """A checkpoint at step 3, while the worker has run ahead: the state of step 3's batch (its prompts, the budget
    controller's share and carry, the schedule) is what resumes, and the new worker writes that batch again."""
    fields = dict(max_staleness=2, intervention_steps=5, judge_token_target=0.05)
    first = make_worker(worker_args(cpu_args, **fields))
    consumed = train(first, 4, step_seconds=0.1)
    wait_for(lambda: first.next_step >= 5, what="the worker to run ahead")
    state = json.loads(json.dumps(first.state_dict(step=3)))  # as a checkpoint stores it
    assert state["next_step"] == 3 and state["prompt_index"] == 3 * GROUPS and state["model_version"] == 5

    resumed = make_worker(worker_args(cpu_args, **fields))
    resumed.load_state_dict(state)
    resumed.update_model_version(resumed.model_version + 1)  # the resumed trainer's cold sync
    resumed.start()
    again = [resumed.rollout_buffer.get(timeout=60) for _ in range(STEP)]
    original = [sample for _, sample in consumed[3]]
    assert [s.group_id for s in again] == [s.group_id for s in original]
    assert [s.metrics.extras["is_control"] for s in again] == [s.metrics.extras["is_control"] for s in original]
    assert [s.input_ids.tolist() for s in again] == [s.input_ids.tolist() for s in original]
    assert [s.advantage for s in again] == [s.advantage for s in original]
    assert first.state_dict()["intervention_budget"] != state["intervention_budget"]  # it had moved on since
    with pytest.raises(ValueError, match="No rollout state for step 0"):
        first.state_dict(step=0)


# ---------------------------------------------------------------------------------------------------------------
# failures and shutdown


class BrokenStream(FakeStream):
    def _step(self):
        raise ConnectionError("engine down")


class BrokenLM(FakeLM):
    """Streams, and fails on its first step, as a server that went away."""

    def _open_stream(self, wake):
        return BrokenStream(self, wake)


def test_a_failing_engine_surfaces_through_check_health(make_worker, cpu_args, tiny_tokenizer):
    worker = make_worker(worker_args(cpu_args), engine=BrokenLM(tiny_tokenizer))
    worker.update_model_version(1)
    worker.start()
    wait_for(lambda: not worker._thread.is_alive(), what="the worker to fail")
    with pytest.raises(RuntimeError, match="rollout worker failed: ConnectionError: engine down") as raised:
        worker.check_health(stale_after_s=300)
    assert isinstance(raised.value.__cause__, ConnectionError)


def test_check_health_reports_a_worker_that_makes_no_progress(make_worker, cpu_args, tiny_tokenizer):
    worker = make_worker(worker_args(cpu_args), engine=FakeLM(tiny_tokenizer, step_seconds=0.05))
    worker.update_model_version(1)
    worker.start()
    time.sleep(0.2)  # inside a slow batch: no heartbeat
    with pytest.raises(RuntimeError, match="no progress"):
        worker.check_health(stale_after_s=0.1)
    worker.check_health(stale_after_s=300)


def test_stop_ends_every_thread_waiting_or_writing(make_worker, cpu_args, tiny_tokenizer):
    """Stopped while it waits for the trainer, and while a batch is under way (judge threads busy): `stop()`
    returns with no thread of the worker left (checked by `make_worker`), and a stopped worker does not restart."""
    waiting = make_worker(worker_args(cpu_args, max_staleness=0))
    waiting.update_model_version(1)
    waiting.start()
    wait_for(lambda: waiting.rollout_buffer.qsize() == STEP, what="the first batch")
    writing = make_worker(worker_args(cpu_args), engine=FakeLM(tiny_tokenizer, step_seconds=0.01))
    writing.update_model_version(1)
    writing.start()
    wait_for(lambda: writing.engine.steps > 3, what="a batch under way")
    for worker in (waiting, writing):
        worker.stop()
        assert not worker._thread.is_alive()
        worker.check_health(stale_after_s=300)  # stopping is not a failure
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME or t.name.startswith("mintrl-")]
    with pytest.raises(RuntimeError, match="runs once"):
        waiting.start()


def test_refuses_a_step_that_is_not_whole_groups(make_worker, cpu_args):
    args = worker_args(cpu_args)
    args.per_device_train_batch_size = 6  # a config the namespace lets through
    with pytest.raises(ValueError, match="6 rollouts per optimizer step is not a multiple of num_generations=4"):
        make_worker(args)


# ---------------------------------------------------------------------------------------------------------------
# VLLMHTTPEngine against a recording completions server


class CompletionsServer:
    """`POST /v1/completions` as vLLM answers it with `return_token_ids` and `logprobs: 0`: token t is
    `100 + (sum(prompt) + i) % 400` with log-prob `-t / 1000`, `max_tokens` of them unless `eos` is reached first.
    Records each request body; `respond(body)` may answer instead (status, payload); `delay` slows each answer.
    `GET /metrics` counts prefix-cache queries (prompt tokens) and hits (all but the last); `GET /server_info`
    gives `max_num_seqs` and `logprobs_mode` (None: it answers 404, as a server without VLLM_SERVER_DEV_MODE)."""

    def __init__(self, eos: int = 2):
        self.bodies: list[dict] = []
        self.respond = None
        self.delay = 0.0
        self.in_flight = self.max_in_flight = 0
        self.hits = self.queries = 0
        self.logprobs_mode: str | None = "processed_logprobs"
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.bodies.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.queries += len(body["prompt"])
                    server.hits += len(body["prompt"]) - 1
                time.sleep(server.delay)
                status, payload = server.respond(body) if server.respond else (200, server.completion(body, eos))
                with server.lock:
                    server.in_flight -= 1
                self.send(status, payload)

            def do_GET(self):
                if self.path.startswith("/metrics"):
                    text = f"vllm:prefix_cache_queries_total{{engine='0'}} {server.queries}\n"
                    text += f"vllm:prefix_cache_hits_total{{engine='0'}} {server.hits}\n"
                    self.send(200, text)
                elif server.logprobs_mode is None:
                    self.send(404, "Not Found")
                else:
                    config = {
                        "scheduler_config": {"max_num_seqs": 3},
                        "model_config": {"logprobs_mode": server.logprobs_mode},
                    }
                    self.send(200, {"vllm_config": config})

            def send(self, status, payload):
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), name="test-server")

    @staticmethod
    def completion(body: dict, eos: int) -> dict:
        tokens = []
        while len(tokens) < body["max_tokens"] and eos not in tokens:
            tokens.append(100 + (sum(body["prompt"]) + len(tokens)) % 400)
        return {"choices": [{"text": "", "token_ids": tokens, "logprobs": {"token_logprobs": [-t / 1000 for t in tokens]}}]}  # fmt: skip


@pytest.fixture
def server():
    server = CompletionsServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        server.thread.join(timeout=10)


@pytest.fixture
def engines():
    """Builds `VLLMHTTPEngine`s, closed at teardown."""
    with stopped_at_exit(VLLMHTTPEngine.close) as built:

        def build(url, **kwargs):
            kwargs.setdefault("model", "policy")
            kwargs.setdefault("eos_token_ids", [2])
            built.append(VLLMHTTPEngine(url, **kwargs))
            return built[-1]

        yield build


def expected(prompt: list[int], cap: int) -> Generation:
    out = CompletionsServer.completion({"prompt": prompt, "max_tokens": cap}, eos=2)["choices"][0]
    return Generation(out["token_ids"], out["logprobs"]["token_logprobs"])


def test_http_engine_sends_trls_payload_and_parses_token_ids_and_logprobs(server, engines):
    version = [1]
    defaults = dict(temperature=0.7, top_p=0.9, top_k=5, min_p=None, repetition_penalty=1.1)
    engine = engines(server.url, model=lambda: f"policy-v{version[0]}", sampling_defaults=defaults, seed=0)
    out = engine.generate([[5, 6, 7], [9]], max_new_tokens=[3, 0])
    assert out == [expected([5, 6, 7], 3), Generation([], [])]  # no request for a prompt without budget
    (body,) = server.bodies
    seed = body.pop("seed")
    assert isinstance(seed, int) and body == {
        "model": "policy-v1",
        "prompt": [5, 6, 7],
        "max_tokens": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "repetition_penalty": 1.1,
        "n": 1,
        "return_token_ids": True,
        "logprobs": 0,
        "stop_token_ids": [2],
    }
    version[0] = 2  # e.g. the LoRA adapter of the next weight version
    engine.generate([[1]], max_new_tokens=2, temperature=0)
    assert server.bodies[-1]["model"] == "policy-v2"
    assert {k: server.bodies[-1][k] for k in ("temperature", "top_p", "top_k", "min_p")} == {
        "temperature": 0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
    }
    server.respond = lambda body: (200, {"choices": [{"token_ids": [7, 2, 9], "logprobs": {"token_logprobs": [-1, -2, -3]}}]})  # fmt: skip
    assert engine.generate([[1]], max_new_tokens=5) == [Generation([7, 2], [-1.0, -2.0])]  # cut after EOS
    engine.reset_cache_stats()
    engine.generate([[1, 2, 3, 4]], max_new_tokens=1)
    assert engine.prefix_cache_hit_rate() == pytest.approx(3 / 4)
    assert engine.server_max_num_seqs() == 3


def test_http_engine_streams_with_priorities_and_drops_cancelled_requests(server, engines):
    engine = engines(server.url, capacity=1)
    server.delay = 0.05
    assert engine.supports_streaming
    with engine.stream() as stream:
        late = stream.submit([1, 2], 3, priority=2)
        cancelled = stream.submit([4], 2, priority=1)
        first = stream.submit([3], 4, priority=0)
        stream.step()  # admits the request of priority 0 only (capacity 1)
        stream.cancel(cancelled)
        while stream.has_work():
            stream.step()
    assert first.result() == expected([3], 4) and late.result() == expected([1, 2], 3) and cancelled.cancelled()
    assert [body["prompt"] for body in server.bodies] == [[3], [1, 2]] and server.max_in_flight == 1


def test_http_engine_errors_name_the_url(server, engines):
    engine = engines(server.url)
    server.respond = lambda body: (500, "boom")
    with pytest.raises(RuntimeError, match=rf"POST {server.url}/v1/completions returned 500: boom"):
        engine.generate([[1]], max_new_tokens=2)
    server.respond = lambda body: (200, {"choices": [{"text": "hi"}]})
    with pytest.raises(RuntimeError, match=rf"{server.url}/v1/completions returned no `token_ids`.*return_token_ids"):
        engine.generate([[1]], max_new_tokens=2)
    server.respond = lambda body: (200, {"choices": [{"token_ids": [5], "logprobs": None}]})
    with pytest.raises(RuntimeError, match="log-prob is needed for each"):
        engine.generate([[1]], max_new_tokens=2)
    unreachable = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=rf"POST {unreachable}/v1/completions failed after 1 attempts.*vllm serve"):
        engines(unreachable, max_retries=0).generate([[1]], max_new_tokens=2)
    engine.close()
    with pytest.raises(RuntimeError, match=rf"VLLMHTTPEngine for {server.url} is closed"):
        engine.generate([[1]], max_new_tokens=2)


def test_the_worker_runs_on_the_http_engine_and_stop_closes_it(server, engines, make_worker, cpu_args, tiny_tokenizer):
    """The continuous rollout over HTTP: the served model named per weight version, the server's log-probs on the
    policy tokens; a stop during a slow batch fails it at once, closes the engine and leaves no thread."""
    worker = None
    engine = engines(server.url, model=lambda: f"trl-policy-v{worker.model_version}")
    worker = make_worker(worker_args(cpu_args), engine=engine)
    (batch,) = train(worker, 1)
    assert {body["model"] for body in server.bodies} <= {"trl-policy-v1", "trl-policy-v2"}
    for _, sample in batch:
        prompt_len, ids = completion(sample, tiny_tokenizer)
        policy = sample.metrics.extras["judge_mask"][prompt_len:] == 0
        assert torch.tensor(sample.old_log_probs[prompt_len:][policy]).tolist() == pytest.approx(
            [-t / 1000 for t, p in zip(ids, policy, strict=True) if p]
        )
    server.delay = 0.5
    wait_for(lambda: server.in_flight > 0, what="a request under way")
    started = time.monotonic()
    worker.stop()
    assert time.monotonic() - started < 5 and not worker._thread.is_alive()
    worker.check_health(stale_after_s=300)
    with pytest.raises(RuntimeError, match="is closed"):
        engine.generate([[1]], max_new_tokens=1)


@pytest.mark.parametrize(
    "mode, temperature, refused",
    [
        ("processed_logprobs", 0.7, False),
        ("raw_logprobs", 1.0, False),  # the raw model's log-probs are the policy's at temperature 1
        ("raw_logprobs", 0.7, True),
        ("processed_logits", 1.0, True),
    ],
)
def test_the_worker_refuses_a_server_whose_logprobs_are_not_the_policys(
    server, engines, make_worker, cpu_args, mode, temperature, refused
):
    """The regression anchors policy tokens at the server's sampled log-probs: they must be the policy's at the
    sampling temperature, or no rollout starts."""
    server.logprobs_mode = mode
    worker = make_worker(
        worker_args(cpu_args), engine=engines(server.url, sampling_defaults={"temperature": temperature})
    )
    if refused:
        message = (
            rf"--logprobs-mode {mode}: .*temperature={temperature}.*Restart it with --logprobs-mode processed_logprobs"
        )
        with pytest.raises(ValueError, match=message):
            worker.start()
        assert worker._thread is None
    else:
        worker.start()
        assert worker._thread is not None


def test_the_worker_warns_when_the_server_does_not_say_its_logprobs_mode(
    server, engines, make_worker, cpu_args, caplog
):
    server.logprobs_mode = None
    worker = make_worker(worker_args(cpu_args), engine=engines(server.url))
    worker.start()
    assert "Could not read the --logprobs-mode" in caplog.text and "VLLM_SERVER_DEV_MODE=1" in caplog.text
