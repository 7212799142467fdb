"""A real-model benchmark run (`benchmarks.tasks.real.run`) on TRL's colocated vLLM engine: sft-grpo's curve point
after its SFT epoch is drawn by the GRPO trainer's engine holding the weights SFT wrote (on the tiny model)."""

from __future__ import annotations

from benchmarks.tasks.real import measures, run
from benchmarks.tasks.real.task import make_problems
from trl_mintrl.engines.transformers import TransformersEngine
from trl_mintrl.text import prompt_token_ids


def test_sft_grpo_draws_its_curve_after_sft_with_the_trainers_engine(tiny_model_path, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv(run.CHECKPOINTS_ENV, str(tmp_path))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    job = {"name": "real-in-band-sft-grpo-s0", "regime": "in-band", "arm": "sft-grpo", "seed": 0, "steps": 1,
           "prompts_per_step": 1, "max_completion_length": 8, "engine": "vllm", "eval_every": 1,
           "curve_problems": 1, "final_problems": 1, "overrides": {},
           "warmup": {"batch_size": 2, "learning_rate": 1e-2}}  # fmt: skip
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    sample, draws = measures.held_out_samples, []

    def greedy(engine, prompts):
        return [g.token_ids for g in engine.generate(prompts, 6, temperature=0)]

    def spying(model, tokenizer, problems, max_new_tokens, *, seed, engine=None, **kwargs):
        """At the first draw (SFT's curve point): the engine's greedy tokens against the model's own, now and before
        SFT."""
        if not draws:
            prompts = [prompt_token_ids(tokenizer, p.prompt) for p in problems]
            ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id])
            draws.append({"engine": engine, "vllm": greedy(engine, prompts),
                          "after_sft": greedy(TransformersEngine(model.eval(), **ids), prompts),
                          "before_sft": greedy(TransformersEngine(initial, **ids), prompts)})  # fmt: skip
        return sample(model, tokenizer, problems, max_new_tokens, seed=seed, engine=engine, **kwargs)

    monkeypatch.setattr(measures, "held_out_samples", spying)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    trainer, clock, sft = run.train(job, model, tokenizer, make_problems(2, 2, seed=1))
    first = draws[0]
    assert first["engine"] is clock.engine and first["engine"] is not None
    assert first["vllm"] == first["after_sft"] != first["before_sft"]  # the engine held the weights SFT wrote
    assert sft["steps"] == 1 and "pass@1" in sft["curve"] and trainer.state.global_step == 1
