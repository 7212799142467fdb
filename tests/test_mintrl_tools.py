"""MInTRL with tools (TRL's `tools=` / `environment_factory=`): three token roles (policy, judge, environment), the
intervention loop inside the tool loop, TRL's tool rules, and a 2-step `MInTRLTrainer` run with an environment."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from datasets import Dataset
from mintrl_helpers import RecordingTrainer, mintrl_args
from test_mintrl_continuous import FakeLM, _hash, hashed_judge
from test_mintrl_rollout import ScriptedPolicy
from transformers import AutoTokenizer
from trl.chat_template_utils import qwen3_chat_template

from trl_mintrl.engines.base import Generation
from trl_mintrl.judges import CorrectionRequest, FunctionJudge, ReviewRequest
from trl_mintrl.losses import advantage_regression_loss, mintrl_anchors, regression_token_masks
from trl_mintrl.mintrl import trainer as mintrl_trainer
from trl_mintrl.mintrl.continuous import ContinuousRollout
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings, Trajectory
from trl_mintrl.mintrl.rollout_batch import RolloutBatch
from trl_mintrl.mintrl.tools import run_tool_calls

CALL = re.compile(r"\[\[(\w+) (\w+)\]\]")  # the scripted tools' call notation: [[tool argument]]


class ScriptedTools:
    """A `ToolEnvironment`: a turn calls `[[tool arg]]`; a result is `<tool>content` text; calls are recorded."""

    max_model_len = 100_000

    def __init__(self, tokenizer, tools: dict):
        self.tok = tokenizer
        self.tools = tools
        self.calls: list[list[tuple[str, str]]] = []  # per run: (tool, argument) per call

    def parse_turn(self, turn_ids, context_ids):
        text = self.tok.decode(turn_ids, skip_special_tokens=True)
        calls = [{"type": "function", "function": {"name": n, "arguments": {"arg": a}}} for n, a in CALL.findall(text)]
        return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}

    def run(self, tool_calls):
        self.calls.append([(c["function"]["name"], c["function"]["arguments"]["arg"]) for c in tool_calls])
        return run_tool_calls(tool_calls, self.tools, {}, None)

    def result_ids(self, tool_messages):
        return ids(self.tok, "".join(f"\n<{m['name']}>{m['content']}\n" for m in tool_messages))


class LogprobPolicy(ScriptedPolicy):
    """`ScriptedPolicy` that reports a sampling log-prob of -0.5 on every token."""

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        return [
            Generation(g.token_ids, [-0.5] * g.num_tokens) for g in super()._generate(prompt_ids, max_new_tokens, 0)
        ]


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def registers(**values):
    return {"get": lambda arg: values[arg]}


def recording_judge(review, correct, seen: list):
    """A FunctionJudge that reads the conversation and records each review request's (prefix, conversation)."""

    def review_fn(question, prefix, steps, reference, conversation):
        seen.append((prefix, [dict(m) for m in conversation]))
        return review(prefix, conversation)

    return FunctionJudge(review_fn, lambda question, prefix, reference, conversation: correct(prefix, conversation))


def run_one(tok, script, judge, tools, **settings):
    base = dict(chunk_size=64, max_reviews=4, max_correction_tokens=64, max_completion_length=256)
    policy = LogprobPolicy(tok, {5: script})
    t = Trajectory(prompt_ids=[5], question="q", review_budget=4, environment=tools)
    InterventionRollout(policy, judge, tok, RolloutSettings(**{**base, **settings})).run([t])
    return t, policy


def test_mask_layout_of_policy_judge_and_tool_tokens(tiny_tokenizer):
    """Turn 1: the policy calls a tool (kept); its result; turn 2: the judge revises the first step and the policy
    ends the turn. The judge's second review saw turn 1 and the result; the policy continued after the result."""
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token
    tools, seen = ScriptedTools(tok, registers(a="7")), []
    judge = recording_judge(lambda prefix, conv: 0 if conv and not prefix else None, lambda p, c: "a=7", seen)
    t, policy = run_one(tok, ["[[get a]]" + eos, "a=9" + eos, eos], judge, tools)

    call, result, correction = ids(tok, "[[get a]]") + [tok.eos_token_id], ids(tok, "\n<get>7\n"), ids(tok, "a=7")
    assert t.completion_ids == call + result + correction + [tok.eos_token_id]
    assert t.env_mask == [1] * len(call) + [0] * len(result) + [0] * len(correction) + [1]
    assert t.judge_mask == [0] * len(call) + [0] * len(result) + [1] * len(correction) + [0]
    assert t.logprobs == [-0.5] * len(call) + [None] * (len(result) + len(correction)) + [-0.5]
    assert tools.calls == [[("get", "a")]] and (t.tool_calls, t.tool_failures, t.finished) == (1, 0, True)
    assert policy.calls[1][0][0] == [5, *call, *result]  # turn 2 continues after the tool's result
    turn_one = {"role": "assistant", "content": "[[get a]]", "tool_calls": [
        {"type": "function", "function": {"name": "get", "arguments": {"arg": "a"}}}]}  # fmt: skip
    tool_result = {"role": "tool", "name": "get", "content": "7"}
    assert seen == [("", []), ("", [turn_one, tool_result])]  # each turn's prefix is its own; the rest is context
    assert t.messages == [turn_one, tool_result, {"role": "assistant", "content": "a=7"}]
    batch = RolloutBatch.from_trajectories(
        [t], True, torch.tensor([False]), None, *[judge.transport_status()] * 2, stop_token_ids=set()
    )
    assert batch.stat("judge_tokens").item() == len(correction)
    assert batch.stat("completion_tokens").item() == len(call) + len(correction) + 1  # no tool token counted
    assert batch.judge_mask(len(t.completion_ids) + 2)[0].tolist() == t.judge_mask + [0, 0]


def test_tool_tokens_get_no_gradient_and_judge_tokens_are_regressed():
    """One row: policy, policy, tool, tool, judge, policy, padding. The loss is hand-computed: the policy tokens'
    log-ratios are 0 (pi_old = pi_theta), the judge token's is its log-prob minus kappa, tool tokens are out."""
    logps = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -0.5, -9.0]], dtype=torch.float64, requires_grad=True)
    completion_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    tool_mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1]])  # TRL pads tool_mask with 1
    judge_mask = torch.tensor([[0, 0, 0, 0, 1, 0, 0]])
    regressed, judge = regression_token_masks(completion_mask, tool_mask, judge_mask)
    assert regressed.tolist() == [[True, True, False, False, True, True, False]]
    assert judge.tolist() == [[False, False, False, False, True, False, False]]
    beta, kappa, advantage = 0.1, -0.2, torch.tensor([0.3], dtype=torch.float64)
    anchors = mintrl_anchors(logps, judge, "const", kappa)
    loss, residuals = advantage_regression_loss(logps, anchors, regressed, advantage, beta)
    residual = beta * (-5.0 - kappa) - 0.3
    assert residuals.item() == pytest.approx(residual) and loss.item() == pytest.approx(residual**2)
    loss.backward()
    g = 2 * residual * beta
    assert logps.grad.tolist() == [
        [pytest.approx(g), pytest.approx(g), 0.0, 0.0, pytest.approx(g), pytest.approx(g), 0.0]
    ]
    # without tools (no judge_mask) every non-policy completion token is the judge's, as before
    regressed, judge = regression_token_masks(completion_mask, tool_mask, None)
    assert regressed.equal(completion_mask.bool()) and judge.tolist() == [
        [False, False, True, True, True, False, False]
    ]


def test_a_judge_written_tool_call_is_executed_and_its_result_masked(tiny_tokenizer):
    """The judge revises the policy's guess with a tool call; the policy ends the turn; the call runs and its result
    is environment tokens; the next turn is kept."""
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token
    tools = ScriptedTools(tok, registers(a="7"))
    judge = recording_judge(lambda prefix, conv: None if conv else 0, lambda p, c: "[[get a]]", [])
    t, _ = run_one(tok, ["I guess 3" + eos, eos, "so 7" + eos], judge, tools)

    call, result, answer = ids(tok, "[[get a]]"), ids(tok, "\n<get>7\n"), ids(tok, "so 7") + [tok.eos_token_id]
    assert tools.calls == [[("get", "a")]]
    assert t.completion_ids == call + [tok.eos_token_id] + result + answer
    assert t.judge_mask == [1] * len(call) + [0] + [0] * len(result) + [0] * len(answer)
    assert t.env_mask == [0] * len(call) + [1] + [0] * len(result) + [1] * len(answer)
    assert t.messages[0]["tool_calls"][0]["function"] == {"name": "get", "arguments": {"arg": "a"}}
    assert t.messages[1] == {"role": "tool", "name": "get", "content": "7"} and t.revisions == 1


@pytest.mark.parametrize("spare", [0, -1], ids=["result-fits-exactly", "result-one-token-too-long"])
def test_overflow_rule(tiny_tokenizer, spare):
    """As in TRL: the tool runs, then a result that would pass max_completion_length is dropped and the rollout
    ends with the turn; a result that just fits is appended and the rollout ends with no budget left."""
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token
    call, result = ids(tok, "[[get a]]") + [tok.eos_token_id], ids(tok, "\n<get>7\n")
    tools = ScriptedTools(tok, registers(a="7"))
    keep = FunctionJudge(lambda q, p, s, r: None, lambda q, p, r: "")
    t, policy = run_one(tok, ["[[get a]]" + eos], keep, tools, max_completion_length=len(call) + len(result) + spare)
    assert tools.calls == [[("get", "a")]] and t.finished and len(policy.calls) == 1
    if spare == 0:
        assert t.completion_ids == call + result and t.env_mask == [1] * len(call) + [0] * len(result)
        assert t.messages[-1]["role"] == "tool"
    else:
        assert t.completion_ids == call and t.env_mask == [1] * len(call)
        assert [m["role"] for m in t.messages] == ["assistant"]


def test_iteration_limit_and_failed_calls_as_in_trl(tiny_tokenizer):
    """An unknown tool and a tool that raises mid-rollout give an error result and count as failures, and the
    rollout goes on; after `max_tool_calling_iterations` turns with tool calls, the next call is not run."""
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token

    def flaky(arg):
        raise RuntimeError(f"register {arg} is unreadable")

    tools = ScriptedTools(tok, {"get": flaky})
    keep = FunctionJudge(lambda q, p, s, r: None, lambda q, p, r: "")
    script = ["[[nope x]]" + eos, "[[get b]]" + eos, "[[get c]]" + eos]
    t, policy = run_one(tok, script, keep, tools, max_tool_calling_iterations=2)
    assert tools.calls == [[("nope", "x")], [("get", "b")]] and len(policy.calls) == 3  # the third call never ran
    assert (t.tool_calls, t.tool_failures, t.finished) == (2, 2, True)
    results = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert results == [str({"error": "Tool nope not found."}), str({"error": "register b is unreadable"})]
    assert t.messages[-1]["tool_calls"][0]["function"]["arguments"] == {"arg": "c"}  # kept, not executed


class HashedTools(ScriptedTools):
    """A deterministic tool for `FakeLM`'s letter soup: a turn calls `get` when its hash says so, and the result is
    a few letters picked by the call's turn."""

    def parse_turn(self, turn_ids, context_ids):
        message = {"role": "assistant", "content": self.tok.decode(turn_ids, skip_special_tokens=True)}
        if _hash(turn_ids) % 3:
            message["tool_calls"] = [{"type": "function", "function": {"name": "get", "arguments": {"arg": str(_hash(turn_ids) % 7)}}}]  # fmt: skip
        return message


def test_continuous_and_lock_step_schedules_give_the_same_trajectories_with_tools(tiny_tokenizer):
    tok = tiny_tokenizer
    settings = RolloutSettings(chunk_size=12, max_reviews=4, max_correction_tokens=6, max_completion_length=160,
                               max_tool_calling_iterations=3)  # fmt: skip

    def batch(tools):
        return [Trajectory(prompt_ids=[3 + i] * (1 + i % 5), question=f"q{i}", review_budget=4 if i % 2 else 0,
                           environment=tools) for i in range(16)]  # fmt: skip

    barrier_tools, continuous_tools = (HashedTools(tok, {"get": lambda arg: "xy" * int(arg)}) for _ in range(2))
    barrier, continuous = batch(barrier_tools), batch(continuous_tools)
    InterventionRollout(FakeLM(tok, streaming=False), hashed_judge(), tok, settings).run(barrier)
    ContinuousRollout(FakeLM(tok), hashed_judge(), tok, settings).run(continuous)
    fields = ("completion_ids", "env_mask", "judge_mask", "logprobs", "messages", "tool_calls", "reviews", "revisions")
    for a, b in zip(barrier, continuous, strict=True):
        assert all(getattr(a, f) == getattr(b, f) for f in fields)
    assert sorted(map(sorted, barrier_tools.calls)) == sorted(map(sorted, continuous_tools.calls))
    tool_tokens = sum(len(t.completion_ids) - t.written_tokens for t in barrier)
    assert tool_tokens > 0 and sum(t.judge_tokens for t in barrier) > 0 and sum(t.tool_calls for t in barrier) > 4


# ----- MInTRLTrainer with environment_factory -----

TOOL_CALL = '<tool_call>\n{"name": "get", "arguments": {"name": "a"}}\n</tool_call>'


class RegisterEnv:
    """Registers only a tool reveals; the second read of a rollout raises (a fault mid-rollout). The reward is the
    share of the rollout's reads that succeeded."""

    def __init__(self):
        self.values, self.reads, self.failed = {}, 0, 0

    def reset(self, **row):
        self.values, self.reads, self.failed = {"a": row["a"]}, 0, 0

    def get(self, name: str) -> str:
        """Read a register.

        Args:
            name: The register's name.
        """
        self.reads += 1
        if self.reads == 2:
            self.failed += 1
            raise RuntimeError("register bus fault")
        return str(self.values[name])

    def get_reward(self) -> float:
        return (self.reads - self.failed) / max(self.reads, 1)


class ControlRecordingTrainer(RecordingTrainer):
    """`RecordingTrainer` that also keeps which rows are controls."""

    def _score_batch(self, output, batch):
        super()._score_batch(output, batch)
        self.records[-1]["is_control"] = batch.rollout.is_control.clone()


def length_reward(completion_ids, **kwargs):
    return [len(ids) / 100 for ids in completion_ids]


def test_mintrl_trainer_with_an_environment_factory(tiny_model_path, cpu_args, monkeypatch):
    """Two steps on the tiny model: the judge writes a tool call at the start of the first two turns of each
    intervened rollout (the policy is biased to end its turn right after one); the environment runs them, the second
    read raises; TRL's reward column, tool metrics and masks come through, and the loss trains."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = qwen3_chat_template
    call_tail = tuple(ids(tokenizer, TOOL_CALL)[-4:])
    args = mintrl_args(cpu_args, max_completion_length=256, chunk_size=4, max_correction_tokens=64,
                       max_tool_calling_iterations=3,
                       generation_kwargs={"sequence_bias": {(*call_tail, tokenizer.eos_token_id): 50.0}})  # fmt: skip

    def review(question, prefix, steps, reference, conversation):
        reads = sum(m["role"] == "tool" for m in conversation)
        return 0 if not prefix and reads < 2 else None

    judge = FunctionJudge(review, lambda question, prefix, reference: TOOL_CALL)
    rows = [{"prompt": [{"role": "user", "content": f"Read register a ({i})."}], "a": i} for i in range(4)]
    trainer = ControlRecordingTrainer(model=tiny_model_path, reward_funcs=length_reward, args=args, processing_class=tokenizer,
                               train_dataset=Dataset.from_list(rows), judge=judge, environment_factory=RegisterEnv)  # fmt: skip
    losses_masks = []  # each loss's (completion_mask, tool_mask, judge_mask) and the regressed tokens it took

    def spy(completion_mask, tool_mask, judge_mask):
        regressed, judge = regression_token_masks(completion_mask, tool_mask, judge_mask)
        losses_masks.append((completion_mask.bool(), tool_mask.bool(), judge_mask.bool(), regressed))
        return regressed, judge

    monkeypatch.setattr(mintrl_trainer, "regression_token_masks", spy)
    trainer.train()

    assert len(losses_masks) == 2
    for completion, policy, judge, regressed in losses_masks:  # the loss regresses policy and judge tokens only
        assert regressed.equal((policy | judge) & completion) and (~policy & ~judge & completion).any()
    assert trainer.reward_func_names == ["length_reward", "RegisterEnv"]
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(entry["tools/call_frequency"] > 0 for entry in logs)
    assert all(0 < entry["tools/failure_frequency"] < 1 for entry in logs)  # the faulty read was counted
    for record in trainer.records:
        tool_mask, judge_mask, mask = record["tool_mask"], record["judge_mask"], record["completion_mask"].bool()
        tool_tokens = ~tool_mask.bool() & ~judge_mask.bool() & mask
        intervened = ~record["is_control"]
        assert tool_tokens[intervened].any(dim=1).all() and not tool_tokens[~intervened].any()
        assert judge_mask[intervened].any(dim=1).all() and not (judge_mask.bool() & tool_mask.bool()).any()
        env_rewards = record["rewards"] - torch.tensor([len(r) / 100 for r in record["completion_ids"]])
        assert env_rewards[intervened].tolist() == pytest.approx([0.5] * int(intervened.sum()), abs=1e-6)
        assert env_rewards[~intervened].abs().max() < 1e-6  # controls never called the tool
        for row in intervened.nonzero().flatten().tolist():  # the reset value, then the fault, as tool results
            results = trainer.processing_class.decode(record["completion_ids"][row][tool_tokens[row]])
            assert re.search(r"<tool_response>\n[0-3]\n</tool_response>.*register bus fault", results, re.S)
    assert all(math.isfinite(entry["loss"]) for entry in logs)


def test_a_tool_result_with_an_image_is_refused():
    with pytest.raises(ValueError, match="tool 'shot' returned an image: MInTRLTrainer does not take images"):
        run_tool_calls([{"type": "function", "function": {"name": "shot", "arguments": {}}}],
                       {"shot": lambda: [{"type": "image", "image": None}]}, {}, None)  # fmt: skip


def test_judge_prompts_show_the_conversation_so_far():
    from trl_mintrl.judges.base import ReviewRequest
    from trl_mintrl.judges.templates import JudgeTemplates

    conversation = [{"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"type": "function", "function": {"name": "get", "arguments": {"name": "a"}}}]},
        {"role": "tool", "name": "get", "content": "7"}]  # fmt: skip
    prompt = JudgeTemplates().render_review(ReviewRequest("q", "So a", ["=7"], conversation=conversation))
    expected = f"[assistant]\nLet me look.\n[tool call] get({json.dumps({'name': 'a'})})\n\n[tool result: get]\n7"
    assert expected + "\n\n[assistant, current turn]\nSo a" in prompt
    assert "[assistant" not in JudgeTemplates().render_review(ReviewRequest("q", "So a", ["=7"]))


def test_the_docs_feedback_judge_writes_its_correction_from_a_tool_error():
    """docs/tools.md's example judge, run as the page shows it: after a failed call it flags a turn that does not
    retry, and writes the call the question needs; after a good result, or on a retrying turn, it keeps."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "tools.md").read_text()
    [block] = [b for b in re.findall(r"^```python\n(.*?)^```", page, flags=re.M | re.S) if "def last_error" in b]
    namespace: dict = {}
    exec(compile(block, "docs/tools.md", "exec"), namespace)
    judge = namespace["judge"]
    failed = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
               "function": {"name": "get", "arguments": {"name": "z"}}}]},
              {"role": "tool", "name": "get", "content": str({"error": "no register 'z'"})}]  # fmt: skip
    question = "What is a + 2 ?"
    guess = ReviewRequest(question=question, prefix="", steps=["a is 3, so 5."], conversation=failed)
    retry = ReviewRequest(question=question, prefix="", steps=["<tool_call>"], conversation=failed)
    read = ReviewRequest(question=question, prefix="", steps=["a is 3, so 5."],
                         conversation=[failed[0], {"role": "tool", "name": "get", "content": "3"}])  # fmt: skip
    verdicts = judge.review([guess, retry, read])
    assert [v.wrong_step for v in verdicts] == [0, None, None]
    [correction] = judge.correct([CorrectionRequest(question=question, prefix="", conversation=failed)])
    assert correction.text == '<tool_call>\n{"name": "get", "arguments": {"name": "a"}}\n</tool_call>'
