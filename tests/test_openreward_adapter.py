"""TRL's experimental OpenReward adapter (`trl.experimental.openreward`) as the `environment_factory` of
`MInTRLTrainer`, unchanged, against an in-process stand-in for the `openreward` SDK's environment handle (the SDK
is not installed and there is no ORS server here).

How the adapter is built: the public `OpenRewardSpec(url, num_tasks=, secrets=)`, with its two SDK handles
injected. `OpenRewardSpec.__init__` imports nothing; the SDK is reached only through the spec's cached properties
`_sdk_client` (`openreward.OpenReward(...)`) and `_sdk_env` (`client.environments.get(name)`). The test assigns
the stand-in to both (they are `functools.cached_property`, so an instance attribute takes their place), and then
reads `spec.train_dataset`, `spec.environment_factory` and `spec.reward_funcs` as a user would: task listing, tool
discovery (one probe session's `list_tools()`), the per-spec `_RolloutEnvironment` subclass with one bound method
per server tool, and the outcome-only reward function (`env.reward` per rollout) all run as TRL ships them. The
factory passes `_client`, `_env` and `_tool_specs` to `_RolloutEnvironment`, the same arguments as
`functools.partial(_RolloutEnvironment, base_url=..., _client=..., _env=..., _tool_specs=...)`.

What the stand-in does: `list_tools()` gives `lookup` and `submit` (JSON-Schema `input_schema`), `session(split=,
index=, secrets=)` a context manager whose session has `get_prompt()` (text blocks) and `call_tool(name, input)`
(an object with `blocks`, `reward`, `metadata`, `finished`); `lookup` raises (the service failing mid-rollout),
`submit` scores the task. Everything is recorded.

The trainer run: the tiny model, Qwen3's chat template (TRL's `qwen3_chat_template`, the one
tests/test_mintrl_tools.py uses), a policy biased to end its turn right after a tool call (as there), and a
`FunctionJudge` that flags the first step of the first two turns of each intervened rollout and writes the
correction as a tool call: `lookup` first (the service raises, the adapter returns `Error: ...`, the run goes on),
then `submit`.

The spec's dataset rows have an empty user message, which TRL appends the environment's `reset()` text to: the
run trains on them unchanged (MInTRL's input check refuses empty prompts only without an `environment_factory`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import pytest
import torch
from mintrl_helpers import RecordingTrainer, mintrl_args
from transformers import AutoTokenizer
from transformers.utils import get_json_schema
from trl.chat_template_utils import qwen3_chat_template
from trl.experimental.openreward import OpenRewardSpec

from trl_mintrl.judges import FunctionJudge
from trl_mintrl.losses import regression_token_masks
from trl_mintrl.mintrl import trainer as mintrl_trainer

URL = "http://ors.invalid:8080"  # never contacted: the spec's SDK handles are the stand-in
SECRETS = {"token": "not-a-secret"}
TARGET = "7"
LOOKUP_FAILURE = "ORS 503: lookup backend unavailable"


def points(index: int) -> float:
    """What a correct submission to task `index` scores (distinct per task, so a reward on the wrong row shows)."""
    return (index + 1) / 4


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


LOOKUP_CALL, SUBMIT_CALL = tool_call("lookup", key="a"), tool_call("submit", answer=TARGET)


# ----- the stand-in for the `openreward` SDK's environment handle -----


@dataclass
class TextBlock:  # the SDK's `TextBlock` shape (the adapter also takes dicts)
    text: str
    type: str = "text"


@dataclass
class ToolOutput:  # the SDK's `openreward.api.environments.types.ToolOutput` shape
    blocks: list
    reward: float | None = None
    metadata: dict | None = None
    finished: bool = False


TOOL_SPECS = [
    {
        "name": "lookup",
        "description": "Look up a key in the task's notes.",
        "input_schema": {"type": "object", "properties": {"key": {"type": "string", "description": "The key."}},
                         "required": ["key"]},
    },
    {
        "name": "submit",
        "description": "Submit the final answer; the episode ends and is scored.",
        "input_schema": {"type": "object", "properties": {"answer": {"type": "string", "description": "The answer."}},
                         "required": ["answer"]},
    },
]  # fmt: skip


@dataclass
class StandInSession:
    env: StandInEnvironment
    split: str
    index: int
    secrets: dict | None
    entered: bool = False
    exited: bool = False
    calls: list = field(default_factory=list)  # (tool name, input) per call_tool

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        self.exited = True
        return False

    def list_tools(self):
        return list(TOOL_SPECS)

    def get_prompt(self):
        return [TextBlock(f"Task {self.index}: find the value of a and submit it.")]

    def call_tool(self, name: str, tool_input: dict):
        if self.env.record_calls:
            self.calls.append((name, dict(tool_input)))
        if name == "lookup":
            raise ConnectionError(LOOKUP_FAILURE)
        if name == "submit":
            correct = tool_input.get("answer") == self.env.tasks[self.index]["target"]
            reward = points(self.index) + self.env.reward_offset if correct else 0.0
            return ToolOutput([{"type": "text", "text": "correct" if correct else "wrong"}], reward,
                              {"index": self.index}, finished=True)  # fmt: skip
        raise KeyError(name)


class StandInEnvironment:
    """What `client.environments.get(name)` returns in the SDK, in process: tasks, tools, sessions."""

    def __init__(self, num_tasks: int = 4, *, record_calls: bool = True, reward_offset: float = 0.0):
        self.tasks = [{"target": TARGET, "points": points(i)} for i in range(num_tasks)]
        self.record_calls, self.reward_offset = record_calls, reward_offset  # switches to break a test's path
        self.sessions: list[StandInSession] = []

    def list_tools(self):
        return list(TOOL_SPECS)

    def num_tasks(self, split):
        return len(self.tasks)

    def get_task(self, split, index):
        return dict(self.tasks[index])

    def list_tasks(self, split):
        return [dict(t) for t in self.tasks]

    def session(self, *, split="train", index=0, secrets=None, task=None):
        assert task is None, "the dataset's rows carry task_index, not task_spec"
        session = StandInSession(self, split, index, secrets)
        self.sessions.append(session)
        return session


class StandInClient:
    def __init__(self, env):
        self.environments = self
        self.env = env

    def get(self, name):
        return self.env


def stand_in_spec(env: StandInEnvironment) -> OpenRewardSpec:
    """`OpenRewardSpec` for a URL target, its two SDK handles (cached properties) replaced by the stand-in."""
    spec = OpenRewardSpec(URL, num_tasks=len(env.tasks), secrets=SECRETS)
    spec._sdk_client = StandInClient(env)
    spec._sdk_env = env
    return spec


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# ----- the adapter alone -----


def test_the_adapter_on_the_stand_in():
    """What the trainer relies on, without it: the spec's dataset, tool discovery, bound tool methods, a session per
    reset, the prompt text, a raising tool answered with `Error: ...`, the reward on the instance."""
    env = StandInEnvironment()
    spec = stand_in_spec(env)
    rows = spec.train_dataset
    assert rows.column_names == ["prompt", "task_index", "points", "target"]
    assert rows[2] == {"prompt": [{"role": "user", "content": ""}], "task_index": 2, "points": 0.75, "target": "7"}

    factory = spec.environment_factory
    assert [(s.index, s.entered, s.exited) for s in env.sessions] == [(0, True, True)]  # the discovery probe
    adapter = factory()
    assert get_json_schema(adapter.submit)["function"]["parameters"] == {  # the schema the policy's prompt shows
        "type": "object", "properties": {"answer": {"type": "string", "description": "The answer."}},
        "required": ["answer"]}  # fmt: skip
    assert adapter.reset(**rows[2]) == "Task 2: find the value of a and submit it."
    session = env.sessions[-1]
    assert (session.split, session.index, session.secrets, session.entered) == ("train", 2, SECRETS, True)
    assert adapter.lookup(key="a") == f"Error: {LOOKUP_FAILURE}" and adapter.reward is None
    assert adapter.submit(answer=TARGET) == "correct"
    assert session.calls == [("lookup", {"key": "a"}), ("submit", {"answer": TARGET})]
    assert (adapter.reward, adapter.rewards, adapter.finished) == (0.75, [None, 0.75], True)
    assert spec.reward_funcs(environments=[adapter, factory()]) == [0.75, None]
    adapter.reset(**rows[1])  # the next rollout closes the previous session
    assert session.exited and not env.sessions[-1].exited and adapter.reward is None


# ----- MInTRLTrainer with the adapter as its environment_factory -----


class BatchRecordingTrainer(RecordingTrainer):
    """`RecordingTrainer` that also keeps each batch's rows, control flags and per-function rewards."""

    def _score_batch(self, output, batch):
        super()._score_batch(output, batch)
        self.records[-1].update(inputs=list(batch.inputs), is_control=batch.rollout.is_control.clone(),
                                rewards_per_func=batch.rewards_per_func.clone())  # fmt: skip


def length_reward(completion_ids, **kwargs):
    return [len(ids) / 100 for ids in completion_ids]


def qwen3_tokenizer(tiny_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


def train_one_step(tiny_model_path, cpu_args, monkeypatch, env: StandInEnvironment, questions: list):
    spec = stand_in_spec(env)
    tokenizer = qwen3_tokenizer(tiny_model_path)
    tails = [(*ids(tokenizer, call)[-4:], tokenizer.eos_token_id) for call in (LOOKUP_CALL, SUBMIT_CALL)]
    args = mintrl_args(cpu_args, max_steps=1, per_device_train_batch_size=8, max_completion_length=256, chunk_size=4,
                       max_correction_tokens=96, max_tool_calling_iterations=3,  # a call is 65 tokens here
                       generation_kwargs={"sequence_bias": {tail: 50.0 for tail in tails}})  # fmt: skip

    def review(question, prefix, steps, reference, conversation):
        questions.append(question)
        return 0 if not prefix and sum(m["role"] == "tool" for m in conversation) < 2 else None

    def correct(question, prefix, reference, conversation):
        return SUBMIT_CALL if any(m["role"] == "tool" for m in conversation) else LOOKUP_CALL

    trainer = BatchRecordingTrainer(model=tiny_model_path, reward_funcs=[spec.reward_funcs, length_reward], args=args,
                                    processing_class=tokenizer, train_dataset=spec.train_dataset,
                                    environment_factory=spec.environment_factory,
                                    judge=FunctionJudge(review, correct))  # fmt: skip
    probes = len(env.sessions)  # sessions opened before training: the spec's tool discovery
    losses_masks = []

    def spy(completion_mask, tool_mask, judge_mask):
        regressed, judge = regression_token_masks(completion_mask, tool_mask, judge_mask)
        losses_masks.append((completion_mask.bool(), tool_mask.bool(), judge_mask.bool(), regressed))
        return regressed, judge

    monkeypatch.setattr(mintrl_trainer, "regression_token_masks", spy)
    trainer.train()
    return trainer, probes, losses_masks


def test_mintrl_trainer_with_the_openreward_adapter(tiny_model_path, cpu_args, monkeypatch):
    """One step: a session per rollout, the judge's tool calls run through the adapter (`lookup` fails at the
    service and comes back as `Error: ...`, then `submit` is scored), the adapter's reward reaches the spec's reward
    function on the right row, tool results are out of the loss and judge tokens in it."""
    env, questions = StandInEnvironment(), []
    trainer, probes, losses_masks = train_one_step(tiny_model_path, cpu_args, monkeypatch, env, questions)

    assert trainer.state.global_step == 1 and len(losses_masks) == 1
    assert trainer.reward_func_names == ["_outcome_only_reward_func", "length_reward"]
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 1 and math.isfinite(logs[0]["loss"]) and logs[0]["tools/call_frequency"] > 0
    assert logs[0]["tools/failure_frequency"] == 0  # the adapter turns the service's exception into a result

    (record,) = trainer.records
    rows, intervened = record["inputs"], ~record["is_control"]
    assert intervened.any() and record["is_control"].any()
    assert len({r["task_index"] for r, i in zip(rows, intervened.tolist(), strict=True) if i}) == 2  # two tasks

    # a session per rollout, opened by reset with the row's task index and the spec's secrets
    rollouts = env.sessions[probes:]
    assert [(s.split, s.index, s.secrets) for s in rollouts] == [("train", r["task_index"], SECRETS) for r in rows]
    assert all(s.entered for s in rollouts) and len(rollouts) == len(record["completion_ids"])
    tasks = {f"Task {r['task_index']}: find the value of a and submit it." for r in rows}
    assert questions and set(questions) <= tasks  # the judge saw the row's (empty) prompt with the session's text

    # the judge-written tool calls executed through the adapter, with their parsed arguments; controls call nothing
    for session, is_intervened in zip(rollouts, intervened.tolist(), strict=True):
        expected = [("lookup", {"key": "a"}), ("submit", {"answer": TARGET})] if is_intervened else []
        assert session.calls == expected

    # the adapter's reward, through the spec's reward function, on each rollout's own row; None (NaN) for controls
    env_rewards = record["rewards_per_func"][:, 0]
    expected = [points(r["task_index"]) if i else math.nan for r, i in zip(rows, intervened.tolist(), strict=True)]
    assert env_rewards.tolist() == pytest.approx(expected, nan_ok=True)
    lengths = torch.tensor([len(c) / 100 for c in record["completion_ids"]])
    assert record["rewards"].tolist() == pytest.approx((env_rewards.nan_to_num() + lengths).tolist(), abs=1e-6)

    # tool results are environment tokens (tool_mask 0, judge_mask 0), judge tokens are in the loss
    tool_mask, judge_mask, mask = record["tool_mask"].bool(), record["judge_mask"].bool(), record["completion_mask"]
    tool_tokens = ~tool_mask & ~judge_mask & mask.bool()
    assert tool_tokens[intervened].any(dim=1).all() and not tool_tokens[~intervened].any()
    assert judge_mask[intervened].any(dim=1).all() and not (judge_mask & tool_mask).any()
    for row in intervened.nonzero().flatten().tolist():  # the error, then the score, as the tool results
        results = trainer.processing_class.decode(record["completion_ids"][row][tool_tokens[row]])
        pattern = rf"<tool_response>\nError: {LOOKUP_FAILURE}\n</tool_response>.*<tool_response>\ncorrect\n"
        assert re.search(pattern, results, re.S), results
        written = trainer.processing_class.decode(record["completion_ids"][row][judge_mask[row]])
        assert '"name": "lookup"' in written and '"name": "submit"' in written
    (completion, policy, judge, regressed) = losses_masks[0]
    assert regressed.equal((policy | judge) & completion) and (~policy & ~judge & completion).any()
