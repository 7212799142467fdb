"""`trl-mintrl train ... --accelerate_config NAME|PATH --num_processes N`: launch through accelerate, as `trl grpo`.

The launcher flags are taken out of the command line; the rest is the training command, which accelerate's own
launcher runs as `-m trl_mintrl.cli train ...` in every process. A NAME is looked up among the configs shipped in
this package (`trl_mintrl/accelerate_configs`, linked from `recipes/accelerate`), then among TRL's.
"""

from __future__ import annotations

import importlib.resources as resources
from pathlib import Path

# accelerate launch flags accepted on the `train` command line (value-taking); none is a training config field
LAUNCH_FLAGS = (
    "--accelerate_config",
    "--num_processes",
    "--num_machines",
    "--machine_rank",
    "--main_process_ip",
    "--main_process_port",
    "--gpu_ids",
    "--rdzv_backend",
)


def split_launch_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(launcher flags with their values, the training arguments), for `--flag value` and `--flag=value`."""
    launch, rest, i = [], [], 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag in LAUNCH_FLAGS:
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise SystemExit(f"trl-mintrl train: error: {flag} needs a value")
                value, i = argv[i + 1], i + 1
            launch += [flag, value]
        else:
            rest.append(argv[i])
        i += 1
    return launch, rest


def shipped_configs() -> dict[str, Path]:
    """Config name -> file, ours first, then TRL's (zero1, fsdp1, ...)."""
    found = {}
    for package in ("trl.accelerate_configs", "trl_mintrl.accelerate_configs"):
        try:
            folder = resources.files(package)
        except ModuleNotFoundError:
            continue
        found.update(
            {Path(entry.name).stem: Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".yaml")}
        )
    return found


def resolve_accelerate_config(name_or_path: str) -> Path:
    if Path(name_or_path).is_file():
        return Path(name_or_path)
    configs = shipped_configs()
    if name_or_path not in configs:
        raise SystemExit(
            f"trl-mintrl train: error: --accelerate_config {name_or_path!r} is neither a file nor a shipped config "
            f"({', '.join(sorted(configs))})"
        )
    return configs[name_or_path]


def launch_training(launch: list[str], train_argv: list[str]) -> None:
    """Run `accelerate launch [--config_file F] [flags] -m trl_mintrl.cli train TRAIN_ARGV` in this process."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = []
    for flag, value in zip(launch[::2], launch[1::2], strict=True):
        args += (
            ["--config_file", str(resolve_accelerate_config(value))]
            if flag == "--accelerate_config"
            else [flag, value]
        )
    launch_command(launch_command_parser().parse_args([*args, "-m", "trl_mintrl.cli", "train", *train_argv]))
