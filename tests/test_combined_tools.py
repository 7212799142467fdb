"""MInTRLSORTTrainer with TRL's `tools=` / `environment_factory=`, as a GRPOTrainer user passes them: MInTRL's
intervention loop runs inside the tool loop (policy, judge and environment tokens; tool results get no gradient), the
environment's `get_reward` is a reward column, and a prompt whose controls and intervened rollouts all fail is
deferred with its reference conversation and repaired after the prompt the policy saw (tool schemas and `reset`
observation included): its assistant tokens learnt, its tool results not. The buffer survives a resume.

The tiny model cannot call tools, so a scripted engine replaces the policy's generation engine (the one MInTRL's
rollout samples from); MInTRL's rollout, TRL's parser, tool dicts, environments and result tokens, the rewards and
both losses run on what it writes. The chat template, environment and reference conversations are those of
tests/test_sort_tools.py.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import params_changed, snapshot
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback
from trl.chat_template_utils import qwen3_template

from tests.conftest import cpu_run_args
from tests.test_sort_tools import REGISTERS, TOOL_TEMPLATE, RegisterEnv, call_text, reference_conversation
from trl_mintrl import MInTRLSORTConfig, MInTRLSORTTrainer
from trl_mintrl.combined.trainer import STATE_FILE, reference_transcript
from trl_mintrl.engines.base import Generation, GenerationEngine
from trl_mintrl.input_checks import InputError
from trl_mintrl.judges import FunctionJudge
from trl_mintrl.judges.base import ReviewRequest, conversation_text
from trl_mintrl.judges.templates import JudgeTemplates
from trl_mintrl.losses import REPAIR_WEIGHTINGS, RepairWeighting, sort_repair_terms
from trl_mintrl.mintrl import trainer as mintrl_trainer
from trl_mintrl.sort import FunctionPlanner

CHECK = "Checked the register. "  # the judge's correction
PLAN = "read the register"


class RegisterPolicy(GenerationEngine):
    """The policy's turns, from the text so far (prompt and completion): first a look-up, then the answer read from
    the last tool result. On a "(hard)" question it reads register a instead of the one asked: every rollout of it,
    controls and intervened ones, is wrong, and the environment's reward is 0."""

    def __init__(self, tokenizer):
        super().__init__([tokenizer.eos_token_id])
        self.tok = tokenizer

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        generations = []
        for ids, cap in zip(prompt_ids, max_new_tokens, strict=True):
            text = self.tok.decode(ids)
            register = "a" if "(hard)" in text else re.search(r"register (\w+)\?", text).group(1)
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
            turn = f"Answer: {results[-1]}" if results else f"Let me read it.\n\n{call_text(register)}"
            generations.append(Generation(self.tok(turn + "<|im_end|>", add_special_tokens=False)["input_ids"][:cap]))
        return generations


def answer_reward(completions, register, **kwargs) -> list[float]:
    return [float(f"Answer: {REGISTERS[r]}" in c[-1]["content"]) for c, r in zip(completions, register, strict=True)]


def checking_judge(references: list) -> FunctionJudge:
    """Keeps every chunk, except the first chunk of a turn after a tool result, which it revises from its first step
    with CHECK (the policy then writes its answer after it). Records the question and reference of each review."""

    def review(question, prefix, steps, reference, conversation):
        references.append((question, reference))
        return 0 if any(m["role"] == "tool" for m in conversation) and not prefix else None

    return FunctionJudge(review, lambda question, prefix, reference, conversation: CHECK)


def register_rows(environment: str | None = None) -> Dataset:
    rows = [
        {"prompt": [{"role": "user", "content": f"What is in register {r}?{' (hard)' if r == 'b' else ''}"}],
         "register": r, "solution": reference_conversation(r), **({"environment": environment} if environment else {})}
        for r in REGISTERS
    ]  # fmt: skip
    return Dataset.from_list(rows)


@pytest.fixture(scope="module")
def tool_tokenizer(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.response_template = qwen3_template  # TRL's parser of Qwen3's `<tool_call>` JSON
    return tokenizer


def combined_args(output_dir, **overrides) -> MInTRLSORTConfig:
    """Per step: both prompts, each with 2 controls and 2 intervened rollouts; turns fit in one chunk."""
    fields = cpu_run_args(output_dir, per_device_train_batch_size=8, max_steps=1, max_completion_length=512)
    fields = {k: v for k, v in fields.items() if k != "num_generations"}
    return MInTRLSORTConfig(**fields | dict(
        num_control_generations=2, num_intervened_generations=2, chunk_size=128, max_reviews=2,
        max_correction_tokens=16, intervention_steps=100, max_tool_calling_iterations=2,
        correctness_reward_funcs=["answer_reward"], repair_batch_size=1) | overrides)  # fmt: skip


class RecordingTrainer(MInTRLSORTTrainer):
    """Keeps each scored generation batch (the output, which rows are controls, the rewards per function) and the
    inputs of each loss (TRL shuffles a generation batch's rows before it splits it into micro-batches)."""

    def _score_batch(self, output, batch):
        super()._score_batch(output, batch)
        self.records = getattr(self, "records", [])
        rewards = batch.rewards_per_func.clone()
        self.records.append({**output, "is_control": batch.rollout.is_control.clone(), "rewards_per_func": rewards})

    def _compute_loss(self, model, inputs):
        self.loss_inputs = [*getattr(self, "loss_inputs", []), inputs]
        return super()._compute_loss(model, inputs)


def build(model_path, tokenizer, args, dataset, references=None, callbacks=None, **kwargs) -> RecordingTrainer:
    model = AutoModelForCausalLM.from_pretrained(model_path)
    trainer = RecordingTrainer(
        model, [answer_reward], args, dataset, processing_class=copy.deepcopy(tokenizer), callbacks=callbacks,
        judge=checking_judge([] if references is None else references), planner=FunctionPlanner(lambda q, r: PLAN),
        **kwargs,
    )  # fmt: skip
    trainer._policy_engine = RegisterPolicy(trainer.processing_class)
    return trainer


def spy_on_repair_passes(trainer, patch) -> tuple[list, list]:
    """(prompt ids, reference ids) of each repair forward (teacher pass first, then base), and (mask, terms) of each
    repair weighting."""
    scored, weighted = [], []
    reference_logps = trainer.repair._reference_logps
    patch.setattr(trainer.repair, "_reference_logps",
                  lambda model, prompts, refs: scored.append((prompts, refs)) or reference_logps(model, prompts, refs))  # fmt: skip
    spy = RepairWeighting(lambda *a: weighted.append((a[2], terms := sort_repair_terms(*a))) or terms, uses_plan=True)
    patch.setitem(REPAIR_WEIGHTINGS, "salience", spy)
    return scored, weighted


@pytest.fixture(scope="module")
def environment_run(tiny_model_path, tool_tokenizer, tmp_path_factory):
    """One step with `environment_factory=RegisterEnv`, every piece recorded: the scored batch, the regression's
    per-token log-probs (their gradients kept), the deferrals, the repair's passes and weights, the judge's
    references."""
    references = []
    args = combined_args(tmp_path_factory.mktemp("environment") / "out")
    trainer = build(tiny_model_path, tool_tokenizer, args, register_rows(), references,
                    environment_factory=RegisterEnv)  # fmt: skip
    regressions, regression_loss = [], mintrl_trainer.advantage_regression_loss  # (log-probs, regressed mask)

    def regression(per_token_logps, anchors, mask, *rest):
        per_token_logps.retain_grad()
        regressions.append((per_token_logps, mask))
        return regression_loss(per_token_logps, anchors, mask, *rest)

    deferred, add = [], trainer.repair.buffer.add
    trainer.repair.buffer.add = lambda prompt, reference, **kw: (
        deferred.append((prompt, reference, kw)) or add(prompt, reference, **kw)
    )
    before = snapshot(trainer.model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mintrl_trainer, "advantage_regression_loss", regression)
        scored, weighted = spy_on_repair_passes(trainer, patch)
        trainer.train()
    return SimpleNamespace(trainer=trainer, batch=trainer.records[0], regressions=regressions, deferred=deferred,
                           scored=scored, weighted=weighted, references=references, before=before)  # fmt: skip


def tokens(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def result_text(value) -> str:
    """The tokens TRL appends for one tool result with this template (`_get_tool_suffix_ids`): the result in a user
    turn, then the next assistant turn's header."""
    return f"\n<|im_start|>user\n<tool_response>\n{value}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def is_hard(tokenizer, prompt_ids) -> bool:
    return "(hard)" in tokenizer.decode(prompt_ids)


# ---- (1) the MInTRL step with an environment ---------------------------------------------------------------------


def test_intervened_rollouts_hold_judge_and_tool_tokens_and_tool_tokens_get_no_gradient(environment_run):
    run = environment_run
    trainer, batch, tok = run.trainer, run.batch, run.trainer.processing_class
    mask = batch["completion_mask"].bool()
    judge, policy = batch["judge_mask"].bool() & mask, batch["tool_mask"].bool() & mask
    environment = mask & ~judge & ~policy
    is_control = batch["is_control"]
    assert is_control.sum() == 4 and (~is_control).sum() == 4
    for row in range(len(mask)):
        value = 3  # the policy reads register a on both prompts
        assert tok.decode(batch["completion_ids"][row][environment[row]]) == result_text(value), row
        written = tok.decode(batch["completion_ids"][row][policy[row] | judge[row]])
        assert written == f"Let me read it.\n\n{call_text('a')}<|im_end|>{'' if is_control[row] else CHECK}" \
                          f"Answer: {value}<|im_end|>", row  # fmt: skip
        assert tok.decode(batch["completion_ids"][row][judge[row]]) == ("" if is_control[row] else CHECK)

    # the loss's micro-batch: the same rows, shuffled
    ((logps, regressed),), (inputs,) = run.regressions, trainer.loss_inputs
    mask = inputs["completion_mask"].bool()
    judge, policy = inputs["judge_mask"].bool() & mask, inputs["tool_mask"].bool() & mask
    environment = mask & ~judge & ~policy
    assert environment.sum() == 8 * len(tokens(tok, result_text(3)))
    assert regressed.bool().equal(policy | judge)  # tool-result tokens are out of the regression
    grad = logps.grad
    assert (grad[environment] == 0).all()  # exactly: no gradient reaches a tool-result token
    intervened = judge.any(dim=1, keepdim=True)
    assert intervened.sum() == 4
    assert (grad[(policy | judge) & intervened] != 0).all()  # the judge's tokens make their residual nonzero
    assert params_changed(run.before, trainer.model) > 0


def test_the_environment_reward_reaches_the_rewards_and_the_advantages(environment_run):
    run = environment_run
    trainer, batch, tok = run.trainer, run.batch, run.trainer.processing_class
    assert trainer.reward_func_names == ["answer_reward", "RegisterEnv"]
    hard = torch.tensor([is_hard(tok, ids) for ids in batch["prompt_ids"]])
    rewards = batch["rewards_per_func"]
    assert rewards[:, 1].tolist() == (~hard).float().tolist()  # get_reward: the asked register was read
    assert rewards[:, 0].tolist() == (~hard).float().tolist()
    total = rewards.sum(dim=1).view(-1, 4)
    baseline = total[:, :2].mean(dim=1, keepdim=True)  # the controls' mean (controls first in a group)
    assert batch["is_control"].view(-1, 4)[:, :2].all()
    assert batch["advantages"].view(-1, 4).tolist() == (total - baseline).tolist()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["rewards/RegisterEnv/mean"] == 0.5 and log["tools/call_frequency"] == 1.0
    assert log["mintrl/intervention_rate"] == 1.0 and log["mintrl/judge_token_frac"] > 0


def test_the_judge_reads_a_reference_conversation_as_a_transcript(environment_run):
    """The one reference column: the judge reads the conversation as text, in the layout of its own conversation
    section, and the templated judges put it in their reference section."""
    expected = {r: reference_transcript(reference_conversation(r)) for r in REGISTERS}
    assert len(environment_run.references) == 4 * 2  # max_reviews=2 per intervened rollout, none per control
    for question, reference in environment_run.references:
        assert reference == expected[re.search(r"register (\w+)\?", question).group(1)]
    parsed = [{"role": "assistant", "content": "Try 0.", "tool_calls": [
        {"type": "function", "function": {"name": "get", "arguments": {"name": "a"}}}]},
        {"role": "tool", "name": "get", "content": "3"}, {"role": "assistant", "content": "Answer: 3"}]  # fmt: skip
    transcript = conversation_text(parsed, "")  # the earlier turns, then the (empty) current turn's block
    assert transcript.startswith(expected["a"] + "\n\n") and "current turn" not in expected["a"]
    assert "current turn" in transcript.removeprefix(expected["a"])
    for part in ("Try 0.", f"[tool call] get({json.dumps({'name': 'a'})})", "[tool result: get]\n3", "Answer: 3"):
        assert part in expected["a"], part
    prompt = JudgeTemplates().render_review(ReviewRequest("q", "", ["Answer: 3"], reference=expected["a"]))
    assert "## Reference solution (for you only; the student cannot see it)\n" + expected["a"] in prompt


# ---- (2) and (3) the repair of the all-wrong prompt --------------------------------------------------------------


def test_the_all_wrong_prompt_is_deferred_and_its_tool_results_get_weight_zero(environment_run):
    run = environment_run
    trainer, tok = run.trainer, run.trainer.processing_class
    ((prompt, reference, kw),) = run.deferred  # only the hard prompt failed every rollout, interventions included
    assert prompt[-1]["content"] == "What is in register b? (hard) (register b is hidden)"  # as the policy saw it
    assert reference == trainer.train_dataset[1]["solution"] and kw["environment"] is None
    assert trainer.repair.buffer.counters["repairs"] == 1 and len(trainer.repair.buffer) == 0

    first_turn, result, answer = (tokens(tok, text) for text in
                                  (f"Try 0.{call_text('b')}<|im_end|>", result_text(6), "Answer: 6<|im_end|>"))  # fmt: skip
    learned = [1] * len(first_turn) + [0] * len(result) + [1] * len(answer)
    (_, teacher_refs), (_, base_refs) = run.scored
    assert teacher_refs == base_refs == [first_turn + result + answer]
    ((mask, terms),) = run.weighted
    assert mask[0].tolist() == learned
    weights = (terms.weights * mask)[0]
    assert (weights[torch.tensor(learned) == 0] == 0).all()  # exactly 0 on the tool result and the turn header
    assert (weights[torch.tensor(learned) == 1] > 0).all()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["sort/repairs"] == 1 and log["sort/repair_loss"] > 0 and log["sort/all_wrong_frac"] == 0.5


def test_the_repair_prompts_show_the_tools_and_the_observation(environment_run):
    run = environment_run
    tok, batch = run.trainer.processing_class, run.batch
    hard = next(row for row in range(len(batch["prompt_ids"])) if is_hard(tok, batch["prompt_ids"][row]))
    seen = batch["prompt_ids"][hard][batch["prompt_mask"][hard].bool()].tolist()
    assert '"name": "get"' in tok.decode(seen) and "register b is hidden" in tok.decode(seen)
    (teacher, _), (base, _) = run.scored
    assert base == [seen]  # learnt after exactly the prompt the rollouts had
    teacher_text = tok.decode(teacher[0])
    assert teacher_text.startswith("<|im_start|>system\n<tools>") and '"name": "get"' in teacher_text
    assert PLAN in teacher_text


# ---- tools=, joint repair, resume with several environments ------------------------------------------------------


def test_standalone_tools_with_the_joint_repair(tiny_model_path, tool_tokenizer, tmp_path):
    """`tools=[get]` (no environment): the rollouts call it, the all-wrong prompt is repaired inside the
    regression's step, after a prompt that shows the tool."""
    from tests.test_sort_tools import get

    args = combined_args(tmp_path / "out", repair_update="joint")
    trainer = build(tiny_model_path, tool_tokenizer, args, register_rows(), tools=[get])
    with pytest.MonkeyPatch.context() as patch:
        scored, weighted = spy_on_repair_passes(trainer, patch)
        trainer.train()
    batch, tok = trainer.records[0], trainer.processing_class
    assert all("<tool_response>\n3\n</tool_response>" in text for text in tok.batch_decode(batch["completion_ids"]))
    assert trainer.repair.buffer.counters["repairs"] == 1
    (_, _), (base, _) = scored
    assert '"name": "get"' in tok.decode(base[0]) and "(hard)" in tok.decode(base[0])
    ((mask, terms),) = weighted
    weights = (terms.weights * mask)[0]
    assert weights[mask[0] == 0].eq(0).all() and weights[mask[0] == 1].gt(0).all() and mask[0].eq(0).any()


class BufferAtStart(TrainerCallback):
    def __init__(self):
        self.trainer, self.buffer = None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.buffer = self.trainer.repair.buffer.state_dict()


def test_resume_restores_the_buffer_of_reference_conversations_and_their_environment(
    tiny_model_path, tool_tokenizer, tmp_path
):
    """A dict `environment_factory` (rows name theirs): the deferred item keeps its environment through the
    checkpoint, and the resumed run repairs it after a prompt with that environment's tools."""
    out, environments = tmp_path / "out", {"registers": RegisterEnv}
    first = build(tiny_model_path, tool_tokenizer,
                  combined_args(out, repair_batch_size=100, save_strategy="steps", save_steps=1),
                  register_rows("registers"), environment_factory=environments)  # fmt: skip
    first.train()
    saved = json.loads(Path(out, "checkpoint-1", STATE_FILE).read_text())["sort_buffer"]
    (item,) = saved["items"]
    assert item["environment"] == "registers" and item["reference"] == first.train_dataset[1]["solution"]
    assert item["prompt"][-1]["content"].endswith("(register b is hidden)")

    spy = BufferAtStart()
    args = combined_args(out, max_steps=2, repair_batch_size=1, max_repairs_per_step=1, save_strategy="no")
    second = build(tiny_model_path, tool_tokenizer, args, register_rows("registers"), callbacks=[spy],
                   environment_factory=environments)  # fmt: skip
    spy.trainer = second
    with pytest.MonkeyPatch.context() as patch:
        scored, _ = spy_on_repair_passes(second, patch)
        second.train(resume_from_checkpoint=True)
    assert spy.buffer == saved
    assert second.repair.buffer.counters["repairs"] == saved["counters"]["repairs"] + 1
    (teacher, _), (base, _) = scored
    tok = second.processing_class
    assert base == second.repair.renderer.prompt_ids([item["prompt"]], ["registers"])
    assert '"name": "get"' in tok.decode(base[0]) and '"name": "get"' in tok.decode(teacher[0])


# ---- (4) what stays refused ----------------------------------------------------------------------------------------


def test_a_rollout_func_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(ValueError, match="provides its own rollout_func"):
        MInTRLSORTTrainer("no/such-model", [answer_reward], combined_args(tmp_path / "out"), register_rows(),
                          environment_factory=RegisterEnv, rollout_func=lambda prompts, trainer: {})  # fmt: skip


def test_a_reference_call_to_a_tool_the_environment_lacks_is_refused_before_training(
    tiny_model_path, tool_tokenizer, tmp_path
):
    rows = register_rows().to_list()
    call, result = rows[0]["solution"][0]["tool_calls"][0], rows[0]["solution"][1]
    call["function"]["name"], result["name"] = "put", "put"
    with pytest.raises(InputError, match=r"Column 'solution' \(reference_column\).*row 0.*calls 'put', which is not "
                                         r"among the tools its prompt shows \(\['get'\]\)"):  # fmt: skip
        build(tiny_model_path, tool_tokenizer, combined_args(tmp_path / "out"), Dataset.from_list(rows),
              environment_factory=RegisterEnv)  # fmt: skip
