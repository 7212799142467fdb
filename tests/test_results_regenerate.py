"""Every committed results report is what its study renders from the committed JSON beside it.

A study writes `benchmarks/results/X.json` and renders `X.md` from it; the .md is never edited by hand. For each
committed JSON with a committed .md beside it, the JSON (and what the renderer reads beside it: the recorded runs a
comparison is made against) is copied into a temporary folder, the study's own `--replot` (or, for a study without
one, the function its run writes the .md with) renders it there, and the result must equal the committed .md byte
for byte: a report whose numbers, or whose fixed texts, no longer follow from its JSON and the current code fails
here. Nothing is written into the repository (checked). The summary blocks of docs/benchmarks.md are checked the
same way by tests/test_docs.py (`test_summary_block_lives_in_docs_benchmarks_and_is_what_its_script_writes`)."""

from __future__ import annotations

import fnmatch
import importlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.lib import harness

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# the files a replot must leave alone (it writes into its --out, here a temporary folder)
UNTOUCHED = [REPO / "README.md", REPO / "docs" / "benchmarks.md"]
WRITE_REPORT = harness.write_report


def replot(module: str, *flags: str) -> Callable[[Path], None]:
    """Render through the study's command line: `main([*flags, "--replot", copy])` writes the .md beside the copy."""

    def run(copy: Path) -> None:
        importlib.import_module(f"benchmarks.studies.{module}").main([*flags, "--replot", str(copy)])

    return run


def rendered(module: str, function: str, end: str = "") -> Callable[[Path], None]:
    """Render through the function a study without `--replot` writes its .md with: `function(results) + end`, written
    where the study writes it (the JSON's name with the suffix .md)."""

    def run(copy: Path) -> None:
        render = getattr(importlib.import_module(module), function)
        copy.with_suffix(".md").write_text(render(json.loads(copy.read_text())) + end)

    return run


def reproduce(copy: Path) -> None:
    """reproduce.py's `--replot` renders from its `--out` folder, which holds reproduce.json beside the recorded runs
    it compares with (learning.json, cost_async.json); its exit status says whether the fresh runs agree."""
    from benchmarks.studies import reproduce as study

    with pytest.raises(SystemExit):
        study.main(["--replot", "--out", str(copy.parent)])


# (pattern of the JSON's name, how its .md is rendered, files the renderer reads beside the JSON), first match wins
RENDERERS: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = [
    ("cost_rollout.json", replot("cost", "--rollout"), ()),
    ("cost_async.json", replot("cost_async"), ()),
    ("cost*.json", replot("cost"), ()),
    ("learning.json", replot("learning"), ()),
    ("learning_async.json", replot("learning_async"), ()),
    ("learning_real_causes.json", replot("learning_real_causes"), ()),
    ("learning_real*.json", replot("learning_real"), ()),
    ("learning_tools*.json", replot("learning_tools"), ()),
    ("intensity_real*.json", replot("intensity_real"), ()),
    ("beyond.json", replot("beyond"), ()),
    ("learned_judge.json", replot("learned_judge"), ()),
    ("references.json", replot("references"), ()),
    ("memory.json", replot("memory"), ()),
    ("reproduce.json", reproduce, ("learning.json", "cost_async.json")),
    ("real_calibration*.json", rendered("benchmarks.studies.real_calibration", "report"), ()),
    ("real_engines.json", rendered("benchmarks.studies.real_engines", "render"), ()),
    ("real_judge_check.json", rendered("benchmarks.studies.real_judge_quality", "markdown"), ()),
    ("tools_calibration.json", rendered("benchmarks.studies.tool_calibration", "markdown"), ()),
    ("gpu_check.json", rendered("scripts.gpu_check", "render", end="\n"), ()),
]


def committed_reports() -> list[str]:
    """The committed results JSONs (every folder) with a committed .md of the same name beside them, relative to
    the repository; a sidecar (`*.samples.json`: the stored samples of a calibration) is no report's source."""
    listed = subprocess.run(
        ["git", "ls-files", "benchmarks/results"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(
        path
        for path in listed
        if path.endswith(".json")
        and not path.endswith(".samples.json")
        and path.removesuffix(".json") + ".md" in listed
    )


def renderer(path: str) -> tuple[Callable[[Path], None], tuple[str, ...]]:
    name = Path(path).name
    for pattern, render, beside in RENDERERS:
        if fnmatch.fnmatch(name, pattern):
            return render, beside
    raise LookupError(f"{path}: no renderer known for this results file; add it to RENDERERS")


def report_only(results, out, file_name, report, plot=None, plots=True):
    """`harness.write_report` without the plots: the .md is the same, the PNGs (seconds each) are not compared."""
    return WRITE_REPORT(results, out, file_name, report, plot, plots=False)


def snapshot() -> dict[Path, tuple[int, int]]:
    """(mtime, size) of the committed results and of the pages a `--readme` would rewrite."""
    files = [*UNTOUCHED, *(p for p in RESULTS.rglob("*") if p.is_file())]
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in files if p.is_file()}


def test_the_committed_results_have_reports_to_check():
    """The parametrized list is not short by accident (a moved results folder, git listing nothing): the main
    studies' files are in it, and a sidecar of stored samples is not."""
    reports = committed_reports()
    for path in ("learning.json", "cost.json", "cost_rollout.json", "beyond.json", "real_calibration.t07.json"):
        assert f"benchmarks/results/{path}" in reports, path
    assert "benchmarks/results/real_calibration.samples.json" not in reports


@pytest.mark.parametrize("path", committed_reports())
def test_committed_report_is_what_its_study_renders_from_the_committed_json(path, tmp_path, monkeypatch):
    """`path`'s .md, rendered now from a copy of `path` by the study's own code, equals the committed .md byte for
    byte, and the rendering wrote nothing into the repository."""
    render, beside = renderer(path)
    source = REPO / path
    copy = tmp_path / source.name
    shutil.copyfile(source, copy)
    for sidecar in [source.with_suffix(".samples.json"), *(source.parent / name for name in beside)]:
        if sidecar.is_file():
            shutil.copyfile(sidecar, tmp_path / sidecar.name)
    monkeypatch.chdir(tmp_path)  # a relative path a renderer might write to lands here, not in the checkout
    monkeypatch.setattr(harness, "write_report", report_only)
    before = snapshot()
    render(copy)
    assert snapshot() == before, "rendering wrote into the repository"
    expected = source.with_suffix(".md").read_bytes().decode()  # bytes: no newline translation
    written = copy.with_suffix(".md")
    assert written.is_file(), f"the study wrote no {written.name} beside the JSON"
    assert written.read_bytes().decode() == expected, (
        f"{path}: the committed .md is not what the study renders from the JSON"
    )


def test_time_to_accuracy_report_is_what_its_study_renders_from_the_committed_runs(tmp_path):
    """time_to_accuracy.md has no JSON of its own: it is rendered from the committed runs of other studies
    (learning.json, references.json, learned_judge.json, async_curves/learning_async.json), and rendering them now
    gives the committed .md byte for byte."""
    from benchmarks.studies import time_to_accuracy

    before = snapshot()
    time_to_accuracy.main(["--out", str(tmp_path / "time_to_accuracy.md")])
    assert snapshot() == before, "rendering wrote into the repository"
    written = (tmp_path / "time_to_accuracy.md").read_bytes().decode()
    assert written == (RESULTS / "time_to_accuracy.md").read_bytes().decode()
