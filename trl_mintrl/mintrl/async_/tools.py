"""TRL's `tools=` and `environment_factory=` in the asynchronous rollout worker, which has no `GRPOTrainer`.

`MInTRLTrainer` runs the tools inside its rollout through the per-row tool dicts and environments TRL's
`GRPOTrainer` builds for each batch (`mintrl/tools.py`). The asynchronous trainer's rollout worker writes its
rollouts on its own thread, so, as TRL's asynchronous trainer does for its own worker, the tools and environments
are built in the worker from what the trainer was given: `WorkerTools` sets them up as `GRPOTrainer.__init__`
does (one probed instance of each environment, whose public methods become tools and whose `get_reward` becomes a
reward column named after its class; the response schema for parsing tool calls; TRL's prefix-preserving training
chat template when the tokenizer's is not), and for each optimizer step's batch as `GRPOTrainer` does for a
generation batch (one pooled environment per rollout, `reset(**row)` with its observation added to the last prompt
message, the rollout's sync and async tool dicts). Each rollout gets a `WorkerToolEnvironment`: the same
`ToolEnvironment` the synchronous trainer's rollout gets, so the same state machine runs the tools, with TRL's
parser (`parse_response`), TRL's tool-call semantics (`run_tool_calls`) and TRL's tool-result tokens
(`GRPOTrainer._get_tool_suffix_ids`, through `trl_mintrl.chat_templating.TrlTemplating`, which also renders the prompts with their tool
schemas as `GRPOTrainer._tokenize_prompts` does).

Async tools and an async `get_reward` run on an event loop the worker owns (`open()` / `close()`), as TRL's
`GRPOTrainer` runs them on its daemon loop.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from collections.abc import Callable

from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
    supports_tool_calling,
)
from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

from ...chat_templating import TrlTemplating
from ..tools import run_tool_calls

EMPTY_PROMPT = [{"role": "user", "content": ""}]  # TRL's prompt of a row without one (the environment owns the data)


def tool_methods(environment) -> list[Callable]:
    """An environment instance's tools, as TRL lists them: its class's public functions but `reset` and
    `get_reward`, bound to it (listed on the class: `getmembers` on the instance would evaluate properties)."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def with_observation(prompt: list[dict], observation) -> list[dict]:
    """`prompt` with an environment's first observation added to its last message, as `GRPOTrainer` and TRL's async
    worker do (a new list: the dataset row is shared by a group's rollouts)."""
    if observation is None:
        return prompt
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return prompt[:-1] + [{**prompt[-1], "content": content + observation}]


class WorkerToolEnvironment:
    """One rollout's `ToolEnvironment` in the worker: its tool schemas and tool dicts, TRL's parser and result
    tokens."""

    def __init__(self, owner: WorkerTools, schemas: list, sync_tools: dict, async_tools: dict, environment=None):
        self.owner = owner
        self.schemas = schemas
        self.sync_tools = sync_tools
        self.async_tools = async_tools
        self.environment = environment  # the instance whose methods are tools (None: `tools=` only)
        self.max_model_len = owner.max_model_len

    def parse_turn(self, turn_ids: list[int], context_ids: list[int]) -> dict:
        return parse_response(self.owner.tokenizer, turn_ids, prefix=context_ids, tools=self.schemas)

    def run(self, tool_calls: list[dict]) -> tuple[list[dict], int]:
        return run_tool_calls(tool_calls, self.sync_tools, self.async_tools, self.owner.async_loop)

    def result_ids(self, tool_messages: list[dict]) -> list[int]:
        return self.owner.templating.tool_suffix_ids(tool_messages)


class WorkerTools:
    """TRL's tools and environments for the rollout worker (see the module's docstring).

    Args:
        tokenizer: the policy's tokenizer; TRL's response schema is set on it for parsing tool calls.
        tools: standalone tool functions (sync or async), shown in every prompt.
        environment_factory: a callable making one environment, or `{name: callable}` with an `environment` column.
        chat_template_kwargs: the config's, as TRL renders prompts and tool results with them.
        max_model_len: the sequence length (prompt and completion) a rollout may reach: a tool result that would
            reach it ends the rollout (TRL's rule).
    """

    def __init__(self, tokenizer, tools, environment_factory, chat_template_kwargs: dict, max_model_len: int):
        if not supports_tool_calling(tokenizer):  # GRPOTrainer's check
            raise ValueError(
                "The provided chat template does not support tool calling. The template must be able to render a "
                "full tool-calling conversation (user -> assistant with tool_calls -> tool)."
            )
        tools = list(tools or [])
        self.standalone_tools = tools
        self.multi_environment = isinstance(environment_factory, dict)
        if environment_factory is None:
            self.factories = None
        else:
            self.factories = environment_factory if self.multi_environment else {None: environment_factory}
        self.env_tools: dict = {None: tools}  # environment name -> the tools its prompts show
        self.pool: dict = {}  # environment name -> reusable instances (construct once, reset often)
        self.reward_types: list[type] = []  # environment classes that own a reward (`get_reward`): a column each
        all_tools = list(tools)
        if self.factories is not None:
            for name, factory in self.factories.items():
                instance = factory()
                members = dict(inspect.getmembers(type(instance), predicate=inspect.isfunction))
                if "reset" not in members:
                    raise ValueError(
                        "Each environment instance returned by `environment_factory` must define a callable `reset`."
                    )
                methods = tool_methods(instance)
                self.env_tools[name] = tools + methods
                self.pool[name] = [instance]
                all_tools += [m for m in methods if m not in all_tools]
                if "get_reward" in members and type(instance) not in self.reward_types:
                    self.reward_types.append(type(instance))
        self.reward_names = [env_type.__name__ for env_type in self.reward_types]
        self.needs_loop = any(inspect.iscoroutinefunction(f) for f in all_tools) or any(
            inspect.iscoroutinefunction(t.get_reward) for t in self.reward_types
        )
        self.tokenizer = tokenizer
        has_template = getattr(tokenizer, "response_template", None) is not None
        if not has_template and getattr(tokenizer, "response_schema", None) is None:
            add_response_schema(tokenizer)  # as GRPOTrainer.__init__ (on the same object)
        prefix_preserving = is_chat_template_prefix_preserving(tokenizer)
        self.chat_template = None if prefix_preserving else get_training_chat_template(tokenizer)
        self.templating = TrlTemplating(tokenizer, tokenizer, self.chat_template, chat_template_kwargs)
        self.max_model_len = max_model_len
        self.async_loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    @classmethod
    def of(cls, tokenizer, args, tools, environment_factory, max_model_len: int | None) -> WorkerTools | None:
        """The worker's tools, or None without `tools` and `environment_factory`; `args`' chat-template arguments;
        no `max_model_len`: no limit but the completion budget."""
        if not tools and environment_factory is None:
            return None
        chat_template_kwargs = getattr(args, "chat_template_kwargs", None) or {}
        length = sys.maxsize if max_model_len is None else max_model_len
        return cls(tokenizer, tools, environment_factory, chat_template_kwargs, length)

    # ----- the worker's lifetime -----
    def open(self) -> None:
        """Start the event loop of async tools and rewards, if any (from the worker's `start()`)."""
        if self.needs_loop and self.async_loop is None:
            self._loop_thread, self.async_loop, ready = start_event_loop_in_daemon(name="mintrl-async-tools")
            ready.wait()

    def close(self) -> None:
        shutdown_event_loop_in_daemon(self._loop_thread, self.async_loop)
        self._loop_thread = self.async_loop = None

    # ----- one batch -----
    def rollouts(self, rows: list[dict]) -> tuple[list, list[WorkerToolEnvironment], list]:
        """Per rollout (one per row): its prompt (the environment's first observation added), its
        `ToolEnvironment`, and its environment instance (None without environments), drawn from the pool (which
        grows only when a batch needs more instances than it holds) and reset with the row, as `GRPOTrainer` does
        for a generation batch."""
        names = [row.get("environment") if self.multi_environment else None for row in rows]
        if self.multi_environment:
            for name in set(names):
                if name not in self.factories:
                    raise ValueError(
                        f"Example has `environment={name!r}`, which is not among the environments passed to "
                        f"`environment_factory`. Expected one of: {list(self.factories)}."
                    )
        prompts, environments, instances = [], [], []
        handed_out: dict = {}
        for row, name in zip(rows, names, strict=True):
            prompt = row.get("prompt", EMPTY_PROMPT) if self.factories is not None else row["prompt"]
            instance = None
            if self.factories is not None:
                pool, index = self.pool[name], handed_out.get(name, 0)
                if index == len(pool):
                    pool.append(self.factories[name]())
                handed_out[name] = index + 1
                instance = pool[index]
                reset_kwargs = {k: v for k, v in row.items() if k != "environment"} if self.multi_environment else row
                prompt = with_observation(prompt, instance.reset(**reset_kwargs))
            sync_tools, async_tools = {}, {}
            for tool in self.standalone_tools + ([] if instance is None else tool_methods(instance)):
                (async_tools if inspect.iscoroutinefunction(tool) else sync_tools)[tool.__name__] = tool
            prompts.append(prompt)
            environments.append(WorkerToolEnvironment(self, self.env_tools[name], sync_tools, async_tools, instance))
            instances.append(instance)
        return prompts, environments, instances

    def prompt_ids(self, prompt, environment: WorkerToolEnvironment) -> list[int]:
        """A prompt's tokens with its tool schemas, as `GRPOTrainer._tokenize_prompts` renders it."""
        return self.templating.prompt_ids([prompt], environment.schemas)[0]

    def environment_rewards(self, instances: list) -> list[list[float | None]]:
        """One column per environment class that owns a reward: `get_reward()` of the rollouts whose environment
        is exactly that class, None for the others (TRL's rule)."""
        columns = []
        for env_type in self.reward_types:
            column = []
            for instance in instances:
                if type(instance) is not env_type:
                    column.append(None)
                elif inspect.iscoroutinefunction(instance.get_reward):
                    column.append(asyncio.run_coroutine_threadsafe(instance.get_reward(), self.async_loop).result())
                else:
                    column.append(instance.get_reward())
            columns.append(column)
        return columns
