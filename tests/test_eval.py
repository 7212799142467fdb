"""pass@k and `trl-mintrl eval`: estimator values, argument checks, scoring, the CLI end to end with resume, YAML
configs, and the sweep over a training run's checkpoints."""

from __future__ import annotations

import importlib.util
import itertools
import json
from fractions import Fraction
from math import comb

import pytest

from trl_mintrl.cli.eval import main
from trl_mintrl.data import LOADERS, fixture_path
from trl_mintrl.engines import Generation, GenerationEngine
from trl_mintrl.eval import SamplingSettings, evaluate, format_table, pass_at_k, summarize

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
    settings = SamplingSettings(
        "scripted", temperature=1.0, top_p=1.0, max_new_tokens=8, num_samples=4, k=[1, 2, 4], batch_size=3
    )
    summaries = evaluate({"aime24": dataset}, engine, tiny_tokenizer, tmp_path, settings)
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
        (["--dataset", AIME, "--num_samples", "4", "--k", "1,8"], "--k values must be between 1 and --num_samples"),
        (["--dataset", "aime1999"], "unknown dataset 'aime1999'"),
        (["--dataset", AIME, "--dataset", AIME], "given twice"),
        (["--dataset", AIME, "--k", "1,x"], "--k must be comma-separated integers"),
        (["--dataset", AIME, "--top_p", "0"], "0 < --top_p <= 1"),
        (["--dataset", AIME, "--top-p", "0.5"], "unrecognized arguments: --top-p"),  # TRL spelling only
        (["--dataset", AIME, "--num_sam", "4"], "unrecognized arguments: --num_sam"),  # no abbreviations
        (["--dataset", AIME, "--chat_template_kwargs", "[1]"], "invalid JSON object value"),
        (["--dataset", AIME, "--select_metric", "pass@64"], "--select_metric must be one of"),
        (["--dataset", AIME, "--model", "no/such-model"], "no such local folder (and the Hub is offline)"),
        (["--dataset", AIME, "--all_checkpoints"], "no complete checkpoint-N/ folder in it"),
        (["--model", "x"], "--dataset is required"),
    ],
)
def test_bad_arguments_fail_as_one_line_before_loading_a_model(extra, message, tiny_model_path, tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-3").mkdir(parents=True)  # cut short: no weights
    model = str(run_dir) if "--all_checkpoints" in extra else tiny_model_path
    with pytest.raises(SystemExit) as exit_:
        main(["--model", model, "--output", str(tmp_path / "out"), *extra])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_unloadable_dataset_fails_as_one_line_before_the_model(tiny_model_path, tmp_path, capsys):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "1+1", "answer": 2}\n{not json\n')
    with pytest.raises(SystemExit) as exit_:
        main(["--model", tiny_model_path, "--output", str(tmp_path / "out"), "--dataset", f"aime24={broken}"])
    message = str(exit_.value.code)
    assert message.startswith("trl-mintrl eval: error: --dataset aime24=") and "cannot load it" in message
    assert "\n" not in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("num_samples: [4\n", "invalid YAML (line 2, column 1)"),
        ("num_sample: 4\n", "unknown key 'num_sample'; did you mean 'num_samples'?"),
        ("- 1\n", "expected a mapping of flag names to values"),
    ],
)
def test_bad_config_files_fail_as_one_line(text, message, tmp_path, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit):
        main(["--config", str(config)])
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed in this environment")
def test_vllm_backend_without_vllm_names_the_install(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", "m", "--output", str(tmp_path / "out"), "--dataset", AIME, "--backend", "vllm"])
    assert 'pip install -e ".[vllm]"' in capsys.readouterr().err


def _samples(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_end_to_end_with_resume(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_path, "--dataset", AIME, "--dataset", HUMANEVAL, "--output", str(out)]
    argv += ["--num_samples", "2", "--k", "1,2", "--max_new_tokens", "12", "--batch_size", "3", "--device", "cpu"]
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
    main([*argv[:-10], "--num_samples", "3", "--k", "1,3", *argv[-6:]])
    grown = _samples(path)
    assert grown[:4] == resumed and sorted(r["sample"] for r in grown[4:]) == [2, 2]

    with pytest.raises(SystemExit, match="different settings.*temperature"):
        main([*argv, "--temperature", "1.0"])


def test_config_file_sets_defaults_and_flags_win(tiny_model_path, tmp_path):
    from trl_mintrl.cli.eval import parse_args

    config = tmp_path / "eval.yaml"
    config.write_text(
        f"model: {tiny_model_path}\ndataset: [{AIME}, {HUMANEVAL}]\noutput: {tmp_path / 'out'}\n"
        "num_samples: 4\nk: [1, 4]\ntemperature: 1.0\nchat_template_kwargs: {enable_thinking: false}\n"
    )
    args = parse_args(["--config", str(config), "--num_samples", "8", "--k", "1,8"])
    assert (args.num_samples, args.k, args.temperature) == (8, [1, 8], 1.0)  # flags win, the rest from YAML
    assert list(args.benchmarks) == ["aime24", "humanevalplus"]
    assert args.chat_template_kwargs == {"enable_thinking": False}


def test_best_checkpoint_and_table_over_steps():
    from trl_mintrl.eval.checkpoints import best_checkpoint, steps_table

    def summary(p1):
        return {"pass@1": p1, "problems": 1, "samples": 1}

    results = {
        10: {"a": summary(0.25), "b": summary(0.25)},  # mean 0.25
        20: {"a": summary(0.75), "b": summary(0.25)},  # mean 0.5: best
        30: {"a": summary(0.5), "b": summary(0.5)},  # mean 0.5 exactly: a tie goes to the earlier step
        40: {"a": summary(1.0)},  # b not scored: the mean is over the scored benchmarks
    }
    assert best_checkpoint({s: r for s, r in results.items() if s < 40}, "pass@1") == (20, 0.5)
    assert best_checkpoint(results, "pass@1") == (40, 1.0)
    lines = steps_table(results, [1]).splitlines()
    assert lines[0] == "| step | a pass@1 (%) | b pass@1 (%) | mean pass@1 (%) |"  # percent, labelled
    assert lines[3] == "| 20 | 75.0 | 25.0 | 50.0 |"
    assert lines[5] == "| 40 | 100.0 | - | 100.0 |"
    assert best_checkpoint({10: {"a": {"pass@1": None}}}, "pass@1") is None


def test_all_checkpoints_of_a_run_in_one_command(tiny_model_path, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    for step in (2, 4, 6):
        shutil.copytree(tiny_model_path, run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (run / "checkpoint-6" / "trainer_state.json").write_text('{"global_st')  # cut short by a kill: left out
    out = tmp_path / "eval"
    main(["--model", str(run), "--all_checkpoints", "--dataset", AIME, "--output", str(out), "--num_samples", "2",
          "--k", "1,2", "--max_new_tokens", "8", "--device", "cpu", "--limit", "1"])  # fmt: skip
    printed = capsys.readouterr().out
    report = json.loads((out / "checkpoints.json").read_text())
    assert sorted(report["checkpoints"]) == ["2", "4"]
    for step in ("2", "4"):  # each checkpoint evaluated into its own resumable folder
        saved = json.loads((out / f"checkpoint-{step}" / "summary.json").read_text())
        assert saved["benchmarks"] == report["checkpoints"][step]
        assert saved["run"]["model"] == str(run / f"checkpoint-{step}")
    scores = {int(s): v["aime24"]["pass@1"] for s, v in report["checkpoints"].items()}
    best = max(sorted(scores), key=lambda s: (scores[s], -s))
    assert report["best"]["step"] == best and f"best checkpoint: checkpoint-{best}" in printed
    table = (out / "checkpoints.md").read_text()
    assert f"(pass@1 {100 * scores[best]:.1f}%, mean over benchmarks)" in table  # the JSON's fraction, in percent
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == "| step | aime24 pass@1 (%) | aime24 pass@2 (%) | mean pass@1 (%) | mean pass@2 (%) |"
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| 2", "| 4"]
    assert (out / "checkpoints.png").stat().st_size > 0


def test_help_shows_the_sampling_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width
    for expected in ("sampling temperature (0: greedy) (default: 0.6)", "probability mass (default: 0.95)",
                     "(default: 4096)", "samples per problem (n) (default: 32)", "(default: [1, 8, 32])",
                     "seed of the sampling (default: 0)"):  # fmt: skip
        assert expected in text, expected
