"""Tool calling in MInTRL's rollout: TRL's `tools=` and `environment_factory=` behind one small interface.

Design: the tools run inside MInTRL's rollout state machine (rollout.py), not in TRL's `_tool_call_loop`. TRL runs
its tool loop after any `rollout_func`, on the finished completions; there it would execute tool calls of turns the
judge had not reviewed yet and generate the next turns without interventions. So a turn's tool calls run as soon
as the turn is accepted, inside the intervention loop, and `MInTRLTrainer._tool_call_loop` hands TRL back what the
rollout recorded (the policy-token mask, the conversation's messages, the call and failure counts) instead of
running the tools again. Everything a `GRPOTrainer` user relies on stays TRL's: the per-row tools and
environments (`_sync_tool_dicts`, `_async_tool_dicts`, built with `reset(**row)` before the rollout), turn parsing
(`parse_response`), the tokens of tool results (`_get_tool_suffix_ids`), `get_reward`, and the `tools/*` metrics.

The rollout sees a `ToolEnvironment` per trajectory, so it stays engine-agnostic and testable with a scripted tool;
`TRLToolEnvironment` is the one `MInTRLTrainer` builds for each row of its batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from trl.chat_template_utils import parse_response

from ..input_checks import context_length


class ToolEnvironment(Protocol):
    """What the rollout needs from one trajectory's tools."""

    max_model_len: int  # a result that would make prompt + completion this long ends the rollout (TRL's rule)

    def parse_turn(self, turn_ids: list[int], context_ids: list[int]) -> dict:
        """The assistant message of a finished turn (`tool_calls` when it calls tools); `context_ids` are the
        tokens before it (prompt and earlier turns)."""

    def run(self, tool_calls: list[dict]) -> tuple[list[dict], int]:
        """The turn's tool messages (`{"role": "tool", "name", "content"}`) and how many calls failed."""

    def result_ids(self, tool_messages: list[dict]) -> list[int]:
        """The tokens that follow the turn: the tool results and the next assistant turn's header."""


def run_tool_calls(
    tool_calls: list[dict],
    sync_tools: dict[str, Callable],
    async_tools: dict[str, Callable],
    async_loop: asyncio.AbstractEventLoop | None,
) -> tuple[list[dict], int]:
    """One turn's tool calls with the semantics of TRL 1.16's `_tool_call_loop`: synchronous results in call order,
    then the asynchronous ones (gathered on TRL's event loop); an unknown tool, an unsupported call type or a tool
    that raises gives `{"error": ...}` as its result and counts as a failure, and the rollout goes on."""
    results, coroutines, failures = [], [], 0
    for call in tool_calls:
        if call["type"] != "function":
            failures += 1
            results.append((call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call['type']}"}))
            continue
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        try:
            if name in sync_tools:
                results.append((name, sync_tools[name](**arguments)))
            elif name in async_tools:
                coroutines.append((name, async_tools[name](**arguments)))
            else:
                raise ValueError(f"Tool {name} not found.")
        except Exception as err:  # a tool's error is its result, as in TRL
            failures += 1
            results.append((name, {"error": str(err)}))
    if coroutines:

        async def gather():
            return await asyncio.gather(*(c for _, c in coroutines), return_exceptions=True)

        for (name, _), result in zip(coroutines, asyncio.run_coroutine_threadsafe(gather(), async_loop).result()):
            failures += isinstance(result, Exception)
            results.append((name, {"error": str(result)} if isinstance(result, Exception) else result))
    return [tool_message(name, result) for name, result in results], failures


def tool_message(name: str, result) -> dict:
    """A tool result as TRL's message. Results with images are refused: the regression's forward pass has no place
    for images that arrive during the rollout."""
    if isinstance(result, list):
        if any(isinstance(part, dict) and part.get("type") == "image" for part in result):
            raise ValueError(
                f"tool {name!r} returned an image: MInTRLTrainer does not take images in tool results yet. Return "
                "text from the tool, or train it with GRPOTrainer."
            )
        return {"role": "tool", "name": name, "content": result}
    return {"role": "tool", "name": name, "content": str(result)}


class TRLToolEnvironment:
    """Row `row` of a `GRPOTrainer` batch with tools: its tool dicts and tool schemas, as TRL built them for the
    batch (`_sync_tool_dicts`, `_async_tool_dicts`, `_env_tools`), and TRL's tool-result tokens."""

    def __init__(self, trainer, row: int):
        self.trainer = trainer
        self.row = row
        environments = trainer.environment_factories
        self.schemas = trainer.tools if environments is None else trainer._env_tools[trainer._batch_environments[row]]
        self.max_model_len = model_length(trainer)

    def parse_turn(self, turn_ids: list[int], context_ids: list[int]) -> dict:
        return parse_response(self.trainer._tokenizer, turn_ids, prefix=context_ids, tools=self.schemas)

    def run(self, tool_calls: list[dict]) -> tuple[list[dict], int]:
        trainer = self.trainer
        return run_tool_calls(
            tool_calls,
            trainer._sync_tool_dicts[self.row],
            trainer._async_tool_dicts[self.row],
            getattr(trainer, "async_loop", None),
        )

    def result_ids(self, tool_messages: list[dict]) -> list[int]:
        return list(self.trainer._get_tool_suffix_ids(tool_messages))


def model_length(trainer) -> int:
    """The sequence length (prompt and completion) a tool-calling rollout may reach, as TRL's `_tool_call_loop`
    takes it: the colocated vLLM engine's `max_model_len`; otherwise the model's positions, or
    `vllm_max_model_length` when it is smaller (TRL does not read a server's `--max-model-len`: set
    `vllm_max_model_length` to it)."""
    if trainer.use_vllm and trainer.vllm_generation.mode == "colocate":
        return trainer.vllm_generation.llm.llm_engine.model_config.max_model_len
    return context_length(trainer.model.config, trainer.args)


def check_tool_processing_class(trainer) -> None:
    """After TRL has loaded the processing class: a vision-language processor with tools is refused (tool results
    with images have no place in MInTRL's rollout)."""
    if trainer.tools and trainer._is_vlm:
        raise ValueError(
            "processing_class is a vision-language processor and tools are set: MInTRLTrainer does not take images "
            "in tool results or prompts with tools yet. Use a text model, or train it with GRPOTrainer."
        )
