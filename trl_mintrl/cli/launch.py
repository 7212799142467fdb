"""`trl-mintrl train ... --accelerate_config NAME|PATH --num_processes N`: launch through accelerate, as `trl grpo`.

The launcher flags are taken out of the command line; the rest is the training command, which accelerate's own
launcher runs as `-m trl_mintrl.cli train ...` in every process. A NAME is looked up among the configs shipped in
this package (`trl_mintrl/accelerate_configs`, linked from `recipes/accelerate`), then among TRL's.
"""

from __future__ import annotations

import importlib.resources as resources
import os
import shlex
import subprocess
import sys
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
    "--num_cpu_threads_per_process",
)


# the launcher flags, for the model card's command: each process accelerate starts sees only the training arguments
LAUNCH_FLAGS_ENV = "TRL_MINTRL_LAUNCH_FLAGS"


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


def accelerate_launch_args(launch: list[str]) -> list[str]:
    """The launcher flags as `accelerate launch` takes them. On CPU, without OMP_NUM_THREADS or
    `--num_cpu_threads_per_process`, the threads per process accelerate would pick (physical cores / processes) are
    passed explicitly, which keeps its notice that it set them out of every run."""
    import psutil
    import yaml

    args, config = [], {}
    for flag, value in zip(launch[::2], launch[1::2], strict=True):
        if flag == "--accelerate_config":
            path = resolve_accelerate_config(value)
            config = yaml.safe_load(path.read_text()) or {}
            args += ["--config_file", str(path)]
        else:
            args += [flag, value]
    if config.get("use_cpu") and "OMP_NUM_THREADS" not in os.environ and "--num_cpu_threads_per_process" not in args:
        processes = int(args[args.index("--num_processes") + 1]) if "--num_processes" in args else None
        processes = processes or config.get("num_processes") or 1
        threads = max(1, (psutil.cpu_count(logical=False) or 1) // processes)
        args += ["--num_cpu_threads_per_process", str(threads)]
    return args


def launched_with() -> list[str]:
    """`--accelerate_config NAME --num_processes N ...` when `trl-mintrl train` relaunched itself through accelerate
    (`launch_training`), so that the card's command is the one the user typed."""
    return shlex.split(os.environ.get(LAUNCH_FLAGS_ENV, ""))


def launch_training(launch: list[str], train_argv: list[str]) -> None:
    """Run `accelerate launch [--config_file F] [flags] -m trl_mintrl.cli train TRAIN_ARGV` in this process. When
    the training fails in a launched process, that process has printed its error already: exit with its exit code,
    without the launcher's tracebacks (accelerate raises `CalledProcessError` for one process, torchrun's
    `ChildFailedError` for several)."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = accelerate_launch_args(launch)
    os.environ[LAUNCH_FLAGS_ENV] = shlex.join(launch)  # accelerate passes this process's environment on
    try:
        launch_command(launch_command_parser().parse_args([*args, "-m", "trl_mintrl.cli", "train", *train_argv]))
    except subprocess.CalledProcessError as error:
        sys.exit(exit_status(error.returncode))
    except Exception as error:
        failures = getattr(error, "failures", None)  # torchrun's ChildFailedError: rank -> ProcessFailure
        if not isinstance(failures, dict) or not failures:
            raise
        codes = [exit_status(failure.exitcode) for _, failure in sorted(failures.items())]
        sys.exit(next((code for code in codes if code), 1))


def exit_status(returncode: int) -> int:
    """A child's exit code as a shell reports it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
