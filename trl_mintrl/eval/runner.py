"""Sampling and scoring a model on benchmarks, resumable sample by sample.

Each benchmark's samples are scored with the matching reward (`math_reward` for `solution`, `code_reward` for
`tests`) and appended to `OUTPUT/<benchmark>.samples.jsonl` batch by batch, so an interrupted run resumes where it
stopped. `OUTPUT/summary.json` gives pass@k per benchmark. Code counts as correct when all tests pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .passk import summarize


def _json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


_json_object.__name__ = "JSON object"  # argparse names the type in its error: "invalid JSON object value"


@dataclass
class SamplingSettings:
    """How samples are drawn and scored; the first four must stay the same for a folder to be resumed.

    `trl-mintrl eval` makes one flag per field from this class (`cli/eval.py`): a field's metadata holds its help
    and, where the command line spells it differently from the field (`k` as "1,8,32", a dict as JSON), its type.
    """

    model: str = field(
        metadata={"help": "model folder or Hub id; with --all_checkpoints, a training output folder", "type": str}
    )
    temperature: float = field(default=0.6, metadata={"help": "sampling temperature (0: greedy)"})
    top_p: float = field(default=0.95, metadata={"help": "nucleus sampling: keep the tokens of this probability mass"})
    max_new_tokens: int = field(default=4096, metadata={"help": "tokens per sample at most"})
    num_samples: int = field(default=32, metadata={"help": "samples per problem (n)"})
    k: list[int] = field(
        default_factory=lambda: [1, 8, 32],
        metadata={"help": "comma-separated k values, each <= --num_samples", "type": str},
    )
    batch_size: int = field(default=64, metadata={"help": "samples per generation call"})
    chat_template_kwargs: dict = field(
        default_factory=dict,
        metadata={
            "help": "JSON passed to the chat template, e.g. '{\"enable_thinking\": false}' for Qwen3 without thinking",
            "type": _json_object,
        },
    )
    math_timeout: float = field(default=10.0, metadata={"help": "seconds per math answer check"})
    code_timeout: float = field(default=10.0, metadata={"help": "seconds per program run (per test)"})

    def resume_key(self) -> dict:
        return {
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "chat_template_kwargs": self.chat_template_kwargs,
        }


def load_samples(path: Path) -> dict[tuple[int, int], dict]:
    """Finished samples by (problem, sample); a line cut short by an interruption is dropped from the file."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        path.write_bytes(complete)
    records = [json.loads(line) for line in complete.decode().splitlines() if line.strip()]
    return {(r["problem"], r["sample"]): r for r in records}


class Scorer:
    """The reward of each task, created on first use (math starts worker processes, code a sandbox)."""

    def __init__(self, math_timeout: float, code_timeout: float):
        self.timeouts = {"math": math_timeout, "code": code_timeout}
        self._rewards = {}

    def __call__(self, task: str, completions: list[str], rows: list[dict]) -> list[float | None]:
        from ..rewards import REWARDS

        if task not in self._rewards:
            self._rewards[task] = REWARDS[task].scorer(self.timeouts[task])
        column = REWARDS[task].column
        return self._rewards[task](completions, **{column: [row[column] for row in rows]})


def evaluate_benchmark(name, dataset, engine, tokenizer, scorer, output: Path, settings: SamplingSettings):
    """Sample what is missing in `OUTPUT/<name>.samples.jsonl`, score it, append it; return all records."""
    from tqdm.auto import tqdm

    from ..data import dataset_task
    from ..text import prompt_token_ids

    task = dataset_task(dataset)
    path = output / f"{name}.samples.jsonl"
    done = load_samples(path)
    todo = [(p, s) for p in range(len(dataset)) for s in range(settings.num_samples) if (p, s) not in done]
    prompt_ids = {}
    with path.open("a") as sink, tqdm(total=len(todo), desc=name, unit="sample") as bar:
        for start in range(0, len(todo), settings.batch_size):
            batch = todo[start : start + settings.batch_size]
            rows = [dataset[p] for p, _ in batch]
            for (p, _), row in zip(batch, rows):
                if p not in prompt_ids:
                    prompt_ids[p] = prompt_token_ids(tokenizer, row["prompt"], **settings.chat_template_kwargs)
            generations = engine.generate([prompt_ids[p] for p, _ in batch], settings.max_new_tokens, temperature=None)
            texts = [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]
            rewards = scorer(task, texts, rows)
            for (p, s), text, generation, reward in zip(batch, texts, generations, rewards):
                record = {
                    "problem": p,
                    "sample": s,
                    "reward": reward,
                    "correct": None if reward is None else reward == 1.0,
                    "num_tokens": generation.num_tokens,
                    "completion": text,
                }
                done[(p, s)] = record
                sink.write(json.dumps(record) + "\n")
            sink.flush()
            bar.update(len(batch))
    return [done[(p, s)] for p in range(len(dataset)) for s in range(settings.num_samples)]


def build_engine(
    model_path: str,
    settings: SamplingSettings,
    backend: str = "transformers",
    seed: int = 0,
    device: str | None = None,
    vllm_kwargs: dict | None = None,
):
    """(engine, tokenizer) for the chosen backend, sampling with the settings' temperature and top-p.
    `vllm_kwargs` go to `vllm.LLM` (tensor_parallel_size, max_model_len, gpu_memory_utilization, ...)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if backend == "vllm":
        from ..engines.vllm import VLLMEngine

        engine = VLLMEngine.from_model_path(
            model_path, temperature=settings.temperature, top_p=settings.top_p, seed=seed, **(vllm_kwargs or {})
        )
        return engine, tokenizer
    from ..engines import TransformersEngine

    engine = TransformersEngine.from_model_path(
        model_path, tokenizer=tokenizer, device=device, temperature=settings.temperature, top_p=settings.top_p
    )
    return engine, tokenizer


def evaluate(benchmarks: dict, engine, tokenizer, output: Path, settings: SamplingSettings) -> dict[str, dict]:
    """Sample, score and summarize every benchmark; write `summary.json`."""
    scorer = Scorer(settings.math_timeout, settings.code_timeout)
    summaries = {}
    for name, dataset in benchmarks.items():
        records = evaluate_benchmark(name, dataset, engine, tokenizer, scorer, output, settings)
        summaries[name] = summarize(records, settings.k)
    (output / "summary.json").write_text(json.dumps({"run": settings.resume_key(), "benchmarks": summaries}, indent=2))
    return summaries
