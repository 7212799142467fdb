"""The beyond-the-papers benchmark end to end in its smallest mode, its plan, and the noisy rule judge it rests on."""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.toy.task import correct_step, make_problems, review_steps, rule_judge

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


def test_noisy_rule_judge_errs_at_its_rate_and_replays_for_a_seed():
    cases = _cases()
    assert all(review_steps(q, prefix, steps) == verdict for q, prefix, steps, verdict in cases)
    # p = 0: the exact judge, call for call
    exact = rule_judge(error_rate=0.0, seed=3)
    for question, prefix, steps, verdict in cases:
        assert exact.review_fn(question, prefix, steps, None) == verdict
        assert exact.correct_fn(question, prefix + "".join(steps), None) == correct_step(
            question, prefix + "".join(steps)
        )

    # p = 1: every right chunk flagged at one of its steps, wrong chunks keep the rule's index, every correction wrong
    always = rule_judge(error_rate=1.0, seed=3)
    for question, prefix, steps, verdict in cases:
        index = always.review_fn(question, prefix, steps, None)
        if verdict is None:
            assert index is not None and 0 <= index < len(steps)
        else:
            assert index == verdict
        right = correct_step(question, prefix)
        wrong = always.correct_fn(question, prefix, None)
        assert wrong != right and re.sub(r"\d+", "N", wrong) == re.sub(r"\d+", "N", right)  # one number changed
        changed = [(int(a), int(b)) for a, b in zip(re.findall(r"\d+", wrong), re.findall(r"\d+", right)) if a != b]
        assert len(changed) == 1 and 1 <= abs(changed[0][0] - changed[0][1]) <= 2 and changed[0][0] >= 0

    # p = 0.3: the same seed gives the same draws, another seed other draws; errors at about the rate p
    right = [(q, prefix, steps) for q, prefix, steps, verdict in cases if verdict is None] * 20

    def draws(seed):
        judge = rule_judge(error_rate=0.3, seed=seed)
        return [
            (judge.review_fn(q, prefix, steps, None), judge.correct_fn(q, prefix, None)) for q, prefix, steps in right
        ]

    first = draws(7)
    assert first == draws(7) and first != draws(8)
    flagged = sum(index is not None for index, _ in first) / len(first)
    corrupted = sum(text != correct_step(q, prefix) for (_, text), (q, prefix, _) in zip(first, right)) / len(first)
    assert 0.25 < flagged < 0.35 and 0.25 < corrupted < 0.35, (flagged, corrupted)


def test_full_plan_uses_its_pinned_24_steps_learning_full_problems_and_the_three_items():
    from benchmarks import beyond, learning

    settings = beyond.settings_for("full")
    jobs = beyond.plan_jobs(settings)
    full = learning.MODES["full"]
    assert len(settings["seeds"]) >= 3
    assert settings["steps"] == 24  # beyond.json's steps and the budget matching, not learning.py's full steps
    assert all(
        job["steps"] == 24
        and job["prompts_per_step"] == full["prompts_per_step"]
        and job["final_prompts"] == full["final_prompts"]
        and job["regime"] == "unreachable"
        for job in jobs
    )
    planned = {(job["label"], job["judge_error_rate"]) for job in jobs}
    noisy = {(label, p) for label in ("mintrl-const", "mintrl-proxy", "mintrl-vote") for p in (0.0, 0.1, 0.3)}
    assert noisy | {("grpo", 0.0), ("mintrl-budget", 0.0), ("mintrl-sort", 0.0)} == planned
    vote = next(job for job in jobs if job["label"] == "mintrl-vote")
    assert vote["overrides"] == {"judge_votes": 3, "judge_min_agree": 2} and vote["method"] == "mintrl-const"
    budget = next(job for job in jobs if job["label"] == "mintrl-budget")
    assert budget["overrides"]["judge_token_target"] == beyond.BUDGET_TARGET
    assert budget["overrides"]["intervention_steps"] == 24  # may review throughout; the stop rule ends it
    assert budget["overrides"]["intervention_stop_gap"] is not None
    assert len({job["name"] for job in jobs}) == len(jobs)


def test_beyond_smoke_mode_writes_a_report_recomputed_from_the_json(tmp_path):
    """Runs `benchmarks/beyond.py --smoke` (1 step, 2 prompts, 2 seeds) as a user would, then changes runs' numbers in
    the JSON and re-renders: the tables follow the JSON."""
    command = [sys.executable, "benchmarks/beyond.py", "--smoke", "--workers", "0", "--out", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=600)
    results = json.loads((tmp_path / "beyond.json").read_text())
    assert results["provenance"]["command"].startswith("python benchmarks/beyond.py --smoke")
    assert len(results["provenance"]["commit"]) == 40
    assert {(r["label"], r["judge_error_rate"], r["seed"]) for r in results["runs"]} == {
        (label, p, seed)
        for label, p in (
            ("grpo", 0.0),
            ("mintrl-const", 0.0),
            ("mintrl-vote", 0.3),
            ("mintrl-budget", 0.0),
            ("mintrl-sort", 0.0),
        )
        for seed in (0, 1)
    }
    for run in results["runs"]:
        keys = {k for entry in run["logs"] for k in entry}
        if run["label"] == "mintrl-vote":  # the trainer's vote metrics reach the run's record
            assert {"mintrl/vote_agreement", "mintrl/vetoed_revisions"} <= keys
        if run["label"] == "mintrl-budget":
            assert "mintrl/intervention_share" in keys
    table = (tmp_path / "beyond.md").read_text()
    assert "| mintrl-vote | 0.3 | 2 |" in table and results["provenance"]["commit"][:12] in table
    assert (tmp_path / "beyond_noise.png").stat().st_size > 0

    pass1 = {("mintrl-const", 0): 0.5, ("mintrl-const", 1): 0.3, ("mintrl-budget", 0): 0.2, ("mintrl-budget", 1): 0.6}
    pass1 |= {("mintrl-sort", 0): 0.1, ("mintrl-sort", 1): 0.3}
    for run in results["runs"]:  # GRPO and votes 0; const +50/+30; controller +20/+60; MInTRL + SORT +10/+30
        run["final"]["pass@1"] = pass1.get((run["label"], run["seed"]), 0.0)
        for entry in run["logs"]:
            if run["label"] == "mintrl-budget":  # 0.1 x 50 tokens x 16 rollouts = 80 judge tokens per step
                entry["mintrl/judge_token_frac"], entry["completions/mean_length"] = 0.1, 50.0
            if run["label"] == "mintrl-const":  # the fixed arm: 0.05 x 50 x 16 = 40 judge tokens
                entry["mintrl/judge_token_frac"], entry["completions/mean_length"] = 0.05, 50.0
            if run["label"] == "mintrl-vote":
                entry["mintrl/vote_agreement"] = 0.75 if run["seed"] == 0 else 0.25
    clean_votes = [  # votes with a noiseless judge at +10/+20, so p = 0.3 is -10/-20 against them
        dict(copy.deepcopy(run), judge_error_rate=0.0, final={**run["final"], "pass@1": 0.1 + 0.1 * run["seed"]})
        for run in results["runs"]
        if run["label"] == "mintrl-vote"
    ]
    results["runs"] += clean_votes
    results["settings"]["plan"].insert(2, ["mintrl-vote", 0.0])
    (tmp_path / "beyond.json").write_text(json.dumps(results))
    (tmp_path / "beyond.md").unlink()
    from benchmarks.beyond import README_END, README_START

    readme = tmp_path / "README.md"
    readme.write_text(f"{README_START}\nold\n{README_END}\n")
    replot = [
        sys.executable,
        "benchmarks/beyond.py",
        "--replot",
        str(tmp_path / "beyond.json"),
        "--readme",
        str(readme),
    ]
    subprocess.run(replot, cwd=ROOT, check=True, capture_output=True, timeout=300)
    lines = (tmp_path / "beyond.md").read_text().splitlines()

    def cells(prefix):
        return [c.strip() for c in next(line for line in lines if line.startswith(prefix)).split("|")]

    const = cells("| mintrl-const | 0 |")
    assert const[4] == "40.0 ± 14.1"  # pass@1 mean ± std of 50 and 30
    assert const[6] == "+40.0 [-87.1, +167.1]" and const[7] == "no"  # paired vs GRPO, t(1) = 12.706
    noisy_votes = cells("| mintrl-vote | 0.3 |")
    assert noisy_votes[8] == "-15.0 [-78.5, +48.5]" and noisy_votes[9] == "no"  # paired vs the same method at p=0
    votes = cells("| 0.3 | 2 |")
    assert votes[3] == "50.0 ± 35.4"  # agreement mean ± std of 75 and 25
    controller = cells("| controller |")
    assert controller[3] == "80 ± 0"  # total judge tokens of a 1-step run
    assert controller[7] == "40.0 ± 28.3" and controller[8] == "+40.0 [-214.1, +294.1]"
    line = next(line for line in lines if line.startswith("Controller - fixed"))
    assert "pass@1 +0.0 [-381.2, +381.2] (no)" in line  # (+20 - 50, +60 - 30) paired by seed
    assert line.endswith("judge tokens controller / fixed 2.00 [2.00, 2.00].")  # 80 / 40 on both seeds
    combined = cells("| mintrl-sort |")
    assert combined[3] == "20.0 ± 14.1" and combined[5:7] == ["+20.0 [-107.1, +147.1]", "no"]  # vs GRPO
    readme_text = readme.read_text()  # the README's block comes from the same JSON
    assert "old" not in readme_text
    assert "| MInTRL + SORT (plain: mintrl-const) | 20.0 ± 14.1 | +20.0 [-107.1, +147.1] |" in readme_text
