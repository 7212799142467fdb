"""The beyond-the-papers benchmark end to end in its smallest mode, its plan, and the fallible rule judge it rests on."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.lib.records import error_of, total_judge_tokens
from benchmarks.tasks.toy.task import JUDGE_ERRORS, correct_step, make_problems, review_steps, rule_judge

ROOT = Path(__file__).resolve().parents[1]
SEPARATOR = "\n\n"


def _cases():
    """(question, prefix, chunk steps, the rule's verdict) over unreachable problems: right chunks, chunks with a wrong
    step (the policy's guess `a+b` for `a#b`), after an accepted prefix or from the start."""
    cases = []
    for problem in make_problems(40, 3, 6, seed=5, new_op=True):
        steps = [step + SEPARATOR for step in problem.steps[:-1]]
        cut = len(steps) // 2
        prefix, rest = "".join(steps[:cut]), steps[cut:]
        cases.append((problem.question, prefix, rest, None))
        cases.append((problem.question, "", steps[:2], None))
        wrong = rest[-1].replace("#", "+")
        cases.append((problem.question, prefix, [*rest[:-1], wrong], len(rest) - 1))
    return cases


CASES = _cases()
RIGHT = [case for case in CASES if case[3] is None]
WRONG = [case for case in CASES if case[3] is not None]


def _one_number_off(wrong: str, right: str) -> bool:
    """`wrong` is `right` with exactly one number changed, by 1 or 2, and not negative."""
    if wrong == right or re.sub(r"\d+", "N", wrong) != re.sub(r"\d+", "N", right):
        return False
    changed = [(int(a), int(b)) for a, b in zip(re.findall(r"\d+", wrong), re.findall(r"\d+", right)) if a != b]
    return len(changed) == 1 and 1 <= abs(changed[0][0] - changed[0][1]) <= 2 and changed[0][0] >= 0


def _observe(judge, repeat: int):
    """Each case reviewed and corrected `repeat` times: the share of right chunks flagged, of wrong chunks passed, of
    corrections changed; asserting on the way that every answer is one the error kinds allow."""
    flagged = passed = corrupted = corrections = 0
    for _ in range(repeat):
        for question, prefix, steps, verdict in CASES:
            index = judge.review_fn(question, prefix, steps, None)
            if verdict is None:
                flagged += index is not None
                assert index is None or (0 <= index < len(steps) and steps[index].strip())
            else:
                passed += index is None
                assert index in (None, verdict)  # a wrong chunk keeps the rule's index unless it is passed
            for text in (prefix, prefix + "".join(steps)):
                right = correct_step(question, text)
                correction = judge.correct_fn(question, text, None)
                corrections += 1
                if correction != right:
                    corrupted += 1
                    assert _one_number_off(correction, right), (correction, right)
    return flagged / (repeat * len(RIGHT)), passed / (repeat * len(WRONG)), corrupted / corrections


def test_rule_judge_rejects_rates_outside_zero_one_by_name():
    for kind in JUDGE_ERRORS:
        for bad in (-0.1, 1.5, "0.3", True, None):
            with pytest.raises(ValueError, match=kind):
                rule_judge(**{kind: bad})
    with pytest.raises(TypeError):
        rule_judge(error_rate=0.3)  # the single rate is gone: each kind has its own


def test_all_rates_zero_is_the_exact_judge_call_for_call():
    assert all(review_steps(q, prefix, steps) == verdict for q, prefix, steps, verdict in CASES)
    exact = rule_judge(false_revise=0.0, missed_error=0.0, wrong_correction=0.0, seed=3)
    assert exact.review_fn is review_steps and exact.correct_fn is correct_step
    assert _observe(exact, 1) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("kind", JUDGE_ERRORS)
def test_each_kind_fires_at_its_rate_on_its_chunks_only_and_the_others_never(kind):
    """One kind at a time: at rate 1 it fires every time on what it applies to, at 0.3 at about 0.3 (binomial sd
    <= 0.01 over these draws), and the two kinds at 0 never fire."""
    position = JUDGE_ERRORS.index(kind)
    for rate, low, high in ((1.0, 1.0, 1.0), (0.3, 0.26, 0.34)):
        observed = _observe(rule_judge(**{kind: rate}, seed=11), 40 if rate < 1 else 1)
        assert low <= observed[position] <= high, (kind, rate, observed)
        assert all(value == 0.0 for i, value in enumerate(observed) if i != position), (kind, rate, observed)


def test_errors_replay_for_a_seed_and_votes_of_one_chunk_can_disagree():
    def draws(seed):
        judge = rule_judge(false_revise=0.3, missed_error=0.3, wrong_correction=0.3, seed=seed)
        return [
            (judge.review_fn(q, prefix, steps, None), judge.correct_fn(q, prefix, None))
            for q, prefix, steps, _ in CASES * 5
        ]

    first = draws(7)
    assert first == draws(7) and first != draws(8)
    judge = rule_judge(missed_error=0.5, seed=1)  # three votes on one wrong chunk, many times: both answers occur
    question, prefix, steps, verdict = WRONG[0]
    votes = {judge.review_fn(question, prefix, steps, None) for _ in range(30)}
    assert votes == {None, verdict}


def test_a_jobs_judge_errors_reach_the_in_band_judge():
    """The toy task's `job_judge` forwards `judge_errors` to the regime's rule judge (near notation on in-band)."""
    from benchmarks.tasks.toy.arms import job_judge
    from benchmarks.tasks.toy.training import REGIMES

    job = {"regime": "in-band", "seed": 0, "judge_steps": 1, "overrides": {}}
    problem = REGIMES["in-band"].problems(1, seed=3)[0]
    steps = [step + SEPARATOR for step in problem.written_steps("near")[:-1]]
    wrong = [*steps[:-1], re.sub(r"=(\d+)", lambda m: f"={int(m.group(1)) + 1}", steps[-1], count=1)]
    flagged = review_steps(problem.question, "", wrong, notation="near")
    assert flagged is not None and review_steps(problem.question, "", steps, notation="near") is None
    assert job_judge(job).review_fn(problem.question, "", wrong, None) == flagged
    missing = job_judge({**job, "judge_errors": {"missed_error": 1.0}})
    assert missing.review_fn(problem.question, "", wrong, None) is None
    assert missing.review_fn(problem.question, "", steps, None) is None
    flagging = job_judge({**job, "judge_errors": {"false_revise": 1.0}})
    assert flagging.review_fn(problem.question, "", steps, None) is not None


def test_full_plan_is_13_arms_x_3_seeds_on_in_band_with_learnings_full_runs():
    from benchmarks.studies import beyond, learning

    settings = beyond.settings_for("full")
    jobs = beyond.plan_jobs(settings)
    full = learning.MODES["full"]
    assert settings["seeds"] == [0, 1, 2] and settings["regime"] == "in-band" and settings["steps"] == full["steps"]
    arms = {
        (job["label"], *(next(iter(job["judge_errors"].items())) if job["judge_errors"] else (None, 0.0)))
        for job in jobs
    }
    expected = {("grpo", None, 0.0), ("mintrl-const", None, 0.0), ("mintrl-budget", None, 0.0)}
    expected |= {("mintrl-sort", None, 0.0)} | {("mintrl-vote", kind, 0.3) for kind in JUDGE_ERRORS}
    expected |= {("mintrl-const", kind, p) for kind in JUDGE_ERRORS for p in (0.1, 0.3)}
    assert arms == expected and len(expected) == 13 and len(jobs) == 39  # 1 + 1 + 6 + 3 + 1 + 1 arms
    assert len({job["name"] for job in jobs}) == len(jobs)
    assert all(len(job["judge_errors"]) <= 1 for job in jobs)
    # the GRPO and plain MInTRL-const jobs are learning.py's full-mode in-band jobs at the same seeds, but for the name
    main = {
        (job["label"], job["seed"]): job
        for job in learning.plan_jobs({"mode": "full", **full})
        if job["regime"] == "in-band" and job["group"] == "main"
    }
    same = [job for job in jobs if job["label"] in ("grpo", "mintrl-const") and not job["judge_errors"]]
    assert len(same) == 6
    for job in same:
        ours = {k: v for k, v in job.items() if k not in ("name", "judge_errors")}
        theirs = {k: v for k, v in main[(job["label"], job["seed"])].items() if k != "name"}
        assert ours == theirs
    for job in jobs:  # every arm: the same steps, prompts, evaluation sets and curve spacing
        assert {k: job[k] for k in ("steps", "prompts_per_step", "final_prompts", "curve_prompts", "eval_every")} == {
            k: same[0][k] for k in ("steps", "prompts_per_step", "final_prompts", "curve_prompts", "eval_every")
        }
    vote = next(job for job in jobs if job["label"] == "mintrl-vote")
    assert vote["overrides"] == {"judge_votes": 3, "judge_min_agree": 2} and vote["method"] == "mintrl-const"
    budget = next(job for job in jobs if job["label"] == "mintrl-budget")
    assert budget["overrides"]["judge_token_target"] == beyond.BUDGET_TARGET
    assert budget["overrides"]["intervention_steps"] == full["steps"]  # may review throughout; the stop rule ends it
    assert budget["overrides"]["intervention_stop_gap"] == 0.1
    sort = next(job for job in jobs if job["label"] == "mintrl-sort")
    assert sort["method"] == "mintrl-sort" and sort["overrides"] == {}


def test_beyond_smoke_mode_writes_a_report_recomputed_from_the_json(tmp_path):
    """Runs `benchmarks/studies/beyond.py --smoke` (1 step, 2 prompts, 2 seeds) as a user would, then changes runs' numbers in
    the JSON and re-renders: the tables and the README block follow the JSON."""
    from benchmarks.studies import beyond

    command = [sys.executable, "-m", "benchmarks.studies.beyond", "--smoke", "--workers", "0", "--out", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=900)
    results = json.loads((tmp_path / "beyond.json").read_text())
    assert results["provenance"]["command"].startswith("python -m benchmarks.studies.beyond --smoke")
    assert len(results["provenance"]["commit"]) == 40
    assert {(r["label"], *error_of(r), r["seed"]) for r in results["runs"]} == {
        (*arm, seed) for arm in beyond.MODES["smoke"]["plan"] for seed in (0, 1)
    }
    assert all(r["regime"] == "in-band" for r in results["runs"])
    for run in results["runs"]:
        keys = {k for entry in run["logs"] for k in entry}
        if run["label"] == "mintrl-vote":  # the trainer's vote metrics reach the run's record
            assert {"mintrl/vote_agreement", "mintrl/vetoed_revisions"} <= keys
        if run["label"] == "mintrl-budget":
            assert "mintrl/intervention_share" in keys
    table = (tmp_path / "beyond.md").read_text()
    assert "| mintrl-vote | false REVISE | 0.3 | 2 |" in table and results["provenance"]["commit"][:12] in table
    assert "Not measured: no judge here reports a confidence" in table
    assert (tmp_path / "beyond_noise.png").stat().st_size > 0

    pass1 = {("mintrl-const", None, 0): 0.5, ("mintrl-const", None, 1): 0.3}
    pass1 |= {("mintrl-const", "false_revise", 0): 0.4, ("mintrl-const", "false_revise", 1): 0.3}
    pass1 |= {("mintrl-vote", "false_revise", 0): 0.5, ("mintrl-vote", "false_revise", 1): 0.2}
    pass1 |= {("mintrl-budget", None, 0): 0.2, ("mintrl-budget", None, 1): 0.6}
    pass1 |= {("mintrl-sort", None, 0): 0.1, ("mintrl-sort", None, 1): 0.3}
    for run in results["runs"]:  # GRPO 0; the plain judge +50/+30; with false REVISE +40/+30; votes +50/+20; ...
        kind, _ = error_of(run)
        run["final"]["pass@1"] = pass1.get((run["label"], kind, run["seed"]), 0.0)
        run["final"]["pass@8"] = 0.6 if (run["label"], kind) == ("mintrl-const", None) else 0.1
        for entry in run["logs"]:
            # judge tokens per step: share / (1 - share) x the policy's mean length x 16 rollouts
            if run["label"] == "mintrl-budget":  # 0.1 / 0.9 x 50 x 16 = 88.9
                entry["mintrl/judge_token_frac"], entry["completions/mean_length"] = 0.1, 50.0
            if (run["label"], kind) == ("mintrl-const", None):  # the fixed arm: 0.05 / 0.95 x 50 x 16 = 42.1
                entry["mintrl/judge_token_frac"], entry["completions/mean_length"] = 0.05, 50.0
            if run["label"] == "mintrl-vote":
                entry["mintrl/vote_agreement"] = 0.75 if run["seed"] == 0 else 0.25
    (tmp_path / "beyond.json").write_text(json.dumps(results))
    (tmp_path / "beyond.md").unlink()
    readme = tmp_path / "README.md"
    readme.write_text(f"{beyond.README_START}\nold\n{beyond.README_END}\n")
    replot = [
        sys.executable,
        "-m",
        "benchmarks.studies.beyond",
        "--replot",
        str(tmp_path / "beyond.json"),
        "--readme",
        str(readme),
    ]
    subprocess.run(replot, cwd=ROOT, check=True, capture_output=True, timeout=300)
    lines = (tmp_path / "beyond.md").read_text().splitlines()

    def cells(prefix):
        return [c.strip() for c in next(line for line in lines if line.startswith(prefix)).split("|")]

    plain = cells("| mintrl-const | - | 0 |")
    assert plain[5] == "40.0 ± 14.1"  # pass@1 mean ± std of 50 and 30
    assert plain[7:9] == ["+40.0 [-87.1, +167.1]", "no"]  # paired vs GRPO, t(1) = 12.706
    assert plain[9] == "+50.0 [+50.0, +50.0]" and plain[10] == "-"  # pass@8 vs GRPO; no plain for the plain judge
    noisy = cells("| mintrl-const | false REVISE | 0.3 |")
    assert noisy[10:13] == ["-5.0 [-68.5, +58.5]", "no", "-50.0 [-50.0, -50.0]"]  # vs the plain judge (-10, 0)
    votes_row = cells("| mintrl-vote | false REVISE | 0.3 |")
    assert votes_row[10] == "+0.0 [-127.1, +127.1]"  # vs the single review with the same error (+10, -10)
    votes = cells("| false REVISE | 0.3 | 2 |")
    assert votes[4] == "50.0 ± 35.4" and votes[8] == "+0.0 [-127.1, +127.1]"  # agreement of 75 and 25
    controller = cells("| controller |")
    assert controller[3] == "89 ± 0"  # total judge tokens of a 1-step run
    assert controller[7] == "40.0 ± 28.3" and controller[9] == "+40.0 [-214.1, +294.1]"
    line = next(line for line in lines if line.startswith("Controller - fixed"))
    assert "pass@1 +0.0 [-381.2, +381.2] (no)" in line  # (+20 - 50, +60 - 30) paired by seed
    assert line.endswith("judge tokens controller / fixed 2.11 [2.11, 2.11].")  # 88.9 / 42.1 on both seeds
    combined = cells("| mintrl-sort |")
    assert combined[3] == "20.0 ± 14.1" and combined[5:7] == ["+20.0 [-107.1, +147.1]", "no"]  # vs GRPO
    assert combined[8] == "-20.0 [-274.1, +234.1]"  # vs mintrl-const: (-40, 0)
    readme_text = readme.read_text()  # the README's block comes from the same JSON
    assert "old" not in readme_text
    for row in (
        "| grpo (no judge) | - | 2 | 0.0 ± 0.0 | - | - |",
        "| mintrl-const | - | 2 | 40.0 ± 14.1 | +40.0 [-87.1, +167.1] | - |",
        "| mintrl-const, false REVISE 0.3 | mintrl-const | 2 | 35.0 ± 7.1 | +35.0 [-28.5, +98.5] | -5.0 [-68.5, +58.5] |",
        "| mintrl-vote, false REVISE 0.3 | mintrl-const, false REVISE 0.3 | 2 | 35.0 ± 21.2 | +35.0 [-155.6, +225.6] "
        "| +0.0 [-127.1, +127.1] |",
        f"| budget controller (target {beyond.BUDGET_TARGET:g}) | fixed schedule | 2 | 40.0 ± 28.3 "
        "| +40.0 [-214.1, +294.1] | +0.0 [-381.2, +381.2] |",
        "| MInTRL + SORT | mintrl-const | 2 | 20.0 ± 14.1 | +20.0 [-107.1, +147.1] | -20.0 [-274.1, +234.1] |",
    ):
        assert row in readme_text, row


def test_judge_tokens_are_counted_from_the_share_of_every_completion_token():
    """TRL's completions/mean_length counts the policy's tokens only: at a judge share f the judge wrote f / (1 - f)
    of that per rollout (a share of 0.5 over 10 policy tokens is 10 judge tokens, not 5)."""
    from benchmarks.studies.beyond import ROLLOUTS

    logs = [{"mintrl/judge_token_frac": 0.5, "completions/mean_length": 10.0},
            {"mintrl/judge_token_frac": 0.2, "completions/mean_length": 20.0}, {"completions/mean_length": 30.0}]  # fmt: skip
    run = {"prompts_per_step": 2, "logs": logs}
    assert total_judge_tokens(run, ROLLOUTS) == pytest.approx((10.0 + 5.0) * 2 * ROLLOUTS)
