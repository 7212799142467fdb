"""Judges: strict verdict parsing, prompt templates, the function judge and the generating judge (self / model)."""

from __future__ import annotations

import logging

import pytest

from trl_mintrl.engines.base import Generation, GenerationEngine
from trl_mintrl.judges import (
    CORRECTION_TEMPLATES,
    REVIEW_TEMPLATES,
    Correction,
    CorrectionRequest,
    FunctionJudge,
    GeneratingJudge,
    JudgeTemplates,
    ReviewRequest,
    Verdict,
    clean_correction,
    parse_correction,
    parse_verdict,
    resolve_template,
)
from trl_mintrl.judges.templates import STUDENT_NOTATION
from trl_mintrl.text import chat_token_ids

# ---------------------------------------------------------------------------------------------------- parse_verdict


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("All steps check out.\nVERDICT: KEEP", Verdict(wrong_step=None)),
        ("Step 2 adds wrongly.\n\nVERDICT: REVISE 2", Verdict(wrong_step=1)),
        ("VERDICT: REVISE 1", Verdict(wrong_step=0)),
        ("VERDICT: REVISE 3", Verdict(wrong_step=2)),
        ("verdict:keep", Verdict(wrong_step=None)),
        ("  Verdict :  Revise   2 .  \n\n  \n", Verdict(wrong_step=1)),
        ("[VERDICT: KEEP]", Verdict(wrong_step=None)),
        ("VERDICT: REVISE [2]", Verdict(wrong_step=1)),
        ("VERDICT: REVISE <3>", Verdict(wrong_step=2)),
        ("VERDICT: KEEP.", Verdict(wrong_step=None)),
        ("**VERDICT: REVISE 1**", Verdict(wrong_step=0)),
    ],
)
def test_parse_verdict_accepts_the_verdict_line_and_converts_to_0_based(text, expected):
    assert parse_verdict(text, num_steps=3) == expected


@pytest.mark.parametrize(
    "text",
    [
        "VERDICT: REVISE 4",  # out of range (3 steps)
        "VERDICT: REVISE 0",  # steps are 1-based in the answer
        "VERDICT: REVISE -1",
        "VERDICT: REVISE",
        "VERDICT: KEEP\nActually, on reflection step 2 is wrong.",  # verdict not on the last line
        "VERDICT: REVISE 2 because the sum is wrong",
        "The verdict is KEEP",
        "KEEP",
        "VERDICT: MAYBE",
        "VERDICT: KEEP or REVISE 2",
        "",
        "   \n\n",
        "ĠVERĠgarbageĊ 1 + 1",
    ],
)
def test_parse_verdict_rejects_everything_else(text):
    assert parse_verdict(text, num_steps=3) == Verdict(failed=True)


def test_clean_correction_strips_reasoning_and_labels():
    assert clean_correction("Correction: 2+3=5.\n") == "2+3=5.\n"  # a correction that ends its line
    assert clean_correction("2+3=5.\n\n\n \n") == "2+3=5.\n\n"  # at most a blank line: the step ends there
    assert clean_correction("Correction:\n    return len(nums)\n") == "    return len(nums)\n"  # code indentation
    assert clean_correction("\n\n    x = 1  ") == "    x = 1"
    assert clean_correction("  \n\n") == ""
    assert clean_correction("**Correction:** Then 7*6 = 42.") == "Then 7*6 = 42."
    assert clean_correction("  next step: divide by 2  ") == "divide by 2"
    assert clean_correction("<think>hmm, careful</think>\n\nSo x = 4.") == "So x = 4."
    # a thinking template opens <think> in the prompt: the answer holds only the closing tag
    assert clean_correction("hmm, careful\n</think>\n\nSo x = 4.") == "So x = 4."
    assert clean_correction("<think>\n\n</think>\n\nSo x = 4.") == "So x = 4."
    assert clean_correction("Answer: \\boxed{5}") == "Answer: \\boxed{5}"  # content, not a label
    assert clean_correction("") == ""
    assert clean_correction(None) == ""
    # an unclosed reasoning block is no correction at all
    assert clean_correction("<think>\nLet me check 2+3. It is") is None
    assert clean_correction("<think>a</think>\n<think>b") is None


def test_parse_correction_fails_when_cut_off_or_still_thinking():
    assert parse_correction("Correction: 2+3=5.", truncated=False) == Correction("2+3=5.")
    assert parse_correction("", truncated=False) == Correction("")  # an empty correction is allowed
    assert parse_correction("2+3=5. Then we multiply by", truncated=True) == Correction(failed=True)
    assert parse_correction("<think>\nSo 2+3 is", truncated=False) == Correction(failed=True)


def test_parse_verdict_reads_past_reasoning_and_fails_inside_it():
    assert parse_verdict("<think>\nstep 1 ok\n</think>\n\nVERDICT: REVISE 2", 2) == Verdict(1)
    assert parse_verdict("step 1 ok\n</think>\nVERDICT: KEEP", 2) == Verdict(None)
    # the verdict line written inside an unclosed reasoning block is a thought, not an answer
    assert parse_verdict("<think>\nmaybe VERDICT: KEEP\nVERDICT: KEEP", 2) == Verdict(failed=True)


# ---------------------------------------------------------------------------------------------------------- templates


def _review(reference=None, complete=True, steps=("2+3=6\n\n", "Answer: 6")):
    return ReviewRequest("Compute 2+3 {in braces}", "We add.\n\n", list(steps), reference, complete)


def test_review_template_reference_section_only_with_reference():
    templates = JudgeTemplates("math", "math")
    with_ref = templates.render_review(_review(reference="2+3=5"))
    without = templates.render_review(_review())
    assert "Reference solution" in with_ref and "2+3=5" in with_ref
    assert "Reference solution" not in without
    for text in (with_ref, without):
        assert "Compute 2+3 {in braces}" in text  # values are inserted verbatim
        assert "### Step 1\n2+3=6\n\n### Step 2\nAnswer: 6" in text
        assert "VERDICT: REVISE <k>" in text and "(1 to 2)" in text
    correction = templates.render_correction(CorrectionRequest("Compute 2+3", "We add.\n\n", "2+3=5"))
    assert "Reference solution" in correction and "2+3=5" in correction and "We add." in correction
    assert "Reference solution" not in templates.render_correction(CorrectionRequest("Compute 2+3", "We add.", None))


@pytest.mark.parametrize("preset", ["math", "code"])
@pytest.mark.parametrize("reference", [None, "2+3=5"])
@pytest.mark.parametrize("prefix", ["", "We add.\n\n"])
def test_correction_presets_ask_the_judge_to_keep_the_students_notation(preset, reference, prefix):
    """The plain text a judge is sent (the endpoint's one user message; chat formats: test_thinking_templates.py)."""
    text = JudgeTemplates(preset, preset).render_correction(CorrectionRequest("Compute 2+3", prefix, reference))
    assert STUDENT_NOTATION in text
    assert text.index("Write only the next short correct piece") < text.index(STUDENT_NOTATION)
    assert text.endswith("your text is appended to the solution as is.")  # still short, still appended as is


def test_review_template_unfinished_note_only_for_a_cut_chunk():
    templates = JudgeTemplates("code", "code")
    cut = templates.render_review(_review(complete=False))
    assert "Step 2 was cut off" in cut and "do not flag it for being incomplete" in cut
    assert "cut off" not in templates.render_review(_review(complete=True))


def test_code_steps_keep_their_indentation_and_empty_prefix_is_explained():
    templates = JudgeTemplates("code", "code")
    text = templates.render_review(ReviewRequest("Sum a list.", "", ["    total += x\n", "    return total\n"]))
    assert "### Step 1\n    total += x\n\n### Step 2\n    return total" in text
    assert "nothing yet" in text


def test_presets_and_custom_templates():
    assert resolve_template("math", "review") == REVIEW_TEMPLATES["math"]
    assert resolve_template("code", "correction") == CORRECTION_TEMPLATES["code"]
    assert REVIEW_TEMPLATES["math"] != REVIEW_TEMPLATES["code"]
    custom = JudgeTemplates("Q: {question}\n{reference}Steps ({num_steps}):\n{steps}", "Go on: {prefix}")
    text = custom.render_review(_review(reference="ref"))
    assert text.startswith("Q: Compute 2+3 {in braces}\n## Reference solution")
    assert "Steps (2):\n### Step 1" in text
    assert custom.render_correction(CorrectionRequest("q", "x = 1", None)) == "Go on: x = 1"


def test_custom_templates_keep_other_braces_and_never_substitute_twice():
    review = 'Put it in \\boxed{} or \\boxed{answer}; {0}, {x, y}, {question.attr} and {"a": 1} are text.\n{steps}'
    text = JudgeTemplates(review, "math").render_review(ReviewRequest("q", "", ["x = {question}"]))
    assert text == (
        'Put it in \\boxed{} or \\boxed{answer}; {0}, {x, y}, {question.attr} and {"a": 1} are text.\n'
        "### Step 1\nx = {question}"  # a value's braces are not read as a placeholder
    )


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        ("Check {steps} against {answer}", "review", r"judge_review_template` uses unknown field\(s\) \{answer\}"),
        ("Continue {prefix} with {steps}", "correction", r"judge_correction_template` uses unknown field.*\{steps\}"),
        ("Check {steps} of {questoin}", "review", r"unknown field\(s\) \{questoin\} \(did you mean \{question\}\?\)"),
        ("Is it right? {question}", "review", r"judge_review_template` must contain the placeholder\(s\) \{steps\}"),
        ("mathh", "review", "neither a preset"),
        ("", "correction", "preset name"),
    ],
)
def test_bad_templates_fail_with_a_clear_error(value, kind, message):
    with pytest.raises(ValueError, match=message):
        resolve_template(value, kind)


# ------------------------------------------------------------------------------------------------------ FunctionJudge


def test_function_judge_results_and_failures(caplog):
    def review_fn(question, prefix, steps, reference):
        if question == "boom":
            raise RuntimeError("checker crashed")
        return {"keep": None, "second": 1, "too far": len(steps), "negative": -1, "bool": True, "str": "0"}[question]

    def correct_fn(question, prefix, reference):
        if question == "boom":
            raise ZeroDivisionError("no")
        return 5 if question == "int" else f"fix after {prefix!r} using {reference}"

    judge = FunctionJudge(review_fn, correct_fn)
    names = ["keep", "second", "boom", "too far", "negative", "bool", "str"]
    with caplog.at_level(logging.WARNING):
        verdicts = judge.review([ReviewRequest(q, "p", ["a", "b"], "ref") for q in names])
    assert verdicts == [Verdict(None), Verdict(1)] + [Verdict(failed=True)] * 5
    assert "review_fn failed on 5 of 7 items" in caplog.text and "checker crashed" in caplog.text
    corrections = judge.correct([CorrectionRequest(q, "x", "r") for q in ("ok", "boom", "int")])
    assert corrections == [Correction("fix after 'x' using r"), Correction(failed=True), Correction(failed=True)]
    with pytest.raises(TypeError, match="review_fn"):
        FunctionJudge("not callable", correct_fn)


# ---------------------------------------------------------------------------------------------------- GeneratingJudge


class ScriptedEngine(GenerationEngine):
    """Answers each prompt with `script(prompt_text)`; `eos` appends EOS (a finished answer) unless told not to."""

    def __init__(self, tokenizer, script, eos=True):
        super().__init__([tokenizer.eos_token_id])
        self.tokenizer, self.script, self.eos = tokenizer, script, eos
        self.calls = []  # (prompt_ids, max_new_tokens, temperature) per call

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        self.calls.append((prompt_ids, max_new_tokens, temperature))
        outputs = []
        for ids in prompt_ids:
            reply = self.tokenizer(self.script(self.tokenizer.decode(ids)), add_special_tokens=False)["input_ids"]
            outputs.append(Generation(reply + ([self.tokenizer.eos_token_id] if self.eos else [])))
        return outputs


def _scripted_review(prompt: str) -> str:
    """Replies by question number: KEEP, REVISE 2, garbage, REVISE 9 (out of range), in turn."""
    n = int(prompt.split("Question number ")[1].split(".")[0])
    return ["Looks right.\nVERDICT: KEEP", "Step 2 is off.\nVERDICT: REVISE 2", "no idea", "VERDICT: REVISE 9"][n % 4]


@pytest.mark.parametrize("batch_size", [2, 32])
def test_generating_judge_one_engine_call_per_batch_exact_prompts_and_parsing(tiny_tokenizer, batch_size):
    engine = ScriptedEngine(tiny_tokenizer, _scripted_review)
    judge = GeneratingJudge(engine, tiny_tokenizer, "math", "math", max_review_tokens=40, temperature=0.0)
    requests = [
        ReviewRequest(f"Question number {i}. Compute {i}+1.", "", [f"{i}+1={i + 2}\n\n", "Answer"], f"{i}+1={i + 1}")
        for i in range(batch_size)
    ]
    verdicts = judge.review(requests)
    assert engine.num_calls == 1 and len(engine.calls) == 1
    prompt_ids, caps, temperature = engine.calls[0]
    assert caps == [40] * batch_size and temperature == 0.0
    assert prompt_ids == [chat_token_ids(tiny_tokenizer, judge.templates.render_review(r)) for r in requests]
    expected = [Verdict(None), Verdict(1), Verdict(failed=True), Verdict(failed=True)]
    assert verdicts == [expected[i % 4] for i in range(batch_size)]


def test_self_judge_puts_the_reference_in_review_and_correction_prompts(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, lambda prompt: "Correction: 2+3=5.")
    judge = GeneratingJudge(engine, tiny_tokenizer, max_correction_tokens=12, temperature=None)
    requests = [CorrectionRequest("Compute 2+3.", "We add.\n\n", "2+3=5 so 5"), CorrectionRequest("Compute 2+3.", "")]
    assert judge.correct(requests) == [Correction("2+3=5.")] * 2
    prompts = [tiny_tokenizer.decode(ids) for ids in engine.calls[0][0]]
    assert engine.calls[0][1:] == ([12, 12], None)
    assert prompts[0].startswith("<|im_start|>user\n") and prompts[0].endswith("<|im_start|>assistant\n")
    assert "## Reference solution (for you only; the student cannot see it)\n2+3=5 so 5" in prompts[0]
    assert "Reference solution" not in prompts[1]
    judge.review([ReviewRequest("Compute 2+3.", "", ["2+3=6"], "2+3=5 so 5")])
    assert "2+3=5 so 5" in tiny_tokenizer.decode(engine.calls[1][0][0])
    assert judge.review([]) == [] and judge.correct([]) == [] and engine.num_calls == 2  # nothing to ask: no call


def test_generating_judge_fails_a_review_cut_by_its_budget(tiny_tokenizer):
    answer = "VERDICT: REVISE 1"
    n_tokens = len(tiny_tokenizer(answer, add_special_tokens=False)["input_ids"])
    request = [ReviewRequest("q", "", ["a", "b"])]
    finished = GeneratingJudge(ScriptedEngine(tiny_tokenizer, lambda p: answer), tiny_tokenizer)
    assert finished.review(request) == [Verdict(0)]
    # Without EOS at exactly the budget the last line may be cut ("REVISE 1" of "REVISE 12"): not trusted.
    cut = GeneratingJudge(
        ScriptedEngine(tiny_tokenizer, lambda p: answer, eos=False), tiny_tokenizer, max_review_tokens=n_tokens
    )
    assert cut.review(request) == [Verdict(failed=True)]


def test_generating_judge_rejects_bad_settings(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, str)
    with pytest.raises(ValueError, match="max_review_tokens"):
        GeneratingJudge(engine, tiny_tokenizer, max_review_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        GeneratingJudge(engine, tiny_tokenizer, temperature=-1.0)
    with pytest.raises(ValueError, match="judge_correction_template"):
        GeneratingJudge(engine, tiny_tokenizer, correction_template="{nope}")


def test_model_judge_on_the_tiny_model_marks_garbage_failed(tiny_model_path):
    judge = GeneratingJudge.from_pretrained(
        tiny_model_path, device="cpu", max_review_tokens=6, max_correction_tokens=5, temperature=0.0
    )
    reviews = [ReviewRequest(f"Compute {i}+1", "", ["x\n\n", "y"], None, i % 2 == 0) for i in range(3)]
    verdicts = judge.review(reviews)
    assert verdicts == [Verdict(failed=True)] * 3  # random weights never write a verdict line
    corrections = judge.correct([CorrectionRequest("Compute 1+1", "1+1", "2")] * 3)
    # random weights do not stop within 5 tokens: a correction cut by its cap is a failure, never inserted
    assert corrections == [Correction(failed=True)] * 3
    assert judge.engine.num_calls == 2
