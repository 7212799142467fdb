"""Data loaders on their shipped fixtures (original schemas), Hub defaults, templates and dataset specs."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import datasets
import pytest

from trl_mintrl.data import LOADERS, dataset_task, fixture_path, load_dataset_by_name, resolve_dataset
from trl_mintrl.data.loaders import lcb_private_tests
from trl_mintrl.rewards import last_boxed, make_code_reward, make_math_reward, parse_tests

CATALOGUE = [name for name in LOADERS if name != "prepared"]
MATH = [name for name in CATALOGUE if LOADERS[name].task == "math"]
CODE = [name for name in CATALOGUE if LOADERS[name].task == "code"]


@pytest.fixture(scope="module")
def math_reward():
    function = make_math_reward(timeout=5.0)
    yield function
    function.verifier.close()


@pytest.fixture(scope="module")
def code_reward():
    return make_code_reward(timeout=5.0)


def load(name: str, **kwargs):
    return LOADERS[name](str(fixture_path(name)), **kwargs)


def test_every_loader_has_a_fixture_and_a_task():
    assert set(MATH) | set(CODE) == set(CATALOGUE) and len(CATALOGUE) >= 14
    for name in CATALOGUE:
        assert fixture_path(name).exists()


@pytest.mark.parametrize("name", MATH)
def test_math_loader(name, math_reward):
    dataset = load(name)
    assert set(dataset.column_names) == {"prompt", "solution", "answer"} and len(dataset) >= 2
    for row in dataset:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith(r"final answer within \boxed{}.")
        assert last_boxed(row["solution"]) == row["answer"]  # the gold the reward reads is the answer column
    # the gold answers round-trip through the reward: a completion boxing the answer scores 1
    completions = [f"So the result is \\boxed{{{answer}}}." for answer in dataset["answer"]]
    assert math_reward(completions, solution=dataset["solution"]) == [1.0] * len(dataset)


def test_math_loaders_normalise_answers_and_keep_worked_solutions():
    assert load("mintrl_math")["answer"] == ["14", "4", r"\frac{5}{6}"]  # the row without an answer is dropped
    assert load("amc23")["answer"] == ["27", "2.5"]  # floats from the Hub schema
    assert load("olympiadbench")["answer"] == ["10", "2, -2"]  # lists of "$...$" answers
    sort = load("sort_math")
    assert sort[0]["solution"].startswith("The width is") and sort[0]["solution"].endswith(r"\boxed{24}$.")
    assert sort[1]["solution"].endswith(r"The final answer is $\boxed{3}$.")  # box added to an unboxed solution
    assert r"\boxed{0.75}" in sort[2]["solution"] and last_boxed(sort[2]["solution"]) == r"\frac{3}{4}"


@pytest.mark.parametrize("name", CODE)
def test_code_loader(name):
    dataset = load(name)
    assert set(dataset.column_names) == {"prompt", "tests", "solution"} and len(dataset) >= 2
    for row in dataset:
        (message,) = row["prompt"]
        assert message["role"] == "user" and "```python" in message["content"]
        assert parse_tests(row["tests"])


@pytest.mark.parametrize("name", ["mintrl_code", "humanevalplus", "mbppplus"])
def test_reference_solutions_pass_their_tests(name, code_reward):
    dataset = load(name)
    completions = [f"```python\n{solution}\n```" for solution in dataset["solution"]]
    assert code_reward(completions, tests=dataset["tests"]) == [1.0] * len(dataset)
    wrong = ["```python\ndef unrelated():\n    pass\n```"] * len(dataset)
    assert code_reward(wrong, tests=dataset["tests"]) == [0.0] * len(dataset)


def test_deepcoder_subsets_get_the_right_test_kinds():
    rows = load("mintrl_code")
    kinds = [sorted({case.kind for case in parse_tests(row["tests"])}) for row in rows]
    assert kinds == [["stdin"], ["call"], ["stdin"], ["call"], ["call"], ["stdin"]]
    lcb_functional = parse_tests(rows[4]["tests"])
    assert {case.fn_name for case in lcb_functional} == {"maxValue"}  # from the row's metadata
    assert "class Solution" in rows[4]["prompt"][0]["content"]  # starter code shown
    assert "`reverse_words`" in rows[3]["prompt"][0]["content"]  # function name shown


def test_livecodebench_decodes_private_tests(code_reward):
    rows = load("livecodebench")
    first = parse_tests(rows[0]["tests"])
    assert [(case.input, case.expected) for case in first] == [("3\n", "6\n"), ("10\n", "20\n"), ("0\n", "0\n")]
    second = parse_tests(rows[1]["tests"])
    assert [(case.fn_name, case.input, case.expected) for case in second] == [
        ("countPairs", [[-1, 1, 2, 3, 1], 2], 3),
        ("countPairs", [[1, 1], 5], 1),
    ]
    solutions = [
        "print(2 * int(input()))",
        "class Solution:\n    def countPairs(self, nums, target):\n"
        "        return sum(nums[i] + nums[j] < target for i in range(len(nums)) for j in range(i + 1, len(nums)))",
    ]
    completions = [f"```python\n{code}\n```" for code in solutions]
    assert code_reward(completions, tests=rows["tests"]) == [1.0, 1.0]


def test_livecodebench_refuses_pickles_that_build_objects():
    payload = base64.b64encode(zlib.compress(pickle.dumps(ValueError("not a string")))).decode()
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        lcb_private_tests(payload)
    ok = base64.b64encode(zlib.compress(pickle.dumps(json.dumps([{"input": "1"}])))).decode()
    assert lcb_private_tests(ok) == [{"input": "1"}]


def test_humanevalplus_and_mbppplus_scripts():
    he = json.loads(load("humanevalplus")[0]["tests"])["script"]
    assert he.rstrip().endswith("check(add)")
    mbpp = json.loads(load("mbppplus")[1]["tests"])["script"]
    assert mbpp.startswith("import math")


def test_prompt_template_and_limit():
    dataset = load("aime24", prompt_template="Q: {question}\nA: \\boxed{}", limit=1)
    assert len(dataset) == 1
    assert (
        dataset[0]["prompt"][0]["content"] == "Q: Find the remainder when $2^{10}$ is divided by $1000$.\nA: \\boxed{}"
    )
    with pytest.raises(ValueError, match=r"`prompt_template` must contain the placeholder\(s\) \{question\}"):
        load("aime24", prompt_template="no placeholder")
    with pytest.raises(ValueError, match="limit"):
        load("aime24", limit=0)


def test_hub_defaults(monkeypatch):
    calls = []
    fixture = datasets.load_dataset("json", data_files=str(fixture_path("mintrl_code")), split="train")

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split, kwargs))
        return fixture

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset = LOADERS["mintrl_code"]()
    assert [call[:3] for call in calls] == [
        ("agentica-org/DeepCoder-Preview-Dataset", config, "train") for config in ("primeintellect", "taco", "lcbv5")
    ]
    assert len(dataset) == 3 * 6  # the three training subsets, concatenated
    calls.clear()
    LOADERS["mintrl_code"]("my-org/deepcoder-mirror", split="test", name="taco")
    assert [call[:3] for call in calls] == [("my-org/deepcoder-mirror", "taco", "test")]


def test_dataset_specs(tmp_path):
    name, loader, path = resolve_dataset(f"math500={fixture_path('math500')}")
    assert (name, loader, path) == ("math500", LOADERS["math500"], str(fixture_path("math500")))
    assert resolve_dataset("aime24") == ("aime24", LOADERS["aime24"], None)
    prepared = tmp_path / "ready.jsonl"
    prepared.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "solution": "2"}) + "\n")
    dataset = load_dataset_by_name(str(prepared))
    assert dataset_task(dataset) == "math" and dataset[0]["solution"] == "2"
    assert dataset_task(load_dataset_by_name(f"humanevalplus={fixture_path('humanevalplus')}")) == "code"
    with pytest.raises(ValueError, match="unknown dataset 'aime1999'"):
        resolve_dataset("aime1999")
    with pytest.raises(ValueError, match="unknown dataset loader 'nope'"):
        resolve_dataset("nope=/tmp/x.jsonl")
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="NAME=PATH"):
        load_dataset_by_name(str(raw))
    with pytest.raises(ValueError, match="no question column"):
        LOADERS["aime24"](str(prepared))
