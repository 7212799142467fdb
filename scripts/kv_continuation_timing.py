"""Time a MInTRL rollout on the transformers engine with and without the kept KV caches.

    python scripts/kv_continuation_timing.py                        # tiny model: 8 rows x 64 tokens, chunks of 8
    python scripts/kv_continuation_timing.py --model PATH --rows 8 --length 128 --chunk 16 --device cuda

Each repeat runs the same greedy rollout on both engines, alternating which goes first (the machine's load changes
over a run), and checks that they give the same tokens. The judge is scripted: it revises every other chunk at its
first step, the correction repeating half of the wrong step and adding a few tokens of its own. Prints, per engine,
the median wall seconds and the prefill tokens (request tokens the model read), reused tokens (served from a kept
cache) and generated tokens of one rollout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def scripted_judge():
    from trl_mintrl.judges import FunctionJudge

    last_step, reviews = {}, {}

    def review(question, prefix, steps, reference):
        reviews[question] = reviews.get(question, 0) + 1
        last_step[question] = steps[0]
        return 0 if reviews[question] % 2 == 1 else None

    def correct(question, prefix, reference):
        step = last_step[question]
        return step[: len(step) // 2] + " so 2 + 3 = 5."

    return FunctionJudge(review, correct)


def one_rollout(engine, tokenizer, args):
    from trl_mintrl.mintrl import InterventionRollout, RolloutSettings, Trajectory

    trajectories = []
    for i in range(args.rows):
        messages = [{"role": "user", "content": f"Problem {i}: Tom has {i + 3} apples and buys {2 * i + 1} more."}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])
        trajectories.append(Trajectory(prompt_ids=ids, question=f"q{i}", reference="r", review_budget=args.reviews))
    settings = RolloutSettings(
        chunk_size=args.chunk, max_reviews=args.reviews, max_correction_tokens=16, max_completion_length=args.length
    )
    counters = (engine.prefill_tokens, engine.reused_tokens, engine.generated_tokens)
    start = time.perf_counter()
    InterventionRollout(engine, scripted_judge(), tokenizer, settings).run(trajectories)
    seconds = time.perf_counter() - start
    now = (engine.prefill_tokens, engine.reused_tokens, engine.generated_tokens)
    return seconds, [b - a for a, b in zip(counters, now, strict=True)], [t.completion_ids for t in trajectories]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a causal LM directory (default: the package's tiny model, built here)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--reviews", type=int, default=1000, help="reviews per row (default: every chunk)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from trl_mintrl.engines import TransformersEngine

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    path = args.model
    if path is None:
        from trl_mintrl.tiny import build_tiny_model

        path = str(build_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny")))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    eos = [tokenizer.eos_token_id]
    engines = {
        flag: TransformersEngine(
            model,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
            eos_token_ids=eos,
            generation_config=GenerationConfig(do_sample=False),
            kv_cache=flag,
        )
        for flag in (False, True)
    }
    one_rollout(engines[True], tokenizer, args)  # warm-up
    seconds = {False: [], True: []}
    for repeat in range(args.repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        runs = {flag: one_rollout(engines[flag], tokenizer, args) for flag in order}
        if runs[False][2] != runs[True][2]:
            raise SystemExit("the cached engine gave other tokens than the uncached one")
        for flag in order:
            seconds[flag].append(runs[flag][0])
    print(f"model {path} on {args.device}, {args.rows} rows x {args.length} tokens, chunks of {args.chunk}")
    print("engine     median_s  min_s   prefill  reused  generated")
    for flag in (False, True):
        _, (prefill, reused, generated), _ = runs[flag]
        name = "kv_cache" if flag else "no_cache"
        median, low = statistics.median(seconds[flag]), min(seconds[flag])
        print(f"{name:<10} {median:8.3f} {low:6.3f} {prefill:8d} {reused:7d} {generated:10d}")
    print(f"speed-up (medians): {statistics.median(seconds[False]) / statistics.median(seconds[True]):.2f}x")


if __name__ == "__main__":
    main()
