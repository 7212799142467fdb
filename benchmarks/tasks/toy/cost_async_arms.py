"""The arms of the asynchronous throughput measurement (`python -m benchmarks.studies.cost_async`) and the rounds that
run them: synchronous and asynchronous MInTRL and TRL's GRPO trainers against one vLLM server of the package's random
tiny model, with the toy's trainer bookkeeping fields, learning rate 0 and the rollout shape and judge of the rollout
measurement (`benchmarks.lib.rollout_cost`). `measure` starts the server, then runs every arm once per round, each a
fresh trainer alone on the machine, in a balanced order."""

from __future__ import annotations

import collections
import contextlib
import gc
import tempfile
import time
from pathlib import Path
from unittest import mock

from benchmarks.lib.rollout_cost import pick_stop_tokens, prompt_text, rollout_judges, rollout_prompts
from benchmarks.lib.server_training import StalenessRecorder, disk_synced
from benchmarks.lib.step_cost import turn_order
from benchmarks.lib.vllm_server import (
    HTTP_TIMEOUT_S,
    Server,
    cmdline,
    cpu_seconds,
    kill_leftovers,
    leftover_children,
    server_counters,
    server_cpu_by_process,
    window_delta,
)

# arm -> (method, synchronous?, settings of the async trainer)
ARMS = {
    "mintrl_sync": ("mintrl", True, {}),
    "mintrl_async": ("mintrl", False, {"max_staleness": 1}),
    "mintrl_async_barrier": ("mintrl", False, {"max_staleness": 1, "rollout_schedule": "barrier"}),
    "mintrl_async_s2": ("mintrl", False, {"max_staleness": 2}),
    # the same without the continuous schedule's speculative next chunks (requested while a chunk is under
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


def build_model(folder: Path, shape: dict) -> dict:
    """The tiny model, its generation config given stop tokens that end a sampled completion after about
    `shape["mean_length"]` tokens (`pick_stop_tokens`, sampled here with transformers: the server reads the
    config when it starts)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from trl_mintrl.engines import TransformersEngine
    from trl_mintrl.tiny import build_tiny_model

    path = build_tiny_model(folder)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = rollout_prompts(tok, shape)
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


def make_dataset(n: int):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": prompt_text(a)}]} for a in range(n)])


def full_length_seconds(server_url: str, model_path: str, shape: dict) -> float:
    """One step's rows generated together to the cap on the server, no stopping (the second of two tries)."""
    from transformers import AutoTokenizer

    from trl_mintrl.engines.vllm_http import VLLMHTTPEngine

    prompts = rollout_prompts(AutoTokenizer.from_pretrained(model_path), shape)
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
    """The rollout measurement's "rule-delayed" judge class (its endpoint judge's local server is closed at once)."""
    with contextlib.ExitStack() as stack:
        return type(rollout_judges(shape, delay_s, stack)["rule-delayed"])


def common_fields(output_dir: str, steps: int, rows: int, shape: dict, seed: int) -> dict:
    from .training import run_fields

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


def run_arm(arm: str, ctx: dict, warmup: int, steps: int, seed: int, position: int) -> dict:
    """One fresh trainer of `arm`, `warmup + steps` optimizer steps; its timings, staleness and logs."""
    import torch
    from transformers import PrinterCallback

    torch.set_num_threads(1)
    total = warmup + steps
    with tempfile.TemporaryDirectory(prefix=f"cost_async_{arm}_") as tmp:
        built_at = time.perf_counter()
        trainer, collator_cls, transfer = build_arm(arm, ctx, total, seed, Path(tmp))
        build_seconds = time.perf_counter() - built_at
        trainer.remove_callback(PrinterCallback)
        recorder = StalenessRecorder(trainer, collator_cls) if collator_cls is not None else None
        timer = _timer(ctx)
        trainer.add_callback(timer)
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
    left = kill_leftovers(ctx["server_pid"])
    return {
        "arm": arm,
        "position": position,
        "seed": seed,
        "build_seconds": build_seconds,
        "first_step_seconds": timer.marks[1]["t"]
        - train_called_at,  # worker (process) start and pipeline fill included
        **_window(timer.marks, warmup, steps),
        **_trained_staleness(recorder, warmup),
        "final_model_version": model_version,
        "logs": timer.log_entries,
        "child_processes": timer.children,
        "leftover_processes_killed": left,
    }


def _timer(ctx: dict):
    """A trainer callback that marks (`_mark`) the start of training and the end of every optimizer step, notes the
    processes running besides the server after the first step (TRL's worker process) and keeps the logged values of
    `LOG_KEYS`."""
    from transformers import TrainerCallback

    server_pid = ctx["server_pid"]

    class Timer(TrainerCallback):
        def __init__(self):
            self.marks, self.log_entries, self.children = [], [], []

        def on_train_begin(self, args, state, control, **kwargs):
            self.marks.append(_mark(ctx, 0))

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(_mark(ctx, state.global_step))
            if state.global_step == 1:  # the processes it runs besides the server (TRL's worker process)
                self.children.extend(f"{p} {cmdline(p)}" for p in sorted(leftover_children(server_pid)))

        def on_log(self, args, state, control, logs=None, **kwargs):
            kept = {k: v for k, v in (logs or {}).items() if k.startswith(LOG_KEYS) and isinstance(v, int | float)}
            self.log_entries.append({"step": state.global_step, **kept})

    return Timer()


def _mark(ctx: dict, step: int) -> dict:
    """The time, this process's and the server's CPU seconds, each server process's, and the server's counters, at
    the end of optimizer step `step`."""
    cpu, server_cpu = cpu_seconds(ctx["server_pid"])
    return {"step": step, "t": time.perf_counter(), "cpu": cpu, "server_cpu": server_cpu,
            "server_processes": server_cpu_by_process(ctx["server_pid"]),
            "server_counters": server_counters(ctx["server_url"])}  # fmt: skip


def _window(marks: list[dict], warmup: int, steps: int) -> dict:
    """The timed window, from the end of optimizer step `warmup` to the end of step `warmup + steps`: its seconds and
    throughput, the trainer's and the server's CPU seconds, and per step each server process's CPU seconds and what
    the server did."""
    start, end = marks[warmup], marks[warmup + steps]
    assert start["step"] == warmup and end["step"] == warmup + steps, (start, end)
    window = end["t"] - start["t"]
    return {
        "window_seconds": window,
        "steps_per_second": steps / window,
        "trainer_cpu_seconds": end["cpu"] - start["cpu"],
        "server_cpu_seconds": end["server_cpu"] - start["server_cpu"],
        # per timed step: each server process's CPU seconds, and what the server did (tokens prefilled, found in
        # its prefix cache, generated; requests finished; preemptions)
        "server_cpu_by_process_per_step": window_delta(start["server_processes"], end["server_processes"], steps),
        "server_counters_per_step": window_delta(start["server_counters"], end["server_counters"], steps),
        "step_seconds": [b["t"] - a["t"] for a, b in zip(marks[:-1], marks[1:], strict=False)],
    }


def _trained_staleness(recorder: StalenessRecorder | None, warmup: int) -> dict:
    """The staleness histogram of the rollouts the timed steps trained, and every step's (None for a synchronous
    arm)."""
    staleness = collections.Counter()
    if recorder is not None:
        for record in recorder.per_step:
            if record["step"] >= warmup:
                staleness.update(record["staleness"])
    return {
        "staleness": {str(k): v for k, v in sorted(staleness.items())} if recorder is not None else None,
        "staleness_per_step": recorder.per_step if recorder is not None else None,
    }


def measure(arms: list[str], rounds: int, warmup: int, steps: int, shape: dict, delay_fraction: float,
            out: Path, log=print, server_processes: str = "multi") -> dict:  # fmt: skip
    """Build the model, start its server, then `rounds` rounds of every arm in a balanced order (`turn_order`), a
    fresh trainer of `warmup + steps` optimizer steps each (`run_arm`); the runs and what every run shared. A failure
    keeps the server's log as `out/cost_async_server.log`."""
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
