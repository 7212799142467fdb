"""Sample SmolLM2-135M-Instruct on GSM8K-style word problems and save the samples as a test fixture.

The tests of the math reward's answer reading and of MInTRL's step splitting (tests/test_rewards_math.py,
tests/test_steps.py) read these samples: they are the formats a real chat model writes (`#### 16`, "The answer is:
16.", one step per line), not ones we imagined. Sampling is the model's own: its chat template with the generation
prompt, temperature 1 (no top-k, no top-p), a fixed seed, at most 128 new tokens. Each problem is asked twice: as
the bare question (what the model writes unprompted) and with the real-model benchmark's instruction (one step per
line, `#### <answer>` at the end; benchmarks/tasks/real/task.py), half the samples each.

    trl-mintrl smollm2 /tmp/smol/model          # once: the checkpoint folder (see docs)
    OMP_NUM_THREADS=1 python scripts/smollm2_samples.py --model /tmp/smol/model

writes tests/data/smollm2_samples.json (a few minutes on two busy cores). Rerunning it with the same seed on the
same torch build gives the same samples; the tests only rely on what the committed file holds.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

# One- and two-step word problems in GSM8K's style, with their gold answers.
PROBLEMS = [
    ("Tom has 5 apples. He buys 3 bags with 4 apples in each bag. How many apples does Tom have now?", "17"),
    ("A pen costs $3 and a notebook costs $5. Sara buys 2 pens and 1 notebook. How much does she spend?", "11"),
    ("A farmer has 12 cows. Each cow gives 8 liters of milk a day. How many liters of milk does he get a day?", "96"),
    ("Lisa reads 15 pages every day. How many pages does she read in 2 weeks?", "210"),
    ("A class has 28 students. 4 of them are absent. The others sit in groups of 6. How many groups are there?", "4"),
    ("Mark earns $12 an hour. He works 6 hours on Monday and 4 hours on Tuesday. How much does he earn?", "120"),
]

# The instruction the real-model benchmark appends to its questions (benchmarks/tasks/real/task.py INSTRUCTION).
INSTRUCTION = (
    'Solve it step by step. Write one step per line, and end with the final answer on its own line as "#### <answer>".'
)
PROMPTS = {"plain": "{question}", "instructed": "{question} " + INSTRUCTION}


def draw_samples(model, tokenizer, args: argparse.Namespace, start: float) -> list[dict]:
    """`args.per_prompt` samples of every problem in each prompt form, in order; the seconds since `start` printed
    after each problem."""
    import torch

    samples = []
    for index, (question, _gold) in enumerate(PROBLEMS):
        for form, pattern in PROMPTS.items():
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": pattern.format(question=question)}],
                tokenize=False,
                add_generation_prompt=True,
            )
            inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(
                    **inputs,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=args.max_new_tokens,
                    num_return_sequences=args.per_prompt,
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
            for row in out[:, inputs["input_ids"].shape[1] :]:
                ids = row.tolist()
                finished = tokenizer.eos_token_id in ids
                if finished:
                    ids = ids[: ids.index(tokenizer.eos_token_id)]
                samples.append(
                    {
                        "problem": index,
                        "prompt": form,
                        "text": tokenizer.decode(ids, skip_special_tokens=True),
                        "num_tokens": len(ids),
                        "finished": finished,  # ended with EOS before max_new_tokens
                    }
                )
        print(f"problem {index}: {time.time() - start:.0f}s", file=sys.stderr, flush=True)
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="/tmp/smol/model", help="checkpoint folder from `trl-mintrl smollm2`")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data/smollm2_samples.json"))
    parser.add_argument("--per-prompt", type=int, default=2, help="samples per problem and prompt form (6 x 2)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    source = Path(args.model) / "trl_mintrl_source.json"
    torch.manual_seed(args.seed)
    start = time.time()
    samples = draw_samples(model, tokenizer, args, start)

    record = {
        "command": "python scripts/smollm2_samples.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "model": json.loads(source.read_text()) if source.is_file() else str(args.model),
        "sampling": {
            "seed": args.seed,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
            "max_new_tokens": args.max_new_tokens,
            "chat_template": "apply_chat_template([user message], add_generation_prompt=True)",
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "seconds": round(time.time() - start),
        "prompts": PROMPTS,
        "problems": [{"question": question, "gold": gold} for question, gold in PROBLEMS],
        "samples": samples,
    }
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(samples)} samples to {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
