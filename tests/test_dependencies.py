"""Every third-party module the package imports is declared in pyproject.toml, and the package imports with nothing
but its declared base dependencies installed.

A module imported at module level must come from a base dependency; one imported inside a function (an optional
backend: vLLM, the `openai` client) may come from an extra, whose absence gives a clear error naming it. The second
test imports every module of `trl_mintrl` in an interpreter that sees only the distributions the base dependencies
bring (a folder of links to exactly those, `python -S`), as a fresh `pip install trl-mintrl` would have them, so a
package another extra or a leftover environment happens to install cannot hide a missing declaration.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "trl_mintrl"
# modules that come through a named requirement's extra and are not installed in the test environment
THROUGH_EXTRAS = {"vllm": "trl[vllm]"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements() -> tuple[list[Requirement], dict[str, list[Requirement]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}
    return [Requirement(r) for r in project["dependencies"]], extras


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(top-level module, line, at module level) of every absolute import in `path`; an import inside a function,
    or guarded by `except ImportError`, is not at module level."""
    tree = ast.parse(path.read_text())
    deferred: set[int] = set()
    for node in ast.walk(tree):
        guarded = isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        )
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or guarded:
            deferred |= {id(inner) for inner in ast.walk(node) if inner is not node}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top != "trl_mintrl":
                found.append((top, node.lineno, id(node) not in deferred))
    return found


@functools.cache
def installed_modules() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions that provide it (one scan of the environment: a scan per
    import made the check take a minute)."""
    return metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    installed = installed_modules().get(module)
    if installed:
        return {canonical(d) for d in installed}
    if module in THROUGH_EXTRAS:
        return {canonical(Requirement(THROUGH_EXTRAS[module]).name)}
    raise AssertionError(f"no installed distribution provides the module {module!r}, and none is known to bring it")


def undeclared_imports(base: list[Requirement], extras: dict[str, list[Requirement]]) -> list[str]:
    """Problems as lines: an import whose distribution pyproject.toml does not name, or names only in an extra while
    the import runs at module level."""
    base_names = {canonical(r.name) for r in base}
    extra_names = {canonical(r.name) for reqs in extras.values() for r in reqs}
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for module, line, module_level in imports_of(path):
            dists = distributions_of(module)
            where = f"{path.relative_to(REPO)}:{line} imports {module} ({', '.join(sorted(dists))})"
            if dists & base_names:
                continue
            if not dists & extra_names:
                problems.append(f"{where}: named nowhere in pyproject.toml")
            elif module_level:
                problems.append(f"{where} at module level, but it is only in an extra: import it where it is used")
    return problems


def test_every_third_party_import_is_declared():
    base, extras = declared_requirements()
    problems = undeclared_imports(base, extras)
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_dropped_or_misplaced_dependency():
    """The check above, fed pyproject.toml without httpx2, or with httpx2 only in an extra (vllm_http.py imports it
    at module level), reports it."""
    base, extras = declared_requirements()
    without = [r for r in base if canonical(r.name) != "httpx2"]
    assert any("imports httpx2" in p and "named nowhere" in p for p in undeclared_imports(without, extras))
    moved = {**extras, "http": [Requirement("httpx2")]}
    assert any("vllm_http.py" in p and "only in an extra" in p for p in undeclared_imports(without, moved))


def base_closure(base: list[Requirement]) -> set[str]:
    """The distributions a fresh install of the base dependencies brings: them and, recursively, their requirements
    (markers evaluated for this interpreter; a requirement's extras bring theirs)."""
    names: set[str] = set()
    expanded: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are queued
    todo = [(r, "") for r in base]  # (requirement, the extra of the distribution that requires it)
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonical(req.name)
        names.add(name)
        for wanted in req.extras | {""}:
            if (name, wanted) not in expanded:
                expanded.add((name, wanted))
                todo += [(Requirement(r), wanted) for r in metadata.requires(req.name) or []]
    return names


def link_farm(distributions: set[str], folder: Path) -> None:
    """`folder` holds a link to every top-level file or package of `distributions` (their code and metadata): a
    site-packages with only them installed."""
    for dist in metadata.distributions():
        if canonical(dist.metadata["Name"]) not in distributions or dist.files is None:
            continue
        for top in {Path(f).parts[0] for f in dist.files if not str(f).startswith("..")}:
            source = Path(dist.locate_file(top))
            target = folder / top
            if source.exists() and not target.exists() and not top.endswith(".pth"):
                target.symlink_to(source)


IMPORT_EVERY_MODULE = r"""
import importlib, json, pkgutil, sys
import trl_mintrl
failed = {}
for info in pkgutil.walk_packages(trl_mintrl.__path__, "trl_mintrl."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
    except Exception as err:
        failed[info.name] = f"{type(err).__name__}: {err}"
extra_errors = {}
from trl_mintrl.mintrl.async_.trainer import require_requests
from trl_mintrl.judges.endpoint import require_openai
for name, check in (("async", require_requests), ("openai", require_openai)):
    try:
        check()
        extra_errors[name] = None
    except ImportError as err:
        extra_errors[name] = str(err)
print(json.dumps({"failed": failed, "extra_errors": extra_errors, "path": sys.path}))
"""


@pytest.mark.slow
def test_every_module_imports_with_only_the_base_dependencies(tmp_path):
    base, _ = declared_requirements()
    allowed = base_closure(base)
    assert "requests" not in allowed and "openai" not in allowed, "the check needs extras outside the base install"
    site = tmp_path / "site-packages"
    site.mkdir()
    link_farm(allowed, site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{site}"
    done = subprocess.run(
        [sys.executable, "-S", "-c", IMPORT_EVERY_MODULE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not any("site-packages" in p and str(site) not in p for p in result["path"]), result["path"]
    assert not result["failed"], "\n".join(f"{name}: {error}" for name, error in result["failed"].items())
    # the extras' own checks name the extra to install
    assert "trl-mintrl[async]" in result["extra_errors"]["async"]
    assert "trl-mintrl[openai]" in (result["extra_errors"]["openai"] or "")
