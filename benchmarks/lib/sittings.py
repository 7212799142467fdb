"""Studies too long for one sitting: `--max_runs N` runs at most N of the runs not yet recorded, then stops, and
`--resume` keeps every record of the results file, those of jobs this sitting does not run included (other arms, runs
of a later sitting), which the harness alone would drop when it rewrites the file."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from benchmarks.lib import harness


def sitting_parser(doc: str, modes: dict[str, str], arms, engines, arms_help: str) -> argparse.ArgumentParser:
    """A study of sittings' command line: its modes and --replot (`harness.study_parser`), one worker unless told,
    --engine (one of `engines`; the study picks the default), --arms (of `arms`) and --max_runs."""
    parser = harness.study_parser(doc, modes, replot_help="re-render the tables from a JSON")
    parser.set_defaults(workers=1)
    parser.add_argument("--engine", choices=list(engines), default=None,
                        help="the rollout engine (default: vllm, transformers for --smoke)")  # fmt: skip
    parser.add_argument("--arms", nargs="+", choices=arms, default=None, help=arms_help)
    add_max_runs_argument(parser)
    return parser


def sitting_output(out: Path | None, mode: str, results: Path) -> Path:
    """Where a sitting writes (created): `out` when given, else `results` for the full mode, `results/quick` for the
    others."""
    out = out or (results if mode == "full" else results / "quick")
    out.mkdir(parents=True, exist_ok=True)
    return out


def add_max_runs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max_runs", type=int, default=None,
                        help="run at most this many of the runs not yet recorded, then stop (size a sitting)")  # fmt: skip


def previous_records(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def this_sitting(jobs: list[dict], previous: dict, max_runs: int | None) -> list[dict]:
    """The jobs of this invocation: those already recorded in the file (kept by `--resume`) and, of the others, at
    most `max_runs` in plan order."""
    if max_runs is None:
        return jobs
    done = {(r.get("recorded") or {}).get("key") for r in previous.get("runs", [])}
    todo = [job for job in jobs if harness.job_key(job) not in done][:max_runs]
    return [job for job in jobs if harness.job_key(job) in done or job in todo]


def keep_other_records(results: dict, previous: dict, tasks: list[dict]) -> None:
    """With `--resume`, the file's records of jobs this invocation does not run (other arms, runs of a later sitting)
    stay in it: the harness keeps only its own jobs' records, and rewrites the file. A record `results` already holds
    (one the study took from another study's file) is not added twice."""
    keys = {harness.job_key(job) for job in tasks}
    for collection in ("baselines", "runs"):
        held = {(record.get("recorded") or {}).get("key") for record in results[collection]}
        for record in previous.get(collection, []):
            if (key := (record.get("recorded") or {}).get("key")) not in keys and key not in held:
                results[collection].append(record)


def execute_sitting(
    results: dict,
    out: Path,
    name: str,
    args: argparse.Namespace,
    *,
    baselines: list[dict],
    jobs: list[dict],
    measure: Callable[[dict], dict],
    run: Callable[[dict], dict],
    describe: Callable[[dict], str],
    render: Callable[..., str],
) -> dict:
    """`harness.execute` for one sitting (`args`: the study's `--resume`, `--max_runs` and `--workers`), each job in
    a fresh process: `run` on this sitting's `jobs` (plan order), then `measure` on the `baselines` jobs not yet
    recorded. Runs first: a sitting is sized by its runs, and a measure its end cuts off is taken by the next one."""
    previous = previous_records(out / name) if args.resume else {}
    jobs = this_sitting(jobs, previous, args.max_runs)
    keep_other_records(results, previous, baselines + jobs)
    return harness.execute(results, out, name, jobs, run, workers=args.workers, render=render, describe=describe,
                           baselines=[(measure, job) for job in baselines], resume=args.resume,
                           fresh_process=True, baselines_first=False)  # fmt: skip
