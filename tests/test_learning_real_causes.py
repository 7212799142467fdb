"""benchmarks/studies/learning_real_causes.py: each run's measures come from its per-step logs (intervention steps, last
quarter), the pairs against mintrl-const are paired by seed, and the hypotheses' rule reads the last-quarter share
at the cap; the arms differ from mintrl-const in the one field each names."""

from __future__ import annotations

import json

import pytest

from benchmarks.lib.stats import format_interval, mean_interval
from benchmarks.studies import learning_real_causes as study
from benchmarks.tasks.real.arms import answer_last_math_reward, answer_penalty_math_reward, arm_judge, config_fields
from benchmarks.tasks.real.task import make_problems
from trl_mintrl.judges import CorrectionRequest
from trl_mintrl.rewards import math_reward

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


def test_a_contrast_pairs_an_arm_with_the_cause_arm_one_factor_away():
    text = study.report(make_results())
    assert not [line for line in text.splitlines() if "(contrast)" in line]  # neither arm ran: no row
    results = make_results()
    clipped = {"mintrl-answer-last": (0.9, 0.8, 0.85), "mintrl-answer-penalty": (0.2, 0.1, 0.3)}
    for arm, shares in clipped.items():
        for seed in SEEDS:
            run = make_run("mintrl-const", seed)
            for entry in run["logs"][6:]:
                entry["completions/clipped_ratio"] = shares[seed]
            results["runs"].append({**run, "name": f"real-in-band-{arm}-s{seed}", "arm": arm})
    cells = line_of(study.report(results), "| mintrl-answer-penalty − mintrl-answer-last |")
    diffs = [a - b for a, b in zip(clipped["mintrl-answer-penalty"], clipped["mintrl-answer-last"], strict=True)]
    assert cells[1] == format_interval(mean_interval(diffs), 100, 0) and cells[-1] == "(contrast)"


def test_a_sitting_runs_the_named_arms_and_keeps_every_other_record(tmp_path, monkeypatch):
    """`--arms` limits a sitting to those arms' runs not yet recorded; with `--resume` the other arms' records stay."""
    ran = []

    def fake_run(job):
        ran.append(job["arm"])
        record = make_run("mintrl-const", job["seed"])
        record["final"].update({"longer_pass@1": 0.0, "chat_nll_change": 0.0})
        return {**job, **record, "arm": job["arm"], "name": job["name"], "step_seconds": [1.0]}

    monkeypatch.setattr(study, "run_job", fake_run)
    monkeypatch.setattr(study, "measure_warm_start", lambda job: {**job, "scores": {}})
    argv = ["--smoke", "--workers", "0", "--out", str(tmp_path)]
    study.main([*argv, "--max_runs", "1"])
    study.main([*argv, "--resume", "--arms", "mintrl-answer-penalty", "mintrl-answer-last"])
    study.main([*argv, "--resume", "--max_runs", "1"])
    assert ran == ["mintrl-const", "mintrl-answer-last", "mintrl-answer-penalty", "mintrl-no-answer"]
    saved = json.loads((tmp_path / "learning_real_causes.json").read_text())
    assert sorted(r["arm"] for r in saved["runs"]) == sorted(ran) and len(saved["baselines"]) == 1
    assert "| mintrl-answer-penalty − mintrl-answer-last |" in (tmp_path / "learning_real_causes.md").read_text()


def test_a_single_seed_leaves_the_rule_open():
    results = make_results()
    results["runs"] = [r for r in results["runs"] if r["seed"] == 0]
    assert line_of(study.report(results), "| mintrl-no-answer − mintrl-const |")[-1] == "open (fewer than 2 seeds)"


def test_each_cause_arm_changes_one_field_of_mintrl_const():
    job = {"steps": 20, "prompts_per_step": 4, "max_completion_length": 64, "seed": 0, "engine": "transformers"}
    base = config_fields("mintrl-const", job, "/tmp/out")
    for arm, field, value in (("mintrl-masked", "mask_truncated_completions", True),
                              ("mintrl-target", "judge_token_target", 0.03),
                              ("mintrl-end-answer", "end_at_judge_answer", True)):  # fmt: skip
        fields = config_fields(arm, job, "/tmp/out")
        assert {k for k in fields if fields[k] != base.get(k)} == {field} and fields[field] == value
    for arm in ("mintrl-no-answer", "mintrl-answer-only"):  # their judge objects differ, not their configs
        assert config_fields(arm, job, "/tmp/out") == base
    for arm in ("mintrl-answer-last", "mintrl-answer-penalty"):  # their rewards differ
        assert config_fields(arm, job, "/tmp/out") == base


def test_the_answer_last_reward_pays_only_completions_that_end_at_their_answer_line():
    [problem] = make_problems(1, 2, seed=1)
    solved = "".join(step + "\n" for step in problem.steps) + f"#### {problem.answer}"
    texts = [solved, solved + "\n\n", solved + "\nJack has more.", solved + f"\n#### {problem.answer}",
             solved.replace(f"#### {problem.answer}", f"#### {problem.answer + 1}")]  # fmt: skip
    completions = [[{"role": "assistant", "content": text}] for text in texts]  # conversational, as the runs'
    assert math_reward(completions, [problem.solution] * 5) == [1.0, 1.0, 1.0, 1.0, 0.0]  # the first line counts
    assert answer_last_math_reward(completions, [problem.solution] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    # running on scores below a wrong answer that ends there; a completion with no answer line (cut) too
    cut = [[{"role": "assistant", "content": problem.steps[0] + "\n" + problem.steps[1]}]]
    assert answer_penalty_math_reward(completions + cut, [problem.solution] * 6) == [1.0, 1.0, -1.0, -1.0, 0.0, -1.0]


def test_only_the_no_answer_arm_has_a_judge_that_leaves_the_answer_line_to_the_policy():
    [problem] = make_problems(1, 2, seed=1)
    done = "".join(step + "\n" for step in problem.steps)  # every step there: next comes the answer line
    request = CorrectionRequest(problem.prompt[0]["content"], done, problem.solution)
    answers = {arm: arm_judge(arm).correct([request])[0].text for arm in study.ARMS}
    assert answers["mintrl-no-answer"] == ""
    assert {answers[arm] for arm in study.ARMS if arm != "mintrl-no-answer"} == {f"#### {problem.answer}\n"}
    assert arm_judge("mintrl-self") is None  # the config's self judge
    one_step = CorrectionRequest(problem.prompt[0]["content"], problem.steps[0] + "\n", problem.solution)
    missing = {arm: arm_judge(arm).correct([one_step])[0].text for arm in study.ARMS}
    assert missing["mintrl-answer-only"] == f"#### {problem.answer}\n"  # the answer line, not the missing step
    assert {missing[arm] for arm in study.ARMS if arm != "mintrl-answer-only"} == {problem.steps[1] + "\n"}


def test_the_answer_reward_arms_train_with_their_reward_and_the_others_with_math_reward(tiny_model_path, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.real.arms import build_trainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    dataset = Dataset.from_list([p.row() for p in make_problems(2, 2, seed=1)])
    job = {"steps": 1, "prompts_per_step": 1, "max_completion_length": 16, "seed": 0, "engine": "transformers"}
    for arm, reward in (
        ("mintrl-answer-last", answer_last_math_reward),
        ("mintrl-answer-penalty", answer_penalty_math_reward),
        ("mintrl-const", math_reward),
    ):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        trainer = build_trainer(arm, job, model, tokenizer, dataset, str(tmp_path / arm))
        assert [f.__wrapped__ for f in trainer.reward_funcs] == [reward]  # inside the package's guard
