"""Benchmark jobs that each build a colocated vLLM engine run side by side (`benchmarks/studies/learning_real.py --workers 2`):
each engine's rendezvous gets a port of its own (`benchmarks.tasks.real.arms.prepare_vllm_cpu`). TRL picks 29500 first
when it is free, so two jobs that both chose before either bound took the same port and one failed (EADDRINUSE)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from conftest import run_process_group  # tests/conftest.py

REPO = Path(__file__).resolve().parents[2]

# Two spawned jobs do what a learning_real job does before its engine binds: `prepare_vllm_cpu`, then TRL's choice of
# the rendezvous port; both choose before either binds (the barrier), then each binds its port as vLLM's
# `init_process_group` does.
JOBS = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    sys.path.insert(0, {repo!r})

    def job(barrier, ports):
        from benchmarks.tasks.real.arms import prepare_vllm_cpu
        from torch.distributed import TCPStore
        from trl.trainer.utils import ensure_master_addr_port

        prepare_vllm_cpu()
        ensure_master_addr_port()
        port = int(os.environ["MASTER_PORT"])
        barrier.wait(timeout=120)
        store = TCPStore("127.0.0.1", port, world_size=1, is_master=True, wait_for_workers=False)
        ports.put(port)
        barrier.wait(timeout=120)
        del store

    if __name__ == "__main__":
        os.environ.pop("MASTER_PORT", None)
        context = multiprocessing.get_context("spawn")
        barrier, ports = context.Barrier(2), context.Queue()
        jobs = [context.Process(target=job, args=(barrier, ports)) for _ in range(2)]
        for process in jobs:
            process.start()
        for process in jobs:
            process.join(timeout=240)
        codes = [process.exitcode for process in jobs]
        print(json.dumps({{"exit_codes": codes, "ports": [ports.get(timeout=5) for code in codes if code == 0]}}))
    """
)


def test_two_jobs_starting_together_give_their_engines_different_ports(tmp_path):
    script = tmp_path / "two_jobs.py"
    script.write_text(JOBS.format(repo=str(REPO)))
    done = run_process_group([sys.executable, str(script)], timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["exit_codes"] == [0, 0], done.stderr[-3000:]  # a job whose port was taken fails to bind it
    assert len(set(outcome["ports"])) == 2, outcome
