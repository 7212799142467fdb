"""`trl-mintrl judge-check`: the recipe's trainer rolls out a few prompts once, and the report says what the judge
did (reviews, REVISE rate, failures by kind, judge-token share, a few reviews) and whether it is usable."""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import free_port

from benchmarks.tasks.toy.task import correct_step, review_steps
from trl_mintrl.cli import COMMANDS
from trl_mintrl.cli import main as cli_main
from trl_mintrl.cli.judge_agreement import compare_with_reference, reference_verdicts
from trl_mintrl.cli.judge_check import JudgeRecorder, main, reviewed_chunks
from trl_mintrl.judges import FunctionJudge, ReviewRequest, Verdict

REPO = Path(__file__).resolve().parent.parent
RECIPE = str(REPO / "recipes" / "cpu" / "mintrl.yaml")

# what the judge of `flaky_rule_judge` answered, appended as it answers
ANSWERS: dict[str, list] = {"review": [], "correct": []}


def flaky_rule_judge() -> FunctionJudge:
    """The CPU recipe's rule judge, except that every 4th review raises, every 4th keeps the chunk unread, and every
    3rd correction raises: each kind of answer the report counts. Each answer is kept in ANSWERS."""

    def review(question, prefix, steps, reference):
        call = len(ANSWERS["review"])
        answer = "raised" if call % 4 == 0 else None if call % 4 == 1 else review_steps(question, prefix, steps)
        ANSWERS["review"].append(answer)
        if answer == "raised":
            raise RuntimeError("judge bug")
        return answer

    def correct(question, prefix, reference):
        call = len(ANSWERS["correct"])
        answer = "raised" if call % 3 == 0 else correct_step(question, prefix, reference)
        ANSWERS["correct"].append(answer)
        if answer == "raised":
            raise RuntimeError("judge bug")
        return answer

    return FunctionJudge(review, correct)


# The scripted judges of the reference comparison. The checked judge answers its i-th review by SCRIPT[i % 7] and
# queues the reference's answer for the same chunk (the reference asks after the rollout, in the same order); "last"
# is the chunk's last step, "raise" a failed review. Per cycle: 3 chunks both revise (at the same step, or the judge
# later or earlier when the chunk has several steps), 1 only the judge revises, 2 only the reference (one of them a
# failed review), 1 both keep: precision 3/4, recall 3/5.
SCRIPT = [(0, 0), (0, None), (None, 0), (None, None), ("raise", 0), ("last", 0), (0, "last")]
SCRIPTED: dict = {"checked": [], "checked_calls": [], "reference_calls": [], "planned": defaultdict(list)}


def _step(answer, steps):
    return len(steps) - 1 if answer == "last" else answer


class ScriptedChecked(FunctionJudge):
    """The judge under check: SCRIPT's first answers, batch sizes kept."""

    def review(self, requests):
        SCRIPTED["checked_calls"].append(len(requests))
        return super().review(requests)


class ScriptedReference(FunctionJudge):
    """The reference: for each chunk, the answer the checked judge's script planned for it; batch sizes kept."""

    def review(self, requests):
        SCRIPTED["reference_calls"].append(len(requests))
        return super().review(requests)


def scripted_checked_judge() -> FunctionJudge:
    def review(question, prefix, steps, reference):
        ours, theirs = SCRIPT[len(SCRIPTED["checked"]) % len(SCRIPT)]
        ours, theirs = _step(ours, steps), _step(theirs, steps)
        SCRIPTED["checked"].append((ours, theirs))
        SCRIPTED["planned"][question, prefix, tuple(steps)].append(theirs)
        if ours == "raise":
            raise RuntimeError("judge bug")
        return ours

    return ScriptedChecked(review, lambda question, prefix, reference: correct_step(question, prefix))


def scripted_reference_judge() -> FunctionJudge:
    def review(question, prefix, steps, reference):
        return SCRIPTED["planned"][question, prefix, tuple(steps)].pop(0)

    return ScriptedReference(review, lambda question, prefix, reference: "")


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    """The recipe names its data and the toy task relative to the repository root, where users run it."""
    monkeypatch.chdir(REPO)


def judge_check(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, printed report) of `trl-mintrl judge-check ARGV`, through the command dispatcher."""
    try:
        cli_main(["judge-check", *argv])
        status = 0
    except SystemExit as exit_info:
        status = exit_info.code
    return status, capsys.readouterr().out


def reported(report: str, name: str) -> str:
    """The value column of the report's line `name`."""
    return re.search(rf"^  {name}\s+(.+)$", report, flags=re.M).group(1)


def test_a_working_judge_is_reported_as_it_answered(tiny_model_path, tmp_path, capsys):
    for answers in ANSWERS.values():
        answers.clear()
    out = tmp_path / "out"
    status, report = judge_check(
        ["mintrl", "--config", RECIPE, "--model_name_or_path", tiny_model_path, "--output_dir", str(out),
         "--judge_function", f"{__name__}.flaky_rule_judge", "--prompts", "2", "--judge_share_warning", "0.01"],
        capsys,
    )  # fmt: skip
    reviews, corrections = ANSWERS["review"], ANSWERS["correct"]
    failed_reviews, failed_corrections = reviews.count("raised"), corrections.count("raised")
    usable = len(reviews) - failed_reviews
    revise = sum(isinstance(answer, int) for answer in reviews)
    assert status == 0, report
    assert report.startswith("judge-check: 2 prompts x 4 intervened rollouts (beside 4 controls each)")
    assert reported(report, "reviews asked") == str(len(reviews))
    assert reported(report, "REVISE rate") == f"{revise / usable:.2f} ({revise} REVISE of {usable} usable reviews)"
    assert reported(report, "failed reviews").startswith(f"{failed_reviews} of {len(reviews)} ")
    assert reported(report, "failed corrections").startswith(f"{failed_corrections} of {len(corrections)} ")
    # a function judge has no server: every failure is an unusable answer, as mintrl/judge_parse_failures counts it
    assert reported(report, "these failures").startswith(
        f"{failed_reviews + failed_corrections} unusable answers (mintrl/judge_parse_failures), 0 unanswered"
    )
    assert 0 < float(reported(report, "judge-token share").split()[0]) < 1  # corrections were inserted
    # above the recipe's judge_share_warning (0.01 here): the report says training will warn, and names the fix
    assert "above judge_share_warning=0.01: training warns when two" in report and "judge_token_target=0.03" in report
    revised, control, ratio = re.match(
        r"([\d.]+) tokens against the controls' ([\d.]+) \(([\d.]+)x", reported(report, "revised length")
    ).groups()
    assert float(ratio) == pytest.approx(float(revised) / float(control), abs=0.006)
    assert ("at or above revised_length_warning=1.5" in report) == (float(ratio) >= 1.5)
    written = [answer for answer in corrections if answer != "raised"]
    with_answer = sum("Answer: " in answer for answer in written)  # the toy's judge ends a solution "Answer: 14"
    assert 0 < with_answer < len(written)
    assert reported(report, "answer in correction").startswith(
        f"{with_answer} of {len(corrections)} corrections write a final answer"
    )
    assert reported(report, "answer in correction").endswith("(end_at_judge_answer=True ends the rollout there)")
    assert failed_reviews and failed_corrections and revise and usable > revise  # every kind of answer was met
    # the reviews shown, revised first: the chunk, the step the rule flagged, the correction it wrote
    shown = report.split("reviews (up to 3, revised first):\n")[1].split("\n  [")
    assert len(shown) == 3 and all("verdict     REVISE at step 1 of " in review for review in shown)
    for review in shown:  # each with the correction written for it: the question's first step (nothing accepted)
        question = ast.literal_eval(re.search(r"question +(.+)", review).group(1))
        assert "after 0 accepted characters)" in review, review
        correction = re.search(r"correction +(.+)", review).group(1)
        assert correction in (repr(correct_step(question, "")), "FAILED: no usable answer, the chunk is kept")
    assert any("correction  '" in review for review in shown)
    assert report.rstrip().endswith(f"judge-check: usable. {usable} of {len(reviews)} reviews answered.")
    assert not out.exists() or not any(out.iterdir())  # nothing trained, nothing saved


def test_a_judge_whose_reviews_all_fail_exits_1_naming_the_fields_to_change(tiny_model_path, tmp_path, capsys):
    """judge='self' (the tiny policy, shown the reference) with a one-token review budget: every review is cut."""
    recipe = tmp_path / "self-judge.yaml"
    lines = Path(RECIPE).read_text().splitlines(keepends=True)
    recipe.write_text("".join(line for line in lines if not line.startswith("judge_function:")))
    status, report = judge_check(
        ["mintrl", "--config", str(recipe), "--model_name_or_path", tiny_model_path, "--output_dir",
         str(tmp_path / "out"), "--judge", "self", "--judge_max_review_tokens", "1", "--prompts", "1"],
        capsys,
    )  # fmt: skip
    assert status == 1, report
    asked = int(reported(report, "reviews asked"))
    assert asked > 0 and reported(report, "failed reviews").startswith(f"{asked} of {asked} ")
    assert reported(report, "REVISE rate").startswith("n/a (0 REVISE of 0 usable reviews)")
    assert reported(report, "judge-token share").startswith("0.000 ")  # failed reviews are KEEP: no correction
    assert "verdict     FAILED: no usable answer, counted as KEEP" in report
    verdict = report.rstrip().splitlines()[-1]
    assert verdict.startswith("judge-check: NOT USABLE. MInTRL judge: ")  # the trainer's JudgeFailureWarning
    assert "raise judge_max_review_tokens=1" in verdict and "judge_chat_template_kwargs=" in verdict


def test_an_unreachable_endpoint_judge_counts_transport_failures_and_names_its_server(
    tiny_model_path, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    url = f"http://127.0.0.1:{free_port()}/v1"  # nobody listens: every request is refused
    recipe = tmp_path / "endpoint-judge.yaml"
    lines = Path(RECIPE).read_text().splitlines(keepends=True)
    recipe.write_text("".join(line for line in lines if not line.startswith("judge_function:")))
    status, report = judge_check(
        ["mintrl", "--config", str(recipe), "--model_name_or_path", tiny_model_path, "--output_dir",
         str(tmp_path / "out"), "--judge", "endpoint", "--judge_base_url", url, "--judge_model", "judge",
         "--judge_check_endpoint", "false", "--judge_max_retries", "0", "--prompts", "1"],
        capsys,
    )  # fmt: skip
    assert status == 1, report
    asked = int(reported(report, "reviews asked"))
    assert reported(report, "these failures").startswith(
        f"0 unusable answers (mintrl/judge_parse_failures), {asked} unanswered requests"
    )
    verdict = report.rstrip().splitlines()[-1]
    assert verdict.startswith("judge-check: NOT USABLE. MInTRL judge: ") and f"judge_base_url='{url}'" in verdict


def test_the_judge_is_measured_against_a_reference_judge(tiny_model_path, tmp_path, capsys):
    """Scripted judges with known disagreements: the report and the JSON count them as the script planned."""
    for key in ("checked", "checked_calls", "reference_calls"):
        SCRIPTED[key].clear()
    SCRIPTED["planned"].clear()
    out, report_path = tmp_path / "out", tmp_path / "report" / "check.json"
    status, report = judge_check(
        ["mintrl", "--config", RECIPE, "--model_name_or_path", tiny_model_path, "--output_dir", str(out),
         "--judge_function", f"{__name__}.scripted_checked_judge", "--prompts", "2",
         "--reference_judge", f"{__name__}.scripted_reference_judge", "--json", str(report_path)],
        capsys,
    )  # fmt: skip
    answers = SCRIPTED["checked"]
    assert len(answers) >= 2 * len(SCRIPT), answers  # every case of the script met at least twice
    both = [(ours, theirs) for ours, theirs in answers if ours not in (None, "raise") and theirs is not None]
    only_checked = sum(ours not in (None, "raise") and theirs is None for ours, theirs in answers)
    only_reference = sum(ours in (None, "raise") and theirs is not None for ours, theirs in answers)
    failed = sum(ours == "raise" for ours, _ in answers)
    same = sum(ours == theirs for ours, theirs in both)
    precision, recall = len(both) / (len(both) + only_checked), len(both) / (len(both) + only_reference)
    assert precision != recall  # a swap would show (the steps are compared in the next test: the tiny model's
    # chunks are mostly one step, where the judge's "last" is the reference's 0)
    # the report's existing lines and verdict are unchanged (a failed review is 1 in 7: usable)
    assert status == 0, report
    assert reported(report, "reviews asked") == str(len(answers))
    assert report.rstrip().endswith(f"usable. {len(answers) - failed} of {len(answers)} reviews answered.")
    assert re.search(
        rf"^against the reference judge FunctionJudge\(review_fn=scripted_reference_judge.<locals>.review, .*\): "
        rf"{len(answers)} reviewed chunks compared$",
        report,
        flags=re.M,
    ), report
    assert reported(report, "REVISE precision").startswith(
        f"{precision:.2f} ({len(both)} of {len(both) + only_checked} "
    )
    assert reported(report, "REVISE recall").startswith(f"{recall:.2f} ({len(both)} of {len(both) + only_reference} ")
    assert reported(report, "first wrong step").startswith(f"{same / len(both):.2f} ({same} of {len(both)} ")
    assert reported(report, "judge failures").startswith(f"{failed} of {len(answers)} chunks ")
    assert reported(report, "judge failures").endswith(f"the reference revises {failed} of them)")
    # one reference call per review round of the rollout, with that round's requests
    assert SCRIPTED["reference_calls"] == SCRIPTED["checked_calls"] and len(SCRIPTED["checked_calls"]) > 1
    assert not any(SCRIPTED["planned"].values())  # every planned answer was asked for

    written = json.loads(report_path.read_text())
    assert written["exit_status"] == 0 and written["verdict"] == report.rstrip().splitlines()[-1]
    assert written["command"].startswith("trl-mintrl judge-check mintrl --config ")
    assert written["command"].endswith(
        f"--prompts 2 --reference_judge {__name__}.scripted_reference_judge --json {report_path}"
    )
    assert written["reviews_asked"] == len(answers) and written["failed_reviews"] == failed
    reference = written["reference"]
    assert reference["precision"] == precision and reference["recall"] == recall
    assert (reference["compared"], reference["reference_failed"]) == (len(answers), 0)
    assert (reference["both_revise"], reference["only_checked"]) == (len(both), only_checked)
    assert (reference["only_reference"], reference["checked_failed"]) == (only_reference, failed)
    assert reference["same_step"] == same
    assert reference["checked_earlier"] == sum(ours < theirs for ours, theirs in both)
    assert reference["checked_later"] == sum(ours > theirs for ours, theirs in both)
    expected = [("failed" if ours == "raise" else ours, theirs) for ours, theirs in answers]
    recorded = [(review["checked"], review["reference"]) for review in reference["reviews"]]
    assert sorted(recorded, key=str) == sorted(expected, key=str)  # every chunk, with both decisions


def test_votes_share_one_reference_review_and_a_broken_reference_is_left_out():
    """judge_votes=3, judge_min_agree=2: a chunk's three votes are one request, asked of the reference once; the
    decision compared is the rollout's (two votes at or before a step), and a reference that raises compares
    nothing."""
    chunk = ReviewRequest("q", "", ["a", "b", "c"], reference="r")
    other = ReviewRequest("q", "a", ["d", "e"], reference="r")
    votes = {id(chunk): [Verdict(2), Verdict(1), Verdict(failed=True)], id(other): [Verdict(0), Verdict(), Verdict()]}

    class Voting(FunctionJudge):
        def review(self, requests):
            return [votes[id(request)][requests[: i + 1].count(request) - 1] for i, request in enumerate(requests)]

    recorder = JudgeRecorder(Voting(lambda *a: None, lambda *a: ""))
    recorder.review([chunk] * 3 + [other] * 3)
    asked = []
    reference = FunctionJudge(lambda q, p, steps, r: asked.append(tuple(steps)) or 1, lambda *a: "")
    answers, error = reference_verdicts(reference, recorder.review_rounds)
    assert asked == [("a", "b", "c"), ("d", "e")] and error is None
    agreement = compare_with_reference(reviewed_chunks(recorder, 2), answers, "ref")
    assert [(r["checked_votes"], r["checked"], r["reference"]) for r in agreement.reviews] == [
        ([2, 1, "failed"], 2, 1),
        ([0, None, None], None, 1),
    ]
    assert (agreement.both_revise, agreement.checked_later, agreement.only_reference) == (1, 1, 1)
    assert (agreement.precision, agreement.recall, agreement.same_step_share) == (1.0, 0.5, 0.0)

    class Broken(FunctionJudge):
        def review(self, requests):
            raise ConnectionError("down")

    answers, error = reference_verdicts(Broken(lambda *a: None, lambda *a: ""), recorder.review_rounds)
    agreement = compare_with_reference(reviewed_chunks(recorder, 2), answers, "ref", error)
    assert (agreement.compared, agreement.reference_failed, agreement.precision, agreement.recall) == (
        0,
        2,
        None,
        None,
    )
    assert error.endswith("review raised ConnectionError: down")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["grpo", "--config", RECIPE], r"judge-check takes a method with a judge, one of \['mintrl', 'mintrl-sort'\]"),
        (["mintrl", "--config", RECIPE, "--prompts", "0"], "--prompts 0: give a positive number"),
        (["mintrl", "--config", RECIPE, "--intervention_steps", "0"], "intervention_steps=0, .*nothing to check"),
        (["mintrl", "--config", RECIPE, "--learning_rat", "1"], "'--learning_rat' \\(did you mean"),  # train's checks
        (
            ["mintrl", "--config", RECIPE, "--reference_judge", "nowhere.judge"],
            r"--reference_judge 'nowhere.judge': cannot import it \(No module named 'nowhere'\); give the dotted path of a zero-argument factory returning a trl_mintrl.judges.Judge",
        ),
        (["mintrl", "--config", RECIPE, "--reference_judge", "rule_judge"], r"'rule_judge': not a dotted path; give"),
        (
            ["mintrl", "--config", RECIPE, "--reference_judge", "benchmarks.tasks.toy.task.review_steps"],
            r"calling it with no arguments raised TypeError: .*; give the dotted path of a zero-argument factory",
        ),
        (
            ["mintrl", "--config", RECIPE, "--reference_judge", "builtins.dict"],
            r"--reference_judge 'builtins.dict': it returned a dict, not a Judge; give the dotted path",
        ),
        (["mintrl", "--config", RECIPE, "--json", "benchmarks"], "--json 'benchmarks': give the path of a file"),
    ],  # fmt: skip
)
def test_what_cannot_be_checked_fails_before_the_model_loads(argv, message, model_without_weights, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--model_name_or_path", model_without_weights, "--output_dir", str(tmp_path / "out")])
    assert str(exit_info.value.code).startswith("trl-mintrl judge-check: error: ")
    assert re.search(message, str(exit_info.value.code)), exit_info.value.code


def test_the_command_is_listed_and_has_help(capsys):
    assert COMMANDS["judge-check"][0] == "trl_mintrl.cli.judge_check"
    cli_main(["--help"])
    assert re.search(r"^  judge-check +try a MInTRL recipe's judge", capsys.readouterr().out, flags=re.M)
    cli_main(["judge-check", "--help"])
    assert capsys.readouterr().out.startswith("usage: trl-mintrl judge-check {mintrl,mintrl-sort} --config")


def test_the_revised_length_line_gives_the_ratio_and_says_when_training_would_warn():
    from trl_mintrl.cli.judge_check import length_lines

    # SmolLM2 in band at step 1: revised rollouts 41 tokens, controls 22
    [line, warning] = length_lines({"length_control": 22.0, "length_revised": 41.0}, 1.5)
    assert "41.0 tokens against the controls' 22.0 (1.86x" in line and "revised_length_warning=1.5" in warning
    assert len(length_lines({"length_control": 22.0, "length_revised": 22.4}, 1.5)) == 1  # the reachable regime
    assert len(length_lines({"length_control": 22.0, "length_revised": 41.0}, None)) == 1  # the warning off
    assert length_lines({"length_control": 22.0, "length_revised": None}, 1.5) == [
        "  revised length       no rollout revised"
    ]
