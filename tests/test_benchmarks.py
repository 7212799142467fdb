"""The learning benchmark end to end in its smallest mode, its statistics, and the support-expansion task."""

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from cost_helpers import StandInTrainer

from benchmarks.lib.stats import format_interval, format_mean_std, mean_interval, paired_difference, t_quantile_975
from benchmarks.tasks.toy.task import (
    FAR_OPERATOR,
    NEW_OPERATOR,
    Problem,
    make_problems,
    parse_question,
    review_steps,
    rule_judge,
    step_reward,
    toy_reward,
)

ROOT = Path(__file__).resolve().parents[1]


def test_t_quantiles_match_tables_and_the_normal_limit():
    assert t_quantile_975(1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile_975(4) == pytest.approx(2.776, abs=1e-3)
    assert t_quantile_975(30) == pytest.approx(2.042, abs=1e-3)
    assert t_quantile_975(40) == pytest.approx(2.021, abs=1e-3)  # expansion beyond the table
    assert t_quantile_975(120) == pytest.approx(1.980, abs=1e-3)
    assert t_quantile_975(10**6) == pytest.approx(1.960, abs=1e-3)
    quantiles = [t_quantile_975(df) for df in range(1, 200)]
    assert all(a > b for a, b in zip(quantiles, quantiles[1:]))
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)


def test_paired_interval_over_seeds():
    method = {0: 0.30, 1: 0.25, 2: 0.40, 3: 0.35, 9: 0.99}
    grpo = {0: 0.20, 1: 0.20, 2: 0.30, 3: 0.20}  # seed 9 has no GRPO run: not paired
    diff = paired_difference(method, grpo)
    assert diff.n == 4 and diff.mean == pytest.approx(0.1)
    std = math.sqrt(sum((d - 0.1) ** 2 for d in (0.10, 0.05, 0.10, 0.15)) / 3)
    assert diff.std == pytest.approx(std)
    assert diff.high - diff.mean == pytest.approx(3.182 * std / 2)
    assert diff.resolved
    assert not mean_interval([0.1, -0.1, 0.05]).resolved
    assert mean_interval([0.2]).low is None and not mean_interval([0.2]).resolved
    assert format_interval(diff) == "+10.0 [+3.5, +16.5]"


@pytest.mark.parametrize(("new_op", "operator", "top"), [(True, NEW_OPERATOR, 19), ("@", FAR_OPERATOR, 12)])
def test_new_operator_problems_end_in_it_and_have_a_familiar_twin(new_op, operator, top):
    problems = make_problems(200, 3, 6, seed=3, new_op=new_op)
    for p in problems:
        assert p.ops[-1][0] == operator and all(op in "+-" for op, _ in p.ops[:-1])
        assert parse_question(p.question) == p
        values = [int(step.split("=")[1]) for step in p.steps[:-1]]
        assert all(0 <= v <= 19 for v in values) and p.answer <= top
        twin = p.familiar()
        assert operator not in twin.question and twin.answer == p.answer
        assert twin.steps[:-2] == p.steps[:-2] and twin.steps[-1] == p.steps[-1]
        assert all(b <= 9 for _, b in twin.ops)
    assert Problem(4, (("-", 3), ("#", 2))).solution == "4-3=1\n\n1#2=5\n\nAnswer: 5"
    assert Problem(9, (("+", 5), ("@", 3))).solution == "9+5=14\n\n14@3=10\n\nAnswer: 10"
    assert Problem(9, (("+", 5), ("@", 3))).familiar().solution == "9+5=14\n\n14-4=10\n\nAnswer: 10"
    # without the new operator the generator draws exactly the problems it drew before (warm start, reachable runs)
    assert make_problems(20, 8, 11, seed=1) == make_problems(20, 8, 11, seed=1, new_op=False)


def test_out_of_reach_answers_are_uniform_and_reading_at_as_plus_stays_in_range():
    """No constant guess scores on much more than 1/13 of out-of-reach problems (the old `a+b+7 <= 15` design put 31%
    on 15), and `a+b` (the warm start's reading of `@`) stays in 0-19, where its values do not wrap onto the rule."""
    problems = make_problems(2600, 3, 6, seed=4, new_op="@")
    shares = Counter(p.answer for p in problems)
    assert set(shares) == set(range(13))
    assert max(shares.values()) / len(problems) < 0.1 and min(shares.values()) / len(problems) > 0.055
    assert all(Problem(p.first, p.ops[:-1]).answer + p.ops[-1][1] <= 19 for p in problems)  # a + b <= 19
    assert all(p.answer == p.familiar().answer and max(b for _, b in p.familiar().ops) <= 9 for p in problems)


def test_step_reward_needs_the_new_step_written_right_not_only_the_answer():
    problem = Problem(9, (("+", 5), ("@", 3)))  # 9+5=14, 14@3=10
    prompt = [{"role": "user", "content": problem.question}]
    texts = [
        "9+5=14\n\n14@3=10\n\nAnswer: 10",  # the reference
        "9+5=14\n\n14+3=10\n\nAnswer: 10",  # the policy's notation, right value
        "Answer: 10",  # a guessed answer
        "9+5=14\n\n14+3=17\n\nAnswer: 10",  # wrong step, answer guessed
        "9+5=13\n\n13+3=10\n\nAnswer: 10",  # wrong running value
        "9+5=14\n\n14-3=10\n\nAnswer: 10",  # not the policy's `+` reading
        "9+5=14\n\n14+3=10\n\nAnswer: 9",  # right step, wrong answer
        "9+5=14\n\n14+3=100\n\nAnswer: 10",
    ]
    answers = [problem.answer] * len(texts)
    assert step_reward(texts, answers, [prompt] * len(texts)) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert toy_reward(texts, answers)[:6] == [1.0] * 6  # the answer-only reward pays the guesses
    assert [problem.new_step_right(t) for t in texts] == [True, True, False, False, False, False, True, False]
    # on the other regimes the step reward is the answer reward
    for p in make_problems(30, 3, 6, seed=2, new_op=True) + make_problems(10, 8, 11, seed=2):
        wrong = p.solution.replace(f"Answer: {p.answer}", f"Answer: {p.answer + 1}")
        pr = [[{"role": "user", "content": p.question}]] * 3
        assert step_reward([p.solution, wrong, f"Answer: {p.answer}"], [p.answer] * 3, pr) == [1.0, 0.0, 1.0]


def test_regimes_train_and_score_with_the_same_test():
    from benchmarks.tasks.toy.evaluate import scores_of
    from benchmarks.tasks.toy.training import REGIMES

    assert REGIMES["out-of-reach"].reward is step_reward
    assert REGIMES["unreachable"].reward is toy_reward and REGIMES["reachable"].reward is toy_reward
    [problem] = REGIMES["out-of-reach"].problems(1, seed=0)
    guess = f"Answer: {problem.answer}"
    assert scores_of([problem], [[guess, problem.solution]], ks=(1,))["pass@1"] == 0.5


def test_rule_judge_knows_the_new_operator_and_writes_longer_corrections_on_request():
    problem = Problem(4, (("-", 3), ("#", 2)))
    assert review_steps(problem.question, "4-3=1\n\n", ["1+2=3\n\n"]) == 0  # the policy's guess is wrong
    assert review_steps(problem.question, "4-3=1\n\n", ["1#2=5\n\n"]) is None
    assert rule_judge().correct_fn(problem.question, "4-3=1\n\n", None) == "1#2=5\n\n"
    assert rule_judge(8).correct_fn(problem.question, "", None) == problem.solution
    with pytest.raises(ValueError, match="steps_per_correction"):
        rule_judge(0)


def test_rule_judge_from_start_revises_the_first_chunk_of_every_rollout_and_only_that():
    """The sweep's off-policy extreme: the first chunk is cut at step 0 even when right, so the judge writes the
    whole solution; later chunks get the exact review."""
    problem = Problem(4, (("-", 3), ("#", 2)))
    judge = rule_judge(8, from_start=True)
    assert judge.review_fn(problem.question, "", ["4-3=1\n\n"], None) == 0
    assert judge.review_fn(problem.question, "4-3=1\n\n", ["1#2=5\n\n"], None) is None
    assert judge.review_fn(problem.question, "4-3=1\n\n", ["1+2=3\n\n"], None) == 0
    assert rule_judge(8).review_fn(problem.question, "", ["4-3=1\n\n"], None) is None


def test_recheck_reruns_a_recorded_run_and_fails_when_its_scores_differ(copy_learning_smoke):
    """`--recheck` reruns one recorded run at this checkout: a smoke run's record matches (exit 0); the same record
    with its pass@1 changed does not (exit 1), and learning_recheck.json says which."""
    tmp_path = copy_learning_smoke
    learning = [sys.executable, "-m", "benchmarks.studies.learning", "--workers", "0", "--out", str(tmp_path)]
    recheck = [*learning, "--recheck", "in-band:mintrl-const:1"]
    done = subprocess.run(recheck, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.loads((tmp_path / "learning_recheck.json").read_text())["runs"]
    assert row["run"] == "in-band-mintrl-const-s1" and row["same"] and row["recorded"] == row["rerun"]

    results = json.loads((tmp_path / "learning.json").read_text())
    [run] = [r for r in results["runs"] if (r["label"], r["seed"]) == ("mintrl-const", 1)]
    run["final"]["pass@1"] += 0.01
    (tmp_path / "learning.json").write_text(json.dumps(results))
    done = subprocess.run(recheck, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "DIFFERENT" in done.stdout
    [row] = json.loads((tmp_path / "learning_recheck.json").read_text())["runs"]
    assert not row["same"] and row["recorded"]["pass@1"] == row["rerun"]["pass@1"] + 0.01
    unknown = subprocess.run([*learning, "--recheck", "in-band:sort:0"], cwd=ROOT, capture_output=True, text=True)
    assert unknown.returncode != 0 and "not a run of" in unknown.stderr


def test_learning_benchmark_smoke_mode_writes_a_report_recomputed_from_the_json(copy_learning_smoke):
    """`benchmarks/studies/learning.py --smoke` (1 step, 2 prompts, 2 seeds, GRPO and MInTRL), run as a user would
    (`learning_smoke`); one run's number changed in the JSON and re-rendered: the table follows the JSON."""
    tmp_path = copy_learning_smoke
    command = [
        sys.executable,
        "-m",
        "benchmarks.studies.learning",
        "--smoke",
        "--workers",
        "0",
        "--out",
        str(tmp_path),
    ]
    results = json.loads((tmp_path / "learning.json").read_text())
    assert results["provenance"]["command"].startswith("python -m benchmarks.studies.learning --smoke")
    assert len(results["provenance"]["commit"]) == 40
    assert {(r["label"], r["seed"]) for r in results["runs"]} == {
        (m, s) for m in ("grpo", "mintrl-const") for s in (0, 1)
    }
    assert all(r["steps"] == 1 and r["logs"] for r in results["runs"])
    [base] = results["baselines"]
    assert {"final", "curve0", "familiar", "judge"} <= set(base) and {"pass@1", "pass@8"} <= set(base["final"])
    assert set(base["judge"]) == {"near", "far"}  # in-band: its own (near) judge, and the far one
    for judge in base["judge"].values():
        assert judge["corrections"] > 0 and judge["correction_nats"] > 0 and judge["coverage"] == 1.0
    assert base["judge"]["far"]["correction_nats"] > base["judge"]["near"]["correction_nats"]
    assert all(set(point) == {"pass@1", "pass@8"} for r in results["runs"] for point in r["curve"].values())
    assert {r["regime"] for r in results["runs"]} == {"in-band"}
    for run in results["runs"]:  # 1 step: the phase end is step 1, the last step; validation picks step 1
        assert run["phase_end"] is None
        assert run["selected"] == {"pass@1": run["final"]["pass@1"], "pass@8": run["final"]["pass@8"], "step": 1}
        assert set(run["validation"]) == {"1"}
    mintrl_logs = [e for r in results["runs"] if r["label"] == "mintrl-const" for e in r["logs"]]
    assert all({"loss", "grad_norm", "mintrl/regression_residual", "mintrl/judge_token_frac"} <= set(e)
               for e in mintrl_logs)  # fmt: skip
    table = (tmp_path / "learning.md").read_text()
    assert "| mintrl-const | 2 |" in table and results["provenance"]["commit"][:12] in table
    assert "| in-band | 0.00 | 0.00 | - | " in table  # the calibration table (no pass@64 in smoke mode)
    assert "## The judge's distance" in table
    for png in ("learning_curves.png", "learning_interventions.png"):
        assert (tmp_path / png).stat().st_size > 0
    # every record says what wrote it (benchmarks/lib/harness.py); a rerun with --resume keeps them and runs nothing
    assert all(len(r["recorded"]["commit"]) == 40 and r["recorded"]["machine"] for r in results["runs"])
    done = subprocess.run([*command, "--resume"], cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    assert "5 finished jobs kept, 0 to run" in done.stdout
    resumed = json.loads((tmp_path / "learning.json").read_text())
    assert resumed["runs"] == results["runs"] and resumed["baselines"] == results["baselines"]

    for run in results["runs"]:  # MInTRL +50 points on seed 0, +30 on seed 1; GRPO 0
        bump = {("mintrl-const", 0): 0.5, ("mintrl-const", 1): 0.3}.get((run["label"], run["seed"]), 0.0)
        run["final"]["pass@1"] = bump
    (tmp_path / "learning.json").write_text(json.dumps(results))
    (tmp_path / "learning.md").unlink()
    from benchmarks.studies.learning import README_END, README_START

    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{README_START}\nold table\n{README_END}\nafter\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.studies.learning",
            "--replot",
            str(tmp_path / "learning.json"),
            "--readme",
            str(readme),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    row = next(
        line for line in (tmp_path / "learning.md").read_text().splitlines() if line.startswith("| mintrl-const |")
    )
    cells = [c.strip() for c in row.split("|")]
    assert cells[3] == "40.0 ± 14.1"  # pass@1 mean ± std of 50 and 30
    assert cells[5] == "+40.0 [-87.1, +167.1]"  # paired difference, t(1) = 12.706
    assert cells[6] == "no"  # 2 seeds do not resolve it
    readme_text = readme.read_text()
    assert "old table" not in readme_text and readme_text.endswith(f"{README_END}\nafter\n")
    assert "| mintrl-const | +40.0 [-87.1, +167.1] |" in readme_text
    assert "| in-band | -1 | " in (tmp_path / "learning.md").read_text()  # the distance table's in-band point
    assert "Judge's distance (MInTRL-const - GRPO, pass@1" in readme_text


def test_learning_replot_reads_the_committed_results_of_the_previous_version(tmp_path):
    """The committed learning.json was written by the previous learning.py (24 steps, float pass@1 curve points, no
    pass@64): `--replot` renders it, and the table carries its numbers."""
    from benchmarks.studies.learning import README_END, README_START

    source = ROOT / "benchmarks" / "results" / "learning.json"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "learning.json").write_bytes(source.read_bytes())
    readme = tmp_path / "README.md"
    readme.write_text(f"{README_START}\nold table\n{README_END}\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.studies.learning",
            "--replot",
            str(tmp_path / "results" / "learning.json"),
            "--out",
            str(tmp_path / "out"),
            "--readme",
            str(readme),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(source.read_text())
    regime = next(iter(results["settings"]["plan"]))
    grpo = [r["final"]["pass@1"] for r in results["runs"] if r["regime"] == regime and r["label"] == "grpo"]
    cell = format_mean_std(grpo)
    table = (tmp_path / "out" / "learning.md").read_text()
    assert f"## Regime: {regime}" in table and f"| grpo | {len(grpo)} | {cell} |" in table
    assert f"| grpo | {cell} |" in readme.read_text()
    base = results["baselines"][0]
    if "pass@64" not in base["final"]:
        assert f"pass@8 {100 * base['final']['pass@8']:.1f}, pass@64 not recorded" in table
    sweep = [r for r in results["runs"] if r["group"] == "sweep"]
    if sweep:  # the sweep's section names the regime its runs were on
        assert f", {sweep[0]['regime']} regime)" in table and f"Intensity ({sweep[0]['regime']}" in readme.read_text()
    for png in ("learning_curves.png", "learning_interventions.png"):
        assert (tmp_path / "out" / png).stat().st_size > 0


def test_cost_token_counter_counts_prefill_generated_and_forward_tokens():
    """The count-based cost figures: prompt tokens given to `generate`, non-padding tokens it returned, and every
    token position a forward pass processed (prefill + one per decoding step per row)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.lib.counters import TokenCounter
    from benchmarks.tasks.toy import WARM_START_DIR

    tokenizer = AutoTokenizer.from_pretrained(WARM_START_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    counter = TokenCounter(model, tokenizer.pad_token_id)
    batch = tokenizer(["Compute 1+2 =", "Compute 12+3-4 ="], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = model.generate(
        **batch, max_new_tokens=6, min_new_tokens=6, do_sample=True, pad_token_id=tokenizer.pad_token_id
    )
    new = out[:, batch["input_ids"].shape[1] :]
    assert (
        counter.prefill_tokens == int(batch["attention_mask"].sum()) == len("Compute 1+2 =") + len("Compute 12+3-4 =")
    )
    assert counter.generated_tokens == int((new != tokenizer.pad_token_id).sum()) == 12
    # prefill processes the padded prompt batch, then each of the 5 further decoding steps one token per row
    assert counter.forward_tokens == batch["input_ids"].numel() + 5 * 2
    model(**batch)
    assert counter.forward_tokens == 2 * batch["input_ids"].numel() + 5 * 2


def test_cost_token_counter_counts_what_the_model_reads_with_a_kept_cache():
    """With the engine's kept KV cache, a continued row feeds the model only its new tokens: prefill counts the
    positions the model's first forward pass of the call processed (the engine's own `prefill_tokens`), not the
    whole prompt `generate` was given (`prompt_tokens`, the cached prefix included); forward tokens follow the passes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.lib.counters import TokenCounter
    from benchmarks.tasks.toy import WARM_START_DIR
    from trl_mintrl.engines import TransformersEngine

    tokenizer = AutoTokenizer.from_pretrained(WARM_START_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    widths = []  # [rows, positions] of every forward pass of the policy model
    model.register_forward_pre_hook(lambda m, a, k: widths.append(tuple(k["input_ids"].shape)), with_kwargs=True)
    counter = TokenCounter(model, tokenizer.pad_token_id)
    engine = TransformersEngine(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id])
    prompts = [tokenizer(text)["input_ids"] for text in ("Compute 1+2 =", "Compute 12+3-4 =")]
    torch.manual_seed(0)
    with engine.session():
        first = engine.generate(prompts, 4, temperature=0)
        assert counter.prefill_tokens == counter.prompt_tokens == engine.prefill_tokens == sum(map(len, prompts))
        before, widths[:] = counter.snapshot(), []
        judge = tokenizer(" x")["input_ids"]  # a correction: two rows continued with new tokens after their chunks
        requests = [p + g.token_ids + judge for p, g in zip(prompts, first, strict=True)]
        engine.generate(requests, 4, temperature=0)
    after = counter.snapshot()
    read = after["prefill_tokens"] - before["prefill_tokens"]
    assert read == engine.prefill_tokens - sum(map(len, prompts)) < sum(map(len, requests))
    assert after["prompt_tokens"] - before["prompt_tokens"] == sum(map(len, requests)) == read + engine.reused_tokens
    assert engine.reused_tokens >= sum(map(len, prompts)) and widths[0][1] < min(map(len, requests))  # not fed again
    assert after["forward_tokens"] - before["forward_tokens"] == sum(rows * width for rows, width in widths)


def test_cost_readme_block_is_computed_from_the_saved_rounds():
    """The README's cost table comes from cost.json: paired time ratio per round and token-count ratios."""
    from benchmarks.studies.cost import readme_block

    def step(seconds, cpu, generated, forward, judge=None):
        record = {"seconds": seconds, "generated_tokens": generated, "forward_tokens": forward}
        if cpu is not None:
            record["process_cpu_seconds"] = cpu
        return record if judge is None else {**record, "judge_tokens": judge, "completion_tokens": 100}

    saved = {
        "provenance": {"commit": "a" * 40},
        "settings": {"rounds": 2},
        "time": {
            "steps": {
                "grpo": [step(2.0, 1.0, 100, 400), step(4.0, 2.0, 100, 400)],
                "mintrl_interventions": [step(3.0, 1.2, 110, 600, judge=5), step(4.0, 2.8, 110, 600, judge=3)],
            }
        },
    }
    row = next(line for line in readme_block(saved).splitlines() if line.startswith("| mintrl_interventions"))
    # CPU ratios 1.2 and 1.4 -> 1.3 +- 12.706 * 0.1; wall ratios 1.5 and 1.0 -> mean 1.25, 1.25 +- 12.706 * 0.25
    assert row == "| mintrl_interventions | 1.30 [0.03, 2.57] | 1.25 [-1.93, 4.43] | 1.10 | 1.50 | 4.0% |"
    # a cost.json from before CPU times were recorded still renders (its CPU cells empty)
    for records in saved["time"]["steps"].values():
        for record in records:
            del record["process_cpu_seconds"]
    row = next(line for line in readme_block(saved).splitlines() if line.startswith("| mintrl_interventions"))
    assert row == "| mintrl_interventions | - | 1.25 [-1.93, 4.43] | 1.10 | 1.50 | 4.0% |"


def test_cost_steps_do_not_depend_on_the_variants_beside_them():
    """A variant's measured step must not depend on which variants take turns beside it. Each variant's
    step samples from the same seed whatever its position and whoever ran before (GRPO's rollouts are identical
    alone, beside one variant and beside three, and its twin's are GRPO's), and the turn order changes every round
    in a balanced design: over a cycle every variant takes every position, and follows every other variant, equally
    often (a fixed order gave GRPO the first slot of every round, so load within a round hit it differently as the
    set, and the round's length, changed). Stand-in trainers: no model, a few sampled tokens per step."""

    import torch

    from benchmarks.lib.counters import TokenCounter
    from benchmarks.lib.step_cost import CPU_KEY, measure_time

    ran: list[str] = []

    class Model(torch.nn.Module):
        def forward(self, input_ids):
            return input_ids

        def generate(self, input_ids, attention_mask=None):
            self(input_ids)
            return torch.cat([input_ids, torch.randint(1, 50, (input_ids.shape[0], 6))], dim=1)

    def build(variant: str, steps: int, rounds_of_repairs: int):
        model = Model()

        def step():
            ran.append(variant)
            if variant == "other":  # a method that draws more random numbers than GRPO in its step
                torch.rand(1000)
            model.generate(torch.ones(4, 3, dtype=torch.long))

        tokens = TokenCounter(model, pad_token_id=0)  # wraps `model.generate`, which `step` looks up when it runs
        return StandInTrainer(steps, model, step), {"tokens": tokens}

    def grpo_digests(variants: list[str], rounds: int) -> list[int]:
        ran.clear()
        steps = measure_time(variants, 1, rounds, build_fn=build)["steps"]
        assert all(r["generated_tokens"] == 24 and r[CPU_KEY] >= 0 for records in steps.values() for r in records)
        if "twin" in steps:
            assert [r["rollout_digest"] for r in steps["twin"]] == [r["rollout_digest"] for r in steps["grpo"]]
        return [r["rollout_digest"] for r in steps["grpo"]]

    alone = grpo_digests(["grpo"], 4)
    assert len(set(alone)) == 4  # a new sample every round
    assert grpo_digests(["grpo", "other"], 4) == alone

    variants = ["grpo", "other", "twin", "third"]  # an even number: a cycle of 4 rounds, here the measured ones
    assert grpo_digests(variants, 4) == alone
    rounds = [ran[i : i + len(variants)] for i in range(0, len(ran), len(variants))]
    assert len(rounds) == 5 and all(sorted(order) == sorted(variants) for order in rounds)  # a step each per round
    measured = rounds[1:]  # after the warm-up round: any cycle of consecutive rounds is balanced
    positions = Counter((name, i) for order in measured for i, name in enumerate(order))
    assert set(positions.values()) == {1} and len(positions) == len(variants) ** 2
    follows = Counter((a, b) for order in measured for a, b in zip(order, order[1:]))
    assert set(follows.values()) == {1} and len(follows) == len(variants) * (len(variants) - 1)


def test_cost_trainers_set_up_one_at_a_time_and_step_only_once_all_have():
    """A trainer's set-up (accelerate's `prepare`: `model.to`) replaces the storage of its parameters, which --real's
    variants share: two at once crashed the process. Stand-in trainers whose set-up takes a while."""
    import threading
    import time

    import torch

    from benchmarks.lib.counters import TokenCounter
    from benchmarks.lib.step_cost import measure_time

    events: list[tuple[str, str]] = []
    setting_up = threading.Semaphore(1)  # a second set-up at once fails the test

    class Model(torch.nn.Module):
        def generate(self, input_ids, attention_mask=None):
            return input_ids

    def build(variant: str, steps: int, rounds_of_repairs: int):
        def set_up():
            assert setting_up.acquire(blocking=False), f"{variant} set up beside another trainer"
            events.append(("set up", variant))
            time.sleep(0.05)
            setting_up.release()

        model = Model()
        trainer = StandInTrainer(steps, model, lambda: events.append(("step", variant)), set_up)
        return trainer, {"tokens": TokenCounter(model, pad_token_id=0)}

    variants = ["grpo", "other", "third"]
    measure_time(variants, 1, 2, build_fn=build)
    assert events[: len(variants)] == [("set up", v) for v in variants]
    assert [kind for kind, _ in events[len(variants) :]] == ["step"] * 3 * len(variants)


def test_cost_prompts_do_not_depend_on_the_number_of_rounds():
    """A --rounds 8 run once disagreed with a --rounds 6 one: the dataset's length followed the steps and the
    sampler shuffles by it, so every step drew other prompts. Step k's prompts must not depend on --rounds."""
    from benchmarks.studies.cost import build

    def first_prompts(steps: int) -> list:
        trainer, _ = build("grpo", steps, steps)
        return [row["prompt"] for row in next(iter(trainer.get_train_dataloader()))]

    assert first_prompts(3) == first_prompts(8)


def test_curve_sets_are_prefixes_of_the_held_out_sets():
    """learning.py scores a run's last curve point on the first `curve_prompts` of the final held-out samples, and
    the warm start's step 0 on `problems(curve_prompts)`: both must be the same problems."""
    from benchmarks.tasks.toy.training import REGIMES

    for regime in REGIMES.values():
        assert regime.problems(32, seed=999) == regime.problems(96, seed=999)[:32]


def test_learning_jobs_carry_each_arms_judge_notation_and_config():
    """Each MInTRL arm's job builds the rule judge of its label (the near arms correct in the policy's notation; the
    unsuffixed and the far arms in the reference's), the sweep runs the near judge, and the SORT beta labels set
    `repair_beta`."""
    from benchmarks.studies.learning import MODES, plan_jobs
    from benchmarks.tasks.toy.arms import LABELS, job_judge

    question = "Compute 9+5@3 ="
    settings = {**MODES["full"], "plan": {"out-of-reach": [*LABELS], "in-band": ["mintrl-const"]}}
    jobs = {(job["regime"], job["label"]): job for job in plan_jobs(settings) if job["seed"] == 0}
    for label, correction in [
        ("mintrl-const-near", "14+3=10\n\n"),
        ("mintrl-proxy-near", "14+3=10\n\n"),
        ("mintrl-const-far", "14@3=10\n\n"),
        ("mintrl-proxy-far", "14@3=10\n\n"),
        ("mintrl-const", "14@3=10\n\n"),  # out-of-reach's own judge: the far one
    ]:
        assert job_judge(jobs["out-of-reach", label]).correct_fn(question, "9+5=14\n\n", None) == correction, label
    # the in-band regime's judge (and the sweep on it) writes the policy's notation
    for key in [("in-band", "mintrl-const"), ("in-band", "sweep:target-1%")]:
        assert job_judge(jobs[key]).correct_fn("Compute 9+5~3 =", "9+5=14\n\n", None) == "14+3=16\n\n", key
    jobs = {label: job for (regime, label), job in jobs.items() if regime == "out-of-reach"}
    assert jobs["mintrl-proxy-near"]["method"] == "mintrl-proxy"
    assert jobs["sort-beta0"]["overrides"] == {"repair_beta": 0.0}
    assert jobs["sort-beta1"]["overrides"] == {"repair_beta": 1.0}
    assert jobs["grpo"]["eval_every"] == 96 // 8


def test_cost_rollout_table_pairs_each_rollout_with_plain_generation_of_its_tokens():
    """`cost.py --rollout`: each rollout's time over the plain generation of the same round, mean and t-interval."""
    from benchmarks.lib.rollout_cost import render_rollout

    def record(seconds, plain, busy, asked=0, kept=0):
        return {"seconds": seconds, "plain_seconds": plain, "busy_share": busy, "policy_tokens": [60, 40],
                "generated_tokens": 130, "judge_tokens": 8, "reviews": 4, "revisions": 2,
                "speculative_calls": asked, "speculative_kept": kept}  # fmt: skip

    saved = {
        "provenance": {"command": "python -m benchmarks.studies.cost --rollout", "commit": "b" * 40},
        "settings": {"rounds": 2, "delay_fraction": 0.1, "shape": {"prompts": 1, "controls": 8, "intervened": 8,
                     "max_completion_length": 384, "mean_length": 96, "chunk_size": 48, "max_reviews": 4}},
        "result": {"regimes": [
            {"name": "all rows at once", "max_num_seqs": None, "rows": 16, "judge_delay_s": 0.3,
             "full_length_seconds": 3.0, "records": {
                 "rule_barrier": [record(3.0, 2.0, 0.9), record(2.0, 2.0, 0.7)],
                 "rule_arrival": [record(1.5, 1.0, 1.0), record(1.6, 1.0, 0.9)],
                 "rule_continuous": [record(1.1, 1.0, 1.0), record(1.3, 1.0, 0.9)],
                 "rule_speculative": [record(1.0, 1.0, 1.0, 10, 6), record(1.0, 1.0, 1.0, 8, 4)]}},
            {"name": "saturated", "max_num_seqs": 4, "rows": 16, "judge_delay_s": 0.1, "full_length_seconds": 1.0,
             "records": {"rule_barrier": [record(4.0, 1.0, 0.5), record(2.0, 1.0, 0.5)]}}]},
    }  # fmt: skip
    text = render_rollout(saved)
    first, saturated = text.split("## saturated")
    assert "## all rows at once: 16 rows, every row per engine step" in first
    assert saturated.startswith(": 16 rows, 4 rows per engine step") and "judge delay 0.100 s" in saturated
    assert "| rule, barrier | 3.00 [-9.71, 15.71] | 50% |" in saturated  # ratios 4 and 2
    rows = {line.split(" | ")[0]: line for line in first.splitlines() if line.startswith("| rule")}
    # ratios 1.5 and 1.0 -> mean 1.25, t(1) interval 1.25 +- 12.706 * 0.25; busy share 80%
    # 130 tokens generated for 100 kept
    assert (
        rows["| rule, barrier"] == "| rule, barrier | 1.25 [-1.93, 4.43] | 80% | 2.50 | 100 | 1.30 | 8 | 4 | 2 | - |"
    )
    assert rows["| rule, speculative"].endswith("| 8 | 4 | 2 | 5 / 9 |")  # speculative chunks: kept / asked per round
    assert rows["| rule, continuous"].startswith("| rule, continuous | 1.20 [-0.07, 2.47] | 95% | 1.20 |")
    assert rows["| rule, continuous, arrival order"].startswith("| rule, continuous, arrival order | 1.55 [")
    # paired differences per pair of schedules: continuous - barrier (1.1 - 1.5, 1.3 - 1.0), continuous - arrival
    # order (1.1 - 1.5, 1.3 - 1.6: -0.35 +- 12.706 * 0.05), speculative - continuous; a pair that did not run: "-"
    header = "| judge | continuous - barrier [95% CI] | continuous - continuous, arrival order [95% CI] |"
    assert header in first
    assert "| rule | -0.05 [-4.50, 4.40] | -0.35 [-0.99, 0.29] | -0.20 [-1.47, 1.07] |" in first
    assert saturated.rstrip().endswith("| rule | - | - | - |")


def test_cost_rollout_readme_block_follows_the_json(tmp_path):
    """`cost.py --rollout --replot JSON --readme README` rewrites the README's rollout rows from the JSON."""
    from benchmarks.studies.cost import ROLLOUT_END, ROLLOUT_START, main

    saved = json.loads((ROOT / "benchmarks/results/cost_rollout.json").read_text())
    records = saved["result"]["regimes"][-1]["records"]["rule_continuous"]  # the last regime: the last column
    first = records[0]
    first["seconds"] = first["plain_seconds"] * 9.0  # one round 9x slower: the mean ratio must move
    path = tmp_path / "cost_rollout.json"
    path.write_text(json.dumps(saved))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{ROLLOUT_START}\nold\n{ROLLOUT_END}\nrest\n")
    main(["--rollout", "--replot", str(path), "--readme", str(readme)])
    text = readme.read_text()
    ratios = [r["seconds"] / r["plain_seconds"] for r in records]
    row = next(line for line in text.splitlines() if line.startswith("| rule, continuous |"))
    assert row.split(" | ")[-1].startswith(f"{sum(ratios) / len(ratios):.2f} [")
    assert text.startswith("intro\n") and text.endswith(f"{ROLLOUT_END}\nrest\n") and "old" not in text
    regimes = len(saved["result"]["regimes"])
    assert (tmp_path / "cost_rollout.md").read_text().count("| rule, continuous |") == regimes


def test_sort_hint_jobs_get_the_rule_planner_and_the_hint_warm_start():
    """SORT's regime in the full plan: GRPO and the four SORT arms, each SORT job with the regime's rule planner
    (the hint in the training wording), GRPO and other regimes' SORT jobs without a planner."""
    from benchmarks.studies.learning import MODES, plan_jobs
    from benchmarks.tasks.toy.arms import LABELS, job_planner
    from benchmarks.tasks.toy.hint import WARM_START_HINT_DIR
    from benchmarks.tasks.toy.training import REGIMES
    from trl_mintrl.sort import FunctionPlanner, PlanRequest

    assert MODES["full"]["plan"]["sort-hint"] == [
        "grpo",
        "sort",
        "sort-uniform",
        "sort-beta0",
        "sort-beta1",
        "sort-shared",
    ]
    assert plan_jobs(MODES["full"])[0]["overrides"] == {} and LABELS["sort-shared"][1] == {
        "repair_optimizer": "shared"
    }
    jobs = {(job["regime"], job["label"]): job for job in plan_jobs(MODES["full"]) if job["seed"] == 0}
    question, reference = "Compute 9+5@3 =", "9+5=14\n\n14+3=10\n\nAnswer: 10"
    for label in ("sort", "sort-uniform", "sort-beta0", "sort-beta1", "sort-shared"):
        planner = job_planner(jobs["sort-hint", label])
        assert isinstance(planner, FunctionPlanner), label
        assert planner.plan([PlanRequest(question, reference)])[0].text == "Rule: a@b = a+b-7."
    assert job_planner(jobs["sort-hint", "grpo"]) is None
    assert job_planner(jobs["out-of-reach", "sort"]) is None
    assert REGIMES[jobs["sort-hint", "sort"]["regime"]].warm_start == WARM_START_HINT_DIR


def test_learning_report_gives_grpos_mean_curve_from_the_warm_start():
    """learning.md says how GRPO's held-out curve moves (the horizon run reads where it flattens from this line)."""
    from benchmarks.studies.learning import report

    def run(seed, p1, p8):
        curve = {"12": {"pass@1": p1[0], "pass@8": p8[0]}, "24": {"pass@1": p1[1], "pass@8": p8[1]}}
        return {"regime": "reachable", "label": "grpo", "seed": seed, "group": "main", "curve": curve,
                "final": {"pass@1": p1[1], "pass@8": p8[1]}, "logs": [], "train_seconds": 1.0, "steps": 24,
                "overrides": {}}  # fmt: skip

    results = {
        "provenance": {"command": "python -m benchmarks.studies.learning --horizon", "commit": "c" * 40,
                       "changed_files_that_matter": []},
        "settings": {"steps": 24, "prompts_per_step": 8, "final_prompts": 96, "seeds": [0, 1],
                     "plan": {"reachable": ["grpo"]}, "sweep_seeds": 0},
        "baselines": [{"regime": "reachable", "final": {"pass@1": 0.1, "pass@8": 0.3, "pass@64": 0.6},
                       "curve0": {"pass@1": 0.1, "pass@8": 0.3}}],
        "runs": [run(0, (0.2, 0.3), (0.4, 0.5)), run(1, (0.4, 0.5), (0.6, 0.7))],
    }  # fmt: skip
    line = next(line for line in report(results).splitlines() if line.startswith("GRPO's curve"))
    assert line.endswith("by step): 0: 10.0 / 30.0, 12: 30.0 / 50.0, 24: 40.0 / 60.0.")


def test_memory_benchmark_quick_writes_phase_table(tmp_path):
    """`benchmarks/studies/memory.py --quick` (two configurations, each in a fresh process) measures every phase through the
    trainers' code and writes memory.json and memory.md: the table, the growth ratio, the largest repair forwards."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.studies.memory",
            "--quick",
            "--configs",
            "mb1-r4",
            "mb2-r4",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    saved = json.loads((tmp_path / "memory.json").read_text())
    assert saved["provenance"]["command"].startswith("python -m benchmarks.studies.memory --quick")
    runs = {run["name"]: run for run in saved["runs"]}
    for name, micro_batch in (("mb1-r4", 1), ("mb2-r4", 2)):
        phases = runs[name]["phases"]
        for phase in ("generation (GRPO)", "generation (MInTRL)", "GRPO loss", "MInTRL loss", "repair update"):
            assert phases[phase]["peak_bytes"] > 0 and phases[phase]["working_bytes"] >= 0, (name, phase)
        assert phases["GRPO loss"]["max_rows_grad"] == micro_batch  # the prepared micro-batch reached the loss
        assert phases["repair: base pass"]["max_rows_grad"] >= 1
        assert runs[name]["facts"]["repairs"] == 1
        # measured as training runs: activations checkpointed (TRL's default, turned on by `Trainer.train`) and the
        # repair's own optimizer state allocated before the phases
        assert runs[name]["facts"]["activation_checkpointing"] is True
        assert runs[name]["facts"]["repair_optimizer_warmed"] is True
    table = (tmp_path / "memory.md").read_text()
    assert table.startswith("# Memory per phase") and "Hypotheses (written before the run)" in table
    assert "| mb2-r4 | 2 | 4 | 4 |" in table and "| micro-batch 1 -> 2 (4 references) |" in table


def test_a_part_reruns_its_arms_and_keeps_every_other_record():
    """`--part`: the fresh part's runs replace the same (regime, label) runs of the previous learning.json; other arms,
    other regimes' calibrations and provenance stay; a previous sweep of another regime (the old design) is dropped."""
    from benchmarks.lib.records import arm_provenance, provenance_lines
    from benchmarks.studies.learning import MODES, PARTS, merge_previous, plan_jobs

    def run(regime, label, seed, group="main"):
        return {"regime": regime, "label": label, "seed": seed, "group": group, "tag": "old"}

    old_prov = {"command": "old", "commit": "a" * 40, "changed_files_that_matter": []}
    previous = {
        "provenance": old_prov,
        "settings": {"sweep": {"regime": "out-of-reach", "judge": "near", "default": "mintrl-const-near"}},
        "baselines": [{"regime": "in-band", "tag": "old"}, {"regime": "reachable", "tag": "old"}],
        "runs": [
            run("in-band", "grpo", 0),
            run("in-band", "sort", 0),
            run("reachable", "grpo", 0),
            run("out-of-reach", "sweep:all-steps", 0, "sweep"),
        ],
    }
    new_prov = {"command": "new", "commit": "b" * 40, "changed_files_that_matter": []}
    fresh = {
        "provenance": new_prov,
        "settings": {"mode": "full", **MODES["full"]},
        "baselines": [{"regime": "in-band", "tag": "new"}],
        "runs": [{**run("in-band", "grpo", 0), "tag": "new"}],
    }
    merged = merge_previous(fresh, previous, ["band"])
    tags = {(r["regime"], r["label"]): r["tag"] for r in merged["runs"]}
    assert tags == {("in-band", "grpo"): "new", ("in-band", "sort"): "old", ("reachable", "grpo"): "old"}
    assert {b["regime"]: b["tag"] for b in merged["baselines"]} == {"in-band": "new", "reachable": "old"}
    assert merged["regime_provenance"]["in-band"] == new_prov and merged["regime_provenance"]["reachable"] == old_prov
    # the part reran in-band's grpo only: its sort runs keep the provenance of the run that wrote them
    assert (
        arm_provenance(merged, "in-band", "sort") == old_prov and arm_provenance(merged, "in-band", "grpo") == new_prov
    )
    merged["settings"]["plan"] = {"in-band": ["grpo", "sort"], "reachable": ["grpo"]}
    assert provenance_lines(merged) == [
        f"- in-band (sort); reachable: `old` at commit `{'a' * 12}`",
        f"- in-band (grpo): `new` at commit `{'b' * 12}`",
    ]
    assert "sweep" not in merged["settings"] or merged["settings"]["sweep"]["regime"] == "in-band"
    # the parts cover the full plan exactly once
    everything = {(j["regime"], j["label"], j["seed"]) for j in plan_jobs({"mode": "full", **MODES["full"]})}
    parts = [(j["regime"], j["label"], j["seed"]) for p in PARTS for j in plan_jobs(MODES["full"], [p])]
    assert len(parts) == len(set(parts)) and set(parts) == everything


def test_not_absorbed_warning_fires_on_far_corrections_and_stays_silent_in_band():
    """On the committed runs, the trainer's not-absorbed warning (its `AbsorptionTracker`, logged per step
    or replayed from the logged judge-token NLL) fires in every out-of-reach run whose corrections are far (the `@`
    step costs ~13 nats), and never in an in-band run (corrections ~7 nats, absorbed)."""
    from benchmarks.lib.records import runs_of
    from benchmarks.tasks.toy.tables import not_absorbed_warning

    results = json.loads((ROOT / "benchmarks" / "results" / "learning.json").read_text())
    far = runs_of(results, "out-of-reach", "mintrl-const-far") + runs_of(results, "out-of-reach", "mintrl-proxy-far")
    in_band = [r for r in results["runs"] if r["regime"] == "in-band" and r["method"].startswith("mintrl")]
    in_band = [r for r in in_band if r["overrides"].get("intervention_steps") != 0]  # mintrl-off has no judge tokens
    assert len(far) >= 10 and len(in_band) >= 5
    assert all(not_absorbed_warning(r) for r in far)
    assert not any(not_absorbed_warning(r) for r in in_band)
    # the replay is the tracker's: a run whose NLL stays high and flat warns, one that falls fast does not
    flat = {"method": "mintrl-const", "logs": [{"step": s, "mintrl/judge_token_nll": 3.0} for s in range(1, 20)]}
    falling = {
        "method": "mintrl-const",
        "logs": [{"step": s, "mintrl/judge_token_nll": 3.0 * 0.8**s} for s in range(1, 20)],
    }
    assert not_absorbed_warning(flat) and not not_absorbed_warning(falling)
