"""vLLM behind the engine interface: TRL's colocated engine or TRL's server for training, a standalone engine for
eval and judges.

The multi-round loops (MInTRL chunks and judge calls, SORT plans) send token ids and get token ids back, one
engine call per round for the whole batch, with per-request sampling settings. Each round's prompt is the previous
round's prompt plus the accepted tokens, so vLLM's prefix cache skips the prefill already done.

- `VLLMEngine`: a `vllm.LLM` in this process (TRL's colocate mode, tensor parallelism included, or standalone);
  the hit rate is counted from each request's `num_cached_tokens`.
- `VLLMServerEngine`: TRL's server mode; the main process talks to `vllm serve` through TRL's `VLLMClient`; the
  hit rate comes from the server's Prometheus counters.

Engines shared by a group of processes are `synchronized`: every call is a collective of the group.
vLLM is imported lazily: `check_vllm_mode_supported` and the collective logic work where vLLM is not installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import Generation, GenerationEngine, GenerationStream

VLLM_MODES = ("colocate", "server")


def check_vllm_mode_supported(args) -> None:
    """Refuse, at trainer construction (before the model loads), a vLLM mode TRL does not have.

    Both of TRL's modes work with the multi-round rollouts: `colocate` (tensor parallelism included: the ranks of a
    group join every round) and `server` (the main process sends each round to `vllm serve`, the others join).
    """
    if getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", "colocate") not in VLLM_MODES:
        raise ValueError(f"vllm_mode must be one of {VLLM_MODES}, got {args.vllm_mode!r}.")


def _all_gather(obj, group=None) -> list:
    """`obj` of every rank of `group` (the default group when None), in rank order; `[obj]` without distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def _group_rank(group=None) -> int:
    import torch.distributed as dist

    return dist.get_rank(group=group) if dist.is_available() and dist.is_initialized() else 0


def _broadcast_from_rank0(obj):
    """Rank 0's `obj` on every rank of the default group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def _current_weights(trainer):
    """Make sure the trainer's vLLM engine (colocated or server) holds the current weights, through TRL's own sync.

    TRL syncs weights before calling a `rollout_func`, so inside a rollout this finds them current; called elsewhere
    (a SORT plan after the optimizer step, or after sleep level 2 discarded the weights) it syncs, exactly as TRL's
    own `_generate` would. In server mode the sync is collective (ZeRO-3 gathers, then the main process streams the
    weights over TRL's NCCL communicator); every rank reaches it at the same call.
    """
    vg = trainer.vllm_generation
    stale = trainer.state.global_step != trainer._last_loaded_step
    sleeping = vg.mode == "colocate" and vg.enable_sleep_mode and vg._llm_weights_sleeping
    if stale or sleeping:
        from trl.extras.profiling import profiling_context

        with profiling_context(trainer, "sync_weights"):
            vg.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step
    yield


def _trainer_sampling_defaults(vg) -> dict[str, Any]:
    """The sampling settings TRL's own vLLM calls use."""
    return {
        "temperature": vg.temperature,
        "top_p": vg.top_p,
        "top_k": vg.top_k,
        "min_p": 0.0 if vg.min_p is None else vg.min_p,
        "repetition_penalty": vg.repetition_penalty,
        **vg.generation_kwargs,
    }


def with_temperature(defaults: dict[str, Any], temperature: float | None) -> dict[str, Any]:
    """`defaults` with a per-call temperature; 0 decodes greedily (no top-p/top-k/min-p truncation). The sampling
    settings of every vLLM engine, `VLLMHTTPEngine` (vllm_http.py) included."""
    kwargs = dict(defaults)
    if temperature is not None:
        kwargs["temperature"] = temperature
        if temperature == 0:
            kwargs.update(top_p=1.0, top_k=0, min_p=0.0)
    return kwargs


def server_prefix_cache_counters(session, base_url: str) -> tuple[float, float] | None:
    """(prefix-cache hits, queries) in tokens from a `vllm serve` server's Prometheus counters, summed over its
    engines; None if it does not report them. `session`: anything with a `get(url, timeout=)` (a `requests`
    session, an `httpx2` client)."""
    try:
        response = session.get(f"{base_url}/metrics", timeout=10)
        response.raise_for_status()
    except Exception:
        return None
    totals = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    seen = set()
    for line in response.text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
            seen.add(name)
    if len(seen) < len(totals):
        return None
    return totals["vllm:prefix_cache_hits_total"], totals["vllm:prefix_cache_queries_total"]


def hit_rate_between(before: tuple[float, float], after: tuple[float, float] | None) -> float | None:
    """Share of the prefix-cache queries between two `server_prefix_cache_counters` readings that hit (0 when none
    were made); None when the later reading failed."""
    if after is None:
        return None
    hits, queries = (a - b for a, b in zip(after, before, strict=True))
    return hits / queries if queries > 0 else 0.0


class VLLMEngine(GenerationEngine):
    """Batched token-in/token-out generation with a `vllm.LLM`.

    Args:
        llm: the engine (TRL's colocated `trainer.vllm_generation.llm`, or one built by `from_model_path`).
        eos_token_ids: generation stops at any of them (passed as `stop_token_ids`, like the `transformers` engine).
        sampling_defaults: `SamplingParams` fields used when `generate(temperature=None)`: temperature, top_p, top_k,
            min_p, repetition_penalty and any extra `generation_kwargs`.
        return_logprobs: ask vLLM for the sampled token's log-probability (the policy needs it, a judge does not).
        tp_group: the tensor-parallel process group of a colocated engine with `vllm_tensor_parallel_size > 1`:
            prompts are gathered within it, every rank of the group makes the same `LLM.generate` call, and each
            keeps its own slice, as TRL does. The engine is then `synchronized`: a rank with no prompts left still
            joins each call, and `any_rank` tells the rollout loops whether the group has work left.
    """

    def __init__(
        self,
        llm,
        *,
        eos_token_ids: Sequence[int],
        sampling_defaults: dict[str, Any] | None = None,
        return_logprobs: bool = True,
        tp_group=None,
    ):
        super().__init__(eos_token_ids)
        self.llm = llm
        self.sampling_defaults = dict(sampling_defaults or {"temperature": 1.0})
        self.return_logprobs = return_logprobs
        self.tp_group = tp_group
        self.synchronized = tp_group is not None
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self._trainer = None

    @classmethod
    def from_trainer(cls, trainer) -> VLLMEngine:
        """The colocated engine of a `GRPOTrainer(use_vllm=True)`, sampling like TRL's own vLLM calls."""
        vg = trainer.vllm_generation
        engine = cls(
            vg.llm,
            eos_token_ids=trainer.eos_token_ids,
            sampling_defaults=_trainer_sampling_defaults(vg),
            tp_group=vg.tp_group if vg.tensor_parallel_size > 1 else None,
        )
        engine._trainer = trainer
        return engine

    @classmethod
    def from_model_path(
        cls,
        path: str,
        *,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        return_logprobs: bool = False,
        seed: int = 0,
        **llm_kwargs,
    ) -> VLLMEngine:
        """A standalone engine for `trl-mintrl eval --backend vllm` or an in-process judge model.

        The sampling arguments are the defaults of `generate(temperature=None)`. Inside a training process
        (torch.distributed initialised, as TRL's colocated engine does) it joins the process group with the
        `external_launcher` backend, so it can live next to the policy engine with its own `gpu_memory_utilization`
        share. Extra keyword arguments go to `vllm.LLM`.
        """
        import torch.distributed as dist
        from transformers import AutoTokenizer, GenerationConfig
        from vllm import LLM

        if dist.is_available() and dist.is_initialized():
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        llm = LLM(
            model=path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            enable_prefix_caching=True,
            **llm_kwargs,
        )
        eos = {AutoTokenizer.from_pretrained(path).eos_token_id}
        with contextlib.suppress(OSError):
            configured = GenerationConfig.from_pretrained(path).eos_token_id
            eos.update(configured if isinstance(configured, list) else [configured])
        eos.discard(None)
        defaults = dict(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty
        )
        return cls(llm, eos_token_ids=sorted(eos), sampling_defaults=defaults, return_logprobs=return_logprobs)

    def close(self) -> None:
        """Shut a standalone engine down now: its engine-core process ends and gives its memory back.

        Dropping the last reference is not enough: the `vllm.LLM` of a process's first `from_model_path` stays
        referenced from the frames of vLLM's first import (seen with vLLM 0.31), so its engine core would hold its
        GPU memory share until the process exits, and `trl-mintrl eval --all_checkpoints` would find no room for the
        next checkpoint's engine. An in-process engine core's shutdown also tears down vLLM's process-wide parallel
        state, so a trainer's engine (TRL owns it) is refused.
        """
        if self._trainer is not None:
            raise RuntimeError("VLLMEngine.close() shuts down a standalone engine; a trainer's engine belongs to TRL.")
        self.llm.llm_engine.engine_core.shutdown()

    # ----------------------------------------------------------------------------------------------------------------
    # session: weight sync and sleep mode

    @contextlib.contextmanager
    def _open_session(self):
        """Once per rollout: make sure the engine holds the current weights, wake it, and put it to sleep after."""
        trainer = self._trainer
        if trainer is None:
            yield
            return
        vg = trainer.vllm_generation
        with _current_weights(trainer):
            if not vg.enable_sleep_mode:
                yield
                return
            self.llm.wake_up(tags=["kv_cache"])
            try:
                yield
            finally:
                self.llm.sleep(level=2)
                vg._llm_weights_sleeping = True

    # ----------------------------------------------------------------------------------------------------------------
    # generation

    def any_rank(self, flag: bool) -> bool:
        if self.tp_group is None:
            return flag
        return any(_all_gather(flag, self.tp_group))

    def sampling_params(self, max_tokens: int, temperature: float | None):
        """The `SamplingParams` of one request: defaults, `temperature` override (0 = greedy), this request's cap."""
        from vllm import SamplingParams

        kwargs = with_temperature(self.sampling_defaults, temperature)
        kwargs.update(
            n=1,
            max_tokens=max_tokens,
            logprobs=0 if self.return_logprobs else None,
            stop_token_ids=self.eos_token_ids,
            detokenize=False,
        )
        return SamplingParams(**kwargs)

    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        if self.tp_group is None:
            return self._generate_all(prompt_ids, max_new_tokens, temperature)
        gathered = _all_gather((prompt_ids, max_new_tokens), self.tp_group)
        start = sum(len(p) for p, _ in gathered[: _group_rank(self.tp_group)])
        outputs = self._generate_all(
            [p for ps, _ in gathered for p in ps], [m for _, ms in gathered for m in ms], temperature
        )
        return outputs[start : start + len(prompt_ids)]

    def _generate_all(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        """One `LLM.generate` call for the whole (group's) batch; with tensor parallelism every rank of the group
        makes it with the same prompts, and a batch with nothing to generate makes no call on any rank."""
        from vllm.inputs import TokensPrompt

        # vLLM rejects max_tokens=0: a request with no budget left gets an empty completion without a call.
        todo = [i for i, cap in enumerate(max_new_tokens) if cap > 0]
        results = [Generation([], [] if self.return_logprobs else None) for _ in prompt_ids]
        if todo:
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=prompt_ids[i]) for i in todo],
                [self.sampling_params(max_new_tokens[i], temperature) for i in todo],
                use_tqdm=False,
            )
            for i, out in zip(todo, outputs, strict=True):
                results[i] = self._to_generation(out)
        return results

    def _to_generation(self, request_output) -> Generation:
        self.prompt_tokens += len(request_output.prompt_token_ids)
        self.cached_prompt_tokens += request_output.num_cached_tokens or 0
        completion = request_output.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = None
        if self.return_logprobs:
            logprobs = [float(lp[tok].logprob) for tok, lp in zip(token_ids, completion.logprobs, strict=True)]
        return Generation(token_ids, logprobs)

    # ----------------------------------------------------------------------------------------------------------------
    # continuous batching

    @property
    def supports_streaming(self) -> bool:
        """A single-process engine batches continuously through `LLM.llm_engine` (add_request / step). A
        tensor-parallel group does not: its ranks would have to add the same requests at the same steps, and each
        rank's trajectories advance at their own pace, so it keeps the lock-step rounds (each a collective)."""
        return self.tp_group is None

    def _open_stream(self, wake):
        return _VLLMStream(self, wake)

    # ----------------------------------------------------------------------------------------------------------------
    # prefix-cache statistics

    def prefix_cache_hit_rate(self) -> float:
        """Share of prompt tokens served from vLLM's prefix cache since the last `reset_cache_stats` (0 if none)."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def reset_cache_stats(self) -> None:
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0


class _VLLMStream(GenerationStream):
    """Requests added to the `vllm.LLM`'s engine while it runs, collected as they finish: what `LLM.generate` does
    internally (add every request, then `step()` until none is left), with requests joining between steps. The
    prefix cache serves each trajectory's continuation as in the lock-step rounds. At most the engine's
    `max_num_seqs` requests are admitted at once: the stream orders the rest by priority (`GenerationStream`),
    whatever `scheduling_policy` the engine was built with (TRL's colocated engine uses first come, first served)."""

    def __init__(self, engine: VLLMEngine, wake):
        llm_engine = engine.llm.llm_engine
        super().__init__(engine, wake, capacity=llm_engine.vllm_config.scheduler_config.max_num_seqs)
        self.llm_engine = llm_engine

    def _add(self, request_id, prompt_ids, max_new_tokens, temperature) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = self.engine.sampling_params(max_new_tokens, temperature)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it finishes
        self.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt_ids), params)

    def _step(self) -> list[tuple[str, Generation]]:
        return [(out.request_id, self.engine._to_generation(out)) for out in self.llm_engine.step() if out.finished]

    def _abort(self, request_ids) -> None:
        self.llm_engine.abort_request(request_ids)


class VLLMServerEngine(GenerationEngine):
    """The policy on a vLLM server (`vllm_mode="server"`), through TRL's `VLLMClient`.

    As in TRL's server mode only the main process holds the client: every call gathers all processes' prompts, the
    main process sends them in one round of requests (one per distinct `max_tokens`, sent together so the server
    batches them) and broadcasts the completions, and each process keeps its slice. The engine is therefore
    `synchronized` across all processes: a process with nothing left still joins each call, and `any_rank` tells
    the rollout loops whether any process has work left. Weights reach the server through TRL's own sync (NCCL
    communicator, once per optimizer step); the server's prefix cache serves the continuation of each round.

    It has no `stream()`: every process's trajectories would have to reach the server through the main process
    between collectives, so MInTRL keeps the lock-step rounds here (`rollout_schedule="auto"` picks them). The
    server batches each round's requests continuously on its side.

    Args:
        client: TRL's `VLLMClient` on the main process, None on the others.
        eos_token_ids: generation stops at any of them (`stop_token_ids` of each request).
        sampling_defaults: `VLLMClient.generate` sampling arguments used when `generate(temperature=None)`:
            temperature, top_p, top_k, min_p, repetition_penalty and any extra `generation_kwargs`.
        return_logprobs: ask the server for the sampled token's log-probability.
    """

    synchronized = True
    _CLIENT_ARGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

    def __init__(
        self,
        client,
        *,
        eos_token_ids: Sequence[int],
        sampling_defaults: dict[str, Any] | None = None,
        return_logprobs: bool = True,
    ):
        super().__init__(eos_token_ids)
        self.client = client
        self.sampling_defaults = dict(sampling_defaults or {"temperature": 1.0})
        self.return_logprobs = return_logprobs
        self._trainer = None
        self._cache_counters_at_reset: tuple[float, float] | None = None

    @classmethod
    def from_trainer(cls, trainer) -> VLLMServerEngine:
        """The server of a `GRPOTrainer(use_vllm=True, vllm_mode="server")`, sampling like TRL's own calls."""
        vg = trainer.vllm_generation
        engine = cls(
            getattr(vg, "vllm_client", None),
            eos_token_ids=trainer.eos_token_ids,
            sampling_defaults=_trainer_sampling_defaults(vg),
        )
        engine._trainer = trainer
        return engine

    @property
    def _is_main(self) -> bool:
        return _group_rank() == 0

    def _open_session(self):
        return contextlib.nullcontext() if self._trainer is None else _current_weights(self._trainer)

    def any_rank(self, flag: bool) -> bool:
        return any(_all_gather(flag))

    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        gathered = _all_gather((prompt_ids, max_new_tokens))
        result = None
        if self._is_main:
            try:
                result = self._request(
                    [p for ps, _ in gathered for p in ps], [m for _, ms in gathered for m in ms], temperature
                )
            except Exception as err:  # every process must learn it, or the others wait forever in the broadcast
                result = f"{type(err).__name__}: {err}"
        result = _broadcast_from_rank0(result)
        if isinstance(result, str):
            base_url = getattr(self.client, "base_url", "the vLLM server")
            raise RuntimeError(f"Generation request to {base_url} failed on the main process: {result}")
        start = sum(len(p) for p, _ in gathered[: _group_rank()])
        return result[start : start + len(prompt_ids)]

    def _request(self, prompt_ids: list[list[int]], caps: list[int], temperature: float | None) -> list[Generation]:
        """The whole batch, one request per distinct cap (the completions API takes one `max_tokens`), in flight
        together; a prompt with no budget left gets an empty completion without a request."""
        kwargs = with_temperature(self.sampling_defaults, temperature)
        client_args = {k: kwargs.pop(k) for k in self._CLIENT_ARGS if k in kwargs}
        extra = {**kwargs, "stop_token_ids": self.eos_token_ids}
        by_cap: dict[int, list[int]] = {}
        for i, cap in enumerate(caps):
            if cap > 0:
                by_cap.setdefault(cap, []).append(i)

        def send(cap: int) -> dict:
            return self.client.generate(
                [prompt_ids[i] for i in by_cap[cap]],
                max_tokens=cap,
                logprobs=0 if self.return_logprobs else None,
                generation_kwargs=extra,
                **client_args,
            )

        results = [Generation([], [] if self.return_logprobs else None) for _ in prompt_ids]
        if not by_cap:
            return results
        with ThreadPoolExecutor(max_workers=len(by_cap)) as pool:
            outputs = dict(zip(by_cap, pool.map(send, by_cap), strict=True))
        for cap, rows in by_cap.items():
            out = outputs[cap]
            for j, i in enumerate(rows):
                logprobs = None
                if self.return_logprobs:
                    logprobs = [float(top[0]) for top in out["logprobs"][j]]
                results[i] = Generation(list(out["completion_ids"][j]), logprobs)
        return results

    # ----------------------------------------------------------------------------------------------------------------
    # prefix-cache statistics, from the server's Prometheus counters

    def _cache_counters(self) -> tuple[float, float] | None:
        session = getattr(self.client, "session", None)  # a client without an HTTP session reports no counters
        return None if session is None else server_prefix_cache_counters(session, self.client.base_url)

    def reset_cache_stats(self) -> None:
        if self._is_main:
            self._cache_counters_at_reset = self._cache_counters()

    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens the server found in its prefix cache since `reset_cache_stats` (all its clients
        counted), the same value on every process; None when the server exposes no prefix-cache counters."""
        rate = None
        if self._is_main and self._cache_counters_at_reset is not None:
            rate = hit_rate_between(self._cache_counters_at_reset, self._cache_counters())
        return _broadcast_from_rank0(rate)
