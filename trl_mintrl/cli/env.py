"""`trl-mintrl env`: versions of the package, Python, its dependencies and the devices torch sees (like `trl env`)."""

from __future__ import annotations

import argparse

# distributions reported, in the order of `trl env`
PACKAGES = ("trl", "torch", "transformers", "accelerate", "datasets", "peft", "deepspeed", "vllm", "math-verify")


def environment_report() -> str:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from .._version import __version__

    lines = [
        f"- trl-mintrl version: {__version__}",
        f"- Platform: {platform.platform()}",
        f"- Python version: {platform.python_version()}",
    ]
    for name in PACKAGES:
        try:
            lines.append(f"- {name} version: {version(name)}")
        except PackageNotFoundError:
            lines.append(f"- {name} version: not installed")
    if torch.cuda.is_available():
        devices = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        lines.append(f"- accelerator(s): {devices} (CUDA {torch.version.cuda})")
    else:
        lines.append(f"- accelerator(s): cpu ({torch.get_num_threads()} torch threads)")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    argparse.ArgumentParser(prog="trl-mintrl env", description="Print versions for a bug report.").parse_args(argv)
    print("\nCopy-paste the following information when reporting an issue:\n")
    print(environment_report())
