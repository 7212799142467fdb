"""benchmarks/studies/intensity_real.py: its probe trains the chain regime's arms with the calibrated settings, and
its report reads each step from the run's logs. No model needed (the runs are faked)."""

import json

import pytest

from benchmarks.studies import intensity_real as study
from benchmarks.tasks.real.arms import arm_judge, config_fields
from benchmarks.tasks.real.judge import rule_judge
from benchmarks.tasks.real.run import plan_jobs
from benchmarks.tasks.real.warm_start import WARMUP_CHAIN_LONG, train_problems
from trl_mintrl.judges.base import CorrectionRequest, ReviewRequest


def test_the_probe_trains_the_chain_regime_with_the_calibrated_settings(tmp_path):
    settings = {"mode": "probe", **study.MODES["probe"], "engine": "transformers"}
    [baseline], jobs = plan_jobs(settings)
    assert baseline["regime"] == "chain" and baseline["warmup"] == WARMUP_CHAIN_LONG
    assert [job["arm"] for job in jobs] == ["grpo", "mintrl-const", "mintrl-lines4", "mintrl-rest", "mintrl-rewrite"]
    mintrl = config_fields("mintrl-const", jobs[1], str(tmp_path))
    assert mintrl["chunk_size"] == 64 and mintrl["max_completion_length"] == 320 and mintrl["max_reviews"] == 4
    assert config_fields("grpo", jobs[0], str(tmp_path))["max_completion_length"] == 320
    for arm, job in zip(("grpo", "mintrl-const"), jobs, strict=False):  # 32 rollouts a step in micro-batches of 4
        fields = config_fields(arm, job, str(tmp_path))
        assert (fields["per_device_train_batch_size"], fields["gradient_accumulation_steps"]) == (4, 8)
    assert {p.num_steps for p in train_problems(jobs[0]["regime"], 8, jobs[0]["seed"])} == {12}


def test_the_higher_share_arms_write_more_of_the_solution_a_correction(tmp_path):
    settings = {"mode": "probe", **study.MODES["probe"], "engine": "transformers"}
    job = plan_jobs(settings)[1][1]
    [chain] = train_problems("chain", 1, seed=0)
    for arm, lines, cap in (("mintrl-const", 1, 32), ("mintrl-lines4", 4, 96), ("mintrl-rest", 13, 256)):
        assert config_fields(arm, job, str(tmp_path))["max_correction_tokens"] == cap
        [correction] = arm_judge(arm).correct([CorrectionRequest(chain.question, "", chain.solution)])
        assert correction.text.count("\n") == lines and correction.text.startswith(chain.steps[0])
    assert correction.text.endswith(f"#### {chain.answer}\n")  # the rest: 12 steps and the answer line


def test_the_rewrite_arm_replaces_a_right_first_chunk_with_the_whole_solution_at_its_target_share(tmp_path):
    settings = {"mode": "probe", **study.MODES["probe"], "engine": "transformers"}
    job = plan_jobs(settings)[1][-1]
    fields = config_fields("mintrl-rewrite", job, str(tmp_path))
    assert (fields["judge_token_target"], fields["max_correction_tokens"]) == (0.35, 256)
    [chain] = train_problems("chain", 1, seed=0)
    q, ref, steps = chain.question, chain.solution, [step + "\n" for step in chain.steps]
    judge, rest = arm_judge("mintrl-rewrite"), arm_judge("mintrl-rest")
    first = ReviewRequest(q, "", steps[:2], ref)
    later = ReviewRequest(q, "".join(steps[:2]), steps[2:4], ref)
    wrong = ReviewRequest(q, "".join(steps[:2]), [steps[2], "1 + 1 = 3\n"], ref)
    # a right first chunk is cut at its first step; later chunks are read as by the other arms
    assert [v.wrong_step for v in judge.review([first, later, wrong])] == [0, None, 1]
    assert [v.wrong_step for v in rest.review([first, later, wrong])] == [None, None, 1]
    cut = ReviewRequest(q, "", [steps[0][:10]], ref, last_step_complete=False)
    assert [v.wrong_step for v in judge.review([cut])] == [0]
    [correction] = judge.correct([CorrectionRequest(q, "", ref)])
    assert correction.text == ref.strip() + "\n"
    with pytest.raises(ValueError, match="rewrite=True replaces the rollout"):
        rule_judge(lines=1, rewrite=True)


def fake_run(job: dict) -> dict:
    logs = [{"step": 1, "reward": 0.5, "completions/mean_length": 190.0}, {"step": 2, "reward": 0.25,
             "completions/mean_length": 205.0}]  # fmt: skip
    if job["arm"].startswith("mintrl"):  # after the intervention steps MInTRL logs the controls' half only
        logs[0].update({"mintrl/judge_token_frac": 0.05, "mintrl/length_control": 200.0,
                        "mintrl/length_intervened": 210.5, "mintrl/reward_control": 0.125,
                        "mintrl/reward_intervened": 0.875})  # fmt: skip
        logs[1].update({"mintrl/judge_token_frac": 0.0, "mintrl/length_control": 205.0, "mintrl/reward_control": 0.25})
    final = {"pass@1": 0.1, "pass@8": 0.4, "longer_pass@1": 0.05, "longer_pass@8": 0.2, "chat_nll": 2.6,
             "chat_nll_change": 0.0, "kl": 0.01}  # fmt: skip
    return {**job, "logs": logs, "step_seconds": [300.0, 250.0], "train_seconds": 550.0, "final": final,
            "scores": {"heldout": {"sample_seconds": 60.0}}, "curve": {},
            "machine_during": {"load_during_mean": 2.0}}  # fmt: skip


def fake_measure(job: dict) -> dict:
    scores = {split: {"pass@1": 0.05, "pass@8": 0.25} for split in ("heldout", "heldout_longer")}
    machine = {"cpu_model": "AMD EPYC", "logical_cpus": 2, "usable_cpus": 2, "load_before": 0.5,
               "load_during_mean": 2.0, "load_during_max": 2.9}  # fmt: skip
    built = {"hash": "f6b614b5ff98", "sft_seconds": 2635.0, "steps": 128, "losses": [0.026, 0.004], "machine": machine,
             "settings": {**WARMUP_CHAIN_LONG, "after": {"problems": 1024, "num_steps": [7, 8, 9]}}}  # fmt: skip
    return {**job, "scores": scores, "built": built, "chat": {"nats_per_token": 2.605}, "sampled_by": "vllm"}


def test_the_report_reads_each_step_from_the_logs(tmp_path, monkeypatch):
    monkeypatch.setattr(study, "run_job", fake_run)
    monkeypatch.setattr(study, "measure_warm_start", fake_measure)
    study.main(["--probe", "--workers", "0", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "intensity_real_probe.json").read_text())
    assert sorted(r["arm"] for r in saved["runs"]) == ["grpo", "mintrl-const", "mintrl-lines4", "mintrl-rest",
                                                       "mintrl-rewrite"]  # fmt: skip
    text = (tmp_path / "intensity_real_probe.md").read_text()
    assert "| mintrl-const s0 | 1 | 300 | 0.50 | 5.0% | 200.0 / 210.5 | 0.12 / 0.88 | 190.0 |" in text
    assert "| mintrl-const s0 | 2 | 250 | 0.25 | 0.0% | 205.0 / - | 0.25 / - | 205.0 |" in text
    assert "| grpo s0 | 1 | 300 | 0.50 | - | - / - | - / - | 190.0 |" in text
    assert "| chain | warm start | - | 5.0 | 25.0 | 5.0 | 25.0 |" in text
    assert "chunks of 64 tokens" in text and "at most 320 tokens" in text


def test_a_full_sitting_runs_its_runs_then_the_warm_start_measure(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr(study, "run_job", lambda job: order.append(job["name"]) or fake_run(job))
    monkeypatch.setattr(study, "measure_warm_start", lambda job: order.append(job["name"]) or fake_measure(job))
    study.main(["--arms", "grpo", "mintrl-const", "--max_runs", "2", "--workers", "0", "--out", str(tmp_path)])
    assert order == ["real-chain-grpo-s0", "real-chain-mintrl-const-s0", "real-chain-warm-start"]
    saved = json.loads((tmp_path / "intensity_real.json").read_text())
    s = saved["settings"]
    sizes = (s["steps"], s["seeds"], s["final_problems"], s["max_completion_length"], s["engine"])
    assert sizes == (20, [0, 1, 2], 48, 320, "vllm")
    assert s["warmup"] == WARMUP_CHAIN_LONG and s["overrides"] == {"chunk_size": 64}
    study.main(["--resume", "--max_runs", "1", "--workers", "0", "--out", str(tmp_path)])
    assert order[3:] == ["real-chain-mintrl-lines4-s0"]  # the next in plan order; the others are kept
    assert len(json.loads((tmp_path / "intensity_real.json").read_text())["runs"]) == 3


# per arm: pass@1 and pass@8 by seed, KL, the controls' length at the last intervention step, s/step
FULL_RUNS = {"grpo": ([0.10, 0.12, 0.08], [0.40, 0.42, 0.38], 0.01, None, 300.0),
             "mintrl-const": ([0.15, 0.18, 0.12], [0.46, 0.49, 0.43], 0.02, 210.0, 330.0),
             "mintrl-lines4": ([0.16, 0.17, 0.12], [0.47, 0.48, 0.43], 0.03, 190.0, 320.0),
             "mintrl-rest": ([0.10, 0.12, 0.08], [0.41, 0.43, 0.39], 0.05, 300.0, 320.0),
             "mintrl-rewrite": ([0.13, 0.15, 0.08], [0.41, 0.43, 0.39], 0.08, 300.0, 320.0)}  # fmt: skip


def full_run(job: dict) -> dict:
    """Three seeds of every arm: mintrl-const resolved above grpo, mintrl-rest below mintrl-const, the KL rising with
    the share, mintrl-rest's controls growing by half over the intervention steps."""
    pass1, pass8, kl, last_control, seconds = FULL_RUNS[job["arm"]]
    rewrite = job["arm"] == "mintrl-rewrite"  # its judge share near 35% (all but seed 2), seeds 1-2 at the cap
    capped = 0.5 if rewrite and job["seed"] else 0.02
    logs = [{"step": step, "reward": 0.1, "completions/mean_length": 200.0, "completions/clipped_ratio": capped}
            for step in (1, 2, 3, 4)]  # fmt: skip
    if job["arm"].startswith("mintrl"):
        share = (0.5 if job["seed"] == 2 else 0.35) if rewrite else 0.05
        for entry, control in zip(logs[:2], (200.0, last_control), strict=True):
            entry.update({"mintrl/interventions_active": 1.0, "mintrl/judge_token_frac": share,
                          "mintrl/length_control": control, "mintrl/reward_gap": 0.9})  # fmt: skip
    final = {"pass@1": pass1[job["seed"]], "pass@8": pass8[job["seed"]], "longer_pass@1": 0.05,
             "longer_pass@8": 0.2, "chat_nll": 2.6, "chat_nll_change": 0.01 * job["seed"], "kl": kl}  # fmt: skip
    return {**job, "logs": logs, "step_seconds": [seconds] * 4, "train_seconds": 4 * seconds, "final": final,
            "scores": {"heldout": {"sample_seconds": 60.0}}, "curve": {},
            "machine_during": {"load_during_mean": 2.0}}  # fmt: skip


def test_the_report_reads_each_hypothesis_by_its_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(study, "run_job", full_run)
    monkeypatch.setattr(study, "measure_warm_start", fake_measure)
    study.main(["--workers", "0", "--out", str(tmp_path)])
    text = (tmp_path / "intensity_real.md").read_text()
    assert (
        "- I1 (mintrl-const above grpo): pass@1 +5.0 [+2.5, +7.5], pass@8 +6.0 [+3.5, +8.5] points: supported" in text
    )
    assert "the paper's shape: below 0: mintrl-rest − mintrl-const pass@1, mintrl-rest − mintrl-const pass@8" in text
    assert "holds in 6 of 9 MInTRL runs; fails in mintrl-rest s0, mintrl-rest s1, mintrl-rest s2." in text
    assert (
        "mintrl-lines4 0.030, mintrl-rest 0.050 (as predicted); any run's largest chat NLL change +0.020 (under"
        in text
    )
    assert "mintrl-const s/step ÷ grpo 1.10 [1.10, 1.10]" in text and "mintrl-rest ÷ mintrl-const 0.97" in text
    assert (
        "| mintrl-rest s1 | 5.0 | 0.90 | 200.0 | 300.0 | 50 | 2.0 | 12.0 | 43.0 | 0.050 | 0.010 | 320 | 2.00 |" in text
    )
    assert "| chain | mintrl-rest − mintrl-const | -5.0 [-7.5, -2.5] |" in text
    assert (
        "- I6 (mintrl-rewrite, the ~35% share): judge share over the intervention steps s0 35.0%, s1 35.0%, s2 50.0% "
        "(predicted 25-45% in each: not held); − mintrl-const pass@1 -3.0 [-5.5, -0.5] (predicted below 0: as "
        "predicted, resolved); − grpo pass@1 +2.0 [-2.3, +6.3] (predicted above 0: as predicted); at the cap in the "
        "last "
        "quarter (10% or more) in 2 of 3 runs (predicted at least 2 of 3); highest mean KL of every arm: yes "
        "(predicted yes)." in text
    )
    assert "Warm start (`benchmarks.tasks.real.warm_start`, hash `f6b614b5ff98`)" in text
    assert "after one on 1024 [7, 8, 9]-step problems" in text and "drawn by vllm" in text


def test_a_gain_whose_interval_includes_zero_is_the_predicted_sign_unresolved(tmp_path, monkeypatch):
    monkeypatch.setitem(FULL_RUNS, "mintrl-const", ([0.15, 0.09, 0.12], [0.46, 0.40, 0.43], 0.02, 210.0, 330.0))
    monkeypatch.setattr(study, "run_job", full_run)
    monkeypatch.setattr(study, "measure_warm_start", fake_measure)
    study.main(["--workers", "0", "--out", str(tmp_path)])
    assert (
        "points: the sign as predicted, not resolved (an interval includes 0)."
        in (tmp_path / "intensity_real.md").read_text()
    )


def test_a_resolved_pass_at_1_with_an_unresolved_pass_at_8_does_not_support_i1(tmp_path, monkeypatch):
    monkeypatch.setitem(FULL_RUNS, "mintrl-const", ([0.15, 0.18, 0.12], [0.40, 0.48, 0.38], 0.02, 210.0, 330.0))
    monkeypatch.setattr(study, "run_job", full_run)
    monkeypatch.setattr(study, "measure_warm_start", fake_measure)
    study.main(["--workers", "0", "--out", str(tmp_path)])
    text = (tmp_path / "intensity_real.md").read_text()
    assert "- I1 (mintrl-const above grpo): pass@1 +5.0 [+2.5, +7.5], pass@8 +2.0" in text
    assert "points: the sign as predicted, not resolved (an interval includes 0)." in text
