"""A judge behind an OpenAI-compatible chat-completions endpoint (`vllm serve`, SGLang, hosted APIs).

Requests go through the `openai` client (the `openai` extra: `pip install -e ".[openai]"`). Each batch gets one
`AsyncOpenAI` whose connections every request of the batch reuses (keep-alive), run on an event loop (`asyncio.run`,
in a helper thread when the caller already runs a loop) so that `review()` and `correct()` stay synchronous for the
trainer. At most `max_concurrency` requests are in flight (a semaphore). Each attempt, connecting, sending and
reading the whole answer, has one deadline, `timeout_s`, so a server that hangs or trickles bytes cannot hold a
request longer than `max_request_seconds`. The client's own retries are off (they would honour a Retry-After of up to
two minutes, count nothing, and stretch the deadline): timeouts, connection errors, 5xx and 429 are retried here with
exponential backoff and jitter, Retry-After honoured up to `max_backoff_s`; other 4xx are not (the request itself is
wrong), nor are answers that arrived but are unusable (malformed, too long, no verdict). An item that still fails
comes back `failed`, never as an exception, and is counted by kind in `failures`; a request that got no answer at
all (`TRANSPORT_FAILURE_KINDS`) is also counted in `transport_status()`, which the trainer watches for a judge that
cannot be reached. `served_models` asks the server, before training, which models it serves. The API key is read
from an environment variable when a batch starts and handed only to that batch's client: it is not stored on the
judge, and any echo of it in an error body is redacted before logging.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .._version import __version__
from .base import Correction, CorrectionRequest, ReviewRequest, TransportStatus, Verdict
from .model_judge import TemplatedJudge
from .parsing import parse_correction, parse_verdict

logger = logging.getLogger(__name__)

_ERROR_BODY_CHARS = 300  # of an error body, in log lines
_READ_CHARS = 4096  # read before redacting, so a key is never cut in two by the truncation
_INSTALL_HINT = 'pip install -e ".[openai]" (or pip install "trl-mintrl[openai]")'

FAILURE_KINDS = (
    "timeout",  # no complete answer within the attempt's deadline
    "connection",  # refused, reset, or closed before the whole body arrived
    "http_429",
    "http_5xx",
    "http_4xx",  # other client errors: not retried
    "malformed_response",  # not JSON, or JSON without a string choices[0].message.content
    "too_long",  # body over `max_response_bytes`, or an answer cut by its token budget (finish_reason "length")
    "unparseable_verdict",  # a review without a valid final `VERDICT:` line
    "unparseable_correction",  # a correction whose `<think>` block never closes
    "unexpected",  # any other exception (a bug, an odd server): logged, never raised
)
# the kinds in which no answer came back: the judge could not be reached (the others are answers that are unusable)
TRANSPORT_FAILURE_KINDS = ("timeout", "connection", "http_429", "http_5xx", "http_4xx", "unexpected")


def require_openai():
    """The `openai` module, or an ImportError naming the extra that installs it (raised before any model loads)."""
    try:
        import openai
    except ImportError as err:
        raise ImportError(
            f"The endpoint judge (judge='endpoint', EndpointJudge) sends its requests with the `openai` client, which "
            f"is not installed: {_INSTALL_HINT}."
        ) from err
    return openai


@dataclass
class _Reply:
    text: str
    finish_reason: str | None


@dataclass
class _Failure:
    kind: str
    reason: str


class _AttemptError(Exception):
    """One failed HTTP attempt: its kind, why, whether another attempt may succeed, and the server's Retry-After."""

    def __init__(self, kind: str, reason: str, retryable: bool, retry_after: float | None = None):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.retryable = retryable
        self.retry_after = retry_after


class EndpointJudge(TemplatedJudge):
    """Reviews and corrects through `POST {base_url}/chat/completions`, with the `openai` client.

    Args:
        base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
        model: the served model name sent in each request.
        api_key_env: environment variable holding the API key (sent as `Authorization: Bearer`); None or unset
            sends no key, as local servers need none.
        timeout_s: deadline of one attempt: connecting, sending and receiving the whole answer.
        max_retries: extra attempts after the first for retryable failures (the `openai` client's own retries are
            off; these are counted by kind in `retries`).
        max_concurrency: most requests in flight at once, and most idle connections kept open for reuse.
        temperature: sampling temperature sent with each request.
        review_template: a preset name ("math", "code") or a custom review template string.
        correction_template: a preset name ("math", "code") or a custom correction template string.
        max_review_tokens: `max_tokens` of a review request; a review cut by it (`finish_reason == "length"`) fails.
        max_correction_tokens: `max_tokens` of a correction request; a correction cut by it fails, and so does one
            that leaves `<think>` open.
        backoff_s: first retry delay; delays double per attempt, times a random factor in [0.5, 1] (jitter), and
            are at least the server's Retry-After.
        max_backoff_s: cap on a retry delay (the server's Retry-After is capped too).
        extra_body: extra JSON fields for every request. The server renders the chat template: to turn a thinking
            template off on vLLM or SGLang, send `{"chat_template_kwargs": {"enable_thinking": False}}` (hosted APIs
            may reject fields they do not know, so nothing is sent by default).
        max_response_bytes: larger successful response bodies fail as `too_long` (a server ignoring `max_tokens`
            must not exhaust the trainer's memory); the body is streamed and dropped at the cap.

    Attributes:
        failures: requests that failed for good, by kind (see `FAILURE_KINDS`), since construction.
        retries: failed attempts that were retried, by kind.
        sent: requests sent since construction (a retried request counts once).

    The continuous rollout keeps up to `concurrent_batches` batches in flight, each from its own thread with its own
    pooled client (so up to that many times `max_concurrency` requests): a slow answer in one batch does not hold
    back the reviews that arrive after it. The counters are updated under a lock.
    """

    concurrent_batches = 4

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 3,
        max_concurrency: int = 16,
        temperature: float = 0.0,
        review_template: str = "math",
        correction_template: str = "math",
        max_review_tokens: int = 1024,
        max_correction_tokens: int = 64,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        extra_body: dict | None = None,
        max_response_bytes: int = 4 << 20,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"`judge_base_url` must start with http:// or https://, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("EndpointJudge needs `model`, the model name the endpoint serves")
        positive_ints = {
            "max_concurrency": max_concurrency,
            "max_review_tokens": max_review_tokens,
            "max_correction_tokens": max_correction_tokens,
            "max_response_bytes": max_response_bytes,
        }
        for name, value in positive_ints.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EndpointJudge `{name}` must be a positive integer, got {value!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"EndpointJudge `max_retries` must be an integer >= 0, got {max_retries!r}")
        for name, value in (("timeout_s", timeout_s), ("backoff_s", backoff_s), ("max_backoff_s", max_backoff_s)):
            if not value > 0:
                raise ValueError(f"EndpointJudge `{name}` must be > 0, got {value!r}")
        if temperature < 0:
            raise ValueError(f"EndpointJudge `temperature` must be >= 0, got {temperature}")
        require_openai()
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        super().__init__(review_template, correction_template, max_review_tokens, max_correction_tokens, temperature)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.max_response_bytes = max_response_bytes
        self.failures: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()
        self.sent = 0
        self._unanswered = 0  # requests that failed with a kind in TRANSPORT_FAILURE_KINDS, since construction
        self._last_transport_error: str | None = None
        self._counters_lock = threading.Lock()  # batches of the continuous rollout finish on their own threads

    def __repr__(self) -> str:
        return (
            f"EndpointJudge(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries}, max_concurrency={self.max_concurrency})"
        )

    @property
    def max_request_seconds(self) -> float:
        """The longest one request can take: every attempt up to its deadline, every backoff at its cap."""
        return (self.max_retries + 1) * self.timeout_s + self.max_retries * self.max_backoff_s

    def transport_status(self) -> TransportStatus:
        with self._counters_lock:
            return TransportStatus(self.sent, self._unanswered, self._last_transport_error)

    def state_dict(self) -> dict:
        return {"failures": dict(self.failures), "retries": dict(self.retries)}

    def load_state_dict(self, state: dict) -> None:
        self.failures = Counter(state.get("failures", {}))
        self.retries = Counter(state.get("retries", {}))

    def review(self, requests: list[ReviewRequest]) -> list[Verdict]:
        prompts = [self.templates.render_review(r) for r in requests]
        replies = self._batch(prompts, self.max_review_tokens)
        outcomes = [_verdict(reply, len(req.steps)) for req, reply in zip(requests, replies, strict=True)]
        self._record("review", outcomes)
        return [Verdict(failed=True) if isinstance(o, _Failure) else o for o in outcomes]

    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]:
        prompts = [self.templates.render_correction(r) for r in requests]
        replies = self._batch(prompts, self.max_correction_tokens)
        outcomes = [_correction(r) for r in replies]
        self._record("correction", outcomes)
        return [Correction(failed=True) if isinstance(o, _Failure) else o for o in outcomes]

    def _record(self, task: str, outcomes: list) -> None:
        """Count the failed requests by kind and log one line per batch."""
        failures = [o for o in outcomes if isinstance(o, _Failure)]
        if not failures:
            return
        by_kind = Counter(f.kind for f in failures)
        unanswered = [f for f in failures if f.kind in TRANSPORT_FAILURE_KINDS]
        with self._counters_lock:
            self.failures.update(by_kind)
            self._unanswered += len(unanswered)
            if unanswered:
                self._last_transport_error = f"{self.url}: {unanswered[0].reason}"
        logger.warning(
            "%d of %d judge %s requests to %s failed (%s); first: %s",
            len(failures),
            len(outcomes),
            task,
            self.url,
            ", ".join(f"{k}: {n}" for k, n in by_kind.most_common()),
            failures[0].reason,
        )

    def _batch(self, prompts: list[str], max_tokens: int) -> list[_Reply | _Failure]:
        """One outcome per prompt, at most `max_concurrency` requests in flight."""
        if not prompts:
            return []
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        results = _run_to_completion(self._send_all(prompts, max_tokens, key))
        with self._counters_lock:
            self.sent += len(prompts)
            for _, retried in results:
                self.retries.update(retried)
        return [outcome for outcome, _ in results]

    async def _send_all(self, prompts: list[str], max_tokens: int, key: str | None) -> list[tuple]:
        """Every prompt's outcome and retried kinds, through one pooled client that is closed before returning."""
        openai = require_openai()
        import httpx2  # the `openai` client's HTTP library

        # The semaphore bounds the requests in flight; a cap on connections too would make a request wait for the
        # connection of an attempt cut off at its deadline to finish closing, and time out in turn.
        pool = httpx2.Limits(max_connections=None, max_keepalive_connections=self.max_concurrency)
        client = openai.AsyncOpenAI(
            api_key=key or "unused",  # without a key the Authorization header is omitted from each request
            base_url=self.base_url,
            max_retries=0,
            timeout=self.timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(limits=pool, timeout=self.timeout_s),
        )
        headers = _headers(openai, key)
        in_flight = asyncio.Semaphore(self.max_concurrency)

        async def send(prompt: str) -> tuple[_Reply | _Failure, list[str]]:
            retried = []  # kinds of the failed attempts that were retried
            async with in_flight:
                try:
                    return await self._request(client, prompt, max_tokens, headers, key, retried), retried
                except _AttemptError as err:
                    return _Failure(err.kind, err.reason), retried
                except Exception as err:  # a bug or an odd server must not take the rollout down
                    return _Failure("unexpected", _redact(f"{type(err).__name__}: {err}", key)), retried

        try:
            return await asyncio.gather(*(send(prompt) for prompt in prompts))
        finally:
            await client.close()

    async def _request(self, client, prompt: str, max_tokens: int, headers: dict, key: str | None, retried: list):
        """One request: attempts until an answer, a failure not worth retrying, or `max_retries` retries."""
        request = dict(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=self.temperature,
            extra_body=self.extra_body or None,
            extra_headers=headers,
        )
        attempt = 0
        while True:
            try:
                return await asyncio.wait_for(self._attempt(client, request, key), self.timeout_s)
            except TimeoutError:
                err = _AttemptError("timeout", f"no complete answer within timeout_s={self.timeout_s}s", True)
            except _AttemptError as attempt_err:
                err = attempt_err
            if not err.retryable or attempt == self.max_retries:
                if attempt:
                    err.reason = f"{err.reason} (after {attempt + 1} attempts)"
                raise err
            delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
            if err.retry_after is not None:
                delay = max(delay, min(err.retry_after, self.max_backoff_s))
            logger.debug("judge request attempt %d failed (%s); retrying in %.2fs", attempt + 1, err.reason, delay)
            retried.append(err.kind)
            await asyncio.sleep(delay)
            attempt += 1

    async def _attempt(self, client, request: dict, key: str | None) -> _Reply:
        """One HTTP attempt, its failures classified by kind and as retryable or not."""
        import httpx2
        import openai

        try:
            async with client.chat.completions.with_streaming_response.create(**request) as response:
                raw = await self._read_body(response)
        except openai.APIStatusError as err:
            detail = _snippet(err.response.content, key)  # read by the client before raising
            kind = "http_429" if err.status_code == 429 else "http_5xx" if err.status_code >= 500 else "http_4xx"
            retry_after = _seconds(err.response.headers.get("Retry-After"))
            raise _AttemptError(kind, f"HTTP {err.status_code}: {detail}", kind != "http_4xx", retry_after) from None
        except (openai.APITimeoutError, httpx2.TimeoutException) as err:
            raise _AttemptError("timeout", f"timed out: {type(err).__name__}", retryable=True) from None
        except (openai.APIConnectionError, httpx2.TransportError) as err:
            reason = _redact(_root_cause(err), key)
            raise _AttemptError("connection", f"connection failed: {reason}", retryable=True) from None
        try:
            choice = json.loads(raw)["choices"][0]
            text = choice["message"].get("content") or ""
            if not isinstance(text, str):
                raise TypeError("content is not a string")
            return _Reply(text, choice.get("finish_reason"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _AttemptError("malformed_response", f"malformed response: {_snippet(raw, key)}", False) from None

    async def _read_body(self, response) -> bytes:
        """The whole body, refusing one over `max_response_bytes` (a body cut short of its Content-Length makes
        the HTTP library raise)."""
        chunks, size = [], 0
        async for chunk in response.iter_bytes():
            size += len(chunk)
            if size > self.max_response_bytes:
                raise _AttemptError("too_long", f"response body over {self.max_response_bytes} bytes", False)
            chunks.append(chunk)
        return b"".join(chunks)


class EndpointUnreachableError(ConnectionError):
    """The server at an endpoint's base URL gave no usable answer to `GET /models`; `status` is the HTTP status
    when it answered with an error, None when it did not answer at all."""

    def __init__(self, reason: str, status: int | None = None):
        super().__init__(reason)
        self.status = status


def served_models(
    base_url: str, api_key_env: str | None = "OPENAI_API_KEY", timeout_s: float = 60.0
) -> list[str] | None:
    """The model names the server at `base_url` lists (`GET {base_url}/models`, one attempt), or None when it does
    not list models (HTTP 404, 405 or 501, an answer that is not a model list, or an empty list). Raises
    `EndpointUnreachableError` when the server cannot be reached (connection refused, timeout) or answers with
    another HTTP error (a refused API key, a server error)."""
    openai = require_openai()
    key = os.environ.get(api_key_env) if api_key_env else None
    url = base_url.rstrip("/") + "/models"
    client = openai.OpenAI(api_key=key or "unused", base_url=base_url, max_retries=0, timeout=timeout_s)
    try:
        page = client.models.list(extra_headers=_headers(openai, key))
        return [model.id for model in page.data] or None
    except openai.APIStatusError as err:
        if err.status_code in (404, 405, 501):
            return None
        detail = _snippet(err.response.content, key)
        raise EndpointUnreachableError(
            f"GET {url} answered HTTP {err.status_code}: {detail}", err.status_code
        ) from None
    except openai.APITimeoutError:
        raise EndpointUnreachableError(f"GET {url} got no answer within {timeout_s}s") from None
    except openai.APIConnectionError as err:
        reason = _redact(_root_cause(err), key)
        raise EndpointUnreachableError(f"GET {url} failed to connect: {reason}") from None
    except (openai.APIResponseValidationError, ValueError, TypeError, AttributeError):
        return None  # an answer, but not an OpenAI model list
    finally:
        client.close()


def _headers(openai, key: str | None) -> dict:
    """Request headers: the package's User-Agent, and none of the environment's OpenAI credentials (organization,
    project) that are not for an arbitrary endpoint; no Authorization header without a key."""
    headers = {"User-Agent": f"trl-mintrl/{__version__}", "OpenAI-Organization": openai.Omit(),
               "OpenAI-Project": openai.Omit()}  # fmt: skip
    if not key:
        headers["Authorization"] = openai.Omit()
    return headers


def _verdict(reply: _Reply | _Failure, num_steps: int) -> Verdict | _Failure:
    """A review reply's verdict, or why it gives none."""
    if isinstance(reply, _Failure):
        return reply
    if reply.finish_reason == "length":
        return _Failure("too_long", "review cut by max_review_tokens (finish_reason=length)")
    verdict = parse_verdict(reply.text, num_steps)
    return (
        _Failure("unparseable_verdict", "no valid final `VERDICT:` line, or a step out of range")
        if verdict.failed
        else verdict
    )


def _correction(reply: _Reply | _Failure) -> Correction | _Failure:
    """A correction reply's text, or why it is unusable (it is then never inserted)."""
    if isinstance(reply, _Failure):
        return reply
    if reply.finish_reason == "length":
        return _Failure("too_long", "correction cut by max_correction_tokens (finish_reason=length)")
    correction = parse_correction(reply.text, truncated=False)
    return _Failure("unparseable_correction", "a `<think>` block left open") if correction.failed else correction


def _run_to_completion(coroutine):
    """Run a batch's coroutine from synchronous code; from inside a running event loop (a notebook, an async
    caller) it runs on a loop of its own in a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _root_cause(err: BaseException) -> str:
    """What actually went wrong under the HTTP library's wrappers: the innermost OS error of the exception chain (e.g.
    `ConnectionRefusedError: [Errno 111] ...` under `APIConnectionError: Connection error.`), else the direct cause."""
    chain = [err]
    while (inner := chain[-1].__cause__ or chain[-1].__context__) is not None and inner not in chain:
        chain.append(inner)
    os_errors = [e for e in chain if isinstance(e, OSError)]
    found = os_errors[-1] if os_errors else err.__cause__ or err
    return f"{type(found).__name__}: {found}"


def _seconds(retry_after: str | None) -> float | None:
    """A Retry-After header in seconds ("2", "1.5"); None for a date or anything else."""
    try:
        return max(0.0, float(retry_after)) if retry_after else None
    except ValueError:
        return None


def _snippet(raw: bytes, key: str | None) -> str:
    """The start of a response body for a log line, with any echo of the key removed before truncating."""
    return _redact(raw[:_READ_CHARS].decode("utf-8", "replace"), key)[:_ERROR_BODY_CHARS]


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, "[REDACTED]") if key else text
