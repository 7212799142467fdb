"""`benchmarks/studies/cost.py --engine`: which variants each engine and task measure, where their results go, and the vLLM
tables rendered from the engine's own counts (the vLLM run itself: tests/real_vllm/test_vllm_cost.py); `--real`'s
trainers (learning_real's arms, built here on the tiny model: the real model's runs are the benchmark's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cost_helpers import StandInTrainer

from benchmarks.lib.counters import CallCounter, TokenCounter
from benchmarks.lib.step_cost import measure_time
from benchmarks.studies.cost import (
    ENGINE_VARIANTS,
    README_START,
    REAL_VARIANTS,
    TOOL_VARIANTS,
    VARIANTS,
    build_real,
    parse_args,
    real_job,
    render,
    result_markers,
)

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.mark.parametrize(
    ("argv", "variants", "name"),
    [
        ([], list(VARIANTS), "cost"),
        (["--tools"], list(TOOL_VARIANTS), "cost_tools"),
        (["--tools", "reachable"], list(TOOL_VARIANTS), "cost_tools_reachable"),
        (["--engine", "vllm"], ["grpo", "mintrl_interventions", "mintrl_after_phase"], "cost_vllm"),
        (["--engine", "vllm", "--tools"], list(TOOL_VARIANTS), "cost_tools_vllm"),
        (["--engine", "vllm", "--variants", "mintrl_interventions"], ["grpo", "mintrl_interventions"], "cost_vllm"),
        (["--real"], list(REAL_VARIANTS), "cost_real"),
        (["--real", "reachable"], list(REAL_VARIANTS), "cost_real_reachable"),
        (["--real", "--engine", "vllm"], list(REAL_VARIANTS), "cost_real_vllm"),
    ],
)
def test_each_engine_and_task_measures_its_variants_into_its_own_files(argv, variants, name):
    """transformers keeps its variants and file names; vLLM measures the engine study's variants into `*_vllm` files."""
    args = parse_args(argv)
    assert (args.variants, args.name) == (variants, name)


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - set(ENGINE_VARIANTS["vllm"])))
def test_vllm_refuses_the_variants_it_does_not_measure(variant, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--engine", "vllm", "--variants", variant])
    assert "--engine vllm measures grpo, mintrl_interventions, mintrl_after_phase" in capsys.readouterr().err


def test_committed_transformers_results_render_as_committed():
    """The vLLM rendering left the transformers tables as they were: the committed .md is what the JSON renders to,
    and the summary blocks keep their markers."""
    for name in ("cost", "cost_tools"):
        saved = json.loads((RESULTS / f"{name}.json").read_text())
        assert render(saved) + "\n" == (RESULTS / f"{name}.md").read_text(), name
    assert result_markers({"task": "reachable"})[0] == README_START
    start = result_markers({"task": "tools-in-band", "engine": "vllm"})[0]
    assert (
        "`python -m benchmarks.studies.cost --tools in-band --engine vllm --replot" in start
        and "cost_tools_vllm" in start
    )


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--real", "--variants", "sort_repair"], "--real measures grpo, mintrl_interventions, mintrl_after_phase"),
        (["--real", "--tools"], "--tools and --real are different tasks"),
        (["--sgd"], "--sgd is --real's"),
    ],
)
def test_real_refuses_variants_learning_real_has_no_arm_for_and_a_second_task(argv, error, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert error in capsys.readouterr().err


def vllm_step(seconds, cpu, requests, cached, judge=None, streams=None) -> dict:
    """A measured step's record as `measure_time` writes it on vLLM (counts per step)."""
    record = {
        "seconds": seconds, "process_cpu_seconds": cpu, "position": 0, "generate": 1, "generate_seconds": 0.5,
        "generation": 1, "generation_seconds": 0.6, "generation_and_scoring": 1, "generation_and_scoring_seconds": 0.8,
        "requests": requests, "engine_steps": 130, "engine_seconds": 0.4, "prompt_tokens": 4000,
        "cached_prompt_tokens": cached, "prefill_tokens": 4000 - cached, "generated_tokens": 3000,
        "decoded_tokens": 3100, "forward_tokens": 20000,
    }  # fmt: skip
    if streams is not None:
        record |= {"streams": streams, "generate": 0, "review": 2, "review_seconds": 0.01, "correct": 1,
                   "correct_seconds": 0.0, "judge_failures": 0, "judge_tokens": judge, "completion_tokens": 3000}  # fmt: skip
    return record


def test_vllm_tables_show_the_engines_counts_and_where_the_step_went():
    saved = {
        "provenance": {
            "command": "python -m benchmarks.studies.cost --engine vllm",
            "commit": "c" * 40,
            "changed_files_that_matter": [],
        },  # fmt: skip
        "settings": {
            "rounds": 2,
            "warmup": 1,
            "variants": ["grpo", "mintrl_interventions"],
            "turn_order": "williams",
            "task": "reachable",
            "engine": "vllm",
        },  # fmt: skip
        "wall_seconds": 60.0,
        "time": {
            "steps": {
                "grpo": [vllm_step(2.0, 2.0, 128, 3000), vllm_step(2.0, 1.0, 128, 3000)],
                "mintrl_interventions": [
                    vllm_step(3.0, 2.4, 600, 2000, judge=30, streams=1),
                    vllm_step(3.0, 1.4, 600, 2000, judge=30, streams=1),
                ],
            },
            "repairs": {},
        },
        "memory": {},
    }
    text = render(saved)
    assert "colocated vLLM engine" in text and "Memory is not measured on vLLM" in text
    time_row, token_row = (line for line in text.splitlines() if line.startswith("| mintrl_interventions"))
    assert "RSS" not in text  # no memory columns
    # CPU ratios 1.2 and 1.4 (mean 1.30); 0 LLM.generate calls + 1 stream, the engine's requests and steps; the
    # step's 3.0 s: 0.6 s rollout (0.4 s of it in engine steps), 0.2 s rewards and log-probs, 2.2 s training
    assert time_row.startswith("| mintrl_interventions | 3.00 (1.90) | 1.50 [1.50, 1.50] | 1.30 [0.03, 2.57] |")
    assert "| 0.0 + 1.0: 600 requests, 130 engine steps (0.40 s) |" in time_row
    assert time_row.endswith("| 0.60 (0.40) / 0.20 / 2.20 |")
    # generated, decoded, asked, prefix-cache hits (share of asked), computed prefill, forward; judge share; no digest
    assert token_row == (
        "| mintrl_interventions | 3,000 (1.00) | 3,100 (1.00) | 4,000 (1.00) | 2,000 (50%) | 2,000 (2.00) "
        "| 20,000 (1.00) | 30 (1.0%) |"
    )
    assert (
        "| grpo | 3,000 (1.00) | 3,100 (1.00) | 4,000 (1.00) | 3,000 (75%) | 1,000 (1.00) | 20,000 (1.00) | - |"
        in text
    )


def test_interleaved_steps_record_every_counters_counts_and_no_digest_on_vllm():
    """`measure_time` records per step the difference of every counter with a snapshot (the model's tokens, the
    vLLM engine's) and of every call counter; a rollout digest only where `generate` produced the rollouts."""
    import torch

    class Engine:  # counts like `VLLMCounter`: one request and 5 tokens per generation
        KEYS = ("requests", "generated_tokens")

        def __init__(self):
            self.requests = self.generated_tokens = 0

        def generate(self):
            self.requests += 1
            self.generated_tokens += 5

        def snapshot(self):
            return {k: getattr(self, k) for k in self.KEYS}

    class Model(torch.nn.Module):
        def forward(self, input_ids):
            return input_ids

    def build(variant: str, steps: int, rounds_of_repairs: int):
        model, engine = Model(), Engine()

        def step():
            engine.generate()
            engine.generate()
            model(input_ids=torch.ones(3, 2))

        trainer = StandInTrainer(steps, model, step)
        tokens = TokenCounter(model, pad_token_id=0, count_generate=False)
        calls = CallCounter(engine, "generate")  # before `step` runs: the counter wraps the engine's method
        return trainer, {"generate": calls, "tokens": tokens, "vllm": engine}

    steps = measure_time(["grpo", "other"], 1, 2, build_fn=build)["steps"]
    for records in steps.values():
        assert len(records) == 2
        for record in records:
            assert (record["generate"], record["requests"], record["generated_tokens"]) == (2, 2, 10)
            assert record["forward_tokens"] == 6 and record["generate_seconds"] >= 0
            assert "rollout_digest" not in record and "prefill_tokens" not in record


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_real_results_name_the_model_its_step_shape_and_engine(engine):
    """A --real run's .md says which model, task and step shape it measured, the vLLM engines' 1 GiB KV cache (the
    toy's is 256 MiB), why there is no memory column; its summary block's markers name its command."""
    settings = {"rounds": 2, "warmup": 1, "variants": ["grpo"], "turn_order": "williams", "task": "real-in-band"}
    if engine == "vllm":
        settings["engine"] = "vllm"
    saved = {
        "provenance": {
            "command": "python -m benchmarks.studies.cost --real",
            "commit": "c" * 40,
            "changed_files_that_matter": [],
        },  # fmt: skip
        "settings": settings,
        "wall_seconds": 60.0,
        "time": {"steps": {"grpo": [vllm_step(2.0, 2.0, 32, 100)] * 2}, "repairs": {}},
        "memory": {},
    }
    text = render(saved)
    assert (
        "SmolLM2-135M-Instruct from the format warm start of `benchmarks/studies/learning_real.py`, its in-band"
        in text
    )
    assert "4 prompts x 8 rollouts per step, completions of at most 64 tokens, learning rate 0." in text
    if engine == "vllm":
        assert "a 1 GiB KV cache" in text and "Memory is not measured on vLLM" in text
    else:
        assert "Memory is not measured on the real model" in text and "colocated vLLM" not in text
    start = result_markers(settings)[0]
    assert (
        f"`python -m benchmarks.studies.cost --real in-band{' --engine vllm' * (engine == 'vllm')} --replot" in start
    )


def test_real_trainers_are_learning_reals_arms_at_learning_rate_0(tiny_model_path, tiny_tokenizer, tmp_path):
    """`build_real` builds learning_real's own trainers (its step shape, MInTRL's rollout settings), then sets what
    the arms fix otherwise: learning rate 0 in the optimizer it creates, and interventions at every step or none;
    every variant draws the same prompts."""
    from transformers import AutoModelForCausalLM

    trainers = {}
    for variant in REAL_VARIANTS:
        method, overrides = VARIANTS[variant]
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        trainers[variant] = build_real(method, overrides, model, tiny_tokenizer, "in-band", 3, "transformers",
                                       str(tmp_path / variant))  # fmt: skip
    assert real_job(3, "transformers")["max_completion_length"] == 64
    grpo, mintrl = trainers["grpo"].args, trainers["mintrl_interventions"].args
    assert (grpo.num_generations, grpo.max_completion_length, grpo.max_steps) == (8, 64, 3)
    assert grpo.per_device_train_batch_size * grpo.gradient_accumulation_steps == 4 * 8
    assert (mintrl.num_control_generations, mintrl.num_intervened_generations, mintrl.chunk_size,
            mintrl.max_reviews) == (4, 4, 16, 4)  # fmt: skip
    for trainer in trainers.values():
        assert trainer.args.learning_rate == 0.0
        assert {group["lr"] for group in trainer.create_optimizer().param_groups} == {0.0}
    assert type(trainers["grpo"].optimizer).__name__ == "AdamW"  # the arms' own
    sgd = build_real("grpo", {}, trainers["grpo"].model, tiny_tokenizer, "in-band", 3, "transformers",
                     str(tmp_path / "sgd"), sgd=True)  # fmt: skip
    optimizer = sgd.create_optimizer()
    assert type(optimizer).__name__ == "SGD" and {g["lr"] for g in optimizer.param_groups} == {0.0}
    assert all(g["momentum"] == 0 for g in optimizer.param_groups)  # no state kept between steps
    scheduled = {v: [trainers[v].schedule.scheduled(s) for s in range(3)] for v in REAL_VARIANTS[1:]}
    assert scheduled == {"mintrl_interventions": [True] * 3, "mintrl_after_phase": [False] * 3}
    first = {v: [row["prompt"] for row in next(iter(t.get_train_dataloader()))] for v, t in trainers.items()}
    assert first["grpo"] == first["mintrl_interventions"] == first["mintrl_after_phase"]
