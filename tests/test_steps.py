"""Steps at blank lines and code fences (MInTRL paper), on real-looking code chunks, through the rollout loop."""

from __future__ import annotations

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
