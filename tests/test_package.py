"""The top-level package: its public names load lazily (so `trl-mintrl --help` stays fast), yet `dir()` lists them
for tab completion and IDEs."""

from __future__ import annotations

import json
import subprocess
import sys

import trl_mintrl


def test_dir_lists_the_lazily_loaded_names_without_loading_them():
    """In a fresh interpreter, `dir(trl_mintrl)` names every public name before any of them (or TRL) is imported."""
    code = "import json, sys, trl_mintrl; print(json.dumps([dir(trl_mintrl), 'trl' in sys.modules]))"
    names, trl_loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                  check=True).stdout)  # fmt: skip
    assert set(trl_mintrl.__all__) <= set(names) and "MInTRLTrainer" in names
    assert names == sorted(names) and "__version__" in names
    assert not trl_loaded


def test_every_listed_name_resolves():
    for name in trl_mintrl.__all__:
        assert getattr(trl_mintrl, name) is not None, name
