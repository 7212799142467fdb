"""The absorption watch: the tracker's rule on recorded toy NLL series, its per-step sums and checkpoint state, its
config checks, and both directions on the toy (a far judge warns within a short run, a near judge does not)."""

from __future__ import annotations

import logging

import pytest
from mintrl_helpers import mintrl_args

from trl_mintrl.mintrl.absorption import AbsorptionTracker

# mintrl/judge_token_nll per step on the toy's unreachable regime (8 prompts x 8 rollouts, lr 1e-4, seed 0, 24
# intervention steps): the rule judge writes the reference's `a#b=` (far), the near judge `a+b=` as the policy does.
FAR = [2.858, 3.18, 3.251, 3.164, 3.465, 3.373, 2.713, 2.567, 3.023, 2.569, 2.293, 3.061,
       2.556, 2.953, 2.007, 2.8, 2.474, 2.168, 2.084, 1.957, 1.973, 1.783, 1.536, 1.035]  # fmt: skip
NEAR = [1.603, 1.5, 1.616, 1.227, 1.471, 1.315, 1.053, 0.983, 0.747, 0.789, 0.658, 0.928,
        0.747, 0.624, 0.548, 0.804, 0.748, 0.485, 0.58, 0.665, 0.757, 0.432, 0.528, 0.414]  # fmt: skip


def defaults() -> AbsorptionTracker:
    return AbsorptionTracker(window=12, max_nll=1.0, min_fall=0.5)  # MInTRLConfig's defaults


def feed(tracker: AbsorptionTracker, series: list[float], first_step: int = 0) -> list[tuple]:
    """One loss computation per step (NLL sum over 10 judge tokens); the (trend, warn) answers in order."""
    return [tracker.update(first_step + step, 10 * nll, 10) for step, nll in enumerate(series)]


def test_defaults_warn_once_on_the_far_judge_at_its_first_full_window_and_never_on_the_near_judge():
    far = feed(defaults(), [*FAR, 9.9])  # one more step closes the last one
    warns = [step for step, (_, warn) in enumerate(far) if warn]
    assert warns == [12]  # step 12 closes step 11: the first full window, and only once
    trend = far[12][0]
    assert trend.not_absorbed and trend.level > 2.5 and trend.fall < 0.2
    near = feed(defaults(), [*NEAR, 0.4])
    assert not any(warn for _, warn in near)
    assert [t is None for t, _ in near] == [True] * 12 + [False] * 13
    first = near[12][0]
    assert first.level < 1.0 and first.fall > 0.5  # absorbed by either test: 1.6 -> 0.7 within 12 steps
    assert not any(t.not_absorbed for t, _ in near[12:])  # later windows fall little, but the NLL is already low


@pytest.mark.parametrize(
    ("series", "not_absorbed"),
    [
        ([3.0] * 6, True),  # high and flat
        ([2.0, 2.2, 2.4, 2.6, 2.8, 3.0], True),  # rising
        ([0.6] * 6, False),  # low and flat: already absorbed
        ([3.0, 2.4, 1.9, 1.5, 1.2, 1.0], False),  # still above max_nll=0.9 at the end but more than halved
        ([3.0, 2.8, 2.6, 2.4, 2.2, 2.0], True),  # falling, but by a third only
        ([0.0, 0.0, 1.5, 1.5, 1.5, 1.5], True),  # a zero NLL (all judge tokens certain) is no division by zero
    ],
)
def test_rule_needs_both_a_high_end_and_a_slow_fall(series, not_absorbed):
    trend, _ = feed(AbsorptionTracker(window=6, max_nll=0.9, min_fall=0.5), [*series, 1.0])[-1]
    assert trend.not_absorbed is not_absorbed


def test_a_step_is_summed_over_its_loss_computations_and_steps_without_judge_tokens_are_left_out():
    tracker = AbsorptionTracker(window=2, max_nll=1.0, min_fall=0.5)
    tracker.update(0, 3.0, 1)  # step 0, two micro-batches: (3 + 1) / (1 + 3) = 1 nat per token
    tracker.update(0, 1.0, 3)
    tracker.update(1, 0.0, 0)  # no judge tokens: not an intervention step
    tracker.update(2, 8.0, 4)
    assert tracker.nll == [1.0]
    trend, warn = tracker.update(3, 0.0, 0)
    assert tracker.nll == [1.0, 2.0] and trend.fall == pytest.approx(-1.0) and trend.level == pytest.approx(2.0)
    assert warn and tracker.warned


def test_the_trend_is_fitted_over_the_last_window_only():
    """Absorbed early, then stalled high: the window forgets the early steps (a stall later in the run is caught)."""
    tracker = AbsorptionTracker(window=4, max_nll=1.0, min_fall=0.5)
    trend, _ = feed(tracker, [0.2] * 4 + [3.0] * 4 + [9.9])[-1]
    assert len(tracker.nll) == 4
    assert trend.level == pytest.approx(3.0) and trend.fall == pytest.approx(0.0) and trend.not_absorbed


def test_state_round_trip_continues_as_if_never_stopped():
    straight, first = defaults(), defaults()
    answers = feed(straight, FAR)
    feed(first, FAR[:7])
    resumed = defaults()
    resumed.load_state_dict(first.state_dict())
    assert feed(resumed, FAR[7:], first_step=7) == answers[7:]
    assert resumed.state_dict() == straight.state_dict()


@pytest.mark.parametrize(
    "state",
    [
        {"pending": None, "warned": False},
        {"nll": "high", "pending": None, "warned": False},
        {"nll": [1.0, "x"], "pending": None, "warned": False},
        {"nll": [], "pending": [1, 2.0], "warned": False},
        {"nll": [], "pending": None, "warned": "no"},
    ],
)
def test_malformed_state_is_refused(state):
    with pytest.raises((KeyError, TypeError, ValueError)):
        defaults().load_state_dict(state)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"absorption_window": 1}, "absorption_window must be >= 2"),
        ({"absorption_max_nll": 0.0}, "absorption_max_nll must be > 0"),
        ({"absorption_min_fall": 1.0}, r"absorption_min_fall must be in \(0, 1\)"),
        ({"absorption_min_fall": 0.0}, r"absorption_min_fall must be in \(0, 1\)"),
    ],
)
def test_config_refuses_bad_absorption_settings(cpu_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        mintrl_args(cpu_args, **overrides)


# ----- both directions on the toy -----

TOY_WINDOW = 10  # steps run per judge; the defaults' thresholds, a shorter window than the default 12


def near_judge():
    """The rule judge in the policy's notation: the warm start writes the `a#b` step as `a+b=`, so this judge takes
    that as the step's form and checks only the value (`1#2=5` is written `1+2=5`), cutting at the step holding the
    first wrong character and writing the rest of that step."""
    from benchmarks.tasks.toy.task import NEW_OPERATOR, STEP_SEPARATOR, parse_question
    from trl_mintrl.judges import FunctionJudge

    def target(question):
        return STEP_SEPARATOR.join(s.replace(NEW_OPERATOR, "+") for s in parse_question(question).steps)

    def review(question, prefix, steps, reference=None):
        text, goal = prefix + "".join(steps), target(question)
        wrong = next((i for i, ch in enumerate(text) if i >= len(goal) or ch != goal[i]), None)
        if wrong is None:  # right so far (the last step may be unfinished)
            return None
        end = len(prefix)
        for index, step in enumerate(steps):
            end += len(step)
            if wrong < end:
                return index
        return len(steps) - 1

    def correct(question, prefix, reference=None):
        rest = target(question)[len(prefix) :]
        cut = rest.find(STEP_SEPARATOR)
        return rest if cut < 0 else rest[: cut + len(STEP_SEPARATOR)]

    return FunctionJudge(review, correct)


def test_near_judge_writes_the_policys_notation():
    judge = near_judge()
    question, prefix = "Compute 4-3#2 =", "4-3=1\n\n"
    assert judge.review_fn(question, prefix, ["1+2=5\n\n", "Answer: 5"], None) is None
    assert judge.review_fn(question, prefix, ["1+2=3\n\n", "Answer: 3"], None) == 0
    assert judge.review_fn(question, "", ["4-3=1\n\n", "1+2=3"], None) == 1
    assert judge.correct_fn(question, prefix, None) == "1+2=5\n\n"
    assert judge.correct_fn(question, prefix + "1+2=5\n\n", None) == "Answer: 5"


@pytest.fixture(scope="module")
def warm_start():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy import WARM_START_DIR

    return WARM_START_DIR, AutoTokenizer.from_pretrained(WARM_START_DIR), AutoModelForCausalLM


@pytest.mark.parametrize("judge", ["far", "near"])
def test_toy_far_judge_warns_and_near_judge_does_not(warm_start, tmp_path, caplog, judge):
    """Ten intervention steps on the unreachable regime (8 prompts x 8 rollouts, the runs of FAR and NEAR): the rule
    judge's `a#b=` keeps the NLL above 2 nats and warns once; the same corrections in the policy's `a+b=` fall below
    1 nat and never warn."""
    from benchmarks.tasks.toy.task import rule_judge
    from benchmarks.tasks.toy.training import REGIMES, build_trainer, rl_config

    path, tokenizer, model_class = warm_start
    args = rl_config(
        "mintrl-const",
        tmp_path,
        steps=TOY_WINDOW + 1,  # the last step closes the window's last step
        regime="unreachable",
        per_device_train_batch_size=64,
        intervention_steps=TOY_WINDOW + 1,
        absorption_window=TOY_WINDOW,
    )
    dataset = REGIMES["unreachable"].dataset(256, seed=1)
    trainer = build_trainer(
        "mintrl-const",
        model_class.from_pretrained(path),
        tokenizer,
        dataset,
        args,
        judge=rule_judge() if judge == "far" else near_judge(),
    )
    with caplog.at_level(logging.WARNING, logger="trl_mintrl.mintrl.absorption"):
        trainer.train()
    nll = [e["mintrl/judge_token_nll"] for e in trainer.state.log_history if "mintrl/judge_token_nll" in e]
    flags = [e["mintrl/corrections_not_absorbed"] for e in trainer.state.log_history if "mintrl/judge_nll_trend" in e]
    warnings = [r.getMessage() for r in caplog.records if "not being absorbed" in r.getMessage()]
    assert len(nll) == TOY_WINDOW + 1 and trainer.absorption.nll == pytest.approx(nll[:TOY_WINDOW])
    assert flags == [float(judge == "far")]  # the last step sees the first full window
    if judge == "far":
        assert min(nll) > 2.0 and len(warnings) == 1
        message = warnings[0]
        for fix in ("judge_correction_template", "judge='self'", "max_correction_tokens=16", "max_reviews=4"):
            assert fix in message, fix
        assert "far from the student" in message
    else:
        assert trainer.absorption.trend().level < 1.0 and warnings == []
