"""A real-model run (`benchmarks.tasks.real.run`) that its sitting's end interrupted resumes from its last checkpoint:
the steps already trained are not trained again, and the clock's records (seconds, the curve, the load) carry on. On
the tiny model, transformers rollouts."""

import json

import pytest

from benchmarks.tasks.real import run
from benchmarks.tasks.real.task import make_problems


class SittingEnded(Exception):
    """Stands for the process being ended after its first checkpoint."""


# (arm, the step whose checkpoint the sitting ended after): mid-run, and after the last step (measuring then: resuming
# trains no step past max_steps and keeps the finished weights)
@pytest.mark.parametrize(("arm", "ended"), [("mintrl-const", 1), ("grpo", 2)])
def test_an_interrupted_run_resumes_from_its_last_checkpoint(arm, ended, tiny_model_path, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv(run.CHECKPOINTS_ENV, str(tmp_path))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    problems = make_problems(2, 2, seed=1)
    job = {"name": f"real-in-band-{arm}-s0", "regime": "in-band", "arm": arm, "seed": 0, "steps": 2,
           "prompts_per_step": 1, "max_completion_length": 8, "engine": "transformers", "eval_every": 1,
           "curve_problems": 1, "final_problems": 1, "overrides": {}}  # fmt: skip
    make_clock = run.make_clock

    def ending_clock(*args):
        clock = make_clock(*args)
        save = clock.on_save

        def on_save(args, state, control, **k):
            save(args, state, control, **k)
            if state.global_step == ended:
                raise SittingEnded

        clock.on_save = on_save
        return clock

    monkeypatch.setattr(run, "make_clock", ending_clock)
    with pytest.raises(SittingEnded):
        run.train(job, AutoModelForCausalLM.from_pretrained(tiny_model_path), tokenizer, problems)
    [checkpoint] = run.run_folder(job).glob("checkpoint-*")  # the last one kept
    assert checkpoint.name == f"checkpoint-{ended}" and run.last_checkpoint(run.run_folder(job)) == checkpoint
    first = json.loads((checkpoint / run.CLOCK_FILE).read_text())
    assert len(first["seconds"]) == ended and list(first["curve"]) == ["1"]

    monkeypatch.setattr(run, "make_clock", make_clock)
    trainer, clock, _ = run.train(job, AutoModelForCausalLM.from_pretrained(tiny_model_path), tokenizer, problems)
    assert trainer.state.global_step == 2 and clock.resumed_at == [ended]
    assert len(clock.seconds) == 2 and clock.seconds[:ended] == first["seconds"]  # no step trained again
    assert list(clock.curve) == [1] and clock.curve[1] == first["curve"]["1"]
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == [1, 2]
    assert clock.watch.state()["before"] == first["watch"]["before"]
    saved = AutoModelForCausalLM.from_pretrained(run.last_checkpoint(run.run_folder(job)))
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), saved.parameters(), strict=True))


def test_a_measure_its_sitting_cut_short_draws_only_the_sets_it_had_not(tiny_model_path, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.real import measures

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    job = {"regime": "in-band", "final_problems": 1, "curve_problems": 1, "max_completion_length": 8}
    sample, drawn_sets = measures.held_out_samples, []

    def drawing(model, tokenizer, problems, *args, **kwargs):
        drawn_sets.append(problems[0].question)
        if len(drawn_sets) == 2:  # the sitting ends while the second set is drawn
            raise SittingEnded
        return sample(model, tokenizer, problems, *args, **kwargs)

    monkeypatch.setattr(measures, "held_out_samples", drawing)
    with pytest.raises(SittingEnded):
        run.final_scores(model, tokenizer, job, seed=0, folder=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["held-out-heldout.json"]
    first = json.loads((tmp_path / "held-out-heldout.json").read_text())
    scores, drawn = run.final_scores(model, tokenizer, job, seed=0, folder=tmp_path)
    longer = run.held_out(job)["heldout_longer"][0].question
    assert drawn_sets[2:] == [longer]  # the next sitting draws the set it had not, only
    assert drawn == first and set(scores) == {"heldout", "heldout_longer", "curve"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held-out-heldout.json", "held-out-heldout_longer.json"]
