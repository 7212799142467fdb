"""`trl-mintrl judge-check`: the recipe's trainer rolls out a few prompts once, and the report says what the judge
did (reviews, REVISE rate, failures by kind, judge-token share, a few reviews) and whether it is usable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import free_port

from benchmarks.toy.task import correct_step, review_steps
from trl_mintrl.cli import COMMANDS
from trl_mintrl.cli import main as cli_main
from trl_mintrl.cli.judge_check import main
from trl_mintrl.judges import FunctionJudge

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
         "--judge_function", f"{__name__}.flaky_rule_judge", "--prompts", "2"],
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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["grpo", "--config", RECIPE], r"judge-check takes a method with a judge, one of \['mintrl', 'mintrl-sort'\]"),
        (["mintrl", "--config", RECIPE, "--prompts", "0"], "--prompts 0: give a positive number"),
        (["mintrl", "--config", RECIPE, "--intervention_steps", "0"], "intervention_steps=0, .*nothing to check"),
        (["mintrl", "--config", RECIPE, "--learning_rat", "1"], "'--learning_rat' \\(did you mean"),  # train's checks
    ],
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
