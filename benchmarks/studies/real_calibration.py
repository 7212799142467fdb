"""MInTRL's two preconditions measured on SmolLM2-135M-Instruct before any method runs (docs/mintrl.md), per difficulty.

    python -m benchmarks.studies.real_calibration --model /tmp/smol/model --steps 1 2 3 \\
        --problems 16 --samples 8 --max_new_tokens 96

For each difficulty (`num_steps`), measured by `benchmarks.tasks.real.calibration` on `--problems` calibration problems
(`task.calibration_problems`: fresh draws from the training distribution) with `--samples` samples each at
temperature 1 (top-p 1, no top-k), through the chat template with its default system prompt:

- pass@1 / pass@8 (unbiased) by the package's `trl_mintrl.rewards.math_reward` (the `solution` column is the gold);
  the same by this script's own reader of the last `#### N` (so the numbers do not hang on whether the math reward
  reads `#### N` at the recorded commit: `math_reward_reads_hash` says whether it does), and the share of samples
  that write `####` at all, or any answer line, or hit the token cap;
- the rule judge (`judge.review_chunk`) on each whole sample: the share it keeps whole, and where it flags;
- the NLL under the model of the judge's corrections where the judge would insert them: (a) on the model's own
  samples, cut before the first wrong line at a token boundary (the sampled tokens kept, as the rollout keeps them)
  and the correction tokenised on its own (as the rollout appends it); (b) after the reference's own prefix, one
  reference step at a time; nats per correction and per token;
- the NLL of whole reference solutions (then the end-of-turn token) after the prompt;
- once: the NLL of the handwritten chat answers (`task.CHAT`), the chat model's baseline;
- with `--rollouts N`, after the rest: MInTRL's own rollouts of the first N problems (`calibration.rollout_locality`:
  the package's rollout loop, `mintrl-const`'s judge and settings at `--chunk_size`, every intervened slot reviewed,
  nothing trained), for how local the corrections are: the judge's share of all tokens and of each intervened rollout.

Results go to `--out`.json/.md (default benchmarks/results/real_calibration) after each difficulty, with the command,
commit, machine and timings, and the sampled completions to `--out`.samples.json (`--rescore` scores them again, no
model: the math reward at a later commit); a rerun with the same sizes keeps the difficulties already measured (`--fresh` redoes
them). Each batch's time is printed as it ends, the first with an estimate for the whole run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.lib.provenance import provenance
from benchmarks.tasks.real.calibration import (
    calibrate_difficulty,
    math_reward_reads_hash,
    rollout_locality,
    text_stats,
)
from benchmarks.tasks.real.scoring import chat_nll
from benchmarks.tasks.real.task import FAMILIES, calibration_problems, chat_dataset

ROOT = Path(__file__).resolve().parents[2]  # the repository root

OUT = ROOT / "benchmarks" / "results" / "real_calibration"
# the band MInTRL needs, as thresholds (a reading aid, not a test): sampling rarely finds the answer, and a
# correction is unlikely but not impossible for the model
BAND = {"pass@8_max": 0.5, "correction_nats_max": 10.0, "control_pass@8_min": 0.75}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="/tmp/smol/model", help="prepared SmolLM2 folder (trl-mintrl smollm2)")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--family", choices=list(FAMILIES), default="mixed",
                        help="the problems' family (benchmarks.tasks.real.task): mixed, or chain (MInTRL's own regime)")  # fmt: skip
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--batch_size", type=int, default=32, help="sampled rows per generate call")
    parser.add_argument("--temperature", type=float, default=1.0, help="1.0: TRL's GRPO default")
    parser.add_argument("--top_k", type=int, default=0, help="0: no top-k, TRL's GRPO default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(OUT), help="path without suffix: writes .json and .md")
    parser.add_argument("--fresh", action="store_true", help="redo difficulties already in --out.json")
    parser.add_argument("--rollouts", type=int, default=0,
                        help="also roll out this many problems a difficulty through MInTRL's own loop (0: none)")  # fmt: skip
    parser.add_argument("--chunk_size", type=int, default=48, help="the policy's chunk between reviews in --rollouts")
    parser.add_argument(
        "--rescore", action="store_true", help="only score --out.samples.json again (math reward at this commit)"
    )
    return parser.parse_args(argv)


def rescore(out, argv: list[str]) -> dict:
    """Score the stored samples again (no model): `text_stats` (the math reward at this commit, the judge's rules)."""
    results = json.loads(_path(out, ".json").read_text())
    stored = json.loads(_path(out, ".samples.json").read_text())
    family = results["config"].get("family", "mixed")
    for key, record in results["difficulties"].items():
        problems = calibration_problems(int(key), record["problems"], family=family)
        samples = stored[key]
        if [p.solution for p in problems for _ in range(record["samples_per_problem"])] != samples["solutions"]:
            raise ValueError(f"num_steps={key}: the stored samples are not of this commit's calibration problems")
        stats = text_stats(problems, samples["completions"], samples["capped"], record["samples_per_problem"], family)
        stats["judge"] = {**record.get("judge", {}), **stats["judge"]}  # keep what only the model could measure
        record.update(stats)
    results["math_reward_reads_hash"] = math_reward_reads_hash()
    results["rescored"] = provenance("-m benchmarks.studies.real_calibration", argv)
    write(results, out)
    return results


CONFIG_KEYS = ("problems", "samples", "max_new_tokens", "seed", "model", "temperature", "top_k", "family")


def config_of(args) -> dict:
    return {k: getattr(args, k) for k in CONFIG_KEYS}


def load_previous(path: Path, config: dict, fresh: bool) -> dict:
    if fresh or not path.is_file():
        return {}
    previous = json.loads(path.read_text())
    # the sampler and the family are recorded since; before, they were these
    same = {"temperature": 1.0, "top_k": 0, "family": "mixed", **previous.get("config", {})} == config
    return previous.get("difficulties", {}) if same else {}


def _path(out, suffix: str) -> Path:
    """`--out` with a suffix appended (`--out results/real_calibration.t07` keeps its dots)."""
    return Path(f"{out}{suffix}")


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    if args.rescore:
        return rescore(out, argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    config = config_of(args)
    results = {
        "provenance": provenance("-m benchmarks.studies.real_calibration", argv),
        "config": config,
        "model_source": _model_source(args.model),
        "math_reward_reads_hash": math_reward_reads_hash(),
        "band_thresholds": BAND,
        "difficulties": load_previous(_path(out, ".json"), config, args.fresh),
    }
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    samples_path = _path(out, ".samples.json")
    samples_path.parent.mkdir(parents=True, exist_ok=True)
    stored = json.loads(samples_path.read_text()) if samples_path.is_file() and results["difficulties"] else {}
    for num_steps in args.steps:
        if str(num_steps) in results["difficulties"]:
            print(f"num_steps={num_steps}: kept from {_path(out, '.json')}", flush=True)
            continue
        record, samples = calibrate_difficulty(model, tokenizer, num_steps, args)
        results["difficulties"][str(num_steps)] = record
        stored[str(num_steps)] = samples
        _path(out, ".samples.json").write_text(json.dumps(stored) + "\n")
        results["chat"] = results.get("chat") or chat_nll(model, tokenizer, chat_dataset())
        write(results, out)
        print(table(results), flush=True)
    if "chat" not in results:
        results["chat"] = chat_nll(model, tokenizer, chat_dataset())
    write(results, out)
    if args.rollouts:  # last: building a trainer around the model may change its settings
        roll_out_difficulties(model, tokenizer, args, results, out)
    return results


def roll_out_difficulties(model, tokenizer, args, results: dict, out: Path) -> None:
    """`rollout_locality` on the first `--rollouts` calibration problems of each difficulty, unless its record has
    them at these sizes already."""
    for num_steps in args.steps:
        record = results["difficulties"][str(num_steps)]
        sizes = {
            "problems": args.rollouts,
            "chunk_size": args.chunk_size,
            "max_completion_length": args.max_new_tokens,
        }
        if {k: record.get("rollouts", {}).get(k) for k in sizes} == sizes:
            continue
        problems = calibration_problems(num_steps, args.rollouts, family=args.family)
        print(f"num_steps={num_steps}: MInTRL's rollouts on {args.rollouts} problems", flush=True)
        record["rollouts"] = rollout_locality(model, tokenizer, problems, max_completion_length=args.max_new_tokens,
                                              chunk_size=args.chunk_size, seed=args.seed)  # fmt: skip
        write(results, out)
        print(rollouts_table(results), flush=True)


def _model_source(path: str) -> dict:
    marker = Path(path) / "trl_mintrl_source.json"
    return json.loads(marker.read_text()) if marker.is_file() else {"path": path}


def write(results: dict, out: Path) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    _path(out, ".json").write_text(json.dumps(results, indent=1) + "\n")
    _path(out, ".md").write_text(report(results))


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _nats(block: dict, key: str = "mean_nats") -> str:
    return "-" if not block.get("n") else f"{block[key]:.1f}"


def table(results: dict) -> str:
    """Two markdown tables: what sampling finds, and what the corrections cost the model."""
    found = [
        "| steps | problems x samples | pass@1 / pass@8 math_reward (%) | pass@1 / pass@8 `#### N` reader (%) | "
        "pass@1 / pass@8 last integer (%) | writes `####` (%) | writes a computation (%) | computations true (%) | "
        "capped (%) | judge keeps whole: all / with a computation (%) |",
        "|---" * 10 + "|",
    ]
    cost = [
        "| steps | correction nats, own samples: mean / median (per token, n) | correction nats, reference prefix: "
        "mean / median (per token, n) | reference solution nats (per token) | generate s (tokens/s) | NLL s |",
        "|---" * 6 + "|",
    ]
    for key in sorted(results["difficulties"], key=int):
        d = results["difficulties"][key]
        p, judge = d["pass"], d["judge"]
        found.append(
            f"| {key} | {d['problems']} x {d['samples_per_problem']} | "
            + " | ".join(
                f"{_pct(p[r]['pass@1'])} / {_pct(p[r]['pass@8'])}"
                for r in ("math_reward", "hash_reader", "last_integer")
            )
            + f" | {_pct(d['writes_hash'])} | {_pct(d.get('writes_computation'))} | {_pct(d.get('computations_true'))} | "
            f"{_pct(d['capped'])} | {_pct(judge['kept_whole'])} / {_pct(judge.get('kept_whole_with_computation'))} |"
        )
        own, ref, whole = d["corrections_own_samples"], d["corrections_reference_prefix"], d["reference_solution"]
        t = d["timing"]
        cost.append(
            f"| {key} | {_corrections(own)} | {_corrections(ref)} | {_nats(whole)} ({_nats(whole, 'nats_per_token')}) "
            f"| {t['generate_s']:.0f} ({t['tokens_per_s']:.0f}) | {t['nll_s']:.0f} |"
        )
    flags = [
        f"| {key} | "
        + " | ".join(_pct(d["first_flagged"][place]) for place in ("before", "at", "after", "none"))
        + " |"
        for key, d in sorted(results["difficulties"].items(), key=lambda kv: int(kv[0]))
        if d.get("first_flagged")
    ]
    where = [
        "",
        "Where the rule judge's first flag falls in a sample (chain problems: their one decisive step):",
        "",
        "| steps | before the decisive step (%) | at it (%) | after it (%) | nowhere (%) |",
        "|---|---|---|---|---|",
        *flags,
    ]
    return "\n".join(found) + "\n\n" + "\n".join(cost) + ("\n" + "\n".join(where) if flags else "")


def rollouts_table(results: dict) -> str:
    """MInTRL's own rollouts per difficulty (`rollout_locality`), where measured; empty otherwise."""
    rows = [(key, d["rollouts"]) for key, d in sorted(results["difficulties"].items(), key=lambda kv: int(kv[0]))
            if d.get("rollouts")]  # fmt: skip
    if not rows:
        return ""
    lines = [
        "| steps | problems (rollouts) | chunk | judge tokens: of all / per intervened / per revised rollout (%) | "
        "revised (%) | reviews per intervened | judge tokens per revised | length: controls / intervened | "
        "capped: controls / intervened (%) | reward: controls / intervened (%) | seconds |",
        "|---" * 11 + "|",
    ]
    for key, r in rows:
        lines.append(
            f"| {key} | {r['problems']} ({r['rollouts']}) | {r['chunk_size']} | {_pct(r['judge_share_all'])} / "
            f"{_pct(r['judge_share_per_intervened'])} / {_pct(r['judge_share_per_revised'])} | {_pct(r['revised_share'])} "
            f"| {r['reviews_per_intervened']:.2f} | {r['judge_tokens_per_revised']:.1f} | {r['length_control']:.1f} / "
            f"{r['length_intervened']:.1f} | {_pct(r['capped_control'])} / {_pct(r['capped_intervened'])} | "
            f"{_pct(r['reward_control'])} / {_pct(r['reward_intervened'])} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def _corrections(block: dict) -> str:
    return f"{_nats(block)} / {_nats(block, 'median_nats')} ({_nats(block, 'nats_per_token')}, {block['n']})"


def _command(prov: dict) -> str:
    changed = prov["changed_files_that_matter"]
    return f"`{prov['command']}` at commit `{prov['commit'][:12]}`" + (
        f" (uncommitted changes in the checkout: {', '.join(changed)})" if changed else ""
    )


def report(results: dict) -> str:
    config = {"temperature": 1.0, "top_k": 0, **results["config"]}
    top_k = f"top-k {config['top_k']}" if config["top_k"] else "no top-k"
    chat = results.get("chat")
    lines = [
        "# Real-model calibration: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32: a slightly degraded SmolLM2)",
        "",
        f"Command: {_command(results['provenance'])}.",
        *(
            [f"Scores recomputed from the stored samples: {_command(results['rescored'])}."]
            if "rescored" in results
            else []
        ),
        "",
        f"{config['problems']} problems x {config['samples']} samples per difficulty, temperature "
        f"{config['temperature']:g}, top-p 1, {top_k}, at most "
        f"{config['max_new_tokens']} new tokens, through the chat template (default system prompt). math_reward "
        f"reads `#### N` at the scoring commit: {results['math_reward_reads_hash']}.",
        "",
        table(results),
        "",
        "Computations: `a op b = c` as the rule judge reads them (`benchmarks/tasks/real/judge.py`); true: c is the value. "
        "The judge keeps a sample whole when no line breaks its rules (prose without computations is kept). "
        "Correction nats: the rule judge's correction (the next reference sentence and its newline) under the model, "
        "summed over its tokens: on the model's own samples cut before the first line the judge flags, and after "
        "the reference's own prefix. Reference solution: the whole reference and the end-of-turn token after the "
        "prompt.",
    ]
    rollouts = rollouts_table(results)
    if rollouts:
        lines += ["", "MInTRL's own rollouts (`calibration.rollout_locality`: one group a problem, 4 controls and 4 "
                  "intervened, every intervened slot reviewed, `mintrl-const`'s judge and settings at this chunk, "
                  "nothing trained; every token counted, the policy's and the judge's):", "", rollouts]  # fmt: skip
    if chat:
        lines += ["", f"Chat answers (`task.CHAT`, {chat['answers']} answers, {chat['tokens']} tokens): "
                  f"{chat['nats_per_token']:.3f} nats per token, {chat['mean_nats_per_answer']:.1f} per answer."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
