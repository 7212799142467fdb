"""benchmarks/studies/comparison_real.py: the MInTRL arm is the intensity ablation's best share by the rule written
before its results, the ablation's runs of the same jobs are reused (not run again, not recorded twice), SORT's
references fit the chain's solutions, and the confirmation is read on the fresh seeds alone. Runs are faked."""

import json

import pytest

from benchmarks.lib.harness import job_key
from benchmarks.studies import comparison_real as study
from benchmarks.studies import intensity_real
from benchmarks.tasks.real.arms import config_fields
from benchmarks.tasks.real.run import plan_jobs
from tests.test_intensity_real import fake_measure

# the ablation's mean pass@1 over seeds 0-2 by MInTRL arm: mintrl-lines4 is the best
ABLATION_PASS1 = {"grpo": 0.10, "mintrl-const": 0.14, "mintrl-lines4": 0.16, "mintrl-rest": 0.12}
# pass@1 on seeds 3-5: mintrl-lines4 gains over grpo on these, loses on seeds 0-2's fakes below
FRESH_PASS1 = {"grpo": [0.10, 0.11, 0.12], "mintrl-lines4": [0.15, 0.15, 0.18], "sft-grpo": [0.12, 0.12, 0.12],
               "sort": [0.09, 0.10, 0.11]}  # fmt: skip
STEP_SECONDS = {"mintrl-lines4": 330.0, "sort": 390.0}  # the others 300


def fake_run(job: dict) -> dict:
    """A run's record: pass@1 from `FRESH_PASS1` on seeds 3-5, else 0.11 (+ 0.001 x seed)."""
    fresh = FRESH_PASS1.get(job["arm"]) if job["seed"] >= 3 else None
    pass1 = fresh[job["seed"] - 3] if fresh else 0.11 + 0.001 * job["seed"]
    final = {"pass@1": pass1, "pass@8": pass1 + 0.3, "longer_pass@1": 0.05, "longer_pass@8": 0.2, "chat_nll": 2.6,
             "chat_nll_change": 0.0, "kl": 0.01}  # fmt: skip
    seconds = STEP_SECONDS.get(job["arm"], 300.0)
    logs = [{"step": 1, "reward": 0.5, "completions/mean_length": 190.0, "completions/clipped_ratio": 0.05}]
    return {**job, "logs": logs, "step_seconds": [seconds], "train_seconds": seconds, "final": final, "scores": {"heldout": {"sample_seconds": 60.0}}, "curve": {},
            "machine_during": {"load_during_mean": 2.0}}  # fmt: skip


def ablation_file(tmp_path, arms=tuple(ABLATION_PASS1)):
    """intensity_real.json as its full mode records it, the runs' pass@1 averaging `ABLATION_PASS1` over seeds 0-2."""
    baselines, jobs = plan_jobs({"mode": "full", **intensity_real.MODES["full"], "engine": "vllm"})
    runs = []
    for job in jobs:
        if job["arm"] in arms:
            record = fake_run(job)
            record["final"]["pass@1"] = ABLATION_PASS1[job["arm"]] + 0.01 * (job["seed"] - 1)
            runs.append({**record, "recorded": {"key": job_key(job), "commit": "abc1234"}})
    measured = [{**fake_measure(job), "recorded": {"key": job_key(job)}} for job in baselines]
    path = tmp_path / "intensity_real.json"
    path.write_text(json.dumps({"settings": {}, "baselines": measured, "runs": runs}))
    return path


@pytest.fixture
def ran(monkeypatch):
    names = []
    monkeypatch.setattr(study, "run_job", lambda job: names.append(job["name"]) or fake_run(job))
    monkeypatch.setattr(study, "measure_warm_start", lambda job: names.append(job["name"]) or fake_measure(job))
    return names


def test_the_best_share_is_chosen_and_the_ablations_runs_are_reused(tmp_path, ran):
    out = tmp_path / "out"
    study.main(["--workers", "0", "--out", str(out), "--ablation", str(ablation_file(tmp_path))])
    saved = json.loads((out / "comparison_real.json").read_text())
    assert saved["settings"]["mintrl_arm"] == "mintrl-lines4"
    assert saved["settings"]["plan"] == {"chain": ["grpo", "mintrl-lines4", "sft-grpo", "sort"]}
    # seeds 0-2 of grpo and mintrl-lines4 and the warm start's measure come from the ablation
    assert ran[:6] == [f"real-chain-{arm}-s{seed}" for seed in (0, 1, 2) for arm in ("sft-grpo", "sort")]
    assert ran[6:] == [f"real-chain-{arm}-s{seed}" for seed in (3, 4, 5) for arm in
                       ("grpo", "mintrl-lines4", "sft-grpo", "sort")]  # fmt: skip
    assert len(saved["runs"]) == 24 and len(saved["baselines"]) == 1
    text = (out / "comparison_real.md").read_text()
    assert (
        "`mintrl-lines4`, by the rule" in text and "mintrl-const 14.0%, mintrl-lines4 16.0%, mintrl-rest 12.0%" in text
    )
    fresh, every = text.split("Paired differences on the fresh seeds")[1].split("On every seed")
    assert "| chain | mintrl-lines4 − grpo | +5.0 [" in fresh  # seeds 3-5 alone: +5, +4, +6
    assert "| chain | mintrl-lines4 − grpo | +5.0 [" not in every
    assert (
        "- C1 (mintrl-lines4 above grpo, pass@1): +5.0 [+2.5, +7.5] points: holds, resolved (interval above 0)."
        in text
    )
    assert ": does not hold (mintrl-lines4 − sft-grpo pass@1)." in text  # C2: +4.0 on the fresh seeds
    assert "sort − grpo -1.0 [-1.0, -1.0], sort − sft-grpo -2.0 [-4.5, +0.5]: does not hold (sort − grpo)." in text
    assert "MInTRL runs at the cap under 10% in the last quarter: 3 of 3;" in text
    assert (
        "mintrl-lines4 s/step ÷ grpo 1.10 [1.10, 1.10] (predicted within 1.3x: yes); sort s/step ÷ grpo 1.30" in text
    )


def test_a_second_sitting_keeps_every_record_once(tmp_path, ran):
    ablation = str(ablation_file(tmp_path))
    out = str(tmp_path / "out")
    study.main(["--workers", "0", "--out", out, "--ablation", ablation, "--max_runs", "2"])
    study.main(["--resume", "--workers", "0", "--out", out, "--ablation", ablation, "--max_runs", "1"])
    assert ran == ["real-chain-sft-grpo-s0", "real-chain-sort-s0", "real-chain-sft-grpo-s1"]
    saved = json.loads((tmp_path / "out" / "comparison_real.json").read_text())
    keys = [r["recorded"]["key"] for r in saved["runs"]]
    assert len(keys) == len(set(keys)) == 9  # 6 reused, 3 run
    text = (tmp_path / "out" / "comparison_real.md").read_text()
    assert "- C1 (mintrl-lines4 above grpo, pass@1): - points: open (fewer than 2 paired fresh seeds)." in text


def test_the_mintrl_arm_waits_for_the_whole_ablation(tmp_path, ran):
    ablation = str(ablation_file(tmp_path, arms=("grpo", "mintrl-const", "mintrl-lines4")))
    with pytest.raises(
        SystemExit, match="finish benchmarks.studies.intensity_real first, or run --arms sft-grpo sort"
    ):
        study.main(["--workers", "0", "--out", str(tmp_path / "out"), "--ablation", ablation])
    study.main(["--workers", "0", "--out", str(tmp_path / "out"), "--ablation", ablation, "--arms", "sort",
                "--max_runs", "1"])  # fmt: skip
    assert ran == ["real-chain-sort-s0"]
    saved = json.loads((tmp_path / "out" / "comparison_real.json").read_text())
    assert saved["settings"]["plan"] == {"chain": ["grpo", "sft-grpo", "sort"]}
    text = (tmp_path / "out" / "comparison_real.md").read_text()
    assert "The MInTRL arm: not chosen yet (the ablation's seeds are not all recorded)" in text
    assert "mintrl-const 14.0%, mintrl-lines4 16.0%)" in text  # the means recorded so far


def test_the_same_jobs_as_the_ablations_and_sorts_references_fit_the_chain(tmp_path):
    settings = {"mode": "full", **study.MODES["full"], "engine": "vllm",
                "plan": {"chain": ["grpo", "mintrl-rest", "sft-grpo", "sort"]}}  # fmt: skip
    _, jobs = plan_jobs(settings)
    _, ablation = plan_jobs({"mode": "full", **intensity_real.MODES["full"], "engine": "vllm"})
    ablation_keys = {job_key(job) for job in ablation}
    assert {job["name"] for job in jobs if job_key(job) in ablation_keys} == {
        f"real-chain-{arm}-s{seed}" for arm in ("grpo", "mintrl-rest") for seed in (0, 1, 2)
    }
    sort = next(job for job in jobs if job["arm"] == "sort")
    assert config_fields("sort", sort, str(tmp_path))["max_reference_tokens"] == 320
    assert "max_reference_tokens" not in config_fields("grpo", jobs[0], str(tmp_path))


def test_a_gain_whose_interval_includes_zero_holds_unresolved(tmp_path, ran, monkeypatch):
    monkeypatch.setitem(FRESH_PASS1, "mintrl-lines4", [0.15, 0.10, 0.18])  # +5, -1, +6 points over grpo
    out = tmp_path / "out"
    study.main(["--workers", "0", "--out", str(out), "--ablation", str(ablation_file(tmp_path))])
    text = (out / "comparison_real.md").read_text()
    assert "- C1 (mintrl-lines4 above grpo, pass@1): +3.3 [" in text and "points: holds, not resolved." in text


def test_the_cost_mode_reads_c5_from_the_first_steps(tmp_path, ran):
    out = tmp_path / "out"
    argv = ["--cost", "--engine", "transformers", "--workers", "0", "--out", str(out)]
    study.main([*argv, "--ablation", str(ablation_file(tmp_path))])
    assert ran == ["real-chain-grpo-s0", "real-chain-mintrl-lines4-s0"]  # no warm-start measure for a step's cost
    text = (out / "comparison_real_cost_transformers.md").read_text()
    assert (
        "- C5 on transformers: mintrl-lines4's first step (interventions) 330 s, grpo's 300 s: 1.10x (predicted "
        in text
    )
