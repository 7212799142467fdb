"""What every results file records so that a reader can rerun it: the command, the commit, and whether the files
the results depend on differed from that commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.rstrip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def provenance(script: str, argv: list[str]) -> dict:
    """`command`, `commit`, `dirty` (any change in the checkout) and `changed_files_that_matter` (changed files under
    benchmarks/ or trl_mintrl/, results excluded)."""
    changed = _git("status", "--porcelain", "--", "benchmarks", "trl_mintrl", "pyproject.toml")
    return {
        "command": " ".join(["python", script, *argv]),
        "commit": _git("rev-parse", "HEAD").strip() or "unknown",
        "dirty": bool(_git("status", "--porcelain")),
        "changed_files_that_matter": [line[3:] for line in changed.splitlines() if "benchmarks/results" not in line],
    }
