"""MInTRLTrainer end to end on the tiny model: advantages, judge-token masks, metrics, schedule, resume, LoRA."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from conftest import assert_resume_refuses, params_changed, snapshot
from mintrl_helpers import (
    CORRECTION,
    RecordingTrainer,
    mintrl_args,
    revise_first_step_judge,
    role_reward,
    scripted_trainer,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.tasks.toy.warm_start import WARM_START_DIR
from trl_mintrl import MInTRLTrainer
from trl_mintrl.judges import FunctionJudge
from trl_mintrl.mintrl.trainer import STATE_FILE


def test_function_judge_end_to_end_advantages_masks_metrics(tiny_model_path, cpu_args, toy_dataset):
    calls = {"review": 0, "correct": 0}
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    before = snapshot(model)
    trainer = RecordingTrainer(
        model=model,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args),
        train_dataset=toy_dataset,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
        judge=revise_first_step_judge(calls),
    )
    trainer.train()
    assert params_changed(before, trainer.model) > 0
    assert calls["correct"] > 0

    tok = trainer.processing_class
    correction_ids = tok(CORRECTION, add_special_tokens=False)["input_ids"][:8]
    for record in trainer.records:
        rewards = record["rewards"].view(-1, 4)
        baseline = rewards[:, :2].mean(dim=1, keepdim=True)  # columns 0-1 are controls
        torch.testing.assert_close(record["advantages"], (rewards - baseline).view(-1))
        assert torch.all(rewards[:, 2:] == 1.0)  # intervened rows were marked as such for the reward
        tool_mask, ids = record["tool_mask"].view(-1, 4, record["tool_mask"].size(1)), record["completion_ids"]
        assert torch.all(tool_mask[:, :2] == 1)  # controls: policy tokens only
        for row in range(ids.size(0)):
            if row % 4 >= 2:  # intervened: the first chunk was replaced by the correction (judge tokens, mask 0)
                n = len(correction_ids)
                assert ids[row, :n].tolist() == correction_ids
                assert record["tool_mask"][row, :n].tolist() == [0] * n

    logs = {k for entry in trainer.state.log_history for k in entry}
    for name in [
        "intervention_rate",
        "judge_token_frac",
        "reviews_per_rollout",
        "reward_control",
        "reward_intervened",
        "reward_gap",
        "judge_token_nll",
        "judge_failures",
        "regression_residual",
    ]:
        assert f"mintrl/{name}" in logs, name
    first = trainer.state.log_history[0]
    assert first["mintrl/intervention_rate"] == 1.0
    assert 0 < first["mintrl/judge_token_frac"] < 1
    assert first["mintrl/reward_intervened"] == 1.0


def test_intervention_schedule_switches_off(tiny_model_path, cpu_args, toy_dataset):
    calls = {"review": 0, "correct": 0}
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, intervention_steps=1, max_steps=3),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(calls),
    )
    trainer.train()
    steps = [e for e in trainer.state.log_history if "mintrl/interventions_active" in e]
    assert [e["mintrl/interventions_active"] for e in steps] == [1.0, 0.0, 0.0]
    reviews_after_step_one = calls["review"]
    assert reviews_after_step_one > 0
    assert all(e["mintrl/judge_token_frac"] == 0.0 for e in steps[1:])
    assert all("mintrl/reward_intervened" not in e for e in steps[1:])


def test_resume_continues_as_if_never_stopped(tiny_model_path, cpu_args, toy_dataset, tmp_path):
    def make(output_dir, max_steps):
        args = mintrl_args(
            cpu_args,
            output_dir=str(output_dir),
            max_steps=max_steps,
            save_strategy="steps",
            save_steps=1,
            intervention_steps=2,
            lr_scheduler_type="constant",
        )
        return MInTRLTrainer(
            model=tiny_model_path,
            reward_funcs=role_reward,
            args=args,
            train_dataset=toy_dataset,
            judge=revise_first_step_judge({"review": 0, "correct": 0}),
        )

    straight = make(tmp_path / "straight", 3)
    straight.train()
    interrupted = make(tmp_path / "resumed", 2)
    interrupted.train()
    checkpoint = tmp_path / "resumed" / "checkpoint-2"
    assert json.loads((checkpoint / "mintrl_state.json").read_text())["judge_failures_total"] == 0
    card = (checkpoint / "README.md").read_text()  # the card travels with every checkpoint
    assert "MInTRL" in card and "chen2026mintrl" in card and "mintrl" in card
    resumed = make(tmp_path / "resumed", 3)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    assert len(straight.absorption.nll) == 2  # the absorption watch's steps 0 and 1 (step 1 saved while pending)
    assert resumed.absorption.nll == pytest.approx(straight.absorption.nll)
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def test_self_judge_and_model_judge_run_and_count_failures(tiny_model_path, cpu_args, toy_dataset):
    for judge_kind in ["self", "model"]:
        extra = {"judge_model_name_or_path": tiny_model_path} if judge_kind == "model" else {}
        trainer = MInTRLTrainer(
            model=tiny_model_path,
            reward_funcs=role_reward,
            args=mintrl_args(cpu_args, judge=judge_kind, max_steps=1, judge_max_review_tokens=8, **extra),
            train_dataset=toy_dataset,
        )
        if judge_kind == "self":  # the policy's own engine and weights: no second model in memory
            assert trainer.judge.engine is trainer.policy_engine
        else:
            assert trainer.judge.engine is not trainer.policy_engine
        assert trainer.judge.max_correction_tokens == 8  # judge_max_correction_tokens unset: the rollout's cap
        trainer.train()
        log = trainer.state.log_history[0]
        # an untrained tiny model never writes a valid verdict: every review fails, counts as KEEP, training goes on
        assert log["mintrl/judge_failures"] > 0
        assert log["mintrl/intervention_rate"] == 0.0


def test_the_judges_correction_budget_is_its_own_field(tiny_model_path, cpu_args, toy_dataset):
    """max_correction_tokens caps a correction in the policy's tokens; judge_max_correction_tokens is the judge's own
    budget, in its tokens."""
    args = mintrl_args(cpu_args, judge="self", max_correction_tokens=8, judge_max_correction_tokens=20)
    trainer = MInTRLTrainer(model=tiny_model_path, reward_funcs=role_reward, args=args, train_dataset=toy_dataset)
    assert trainer.judge.max_correction_tokens == 20
    with pytest.raises(ValueError, match="judge_max_correction_tokens"):
        mintrl_args(cpu_args, judge_max_correction_tokens=0)


def test_lora_trains_adapter_only(tiny_model_path, cpu_args, toy_dataset):
    from peft import LoraConfig

    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, learning_rate=1e-2),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge({"review": 0, "correct": 0}),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and all("lora_" in n for n in changed)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"num_generations": 5}, "num_generations=5 conflicts"),
        ({"anchor": "bogus"}, "anchor='bogus'"),
        ({"judge": "model"}, "judge_model_name_or_path"),
        ({"judge": "endpoint"}, "judge_base_url"),
        ({"beta": 0.04}, "no KL term"),
        ({"num_control_generations": 0}, "num_control_generations=0 .*at least 1"),
        ({"chunk_size": 0}, "chunk_size must be >= 1"),
        ({"rollout_schedule": "async"}, "rollout_schedule='async'"),
    ],
)
def test_config_errors_name_the_field(cpu_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        mintrl_args(cpu_args, **overrides)


def test_continuous_schedule_is_refused_without_continuous_batching(tiny_model_path, cpu_args, toy_dataset):
    """transformers generate has no continuous batching: asking for it fails before the model loads."""
    with pytest.raises(ValueError, match="rollout_schedule='continuous' needs"):
        MInTRLTrainer(
            model=tiny_model_path,
            reward_funcs=role_reward,
            args=mintrl_args(cpu_args, rollout_schedule="continuous"),
            train_dataset=toy_dataset,
            judge=revise_first_step_judge(),
        )


def test_self_judge_requires_reference_column(tiny_model_path, cpu_args, toy_dataset):
    with pytest.raises(ValueError, match="reference_column"):
        MInTRLTrainer(
            model=tiny_model_path,
            reward_funcs=role_reward,
            args=mintrl_args(cpu_args),
            train_dataset=toy_dataset.remove_columns("solution"),
        )


def test_num_generations_is_derived(cpu_args):
    args = mintrl_args(
        cpu_args, num_control_generations=3, num_intervened_generations=1, per_device_train_batch_size=8
    )
    assert args.num_generations == 4
    assert os.path.basename(args.output_dir) == "out"


def test_endpoint_judge_end_to_end_against_local_server(tiny_model_path, cpu_args, toy_dataset, monkeypatch):
    """The endpoint backend built from config, talking to a real OpenAI-style server on 127.0.0.1."""
    from openai_server import ScriptedServer

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("JUDGE_KEY", "sk-secret")

    def respond(question, attempt, body):
        prompt = body["messages"][0]["content"]
        if "VERDICT" in prompt:  # a review request: the first step is always wrong
            return 200, "The first step is wrong.\nVERDICT: REVISE 1", 0.0
        return 200, CORRECTION, 0.0

    server = ScriptedServer(respond)
    try:
        trainer = RecordingTrainer(
            model=tiny_model_path,
            reward_funcs=role_reward,
            args=mintrl_args(
                cpu_args,
                judge="endpoint",
                judge_base_url=server.url,
                judge_model="judge",
                judge_api_key_env="JUDGE_KEY",
                max_steps=1,
                max_reviews=1,
            ),
            train_dataset=toy_dataset,
        )
        trainer.train()
    finally:
        server.close()
    assert server.requests, "the trainer never called the endpoint"
    assert all(headers["Authorization"] == "Bearer sk-secret" for headers, _ in server.requests)
    log = trainer.state.log_history[0]
    assert log["mintrl/intervention_rate"] == 1.0 and log["mintrl/judge_failures"] == 0
    record = trainer.records[0]
    judge_rows = (record["tool_mask"] == 0).any(dim=1)
    assert judge_rows.tolist() == [i % 4 >= 2 for i in range(record["tool_mask"].size(0))]  # exactly the intervened


def test_adaptive_switch_off_when_corrections_stop_helping(tiny_model_path, cpu_args, toy_dataset, tmp_path):
    def intervened_worse(completions, mintrl_intervened, **kwargs):
        return [0.0 if inter else 1.0 for inter in mintrl_intervened]

    args = mintrl_args(
        cpu_args,
        max_steps=3,
        intervention_stop_gap=-0.5,
        intervention_gap_ema=0.0,
        save_strategy="steps",
        save_steps=1,
    )
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=intervened_worse,
        args=args,
        train_dataset=toy_dataset,
        judge=revise_first_step_judge({"review": 0, "correct": 0}),
    )
    trainer.train()
    active = [e["mintrl/interventions_active"] for e in trainer.state.log_history if "loss" in e]
    assert active == [1.0, 0.0, 0.0]  # gap -1 < -0.5 after the first step: interventions stop for good
    state = json.loads((tmp_path / "out" / "checkpoint-3" / "mintrl_state.json").read_text())
    assert state["interventions_stopped_at"] == 0 and state["reward_gap_ema"] == -1.0
    resumed = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=intervened_worse,
        args=mintrl_args(cpu_args, max_steps=4, intervention_stop_gap=-0.5),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge({"review": 0, "correct": 0}),
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-3"))
    assert resumed.schedule.interventions_stopped_at == 0  # restored: the resumed run does not intervene again
    new_logs = [e for e in resumed.state.log_history if "loss" in e and e["step"] == 4]
    assert [e["mintrl/interventions_active"] for e in new_logs] == [0.0]


# ----- the loss where it runs: the trainer's _compute_loss against an independent float64 computation -----


def fixed_batch(vocab_size: int, with_old_logps: bool) -> dict:
    """4 rollouts (2 controls, 2 intervened whose first tokens are judge tokens), right-padded completions."""
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, vocab_size, (4, 4), generator=gen)
    completion_ids = torch.randint(3, vocab_size, (4, 6), generator=gen)
    completion_mask = (torch.arange(6) < torch.tensor([[6], [4], [6], [3]])).long()
    tool_mask = torch.ones(4, 6, dtype=torch.long)
    tool_mask[2, :3] = 0
    tool_mask[3, :2] = 0
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([0.5, -0.25, 1.0, -1.0]),
    }
    if with_old_logps:  # a batch sampled by an older policy (TRL passes these when a batch serves several steps)
        batch["old_per_token_logps"] = -1.0 - 4.0 * torch.rand(4, 6, generator=gen)
    return batch


def float64_reference(model_path: str, batch: dict, anchor: str, kappa: float, beta: float, accumulation: int):
    """The paper's loss written out token by token in float64, on a float64 copy of the model loaded from disk;
    returns the loss and the parameter gradients."""
    model64 = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    prompt_len = batch["prompt_ids"].size(1)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model64(input_ids=ids, attention_mask=attention).logits[:, prompt_len - 1 : -1]
    logps = torch.log_softmax(logits, dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    old = batch.get("old_per_token_logps")
    rows, tokens = batch["completion_ids"].shape
    total = torch.zeros((), dtype=torch.float64)
    for b in range(rows):
        log_ratio = torch.zeros((), dtype=torch.float64)
        for t in range(tokens):
            if not batch["completion_mask"][b, t]:
                continue
            judge_token = batch["tool_mask"][b, t] == 0
            if anchor == "const" and judge_token:
                a_t = torch.tensor(kappa, dtype=torch.float64)
            elif old is not None:
                a_t = old[b, t].double()
            else:  # pi_old is the policy at this forward
                a_t = logps[b, t].detach()
            log_ratio = log_ratio + logps[b, t] - a_t
        residual = beta * log_ratio - batch["advantages"][b].double()
        total = total + residual**2
    loss = total / rows / accumulation
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model64.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "anchor,with_old_logps", [("const", True), ("proxy", True), ("const", False), ("proxy", False)]
)
def test_compute_loss_matches_float64_reference(tiny_model_path, cpu_args, toy_dataset, anchor, with_old_logps):
    kappa, beta = -0.7, 0.5  # a large beta, so that every token's anchor moves the loss well above float noise
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, anchor=anchor, kappa=kappa, regression_beta=beta),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(),
    )
    batch = fixed_batch(trainer.model.config.vocab_size, with_old_logps)
    expected_loss, expected_grads = float64_reference(tiny_model_path, batch, anchor, kappa, beta, accumulation=2)

    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # the loss of one of two micro-batches of an optimizer step
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():  # float32 against float64: relative error of each gradient tensor
        error = (grad.double() - expected_grads[name]).norm() / expected_grads[name].norm()
        assert error < 1e-4, (name, error.item())
    assert trainer._metrics["train"]["mintrl/judge_token_nll"]  # the batch has judge tokens, and they are logged


def one_step(tiny_model_path, cpu_args, toy_dataset, **overrides):
    """The weight change of one plain-SGD MInTRL step, and the rollouts it trained on."""
    args = mintrl_args(
        cpu_args, max_steps=1, optim="sgd", learning_rate=1e-4, max_grad_norm=0.0, regression_beta=0.5, **overrides
    )
    trainer = scripted_trainer(tiny_model_path, args, toy_dataset)
    before = snapshot(trainer.model)
    trainer.train()
    delta = {n: p.detach() - before[n] for n, p in trainer.model.named_parameters() if n in before}
    rollouts = (
        torch.cat([r["completion_ids"] for r in trainer.records]),
        torch.cat([r["rewards"] for r in trainer.records]),
    )
    return delta, rollouts


def test_gradient_accumulation_two_micro_batches_equal_one_batch(tiny_model_path, cpu_args, toy_dataset):
    """GA=2 over two micro-batches of 4 rollouts moves the weights exactly as GA=1 over the same 8 rollouts."""
    single, (ids, rewards) = one_step(tiny_model_path, cpu_args, toy_dataset, per_device_train_batch_size=8)
    accumulated, (ids_ga, rewards_ga) = one_step(
        tiny_model_path, cpu_args, toy_dataset, per_device_train_batch_size=4, gradient_accumulation_steps=2
    )
    # same rollouts (one generation batch of 8 in both runs); TRL shuffles rows before splitting micro-batches
    assert torch.equal(rewards, rewards_ga) and torch.equal(ids, ids_ga)
    assert sum(d.abs().sum() for d in single.values()) > 0
    for name, delta in single.items():  # SGD without clipping: the weight change is -lr * gradient
        error = (accumulated[name] - delta).norm() / delta.norm()
        assert error < 1e-4, (name, error.item())


def test_unscorable_rollouts_get_no_signal_and_leave_the_baseline_to_the_others(
    tiny_model_path, cpu_args, toy_dataset
):
    """A reward function returning None: that rollout's advantage is 0 and the baseline is the mean of the scorable
    controls; a group with no scorable control gets no signal at all."""

    def patchy_reward(completions, mintrl_intervened, completion_ids, **kwargs):
        rewards = role_reward(completions, mintrl_intervened, completion_ids)
        for row in range(len(rewards)):
            if row in (0, 3, 4, 5):  # group 0: a control and an intervened row; group 1: both controls
                rewards[row] = None
        return rewards

    trainer = RecordingTrainer(
        model=tiny_model_path,
        reward_funcs=patchy_reward,
        args=mintrl_args(cpu_args, max_steps=1, per_device_train_batch_size=8),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(),
    )
    trainer.train()
    record = trainer.records[0]
    rewards, advantages = record["rewards"].view(-1, 4), record["advantages"].view(-1, 4)
    assert torch.isnan(rewards[0, [0, 3]]).all() and torch.isnan(rewards[1, :2]).all()
    r = rewards[0]
    torch.testing.assert_close(
        advantages[0], torch.stack([r.new_tensor(0.0), r[1] - r[1], r[2] - r[1], r.new_tensor(0.0)])
    )
    assert torch.equal(advantages[1], torch.zeros(4))
    assert trainer.state.log_history[0]["mintrl/reward_control"] == pytest.approx(r[1].item())


# ----- extra state: atomic, and refused on resume when missing or corrupt -----


def test_resume_refuses_a_missing_or_corrupt_state_file(tiny_model_path, cpu_args, toy_dataset, tmp_path):
    def make(max_steps):
        args = mintrl_args(
            cpu_args, output_dir=str(tmp_path / "run"), max_steps=max_steps, save_strategy="steps", save_steps=1
        )
        return scripted_trainer(tiny_model_path, args, toy_dataset, MInTRLTrainer)

    make(1).train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert not [p.name for p in checkpoint.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    state = json.loads((checkpoint / STATE_FILE).read_text())
    cases = {
        "missing": (None, "is missing"),
        "cut_short": (json.dumps(state)[:20], "not valid JSON"),
        "missing_key": (json.dumps({k: v for k, v in state.items() if k != "reward_gap_ema"}), "reward_gap_ema"),
        "wrong_type": (json.dumps({**state, "judge_failures_total": "many"}), "malformed"),
        "bad_absorption": (json.dumps({**state, "judge_absorption": {"nll": 1.5, "pending": None}}), "malformed"),
        "not_an_object": ("[]", "not a JSON object"),
    }
    assert_resume_refuses(lambda: make(2), checkpoint, STATE_FILE, cases, tmp_path)

    # a checkpoint from before the absorption watch (no `judge_absorption` key) resumes with a fresh tracker
    old = tmp_path / "before_absorption"
    shutil.copytree(checkpoint, old)
    (old / STATE_FILE).write_text(json.dumps({k: v for k, v in state.items() if k != "judge_absorption"}))
    resumed = make(2)
    resumed.train(resume_from_checkpoint=str(old))
    assert resumed.state.global_step == 2 and resumed.absorption.nll == []  # step 0 was lost, step 1 still pending


def test_lengths_and_clipped_ratios_count_every_token_per_half(tiny_model_path, cpu_args, toy_dataset):
    """`mintrl/length*` count judge tokens too (TRL's completions/mean_length does not) and `mintrl/clipped_ratio_*`
    tell, per half, the rollouts cut at max_completion_length: checked row by row against the batch trained on."""
    # the toy benchmark's warm start writes "4+5=9\n\nAnswer: 9" and EOS (17 tokens); the correction "7+7=14\n\n" in
    # place of the first chunk makes an intervened rollout 19 tokens, cut at 18
    args = mintrl_args(cpu_args, max_steps=1, max_completion_length=18)
    trainer = scripted_trainer(str(WARM_START_DIR), args, toy_dataset)
    trainer.train()
    [record] = trainer.records
    [log] = [e for e in trainer.state.log_history if "mintrl/length" in e]
    lengths = record["completion_mask"].sum(dim=1)
    last = record["completion_ids"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    stop = torch.tensor([*trainer.eos_token_ids, trainer.processing_class.pad_token_id])
    truncated = ~torch.isin(last, stop)
    control = torch.arange(len(lengths)) % 4 < 2  # columns 0-1 of each group of 4
    assert log["mintrl/length"] == pytest.approx(lengths.float().mean().item())
    assert log["mintrl/length_control"] == pytest.approx(lengths[control].float().mean().item())
    assert log["mintrl/length_intervened"] == pytest.approx(lengths[~control].float().mean().item())
    policy_only = (record["completion_mask"] * record["tool_mask"]).sum(dim=1).float().mean().item()
    assert log["mintrl/length"] > policy_only == pytest.approx(log["completions/mean_length"])  # judge tokens count
    assert log["mintrl/clipped_ratio_control"] == pytest.approx(truncated[control].float().mean().item())
    assert log["mintrl/clipped_ratio_intervened"] == pytest.approx(truncated[~control].float().mean().item())
    assert not truncated[control].any() and truncated[~control].all()  # the halves differ: a swap would show


def test_rollout_groups_hands_back_each_rollouts_tokens(toy_dataset, cpu_args):
    """`rollout_groups` (the rollout of a first batch, for checks before training) gives each row's completion ids:
    the judge's correction in the intervened rows only, as long as the row's token count, its judge-mask ones the
    row's judge tokens."""
    trainer = scripted_trainer(str(WARM_START_DIR), mintrl_args(cpu_args, max_steps=1), toy_dataset)
    rollout = trainer.rollout_groups([toy_dataset[0], toy_dataset[1]])
    texts = trainer.processing_class.batch_decode(rollout.completion_ids)
    assert len(texts) == 2 * trainer.num_generations
    tokens, judge = rollout.stat("completion_tokens"), rollout.stat("judge_tokens")
    assert [len(ids) for ids in rollout.completion_ids] == tokens.int().tolist()
    assert [sum(mask) for mask in rollout.judge_masks] == judge.int().tolist()
    for text, control in zip(texts, rollout.is_control.tolist(), strict=True):
        assert (CORRECTION in text) != control


def test_a_judge_answer_ends_the_rollout_in_the_batch_trained_on(tiny_model_path, cpu_args, toy_dataset):
    """`end_at_judge_answer=True`: a correction that writes the final answer is the end of its rollout, closed by
    the judge's EOS (a judge token, anchored like the correction), and the share of revised rollouts it ended is
    logged; the controls are untouched."""
    answer = "Answer: 14\n"
    judge = FunctionJudge(lambda q, prefix, steps, r: 0 if not prefix else None, lambda q, prefix, r: answer)
    args = mintrl_args(cpu_args, max_steps=1, end_at_judge_answer=True, max_correction_tokens=16)
    trainer = RecordingTrainer(model=str(WARM_START_DIR), reward_funcs=role_reward, args=args,
                               train_dataset=toy_dataset, judge=judge)  # fmt: skip
    trainer.train()
    [record] = trainer.records
    tok = trainer.processing_class
    ended = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    lengths = record["completion_mask"].sum(dim=1)
    for row in range(len(lengths)):
        ids = record["completion_ids"][row, : lengths[row]].tolist()
        if row % 4 >= 2:  # intervened: the correction and its EOS, all judge tokens
            assert ids == ended and record["tool_mask"][row, : len(ended)].tolist() == [0] * len(ended)
        else:
            assert record["tool_mask"][row, : lengths[row]].bool().all()
    [log] = [e for e in trainer.state.log_history if "mintrl/ended_at_judge_answer" in e]
    assert log["mintrl/ended_at_judge_answer"] == 1.0 and log["mintrl/clipped_ratio_intervened"] == 0.0
    assert log["mintrl/policy_tokens_after_correction"] == 0.0
