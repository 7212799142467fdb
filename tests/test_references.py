"""The reference-distance benchmark: the styles it rewrites references in, SFT on references
before GRPO, which recorded runs it reuses, and the script end to end in its smallest mode."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def test_every_style_is_a_solution_the_reward_accepts_and_fits_the_completion_budget():
    """A style that the reward rejected, or that a student imitating it could not finish within
    max_completion_length, would measure truncation or a wrong target, not distance."""
    from transformers import AutoTokenizer

    from benchmarks.tasks.toy.reference_styles import STYLES, write_reference
    from benchmarks.tasks.toy.training import REGIMES

    regime = REGIMES["in-band"]
    tokenizer = AutoTokenizer.from_pretrained(regime.warm_start)
    problems = [p for seed in range(5) for p in regime.problems(384, seed=1000 + seed)]
    for style in STYLES:
        texts = [write_reference(p, style) for p in problems]
        assert all(p.solved(t) for p, t in zip(problems, texts, strict=True)), style
        longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)  # + end token
        assert longest <= regime.max_completion_length, (style, longest)
    problem = problems[0]
    written = {style: write_reference(problem, style) for style in STYLES}
    assert len(set(written.values())) == len(STYLES)
    assert written["own"] == regime.dataset(1, seed=1000)[0]["solution"]  # the regime's references today
    assert "~" not in written["own"] and "~" in written["symbol"]
    assert " ~ " in written["spaced"] and "\n\n" not in written["spaced"]
    assert written["worded"].startswith("first ") and "\nlast " in written["worded"]
    with pytest.raises(ValueError, match="unknown reference style 'teacher'"):
        write_reference(problem, "teacher")


def test_the_dataset_carries_the_style_and_sft_on_it_lowers_its_loss():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy.reference_styles import write_reference
    from benchmarks.tasks.toy.training import REGIMES
    from benchmarks.tasks.toy.warm_start import sft_batch, sft_on_references

    torch.manual_seed(0)
    regime = REGIMES["in-band"]
    data = regime.dataset(12, seed=5, reference_style="spaced")
    problems = regime.problems(12, seed=5)
    assert data["solution"] == [write_reference(p, "spaced") for p in problems]
    tokenizer = AutoTokenizer.from_pretrained(regime.warm_start)
    model = AutoModelForCausalLM.from_pretrained(regime.warm_start)
    batch = sft_batch(tokenizer, list(zip(data["prompt"], data["solution"], strict=True)))
    with torch.no_grad():
        before = model(**batch).loss.item()
    steps = sft_on_references(model, tokenizer, data, batch_size=5, learning_rate=3e-3)
    with torch.no_grad():
        after = model(**batch).loss.item()
    assert steps == 3  # one epoch: 5 + 5 + 2 rows
    assert after < before - 0.1 and not model.training


def test_a_recorded_run_is_reused_only_for_the_very_job():
    from benchmarks.lib.records import split_recorded
    from benchmarks.studies import learning, references
    from benchmarks.tasks.toy.arms import SFT_FIRST

    settings = {"mode": "full", **references.MODES["full"]}
    jobs = references.planned_jobs(settings)
    labels = {job["label"] for job in jobs}
    assert labels == {"grpo", "mintrl-const"} | {
        references.arm_label(arm, style) for arm in references.REFERENCE_ARMS for style in settings["styles"]
    }
    assert len(jobs) == 5 * (2 + 3 * 4)
    sft = next(j for j in jobs if j["label"] == "sft-grpo@worded" and j["seed"] == 0)
    assert sft["overrides"] == {"_sft_first": SFT_FIRST, "_reference_style": "worded"}
    grpo = next(j for j in jobs if j["label"] == "grpo" and j["seed"] == 0)
    assert grpo == learning.plan_jobs(learning.MODES["full"] | {"mode": "full"}, ["band"])[0]  # learning.py's job
    recorded = {"settings": {}, "provenance": {"commit": "c" * 40}, "runs": [dict(grpo, final={"pass@1": 0.1})]}
    other = copy.deepcopy(grpo) | {"steps": 47}
    recorded["runs"].append(dict(other, seed=1, name="in-band-grpo-s1", final={"pass@1": 0.2}))
    to_run, reused, prov = split_recorded(jobs, recorded)
    assert reused == [recorded["runs"][0]] and prov == {"in-band:grpo": recorded["provenance"]}
    assert len(to_run) == len(jobs) - 1  # seed 1's recorded GRPO ran other steps: run again


def test_references_smoke_mode_writes_a_report_recomputed_from_the_json(tmp_path):
    """`benchmarks/studies/references.py --smoke` as a user runs it (no recorded runs to reuse), then the tables re-rendered
    from a JSON with changed numbers follow the numbers."""
    from benchmarks.studies import references

    command = [sys.executable, "-m", "benchmarks.studies.references", "--smoke", "--workers", "0", "--out", str(tmp_path),
               "--learning", str(tmp_path / "none.json")]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=900)
    results = json.loads((tmp_path / "references.json").read_text())
    assert {r["label"] for r in results["runs"]} == {"grpo", "mintrl-const", "sft-grpo", "sort-uniform", "sort"} | {
        "sft-grpo@spaced",
        "sort-uniform@spaced",
        "sort@spaced",
    }
    distance = results["baselines"][0]["styles"]
    assert distance["spaced"]["nll_per_token"] > distance["own"]["nll_per_token"] > 0
    sft_runs = [r for r in results["runs"] if r["label"].startswith("sft-grpo")]
    assert all(set(r["sft_end"]) == {"pass@1", "pass@8", "steps"} for r in sft_runs)
    assert (tmp_path / "references_distance.png").stat().st_size > 0

    for run in results["runs"]:  # GRPO 0.1, MInTRL 0.5; sft-grpo 0.4 on own references, 0.2 on spaced ones
        run["final"]["pass@1"] = {"grpo": 0.1, "mintrl-const": 0.5, "sft-grpo": 0.4, "sft-grpo@spaced": 0.2}.get(
            run["label"], 0.1
        )
    (tmp_path / "changed.json").write_text(json.dumps(results))
    replot = [sys.executable, "-m", "benchmarks.studies.references", "--replot", str(tmp_path / "changed.json")]
    subprocess.run(replot, cwd=ROOT, check=True, capture_output=True, timeout=120)
    table = (tmp_path / "references.md").read_text()
    assert "| own |" in table and "| sft-grpo | 1 | 40.0 | +30.0 | +10.0 |" in table
    assert "| sft-grpo | 1 | 20.0 | +10.0 | +30.0 |" in table  # the spaced row
    assert [r["arm"] for r in references.rows(results)][:4] == ["sft-grpo", "sort-uniform", "sort", "sft-only"]
