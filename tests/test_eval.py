"""pass@k and `trl-mintrl eval`: estimator values, argument checks, scoring, the CLI end to end with resume."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
from fractions import Fraction
from math import comb

import pytest

from trl_mintrl.data import LOADERS, fixture_path
from trl_mintrl.engines import Generation, GenerationEngine
from trl_mintrl.eval import evaluate, format_table, main, pass_at_k, summarize

AIME = f"aime24={fixture_path('aime24')}"
HUMANEVAL = f"humanevalplus={fixture_path('humanevalplus')}"


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (2, 1, 1, 0.5),
        (4, 1, 2, 0.5),
        (5, 2, 2, 0.7),
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (5, 3, 3, 1.0),
        (3, 1, 3, 1.0),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    # (4, 1, 2): 1 - C(3,2)/C(4,2) = 1 - 3/6; (5, 2, 2): 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_matches_brute_force_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                expected = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


@pytest.mark.parametrize("c", [1, 2, 17, 512, 1000])
@pytest.mark.parametrize("k", [1, 8, 32, 256])
def test_pass_at_k_is_stable_for_n_1024(c, k):
    n = 1024
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, 1, 5), (4, 1, 0), (4, -1, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k needs"):
        pass_at_k(n, c, k)


def test_summarize_and_table():
    records = [
        {"problem": p, "sample": s, "reward": r, "correct": None if r is None else r == 1.0}
        for p, rewards in enumerate([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [None] * 4, [0.5, 1.0, 1.0, 1.0]])
        for s, r in enumerate(rewards)
    ]
    summary = summarize(records, [1, 2, 4])
    assert (summary["problems"], summary["skipped"], summary["samples"]) == (3, 1, 4)
    assert summary["pass@1"] == pytest.approx((2 / 4 + 0 + 3 / 4) / 3)
    assert summary["pass@2"] == pytest.approx(((1 - 1 / 6) + 0 + 1) / 3)
    assert summary["pass@4"] == pytest.approx(2 / 3)
    assert summary["mean_reward"] == pytest.approx(5.5 / 12)
    table = format_table({"toy": summary}, [1, 2, 4]).splitlines()
    assert table[0].split() == ["benchmark", "problems", "samples", "pass@1", "pass@2", "pass@4"]
    assert table[1].split() == ["toy", "3", "4", "41.7", "61.1", "66.7"]


class ScriptedEngine(GenerationEngine):
    """Answers each prompt correctly the first `correct[i]` times it is asked, wrongly afterwards."""

    def __init__(self, tokenizer, answers: dict[str, str], correct: dict[str, int]):
        super().__init__([tokenizer.eos_token_id])
        self.tokenizer, self.answers, self.correct = tokenizer, answers, correct
        self.asked: dict[str, int] = {}

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        out = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids)
            key = next(k for k in self.answers if k in prompt)
            self.asked[key] = self.asked.get(key, 0) + 1
            answer = self.answers[key] if self.asked[key] <= self.correct[key] else "-1"
            out.append(Generation(self.tokenizer(f"So \\boxed{{{answer}}}", add_special_tokens=False)["input_ids"]))
        return out


def test_evaluate_scores_and_aggregates(tiny_tokenizer, tmp_path):
    dataset = LOADERS["aime24"](str(fixture_path("aime24")))
    engine = ScriptedEngine(tiny_tokenizer, {"remainder": "24", "divisors": "12"}, {"remainder": 2, "divisors": 0})
    args = argparse.Namespace(
        num_samples=4, k=[1, 2, 4], max_new_tokens=8, batch_size=3, math_timeout=5.0, code_timeout=5.0
    )
    args.model, args.temperature, args.top_p = "scripted", 1.0, 1.0
    summaries = evaluate({"aime24": dataset}, engine, tiny_tokenizer, tmp_path, args)
    # problem 0: 2 of 4 correct, problem 1: none
    assert summaries["aime24"]["pass@1"] == pytest.approx(0.25)
    assert summaries["aime24"]["pass@2"] == pytest.approx((1 - 1 / 6) / 2)
    assert summaries["aime24"]["pass@4"] == pytest.approx(0.5)
    assert engine.num_calls == 3  # 8 samples in batches of 3
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["benchmarks"]["aime24"] == summaries["aime24"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dataset", AIME, "--num-samples", "4", "--k", "1,8"], "--k values must be between 1 and --num-samples"),
        (["--dataset", "aime1999"], "unknown dataset 'aime1999'"),
        (["--dataset", AIME, "--dataset", AIME], "given twice"),
        (["--dataset", AIME, "--k", "1,x"], "--k must be comma-separated integers"),
        (["--dataset", AIME, "--top-p", "0"], "0 < --top-p <= 1"),
    ],
)
def test_bad_arguments_fail_before_loading_a_model(extra, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(tmp_path / "no-such-model"), "--output", str(tmp_path / "out"), *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed in this environment")
def test_vllm_backend_without_vllm_names_the_install(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", "m", "--output", str(tmp_path / "out"), "--dataset", AIME, "--backend", "vllm"])
    assert 'pip install "trl-mintrl[vllm]"' in capsys.readouterr().err


def _samples(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_end_to_end_with_resume(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_path, "--dataset", AIME, "--dataset", HUMANEVAL, "--output", str(out)]
    argv += ["--num-samples", "2", "--k", "1,2", "--max-new-tokens", "12", "--batch-size", "3", "--device", "cpu"]
    main(argv)
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].split() == ["benchmark", "problems", "samples", "pass@1", "pass@2"]
    assert "aime24" in captured.out and "humanevalplus" in captured.out
    assert "100%" in captured.err  # progress bars
    summary = json.loads((out / "summary.json").read_text())
    for name in ("aime24", "humanevalplus"):
        records = _samples(out / f"{name}.samples.jsonl")
        assert sorted((r["problem"], r["sample"]) for r in records) == [(p, s) for p in range(2) for s in range(2)]
        assert summary["benchmarks"][name] == summarize(records, [1, 2])

    # interrupt: keep one finished sample and half a line, then rerun the same command
    path = out / "aime24.samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][:20])
    before = {name: (out / f"{name}.samples.jsonl").read_text() for name in ("aime24", "humanevalplus")}
    main(argv)
    resumed = _samples(path)
    assert resumed[0] == json.loads(lines[0])  # finished sample kept, not redone
    assert sorted((r["problem"], r["sample"]) for r in resumed) == [(p, s) for p in range(2) for s in range(2)]
    assert (out / "humanevalplus.samples.jsonl").read_text() == before["humanevalplus"]  # nothing redone

    # more samples later: only the new ones are drawn
    main([*argv[:-10], "--num-samples", "3", "--k", "1,3", *argv[-6:]])
    grown = _samples(path)
    assert grown[:4] == resumed and sorted(r["sample"] for r in grown[4:]) == [2, 2]

    with pytest.raises(SystemExit, match="different settings.*temperature"):
        main([*argv, "--temperature", "1.0"])
