"""`MInTRLRolloutWorker`: MInTRL's rollouts for TRL's `AsyncGRPOTrainer`, written while the trainer trains.

A thread of the trainer's main process (TRL's `RolloutWorkerProtocol`) builds one optimizer step's rollouts at a
time: whole groups of prompts, controls and intervened rollouts as in `MInTRLTrainer`, run by the project's rollout
state machine (`rollout_for`: the continuous schedule on a streaming engine such as `VLLMHTTPEngine`), scored by
the reward functions, given the control baseline, and pushed as TRL `RolloutSample`s whose `metrics` is a
`SampleMetrics` carrying the judge-token mask (collator.py). With TRL's `tools=` / `environment_factory=` the worker
builds the tools and environments itself (tools.py, as TRL's asynchronous trainer has its worker build them), and
the same state machine runs them inside the intervention loop, as in `MInTRLTrainer`: tool results are context in
the samples (no loss term), judge tokens are marked by the judge mask.

Staleness is bounded where the rollouts are made, not only where they are dropped. With `FixedCountBatcher` the
trainer's optimizer step s consumes exactly the rollouts of batch s, and trains them with weight version
`consume_version(s)` (one version per `weight_sync_steps` steps after the cold sync). Batch s is started only once
the server holds version `consume_version(s) - max_staleness` or later, so its rollouts are never more than
`max_staleness` versions old when trained, and TRL's dataset never has to drop one. (`max_staleness=0` would be
synchronous training, but TRL's training loop has accelerate fetch step s+1's batch before step s trains, so the
worker would wait for weights that never come: `AsyncMInTRLConfig` requires at least 1.) The intervention schedule counts
optimizer steps in the same way: batch s intervenes iff step s < `intervention_steps` (and the adaptive switch-off
has not fired), whatever the steps the worker runs ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from dataclasses import fields
from typing import Any

import torch
from trl.data_utils import is_conversational
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
from trl.trainer.utils import get_callable_name, is_async_callable

from ...engines.base import GenerationEngine
from ...engines.vllm_http import VLLMHTTPEngine
from ...judges import Judge, TransportStatus
from ...losses import control_baseline_advantages
from ...text import prompt_token_ids, question_text
from ...trainer_base import GenerationBatch
from ..continuous import rollout_for
from ..intervention_schedule import InterventionSchedule, reviewed_rows
from ..rollout import RolloutSettings, Trajectory
from ..rollout_batch import RolloutBatch, RolloutMeasures, is_truncated, rollout_metrics
from .collator import trajectory_sample
from .tools import WorkerTools

logger = logging.getLogger(__name__)

THREAD_NAME = "mintrl-async-rollout"


def check_logprobs_mode(engine: GenerationEngine) -> None:
    """Refuse a vLLM server whose sampled log-probs are not the policy's at the engine's sampling temperature, which
    the regression anchors policy tokens at (TRL's synchronous trainer checks its server likewise, for its importance
    sampling): vLLM's default `--logprobs-mode raw_logprobs` reports the raw model's, the same only at temperature 1;
    the `*_logits` modes report no log-probs at all. A server that cannot say gets a warning."""
    if not isinstance(engine, VLLMHTTPEngine):
        return
    temperature = engine.sampling_defaults.get("temperature", 1.0)
    mode = engine.server_logprobs_mode()
    if mode is None:
        logger.warning(
            "Could not read the --logprobs-mode of the vLLM server at %s (GET /server_info needs "
            "VLLM_SERVER_DEV_MODE=1): unless it is `processed_logprobs`, its sampled log-probs are not the policy's at "
            "temperature=%s, and the regression's anchors on policy tokens are biased.",
            engine.base_url,
            temperature,
        )
    elif not (mode == "processed_logprobs" or mode == "raw_logprobs" and temperature == 1.0):
        raise ValueError(
            f"The vLLM server at {engine.base_url} runs with --logprobs-mode {mode}: the log-probs it reports for the "
            f"tokens it samples are not the policy's at temperature={temperature}, which MInTRL's regression anchors "
            "policy tokens at (every residual would be biased). Restart it with --logprobs-mode processed_logprobs."
        )


class MInTRLRolloutWorker:
    """TRL's `RolloutWorkerProtocol` for MInTRL, run as a thread of the trainer's main process.

    Args:
        args: the config: MInTRL's fields under `MInTRLConfig`'s names (`num_generations` and its split
            `num_control_generations`, `chunk_size`, `max_reviews`, `max_correction_tokens`, `step_split`,
            `judge_votes`, `judge_min_agree`, `intervention_steps`, `intervention_stop_gap`, `intervention_gap_ema`,
            `judge_token_target`, `reference_column`, `rollout_schedule`, `speculative_chunks`, the judge-outage
            fields) and `AsyncGRPOConfig`'s (`max_completion_length`, `per_device_train_batch_size`,
            `gradient_accumulation_steps`, `max_staleness`, `weight_sync_steps`, `chat_template_kwargs`), plus
            `reward_weights` and `mask_truncated_completions` when present.
        processing_class: the policy's tokenizer (prompts, corrections, completions for the reward functions).
        train_dataset: the prompts, a sized dataset of rows with a `prompt` column; taken in order, cycling.
        reward_funcs: reward functions called as `MInTRLTrainer` calls them (one call per batch, with the dataset
            columns and `mintrl_intervened`); async functions are awaited.
        judge: reviews and corrects; None: every rollout is a control.
        engine: the policy's generation engine, called from the worker's thread only (no collectives), e.g. a
            `VLLMHTTPEngine`; the worker owns it: `stop()` closes a `VLLMHTTPEngine`.
        tools, environment_factory: TRL's, as `GRPOTrainer` takes them (`WorkerTools`); the environments' `get_reward`
            columns follow the reward functions', weight 1 each.
        max_model_len: the sequence length a tool-calling rollout may reach (None: no limit but
            `max_completion_length`).

    One optimizer step's rollouts (`per_device_train_batch_size * gradient_accumulation_steps * world_size`, whole
    groups) make a batch; a sample's `group_id` is its group's prompt position (counted over epochs and resumes).
    The schedule's watch of the judge is `MInTRLTrainer`'s (`InterventionSchedule`); when `judge_outage_policy="stop"`
    decides, `judge_outage_stop` says on which step's batch, for the trainer to stop after that step. `state_dict(step)` /
    `load_state_dict` resume exactly at an optimizer step. A worker runs once: `start()` after `stop()` is refused.
    """

    def __init__(
        self,
        args,
        processing_class,
        train_dataset,
        reward_funcs,
        judge: Judge | None,
        engine: GenerationEngine,
        *,
        tools: list | None = None,
        environment_factory=None,
        max_model_len: int | None = None,
    ):
        self.args = args
        self.tokenizer = processing_class
        self.judge = judge
        self.engine = engine
        self.dataset = train_dataset
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        self.reward_func_names = [get_callable_name(f) for f in self.reward_funcs]
        weights = getattr(args, "reward_weights", None)
        self.reward_weights = torch.tensor(weights if weights is not None else [1.0] * len(self.reward_funcs))
        self.group_size = args.num_generations
        self.num_controls = args.num_control_generations
        samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        samples_per_step *= getattr(args, "world_size", 1)
        self.groups_per_step = samples_per_step // self.group_size
        self.max_staleness = args.max_staleness
        self.weight_sync_steps = getattr(args, "weight_sync_steps", 1)
        self.settings = RolloutSettings(**{f.name: getattr(args, f.name) for f in fields(RolloutSettings)})
        self.eos_and_pad = {*engine.eos_token_ids, processing_class.pad_token_id}
        self._check_inputs(samples_per_step)
        self.tools = WorkerTools.of(processing_class, args, tools, environment_factory, max_model_len)
        if self.tools is not None:  # each environment class with `get_reward` is a reward column of weight 1
            self.reward_func_names += self.tools.reward_names
            self.reward_weights = torch.cat([self.reward_weights, torch.ones(len(self.tools.reward_names))])
        if not self.reward_func_names:
            raise ValueError(
                "No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose environment "
                "defines a `get_reward` method."
            )

        self.rollout_buffer: queue.Queue[RolloutSample] = queue.Queue()
        self.metrics_queue: queue.Queue[dict] = queue.Queue(maxsize=4096)  # full: metrics are dropped, never waited on
        self.schedule = InterventionSchedule(args)
        # (step, reason) once judge_outage_policy="stop" decides, on the batch of optimizer `step`: the trainer stops
        # after that step, which trains up to max_staleness steps after the worker scored its batch
        self.judge_outage_stop: tuple[int, str] | None = None
        self.next_step = 0  # the optimizer step that trains the next batch
        self.prompt_index = 0  # the next prompt's position, counted over epochs (row: position % len(dataset))
        self._state_lock = threading.Lock()  # the schedule's state: written by the thread, read by `state_dict`
        self._states_at_start: dict[int, dict] = {}  # step -> the state when its batch started (exact resumes)
        self._version = 0
        self._version_changed = threading.Condition()
        self._first_step = self._first_version = 0  # at `start()`: the step and weight version the run begins at
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.monotonic()

    def _check_inputs(self, samples_per_step: int) -> None:
        if samples_per_step % self.group_size:
            raise ValueError(
                f"per_device_train_batch_size x gradient_accumulation_steps x world_size = {samples_per_step} "
                f"rollouts per optimizer step is not a multiple of num_generations={self.group_size}: the worker "
                "writes whole groups (the control baseline is per group), one optimizer step's at a time."
            )
        if not hasattr(self.dataset, "__len__") or len(self.dataset) == 0:
            raise ValueError("MInTRLRolloutWorker needs a non-empty sized train_dataset (rows read by position).")
        if len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} values for {len(self.reward_funcs)} reward functions."
            )

    # ----------------------------------------------------------------------------------------------------------------
    # RolloutWorkerProtocol

    @property
    def model_version(self) -> int:
        return self._version

    def update_model_version(self, model_version: int) -> None:
        with self._version_changed:
            self._version = model_version
            self._version_changed.notify_all()

    def start(self) -> None:
        """Start writing rollouts, from the weight version the server holds now (after the trainer's cold sync)."""
        if self._stop.is_set():
            raise RuntimeError("MInTRLRolloutWorker was stopped; a worker runs once: build a new one to train again.")
        if self._thread is not None:
            logger.warning("MInTRLRolloutWorker.start() called while it runs; ignored.")
            return
        check_logprobs_mode(self.engine)
        if self.tools is not None:
            self.tools.open()  # the event loop of async tools and rewards, if any
        self._first_step, self._first_version = self.next_step, self._version
        self._heartbeat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch in progress (a `VLLMHTTPEngine` is closed first, which fails it at once) and join the
        thread: nothing the worker started is left running."""
        self._stop.set()
        with self._version_changed:
            self._version_changed.notify_all()  # a thread waiting for admission sees the stop
        if isinstance(self.engine, VLLMHTTPEngine):
            self.engine.close()
        if self._thread is not None:
            self._thread.join()
        if self.tools is not None:
            self.tools.close()

    def check_health(self, stale_after_s: float) -> None:
        """Raise the thread's exception, or an error when it made no progress (nor heard from the server) for
        `stale_after_s` seconds. Waiting for the trainer to catch up counts as progress."""
        if self._error is not None:
            raise RuntimeError(
                f"The MInTRL rollout worker failed: {type(self._error).__name__}: {self._error}"
            ) from self._error
        if self._thread is None or self._stop.is_set():
            return
        last_sign = max(self._heartbeat, getattr(self.engine, "last_response_at", -math.inf))
        if time.monotonic() - last_sign > stale_after_s:
            raise RuntimeError(
                f"The MInTRL rollout worker made no progress for {time.monotonic() - last_sign:.0f}s > "
                f"{stale_after_s:.0f}s (heartbeat_stale_after_s): the generation server or the judge hangs."
            )

    # ----------------------------------------------------------------------------------------------------------------
    # resume

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """What a resumed run needs to continue as this one would have from optimizer step `step` (the trainer's
        `global_step` at the checkpoint; None: from the next batch the worker starts): that batch's first prompt,
        the schedule's state before it, and the current weight version."""
        with self._state_lock:
            if step in self._states_at_start:  # the batch has started (it may be under way): its state at the start
                state = self._states_at_start[step]
            elif step is None or step == self.next_step:
                state = self._state()
            else:
                raise ValueError(
                    f"No rollout state for step {step}: the worker is at step {self.next_step} and keeps the state "
                    f"of steps {sorted(self._states_at_start)}."
                )
        return {**state, "model_version": self._version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict` (before `start()`)."""
        if self._thread is not None:
            raise RuntimeError("MInTRLRolloutWorker.load_state_dict must be called before start().")
        with self._state_lock:
            self.next_step = int(state["next_step"])
            self.prompt_index = int(state["prompt_index"])
            self.schedule.load_state_dict(state)
            if self.judge is not None:
                self.judge.load_state_dict(state.get("judge", {}))  # added later: older checkpoints have none
        self.update_model_version(int(state["model_version"]))

    def _state(self) -> dict[str, Any]:
        judge = self.judge.state_dict() if self.judge is not None else {}  # e.g. the endpoint judge's counters
        return {
            "next_step": self.next_step,
            "prompt_index": self.prompt_index,
            "judge": judge,
            **self.schedule.state_dict(),
        }

    # ----------------------------------------------------------------------------------------------------------------
    # the thread

    def consume_version(self, step: int) -> int:
        """The weight version that trains the batch of optimizer step `step`: one sync per `weight_sync_steps`
        steps since the run's first step, whose batch trains with the version the worker started at."""
        k = self.weight_sync_steps
        return self._first_version + step // k - self._first_step // k

    def _run(self) -> None:
        try:
            while (admission_wait := self._wait_for_admission(self.next_step)) is not None:
                self._write_batch(self.next_step, admission_wait)
        except BaseException as err:
            if not self._stop.is_set():  # an engine closed by `stop()` fails the batch in progress: no error
                self._error = err
                logger.exception("The MInTRL rollout worker failed")

    def _wait_for_admission(self, step: int) -> float | None:
        """Seconds waited until the server's weights are recent enough for batch `step` (None: stopped)."""
        start = time.monotonic()
        oldest_allowed = self.consume_version(step) - self.max_staleness
        with self._version_changed:
            while self._version < oldest_allowed and not self._stop.is_set():
                self._heartbeat = time.monotonic()
                self._version_changed.wait(timeout=1.0)
        self._heartbeat = time.monotonic()
        return None if self._stop.is_set() else time.monotonic() - start

    def _write_batch(self, step: int, admission_wait: float) -> None:
        """Batch `step`: its groups' rollouts, rewards and advantages, the schedule stepped with its measures, then
        its samples and metrics pushed to the trainer."""
        started = time.monotonic()
        version = self._version  # the oldest weights that write this batch (a sync during it only makes it fresher)
        intervening, is_control, first_prompt = self._begin_batch(step)
        rows = [self.dataset[(first_prompt + g) % len(self.dataset)] for g in range(self.groups_per_step)]
        group_rows = [row for row in rows for _ in range(self.group_size)]
        trajectories, prompts, environments = self._trajectories(group_rows, is_control.tolist())
        rollout = self._run_rollout(trajectories, intervening, is_control)
        rewards_per_func = self._rewards(group_rows, prompts, trajectories, environments)
        rewards = GenerationBatch(group_rows, rewards_per_func=rewards_per_func).rewards(self.reward_weights)
        advantages = control_baseline_advantages(rewards, is_control, self.group_size)
        measured = RolloutMeasures.of(rewards, rollout)
        with self._state_lock:
            budget = self.schedule.intervention_budget
            share = budget.share if budget is not None and intervening else None
            metrics = rollout_metrics(rollout, measured, self.args, share)
            self.schedule.step(rollout, measured, step)
            outage = self.schedule.judge_outage.stop_reason
            if outage is not None and self.judge_outage_stop is None:
                self.judge_outage_stop = (step, outage)
            self.next_step = step + 1
            self.prompt_index = first_prompt + self.groups_per_step

        masking = getattr(self.args, "mask_truncated_completions", False)
        trained = [not (masking and is_truncated(t, self.eos_and_pad)) for t in trajectories]
        for i, t in enumerate(trajectories):
            sample = trajectory_sample(
                prompts[i],
                t,
                advantages[i].item(),
                {"reward": rewards[i].item(), **self._reward_metrics(rewards_per_func[i])},
                self.tokenizer if self.tools is None else None,
                group_id=first_prompt + i // self.group_size,  # the group's prompt position: unique per group
                version=version,
                is_control=bool(is_control[i]),
                trained=trained[i],
                step_regression_rows=sum(trained),
            )
            sample.enqueued_at = time.time()
            self.rollout_buffer.put(sample)
        staleness = float(self.consume_version(step) - version)  # weight syncs between writing and training them
        metrics.update(self._completion_metrics(trajectories))
        if self.tools is not None:  # as GRPOTrainer logs them: calls per rollout, failures per call
            calls, failures = rollout.stat("tool_calls").sum().item(), rollout.stat("tool_failures").sum().item()
            metrics["tools/call_frequency"] = calls / len(trajectories)
            metrics["tools/failure_frequency"] = failures / calls if calls else 0.0
        metrics.update({"mintrl/staleness": staleness, "mintrl/staleness_max": staleness})
        metrics["mintrl/admission_wait_s"] = admission_wait  # the worker waited for the trainer (staleness bound)
        metrics["mintrl/rollout_s"] = time.monotonic() - started
        with contextlib.suppress(queue.Full):  # the trainer stopped reading its metrics: never block generation
            self.metrics_queue.put_nowait(metrics)

    def _begin_batch(self, step: int) -> tuple[bool, torch.Tensor, int]:
        """Record the state batch `step` starts from and take its decisions: whether it intervenes, which rollouts
        are controls (budget controller included), its first prompt."""
        with self._state_lock:
            self._states_at_start[step] = self._state()
            keep_from = step - (self.max_staleness + 2) * self.weight_sync_steps  # older ones are trained already
            self._states_at_start = {s: v for s, v in self._states_at_start.items() if s >= keep_from}
            intervening = self.judge is not None and self.schedule.scheduled(step)
            n_rows = self.groups_per_step * self.group_size
            if intervening:
                rows = slice(0, n_rows)
                budget = self.schedule.intervention_budget
                reviewed = reviewed_rows(rows, n_rows, self.group_size, self.num_controls, budget)
                is_control = ~reviewed
            else:
                is_control = torch.ones(n_rows, dtype=torch.bool)
            return intervening, is_control, self.prompt_index

    def _run_rollout(
        self, trajectories: list[Trajectory], intervening: bool, is_control: torch.Tensor
    ) -> RolloutBatch:
        """Run the batch's rollouts in place (the config's rollout schedule on the worker's engine) and record them,
        with the engine's prefix-cache hits and the judge's requests made meanwhile."""
        self.engine.reset_cache_stats()
        transport_before = self._judge_transport()
        schedule = getattr(self.args, "rollout_schedule", "auto")
        speculate = getattr(self.args, "speculative_chunks", True)
        rollout_for(self.engine, self.judge, self.tokenizer, self.settings, schedule, speculate).run(trajectories)
        self._heartbeat = time.monotonic()
        if any(t.logprobs is None for t in trajectories):
            raise RuntimeError(
                f"{type(self.engine).__name__} does not report sampling log-probs: the asynchronous loss anchors each "
                "policy token at the log-prob it was sampled with."
            )
        return RolloutBatch.from_trajectories(
            trajectories,
            intervening,
            is_control,
            self.engine.prefix_cache_hit_rate(),
            transport_before,
            self._judge_transport(),
            self.eos_and_pad,
        )

    def _trajectories(self, rows: list[dict], is_control: list[bool]) -> tuple[list[Trajectory], list, list]:
        """As `MInTRLTrainer._intervention_rollout` builds them: controls have no review budget. With tools, each
        rollout has its own environment, reset with its row, whose first observation is part of its prompt, and
        its prompt shows its tools. Returns the trajectories, their prompts and their environment instances (None
        without environments)."""
        chat_template_kwargs = getattr(self.args, "chat_template_kwargs", None) or {}
        reference_column = getattr(self.args, "reference_column", "solution")
        if self.tools is None:
            prompts, environments, instances = [row["prompt"] for row in rows], [None] * len(rows), [None] * len(rows)
        else:
            prompts, environments, instances = self.tools.rollouts(rows)
        prompt_ids = {}  # without tools, a group's rollouts share their prompt's tokens
        trajectories = []
        for row, prompt, environment, control in zip(rows, prompts, environments, is_control, strict=True):
            if environment is not None:
                ids = self.tools.prompt_ids(prompt, environment)
            else:
                if id(row) not in prompt_ids:
                    prompt_ids[id(row)] = prompt_token_ids(self.tokenizer, prompt, **chat_template_kwargs)
                ids = prompt_ids[id(row)]
            trajectories.append(
                Trajectory(
                    prompt_ids=list(ids),
                    question=question_text(prompt),
                    reference=row.get(reference_column),
                    review_budget=0 if control else self.args.max_reviews,
                    environment=environment,
                )
            )
        return trajectories, prompts, instances

    def _rewards(
        self, rows: list[dict], prompts: list, trajectories: list[Trajectory], environments: list
    ) -> torch.Tensor:
        """(rollouts, reward functions), NaN where a function returned None: each function called once for the batch,
        with the keyword arguments `MInTRLTrainer`'s reward functions get (no `trainer_state`: the trainer is
        elsewhere); with tools, the completions are the rollouts' messages (assistant turns and tool results) and
        the environments' `get_reward` columns follow the functions'."""
        completion_ids = [t.completion_ids for t in trajectories]
        if self.tools is not None:
            completions = [t.messages for t in trajectories]
        else:
            texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
            conversational = is_conversational({"prompt": prompts[0]})
            completions = [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts
        excluded = ("prompt", "completion", "completion_ids")  # as TRL's `_calculate_rewards`
        columns = {key: [row[key] for row in rows] for key in rows[0] if key not in excluded}
        kwargs = {
            **columns,
            "mintrl_intervened": [t.review_budget > 0 for t in trajectories],
            "prompts": prompts,
            "completions": completions,
            "completion_ids": completion_ids,
        }
        if self.tools is not None and self.tools.factories is not None:
            kwargs["environments"] = environments  # as GRPOTrainer gives them to reward functions
        rewards = torch.full((len(rows), len(self.reward_func_names)), math.nan)
        for j, (func, name) in enumerate(zip(self.reward_funcs, self.reward_func_names, strict=False)):
            values = asyncio.run(func(**kwargs)) if is_async_callable(func) else func(**kwargs)
            if len(values) != len(rows):
                raise ValueError(f"Reward function {name!r} returned {len(values)} rewards for {len(rows)} rollouts.")
            rewards[:, j] = torch.tensor([math.nan if v is None else float(v) for v in values])
        if self.tools is not None:
            for j, values in enumerate(self.tools.environment_rewards(environments), start=len(self.reward_funcs)):
                rewards[:, j] = torch.tensor([math.nan if v is None else float(v) for v in values])
        return rewards

    def _reward_metrics(self, rewards: torch.Tensor) -> dict[str, float]:
        return {f"rewards/{name}": float(r) for name, r in zip(self.reward_func_names, rewards, strict=True)}

    def _completion_metrics(self, trajectories: list[Trajectory]) -> dict[str, float | tuple[float, float]]:
        """The completion lengths TRL logs for GRPO (rates where TRL's async worker uses them): the policy's and
        the judge's tokens, not the environment's."""
        lengths = [t.written_tokens for t in trajectories]
        clipped = sum(is_truncated(t, self.eos_and_pad) for t in trajectories)
        return {
            "completions/mean_length": (float(sum(lengths)), float(len(lengths))),
            "completions/max_length": float(max(lengths)),
            "completions/min_length": float(min(lengths)),
            "completions/clipped_ratio": (float(clipped), float(len(lengths))),
        }

    def _judge_transport(self) -> TransportStatus:
        return TransportStatus() if self.judge is None else self.judge.transport_status()
