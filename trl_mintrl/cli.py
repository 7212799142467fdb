"""`trl-mintrl` command line: `train`, `eval`, `tiny-model`, `env`, `--version`. Also `python -m trl_mintrl.cli`.

Each sub-command lives in its own module and parses its own arguments (`train` goes through TRL's `TrlParser`),
so this file only dispatches; heavy imports happen after the sub-command is chosen.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> (module, function taking argv, one-line help)
COMMANDS = {
    "train": ("trl_mintrl.train", "main", "train with GRPO, MInTRL or SORT from a TRL-style YAML recipe"),
    "eval": ("trl_mintrl.eval", "main", "pass@k evaluation of a model on math/code benchmarks"),
    "tiny-model": ("trl_mintrl.cli", "tiny_model_main", "build the offline tiny model + tokenizer used by tests"),
    "env": ("trl_mintrl.cli", "env_main", "print the versions and devices to paste into a bug report"),
}

# distributions reported by `trl-mintrl env`, in the order of `trl env`
_ENV_PACKAGES = (
    "trl",
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "peft",
    "deepspeed",
    "vllm",
    "math-verify",
    "openai",
)


def tiny_model_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="trl-mintrl tiny-model", description="Build an offline tiny causal LM.")
    parser.add_argument("out_dir", help="folder to write the model and tokenizer to")
    parser.add_argument("--hidden-size", type=int, default=192, help="multiple of 32 (head_dim is 32)")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=576)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from .tiny import build_tiny_model

    path = build_tiny_model(
        args.out_dir,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        seed=args.seed,
    )
    print(f"tiny model written to {path}")


def environment_report() -> str:
    """Versions of trl-mintrl, Python, the packages it runs on, and the devices torch sees (like `trl env`)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    lines = [
        f"- trl-mintrl version: {__version__}",
        f"- Platform: {platform.platform()}",
        f"- Python version: {platform.python_version()}",
    ]
    for name in _ENV_PACKAGES:
        try:
            lines.append(f"- {name} version: {version(name)}")
        except PackageNotFoundError:
            lines.append(f"- {name} version: not installed")
    import torch

    if torch.cuda.is_available():
        devices = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        lines.append(f"- accelerator(s): {devices} (CUDA {torch.version.cuda})")
    else:
        lines.append(f"- accelerator(s): cpu ({torch.get_num_threads()} torch threads)")
    return "\n".join(lines)


def env_main(argv: list[str]) -> None:
    argparse.ArgumentParser(prog="trl-mintrl env", description="Print versions for a bug report.").parse_args(argv)
    print("\nCopy-paste the following information when reporting an issue:\n")
    print(environment_report())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        from . import __version__

        print(f"trl-mintrl {__version__}")
        return
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items())
        message = f"usage: trl-mintrl [--version] {{{','.join(COMMANDS)}}} [args...]\n\ncommands:\n{lines}\n"
        if argv and argv[0] not in ("-h", "--help"):
            sys.exit(f"{message}\ntrl-mintrl: error: unknown command {argv[0]!r}")
        print(message)
        return
    module, function, _ = COMMANDS[argv[0]]
    getattr(importlib.import_module(module), function)(argv[1:])


if __name__ == "__main__":
    main()
