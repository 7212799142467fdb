"""The benchmarks' shared harness (`benchmarks/lib/harness.py`) with trivial jobs: every finished job is recorded at once
with its command, commit and machine; a failing job is recorded as failed and the others go on, inline and in worker
processes; a rerun with `resume` runs only the jobs not yet recorded; the paired statistics and `--replot`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.lib import harness

ran: list[str] = []  # the jobs `square` ran in this process (inline runs)
failing: set[str] = set()  # the jobs `square` raises on


def process_id(job: dict) -> dict:
    """A job whose record is the id of the process that ran it."""
    import os

    return {**job, "pid": os.getpid()}


def square(job: dict) -> dict:
    """A trivial study's job: its record is the job and the square of its seed; raises for a job named in `failing`
    or with `fail` set (which a worker process sees too)."""
    ran.append(job["name"])
    if job["name"] in failing or job.get("fail"):
        raise ValueError(f"job {job['name']} failed on purpose")
    return {**job, "final": {"pass@1": job["seed"] ** 2 / 100}}


def square_or_die(job: dict) -> dict:
    """`square`, but a job with `die` set kills its own process (as the out-of-memory killer would)."""
    import os
    import signal

    if job.get("die"):
        os.kill(os.getpid(), signal.SIGKILL)
    return square(job)


def jobs_of(arms=("a", "b"), seeds=(0, 1, 2)) -> list[dict]:
    return [{"name": f"{arm}-s{seed}", "arm": arm, "seed": seed} for seed in seeds for arm in arms]


def new_results() -> dict:
    return harness.new_results("benchmarks/mine.py", ["--smoke"], {"mode": "smoke"})


def render(results: dict, out: Path, plots: bool = True) -> str:
    text = f"{len(results['runs'])} runs\n"
    (out / "mine.md").write_text(text)
    return text


@pytest.fixture(autouse=True)
def _clean():
    ran.clear()
    failing.clear()


def test_every_record_carries_its_command_commit_machine_and_key(tmp_path):
    seen: list[int] = []

    def on_record(results, collection, record):
        seen.append(len(json.loads((tmp_path / "mine.json").read_text())["runs"]) if seen else 0)

    jobs = jobs_of()
    results = harness.execute(new_results(), tmp_path, "mine.json", jobs, square, render=render, on_record=on_record)
    saved = json.loads((tmp_path / "mine.json").read_text())
    assert saved == results and [r["name"] for r in saved["runs"]] == [j["name"] for j in jobs]  # inline: in order
    assert seen == [0, 1, 2, 3, 4, 5]  # the file was rewritten after every record, before the next job
    for record, job in zip(saved["runs"], jobs, strict=True):
        meta = record["recorded"]
        assert meta["key"] == harness.job_key(job)
        assert meta["command"] == "python benchmarks/mine.py --smoke" and len(meta["commit"]) == 40
        assert {"cpu_model", "logical_cpus", "usable_cpus", "load_1min", "platform", "python"} <= set(meta["machine"])
        assert meta["seconds"] >= 0 and isinstance(meta["dirty"], bool)
        assert harness.record_provenance(record) == {k: saved["provenance"][k] for k in harness.PROVENANCE_KEYS}
    assert (tmp_path / "mine.md").read_text() == "6 runs\n" and "failed" not in saved


def test_a_failing_job_is_recorded_as_failed_and_the_others_run(tmp_path):
    failing.add("b-s1")
    jobs = jobs_of()
    with pytest.raises(harness.JobsFailed, match=r"1 of 6 jobs failed \(b-s1\)"):
        harness.execute(new_results(), tmp_path, "mine.json", jobs, square, render=render)
    assert ran == [j["name"] for j in jobs]  # every job ran after the failure
    saved = json.loads((tmp_path / "mine.json").read_text())
    assert [r["name"] for r in saved["runs"]] == ["a-s0", "b-s0", "a-s1", "a-s2", "b-s2"]
    [failed] = saved["failed"]
    assert failed["job"] == jobs[3] and failed["collection"] == "runs"
    assert failed["error"] == "ValueError: job b-s1 failed on purpose" and "Traceback" in failed["traceback"]
    assert failed["recorded"]["key"] == harness.job_key(jobs[3]) and len(failed["recorded"]["commit"]) == 40
    assert (tmp_path / "mine.md").read_text() == "5 runs\n"  # rendered at the end all the same


def test_resume_runs_only_the_jobs_not_yet_recorded(tmp_path):
    """A sitting ends after some jobs (one of them failed); the rerun with the same job list and `resume` keeps the
    finished records and runs only the failed and the missing jobs."""
    jobs = jobs_of()
    failing.add("a-s1")
    with pytest.raises(harness.JobsFailed):
        harness.execute(new_results(), tmp_path, "mine.json", jobs[:4], square)  # the sitting ended after 4 jobs
    first = json.loads((tmp_path / "mine.json").read_text())
    ran.clear()
    failing.clear()
    kept: list[str] = []
    harness.execute(new_results(), tmp_path, "mine.json", jobs, square, resume=True,
                    on_record=lambda results, collection, record: kept.append(record["name"]))  # fmt: skip
    assert ran == ["a-s1", "a-s2", "b-s2"]
    saved = json.loads((tmp_path / "mine.json").read_text())
    assert sorted(r["name"] for r in saved["runs"]) == sorted(j["name"] for j in jobs) and "failed" not in saved
    assert kept == ["a-s0", "b-s0", "b-s1", "a-s1", "a-s2", "b-s2"]  # the kept records first, then the new ones
    assert saved["runs"][:3] == first["runs"]  # kept as they were recorded
    ran.clear()
    harness.execute(new_results(), tmp_path, "mine.json", jobs, square, resume=True)
    assert ran == []  # nothing left to run
    # a job that differs in any field is another job: its old record is not kept
    changed = [{**job, "steps": 2} if job["name"] == "b-s0" else job for job in jobs]
    harness.execute(new_results(), tmp_path, "mine.json", changed, square, resume=True)
    assert ran == ["b-s0"]
    saved = json.loads((tmp_path / "mine.json").read_text())
    assert [r.get("steps") for r in saved["runs"] if r["name"] == "b-s0"] == [2]


def test_baselines_are_jobs_too(tmp_path):
    jobs = jobs_of(seeds=(0,))
    baseline = (square, {"name": "warm-start", "seed": 5})
    results = harness.execute(new_results(), tmp_path, "mine.json", jobs, square, baselines=[baseline])
    assert [b["name"] for b in results["baselines"]] == ["warm-start"] and len(results["runs"]) == 2
    assert ran == ["warm-start", "a-s0", "b-s0"]  # baselines first
    ran.clear()
    harness.execute(new_results(), tmp_path, "mine.json", jobs, square, baselines=[baseline], resume=True)
    assert ran == []


def test_worker_processes_record_every_job_and_survive_a_failing_one(tmp_path):
    """In spawned worker processes (the function imported there by name) a job that raises is recorded as failed
    and every other job is recorded."""
    jobs = [{**job, "fail": job["name"] == "a-s1"} for job in jobs_of(seeds=(0, 1))]
    with pytest.raises(harness.JobsFailed, match="a-s1"):
        harness.execute(new_results(), tmp_path, "mine.json", jobs, square, workers=2)
    saved = json.loads((tmp_path / "mine.json").read_text())
    assert sorted(r["name"] for r in saved["runs"]) == ["a-s0", "b-s0", "b-s1"]
    assert [f["job"]["name"] for f in saved["failed"]] == ["a-s1"]
    assert "job a-s1 failed on purpose" in saved["failed"][0]["traceback"]
    assert ran == []  # nothing ran in this process


def test_a_job_whose_process_dies_fails_alone(tmp_path):
    """With a process of its own per job, a job whose process is killed (signal 9, as the out-of-memory killer does)
    is recorded as failed, and the job running beside it and those after it are recorded: in a process pool the
    death broke the pool and failed them all (a sitting lost both of its runs and the measure after them)."""
    jobs = [{**job, "die": job["name"] == "a-s0"} for job in jobs_of(seeds=(0, 1))]
    with pytest.raises(harness.JobsFailed, match="1 of 4 jobs failed"):
        harness.execute(new_results(), tmp_path, "mine.json", jobs, square_or_die, workers=2, fresh_process=True)
    saved = json.loads((tmp_path / "mine.json").read_text())
    assert sorted(r["name"] for r in saved["runs"]) == ["a-s1", "b-s0", "b-s1"]
    [failed] = saved["failed"]
    assert failed["job"]["name"] == "a-s0" and "killed by signal 9" in failed["error"]


@pytest.mark.parametrize("fresh_process", [False, True])
def test_fresh_process_runs_each_job_in_a_process_of_its_own(tmp_path, fresh_process):
    """One worker runs every job in the same process, unless `fresh_process` gives each job its own (a run that
    leaves a vLLM engine behind must not share a process with the next)."""
    results = harness.execute(new_results(), tmp_path, "mine.json", jobs_of(arms=("a",)), process_id, workers=1,
                              fresh_process=fresh_process)  # fmt: skip
    pids = {r["pid"] for r in results["runs"]}
    assert len(results["runs"]) == 3 and len(pids) == (3 if fresh_process else 1)


def test_job_keys_follow_the_content_not_the_order_of_fields():
    job = {"name": "a-s0", "seed": 0, "overrides": {"x": 1, "y": [1, 2]}}
    assert harness.job_key(job) == harness.job_key({"overrides": {"y": [1, 2], "x": 1}, "seed": 0, "name": "a-s0"})
    assert harness.job_key(job) != harness.job_key({**job, "seed": 1})
    assert len(harness.job_key(job)) == 16
    records = [{**job, "seed": 1, "final": 0.1}, {**job, "final": 0.2}]
    assert harness.find_record(job, records) is records[1] and harness.find_record({**job, "seed": 2}, records) is None


def test_paired_statistics_select_and_pair_by_seed():
    runs = [
        {"arm": "b", "seed": 1, "final": {"pass@1": 0.5}},
        {"arm": "a", "seed": 1, "final": {"pass@1": 0.2}},
        {"arm": "b", "seed": 0, "final": {"pass@1": 0.4}},
        {"arm": "a", "seed": 0, "final": {"pass@1": 0.1}},
        {"arm": "b", "seed": 2, "final": {"pass@1": 0.9}},  # no seed 2 for a: not paired
    ]
    b = harness.select(runs, arm="b")
    assert [r["seed"] for r in b] == [0, 1, 2] and harness.by_seed(b) == {0: 0.4, 1: 0.5, 2: 0.9}
    diff = harness.versus(b, harness.select(runs, arm="a"))
    assert diff.n == 2 and diff.mean == pytest.approx(0.3) and diff.std == pytest.approx(0.0)
    assert harness.verdict_cell(diff) == "**yes, better**" and harness.verdict_cell(None) == "-"
    assert harness.versus(b, []) is None


def test_step_logs_keep_the_training_steps_chosen_metrics():
    history = [{"step": 1, "reward": 0.5, "loss": 1.0, "other": 3}, {"step": 1, "eval_loss": 2.0},
               {"step": 2, "reward": 0.7}]  # fmt: skip
    assert harness.step_logs(history, ("reward", "loss")) == [
        {"step": 1, "reward": 0.5, "loss": 1.0},
        {"step": 2, "reward": 0.7},
    ]


def test_replot_renders_from_the_json_and_rewrites_the_readme_block(tmp_path):
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser, replot_help="re-render")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"runs": [{"seed": 0}, {"seed": 1}]}))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- s -->\nold\n<!-- e -->\nrest\n")
    args = parser.parse_args(["--replot", str(path), "--readme", str(readme), "--out", str(tmp_path / "out")])
    assert not args.resume and args.workers >= 1
    block = lambda results: f"{len(results['runs'])} runs in the block"  # noqa: E731
    assert harness.replot_from(args, render, block, ("<!-- s -->", "<!-- e -->"))
    assert (tmp_path / "out" / "mine.md").read_text() == "2 runs\n"
    assert readme.read_text() == "intro\n<!-- s -->\n2 runs in the block\n<!-- e -->\nrest\n"
    assert not harness.replot_from(parser.parse_args([]), render)


def test_replot_refuses_a_page_for_a_study_without_a_block(tmp_path):
    """A study whose results file the docs include as it is (learning_real) has no block: `--readme` is refused with
    the fix, before anything is rendered."""
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser, replot_help="re-render")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"runs": []}))
    args = parser.parse_args(["--replot", str(path), "--readme", str(tmp_path / "page.md"), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="run --replot without --readme"):
        harness.replot_from(args, render)
    assert not (tmp_path / "mine.md").exists()
