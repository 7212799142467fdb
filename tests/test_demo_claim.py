"""The main demo's closing lines: what the committed benchmark found for its arm comes from learning.json, and the
demo's defaults are that arm (no 4-minute demo run here: only the function that writes the lines)."""

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from benchmarks.lib.records import final_by_seed, runs_of
from benchmarks.lib.stats import format_interval, paired_difference
from benchmarks.tasks.toy.demo_claim import LEARNING_JSON, arms_commit, committed_comparison, load_results

ROOT = Path(__file__).resolve().parents[1]
ARM = dict(steps=48, prompts_per_step=8, final_prompts=96, seed=0)


@pytest.fixture(scope="module")
def committed():
    return json.loads(LEARNING_JSON.read_text())


def _set_mintrl(results: dict, regime: str, shift: dict) -> dict:
    """A copy where mintrl-const on `regime` scores GRPO's per-seed value plus `shift[metric]` (+ a small spread)."""
    results = copy.deepcopy(results)
    grpo = {r["seed"]: r["final"] for r in runs_of(results, regime, "grpo")}
    for run in runs_of(results, regime, "mintrl-const"):
        for metric, delta in shift.items():
            run["final"][metric] = grpo[run["seed"]][metric] + delta + 0.002 * run["seed"]
    return results


def test_the_line_states_the_committed_paired_difference_and_its_verdict(committed):
    text = committed_comparison(committed, ARM)
    assert (
        "benchmarks/results/learning.json" in text
        and arms_commit(committed, "in-band", ("mintrl-const", "grpo")) in text
    )
    assert "See the summary tables in docs/benchmarks.md" in text
    for metric in ("pass@1", "pass@8"):
        diff = paired_difference(
            final_by_seed(runs_of(committed, "in-band", "mintrl-const"), metric),
            final_by_seed(runs_of(committed, "in-band", "grpo"), metric),
        )
        assert f"{metric} {format_interval(diff)} ({'resolved' if diff.resolved else 'not resolved'})" in text
    assert f"over {len(runs_of(committed, 'in-band', 'grpo'))} seeds" in text


def test_the_line_follows_an_edited_json(committed):
    better = committed_comparison(_set_mintrl(committed, "in-band", {"pass@1": 0.1, "pass@8": 0.1}), ARM)
    assert "pass@1 +10.9 [+10.5, +11.3] (resolved)" in better  # 0.1 + 0.002 * seed, seeds 0-9
    assert "mintrl-const beats grpo on this regime (pass@1, pass@8)" in better
    assert "not shown to beat" not in better

    worse = committed_comparison(_set_mintrl(committed, "in-band", {"pass@1": -0.1}), ARM)
    assert "mintrl-const is worse than grpo on this regime (pass@1)" in worse

    tied = _set_mintrl(committed, "in-band", {"pass@1": 0.0, "pass@8": 0.0})
    for run in runs_of(tied, "in-band", "mintrl-const"):
        run["final"]["pass@1"] += 0.05 * (-1) ** run["seed"]  # zero-mean noise: an interval around 0
        run["final"]["pass@8"] += 0.05 * (-1) ** run["seed"]
    assert "no difference is resolved: on this regime mintrl-const is not shown to beat grpo" in (
        committed_comparison(tied, ARM)
    )

    one_seed = copy.deepcopy(committed)
    one_seed["runs"] = [r for r in one_seed["runs"] if r["seed"] == 0]
    text = committed_comparison(one_seed, ARM)
    assert "over 1 seeds" in text and "(no interval)" in text and "not shown to beat" in text

    missing = copy.deepcopy(committed)
    missing["runs"] = [r for r in missing["runs"] if r["regime"] != "in-band"]
    assert "has no mintrl-const and grpo runs on the in-band regime" in committed_comparison(missing, ARM)
    assert "is missing" in committed_comparison(None, ARM)


def test_the_line_names_how_the_benchmark_arm_differs_from_the_demo(committed):
    assert "the same arm as this demo" in committed_comparison(committed, ARM)
    longer = copy.deepcopy(committed)
    for run in longer["runs"]:
        run["steps"] = 96
    text = committed_comparison(longer, ARM)
    assert f"the closest committed benchmark arm, which differs: 96 optimizer steps, the demo {ARM['steps']}" in text
    assert "the same arm" not in text
    other = committed_comparison(committed, dict(ARM, final_prompts=128, seed=17))
    assert "96 held-out problems, the demo 128" in other and "do not include the demo's seed 17" in other


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "example, method, regime", [("mintrl_toy", "mintrl-const", "in-band"), ("sort_toy", "sort", "sort-hint")]
)
def test_the_demo_defaults_are_the_committed_arm_and_it_prints_the_line(
    committed, monkeypatch, capsys, example, method, regime
):
    import benchmarks.tasks.toy.demo as shared

    demo = _load_example(example)
    args = shared.parse_args("", "out", [])
    assert shared.demo_arm(args) == ARM
    # the README states "the same arm" as the committed benchmark: this breaks when either side changes
    line = committed_comparison(load_results(), shared.demo_arm(args), regime=regime, label=method)
    assert "the same arm as this demo" in line

    # main() with training and evaluation stubbed: the printed closing lines are the function's, from the JSON
    trained = []
    scores = {"pass@1": 0.2, "pass@8": 0.5, "minutes": 0.0, "judge_share": 0.05, "intervention_steps": 9,
              "repair_steps": 7}  # fmt: skip

    def train_and_evaluate(name, regime_name, args, heldout):
        trained.append((name, regime_name))
        return dict(scores)

    monkeypatch.setattr(shared, "train_and_evaluate", train_and_evaluate)
    monkeypatch.setattr(shared, "evaluate", lambda *a, **k: {"pass@1": 0.1, "pass@8": 0.4})
    monkeypatch.setattr(shared.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(shared.torch, "set_num_threads", lambda n: None)  # keep the test process's threads
    edited = _set_mintrl(committed, "in-band", {"pass@1": 0.1, "pass@8": 0.1})
    monkeypatch.setattr(shared, "load_results", lambda: edited)
    demo.main([])
    out = capsys.readouterr().out
    assert trained == [(method, regime), ("grpo", regime)]
    assert "96 held-out problems" in out and "One seed cannot resolve a difference" in out
    assert committed_comparison(edited, ARM, regime=regime, label=method) in out
    if method == "mintrl-const":
        assert "mintrl-const beats grpo" in out and "judge wrote 5.0% of completion tokens" in out
    else:
        assert "sort beats grpo on this regime (pass@1" in out and "at 7 of its 48 steps" in out


def test_readme_first_paragraph_states_the_demo_settings_and_the_committed_difference(committed):
    """The numbers are measured from a clean clone (not checkable here without the run); what the README says about
    the demo's settings, each demo's seed-0 numbers and the committed 5-seed differences, with whether each is
    resolved, must match the code and the JSON."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    paragraph = readme[readme.index("The first command") : readme.index("The second command")]
    assert f"{ARM['steps']} steps x {ARM['prompts_per_step']} prompts" in paragraph
    assert f"on {ARM['final_prompts']} held-out problems" in paragraph
    assert "(docs/benchmarks.md#summary-tables)" in paragraph
    assert "\n## Summary tables\n" in (ROOT / "docs" / "benchmarks.md").read_text()
    assert "`examples/sort_toy.py`" in paragraph and "sort-hint arm" in paragraph and "in-band arm" in paragraph
    for regime, label, name in (("in-band", "mintrl-const", "MInTRL"), ("sort-hint", "sort", "SORT")):
        runs, grpo = runs_of(committed, regime, label), runs_of(committed, regime, "grpo")
        diffs = {m: paired_difference(final_by_seed(runs, m), final_by_seed(grpo, m)) for m in ("pass@1", "pass@8")}
        resolved = [m for m, d in diffs.items() if d.resolved]
        verdict = {2: "both resolved", 0: "neither resolved"}.get(len(resolved), f"{''.join(resolved)} resolved")
        intervals = f"pass@1 {format_interval(diffs['pass@1'])}, pass@8 {format_interval(diffs['pass@8'])}"
        assert f"{name} - GRPO is {intervals} points (95% t-intervals, {verdict})" in paragraph
        assert f"Over {len(grpo)} seeds, {name} - GRPO" in paragraph
        seed0 = {r["label"]: r["final"] for r in runs + grpo if r["seed"] == 0}  # what the demo prints (its seed 0)
        for shown, key in ((name, label), ("GRPO", "grpo")):
            assert f"after {shown} {seed0[key]['pass@1']:.3f} and {seed0[key]['pass@8']:.3f}" in paragraph
    first_command = (ROOT / "README.md").read_text().split("```bash\n")[1].split("\n```")[0]
    assert first_command.endswith("examples/sort_toy.py && .venv/bin/python examples/mintrl_toy.py")
