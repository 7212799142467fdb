"""The harness every learning study runs on: jobs, worker processes, records, resuming, paired statistics, the CLI
flags and the summary block. Task-agnostic: it imports no task and no study; a study hands it its jobs and its own
top-level function that runs one.

A job is a plain JSON-serialisable dict (an arm, a regime, a seed and whatever the study's function reads); its key
(`job_key`) hashes its canonical JSON, so the same job has the same key in every invocation. A study:

    from benchmarks.lib import harness

    def run_one(job: dict) -> dict:  # top-level: a worker process imports it by name
        return {**job, "final": {"pass@1": train_and_score(job["arm"], job["regime"], job["seed"])}}

    jobs = [{"name": f"{arm}-s{seed}", "regime": "easy", "arm": arm, "seed": seed}
            for seed in (0, 1, 2) for arm in ("grpo", "mintrl")]
    results = harness.new_results("-m benchmarks.studies.mine", argv, settings)
    harness.execute(results, out, "mine.json", jobs, run_one, workers=2, render=render, resume=args.resume)
    runs = results["runs"]
    diff = harness.versus(harness.select(runs, arm="mintrl"), harness.select(runs, arm="grpo"))  # paired by seed

`execute` runs the jobs inline (workers 0, in order) or in spawned worker processes and, as each ends, appends the
record its function returned to `results["runs"]` (a baseline's to `results["baselines"]`) with `recorded`: the
job's key, the command, the commit, whether the checkout differed from it, the machine (`provenance.machine`) and
the job's seconds; then it rewrites `out/json_name` and re-renders the tables, so a sitting that ends keeps every
finished run. A job that raises (or whose process dies) goes to `results["failed"]` with its traceback and the others
go on; `execute` raises `JobsFailed` once all have ended. With `resume`, the records of `out/json_name` whose keys are
among this invocation's jobs are kept and those jobs are not run again (failed ones are).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import wait
from pathlib import Path

from benchmarks.lib import readme
from benchmarks.lib.provenance import machine, provenance
from benchmarks.lib.stats import Interval, paired_difference

# set before torch is imported (worker processes inherit them): one thread per process, offline, quiet
ENVIRONMENT = {
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
PROVENANCE_KEYS = ("command", "commit", "dirty", "changed_files_that_matter")


def quiet_environment() -> None:
    """`ENVIRONMENT` in this process, where not already set."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)


# ------------------------------------------------------------------------------------------------------------- jobs


def job_key(job: dict) -> str:
    """16 hex digits of the sha256 of the job's canonical JSON: the same job, the same key, in every invocation."""
    canonical = json.dumps(job, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def as_json(value):
    """`value` as its JSON holds it (string dict keys, lists for tuples), so rendering now and from the file agree."""
    return json.loads(json.dumps(value))


def find_record(job: dict, records: Iterable[dict]) -> dict | None:
    """The first of `records` that holds every field of `job` with the same value: the very job, recorded before (in
    this study's file or another's)."""
    return next((r for r in records if all(r.get(k) == v for k, v in job.items())), None)


def new_results(script: str, argv: list[str], settings: dict, **fields) -> dict:
    """A results dict as the studies write it: the command and commit (`provenance`), the settings, no baselines or
    runs yet; `fields` add to (or, for `runs`, replace) them."""
    return {"provenance": provenance(script, argv), "settings": settings, "baselines": [], "runs": [], **fields}


@dataclass(frozen=True, eq=False)
class Task:
    """One job to run: `function(job)` returns its record, which joins `results[collection]`."""

    function: Callable[[dict], dict]
    job: dict
    collection: str = "runs"

    @property
    def key(self) -> str:
        return job_key(self.job)


@dataclass(frozen=True)
class Outcome:
    """A task's end: its record, or None and the traceback; its seconds and the machine it ended on."""

    task: Task
    record: dict | None
    error: str | None
    seconds: float
    machine: dict


def _attempt(function: Callable[[dict], dict], job: dict) -> tuple[dict | None, str | None, float, dict]:
    """Run one job here (in a worker process or inline): (record, None, ...) or (None, its traceback, ...)."""
    start = time.perf_counter()
    try:
        record, error = function(job), None
    except Exception:
        record, error = None, traceback.format_exc()
    return record, error, time.perf_counter() - start, machine()


def _attempt_into(send, function: Callable[[dict], dict], job: dict) -> None:
    """`_attempt` in a process of its own, its result sent back through `send` (a pipe's end)."""
    send.send(_attempt(function, job))
    send.close()


def run_tasks(tasks: list[Task], workers: int, fresh_process: bool = False) -> Iterator[Outcome]:
    """Run `tasks` inline and in order (`workers` 0), or in `workers` spawned processes; yield each outcome as it
    ends. A task that raises, or whose process dies, yields its traceback and the others go on. `fresh_process`: each
    task in a process of its own (`_isolated`), for jobs that leave behind what their process cannot free (a colocated
    vLLM engine: ~10 GB a SmolLM2 run, so a worker's second run would hold two)."""
    if workers == 0:
        for task in tasks:
            yield Outcome(task, *_attempt(task.function, task.job))
        return
    if fresh_process:
        yield from _isolated(tasks, workers)
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_attempt, task.function, task.job): task for task in tasks}
        for future in as_completed(futures):
            try:
                yield Outcome(futures[future], *future.result())
            except Exception:  # the process died (BrokenProcessPool) or the record could not be sent back
                yield Outcome(futures[future], None, traceback.format_exc(), 0.0, machine())


def _isolated(tasks: list[Task], workers: int) -> Iterator[Outcome]:
    """Each task in a spawned process of its own, at most `workers` at once, in order. A process that dies (the
    kernel's out-of-memory killer, a crash) fails its own task only: in a process pool it breaks the pool, and every
    other task, running or waiting, fails with it."""
    context = get_context("spawn")
    waiting, running = list(tasks), {}
    while waiting or running:
        while waiting and len(running) < workers:
            task = waiting.pop(0)
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_attempt_into, args=(send, task.function, task.job))
            process.start()
            send.close()  # the child holds the only writing end: its death ends the pipe
            running[receive] = (task, process, time.perf_counter())
        for receive in wait(list(running)):
            task, process, began = running.pop(receive)
            try:
                outcome = Outcome(task, *receive.recv())
            except EOFError:  # the process ended without sending its result
                process.join()
                code = process.exitcode
                cause = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                outcome = Outcome(task, None, f"JobProcessDied: the job's process died ({cause}; signal 9: the "
                                  "kernel's out-of-memory killer, or a kill)", time.perf_counter() - began,
                                  machine())  # fmt: skip
            process.join()
            receive.close()
            yield outcome


def free_port() -> int:
    """A TCP port the system just handed out as free: concurrent jobs that each need a port of their own (a server, a
    rendezvous) do not pick the same one, as two that each try a fixed list first can."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------- records


class JobsFailed(RuntimeError):
    """Jobs raised: each is in the results' `failed` list with its traceback; every other job's record was kept."""


def recorded(results: dict, outcome: Outcome) -> dict:
    """What a record carries of its run besides the study's fields: the job's key, the command and commit of this
    invocation (`results["provenance"]`), the machine and the job's seconds."""
    prov = results["provenance"]
    return {
        "key": outcome.task.key,
        **{k: prov[k] for k in PROVENANCE_KEYS if k in prov},
        "machine": outcome.machine,
        "seconds": round(outcome.seconds, 3),
    }


def record_provenance(record: dict) -> dict | None:
    """The command and commit that wrote `record` (the provenance fields of its `recorded`); None for a record
    written before the harness recorded them."""
    meta = record.get("recorded")
    return None if meta is None else {k: meta[k] for k in PROVENANCE_KEYS if k in meta}


def execute(
    results: dict,
    out: Path,
    json_name: str,
    jobs: list[dict],
    run: Callable[[dict], dict],
    *,
    workers: int = 0,
    baselines: Iterable[tuple[Callable[[dict], dict], dict]] = (),
    render: Callable[..., str] | None = None,
    describe: Callable[[dict], str] | None = None,
    on_record: Callable[[dict, str, dict], None] | None = None,
    resume: bool = False,
    fresh_process: bool = False,
    baselines_first: bool = True,
) -> dict:
    """Run the `baselines` (`(function, job)` pairs; first, or after the runs with `baselines_first=False`) and `run`
    on every job (module docstring). After each
    record: `on_record(results, collection, record)` (a study's own bookkeeping; also called for every record kept
    by `resume`), `out/json_name` rewritten, `render(results, out, plots=False)`, and `describe(record)` printed for
    a run; with workers, `fresh_process` runs each job in a process of its own (`run_tasks`). At the end
    `render(results, out)` is printed; `JobsFailed` if any job failed. Returns `results`."""
    measures = [Task(function, job, "baselines") for function, job in baselines]
    runs = [Task(run, job) for job in jobs]
    tasks = measures + runs if baselines_first else runs + measures
    path = out / json_name
    if resume:
        tasks = _resume(results, path, tasks, on_record)
    print(f"{sum(t.collection == 'runs' for t in tasks)} runs on {workers or 1} worker(s) -> {out}", flush=True)
    start, failed = time.perf_counter(), []
    for outcome in run_tasks(tasks, workers, fresh_process):
        line = _keep(results, outcome, on_record, describe, failed)
        results["wall_seconds"] = time.perf_counter() - start
        path.write_text(json.dumps(results, indent=1))
        if render is not None:
            render(results, out, plots=False)
        if line:
            print(line, flush=True)
    if render is not None:
        print(render(results, out))
    print("wrote", out, flush=True)
    if failed:
        names = ", ".join(str(f["job"].get("name", f["recorded"]["key"])) for f in failed)
        raise JobsFailed(f"{len(failed)} of {len(tasks)} jobs failed ({names}); tracebacks under 'failed' in {path}")
    return results


def _keep(results: dict, outcome: Outcome, on_record, describe, failed: list[dict]) -> str | None:
    """Add an outcome to `results`: its record, or a `failed` entry (also appended to `failed`); the line to print."""
    collection = outcome.task.collection
    if outcome.error is not None:
        error = outcome.error.strip().splitlines()[-1]
        entry = {"collection": collection, "job": as_json(outcome.task.job), "error": error,
                 "traceback": outcome.error, "recorded": recorded(results, outcome)}  # fmt: skip
        results.setdefault("failed", []).append(entry)
        failed.append(entry)
        print(outcome.error, file=sys.stderr, flush=True)
        return f"FAILED {outcome.task.job.get('name', entry['recorded']['key'])}: {error}"
    record = {**as_json(outcome.record), "recorded": recorded(results, outcome)}
    results.setdefault(collection, []).append(record)
    if on_record is not None:
        on_record(results, collection, record)
    return describe(record) if describe is not None and collection == "runs" else None


def _resume(results: dict, path: Path, tasks: list[Task], on_record) -> list[Task]:
    """Keep the records of `path` (an earlier invocation of the same study) whose keys are those of `tasks`, in the
    same collection; return the tasks still to run."""
    if not path.is_file():
        return tasks
    previous = json.loads(path.read_text())
    wanted = {(task.collection, task.key) for task in tasks}
    kept: set[tuple[str, str]] = set()
    for collection in dict.fromkeys(task.collection for task in tasks):
        for record in previous.get(collection, []):
            done = (collection, (record.get("recorded") or {}).get("key"))
            if done in wanted and done not in kept:
                kept.add(done)
                results.setdefault(collection, []).append(record)
                if on_record is not None:
                    on_record(results, collection, record)
    print(f"resuming {path}: {len(kept)} finished jobs kept, {len(tasks) - len(kept)} to run", flush=True)
    return [task for task in tasks if (task.collection, task.key) not in kept]


def step_logs(log_history: list[dict], keys: Iterable[str]) -> list[dict]:
    """A trainer's training-step log lines (those with a reward) reduced to `keys`, each with its step."""
    keys = tuple(keys)
    return [{"step": e["step"], **{k: e[k] for k in keys if k in e}} for e in log_history if "reward" in e]


# ------------------------------------------------------------------------------------------------------- statistics


def select(records: Iterable[dict], **fields) -> list[dict]:
    """The records whose `fields` have these values (e.g. `regime="in-band", label="grpo"`), in order of seed."""
    chosen = (r for r in records if all(r.get(k) == v for k, v in fields.items()))
    return sorted(chosen, key=lambda r: r.get("seed", 0))


def by_seed(runs: Iterable[dict], key: str = "pass@1", where: str = "final") -> dict[int, float]:
    """seed -> `run[where][key]` (runs without `where` left out)."""
    return {r["seed"]: r[where][key] for r in runs if where in r}


def versus(runs: list[dict], baseline: list[dict], key: str = "pass@1", where: str = "final") -> Interval | None:
    """`runs` - `baseline` on `key`, paired by seed, with its 95% t-interval (`stats.paired_difference`)."""
    return paired_difference(by_seed(runs, key, where), by_seed(baseline, key, where))


def verdict_cell(diff: Interval | None) -> str:
    """Whether a paired difference's interval resolves it: `-` without an interval, `no`, or `**yes, better**` /
    `**yes, worse**` (a table cell)."""
    if diff is None or diff.low is None:
        return "-"
    if not diff.resolved:
        return "no"
    return "**yes, better**" if diff.mean > 0 else "**yes, worse**"


# ------------------------------------------------------------------------- CLI, the report and the summary block


def per_run_lines(results: dict, runs_of: Callable[[dict, str, str], list[dict]], digits: int = 1) -> list[str]:
    """One line per (regime, arm) of the plan that has runs: each seed's final pass@1 in %."""
    lines = []
    for regime, arms in results["settings"]["plan"].items():
        for arm in arms:
            runs = runs_of(results, regime, arm)
            if runs:
                values = " / ".join(f"{100 * r['final']['pass@1']:.{digits}f}" for r in runs)
                lines.append(f"- {regime} {arm} (seeds {[r['seed'] for r in runs]}): {values}")
    return lines


def plot_curves(
    results: dict, path: Path, title: str, curves_of: Callable[[str, str], list[dict[int, float]]]
) -> Path:
    """Held-out pass@1 (%) of the curve set against the optimizer step, one panel per regime of the plan with runs
    and one line per arm: at each step the mean over the arm's runs that measured it (`curves_of(regime, arm)`: step -> pass@1 per
    run). Saved at `path`."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = results["settings"]["plan"]
    regimes = [regime for regime, arms in plan.items() if any(curves_of(regime, arm) for arm in arms)] or list(plan)
    fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 3.6), squeeze=False)
    for ax, regime in zip(axes[0], regimes, strict=True):
        for arm in plan[regime]:
            curves = curves_of(regime, arm)
            if not curves:
                continue
            steps = sorted({step for curve in curves for step in curve})
            means = [100 * statistics.fmean(c[k] for c in curves if k in c) for k in steps]
            ax.plot(steps, means, marker="o", label=arm)
        ax.set_title(f"{title}, {regime}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("held-out pass@1 (%), curve set")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def study_parser(doc: str, modes: dict[str, str], replot_help: str) -> argparse.ArgumentParser:
    """A study's command line: its docstring as the description, a flag per mode besides "full" (`modes`: name ->
    help, the first given wins: `mode_of`), then `add_arguments`; the study adds its own flags."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for mode, help_text in modes.items():
        parser.add_argument(f"--{mode}", action="store_true", help=help_text)
    add_arguments(parser, replot_help)
    return parser


def mode_of(args: argparse.Namespace, modes: Iterable[str]) -> str:
    """The first of `modes` whose flag is set, else "full"."""
    return next((mode for mode in modes if getattr(args, mode)), "full")


def write_report(results: dict, out: Path, file_name: str, report, plot=None, plots: bool = True) -> str:
    """A study's `render`: `report(results)` written to `out/file_name`, and `plot(results, out)` with `plots`;
    returns the report's text."""
    text = report(results)
    (out / file_name).write_text(text)
    if plots and plot is not None:
        plot(results, out)
    return text


def write_results(results: dict, out: Path, json_name: str, render: Callable[..., str]) -> str:
    """The end of a study's run: `results` written to `out/json_name`, then `render(results, out)` (its report beside
    the JSON) printed; returns the report's text."""
    (out / json_name).write_text(json.dumps(results, indent=1))
    text = render(results, out)
    print(text)
    return text


def add_arguments(parser: argparse.ArgumentParser, replot_help: str) -> None:
    """The flags every study takes: --workers, --out, --resume, --replot (`replot_help`) and --readme."""
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="parallel runs (0: inline)")
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (with --replot: default the JSON's folder)"
    )
    add_resume_argument(parser)
    parser.add_argument("--replot", type=Path, default=None, help=replot_help)
    parser.add_argument(
        "--readme", type=Path, default=None, help="with --replot: rewrite its block in this page (docs/benchmarks.md)"
    )


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the finished runs of the output folder's JSON (the same jobs) and run only the others",
    )


def replot_from(args: argparse.Namespace, render: Callable[..., str], block=None, markers=None, load=None) -> bool:
    """`--replot JSON [--out DIR] [--readme docs/benchmarks.md]` (`readme.replot`): re-render the study's tables and
    plots from the JSON and rewrite the page's summary block between `markers` with `block(results)`. False when not
    asked."""
    if args.replot is None:
        return False
    readme_page = getattr(args, "readme", None)  # a study without --readme has no block to write
    if readme_page is not None and block is None:
        raise SystemExit(
            "--readme: this study writes no block into a page (docs/benchmarks.md includes its results file as it "
            "is); run --replot without --readme"
        )
    start, end = markers if markers is not None else (None, None)
    readme.replot(args.replot, args.out, render, readme_page, start, end, block, load)
    return True
