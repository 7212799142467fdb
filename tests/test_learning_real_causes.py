"""benchmarks/studies/learning_real_causes.py: each run's measures come from its per-step logs (intervention steps, last
quarter), the pairs against mintrl-const are paired by seed, and the hypotheses' rule reads the last-quarter share
at the cap; the arms differ from mintrl-const in the one field each names."""

from __future__ import annotations

import pytest

from benchmarks.lib.stats import format_interval, mean_interval
from benchmarks.studies import learning_real_causes as study
from benchmarks.tasks.real.arms import arm_judge, config_fields
from benchmarks.tasks.real.task import make_problems
from trl_mintrl.judges import CorrectionRequest

SEEDS = (0, 1, 2)
# per arm and seed: the last-quarter share at the cap
CLIPPED = {
    "mintrl-const": (0.9, 0.95, 1.0),
    "mintrl-no-answer": (0.1, 0.0, 0.2),  # far below: supported
    "mintrl-masked": (0.6, 0.7, 0.65),  # below, but still over half: partial
    "mintrl-target": (0.8, 1.0, 1.1),  # one seed above: not supported
}


def make_run(arm: str, seed: int) -> dict:
    clipped = CLIPPED[arm][seed]
    logs = []
    for step in range(1, 9):  # 8 steps: 2 with interventions, the last quarter is steps 7-8
        entry = {"step": step, "completions/clipped_ratio": clipped if step > 6 else 0.0, "mintrl/length": 60.0}
        entry["mintrl/interventions_active"] = float(step <= 2)
        if step <= 2:
            entry.update({"mintrl/clipped_ratio_control": 0.1 * step, "mintrl/clipped_ratio_intervened": 0.3,
                          "mintrl/length_control": 20.0 + seed, "mintrl/length_intervened": 40.0,
                          "mintrl/judge_token_frac": 0.4, "mintrl/policy_tokens_after_correction": 5.0 * step})  # fmt: skip
        logs.append(entry)
    final = {"pass@1": 0.01 * (seed + 1), "pass@8": 0.1, "kl": 0.5}
    return {"name": f"real-in-band-{arm}-s{seed}", "regime": "in-band", "arm": arm, "seed": seed, "logs": logs,
            "final": final}  # fmt: skip


def make_results() -> dict:
    settings = {**study.MODES["full"], "mode": "full", "engine": "vllm"}
    return {
        "provenance": {"command": "python -m benchmarks.studies.learning_real_causes", "commit": "0" * 40, "dirty": False,
                       "changed_files_that_matter": []},
        "settings": settings,
        "baselines": [],
        "runs": [make_run(arm, seed) for seed in SEEDS for arm in CLIPPED],
    }  # fmt: skip


def line_of(text: str, start: str) -> list[str]:
    [line] = [line for line in text.splitlines() if line.startswith(start)]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_measures_come_from_the_intervention_steps_and_the_last_quarter():
    run = make_run("mintrl-masked", 1)
    measured = study.derived(run)
    assert measured["clipped_last"] == pytest.approx(0.7)  # steps 7-8 only
    assert measured["clipped_control_iv"] == pytest.approx(0.15)  # steps 1-2: 0.1, 0.2
    assert measured["after_correction_iv"] == pytest.approx(7.5)
    assert measured["length_control_iv"] == 21.0 and measured["judge_share_iv"] == 0.4
    del run["logs"][0]["mintrl/policy_tokens_after_correction"]
    assert study.derived(run)["after_correction_iv"] == 10.0  # a step that did not log it is left out


def test_pairs_follow_the_seeds_and_the_rule_the_hypotheses_fixed():
    text = study.report(make_results())
    for arm, expected in (("mintrl-no-answer", "supported"), ("mintrl-masked", "partial"),
                          ("mintrl-target", "not supported")):  # fmt: skip
        cells = line_of(text, f"| {arm} − mintrl-const |")
        diffs = [a - b for a, b in zip(CLIPPED[arm], CLIPPED["mintrl-const"], strict=True)]
        assert cells[1] == format_interval(mean_interval(diffs), 100, 0)
        assert cells[-1] == expected
    # lengths paired by seed: the control lengths are equal across arms, so the difference is exactly 0
    assert line_of(text, "| mintrl-masked − mintrl-const |")[5] == "+0.0 [+0.0, +0.0]"
    assert line_of(text, "| mintrl-const s2 |")[1] == "100"  # per run, in %


def test_a_single_seed_leaves_the_rule_open():
    results = make_results()
    results["runs"] = [r for r in results["runs"] if r["seed"] == 0]
    assert line_of(study.report(results), "| mintrl-no-answer − mintrl-const |")[-1] == "open (fewer than 2 seeds)"


def test_each_cause_arm_changes_one_field_of_mintrl_const():
    job = {"steps": 20, "prompts_per_step": 4, "max_completion_length": 64, "seed": 0, "engine": "transformers"}
    base = config_fields("mintrl-const", job, "/tmp/out")
    for arm, field, value in (("mintrl-masked", "mask_truncated_completions", True),
                              ("mintrl-target", "judge_token_target", 0.03)):  # fmt: skip
        fields = config_fields(arm, job, "/tmp/out")
        assert {k for k in fields if fields[k] != base.get(k)} == {field} and fields[field] == value
    assert config_fields("mintrl-no-answer", job, "/tmp/out") == base  # its judge object differs, not its config


def test_only_the_no_answer_arm_has_a_judge_that_leaves_the_answer_line_to_the_policy():
    [problem] = make_problems(1, 2, seed=1)
    done = "".join(step + "\n" for step in problem.steps)  # every step there: next comes the answer line
    request = CorrectionRequest(problem.prompt[0]["content"], done, problem.solution)
    answers = {arm: arm_judge(arm).correct([request])[0].text for arm in study.ARMS}
    assert answers["mintrl-no-answer"] == ""
    assert {answers[arm] for arm in study.ARMS if arm != "mintrl-no-answer"} == {f"#### {problem.answer}\n"}
    assert arm_judge("mintrl-self") is None  # the config's self judge
