"""Steps at blank lines and code fences (MInTRL paper) or at lines (`step_split`), on real-looking code chunks and on
a real chat model's samples, through the rollout loop."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_mintrl_rollout import ScriptedPolicy, make_trajectory

from trl_mintrl.judges import FunctionJudge, JudgeTemplates, ReviewRequest
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings
from trl_mintrl.mintrl.steps import open_fence_at_end, split_steps

TWO_FUNCTIONS = (
    "We parse the input, then solve each case.\n"
    "```python\n"
    "def parse(line):\n"
    "    return list(map(int, line.split()))\n"
    "\n"
    "def solve(nums):\n"
    "    return max(nums) - min(nums) + 1\n"
    "```\n"
    "\n"
    "This runs in O(n)."
)


def test_fence_lines_and_blank_lines_inside_code_are_boundaries():
    assert split_steps(TWO_FUNCTIONS) == [
        "We parse the input, then solve each case.\n",
        "```python\ndef parse(line):\n    return list(map(int, line.split()))\n\n",
        "def solve(nums):\n    return max(nums) - min(nums) + 1\n```\n\n",
        "This runs in O(n).",
    ]


def test_tilde_fences_longer_fences_and_info_strings():
    text = "Plan:\n~~~~ python title=x\na = 1\n```\nb = 2\n~~~~\nc\n"
    # "```" does not close a "~~~~" fence: it is code
    assert split_steps(text) == ["Plan:\n", "~~~~ python title=x\na = 1\n```\nb = 2\n~~~~\n", "c\n"]
    assert split_steps("````\nx\n```\ny\n````\nz") == ["````\nx\n```\ny\n````\n", "z"]
    assert split_steps("```\nx\n```py\ny\n```\nz") == ["```\nx\n```py\ny\n```\n", "z"]  # an info string never closes


def test_backticks_inside_strings_and_inline_code_are_not_fences():
    text = (
        "Use `split` and ```inline``` code.\n"
        "```python\n"
        'FENCE = "```"\n'
        "doc = '''\n"
        "    ```\n"  # indented 4 spaces: not a fence line (CommonMark), still inside the code
        "'''\n"
        "```\n"
        "Done."
    )
    assert split_steps(text) == [
        "Use `split` and ```inline``` code.\n",
        "```python\nFENCE = \"```\"\ndoc = '''\n    ```\n'''\n```\n",
        "Done.",
    ]
    assert open_fence_at_end(text) is None
    # a line that starts with inline code in triple backticks is prose, not a fence
    assert split_steps("We call\n```f(x)``` twice.\nThen") == ["We call\n```f(x)``` twice.\nThen"]
    assert open_fence_at_end(text.rsplit("```\n", 1)[0]) == "```"


def test_a_fence_opened_in_one_chunk_and_closed_in_the_next():
    first_chunk = "```python\ndef parse(line):\n    return line.split()\n\ndef solve(nums):\n"
    second_chunk = "    return len(nums)\n```\nThe answer is the count."
    prefix = "We count the tokens.\n\n" + first_chunk
    assert open_fence_at_end(prefix) == "```"
    # knowing the chunk starts inside the block, its "```" closes the block and the prose is a step of its own
    assert split_steps(second_chunk, prefix=prefix) == ["    return len(nums)\n```\n", "The answer is the count."]
    # without the prefix the same line would open a block that swallows the prose
    assert split_steps(second_chunk) == ["    return len(nums)\n", "```\nThe answer is the count."]


def test_an_unfinished_prefix_line_continues_into_the_chunk():
    # the prefix ends in the middle of a fence line: the chunk's first line finishes it
    assert split_steps("thon\nx = 1\n```\ny", prefix="Code:\n```py") == ["thon\nx = 1\n```\n", "y"]
    # the prefix ends in the middle of a code line: "```" inside that line is not a fence
    assert split_steps('```")\nz = 2\n\nw', prefix='```\nprint("') == ['```")\nz = 2\n\n', "w"]


@pytest.mark.parametrize(
    "text",
    [TWO_FUNCTIONS, "", "\n\n", "```", "a\n\n\n```\n\n\nb\n```\n\n", "x\r\n\r\n```py\r\ny\r\n```\r\nz", "~~~\n\n~~~"],
)
def test_steps_join_back_to_the_chunk(text):
    for prefix in ["", "```\n", "ab"]:
        assert "".join(split_steps(text, prefix)) == text


def test_code_review_prompt_numbers_the_steps_the_rollout_splits():
    steps = split_steps(TWO_FUNCTIONS)
    prompt = JudgeTemplates("code", "code").render_review(ReviewRequest("Count.", "", steps))
    assert "code-fence lines" in prompt and "(1 to 4)" in prompt
    assert "### Step 2\n```python\ndef parse(line):" in prompt
    assert "### Step 3\ndef solve(nums):\n    return max(nums) - min(nums) + 1\n```\n\n### Step 4\nThis runs" in prompt


def test_judge_keeps_a_correct_function_and_revises_the_next(tiny_tokenizer):
    """A 2-function code chunk: the judge flags the second function (step 3); the first stays, the correction
    continues inside the code block, and the policy finishes after it."""
    tok = tiny_tokenizer
    seen = []

    def review(question, prefix, steps, reference):
        seen.append((prefix, steps))
        return next((i for i, s in enumerate(steps) if "max(nums) - min(nums) + 1" in s), None)

    judge = FunctionJudge(review, lambda q, prefix, ref: "def solve(nums):\n    return len(set(nums))\n")
    policy = ScriptedPolicy(tok, {1: [TWO_FUNCTIONS, "```\nThis runs in O(n)." + tok.eos_token]})
    trajectory = make_trajectory(1, intervened=True, budget=2)
    settings = RolloutSettings(chunk_size=512, max_reviews=2, max_correction_tokens=64, max_completion_length=512)
    InterventionRollout(policy, judge, tok, settings).run([trajectory])
    text = tok.decode(trajectory.completion_ids, skip_special_tokens=True)
    kept = "".join(split_steps(TWO_FUNCTIONS)[:2])
    assert text == kept + "def solve(nums):\n    return len(set(nums))\n" + "```\nThis runs in O(n)."
    assert trajectory.revisions == 1
    # the second review: its prefix ends inside the open code block, so the chunk's fence line closes it
    assert seen[1] == (kept + "def solve(nums):\n    return len(set(nums))\n", ["```\n", "This runs in O(n)."])
    assert open_fence_at_end(seen[1][0]) == "```"


# ----- where steps end: step_split modes -----

# A chat model's usual answer: one step per line, no blank line (SmolLM2-135M-Instruct writes this way; the tests
# below on its own samples read tests/data/smollm2_samples.json).
LINE_STEPS = "Tom buys 3 * 4 = 12 apples.\nHe has 5 + 12 = 17 apples.\n#### 17"
PARAGRAPHS = "First, 3 * 4 = 12.\n\nThen 5 + 12 = 17.\n\nThe answer is 17."


def test_line_mode_splits_at_every_line_and_keeps_blank_lines_with_the_step_before():
    assert split_steps(LINE_STEPS, mode="line") == [
        "Tom buys 3 * 4 = 12 apples.\n",
        "He has 5 + 12 = 17 apples.\n",
        "#### 17",
    ]
    assert split_steps(LINE_STEPS, mode="blank_line") == [LINE_STEPS]  # the paper's split: one step
    # paragraphs written one line each split the same in both modes (the paper's steps are lines there)
    assert split_steps(PARAGRAPHS, mode="line") == split_steps(PARAGRAPHS, mode="blank_line")
    assert split_steps(PARAGRAPHS, mode="line") == [
        "First, 3 * 4 = 12.\n\n",
        "Then 5 + 12 = 17.\n\n",
        "The answer is 17.",
    ]
    assert split_steps("a\r\nb\r\n\r\nc", mode="line") == ["a\r\n", "b\r\n\r\n", "c"]
    assert split_steps("\n\nx\ny", mode="line") == ["\n\nx\n", "y"]  # leading blank lines join the first step


def test_line_mode_keeps_code_blocks_whole_between_fences_and_blank_lines():
    """Code fences are respected in every mode: lines of code never split, a block splits at its fence lines and
    blank lines; the prose around it splits at lines."""
    assert split_steps(TWO_FUNCTIONS, mode="line") == split_steps(TWO_FUNCTIONS, mode="blank_line")
    text = "Read n.\nThen loop:\n```python\nfor i in range(n):\n    print(i)\n```\nIt prints n lines.\nDone."
    assert split_steps(text, mode="line") == [
        "Read n.\n",
        "Then loop:\n",
        "```python\nfor i in range(n):\n    print(i)\n```\n",
        "It prints n lines.\n",
        "Done.",
    ]
    assert split_steps(text, mode="blank_line") == ["Read n.\nThen loop:\n", "```python\nfor i in range(n):\n    print(i)\n```\n", "It prints n lines.\nDone."]  # fmt: skip
    # a chunk that starts inside a code block (the prefix opened it): its code lines stay together
    assert split_steps("    return x\n    # end\n```\nok\nfine", prefix="```py\ndef f(x):\n", mode="line") == [
        "    return x\n    # end\n```\n",
        "ok\n",
        "fine",
    ]


def test_auto_mode_uses_blank_lines_when_the_chunk_has_a_paragraph_break_else_lines():
    assert split_steps(LINE_STEPS, mode="auto") == split_steps(LINE_STEPS, mode="line")
    mixed = "To find it:\n3 * 4 = 12\n5 + 12 = 17\n\n#### 17"
    assert split_steps(mixed, mode="auto") == ["To find it:\n3 * 4 = 12\n5 + 12 = 17\n\n", "#### 17"]
    assert split_steps(mixed, mode="line") == ["To find it:\n", "3 * 4 = 12\n", "5 + 12 = 17\n\n", "#### 17"]
    # a blank line inside code, or only at the chunk's ends, is no paragraph break
    assert split_steps("a\n```\nx\n\ny\n```\nb\nc", mode="auto") == split_steps(
        "a\n```\nx\n\ny\n```\nb\nc", mode="line"
    )
    assert split_steps("\n\na\nb\n\n", mode="auto") == ["\n\na\n", "b\n\n"]


@pytest.mark.parametrize("mode", ["line", "blank_line", "auto"])
@pytest.mark.parametrize(
    "text",
    [
        TWO_FUNCTIONS,
        LINE_STEPS,
        PARAGRAPHS,
        "",
        "\n",
        "\n\n",
        "a\nb",
        "```",
        "x\r\n\r\n```py\r\ny\r\n```\r\nz",
        "~~~\n\n~~~",
    ],
)
def test_steps_join_back_to_the_chunk_in_every_mode(text, mode):
    for prefix in ["", "```\n", "ab", "line\n"]:
        steps = split_steps(text, prefix, mode)
        assert "".join(steps) == text
        assert all(steps) and (len(steps) <= 1 or all(step.strip() for step in steps))  # no empty, no blank step


def test_unknown_step_split_is_refused_naming_the_field_and_the_choices(cpu_args):
    from trl_mintrl import MInTRLConfig, MInTRLSORTConfig

    with pytest.raises(
        ValueError, match=r"split_steps\(mode='lines'\): mode must be one of \('line', 'blank_line', 'auto'\)"
    ):
        split_steps("a\nb", mode="lines")
    with pytest.raises(ValueError, match=r"step_split='paragraph' is not one of \('line', 'blank_line', 'auto'\)"):
        RolloutSettings(chunk_size=8, max_reviews=1, max_correction_tokens=8, max_completion_length=8, step_split="paragraph")  # fmt: skip
    for config in (MInTRLConfig, MInTRLSORTConfig):
        with pytest.raises(ValueError, match=r"step_split='paragraph' is not one of \('line', 'blank_line', 'auto'\)"):
            config(**{**cpu_args, "step_split": "paragraph"})
        assert config(**cpu_args).step_split == "line"


def test_line_mode_review_prompt_numbers_each_line(tiny_tokenizer):
    """The judge's prompt numbers the lines as steps, and its REVISE k keeps the k-1 lines before."""
    steps = split_steps(LINE_STEPS, mode="line")
    prompt = JudgeTemplates().render_review(ReviewRequest("Tom has 5 apples...", "", steps))
    assert (
        "### Step 1\nTom buys 3 * 4 = 12 apples.\n\n### Step 2\nHe has 5 + 12 = 17 apples.\n\n### Step 3\n#### 17"
        in prompt
    )
    assert "(1 to 3)" in prompt
    code = JudgeTemplates("code", "code").render_review(
        ReviewRequest("Count.", "", split_steps(TWO_FUNCTIONS, mode="line"))
    )
    assert "line breaks or blank lines in prose" in code and "code-fence lines" in code


@pytest.mark.parametrize("mode, kept", [("line", "Tom buys 3 * 4 = 12 apples.\n"), ("blank_line", "")])
def test_a_revise_of_the_second_line_keeps_the_first_only_in_line_mode(tiny_tokenizer, mode, kept):
    """The rollout splits with `RolloutSettings.step_split`: in line mode a judge that flags the second line keeps
    the first; with the paper's split the chunk is one step and the REVISE drops all of it."""
    tok = tiny_tokenizer
    flag = lambda q, prefix, steps, ref: next((i for i, s in enumerate(steps) if "5 + 12 = 18" in s), None)  # noqa: E731
    judge = FunctionJudge(flag, lambda q, prefix, ref: "He has 5 + 12 = 17 apples.\n")
    chunk = "Tom buys 3 * 4 = 12 apples.\nHe has 5 + 12 = 18 apples.\n#### 18"
    policy = ScriptedPolicy(tok, {3: [chunk, "#### 17" + tok.eos_token]})
    trajectory = make_trajectory(3, intervened=True, budget=2)
    settings = RolloutSettings(chunk_size=512, max_reviews=2, max_correction_tokens=64, max_completion_length=512, step_split=mode)  # fmt: skip
    InterventionRollout(policy, judge, tok, settings).run([trajectory])
    text = tok.decode(trajectory.completion_ids, skip_special_tokens=True)
    assert text == kept + "He has 5 + 12 = 17 apples.\n#### 17"
    assert trajectory.revisions == 1


def test_trainers_and_the_async_worker_pass_step_split_to_the_rollout(tiny_model_path, cpu_args, toy_dataset, monkeypatch, tiny_tokenizer):  # fmt: skip
    """Every place that builds the rollout's settings takes `step_split` from the config."""
    from mintrl_helpers import mintrl_args, revise_first_step_judge, role_reward, scripted_trainer
    from test_async_worker import worker_args
    from test_mintrl_continuous import FakeLM

    from trl_mintrl.mintrl import trainer as trainer_module
    from trl_mintrl.mintrl.async_.worker import MInTRLRolloutWorker

    seen = []
    original = trainer_module.rollout_for

    def spy(engine, judge, tokenizer, settings, *args, **kwargs):
        seen.append(settings.step_split)
        return original(engine, judge, tokenizer, settings, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "rollout_for", spy)
    scripted_trainer(tiny_model_path, mintrl_args(cpu_args, step_split="auto", max_steps=1), toy_dataset).train()
    assert seen and set(seen) == {"auto"}
    args = worker_args(cpu_args, step_split="blank_line")
    worker = MInTRLRolloutWorker(args, tiny_tokenizer, toy_dataset, [role_reward], revise_first_step_judge(), FakeLM(tiny_tokenizer))  # fmt: skip
    assert worker.settings.step_split == "blank_line"


# ----- on SmolLM2-135M-Instruct's own samples (tests/data/smollm2_samples.json) -----


def smollm2_texts() -> list[str]:
    record = json.loads((Path(__file__).resolve().parent / "data" / "smollm2_samples.json").read_text())
    return [sample["text"] for sample in record["samples"]]


def test_smollm2_samples_with_one_step_per_line_split_into_their_lines():
    """7 of the 24 samples write steps on single lines with no blank line: the paper's split makes each one step
    (a REVISE would drop all of it), line mode (and auto) gives its lines. 11 have a blank line, 6 no line break."""
    texts = smollm2_texts()
    blank = [i for i, text in enumerate(texts) if re.search(r"\n[ \t]*\n", text)]
    single = [i for i, text in enumerate(texts) if "\n" in text and i not in blank]
    assert single == [4, 6, 10, 12, 13, 19, 20] and len(blank) == 11
    for i in single:
        lines = texts[i].splitlines(keepends=True)
        assert split_steps(texts[i], mode="blank_line") == [texts[i]]
        assert split_steps(texts[i], mode="line") == split_steps(texts[i], mode="auto") == lines
    assert split_steps(texts[13], mode="line") == [
        "Lisa reads 3*2=6 pages in 2 weeks.\n",
        "There are 6 pages in 2 weeks * 6 days = 36 pages\n",
        "Lisa reads 1.5 pages per day * 2 weeks = 3.5 pages in 2 weeks\n",
        "So, Lisa reads 3.5 pages in 2 weeks",
    ]


def test_smollm2_samples_that_mix_blank_lines_and_line_steps():
    """5 samples (all with the benchmark's instruction) have a blank line and also paragraphs of several lines:
    'auto' takes the paper's split there, whose steps hold several of the model's lines; 'line' splits them all."""
    texts = smollm2_texts()
    mixed = [
        i
        for i, text in enumerate(texts)
        if re.search(r"\n[ \t]*\n", text)
        and any("\n" in step.rstrip() for step in split_steps(text, mode="blank_line"))
    ]
    assert mixed == [7, 11, 15, 18, 22]
    for i in mixed:
        assert split_steps(texts[i], mode="auto") == split_steps(texts[i], mode="blank_line")
        assert len(split_steps(texts[i], mode="line")) > len(split_steps(texts[i], mode="blank_line"))
    # sample 11: "Sure! ...\n\nStep-by-step:\n(12 / 1*1) x 10 + 8\nFind both numerator ..." in 2 steps or 7
    assert [len(split_steps(texts[11], mode=m)) for m in ("blank_line", "auto", "line")] == [2, 2, 7]
    for text in texts:
        for mode in ("line", "blank_line", "auto"):
            assert "".join(split_steps(text, mode=mode)) == text


@pytest.mark.parametrize("mode, kept_lines", [("line", 1), ("auto", 1), ("blank_line", 0)])
def test_a_revise_on_a_smollm2_sample_keeps_the_lines_before_the_wrong_one(tiny_tokenizer, mode, kept_lines):
    """Sample 13 as a chunk; the judge flags its second line (6 pages in 2 weeks * 6 days = 36): line and auto keep
    the first line, the paper's split drops the whole chunk."""
    tok, text = tiny_tokenizer, smollm2_texts()[13]
    correction = "Lisa reads 15 * 14 = 210 pages in 2 weeks.\n"
    flag = lambda q, prefix, steps, ref: next((i for i, s in enumerate(steps) if "36 pages" in s), None)  # noqa: E731
    judge = FunctionJudge(flag, lambda q, prefix, ref: correction)
    policy = ScriptedPolicy(tok, {4: [text, "#### 210" + tok.eos_token]})
    trajectory = make_trajectory(4, intervened=True, budget=2)
    settings = RolloutSettings(chunk_size=512, max_reviews=2, max_correction_tokens=64, max_completion_length=512, step_split=mode)  # fmt: skip
    InterventionRollout(policy, judge, tok, settings).run([trajectory])
    kept = "".join(text.splitlines(keepends=True)[:kept_lines])
    assert tok.decode(trajectory.completion_ids, skip_special_tokens=True) == kept + correction + "#### 210"
