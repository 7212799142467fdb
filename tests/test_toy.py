"""The toy arithmetic task: generation, reward, rule judge, warm-start checkpoint."""

import random

import pytest

from benchmarks.tasks.toy.task import (
    STEP_SEPARATOR,
    Problem,
    final_answer,
    make_dataset,
    make_problem,
    make_problems,
    parse_question,
    review_steps,
    rule_judge,
    toy_reward,
)
from trl_mintrl.judges.base import CorrectionRequest, ReviewRequest
from trl_mintrl.mintrl.steps import split_steps

EXAMPLE = Problem(7, (("-", 7), ("+", 9), ("-", 8)))


def test_problem_solution_format():
    assert EXAMPLE.question == "Compute 7-7+9-8 ="
    assert EXAMPLE.solution == "7-7=0\n\n0+9=9\n\n9-8=1\n\nAnswer: 1"
    assert EXAMPLE.answer == 1
    assert parse_question("Please solve. " + EXAMPLE.question) == EXAMPLE


def test_generation_is_deterministic_and_respects_difficulty():
    a = make_problems(50, 3, 7, seed=5)
    assert a == make_problems(50, 3, 7, seed=5)
    assert a != make_problems(50, 3, 7, seed=6)
    assert {p.num_ops for p in a} == set(range(3, 8))
    for p in make_problems(200, 10, 10, seed=1, max_value=15):
        assert p.num_ops == 10
        values = [int(step.split("=")[1]) for step in p.steps[:-1]]
        assert all(0 <= v <= 15 for v in values)
        assert values[-1] == p.answer
        assert eval(p.question.removeprefix("Compute ").removesuffix(" =")) == p.answer


def test_dataset_columns():
    ds = make_dataset(4, 2, 2, seed=0)
    assert set(ds.column_names) == {"prompt", "solution", "answer", "num_ops"}
    row = ds[0]
    problem = parse_question(row["prompt"][0]["content"])
    assert row["solution"] == problem.solution and row["answer"] == problem.answer and row["num_ops"] == 2


def test_reward_checks_first_answer_only():
    completions = [
        EXAMPLE.solution,
        [{"role": "assistant", "content": EXAMPLE.solution}],
        "7-7=0\n\nAnswer: 2",
        "Answer: 11",  # 1 is a prefix of 11 but not the answer
        "Answer: 2\n\nAnswer: 1",
        "no answer",
    ]
    assert toy_reward(completions, [1] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert final_answer("x\n\nAnswer: -3") == -3


@pytest.mark.parametrize(
    ("prefix", "chunk", "expected"),
    [
        ("", EXAMPLE.solution, None),
        ("", "7-7=0\n\n0+9=8\n\n8-8=0\n\n", 1),  # earliest wrong step, later ones ignored
        ("", "7-7=1\n\n1+9=10\n\n", 0),
        ("7-7=0\n\n", "0+9=9\n\n9-8", None),  # unfinished last step that is still right
        ("7-7=0\n\n", "0+9=9\n\n9-9", 1),  # unfinished but already wrong
        ("7-7=0\n\n0+", "9=9\n\n9-8=1\n\n", None),  # a step straddling the prefix and the chunk
        ("7-7=0\n\n0+", "9=8\n\n9-8=1\n\n", 0),
        ("7-7=0\n\n0+9=9\n\n", "9-8=1\n\nAnswer: 2", 1),
        ("", "7-7=0\n0+9=9\n\n", 0),  # steps must be separated by a blank line
        (EXAMPLE.solution[:-9], "Answer: 1\n\n1+1=2", 1),  # anything after the answer is wrong
    ],
)
def test_rule_review_finds_earliest_wrong_step(prefix, chunk, expected):
    assert review_steps(EXAMPLE.question, prefix, split_steps(chunk), None) == expected


def repair_slipping_policy(judge, question: str, solution: str, rounds: int, rng: random.Random) -> str:
    """The rollout loop with a policy that writes `solution` in random chunks and slips (one digit off) in half of
    them: each chunk goes to `judge`, which must flag exactly the slipped ones; a flagged chunk is cut at the wrong
    step and the judge's correction appended. Returns the text after `rounds` chunks or on reaching `solution`."""
    prefix = ""
    for _round in range(rounds):
        assert solution.startswith(prefix), (solution, prefix)
        target = solution[len(prefix) :]
        if not target:
            break
        chunk = target[: rng.randint(1, 12)]
        slipped = rng.random() < 0.5 and any(ch.isdigit() for ch in chunk)
        if slipped:
            pos = max(i for i, ch in enumerate(chunk) if ch.isdigit())
            chunk = chunk[:pos] + str((int(chunk[pos]) + 1) % 10) + chunk[pos + 1 :]
        steps = split_steps(chunk)
        verdict = judge.review([ReviewRequest(question, prefix, steps)])[0]
        assert not verdict.failed
        if verdict.wrong_step is None:
            assert not slipped
            prefix += chunk
            continue
        assert slipped
        prefix += "".join(steps[: verdict.wrong_step])
        correction = judge.correct([CorrectionRequest(question, prefix)])[0]
        assert correction.text
        prefix += correction.text
    return prefix


def test_rule_judge_corrections_repair_random_trajectories():
    """Simulate the rollout loop with a policy that slips at random: judge cuts and corrections always converge on
    the reference solution, and the judge never flags a right step."""
    judge = rule_judge()
    rng = random.Random(0)
    for _ in range(100):
        problem = make_problem(rng, rng.randint(1, 8))
        prefix = repair_slipping_policy(judge, problem.question, problem.solution, 4 * len(problem.steps), rng)
        assert prefix == problem.solution
        assert toy_reward([prefix], [problem.answer]) == [1.0]


def test_char_tokenizer_round_trips_and_covers_prompts():
    from benchmarks.tasks.toy import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    text = EXAMPLE.solution + "\nPlan: (1) add; {check} ~ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character, none unknown
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Compute 1+2 ="}], add_generation_prompt=True)
    assert tokenizer.decode(chat).endswith("<|im_start|>assistant\n")


def test_warm_start_build_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    from benchmarks.tasks.toy import build_warm_start

    a = load_file(build_warm_start(tmp_path / "a", seed=3, steps=3, batch_size=4, log_every=0) / "model.safetensors")
    b = load_file(build_warm_start(tmp_path / "b", seed=3, steps=3, batch_size=4, log_every=0) / "model.safetensors")
    c = load_file(build_warm_start(tmp_path / "c", seed=4, steps=3, batch_size=4, log_every=0) / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(a[k].equal(b[k]) for k in a)
    assert not all(a[k].equal(c[k]) for k in a)


@pytest.fixture(scope="module")
def warm_start():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy import WARM_START_DIR

    return AutoModelForCausalLM.from_pretrained(WARM_START_DIR), AutoTokenizer.from_pretrained(WARM_START_DIR)


def test_warm_start_solves_easy_problems_more_often_than_hard_ones(warm_start):
    from benchmarks.tasks.toy import evaluate, sample_completions

    model, tokenizer = warm_start
    easy = make_problems(16, 2, 2, seed=11)
    hard = make_problems(16, 11, 11, seed=12)
    completions = sample_completions(model, tokenizer, easy, 4)
    assert [len(c) for c in completions] == [4] * len(easy)
    correct = sum(sum(toy_reward(texts, [p.answer] * 4)) for p, texts in zip(easy, completions))
    scores = evaluate(model, tokenizer, easy, 4, ks=(1, 4))
    assert scores["pass@1"] == pytest.approx(correct / (4 * len(easy)))  # same sampling seed, same samples
    assert scores["pass@4"] >= scores["pass@1"]
    assert scores["pass@1"] > 0.6
    assert evaluate(model, tokenizer, hard, 4, ks=(1,))["pass@1"] < scores["pass@1"] - 0.3


def test_step_count_diagnostics():
    from benchmarks.tasks.toy.evaluate import count_steps

    assert count_steps(EXAMPLE.solution) == EXAMPLE.num_ops
    assert count_steps("7-7=0\n\nAnswer: 0\n\n0+9=9") == 1  # steps after the answer do not count
    assert count_steps("7 - 7 = 0\n\n0+9=9\n\n9-8=1\n\n1+1=2") == 4


def test_mintrl_step_on_toy_task_intervenes_with_rule_judge(warm_start, tmp_path):
    """One MInTRL step on the toy task wires the rule judge in: it revises rollouts, never fails, and its tokens are
    a minority of the completion tokens."""
    from benchmarks.tasks.toy.training import build_trainer, rl_config

    model, tokenizer = warm_start
    args = rl_config(
        "mintrl-const", tmp_path, steps=1, per_device_train_batch_size=16, max_reviews=4, learning_rate=0.0
    )
    trainer = build_trainer("mintrl-const", model, tokenizer, make_dataset(8, 11, 11, seed=5), args)
    trainer.train()
    logs = next(entry for entry in trainer.state.log_history if "reward" in entry)
    assert logs["mintrl/intervention_rate"] > 0
    assert 0 < logs["mintrl/judge_token_frac"] < 0.5
    assert logs["mintrl/judge_failures"] == 0


FAR = Problem(9, (("+", 5), ("@", 3)))  # 9+5=14, 14@3=10 (a@b = a+b-7)


@pytest.mark.parametrize(
    ("notation", "chunk", "expected"),
    [
        ("far", "14@3=10\n\n", None),
        ("far", "14+3=10\n\n", 0),  # the policy's notation is a wrong step for the far judge
        ("far", "14+3=17\n\n", 0),
        ("near", "14+3=10\n\n", None),  # near: `+` in place of `@` is right iff the value is
        ("near", "14@3=10\n\n", None),  # the reference's notation stays right
        ("near", "14+3=17\n\n", 0),
        ("near", "14-3=10\n\n", 0),  # only the policy's way of writing the step (`+`), not any operator
        ("near", "14+3=1", None),  # unfinished, still a prefix of `14+3=10`
        ("near", "14+3=11\n\n", 0),
        ("near", "14+3=10\n\nAnswer: 10", None),
        ("near", "14+3=10\n\nAnswer: 3", 1),
    ],
)
def test_rule_review_in_the_far_and_the_near_notation(notation, chunk, expected):
    judge = rule_judge(notation=notation)
    assert judge.review_fn(FAR.question, "9+5=14\n\n", split_steps(chunk), None) == expected


def test_rule_corrections_in_the_far_and_the_near_notation():
    far, near = rule_judge(), rule_judge(notation="near")
    assert far.correct_fn(FAR.question, "9+5=14\n\n", None) == "14@3=10\n\n"
    assert near.correct_fn(FAR.question, "9+5=14\n\n", None) == "14+3=10\n\n"
    assert near.correct_fn(FAR.question, "", None) == "9+5=14\n\n"  # familiar steps are the same in both
    assert near.correct_fn(FAR.question, "9+5=14\n\n14+3=", None) == "10\n\n"  # completes the step begun
    assert near.correct_fn(FAR.question, "9+5=14\n\n14@3=", None) == "10\n\n"
    assert rule_judge(8, notation="near").correct_fn(FAR.question, "", None) == "9+5=14\n\n14+3=10\n\nAnswer: 10"
    assert FAR.written_steps("near") == ["9+5=14", "14+3=10", "Answer: 10"]
    with pytest.raises(ValueError, match="notation"):
        rule_judge(notation="close")


def test_near_judge_repairs_random_trajectories_written_in_the_policy_notation():
    """A policy that writes new-operator steps with `+` and slips at random: the near judge's cuts and corrections
    converge on the near-notation solution, and it never flags a right step."""
    judge = rule_judge(notation="near")
    rng = random.Random(1)
    for _ in range(100):
        problem = make_problem(rng, rng.randint(2, 6), new_op="@")
        solution = STEP_SEPARATOR.join(problem.written_steps("near"))
        prefix = repair_slipping_policy(judge, problem.question, solution, 4 * len(problem.steps), rng)
        assert prefix == solution
        assert toy_reward([prefix], [problem.answer]) == [1.0] and problem.solved(prefix)


def test_rule_planner_states_the_rule_from_the_reference_in_the_training_wording():
    """SORT's regime: the rule planner writes `Rule: a@b = a+b-7.` from the question and the reference's step (in
    either notation), the wording the hint warm start was trained on; it fails (not raises) without a new operator."""
    from benchmarks.tasks.toy.hint import hint_prompt, plan_rule, rule_planner, rule_text
    from trl_mintrl.sort import PlanRequest

    problem = Problem(2, (("+", 7), ("+", 6), ("@", 1)))
    near = STEP_SEPARATOR.join(problem.written_steps("near"))
    assert near == "2+7=9\n\n9+6=15\n\n15+1=9\n\nAnswer: 9"
    assert plan_rule(problem.question, near) == plan_rule(problem.question, problem.solution) == "Rule: a@b = a+b-7."
    assert plan_rule("Compute 1+2#3 =", "1+2=3\n\n3+3=8\n\nAnswer: 8") == rule_text("#", 2) == "Rule: a#b = a+b+2."
    assert hint_prompt(rule_text("@", -7), problem.question) == "Rule: a@b = a+b-7. Compute 2+7+6@1 ="
    plans = rule_planner().plan([PlanRequest(problem.question, near), PlanRequest(EXAMPLE.question, EXAMPLE.solution)])
    assert plans[0].text == "Rule: a@b = a+b-7." and not plans[0].failed
    assert plans[1].failed


def test_hinted_training_examples_apply_a_stated_rule_of_another_operator():
    """The hint warm start's extra data: a rule for a symbol other than the regime's `@`, stated before the question
    in `hint_prompt`'s wording, applied in the last step written the policy's way (`a+b=v`, v = a+b+k)."""
    import re

    from benchmarks.tasks.toy.hint import HINT_SYMBOLS, make_hinted_example

    rng = random.Random(0)
    for _ in range(200):
        example = make_hinted_example(rng, rng.randint(1, 6))
        content = example.row()["prompt"][0]["content"]
        match = re.fullmatch(r"Rule: a(\S)b = a\+b([+-]\d)\. Compute (\d+(?:[-+]\d+)*)(\S)(\d+) =", content)
        assert match, content
        symbol, k, head, op, b = match.groups()
        assert symbol == op and symbol in HINT_SYMBOLS and "@" not in content and int(k) != 0
        steps = example.solution.split(STEP_SEPARATOR)
        value = sum(int(term) for term in re.findall(r"[-+]?\d+", head))
        assert steps[-2] == f"{value}+{b}={value + int(b) + int(k)}"
        assert steps[-1] == f"Answer: {value + int(b) + int(k)}" and 0 <= value + int(b) + int(k) <= 19


def test_sort_hint_regime_uses_the_hint_warm_start_near_references_and_the_hinted_teacher_prompt(tmp_path):
    from benchmarks.tasks.toy.hint import HINT_TEACHER_TEMPLATE, WARM_START_HINT_DIR, hinted_prompt_fn
    from benchmarks.tasks.toy.training import REGIMES, rl_config
    from benchmarks.tasks.toy.warm_start import WARM_START_DIR

    regime = REGIMES["sort-hint"]
    assert regime.warm_start == WARM_START_HINT_DIR and REGIMES["out-of-reach"].warm_start == WARM_START_DIR
    assert regime.problems(8, seed=999) == REGIMES["out-of-reach"].problems(8, seed=999)
    rows = regime.dataset(4, seed=1)
    for row, problem in zip(rows, regime.problems(4, seed=1), strict=True):
        assert row["solution"] == STEP_SEPARATOR.join(problem.written_steps("near")) != problem.solution
        assert hinted_prompt_fn()(problem)[0]["content"] == "Rule: a@b = a+b-7. " + problem.question
    assert REGIMES["out-of-reach"].dataset(4, seed=1)["solution"][0] == regime.problems(4, seed=1)[0].solution
    args = rl_config("sort", tmp_path, steps=1, regime="sort-hint")
    assert args.teacher_template == HINT_TEACHER_TEMPLATE
    assert rl_config("sort", tmp_path, steps=1, regime="out-of-reach").teacher_template != HINT_TEACHER_TEMPLATE


def test_reference_logprobs_score_the_near_reference_after_its_prompt(warm_start):
    """Calibration (c): mean per-token log-prob of the reference and of the decisive `@`-step result, <= 0."""
    from benchmarks.tasks.toy.calibration import reference_logprobs
    from benchmarks.tasks.toy.hint import hinted_prompt_fn

    model, tokenizer = warm_start
    problems = make_problems(2, 3, 4, seed=5, new_op="@")
    base = reference_logprobs(model, tokenizer, problems)
    teacher = reference_logprobs(model, tokenizer, problems, prompt_fn=hinted_prompt_fn())
    for scores in (base, teacher):
        assert scores["mean_token_logprob"] < 0 and scores["decisive_logprob"] < 0
    assert base != teacher


def test_sort_trainer_on_the_sort_hint_regime_takes_the_rule_planner(warm_start, tmp_path):
    """`build_trainer` threads the planner into SORT's repair (constructed only; no training step)."""
    from benchmarks.tasks.toy.hint import rule_planner
    from benchmarks.tasks.toy.training import REGIMES, build_trainer, rl_config

    model, tokenizer = warm_start
    regime = REGIMES["sort-hint"]
    planner = rule_planner()
    args = rl_config("sort", tmp_path, steps=1, regime="sort-hint", per_device_train_batch_size=16)
    trainer = build_trainer(
        "sort", model, tokenizer, regime.dataset(4, seed=0), args, reward=regime.reward, planner=planner
    )
    assert trainer.repair.planner is planner


# ---- the in-band regime family: a rule applied more than once, every application checked ------------


def test_in_band_problems_apply_their_rule_twice_and_keep_single_rule_problems_as_they_were():
    from benchmarks.tasks.toy.task import BAND_OPERATORS, OFFSETS

    for symbol in BAND_OPERATORS:
        for p in make_problems(200, 3, 6, seed=7, new_op=symbol, new_op_count=2):
            assert p.ops[-1][0] == symbol and sum(op == symbol for op, _ in p.ops) == 2
            assert parse_question(p.question) == p
            value = p.first
            for op, b in p.ops:  # every running value in 0..19, a rule step's a+b too (its familiar reading)
                if op == symbol:
                    assert value + b <= 19 and b <= 9
                value = value + b + OFFSETS[op] if op in OFFSETS else value + b if op == "+" else value - b
                assert 0 <= value <= 19
            assert p.familiar().answer == p.answer and all(op in "+-" for op, _ in p.familiar().ops)
    with pytest.raises(ValueError, match="new_op_count"):
        make_problem(random.Random(0), 3, new_op="~", new_op_count=4)
    # one application (the other regimes): the same problems as before new_op_count existed
    assert make_problems(50, 3, 6, seed=2, new_op="@") == make_problems(50, 3, 6, seed=2, new_op="@", new_op_count=1)


def test_in_band_reward_checks_every_application_of_the_rule():
    from benchmarks.tasks.toy.task import step_reward

    problem = Problem(1, (("+", 4), ("~", 7), ("~", 1)))  # 1+4=5, 5~7=11, 11~1=11
    assert problem.solution == "1+4=5\n\n5~7=11\n\n11~1=11\n\nAnswer: 11"
    prompt = [{"role": "user", "content": problem.question}]
    texts = [
        problem.solution,
        "1+4=5\n\n5+7=11\n\n11+1=11\n\nAnswer: 11",  # the policy's notation: right
        "1+4=5\n\n5+7=12\n\n12+1=11\n\nAnswer: 11",  # the first application wrong, the answer right by luck
        "1+4=5\n\n5+7=11\n\n11+1=12\n\nAnswer: 11",  # the second wrong
        "1+4=5\n\n5+7=11\n\n11+1=11\n\nAnswer: 12",
    ]
    assert step_reward(texts, [problem.answer] * 5, [prompt] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    judge = rule_judge(notation="near")  # the in-band regime's judge: finds the first wrong application, corrects it
    steps = split_steps("1+4=5\n\n5+7=12\n\n")
    assert judge.review_fn(problem.question, "", steps, None) == 1
    assert judge.correct_fn(problem.question, "1+4=5\n\n", None) == "5+7=11\n\n"


def test_judge_calibration_measures_the_corrections_nll_and_the_reviews_coverage(warm_start):
    """`correction_nats` is the NLL of the judge's corrections under the model, given everything before them (checked
    against a direct forward pass of one correction); coverage counts corrections inside the reviewed span."""
    import torch

    from benchmarks.lib.logprobs import sequence_nll
    from benchmarks.tasks.toy.calibration import judge_calibration
    from trl_mintrl.text import prompt_token_ids

    model, tokenizer = warm_start
    problems = make_problems(6, 3, 4, seed=3, new_op="~", new_op_count=2)
    near = judge_calibration(model, tokenizer, problems, notation="near", reviewed_tokens=96, n_samples=2)
    far = judge_calibration(model, tokenizer, problems, notation="far", reviewed_tokens=96, n_samples=2)
    assert near["corrections"] > 0 and 0 < near["correction_nats"] < far["correction_nats"]  # `~` never seen
    assert near["coverage"] == 1.0 and near["corrected_share"] > 0.5
    none = judge_calibration(model, tokenizer, problems, notation="near", reviewed_tokens=0, n_samples=2)
    assert none["coverage"] == 0.0 and none["correction_nats"] == near["correction_nats"]

    context = prompt_token_ids(tokenizer, problems[0].row()["prompt"]) + tokenizer("1+")["input_ids"]
    target = tokenizer("2=3\n\n")["input_ids"]
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([context + target])).logits[0].double(), -1)
    direct = -sum(logps[len(context) - 1 + i, t].item() for i, t in enumerate(target))
    [batched] = sequence_nll(model, [(context, target)])
    assert batched == pytest.approx(direct, rel=1e-4)


def test_toy_schedule_trains_the_first_step_and_lowers_the_rate_after_the_phase(warm_start, tmp_path):
    """The toy's warm-up trains optimizer step 1 at a third of the rate (transformers' constant_with_warmup trains it at
    0); the lower-rate arms multiply the rate from the phase's end on."""
    from benchmarks.tasks.toy.training import build_trainer, rl_config

    model, tokenizer = warm_start
    data = make_dataset(4, 3, 4, seed=0)
    rates = {}
    for later in (None, {"later_factor": 0.3, "later_from": 4}):
        args = rl_config("grpo", tmp_path / str(later is None), steps=6, learning_rate=3e-4)
        trainer = build_trainer("grpo", model, tokenizer, data, args, schedule=later)
        trainer.create_optimizer()
        scheduler = trainer.create_scheduler(6)
        rates[later is None] = []
        for _ in range(6):
            rates[later is None].append(scheduler.get_last_lr()[0])
            trainer.optimizer.step()
            scheduler.step()
    assert rates[True] == pytest.approx([1e-4, 2e-4, 3e-4, 3e-4, 3e-4, 3e-4])
    assert rates[False] == pytest.approx([1e-4, 2e-4, 3e-4, 3e-4, 9e-5, 9e-5])
