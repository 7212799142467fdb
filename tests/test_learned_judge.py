"""The learned toy judge: what it is trained on parses back to the rule judge's answers, its accuracy
is counted right, and the benchmark's runs train MInTRL through the package's model judge (`judge="model"`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _review(wrong_step, steps=("1+2=3", "3+4=7", "7-1=6")) -> dict:
    request = dict(
        question="Compute 1+2+4-1 =", prefix="", steps=list(steps), reference="1+2=3", last_step_complete=True
    )
    return {"request": request, "verdict": {"wrong_step": wrong_step, "failed": False}}


def _correction(text: str) -> dict:
    request = dict(question="Compute 1+2+4-1 =", prefix="1+2=3\n\n", reference="1+2=3")
    return {"request": request, "correction": {"text": text, "failed": False}}


def test_training_answers_parse_back_to_the_rule_judges_verdicts_and_corrections():
    """The judge learns to write exactly what `parse_verdict` / `parse_correction` turn back into the rule's answer,
    from prompts rendered by the templates `GeneratingJudge` renders at training time."""
    from benchmarks.tasks.toy.learned_judge import JUDGE_CORRECTION_TEMPLATE, JUDGE_REVIEW_TEMPLATE, training_examples
    from trl_mintrl.judges.base import CorrectionRequest, ReviewRequest
    from trl_mintrl.judges.parsing import parse_correction, parse_verdict
    from trl_mintrl.judges.templates import JudgeTemplates

    transcripts = {"reviews": [_review(None), _review(0), _review(2)], "corrections": [_correction("3+4=7\n\n")]}
    examples = training_examples(transcripts)
    assert [answer for _, answer in examples] == [
        "VERDICT: KEEP",
        "VERDICT: REVISE 1",
        "VERDICT: REVISE 3",
        "3+4=7\n\n",
    ]
    for (_messages, answer), row in zip(examples[:3], transcripts["reviews"], strict=True):
        assert parse_verdict(answer, num_steps=3).wrong_step == row["verdict"]["wrong_step"]
    assert parse_correction(examples[3][1], truncated=False).text == "3+4=7\n\n"
    templates = JudgeTemplates(JUDGE_REVIEW_TEMPLATE, JUDGE_CORRECTION_TEMPLATE)
    assert examples[0][0] == [
        {"role": "user", "content": templates.render_review(ReviewRequest(**transcripts["reviews"][0]["request"]))}
    ]
    assert examples[3][0][0]["content"] == templates.render_correction(
        CorrectionRequest(**transcripts["corrections"][0]["request"])
    )
    assert "## Reference solution" in examples[0][0][0]["content"]  # the judge reads the reference


def test_accuracy_counts_against_the_rule_judge_by_hand():
    """Rule: KEEP, REVISE 2, REVISE 3, KEEP, KEEP; judge: REVISE 2, REVISE 2, KEEP, failed, KEEP. Corrections: one
    right, one failed."""
    from benchmarks.tasks.toy.learned_judge import judge_accuracy
    from trl_mintrl.judges.base import Correction, Judge, Verdict

    class Scripted(Judge):
        def review(self, requests):
            return [Verdict(1), Verdict(1), Verdict(None), Verdict(failed=True), Verdict(None)][: len(requests)]

        def correct(self, requests):
            return [Correction("3+4=7\n\n"), Correction(failed=True)][: len(requests)]

    transcripts = {
        "reviews": [_review(None), _review(1), _review(2), _review(None), _review(None)],
        "corrections": [_correction("3+4=7\n\n"), _correction("7-1=6\n\n")],
    }
    acc = judge_accuracy(Scripted(), transcripts, batch_size=8)
    assert (acc["rule_revise"], acc["judge_revise"]) == (2, 2)
    assert acc["revise_precision"] == 0.5 and acc["revise_recall"] == 0.5  # both revise only the second chunk
    assert acc["first_wrong_step_accuracy"] == 1.0  # ... at the same step
    assert acc["false_revise"] == pytest.approx(1 / 3)  # of the rule's 3 KEEPs, one revised
    assert acc["missed_error"] == 0.5  # of the rule's 2 REVISEs, one kept (a failed review would count as KEEP)
    assert acc["review_parse_failures"] == 0.2
    assert acc["wrong_correction"] == 0.0 and acc["exact_corrections"] == 0.5 and acc["correction_failures"] == 0.5


def test_the_recording_judge_keeps_every_request_with_the_inner_judges_answer():
    from benchmarks.tasks.toy.learned_judge import RecordingJudge
    from benchmarks.tasks.toy.task import rule_judge
    from trl_mintrl.judges.base import CorrectionRequest, ReviewRequest

    judge = RecordingJudge(rule_judge(notation="near"))
    requests = [
        ReviewRequest("Compute 1+2~4 =", "", ["1+2=3\n\n", "3+4=7\n\n"]),
        ReviewRequest("Compute 1+2 =", "", ["1+2=3"]),
    ]
    verdicts = judge.review(requests)
    assert [v.wrong_step for v in verdicts] == [1, None]  # 3~4 = 6
    fixes = judge.correct([CorrectionRequest("Compute 1+2~4 =", "1+2=3\n\n")])
    assert fixes[0].text == "3+4=6\n\n"
    assert [r for r, _ in judge.reviews] == requests and judge.reviews[0][1] is verdicts[0]
    assert judge.corrections[0][1] is fixes[0]


def test_transcripts_leave_out_the_benchmarks_evaluation_problems():
    from benchmarks.tasks.toy.learned_judge import JUDGE_HELDOUT_SEED, JUDGE_TRAIN_SEED, excluded_questions
    from benchmarks.tasks.toy.training import HELDOUT_SEED, REGIMES

    excluded = excluded_questions()
    assert {p.question for p in REGIMES["in-band"].problems(96, seed=HELDOUT_SEED)} <= excluded
    assert JUDGE_TRAIN_SEED != JUDGE_HELDOUT_SEED


def test_a_learned_judge_job_builds_the_package_model_judge_from_its_config():
    """The benchmark's run is learning.py's in-band job whose trainer builds `GeneratingJudge` itself from
    `judge="model"` and the committed judge's folder, with the compact templates."""
    from benchmarks.studies import learned_judge, learning
    from benchmarks.tasks.toy.arms import job_judge
    from benchmarks.tasks.toy.learned_judge import JUDGE_DIR, JUDGE_REVIEW_TEMPLATE, judge_config_fields

    jobs = learned_judge.planned_jobs({"seeds": [0, 1, 2, 3, 4], "learning_mode": "full"})
    assert [j["label"] for j in jobs[:3]] == ["grpo", "mintrl-const", "mintrl-learned"]
    learned = jobs[2]
    assert learned["overrides"] == {"_learned_judge": True}
    assert job_judge(learned) is None  # the trainer builds it
    assert job_judge(jobs[1]) is not None  # the rule judge
    fields = judge_config_fields()
    assert fields["judge"] == "model" and fields["judge_model_name_or_path"] == str(JUDGE_DIR)
    assert fields["judge_review_template"] == JUDGE_REVIEW_TEMPLATE
    grpo = learning.plan_jobs(learning.MODES["full"] | {"mode": "full"}, ["band"])[0]
    assert jobs[0] == grpo  # so learning.json's recorded runs are reused


@pytest.mark.slow
def test_learned_judge_smoke_trains_mintrl_through_the_model_judge(tmp_path):
    """`benchmarks/studies/learned_judge.py --smoke` as a user runs it: 1 step of MInTRL with the committed learned judge
    loaded by the trainer (`judge="model"`), whose reviews are parsed (no failures: its answers are well formed)."""
    from benchmarks.tasks.toy.learned_judge import JUDGE_DIR

    if not (JUDGE_DIR / "build.json").is_file():
        pytest.fail(f"{JUDGE_DIR} holds no judge: build it with `python -m benchmarks.studies.learned_judge --build`")
    command = [sys.executable, "-m", "benchmarks.studies.learned_judge", "--smoke", "--workers", "0", "--out", str(tmp_path),
               "--learning", str(tmp_path / "none.json")]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=900)
    results = json.loads((tmp_path / "learned_judge.json").read_text())
    learned = [r for r in results["runs"] if r["label"] == "mintrl-learned"]
    assert len(learned) == 1
    log = learned[0]["logs"][0]
    assert log["mintrl/interventions_active"] == 1
    assert log["mintrl/judge_parse_failures"] == 0
    assert "mintrl-learned" in (tmp_path / "learned_judge.md").read_text()


def test_replot_rewrites_the_readme_block_from_the_json(tmp_path):
    """`learned_judge.py --replot JSON --readme README` writes the block from the JSON's runs: the committed result,
    then the same with one learned-judge run changed, whose difference to GRPO moves with it."""
    from benchmarks.studies import learned_judge

    results = json.loads((ROOT / "benchmarks/results/learned_judge.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text(f"{learned_judge.README_START}\nold\n{learned_judge.README_END}\n")
    path = tmp_path / "learned_judge.json"
    path.write_text(json.dumps(results))
    learned_judge.main(["--replot", str(path), "--readme", str(readme)])
    block = readme.read_text()
    assert "old" not in block and "| learned |" in block
    grpo = {r["seed"]: r["final"]["pass@1"] for r in results["runs"] if r["label"] == "grpo"}
    learned = {r["seed"]: r["final"]["pass@1"] for r in results["runs"] if r["label"] == "mintrl-learned"}
    mean = 100 * sum(learned[s] - grpo[s] for s in learned) / len(learned)
    assert f"| learned | {100 * sum(learned.values()) / len(learned):.1f} ± " in block and f"{mean:+.1f} [" in block
    for run in results["runs"]:
        if run["label"] == "mintrl-learned" and run["seed"] == 0:
            run["final"]["pass@1"] += 0.5  # 50 points more on one of 5 seeds: +10 on the mean difference
    path.write_text(json.dumps(results))
    learned_judge.main(["--replot", str(path), "--readme", str(readme)])
    assert f"{mean + 10:+.1f} [" in readme.read_text()
