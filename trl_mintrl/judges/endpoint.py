"""A judge behind an OpenAI-compatible chat-completions endpoint (`vllm serve`, SGLang, hosted APIs).

Standard library only (urllib + a thread pool). Each batch sends one request per item, at most `max_concurrency` at a
time. Connecting and reading the whole answer share one deadline per attempt, `timeout_s`, so a server that hangs or
trickles bytes cannot hold a request longer than `max_request_seconds`. Timeouts, connection errors,
5xx and 429 are retried with exponential backoff and jitter; other 4xx are not (the request itself is wrong), nor are
answers that arrived but are unusable (malformed, too long, no verdict). An item that still fails comes back
`failed`, never as an exception, and is counted by kind in `failures`. The API key is read from an environment
variable when a batch starts and only ever put into the `Authorization` header: it is not stored on the judge, and
any echo of it in an error body is redacted before logging.
"""

from __future__ import annotations

import functools
import http.client
import io
import json
import logging
import os
import random
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import __version__
from .base import Correction, CorrectionRequest, Judge, ReviewRequest, Verdict
from .parsing import parse_correction, parse_verdict
from .templates import JudgeTemplates

logger = logging.getLogger(__name__)

_ERROR_BODY_CHARS = 300  # of an error body, in log lines
_READ_CHARS = 4096  # read before redacting, so a key is never cut in two by the truncation
_READ_CHUNK = 65536

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


class EndpointJudge(Judge):
    """Reviews and corrects through `POST {base_url}/chat/completions`.

    Args:
        base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
        model: the served model name sent in each request.
        api_key_env: environment variable holding the API key (sent as `Authorization: Bearer`); None or unset
            sends no key, as local servers need none.
        timeout_s: deadline of one attempt: connecting, sending and receiving the whole answer.
        max_retries: extra attempts after the first for retryable failures.
        max_concurrency: most requests in flight at once.
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
        max_response_bytes: larger response bodies fail as `too_long` (a server ignoring `max_tokens` must not
            exhaust the trainer's memory).

    Attributes:
        failures: requests that failed for good, by kind (see `FAILURE_KINDS`), since construction.
        retries: failed attempts that were retried, by kind.
    """

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
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.temperature = temperature
        self.templates = JudgeTemplates(review_template, correction_template)
        self.max_review_tokens = max_review_tokens
        self.max_correction_tokens = max_correction_tokens
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.max_response_bytes = max_response_bytes
        self.failures: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()

    def __repr__(self) -> str:
        return (
            f"EndpointJudge(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries}, max_concurrency={self.max_concurrency})"
        )

    @property
    def max_request_seconds(self) -> float:
        """The longest one request can take: every attempt up to its deadline, every backoff at its cap."""
        return (self.max_retries + 1) * self.timeout_s + self.max_retries * self.max_backoff_s

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
        self.failures.update(by_kind)
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
        headers = {"Content-Type": "application/json", "User-Agent": f"trl-mintrl/{__version__}"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        opener = urllib.request.build_opener(_DeadlineHTTPHandler, _DeadlineHTTPSHandler)  # reads proxy settings now

        def call(prompt: str) -> tuple[_Reply | _Failure, list[str]]:
            retried = []  # kinds of the failed attempts that were retried
            try:
                return self._complete(opener, prompt, max_tokens, headers, key, retried), retried
            except _AttemptError as err:
                return _Failure(err.kind, err.reason), retried
            except Exception as err:  # a bug or an odd server must not take the rollout down
                return _Failure("unexpected", _redact(f"{type(err).__name__}: {err}", key)), retried

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            results = list(pool.map(call, prompts))
        for _, retried in results:
            self.retries.update(retried)
        return [outcome for outcome, _ in results]

    def _complete(self, opener, prompt: str, max_tokens: int, headers: dict, key: str | None, retried: list) -> _Reply:
        body = {
            **self.extra_body,
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": self.temperature,
        }
        data = json.dumps(body).encode()
        attempt = 0
        while True:
            try:
                return self._post(opener, data, headers, key)
            except _AttemptError as err:
                if not err.retryable or attempt == self.max_retries:
                    if attempt:
                        err.reason = f"{err.reason} (after {attempt + 1} attempts)"
                    raise
                delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
                if err.retry_after is not None:
                    delay = max(delay, min(err.retry_after, self.max_backoff_s))
                logger.debug("judge request attempt %d failed (%s); retrying in %.2fs", attempt + 1, err.reason, delay)
                retried.append(err.kind)
                time.sleep(delay)
                attempt += 1

    def _post(self, opener, data: bytes, headers: dict, key: str | None) -> _Reply:
        """One HTTP attempt, its failures classified by kind and as retryable or not."""
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with opener.open(request, timeout=self.timeout_s) as response:
                raw = self._read_body(response)
        except urllib.error.HTTPError as err:
            try:
                detail = _snippet(err.read(_READ_CHARS), key)
            except (OSError, http.client.HTTPException) as read_err:
                detail = f"(body unreadable: {type(read_err).__name__})"
            finally:
                err.close()
            kind = "http_429" if err.code == 429 else "http_5xx" if err.code >= 500 else "http_4xx"
            retry_after = _seconds(err.headers.get("Retry-After")) if err.headers else None
            raise _AttemptError(kind, f"HTTP {err.code}: {detail}", kind != "http_4xx", retry_after) from None
        except urllib.error.URLError as err:
            kind = "timeout" if isinstance(err.reason, TimeoutError) else "connection"
            raise _AttemptError(kind, f"connection failed: {err.reason}", retryable=True) from None
        except TimeoutError as err:
            raise _AttemptError("timeout", f"timed out after {self.timeout_s}s: {err}", retryable=True) from None
        except (OSError, http.client.HTTPException) as err:
            raise _AttemptError("connection", f"{type(err).__name__}: {err}", retryable=True) from None
        try:
            choice = json.loads(raw)["choices"][0]
            text = choice["message"].get("content") or ""
            if not isinstance(text, str):
                raise TypeError("content is not a string")
            return _Reply(text, choice.get("finish_reason"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _AttemptError("malformed_response", f"malformed response: {_snippet(raw, key)}", False) from None

    def _read_body(self, response) -> bytes:
        """The whole body, refusing one over `max_response_bytes` and one cut short of its Content-Length."""
        chunks, size = [], 0
        while chunk := response.read(_READ_CHUNK):
            size += len(chunk)
            if size > self.max_response_bytes:
                raise _AttemptError("too_long", f"response body over {self.max_response_bytes} bytes", False)
            chunks.append(chunk)
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and size < int(declared):
            raise _AttemptError("connection", f"connection closed after {size} of {declared} bytes", True)
        return b"".join(chunks)


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


class _DeadlineReader(io.RawIOBase):
    """Socket reads sharing one deadline: a server that trickles bytes cannot stretch an attempt past it."""

    def __init__(self, sock, deadline: float):
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)  # holds the socket open until the response is closed
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("attempt deadline passed")
        self._sock.settimeout(remaining)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock, *args, deadline: float, **kwargs):
        super().__init__(sock, *args, **kwargs)
        plain = self.fp
        self.fp = io.BufferedReader(_DeadlineReader(sock, deadline))
        plain.close()


class _DeadlineConnection:
    """Mixin for http.client connections: status line, headers and body must all arrive within `timeout` of the
    connection's creation (connect and send are bounded by the same socket timeout)."""

    def __init__(self, *args, timeout: float, **kwargs):
        super().__init__(*args, timeout=timeout, **kwargs)
        self.response_class = functools.partial(_DeadlineResponse, deadline=time.monotonic() + timeout)


class _DeadlineHTTPConnection(_DeadlineConnection, http.client.HTTPConnection):
    pass


class _DeadlineHTTPSConnection(_DeadlineConnection, http.client.HTTPSConnection):
    pass


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_DeadlineHTTPConnection, req, **kwargs)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_DeadlineHTTPSConnection, req, **kwargs)


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
