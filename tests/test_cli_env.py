"""`trl-mintrl --version` and `trl-mintrl env`: what a user pastes into a bug report."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import trl_mintrl


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trl_mintrl.cli", *args], capture_output=True, text=True, timeout=120, check=True
    )


def test_version_flag_prints_the_package_version():
    assert _run("--version").stdout.strip() == f"trl-mintrl {trl_mintrl.__version__}"


def test_env_lists_installed_versions_and_missing_packages():
    out = _run("env").stdout
    assert f"- trl-mintrl version: {trl_mintrl.__version__}" in out
    assert f"- trl version: {version('trl')}" in out
    assert f"- torch version: {version('torch')}" in out
    assert f"- transformers version: {version('transformers')}" in out
    assert "- accelerator(s): cpu" in out  # no GPU on this machine
    try:
        version("vllm")
    except Exception:
        assert "- vllm version: not installed" in out


def test_help_names_every_command():
    out = _run("--help").stdout
    for command in ("train", "eval", "tiny-model", "env", "--version"):
        assert command in out
