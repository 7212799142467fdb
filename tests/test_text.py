"""`trl_mintrl.text`: the one template convention (loaders, judges, SORT), thinking blocks and message text."""

import pytest

from trl_mintrl.data import LOADERS, fixture_path
from trl_mintrl.text import (
    check_template,
    content_text,
    fill_template,
    opens_thinking,
    outside_thinking,
    template_fields,
)


def test_fill_substitutes_known_fields_once_and_leaves_other_braces():
    template = 'Q: {question}\nPut it in \\boxed{} (or \\boxed{answer}); JSON {"a": 1}, sets {x, y}, {0}, {unknown}.'
    filled = fill_template(template, {"question": "Is {question} or \\frac{1}{2} bigger?", "answer": "no"})
    assert filled == (
        "Q: Is {question} or \\frac{1}{2} bigger?\n"  # the value's braces are not read as placeholders
        'Put it in \\boxed{} (or \\boxed{answer}); JSON {"a": 1}, sets {x, y}, {0}, {unknown}.'
    )
    assert fill_template("{n} steps: {steps}", {"n": 2, "steps": "a"}) == "2 steps: a"
    assert template_fields(template) == {"question", "unknown"}  # `\boxed{answer}` is a LaTeX argument


@pytest.mark.parametrize(
    "template, message",
    [
        ("{question} without it", r"`plan_template` must contain the placeholder\(s\) \{plan\}"),
        ("{question} {plan} {answr}", r"`plan_template` uses unknown field\(s\) \{answr\}; it may use"),
        ("{questoin} {plan}", r"unknown field\(s\) \{questoin\} \(did you mean \{question\}\?\)"),
        ("", "`plan_template` must be a template string"),
        (None, "`plan_template` must be a template string"),
    ],
)
def test_check_template_names_the_config_field(template, message):
    with pytest.raises(ValueError, match=message):
        check_template("plan_template", template, {"question", "plan"})


def test_check_template_accepts_latex_and_optional_fields():
    check_template("prompt_template", "{question}\n\nPut your final answer within \\boxed{}.", {"question"})
    check_template("prompt_template", "{question} Answer as \\boxed{answer}, not {x, y}.", {"question"})
    check_template("t", "{steps} only", {"steps", "reference"}, required={"steps"})


def test_loader_prompt_template_with_latex_needs_no_escaping():
    template = "Solve: {question}\nWrite \\boxed{answer} at the end."
    row = LOADERS["aime24"](str(fixture_path("aime24")), prompt_template=template, limit=1)[0]
    content = row["prompt"][0]["content"]
    assert content.startswith("Solve: ") and content.endswith("\nWrite \\boxed{answer} at the end.")
    assert "{question}" not in content


@pytest.mark.parametrize(
    "text, opened, expected",
    [
        ("plain answer", False, ("plain answer", False)),
        ("<think>hmm</think>\nplan", False, ("\nplan", False)),
        ("hmm\n</think>\nplan", False, ("\nplan", False)),  # a block the prompt opened: only the closing tag
        ("hmm\n</think>\nplan", True, ("\nplan", False)),
        ("hmm, still thinking", True, ("", True)),
        ("a <think>b</think> c <think>d", False, ("a  c ", True)),  # an unclosed block is cut with what follows
        ("<think>a</think>\n<think>b", False, ("\n", True)),
        ("x</think>y<think>z</think>w", False, ("yw", False)),
    ],
)
def test_outside_thinking(text, opened, expected):
    assert outside_thinking(text, opened=opened) == expected


def test_opens_thinking_and_content_text():
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thinking("no block")
    assert content_text([{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]) == "ab"
    assert content_text(None) == "" and content_text("s") == "s"
