"""CI runs what a new user runs, first: the README's install in a fresh venv, then the README's test command, and
only after them anything an extra brings, so that an extra cannot supply a dependency the README's install lacks."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> tuple[str, str]:
    """The README's two leading commands: setup-and-demos, and the tests."""
    blocks = re.findall(r"```bash\n(.*?)\n```", (REPO / "README.md").read_text(), flags=re.S)
    return blocks[0].strip(), blocks[1].strip()


def ci_steps(path: Path) -> list[str]:
    """The commands of a shell script, comments and blank lines dropped."""
    return [
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def order_problems(steps: list[str], setup: str, tests: str) -> list[str]:
    install = setup.split(" && .venv/bin/python examples/")[0]
    problems = []
    if not install.startswith("python3 -m venv .venv && ") or "pip install" not in install:
        problems.append(f"README command 1 does not start with a venv and an install: {setup!r}")
    installs = [i for i, step in enumerate(steps) if "pip install" in step]
    if install not in steps:
        problems.append(f".ci/run does not run the README's install as written: {install!r}")
    elif installs and installs[0] != steps.index(install):
        problems.append(f".ci/run installs before the README's install: {steps[installs[0]]!r}")
    if tests not in steps:
        problems.append(f".ci/run does not run the README's test command as written: {tests!r}")
    elif install in steps:
        between = [s for s in steps[steps.index(install) + 1 : steps.index(tests)] if "pip" in s or "venv" in s]
        if between:
            problems.append(f".ci/run changes the venv between the README's install and its tests: {between}")
    if install in steps and not any(step.startswith("rm -rf .venv") for step in steps[: steps.index(install)]):
        problems.append(".ci/run does not remove a leftover .venv before the README's install")
    return problems


def test_ci_runs_the_readme_install_then_its_tests_before_any_extra():
    setup, tests = readme_commands()
    problems = order_problems(ci_steps(REPO / ".ci" / "run"), setup, tests)
    assert not problems, "\n".join(problems)


def test_the_order_check_sees_an_extra_installed_first():
    """Broken on purpose: the extras installed before the README's install, or between it and the tests."""
    setup, tests = readme_commands()
    steps = ci_steps(REPO / ".ci" / "run")
    extras = '.venv/bin/pip install -q torch==2.13.0 -e ".[test,deepspeed,docs]"'
    install = steps.index(setup.split(" && .venv/bin/python examples/")[0])
    assert any(
        "installs before" in p for p in order_problems([*steps[:install], extras, *steps[install:]], setup, tests)
    )
    between = [*steps[: install + 1], extras, *steps[install + 1 :]]
    assert any("between the README's install" in p for p in order_problems(between, setup, tests))


def test_ci_runs_ruff_at_the_dev_extras_pin():
    """The lint step: ruff's checks and its format check, at the version pinned in the "dev" extra."""
    steps = ci_steps(REPO / ".ci" / "run")
    pin = re.search(r'"(ruff==[^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert f".venv/bin/pip install -q {pin}" in steps
    assert ".venv/bin/ruff check ." in steps and ".venv/bin/ruff format --check ." in steps
