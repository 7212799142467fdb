"""`AsyncMInTRLTrainer` with TRL's `tools=` / `environment_factory=`: the rollout worker (mintrl/async_/worker.py,
mintrl/async_/tools.py) runs the same intervention-inside-the-tool-loop state machine as `MInTRLTrainer`, without a
vLLM server: a scripted engine (the scheduler tests' FakeLM, steered by a script), a scripted judge and a register
environment, the trainer's side played by `train`. The worker's rollouts equal the synchronous trainer's on the same
script, token roles included; a judge-written tool call runs; tool results get no gradient in the asynchronous loss;
a raising environment is counted and the run goes on; what cannot work is refused before training."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from datasets import Dataset
from mintrl_helpers import RecordingTrainer, mintrl_args, revise_first_step_judge
from test_async_packing import collate_through_trl
from test_async_trainer import BETA, KAPPA, ScriptedWorker, async_args, make_trainer, sequence_log_probs
from test_async_worker import STEP, drain_metrics, stopped_at_exit, train, worker_args
from test_mintrl_continuous import FakeLM
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl.chat_template_utils import qwen3_chat_template

from trl_mintrl.input_checks import context_length
from trl_mintrl.judges import FunctionJudge
from trl_mintrl.mintrl.async_ import AsyncMInTRLConfig, AsyncMInTRLTrainer
from trl_mintrl.mintrl.async_.worker import MInTRLRolloutWorker

TOOL_CALL = '<tool_call>\n{"name": "get", "arguments": {"name": "a"}}\n</tool_call>'
HEADER = "<|im_start|>assistant\n"
SETTINGS = dict(chunk_size=64, max_reviews=2, max_correction_tokens=64, max_completion_length=256,
                max_tool_calling_iterations=3)  # fmt: skip


def tool_tokenizer(tiny_model_path):
    """A tokenizer of its own (TRL sets its response schema), with a chat template that renders tool calls."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


class ScriptedToolLM(FakeLM):
    """FakeLM (greedy, streaming or not, sampled log-prob -(t % 7) / 10) writing a script instead of letter soup.
    The current turn is the text after the last assistant header. Before any tool result, the rollout of an odd
    register calls the tool itself, an even one guesses; after a result it answers; a turn holding a tool call
    (its own or the judge's) ends at once."""

    def __init__(self, tokenizer, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.tok = tokenizer

    def next_token(self, context):
        text = self.tok.decode(context, skip_special_tokens=False)
        turn, completion = text.rsplit(HEADER, 1)[1], text.split(HEADER, 1)[1]
        register = int(re.search(r"register a \((\d+)\)", text).group(1))
        if "</tool_response>" in completion:
            intended = "So a is known."
        else:
            intended = TOOL_CALL if register % 2 else "I guess 3."
        if "</tool_call>" in turn or not intended.startswith(turn) or turn == intended:
            return self.tok.eos_token_id
        return self.tok(intended[len(turn) :], add_special_tokens=False)["input_ids"][0]


def tool_judge(seen: list | None = None) -> FunctionJudge:
    """Flags a turn that guesses before any register was read (the first step of a first turn without a tool call)
    and writes the call in the policy's format; records each review's (prefix, conversation)."""

    def review(question, prefix, steps, reference, conversation):
        if seen is not None:
            seen.append((prefix, [dict(m) for m in conversation]))
        read = any(m["role"] == "tool" for m in conversation)
        return 0 if not read and not prefix and "<tool_call>" not in steps[0] else None

    return FunctionJudge(review, lambda question, prefix, reference, conversation: TOOL_CALL)


class RegisterEnv:
    """Registers only `get` reveals; `reset` gives a first observation; the reward is whether a register was read."""

    def reset(self, **row):
        self.values, self.reads = {"a": row["a"]}, []
        return " Registers: a."

    def get(self, name: str) -> str:
        """Read a register.

        Args:
            name: The register's name.
        """
        self.reads.append(name)
        return str(self.values[name])

    def get_reward(self) -> float:
        return float(bool(self.reads))


class FaultyRegisterEnv(RegisterEnv):
    """Register 1's bus is faulty: reading it raises, mid-rollout."""

    def get(self, name: str) -> str:
        """Read a register.

        Args:
            name: The register's name.
        """
        if self.values["a"] == 1:
            raise RuntimeError("register bus fault")
        return super().get(name)


def length_reward(completion_ids, **kwargs):
    return [len(ids) / 100 for ids in completion_ids]


def register_rows(n: int = 2) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Read register a ({i})."}], "a": i} for i in range(n)]


@pytest.fixture
def make_tool_worker(tiny_model_path):
    """Workers on the scripted engine, judge and register environment (each overridable), stopped at teardown."""
    with stopped_at_exit(MInTRLRolloutWorker.stop) as workers:

        def build(cpu_args, env=RegisterEnv, judge=None, rows=None, streaming=True, **fields):
            tokenizer = tool_tokenizer(tiny_model_path)
            model_len = context_length(AutoConfig.from_pretrained(tiny_model_path), worker_args(cpu_args))
            worker = MInTRLRolloutWorker(
                worker_args(cpu_args, **{**SETTINGS, **fields}), tokenizer, Dataset.from_list(rows or register_rows()),
                [length_reward], judge or tool_judge(), ScriptedToolLM(tokenizer, streaming=streaming),
                environment_factory=env, max_model_len=model_len,
            )  # fmt: skip
            workers.append(worker)
            return worker

        yield build


def completion_part(sample, n_prompt):
    return {
        "ids": sample.input_ids[n_prompt:].tolist(),
        "trained": sample.completion_mask[n_prompt:].tolist(),
        "judge": sample.metrics.extras["judge_mask"][n_prompt:].tolist(),
    }


def prompt_length(sample) -> int:
    return int(np.flatnonzero(sample.completion_mask)[0]) if sample.completion_mask.any() else len(sample.input_ids)


# ---------------------------------------------------------------------------------------------------------------
# the worker's rollouts are the synchronous trainer's


@pytest.mark.parametrize("streaming", [True, False], ids=["continuous", "lock-step"])
def test_worker_rollouts_equal_the_synchronous_trainers_on_the_same_script(
    make_tool_worker, tiny_model_path, cpu_args, streaming
):
    """One optimizer step of 2 prompts x (2 controls + 2 intervened), once through `MInTRLTrainer` (its engine
    swapped for the script) and once through the asynchronous worker: the same prompts (tool schemas and the
    environment's observation), completions, policy / judge / environment roles, rewards (the environment's
    `get_reward` column included)."""
    sync_args = mintrl_args(cpu_args, per_device_train_batch_size=STEP, max_steps=1, **SETTINGS)
    trainer = RecordingTrainer(model=tiny_model_path, reward_funcs=length_reward, args=sync_args,
                               processing_class=tool_tokenizer(tiny_model_path),
                               train_dataset=Dataset.from_list(register_rows()), judge=tool_judge(),
                               environment_factory=RegisterEnv)  # fmt: skip
    trainer._policy_engine = ScriptedToolLM(trainer.processing_class, streaming=streaming)
    trainer.train()
    (record,) = trainer.records
    expected = {}  # (register, column in its group) -> the synchronous rollout
    for row in range(STEP):
        prompt = record["prompt_ids"][row][record["prompt_mask"][row].bool()].tolist()
        n = int(record["completion_mask"][row].sum())  # no rollout is masked here (none truncated)
        policy, judge = record["tool_mask"][row][:n].tolist(), record["judge_mask"][row][:n].tolist()
        register = int(re.search(r"register a \((\d)\)", trainer.processing_class.decode(prompt)).group(1))
        expected[(register, row % 4)] = {
            "prompt": prompt,
            "ids": record["completion_ids"][row][:n].tolist(),
            "trained": [int(p or j) for p, j in zip(policy, judge, strict=True)],  # environment tokens: out
            "judge": judge,
            "reward": record["rewards"][row].item(),
        }
    assert trainer.reward_func_names == ["length_reward", "RegisterEnv"]

    worker = make_tool_worker(cpu_args, streaming=streaming)
    assert worker.reward_func_names == ["length_reward", "RegisterEnv"]
    (batch,) = train(worker, 1)
    for i, (_, sample) in enumerate(batch):
        register, column = i // 4, i % 4
        n_prompt = len(expected[(register, column)]["prompt"])
        assert sample.input_ids[:n_prompt].tolist() == expected[(register, column)]["prompt"]
        assert sample.completion_mask[:n_prompt].sum() == 0
        got = completion_part(sample, n_prompt)
        want = {k: v for k, v in expected[(register, column)].items() if k not in ("prompt", "reward")}
        assert got == want, (register, column)
        assert sample.metrics["reward"] == pytest.approx(expected[(register, column)]["reward"])
    # the script's shape: every rollout but the even register's controls called the tool; the judge wrote calls
    tool_tokens = [sum(1 - t for t in v["trained"]) for v in expected.values()]
    assert sum(t > 0 for t in tool_tokens) == 6 and sum(sum(v["judge"]) > 0 for v in expected.values()) == 2
    decoded = trainer.processing_class.decode(batch[0][1].input_ids)
    assert "Read register a (0). Registers: a." in decoded and '"name": "get"' in decoded.split(HEADER)[0]


# ---------------------------------------------------------------------------------------------------------------
# what the worker's rollouts hold


def test_a_judge_written_tool_call_is_executed_and_its_result_gets_no_loss_term(make_tool_worker, cpu_args):
    seen = []
    worker = make_tool_worker(cpu_args, judge=tool_judge(seen))
    (batch,) = train(worker, 1)
    tok = worker.tokenizer
    even_intervened = [sample for _, sample in batch[2:4]]  # register 0: the policy guesses, the judge calls
    for sample in even_intervened:
        n_prompt = prompt_length(sample)
        part = completion_part(sample, n_prompt)
        ids = np.asarray(part["ids"])
        judge_text = tok.decode(ids[np.asarray(part["judge"], bool)].tolist())
        assert judge_text == TOOL_CALL  # the judge's tokens: exactly its call, in the loss
        environment = ids[np.asarray(part["trained"]) == 0].tolist()
        assert re.fullmatch(r"\s*<\|im_start\|>user\n<tool_response>\n0\n</tool_response><\|im_end\|>\n" + re.escape(HEADER),
                            tok.decode(environment, skip_special_tokens=False).lstrip("\n"))  # fmt: skip
        assert tok.decode(ids.tolist(), skip_special_tokens=True).endswith("So a is known.")
        assert sample.metrics["rewards/RegisterEnv"] == 1.0  # the environment ran the judge's call
        roles = [m["role"] for m in sample.completion]
        assert roles == ["assistant", "tool", "assistant"] and sample.completion[1]["content"] == "0"
        assert sample.completion[0]["tool_calls"][0]["function"] == {"name": "get", "arguments": {"name": "a"}}
        assert (sample.old_log_probs[n_prompt:][ids >= 0][np.asarray(part["trained"]) == 0] == 0).all()
    # the judge saw the tool result in the conversation when it reviewed the answer turn
    assert any(conv and conv[-1] == {"role": "tool", "name": "get", "content": "0"} for _, conv in seen)
    even_controls = [sample for _, sample in batch[:2]]
    assert all(s.metrics["rewards/RegisterEnv"] == 0.0 and s.completion_mask.sum() > 0 for s in even_controls)
    metrics = drain_metrics(worker)[0]  # the worker may have written the next step already
    assert metrics["tools/call_frequency"] == 6 / 8 and metrics["tools/failure_frequency"] == 0.0
    tool_free = sum(len(completion_part(s, prompt_length(s))["ids"]) for _, s in batch)
    assert metrics["completions/mean_length"][0] < tool_free  # tool results are in no length metric


def test_tool_results_get_no_gradient_in_the_async_loss(make_tool_worker, tiny_model_path, cpu_args, toy_dataset):
    """The worker's step (tool results in 6 of 8 rollouts), packed as TRL packs it and trained by
    `AsyncMInTRLTrainer.compute_loss`: the loss is the hand-computed regression over policy and judge tokens only
    (policy tokens anchored at their sampled log-probs, judge tokens at kappa), and so are its gradients; the
    regression that would count the tool results' tokens is another number."""
    worker = make_tool_worker(cpu_args)
    samples = [sample for _, sample in train(worker, 1)[0]]
    trainer = make_trainer(tiny_model_path, toy_dataset, async_args(cpu_args), ScriptedWorker(max_staleness=1))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa", dtype=torch.float32)
    batch, _ = collate_through_trl(samples, "fixed")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = sum(trainer.compute_loss(trainer.model, {k: v[r : r + 1] for k, v in batch.items()}) for r in range(2))

    residuals, with_tools = [], []
    for sample in samples:
        current = sequence_log_probs(reference, sample.input_ids)
        judge = torch.as_tensor(sample.metrics.extras["judge_mask"], dtype=torch.bool)
        anchors = torch.where(judge, KAPPA, torch.as_tensor(sample.old_log_probs))
        trained = torch.as_tensor(sample.completion_mask, dtype=torch.bool)
        residuals.append(BETA * (current - anchors)[trained].sum() - sample.advantage)
        completion = torch.arange(len(trained)) >= prompt_length(sample)
        with_tools.append(BETA * (current - anchors)[completion].sum() - sample.advantage)
    expected = torch.stack(residuals).pow(2).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)
    assert abs(torch.stack(with_tools).pow(2).mean().item() - expected.item()) > 1e-3
    loss.backward()
    expected.backward()
    trained_grads = dict(trainer.model.named_parameters())
    for name, param in reference.named_parameters():
        scale = param.grad.abs().max().item()
        torch.testing.assert_close(trained_grads[name].grad, param.grad, rtol=0, atol=1e-5 * scale, msg=name)


def test_an_environment_that_raises_is_counted_and_the_run_goes_on(make_tool_worker, cpu_args):
    """Register 1's reads raise mid-rollout: the error is the tool's result, counted in tools/failure_frequency,
    and the worker goes on to the next step."""
    worker = make_tool_worker(cpu_args, env=FaultyRegisterEnv)
    steps = train(worker, 2)
    for batch in steps:
        assert len(batch) == STEP
        for _, sample in batch[4:]:  # register 1: every rollout called the tool itself
            results = [m["content"] for m in sample.completion if m["role"] == "tool"]
            assert results == [str({"error": "register bus fault"})]
            assert sample.metrics["rewards/FaultyRegisterEnv"] == 0.0
    metrics = drain_metrics(worker)
    while len(metrics) < 2:  # a step's samples reach the buffer before its metrics reach their queue
        metrics.append(worker.metrics_queue.get(timeout=60))
    assert all(m["tools/call_frequency"] == 6 / 8 and m["tools/failure_frequency"] == 4 / 6 for m in metrics)


def test_async_tools_and_environment_owned_data(make_tool_worker, cpu_args):
    """An async tool runs on the worker's own event loop (closed with the worker); rows without a prompt take the
    environment's first observation as theirs (TRL's environment-owned data)."""

    class AsyncRegisterEnv(RegisterEnv):
        def reset(self, **row):
            super().reset(**row)
            return f"Read register a ({row['a']})."

        async def get(self, name: str) -> str:
            """Read a register.

            Args:
                name: The register's name.
            """
            return RegisterEnv.get(self, name)

    worker = make_tool_worker(cpu_args, env=AsyncRegisterEnv, rows=[{"a": 0}, {"a": 1}])
    (batch,) = train(worker, 1)
    for _, sample in batch[4:]:
        assert sample.prompt == [{"role": "user", "content": "Read register a (1)."}]
        assert [m["content"] for m in sample.completion if m["role"] == "tool"] == ["1"]
    assert worker.tools.async_loop is not None


# ---------------------------------------------------------------------------------------------------------------
# the trainer builds the worker with tools; refusals


def test_the_trainer_builds_a_tool_calling_worker_without_a_dataset(tiny_model_path, cpu_args):
    """`environment_factory` and no `train_dataset`: TRL's placeholder rows, the environment's reset supplies the
    prompts; the worker holds the environment's tools, reward column and the model's length; nothing contacts the
    server before training."""
    trainer = AsyncMInTRLTrainer(tiny_model_path, [length_reward], async_args(cpu_args, max_tool_calling_iterations=2),
                                 processing_class=tool_tokenizer(tiny_model_path), judge=tool_judge(),
                                 environment_factory=RegisterEnv)  # fmt: skip
    worker = trainer.rollout_worker
    try:
        assert worker.tools is not None and worker.settings.max_tool_calling_iterations == 2
        assert worker.reward_func_names == ["length_reward", "RegisterEnv"] and worker.reward_weights.tolist() == [
            1,
            1,
        ]
        assert worker.tools.max_model_len == trainer.model.config.max_position_embeddings
        assert [tool.__name__ for tool in worker.tools.env_tools[None]] == ["get"]
        assert len(worker.dataset) == 4 and worker.dataset[0]["prompt"] == [{"role": "user", "content": ""}]
    finally:
        worker.stop()


def test_max_tool_calling_iterations_is_no_longer_refused(cpu_args):
    assert AsyncMInTRLConfig(**cpu_args, max_tool_calling_iterations=2).max_tool_calling_iterations == 2


@pytest.mark.parametrize(
    "case, message",
    [
        ({"environment_factory": RegisterEnv, "rollout_worker": "worker"},
         r"^environment_factory= is for the rollout worker the trainer builds"),
        ({"train_dataset": None}, r"`train_dataset` is required unless an `environment_factory` is provided"),
        ({"train_dataset": None, "environment_factory": {"r": RegisterEnv}},
         r"A `dict` `environment_factory` \(multiple environments\) requires a `train_dataset`"),
        ({"train_dataset": None, "environment_factory": RegisterEnv, "max_steps": -1},
         r"`max_steps` must be set to a positive value"),
    ],
)  # fmt: skip
def test_trainer_refusals_before_the_model_loads(cpu_args, toy_dataset, case, message):
    case = dict(case)
    args = async_args(cpu_args, max_steps=case.pop("max_steps", 2))
    kwargs = {"train_dataset": toy_dataset, "judge": revise_first_step_judge(), **case}
    if kwargs.get("rollout_worker") == "worker":
        kwargs["rollout_worker"], kwargs["judge"] = ScriptedWorker(1), None
    with pytest.raises(ValueError, match=message):
        AsyncMInTRLTrainer("no/such-model", args=args, **kwargs)


class NoReset:
    def get(self, name: str) -> str:
        """Read.

        Args:
            name: A name.
        """
        return name


class NoReward:
    def reset(self, **row):
        pass


@pytest.mark.parametrize(
    "case, message",
    [
        ({"env": NoReset}, "must define a callable `reset`"),
        ({"env": NoReward, "reward_funcs": []}, "^No reward source provided"),
        ({"template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}, "does not support tool calling"),
        ({"env": {"r": RegisterEnv}}, r"Example has `environment=None`, which is not among"),
    ],
)
def test_worker_refusals(tiny_model_path, cpu_args, case, message):
    tokenizer = tool_tokenizer(tiny_model_path)
    tokenizer.chat_template = case.get("template", tokenizer.chat_template)
    worker = None
    with pytest.raises(ValueError, match=message):
        worker = MInTRLRolloutWorker(worker_args(cpu_args, **SETTINGS), tokenizer, Dataset.from_list(register_rows()),
                                     case.get("reward_funcs", [length_reward]), tool_judge(), ScriptedToolLM(tokenizer),
                                     environment_factory=case.get("env", RegisterEnv), max_model_len=4096)  # fmt: skip
        worker._trajectories(register_rows(), [True, True])  # a dict factory needs the `environment` column


def test_trains_end_to_end_on_the_tool_calling_worker(make_tool_worker, tiny_model_path, cpu_args, toy_dataset):
    """Two optimizer steps of `AsyncMInTRLTrainer` on the worker: the collator lays out the judge mask beside the
    tool-result-free completion mask, the loss trains, and the worker's tool metrics reach the logs."""
    worker = make_tool_worker(cpu_args)
    args = async_args(cpu_args, per_device_train_batch_size=STEP, max_steps=2)
    trainer = make_trainer(tiny_model_path, toy_dataset, args, worker)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(np.isfinite(entry["loss"]) for entry in logs)
    assert all(entry["tools/call_frequency"] == 6 / 8 for entry in logs)
    assert all(entry["mintrl/judge_token_frac"] > 0 for entry in logs)
