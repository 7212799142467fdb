"""The wheel a user would install (`python -m build`): it builds from the checkout, carries the package and its
data but no benchmark weights, installs into a fresh environment and its console script runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import trl_mintrl

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out, source = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("source")
    # a copy of what the wheel is built from, so setuptools' build/ and egg-info never land in the checkout
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "trl_mintrl", source / "trl_mintrl", ignore=shutil.ignore_patterns("__pycache__"))
    # --no-isolation: build with this environment's setuptools (the test extra pins the floor), no download
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (path,) = out.glob("trl_mintrl-*.whl")
    return path


def test_wheel_holds_the_package_and_no_benchmark_weights(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "trl_mintrl/__init__.py" in names and "trl_mintrl/mintrl/trainer.py" in names
    assert any(name.startswith("trl_mintrl/data/fixtures/") for name in names)  # shipped look-alike datasets
    assert not [n for n in names if n.endswith((".safetensors", ".bin", ".pt"))], "the wheel carries weights"
    assert not [n for n in names if n.startswith(("benchmarks/", "tests/", "examples/"))]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "trl-mintrl = trl_mintrl.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_wheel_installs_and_its_console_script_runs(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    # --no-deps: the dependencies (torch, trl, ...) are the ones this suite already tests; the point is the wheel
    subprocess.run(
        [env_dir / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = subprocess.run(
        [env_dir / "bin" / "trl-mintrl", "--version"], check=True, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == f"trl-mintrl {trl_mintrl.__version__}"
