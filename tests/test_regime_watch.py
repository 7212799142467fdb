"""MInTRL's regime warnings: the judge's share of the tokens far above the paper's, and the controls' length climbing
toward the cap while the judge intervenes and after. Fed with the per-step numbers of the committed real-model and
toy runs, then end to end through the trainer."""

from __future__ import annotations

import logging

import pytest
from mintrl_helpers import mintrl_args, scripted_trainer

from trl_mintrl.mintrl.regime_watch import RegimeWatch

LOGGER = "trl_mintrl.mintrl.regime_watch"


def watch(**overrides) -> RegimeWatch:
    return RegimeWatch(**{"max_judge_share": 0.25, "control_length_climb": 0.5, "max_completion_length": 64,
                          "revised_length_ratio": 1.5, **overrides})  # fmt: skip


def feed(w: RegimeWatch, shares, lengths=None, clipped=None) -> list[list[str]]:
    lengths = lengths or [22.0] * len(shares)
    clipped = clipped or [0.0] * len(shares)
    return [w.update(s, n, c) for s, n, c in zip(shares, lengths, clipped, strict=True)]


def test_the_share_warning_speaks_at_the_second_step_of_a_share_far_above_the_papers():
    # SmolLM2 in band, fresh seed 3: 55%, 49% at the first two intervention steps
    assert feed(watch(), [0.55, 0.49, 0.35, 0.41]) == [[], ["share"], [], []]  # once per run
    # the toy benchmark's in-band arm, where MInTRL gained: 16-23% a step
    assert feed(watch(), [0.21, 0.23, 0.16, 0.16, 0.19, 0.16, 0.18, 0.2, 0.16, 0.22, 0.26, 0.14]) == [[]] * 12
    # judge_token_target's controller: every slot reviewed at the first step only
    assert feed(watch(), [0.45, 0.03, 0.04, 0.03]) == [[]] * 4
    assert feed(watch(max_judge_share=None), [0.55, 0.49]) == [[], []]


def test_the_length_warning_speaks_when_the_controls_climb_halfway_to_the_cap():
    # fresh seed 3's controls (every token): 22 -> 52 by the fifth intervention step; the share cut at the cap with it
    lengths, clipped = [22.06, 22.56, 28.12, 35.44, 51.75, 50.5], [0.0, 0.0, 0.0, 0.19, 0.44, 0.59]
    said = feed(watch(max_judge_share=None), [0.5] * 6, lengths, clipped)
    assert said == [[], [], [], [], ["length"], []]  # (35.44 + 51.75) / 2 >= 22.06 + 0.5 * (64 - 22.06)
    # the reachable regime's controls stayed at 21-23 tokens
    assert feed(watch(), [0.25] * 4, [21.5, 20.9, 22.7, 22.1], [0.0] * 4) == [[]] * 4
    # long but never cut (answers that end on their own): no warning; at the cap from the start there is no climb,
    # and the warning is the one for controls cut from the start
    assert feed(watch(max_judge_share=None), [0.5] * 3, [22.0, 60.0, 62.0], [0.0, 0.1, 0.1]) == [[]] * 3
    assert feed(watch(max_judge_share=None), [0.5] * 3, [64.0, 64.0, 64.0], [1.0, 1.0, 1.0]) == [[], ["clipped"], []]


def test_the_length_warning_also_watches_the_steps_after_the_interventions():
    # the chain family's mintrl-lines4, seed 0 (320-token cap): the controls stayed near 209 tokens over its 8
    # intervention steps, then grew on once they had ended, to 309 tokens with 75% cut at the cap at step 13
    w = watch(max_completion_length=320)
    shares = [0.083, 0.178, 0.142, 0.108, 0.174, 0.166, 0.101, 0.163]
    lengths = [208.875, 204.812, 211.875, 209.75, 208.875, 206.75, 242.812, 230.438]
    clipped = [0.0, 0.0, 0.0, 0.0, 0.0, 0.062, 0.125, 0.062]
    assert feed(w, shares, lengths, clipped) == [[]] * 8
    after = [(243.031, 0.125), (258.938, 0.125), (276.781, 0.156), (279.5, 0.219), (309.156, 0.75)]
    said = [w.update_after_interventions(length, cut) for length, cut in after]
    assert said == [[], [], [], [], ["length"]]  # (279.5 + 309.156) / 2 >= 208.875 + 0.5 * (320 - 208.875)
    assert "grew from 209 to 294 tokens" in w.message("length")
    assert "by 5 steps after the judge's 8 intervention steps" in w.message("length")
    assert w.update_after_interventions(294.0, 0.47) == []  # once per run
    # mintrl-const, seed 0: controls at 188-217 tokens and none cut over the 12 steps after its 8
    quiet = watch(max_completion_length=320)
    feed(quiet, [0.05] * 8, [208.88, 210.56, 207.81, 210.12, 206.38, 197.69, 217.56, 206.06], [0.0] * 8)
    after = [212.84, 187.56, 217.16, 202.12, 188.62, 207.72, 191.44, 198.41, 213.28, 204.0, 201.66, 198.34]
    assert [quiet.update_after_interventions(length, 0.0) for length in after] == [[]] * 12
    # a run that has not intervened yet (or never does) has no start to climb from
    assert watch().update_after_interventions(64.0, 1.0) == [] and watch().steps_after_interventions == 0


def test_controls_cut_at_the_cap_from_the_start_warn_once_at_the_second_step():
    # the CPU recipe's old setup: the instruct model without a format warm-up, half to all of its 96 tokens cut
    w = watch(max_judge_share=None, max_completion_length=96)
    assert feed(w, [0.1] * 4, [96.0, 95.0, 96.0, 96.0], [0.75, 0.5, 1.0, 1.0]) == [[], ["clipped"], [], []]
    assert "max_completion_length=96" in w.message("clipped") and "mask_truncated_completions=True" in w.message(
        "clipped"
    )
    # the real model after its warm-up: a few cut at first, then the climb (the length warning, not this one)
    lengths, clipped = [22.06, 22.56, 28.12, 35.44, 51.75], [0.0, 0.0, 0.0, 0.19, 0.44]
    assert "clipped" not in sum(feed(watch(max_judge_share=None), [0.5] * 5, lengths, clipped), [])
    assert feed(watch(max_judge_share=None, control_length_climb=None), [0.1] * 2, [96.0] * 2, [1.0] * 2) == [[], []]


def test_the_warnings_name_their_fixes():
    share = watch(max_judge_share=0.25)
    feed(share, [0.55, 0.49])
    assert "judge_token_target" in share.message("share") and "49-55%" in share.message("share")
    length = watch(max_judge_share=None)
    feed(length, [0.5, 0.5, 0.5], [22.0, 45.0, 50.0], [0.0, 0.3, 0.5])
    text = length.message("length")
    assert "mask_truncated_completions=True" in text and "from 22 to 48 tokens" in text


def lengthening(w: RegimeWatch, controls, revised, gaps) -> list[list[str]]:
    """Feed steps with a share under the threshold and no controls cut: only the lengthening warning can speak."""
    return [w.update(0.05, c, 0.0, r, g) for c, r, g in zip(controls, revised, gaps, strict=True)]


def test_the_lengthening_warning_speaks_when_revised_rollouts_outgrow_the_controls():
    # SmolLM2 in band (the cause study's mintrl-target, seed 0): controls 21.5 tokens, revised 37.6 then 46.9 (step 2
    # revised nothing), rewarded ~1 against ~0.06; the controls reached 37.6 by the fourth step, 55.5 by the eighth
    said = lengthening(watch(), [21.5, 21.6, 23.8, 37.6], [37.6, None, 46.9, 64.0], [0.94, None, 0.9, 0.93])
    assert said == [[], [], ["lengthening"], []]  # steps that revised none do not count; once per run
    # the reachable regime: a correction replaces a step, the revised rollouts as long as the controls (0.96-1.06x)
    assert lengthening(watch(), [21.5, 21.6, 22.0], [21.3, 21.6, 22.4], [0.5, 0.5, 0.94]) == [[]] * 3
    # longer but scoring no better than the controls (the self-judge in band: rewards ~0 on both sides)
    assert lengthening(watch(), [21.4, 20.8, 21.0], [40.0, 41.0, 42.0], [0.0, -0.06, 0.0]) == [[]] * 3
    assert lengthening(watch(revised_length_ratio=None), [21.5, 21.5], [37.6, 43.8], [0.9, 0.9]) == [[], []]
    w = watch()
    lengthening(w, [21.5, 21.5], [37.6, 43.8], [0.94, 0.88])
    assert "1.9 times as long as the controls (41 tokens against 22" in w.message("lengthening")
    assert "warm-up on complete answers" in w.message("lengthening")


def test_the_lengthening_window_is_kept_in_the_checkpoint_state():
    w = watch()
    lengthening(w, [21.5], [37.6], [0.94])
    resumed = watch()
    resumed.load_state_dict(w.state_dict())
    assert resumed.revised == [(21.5, 37.6, 0.94)]
    assert lengthening(resumed, [21.5], [43.8], [0.88]) == [["lengthening"]]
    older = w.state_dict()
    del older["revised"]  # a checkpoint written before the warning existed
    resumed.load_state_dict(older)
    assert resumed.revised == []


@pytest.mark.parametrize("value", [1.0, 0.5])
def test_a_revised_length_ratio_of_one_or_less_is_refused(cpu_args, value):
    with pytest.raises(ValueError, match="revised_length_warning must be > 1"):
        mintrl_args(cpu_args, revised_length_warning=value)


@pytest.mark.parametrize("field", ["judge_share_warning", "control_length_warning"])
@pytest.mark.parametrize("value", [0.0, 1.0, -0.1])
def test_thresholds_outside_zero_one_are_refused(cpu_args, field, value):
    with pytest.raises(ValueError, match=field):
        mintrl_args(cpu_args, **{field: value})


def test_the_trainer_warns_from_its_second_intervention_step_and_keeps_the_state(
    tiny_model_path, cpu_args, toy_dataset, caplog, tmp_path
):
    # the scripted judge replaces each intervened rollout's first chunk: ~15% of the tokens, every step
    args = mintrl_args(cpu_args, max_steps=1, save_strategy="steps", save_steps=1, judge_share_warning=0.1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = scripted_trainer(tiny_model_path, args, toy_dataset)
        first.train()
        assert not [r for r in caplog.records if r.name == LOGGER]
        resumed = scripted_trainer(
            tiny_model_path, mintrl_args(cpu_args, max_steps=2, judge_share_warning=0.1), toy_dataset
        )
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
    # the restored window held step 1's share; the untrained tiny model's completions are all cut at the cap
    share, clipped = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "judge_token_target" in share and "were cut at max_completion_length=24" in clipped
    assert resumed.schedule.regime_watch.warned == {"share", "clipped"}
    assert len(resumed.schedule.regime_watch.shares) == 2
    # the revised rollouts' length beside the controls' reached the watch at both steps (the untrained model: all cut)
    revised = resumed.schedule.regime_watch.revised
    assert len(revised) == 2 and all(control == length == 24.0 for control, length, _ in revised), revised
    # past the intervention steps the controls' length still reaches the watch
    after = scripted_trainer(tiny_model_path, mintrl_args(cpu_args, max_steps=3, intervention_steps=1), toy_dataset)
    after.train()
    watched = after.schedule.regime_watch
    assert (watched.intervention_steps, watched.steps_after_interventions) == (1, 2)
    logged = [log["mintrl/length_control"] for log in after.state.log_history if "mintrl/length_control" in log]
    assert watched.control_lengths == pytest.approx(logged[1:]) and len(logged) == 3
    assert watched.state_dict()["steps_after_interventions"] == 2
    quiet = scripted_trainer(
        tiny_model_path, mintrl_args(cpu_args, max_steps=2, control_length_warning=None), toy_dataset
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        quiet.train()
    assert not [r for r in caplog.records if r.name == LOGGER]  # share under the default 0.25; length warnings off
