"""`AsyncMInTRLTrainer` without a vLLM server: a scripted rollout worker (TRL's `RolloutWorkerProtocol`) pushes prepared
rollouts and a no-op weight transfer stands in for the server. The loss on a stale rollout is the hand-computed
regression, the trainer builds MInTRL's worker and the disk weight sync for a server, training runs end to end within
`max_staleness`, the config and the trainer refuse what they cannot honour, a resumed run gets the trainer's and the
worker's state back, and no thread outlives `train()`."""

from __future__ import annotations

import json
import queue
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import params_changed, snapshot
from mintrl_helpers import mintrl_fields, revise_first_step_judge, role_reward
from openai_server import ScriptedServer
from peft import LoraConfig
from test_async_packing import collate_through_trl
from test_mintrl_continuous import FakeLM
from transformers import AutoModelForCausalLM
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from trl_mintrl.engines.vllm_http import VLLMHTTPEngine
from trl_mintrl.judges import EndpointJudge, GeneratingJudge
from trl_mintrl.mintrl.async_ import AsyncMInTRLConfig, AsyncMInTRLTrainer, SampleMetrics
from trl_mintrl.mintrl.async_.config import REFUSED_ASYNC_FIELDS
from trl_mintrl.mintrl.async_.trainer import STATE_FILE
from trl_mintrl.mintrl.async_.transfer import DiskReloadTransfer
from trl_mintrl.mintrl.async_.worker import MInTRLRolloutWorker
from trl_mintrl.mintrl.judge_watch import JudgeOutageError

BETA, KAPPA = 0.05, -0.2
TRL_TRACE_THREAD = "rollout-trace-logger"  # TRL's RolloutQueueDataset starts this daemon and never stops it


class NoTransfer:
    """TRL's `WeightTransferProtocol` with no server: syncs only bump the trainer's `model_version`."""

    def init_weight_transfer(self):
        pass

    def pause(self):
        pass

    def send_weights(self, iterator):
        for _ in iterator:
            pass

    def resume(self):
        pass

    def destroy(self):
        pass


class ScriptedWorker:
    """TRL's `RolloutWorkerProtocol` pushing prepared batches, one optimizer step's rollouts each, gated like
    `MInTRLRolloutWorker`: batch b (trained with weight version `first_version + b - first_batch`, one sync per step)
    is written once the weights are at most `max_staleness` versions older, and stamped with the version current
    then. The batches that `start()` may write at once are written before it returns, so the first stale batch does
    not depend on thread timing. `fail_at`: the batch whose writing raises."""

    def __init__(self, max_staleness: int, groups_per_step: int = 1, fail_at: int | None = None):
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.max_staleness, self.groups_per_step, self.fail_at = max_staleness, groups_per_step, fail_at
        self.version = self.next_batch = self.first_batch = self.first_version = 0
        self.written: list[tuple[int, int]] = []  # (batch, version that wrote it)
        self.loaded_state: dict | None = None
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self):
        self.first_batch, self.first_version = self.next_batch, self.version
        while self._admitted():
            self._write()
        self._thread = threading.Thread(target=self._run, name="scripted-rollout-worker")
        self._thread.start()

    def stop(self):
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def update_model_version(self, model_version):
        with self._changed:
            self.version = model_version
            self._changed.notify_all()

    def check_health(self, stale_after_s):
        if self.error is not None:
            raise RuntimeError(f"scripted worker failed: {self.error}") from self.error

    def state_dict(self, step):
        """As `MInTRLRolloutWorker`: a state only for the steps whose batches it wrote, and the next one."""
        if step > self.next_batch:
            raise ValueError(f"no state for step {step}: the next batch is {self.next_batch}")
        return {"next_batch": step, "version": self.version}

    def load_state_dict(self, state):
        self.loaded_state = state
        self.next_batch = state["next_batch"]
        self.update_model_version(state["version"])

    def _admitted(self) -> bool:
        consume_version = self.first_version + self.next_batch - self.first_batch
        return self.version >= consume_version - self.max_staleness

    def _run(self):
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._stop.is_set() or self._admitted())
                if self._stop.is_set():
                    return
                self._write()
        except Exception as error:
            self.error = error

    def _write(self):
        batch = self.next_batch
        if batch == self.fail_at:
            raise ValueError(f"batch {batch} cannot be written")
        for group in range(self.groups_per_step):
            for sample in scripted_group(batch * self.groups_per_step + group, self.version, self.groups_per_step):
                self.rollout_buffer.put(sample)
        self.written.append((batch, self.version))
        self.metrics_queue.put({"scripted/batches_total": 1.0})
        self.next_batch += 1


def rollout_sample(
    prompt, completion, judge, behaviour_logps, advantage, version, group_id, step_rows, trained=True
) -> RolloutSample:
    """A rollout as `MInTRLRolloutWorker` writes it: sampled log-probs on policy tokens, 0 on the prompt and on judge
    tokens, the judge-token mask and its step's rollouts in the regression (`step_rows`) in the metrics' extras;
    `trained=False`: left out of the regression (mask_truncated_completions)."""
    judge_mask = np.array([0] * len(prompt) + judge)
    return RolloutSample(
        prompt=[],
        completion=[],
        input_ids=np.array(prompt + completion),
        completion_mask=np.array([0] * len(prompt) + [int(trained)] * len(completion)),
        old_log_probs=np.where(judge_mask == 1, 0.0, behaviour_logps).astype(np.float32),
        advantage=advantage,
        model_version=version,
        group_id=group_id,
        metrics=SampleMetrics(
            {"reward": advantage},
            extras={
                "judge_mask": judge_mask,
                "model_version": version,
                "is_control": False,
                "step_regression_rows": step_rows,
            },
        ),
    )


def scripted_group(group_id: int, version: int, groups_per_step: int) -> list[RolloutSample]:
    """Four rollouts of one prompt (two controls, two intervened, one judge token each), behaviour log-probs -1."""
    prompt = [10 + group_id % 50, 11, 12, 13]
    rollouts = [([20, 21, 22, 23], [0] * 4), ([20, 24, 25], [0] * 3), ([30, 31, 32], [0, 1, 0]), ([33, 34], [1, 0])]
    return [
        rollout_sample(prompt, completion, judge, np.full(len(prompt) + len(completion), -1.0), advantage, version,
                       group_id, step_rows=4 * groups_per_step)
        for (completion, judge), advantage in zip(rollouts, [-0.5, -0.5, 1.5, -0.5], strict=True)
    ]  # fmt: skip


def make_trainer(tiny_model_path, toy_dataset, args, worker, trainer_class=None) -> AsyncMInTRLTrainer:
    return (trainer_class or AsyncMInTRLTrainer)(
        tiny_model_path,
        reward_funcs=[],
        args=args,
        train_dataset=toy_dataset,
        rollout_worker=worker,
        weight_transfer=NoTransfer(),
    )


def async_args(cpu_args, **overrides) -> AsyncMInTRLConfig:
    """cpu_args: one group of 4 rollouts per optimizer step; a regression temperature at which anchors count."""
    return AsyncMInTRLConfig(**{**cpu_args, "regression_beta": BETA, "kappa": KAPPA, **overrides})


def sequence_log_probs(model, input_ids: np.ndarray) -> torch.Tensor:
    """(L,) log pi(token_p | tokens before p) by a plain forward of one sequence (0 at p = 0)."""
    ids = torch.as_tensor(input_ids)[None]
    logps = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return torch.cat([logps.new_zeros(1), logps])


# ----- the loss on a stale rollout, hand-computed -----


def test_stale_rollout_loss_is_the_hand_computed_regression(tiny_model_path, cpu_args, toy_dataset):
    """Two groups on two ranks' rows (the shorter row padded): group 0 written by the weights before the last sync
    (its anchors are their log-probs), group 1 by the current weights; judge tokens anchored at kappa. The rows'
    losses add up to mean_y (beta * sum_t (log pi_theta - a_t) - A)^2 from a per-sequence forward, and so do their
    gradients: no ratio, no clipping, padding terms counted nowhere."""
    trainer = make_trainer(tiny_model_path, toy_dataset, async_args(cpu_args), ScriptedWorker(max_staleness=1))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa", dtype=torch.float32)
    specs = [  # (group, prompt, completion, judge flags, advantage)
        (0, [11, 12, 13, 14, 15, 16], [31, 32, 33, 34, 35], [0, 1, 1, 0, 0], 0.5),
        (0, [11, 12, 13, 14, 15, 16], [31, 32, 36], [0, 0, 0], -0.5),
        (1, [21, 22, 23, 24], [41, 42, 43, 44, 45, 46, 47, 48], [0, 0, 0, 1, 1, 1, 0, 0], 1.0),
        (1, [21, 22, 23, 24], [41, 49, 50, 51, 52, 53], [0] * 6, -1.0),
    ]

    def behaviour(group):  # each group's rollouts as the weights of its version wrote them
        with torch.no_grad():
            return [sequence_log_probs(reference, np.array(p + c)).numpy() for g, p, c, _, _ in specs if g == group]

    stale_logps = behaviour(0)
    with torch.no_grad():  # a weight update since group 0 was written
        generator = torch.Generator().manual_seed(0)
        for param in trainer.model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    reference.load_state_dict(trainer.model.state_dict())
    assert np.abs(behaviour(0)[0] - stale_logps[0]).max() > 1e-2  # its anchors are not the current log-probs
    logps = stale_logps + behaviour(1)

    def collated(step_rows: int):  # as TRL's trainer does: queue, planner, collator
        samples = [
            rollout_sample(p, c, j, lp, a, version=g, group_id=g, step_rows=step_rows)
            for (g, p, c, j, a), lp in zip(specs, logps, strict=True)
        ]
        return samples, collate_through_trl(samples, "fixed")[0]

    samples, batch = collated(step_rows=4)
    assert (batch["token_index"] < 0).any()  # the shorter row has padding terms

    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [{key: value[rank : rank + 1] for key, value in batch.items()} for rank in range(2)]
    loss = sum(trainer.compute_loss(trainer.model, row) for row in rows)

    residuals = []
    for sample in samples:
        current = sequence_log_probs(reference, sample.input_ids)
        judge = torch.as_tensor(sample.metrics.extras["judge_mask"], dtype=torch.bool)
        anchors = torch.where(judge, KAPPA, torch.as_tensor(sample.old_log_probs))
        trained = torch.as_tensor(sample.completion_mask, dtype=torch.bool)
        residuals.append(BETA * (current - anchors)[trained].sum() - sample.advantage)
    expected = torch.stack(residuals).pow(2).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)

    loss.backward()
    expected.backward()
    trained_grads = dict(trainer.model.named_parameters())
    for name, param in reference.named_parameters():
        scale = param.grad.abs().max().item()  # float32 agreement, at the scale of the tensor's gradient
        torch.testing.assert_close(trained_grads[name].grad, param.grad, rtol=0, atol=1e-5 * scale, msg=name)

    # one of two micro-batches of an optimizer step of 8 rollouts: its share of the step's mean
    trainer.current_gradient_accumulation_steps = 2
    _, batch = collated(step_rows=8)
    with torch.no_grad():
        halved = sum(
            trainer.compute_loss(trainer.model, {k: v[r : r + 1] for k, v in batch.items()}) for r in range(2)
        )
    torch.testing.assert_close(halved, expected.detach() / 2, rtol=1e-5, atol=1e-7)


def test_every_rollout_of_an_optimizer_step_weighs_the_same_whatever_its_micro_batch(
    tiny_model_path, cpu_args, toy_dataset
):
    """An optimizer step of two micro-batches, one keeping all 4 rollouts in the regression and one keeping 1 of 4
    (mask_truncated_completions left the other 3 out): the step's loss is the mean over those 5 rollouts, each
    weighing 1/5, as in MInTRLTrainer, not 1/4 and 1 (a mean per micro-batch)."""
    trainer = make_trainer(tiny_model_path, toy_dataset, async_args(cpu_args), ScriptedWorker(max_staleness=1))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    prompt, completions = [11, 12, 13, 14], [[31, 32, 33], [31, 34], [35, 36, 37, 38], [39]]
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():  # the trainer's model runs TRL's packed tree attention: score with a plain copy
        logps = [sequence_log_probs(reference, np.array(prompt + c)).numpy() - 0.1 for c in completions]
    micro_batches = [[True] * 4, [False, True, False, False]]  # rollouts in the regression, per micro-batch
    loss, squared = 0.0, []
    for step, kept in enumerate(micro_batches):
        samples = [
            rollout_sample(prompt, c, [0] * len(c), lp, a, version=1, group_id=step, step_rows=5, trained=k)
            for c, lp, a, k in zip(completions, logps, [0.5, -0.5, 1.0, -1.0], kept, strict=True)
        ]
        batch, _ = collate_through_trl(samples, "fixed")
        loss = loss + sum(
            trainer.compute_loss(trainer.model, {k: v[r : r + 1] for k, v in batch.items()}) for r in range(2)
        )
        with torch.no_grad():
            for sample, k in zip(samples, kept, strict=True):
                if k:  # the anchors are 0.1 below the current log-probs
                    n_completion = int(sample.completion_mask.sum())
                    squared.append((BETA * 0.1 * n_completion - sample.advantage) ** 2)
    assert len(squared) == 5
    torch.testing.assert_close(loss.detach(), torch.tensor(sum(squared) / 5), rtol=1e-4, atol=1e-6)


# ----- what the trainer builds for a vLLM server -----


@pytest.mark.parametrize("judge", ["object", "args"])
def test_builds_the_rollout_worker_and_the_disk_sync(tiny_model_path, cpu_args, toy_dataset, judge):
    """Without `rollout_worker` and `weight_transfer`: MInTRL's worker on an HTTP engine for the served model, with
    TRL's end-of-completion ids and the config's sampling, and the disk weight sync bound to the tied head. Nothing
    contacts the server before training starts."""
    judge_object = revise_first_step_judge() if judge == "object" else None
    args = async_args(cpu_args, temperature=0.7)
    trainer = AsyncMInTRLTrainer(tiny_model_path, [role_reward], args, toy_dataset, judge=judge_object)
    worker, engine = trainer.rollout_worker, trainer.policy_engine
    try:
        assert isinstance(worker, MInTRLRolloutWorker) and worker.engine is engine
        assert isinstance(engine, VLLMHTTPEngine) and engine.served_model() == tiny_model_path
        assert engine.eos_token_ids == trainer.eos_token_ids  # derived before TRL's constructor, as it derives them
        # the filters sent at their "off" values, so the server's generation_config defaults never apply
        assert engine.sampling_defaults == dict(temperature=0.7, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)
        if judge == "object":
            assert worker.judge is judge_object
        else:  # judge="self": the policy on the server, shown the reference
            assert isinstance(worker.judge, GeneratingJudge) and worker.judge.engine is engine
        transfer = trainer.weight_transfer
        assert isinstance(transfer, DiskReloadTransfer)
        assert transfer.folder == (Path(args.output_dir) / ".vllm_weights").resolve()
        assert transfer.tied_names == {"lm_head.weight": "model.embed_tokens.weight"}
    finally:
        worker.stop()


# ----- end to end -----


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if entry.get(key) is not None]


class TrainedBatchSpy(AsyncMInTRLTrainer):
    """Records, per loss computation, the batch trained (its prompt's first token names it, `scripted_group`) and
    the weight version that trains it. TRL's own `sample/staleness_*` are measured when the dataloader fetches a
    sample, one micro-batch ahead of training (accelerate's dispatcher prefetches), so they read one less."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.trained = getattr(self, "trained", [])
        self.trained.append((int(inputs["input_ids"][0, 0]) - 10, self.model_version))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def test_trains_end_to_end_within_max_staleness(tiny_model_path, cpu_args, toy_dataset):
    threads_before = set(threading.enumerate())
    worker = ScriptedWorker(max_staleness=1)
    trainer = make_trainer(tiny_model_path, toy_dataset, async_args(cpu_args, max_steps=3), worker, TrainedBatchSpy)
    before = snapshot(trainer.model)
    trainer.train()

    assert params_changed(before, trainer.model) > 0
    assert trainer.model_version == 4  # the cold sync, then one sync per optimizer step
    written_by = dict(worker.written)
    staleness = [version - written_by[batch] for batch, version in trainer.trained]
    assert [batch for batch, _ in trainer.trained] == [0, 1, 2]
    assert staleness[:2] == [0, 1] and max(staleness) <= 1  # batch 1 was written while batch 0 trained
    assert not logged(trainer, "sample/dropped_stale_total")
    for key in ("loss", "entropy", "mintrl/judge_token_nll", "mintrl/regression_residual"):
        assert len(logged(trainer, key)) == 3, key
    assert sum(logged(trainer, "scripted/batches_total")) >= 3  # the worker's metrics queue is drained
    assert trainer._trained_groups == {0, 1, 2, 3}  # TRL counts the groups it collates: one batch ahead
    assert {t for t in threading.enumerate() if t.name != TRL_TRACE_THREAD} <= threads_before  # nothing outlives


def test_a_failing_worker_stops_training_and_leaves_no_thread(tiny_model_path, cpu_args, toy_dataset):
    """TRL asks the worker for its health when no rollout came for 5 s; the error ends `train()`, whose cleanup stops
    the worker."""
    threads_before = set(threading.enumerate())
    worker = ScriptedWorker(max_staleness=1, fail_at=2)
    trainer = make_trainer(tiny_model_path, toy_dataset, async_args(cpu_args, max_steps=3), worker)
    with pytest.raises(RuntimeError, match="batch 2 cannot be written"):
        trainer.train()
    assert trainer.state.global_step == 1
    assert {t for t in threading.enumerate() if t.name != TRL_TRACE_THREAD} <= threads_before


# ----- resume -----


def test_a_judge_outage_stops_after_the_step_that_trains_the_deciding_batch(
    tiny_model_path, tiny_tokenizer, cpu_args, toy_dataset, tmp_path
):
    """MInTRL's own worker (the scripted engine) with an endpoint judge whose server answers HTTP 500 to everything.
    Batch 0's rollouts end before any review (no judge request: no news), batches 1 and 2 get no answer, so with
    judge_outage_steps=2 the worker decides on batch 2, while it runs up to max_staleness=2 steps ahead; the run
    stops where MInTRLTrainer stops, after the optimizer step that trains batch 2 (global step 3), with
    checkpoint-3 and JudgeOutageError. The checkpoint holds the judge's failure counters as of batch 3's start,
    which a resumed run continues from."""
    server = ScriptedServer(lambda question, attempt, body: (500, {"error": "down"}, 0))
    output_dir = tmp_path / "run"
    args = AsyncMInTRLConfig(
        **mintrl_fields(cpu_args, output_dir=str(output_dir), judge_outage_steps=2), max_staleness=2
    )

    def trainer_and_judge(max_steps: int):
        judge = EndpointJudge(server.url, model="judge", max_retries=0)
        worker = MInTRLRolloutWorker(args, tiny_tokenizer, toy_dataset, [role_reward], judge, FakeLM(tiny_tokenizer))
        args.max_steps = max_steps
        return make_trainer(tiny_model_path, toy_dataset, args, worker), judge

    try:
        trainer, judge = trainer_and_judge(max_steps=6)
        checkpoint = output_dir / "checkpoint-3"
        message = (
            rf"no judge request was answered for 2 training steps in a row .*HTTP 500.*{re.escape(str(checkpoint))}$"
        )
        with pytest.raises(JudgeOutageError, match=message):
            trainer.train()
        worker = trainer.rollout_worker
        assert trainer.state.global_step == 3 and worker.judge_outage_stop[0] == 2
        assert worker.next_step > 3  # it had scored batches beyond the deciding one: the stop did not land there
        assert sorted(p.name for p in output_dir.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-3"]
        saved = json.loads((checkpoint / STATE_FILE).read_text())["rollout_worker"]
        assert saved["next_step"] == 3 and saved["judge_outage_steps"] == 2
        failures_at_save = saved["judge"]["failures"]["http_5xx"]
        assert 0 < failures_at_save < judge.failures["http_5xx"]  # batch 3's start, not the worker's latest count

        resumed, resumed_judge = trainer_and_judge(max_steps=5)
        with pytest.raises(JudgeOutageError, match="for 3 training steps in a row"):  # still down: batch 3 fails
            resumed.train(resume_from_checkpoint=str(checkpoint))
        assert resumed.state.global_step == 4
        assert resumed_judge.failures["http_5xx"] > failures_at_save  # counted on from the checkpoint, not from 0
    finally:
        server.close()


def test_resume_restores_the_trainer_and_worker_state(tiny_model_path, cpu_args, toy_dataset):
    settings = dict(max_steps=2, save_strategy="steps", save_steps=1)
    first = make_trainer(tiny_model_path, toy_dataset, async_args(cpu_args, **settings), ScriptedWorker(1))
    first.train()
    saved = json.loads((Path(first.args.output_dir) / "checkpoint-2" / STATE_FILE).read_text())
    assert saved["model_version"] == 3 and saved["groups_trained"] == 3  # TRL's count: one batch ahead
    assert saved["rollout_worker"] == {"next_batch": 2, "version": 3}

    worker = ScriptedWorker(max_staleness=1)
    resumed = make_trainer(tiny_model_path, toy_dataset, async_args(cpu_args, **{**settings, "max_steps": 3}), worker)
    resumed.train(resume_from_checkpoint=True)
    assert worker.loaded_state == saved["rollout_worker"]
    assert resumed.state.global_step == 3
    assert worker.written[0] == (2, 4)  # batch 2 next, after the cold sync of the restored version 3
    assert resumed._trained_groups == {2, 3} and resumed._groups_before_resume == 3
    assert resumed.model_version == 5
    absorbed = resumed.absorption.state_dict()["nll"]
    assert absorbed[: len(saved["judge_absorption"]["nll"])] == saved["judge_absorption"]["nll"]
    assert len(absorbed) == 2  # the first two steps closed (the second restored as pending), the third pending


# ----- config refusals -----

# A value other than AsyncMInTRLConfig's default for each refused field
NON_DEFAULT = {
    "epsilon": 0.3,
    "epsilon_high": 0.28,
    "token_budget": 256,
    "router_aux_loss_coef": 0.01,
    "fork_threshold_tokens": 64,
    "queue_maxsize": 64,
    "log_completions": True,
    "num_completions_to_print": 2,
    "top_p": 0.9,
    "top_k": 20,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "judge_vllm_gpu_memory_utilization": 0.3,
}


def test_every_refused_field_has_a_test_value():
    assert NON_DEFAULT.keys() == REFUSED_ASYNC_FIELDS.keys()


@pytest.mark.parametrize("name", sorted(REFUSED_ASYNC_FIELDS))
def test_refused_fields_name_the_field_why_and_instead(cpu_args, name):
    why, instead = REFUSED_ASYNC_FIELDS[name]
    with pytest.raises(ValueError) as raised:
        AsyncMInTRLConfig(**{**cpu_args, name: NON_DEFAULT[name]})
    message = str(raised.value)
    assert message.startswith(f"{name}=") and why in message and instead in message, message


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"anchor": "proxy"}, r"^anchor='proxy' is refused.*past weight version.*never computed.*anchor='const'"),
        ({"weight_sync": "lora"}, r"^weight_sync='lora' is not one of \('disk', 'nccl'\)"),
        ({"max_staleness": 0}, r"^max_staleness=0: .*fetches the next micro-batch.*max_staleness >= 1"),
        ({"num_generations": 3}, r"= 4 rollouts per optimizer step is not a multiple of num_generations=3"),
        ({"num_generations": 1}, r"^num_generations=1: "),  # MInTRL's own checks run too
        ({"kappa": 0.5}, r"^kappa=0.5: "),
    ],
)
def test_async_settings_refused_with_the_field(cpu_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        AsyncMInTRLConfig(**{**cpu_args, **overrides})


def test_defaults_and_mintrl_fields(cpu_args):
    args = AsyncMInTRLConfig(**cpu_args)
    assert (args.max_staleness, args.token_budget, args.weight_sync, args.anchor) == (2, 0, "disk", "const")
    assert (args.num_control_generations, args.num_intervened_generations) == (2, 2)
    assert args.accelerator_config.dispatch_batches  # AsyncGRPOConfig's own __post_init__ ran


@pytest.mark.parametrize(
    "case, error, message",
    [
        ({"tools": [len], "rollout_worker": "worker"}, ValueError, "^tools= is for the rollout worker the trainer"),
        ({"model": object()}, TypeError, "model as a path or Hub id"),
        ({"rollout_worker": "worker", "judge": "judge"}, ValueError, "a given rollout_worker has its own"),
        ({"judge_backend": "base", "peft_config": "lora"}, ValueError, "judge='base' with peft_config.*judge='model'"),
        ({"weight_sync": "nccl", "peft_config": "lora"}, ValueError, "weight_sync='nccl' with peft_config.*'disk'"),
    ],
)
def test_trainer_arguments_refused_before_the_model_loads(cpu_args, toy_dataset, case, error, message):
    """The model path does not exist: each refusal comes first."""
    case = dict(case)
    args = async_args(cpu_args, judge=case.pop("judge_backend", "self"), weight_sync=case.pop("weight_sync", "disk"))
    objects = {"worker": ScriptedWorker(1), "judge": revise_first_step_judge(), "lora": LoraConfig()}
    kwargs = {name: objects.get(value, value) if isinstance(value, str) else value for name, value in case.items()}
    kwargs.setdefault("model", "no/such-model")
    with pytest.raises(error, match=message):
        AsyncMInTRLTrainer(args=args, train_dataset=toy_dataset, **kwargs)
