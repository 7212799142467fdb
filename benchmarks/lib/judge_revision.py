"""`EndpointJudge` as it was at an earlier git revision, imported beside the current package: the judge studies'
`--before REV` measures the old client against this checkout's on the same server."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root


def load_judge_class(rev: str):
    """EndpointJudge as it was at git revision `rev`, imported beside the current package."""
    source = subprocess.run(
        ["git", "show", f"{rev}:trl_mintrl/judges/endpoint.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "endpoint_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("trl_mintrl.judges.endpoint_before", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EndpointJudge
