"""A `vllm serve` server behind the engine interface, over plain HTTP, for a rollout worker thread.

`VLLMServerEngine` (vllm.py) is TRL's server mode: every call is a collective of the training processes, so it cannot
run in a thread of its own next to training. This engine is the asynchronous trainer's: token ids go out through
`POST /v1/completions` (`return_token_ids`, `logprobs: 0` for each sampled token's log-prob, the EOS ids as
`stop_token_ids`), one request per prompt, sent concurrently from a thread pool through one `httpx2` client (the HTTP library
`huggingface_hub` already brings); the server batches
them continuously. No collective, no process group: only the thread that owns it calls it.

It streams (`GenerationEngine.stream`): a chunk request is sent when the rollout asks for it and collected when its
answer arrives, so MInTRL's continuous rollout runs on it. The served model's name is read per request from a
callable, so a LoRA run can name the adapter version the server holds now.
"""

from __future__ import annotations

import logging
import math
import queue
import random
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2

from .base import Generation, GenerationEngine, GenerationStream
from .vllm import hit_rate_between, server_prefix_cache_counters, with_temperature

logger = logging.getLogger(__name__)

_RETRYABLE = (httpx2.TransportError,)  # refused or dropped connections and timeouts: the request never got an answer


def wait_for_health(
    base_url: str,
    timeout_s: float,
    *,
    process: subprocess.Popen | None = None,
    log_path: Path | None = None,
    hint: str = "",
) -> None:
    """Poll `GET {base_url}/health` once a second until the server answers 200.

    Raises `TimeoutError` after `timeout_s` seconds, or `RuntimeError` as soon as `process` (the server, when the
    caller started it) has exited; both messages end with `hint` and the last 8000 characters of `log_path`. Not TRL's
    `VLLMClient.check_server`: its requests have no timeout, a non-200 answer never ends its wait, and it cannot see
    a server process that died."""

    def failure(what: str) -> str:
        log = log_path.read_text(errors="replace")[-8000:] if log_path is not None and log_path.exists() else ""
        return " ".join(filter(None, [what, hint])) + (f"\n{log_path}:\n{log}" if log else "")

    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(failure(f"The vLLM server for {base_url} exited with {process.returncode}."))
        try:
            if httpx2.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(
                failure(f"The vLLM server at {base_url} did not answer /health within {timeout_s:.0f}s.")
            )
        time.sleep(1.0)


class VLLMHTTPEngine(GenerationEngine):
    """Token-in/token-out generation on a `vllm serve` server through its OpenAI-compatible completions API.

    Args:
        base_url: the server's root, e.g. `http://127.0.0.1:8000` (no `/v1`).
        model: the served model name, or a callable returning it at each request (e.g. the LoRA adapter of the
            current weight version).
        eos_token_ids: generation stops at any of them (sent as `stop_token_ids`).
        sampling_defaults: request fields used when `generate(temperature=None)`: temperature, top_p, top_k, min_p,
            repetition_penalty, and any other sampling field vLLM accepts in the request body.
        return_logprobs: ask for each sampled token's log-probability (the policy needs them, a judge does not).
        request_timeout: seconds one request may take.
        max_retries: retries of a request that could not reach the server (refused connection, timeout).
        max_concurrency: requests in flight at once (the thread pool's size).
        capacity: requests a stream runs at once, the rest waiting on this side by priority
            (`GenerationStream`); the server's `max_num_seqs` (`server_max_num_seqs()`) makes the rollout's
            priorities count. None: `max_concurrency`.
        seed: seeds the per-request sampling seeds (a request without one uses the server's shared RNG).

    `close()` ends it: the pool's threads are joined and later calls raise.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | Callable[[], str],
        eos_token_ids: Sequence[int],
        sampling_defaults: dict[str, Any] | None = None,
        return_logprobs: bool = True,
        request_timeout: float = 600.0,
        max_retries: int = 3,
        max_concurrency: int = 64,
        capacity: int | None = None,
        seed: int | None = None,
    ):
        super().__init__(eos_token_ids)
        self.base_url = base_url.rstrip("/")
        self.completions_url = f"{self.base_url}/v1/completions"
        self.served_model = model if callable(model) else lambda: model
        self.sampling_defaults = dict(sampling_defaults or {"temperature": 1.0})
        self.return_logprobs = return_logprobs
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.capacity = capacity if capacity is not None else max_concurrency
        self.last_response_at = time.monotonic()  # when the server last answered: a rollout worker's heartbeat
        self._seeds = random.Random(seed)
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="mintrl-http")
        # one client for every pool thread (it is thread-safe), a connection per request in flight
        limits = httpx2.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        self._client = httpx2.Client(limits=limits)
        self._cache_counters_at_reset: tuple[float, float] | None = None

    @property
    def supports_streaming(self) -> bool:
        return True

    def close(self) -> None:
        """Fail what waits, join the pool's threads (requests in flight finish first), close the connections."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def check_open(self) -> None:
        """Raise once closed: a caller waiting for answers must not wait for ones that will never come."""
        if self._closed:
            raise RuntimeError(f"VLLMHTTPEngine for {self.base_url} is closed.")

    # ----------------------------------------------------------------------------------------------------------------
    # requests

    def send(self, prompt_ids: list[int], max_new_tokens: int, temperature: float | None) -> Future:
        """One completion request, sent from the pool; the future holds its `Generation` (not yet truncated)."""
        self.check_open()
        return self._pool.submit(self._complete, prompt_ids, max_new_tokens, self.payload_fields(temperature))

    def payload_fields(self, temperature: float | None) -> dict[str, Any]:
        """The request body but for the prompt and its cap: TRL's async worker's fields (`_generate_one_turn`) plus
        the stop ids and any extra sampling defaults."""
        fields = with_temperature(self.sampling_defaults, temperature)
        fields.update(n=1, return_token_ids=True, stop_token_ids=self.eos_token_ids)
        if self.return_logprobs:
            fields["logprobs"] = 0  # the sampled token's log-prob only
        if fields.get("min_p") is None:
            fields.pop("min_p", None)
        return fields

    def _complete(self, prompt_ids: list[int], max_new_tokens: int, fields: dict[str, Any]) -> Generation:
        payload = {
            **fields,
            "model": self.served_model(),
            "prompt": prompt_ids,
            "max_tokens": max_new_tokens,
            "seed": self._seeds.getrandbits(63),
        }
        for attempt in range(self.max_retries + 1):
            try:
                response = self._client.post(self.completions_url, json=payload, timeout=self.request_timeout)
                break
            except _RETRYABLE as err:
                if attempt == self.max_retries or self._closed:
                    raise RuntimeError(
                        f"POST {self.completions_url} failed after {attempt + 1} attempts ({type(err).__name__}: "
                        f"{err}). Check that `vllm serve` is running and reachable at {self.base_url}."
                    ) from err
                time.sleep(min(2**attempt, 8))
        if not response.is_success:
            raise RuntimeError(
                f"POST {self.completions_url} returned {response.status_code}: {response.text[:1000]}"
                f" (model {payload['model']!r})."
            )
        self.last_response_at = time.monotonic()
        return self._parse(response)

    def _parse(self, response: httpx2.Response) -> Generation:
        try:
            choice = response.json()["choices"][0]
            token_ids = choice.get("token_ids")
            logprobs = choice.get("logprobs") if self.return_logprobs else None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
            raise RuntimeError(
                f"POST {self.completions_url} answered {response.text[:300]!r}, not a completions response."
            ) from err
        if token_ids is None:
            raise RuntimeError(
                f"POST {self.completions_url} returned no `token_ids`: the server does not honour "
                "`return_token_ids` (vLLM >= 0.10.2 does)."
            )
        if not self.return_logprobs:
            return Generation(list(token_ids))
        token_logprobs = (logprobs or {}).get("token_logprobs")
        if token_logprobs is None or len(token_logprobs) != len(token_ids):
            raise RuntimeError(
                f"POST {self.completions_url} returned {len(token_ids)} tokens but log-probs {token_logprobs!r}: "
                "a sampled token's log-prob is needed for each."
            )
        # vLLM sends None for a NaN log-prob; keep it NaN, as TRL does
        return Generation(list(token_ids), [math.nan if lp is None else float(lp) for lp in token_logprobs])

    def server_config(self) -> dict | None:
        """The server's resolved `vllm_config` from `/server_info` (a dev-mode route, `VLLM_SERVER_DEV_MODE=1`); None
        when it does not answer it."""
        try:
            response = self._client.get(f"{self.base_url}/server_info", params={"config_format": "json"}, timeout=30)
            response.raise_for_status()
            config = response.json()["vllm_config"]
        except (httpx2.HTTPError, ValueError, KeyError, TypeError):
            return None
        return config if isinstance(config, dict) else None

    def server_max_num_seqs(self) -> int | None:
        """The server's `max_num_seqs`; None when it does not say."""
        try:
            return int(self.server_config()["scheduler_config"]["max_num_seqs"])
        except (TypeError, KeyError, ValueError):
            return None

    def server_logprobs_mode(self) -> str | None:
        """The server's `--logprobs-mode` (`raw_logprobs`, vLLM's default, or `processed_logprobs`, ...); None when
        it does not say."""
        try:
            return str(self.server_config()["model_config"]["logprobs_mode"])
        except (TypeError, KeyError):
            return None

    # ----------------------------------------------------------------------------------------------------------------
    # GenerationEngine

    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        """All requests in flight together; a prompt with no budget gets an empty completion without a request."""
        futures = [self.send(p, cap, temperature) if cap > 0 else None for p, cap in zip(prompt_ids, max_new_tokens)]
        empty = Generation([], [] if self.return_logprobs else None)
        return [empty if future is None else future.result() for future in futures]

    def _open_stream(self, wake: Callable[[], None]) -> GenerationStream:
        return _HTTPStream(self, wake)

    def reset_cache_stats(self) -> None:
        self._cache_counters_at_reset = server_prefix_cache_counters(self._client, self.base_url)

    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens the server found in its prefix cache since `reset_cache_stats` (all its clients
        counted); None when it exposes no prefix-cache counters."""
        if self._cache_counters_at_reset is None:
            return None
        return hit_rate_between(
            self._cache_counters_at_reset, server_prefix_cache_counters(self._client, self.base_url)
        )


class _HTTPStream(GenerationStream):
    """Each admitted request is one HTTP request in the pool; `step()` collects those answered since the last one,
    waiting at most `poll_seconds` for the first, so the owner thread neither spins nor misses its other events
    for long."""

    poll_seconds = 0.02

    def __init__(self, engine: VLLMHTTPEngine, wake: Callable[[], None]):
        super().__init__(engine, wake, capacity=engine.capacity)
        self._answered: queue.SimpleQueue[tuple[str, Future]] = queue.SimpleQueue()
        self._dropped: set[str] = set()  # aborted requests, whose answers are thrown away when they arrive

    def _add(self, request_id, prompt_ids, max_new_tokens, temperature) -> None:
        future = self.engine.send(prompt_ids, max_new_tokens, temperature)
        future.add_done_callback(lambda f: self._answered.put((request_id, f)))

    def _step(self) -> list[tuple[str, Generation]]:
        try:
            answered = [self._answered.get(timeout=self.poll_seconds)]
        except queue.Empty:
            self.engine.check_open()  # a closed engine answers nothing more: fail the rollout instead of waiting
            return []
        while True:
            try:
                answered.append(self._answered.get_nowait())
            except queue.Empty:
                break
        finished = []
        for request_id, future in answered:
            if request_id in self._dropped:
                self._dropped.discard(request_id)
            else:
                finished.append((request_id, future.result()))  # a failed request fails the rollout
        return finished

    def _abort(self, request_ids) -> None:
        """The HTTP requests run to their end on the server; their answers are dropped here."""
        self._dropped.update(request_ids)
