"""The toy's trainers as the cost study measures them: a method's trainer on the reachable regime's problems or on
the tool task, from the committed warm start, with learning rate 0 (so that every variant samples from the same
weights at every step) and a dataset of fixed length (so that step k's prompts do not depend on how many steps run)."""

from __future__ import annotations

from .task import make_dataset, make_problems
from .training import RL_MAX_OPS, RL_MIN_OPS, build_trainer, rl_config
from .warm_start import WARM_START_DIR

DATASET_STEPS = 64  # prompts for this many steps: more than any run here takes


def warm_start_model(tools: str | None = None):
    """(tokenizer, model) of the toy's warm start; with `tools`, the tool task's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .warm_start_tools_build import WARM_START_TOOLS_DIR

    warm_start = WARM_START_TOOLS_DIR if tools else WARM_START_DIR
    return AutoTokenizer.from_pretrained(warm_start), AutoModelForCausalLM.from_pretrained(warm_start)


def toy_trainer(method: str, overrides: dict, model, tokenizer, steps: int, output_dir: str, tools: str | None = None):
    """`method`'s trainer (config `overrides`) at learning rate 0 on the reachable regime's problems with the rule
    judge (or the policy as its own judge: `judge="self"`); with `tools` (a regime of the tool task), on the tool task
    (its environment, reward and rule judge, whose corrections are tool calls)."""
    # a fixed size: the sampler shuffles with a permutation of the dataset's length, so a length that followed
    # `steps` gave each --rounds other prompts at every step (a --rounds 8 run and a --rounds 6 one once disagreed so)
    size = 16 * max(steps, DATASET_STEPS)
    if tools:
        from .tool_judge import tool_judge
        from .tool_task import TOOL_FIELDS, RegisterEnv, make_tool_dataset, tool_reward

        train = make_tool_dataset(size, seed=7, regime=tools)
        args = rl_config(method, output_dir, steps=steps, learning_rate=0.0, regime="in-band", **TOOL_FIELDS,
                         **overrides)  # fmt: skip
        return build_trainer(method, model, tokenizer, train, args, judge=tool_judge(), reward=tool_reward,
                             environment_factory=RegisterEnv)  # fmt: skip
    train = make_dataset(size, RL_MIN_OPS, RL_MAX_OPS, seed=7)
    args = rl_config(method, output_dir, steps=steps, learning_rate=0.0, **overrides)
    judge = None if overrides.get("judge") == "self" else "rule"
    return build_trainer(method, model, tokenizer, train, args, judge=judge)


def fill_repair_buffer(trainer, items: int) -> None:
    """Put `items` reachable-regime problems with their solutions in a SORT trainer's repair buffer, so that it repairs
    at every step."""
    for problem in make_problems(items, RL_MIN_OPS, RL_MAX_OPS, seed=8):
        row = problem.row()
        trainer.repair.buffer.add(row["prompt"], row["solution"])
