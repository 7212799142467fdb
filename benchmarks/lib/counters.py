"""What a training step does, counted on the objects that do it: calls of a method and their seconds, the tokens a
model's forward passes and `generate` calls process, what a colocated vLLM engine was asked and did, a MInTRL
trainer's last rollout statistics, and the CPU, page faults and garbage collection of the thread running the step.
The cost studies take a snapshot of each before and after a step; the difference is the step's."""

from __future__ import annotations

import gc
import resource
import threading
import time
import zlib


class CallCounter:
    """Counts calls of a method on one object and the seconds spent in them (model generation, judge review and
    correct calls): the per-step profile of where a method's extra time goes."""

    def __init__(self, obj, name: str):
        self.calls, self.seconds = 0, 0.0
        original = getattr(obj, name)

        def counted(*args, **kwargs):
            self.calls += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(obj, name, counted)


class LastRollout:
    """The per-row rollout statistics (`RolloutBatch`) of a MInTRL trainer's last generation batch, taken from the
    batch record as the trainer scores it (the record itself is cleared after each batch)."""

    def __init__(self, trainer):
        self.rollout = None
        score_batch = trainer._score_batch

        def recording(output, batch):
            self.rollout = batch.rollout
            score_batch(output, batch)

        trainer._score_batch = recording


class TokenCounter:
    """Counts, on one model, the tokens its forward passes process and, per `generate` call, the prompt tokens it was
    given, the prefill tokens the model read of them and the non-padding tokens it generated.

    Prefill is what the model processed, not what `generate` was given: the non-padding positions of the first
    forward pass of each `generate` call. With a kept KV cache (engines/kv_cache.py) `generate` is given a row's whole
    ids and a cache of its prefix, and the model reads only the positions after the cache; counting the prompt given
    (`prompt_tokens`) would count the cached prefix as read again."""

    KEYS = ("forward_tokens", "prefill_tokens", "prompt_tokens", "generated_tokens")

    def __init__(self, model, pad_token_id: int, count_generate: bool = True):
        """`count_generate` False: forward tokens only (on vLLM the model trains and scores, the engine generates,
        and `VLLMCounter` counts its tokens under the same names)."""
        self.forward_tokens = self.prefill_tokens = self.prompt_tokens = self.generated_tokens = 0
        self.keys = self.KEYS if count_generate else self.KEYS[:1]
        self.digest = 0  # crc32 of every sequence `generate` returned since it was last reset: the rollouts' identity
        self._prefill_pending = False  # the next forward pass is a `generate` call's first: its prefill
        model.register_forward_pre_hook(self._count_forward, with_kwargs=True)
        if not count_generate:
            return
        original = model.generate

        def generate(*args, **kwargs):
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            self.prompt_tokens += int(mask.sum()) if mask is not None else input_ids.numel()
            self._prefill_pending = True
            try:
                output = original(*args, **kwargs)
            finally:
                self._prefill_pending = False
            sequences = getattr(output, "sequences", output)
            self.generated_tokens += int((sequences[:, input_ids.shape[1] :] != pad_token_id).sum())
            self.digest = zlib.crc32(sequences.cpu().numpy().tobytes(), self.digest)
            return output

        model.generate = generate

    def _count_forward(self, module, args, kwargs):
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")[..., 0]
        self.forward_tokens += tokens.numel()
        if self._prefill_pending:  # the positions this pass processes, less the padding (the 2D mask's last columns)
            self._prefill_pending = False
            mask = kwargs.get("attention_mask")
            if hasattr(mask, "dim") and mask.dim() == 2 and mask.shape[0] == tokens.shape[0]:  # not a 4D mask
                self.prefill_tokens += int(mask[:, -tokens.shape[1] :].sum())
            else:
                self.prefill_tokens += tokens.numel()

    def snapshot(self) -> dict:
        return {k: getattr(self, k) for k in self.keys}


class VLLMCounter:
    """Counts what one colocated vLLM engine (a `vllm.LLM`) was asked and did, whoever asked it: TRL's GRPO (one
    `LLM.generate` call per generation, one per tool turn of TRL's loop) and MInTRL's policy engine (its continuous
    schedule adds requests to the running engine and steps it; lock-step rounds call `LLM.generate`).

    Per request that finished: its prompt tokens (`prompt_tokens`, what was asked), those vLLM's prefix cache served
    (`cached_prompt_tokens`), the rest, which the engine computed (`prefill_tokens`, as the `transformers` engine's
    prefill counts what the model read), and the tokens it returned (`generated_tokens`). `decoded_tokens`: every
    token the engine sampled, for requests aborted before they finished too (MInTRL's speculative chunks that a
    judge's revision threw away). `requests` added, `engine_steps` (a scheduler iteration and one forward pass of the
    running batch each) and `engine_seconds` in them: all of the engine's work, since `LLM.generate` also runs its
    requests by stepping the engine. The hooks are on the engine object, so every path through it is counted."""

    KEYS = ("requests", "engine_steps", "engine_seconds", "prompt_tokens", "cached_prompt_tokens", "prefill_tokens",
            "generated_tokens", "decoded_tokens")  # fmt: skip

    def __init__(self, llm):
        for key in self.KEYS:
            setattr(self, key, 0)
        engine = llm.llm_engine
        add_request, step, get_output = engine.add_request, engine.step, engine.engine_core.get_output

        def adding(*args, **kwargs):
            self.requests += 1
            return add_request(*args, **kwargs)

        def stepping():
            start = time.perf_counter()
            outputs = step()
            self.engine_seconds += time.perf_counter() - start
            self.engine_steps += 1
            for out in outputs:
                if out.finished:
                    cached = out.num_cached_tokens or 0
                    self.prompt_tokens += len(out.prompt_token_ids)
                    self.cached_prompt_tokens += cached
                    self.prefill_tokens += len(out.prompt_token_ids) - cached
                    self.generated_tokens += sum(len(c.token_ids) for c in out.outputs)
            return outputs

        def output():  # the engine core's outputs of one step: each running request's new tokens
            outputs = get_output()
            self.decoded_tokens += sum(len(o.new_token_ids) for o in outputs.outputs)
            return outputs

        engine.add_request, engine.step, engine.engine_core.get_output = adding, stepping, output

    def snapshot(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}


class GCTimer:
    """Seconds the garbage collector ran, per thread that triggered it (a collection runs in the thread whose
    allocation set it off, and walks every tracked object of the process, whichever trainer owns it)."""

    def __init__(self):
        self.seconds: dict[int, float] = {}
        self.collections: dict[int, int] = {}
        self._start: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        thread = threading.get_ident()
        if phase == "start":
            self._start[thread] = time.perf_counter()
        elif thread in self._start:
            self.seconds[thread] = self.seconds.get(thread, 0.0) + time.perf_counter() - self._start.pop(thread)
            self.collections[thread] = self.collections.get(thread, 0) + 1

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def thread_usage(gc_timer: GCTimer | None = None) -> dict:
    """The calling thread's CPU seconds, the process's (every thread), its page faults and context switches, and
    the garbage collector's seconds in it, so far: a step's difference of two of these is what machine noise moves
    least (CPU time) and what explains a wall-time difference (faults, other threads' CPU, GC)."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    thread = threading.get_ident()
    return {
        "thread_cpu_seconds": time.thread_time(),
        "process_cpu_seconds": time.process_time(),
        "minor_faults": usage.ru_minflt,
        "major_faults": usage.ru_majflt,
        "involuntary_switches": usage.ru_nivcsw,
        "gc_seconds": gc_timer.seconds.get(thread, 0.0) if gc_timer else 0.0,
        "gc_collections": gc_timer.collections.get(thread, 0) if gc_timer else 0,
    }
