"""A judge behind an OpenAI-compatible chat-completions endpoint (`vllm serve`, SGLang, hosted APIs).

Standard library only (urllib + a thread pool). Each batch sends one request per item, at most `max_concurrency` at a
time. Timeouts, connection errors, 5xx and 429 are retried with exponential backoff and jitter; other 4xx are not
(the request itself is wrong). An item that still fails comes back `failed`, never as an exception. The API key is
read from an environment variable when a batch starts and only ever put into the `Authorization` header: it is not
stored on the judge, and any echo of it in an error body is redacted before logging.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import __version__
from .base import Correction, CorrectionRequest, Judge, ReviewRequest, Verdict
from .parsing import clean_correction, parse_verdict
from .templates import JudgeTemplates

logger = logging.getLogger(__name__)

_ERROR_BODY_CHARS = 300  # of an error body, in log lines
_READ_CHARS = 4096  # read before redacting, so a key is never cut in two by the truncation


@dataclass
class _Reply:
    text: str
    finish_reason: str | None


class _AttemptError(Exception):
    """One failed HTTP attempt: why, whether another attempt may succeed, and the server's Retry-After."""

    def __init__(self, reason: str, retryable: bool, retry_after: float | None = None):
        super().__init__(reason)
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
        timeout_s: socket timeout of one attempt (connect and each read).
        max_retries: extra attempts after the first for retryable failures.
        max_concurrency: most requests in flight at once.
        temperature: sampling temperature sent with each request.
        review_template / correction_template: a preset name ("math", "code") or a custom template string.
        max_review_tokens / max_correction_tokens: `max_tokens` of review and correction requests; a review cut by
            its budget (`finish_reason == "length"`) fails.
        backoff_s / max_backoff_s: first retry delay and its cap; delays double per attempt, times a random factor
            in [0.5, 1] (jitter), and are at least the server's Retry-After (capped too).
        extra_body: extra JSON fields for every request, e.g. `{"chat_template_kwargs": {"enable_thinking": False}}`.
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
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"`judge_base_url` must start with http:// or https://, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("EndpointJudge needs `model`, the model name the endpoint serves")
        positive_ints = {
            "max_concurrency": max_concurrency,
            "max_review_tokens": max_review_tokens,
            "max_correction_tokens": max_correction_tokens,
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

    def __repr__(self) -> str:
        return (
            f"EndpointJudge(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries}, max_concurrency={self.max_concurrency})"
        )

    def review(self, requests: list[ReviewRequest]) -> list[Verdict]:
        prompts = [self.templates.render_review(r) for r in requests]
        replies = self._batch(prompts, self.max_review_tokens, "review")
        verdicts = []
        for req, reply in zip(requests, replies, strict=True):
            if reply is None or reply.finish_reason == "length":
                verdicts.append(Verdict(failed=True))
            else:
                verdicts.append(parse_verdict(reply.text, len(req.steps)))
        return verdicts

    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]:
        prompts = [self.templates.render_correction(r) for r in requests]
        replies = self._batch(prompts, self.max_correction_tokens, "correction")
        return [Correction(failed=True) if r is None else Correction(clean_correction(r.text)) for r in replies]

    def _batch(self, prompts: list[str], max_tokens: int, kind: str) -> list[_Reply | None]:
        """One reply per prompt (None where it failed), at most `max_concurrency` requests in flight."""
        if not prompts:
            return []
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        headers = {"Content-Type": "application/json", "User-Agent": f"trl-mintrl/{__version__}"}
        if key:
            headers["Authorization"] = f"Bearer {key}"

        def call(prompt: str) -> _Reply | str:
            try:
                return self._complete(prompt, max_tokens, headers, key)
            except _AttemptError as err:
                return err.reason
            except Exception as err:  # a bug or an odd server must not take the rollout down
                return _redact(f"{type(err).__name__}: {err}", key)

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            results = list(pool.map(call, prompts))
        failures = [r for r in results if isinstance(r, str)]
        if failures:
            logger.warning(
                "%d of %d judge %s requests to %s failed; first: %s",
                len(failures),
                len(results),
                kind,
                self.url,
                failures[0],
            )
        return [None if isinstance(r, str) else r for r in results]

    def _complete(self, prompt: str, max_tokens: int, headers: dict, key: str | None) -> _Reply:
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
                return self._post(data, headers, key)
            except _AttemptError as err:
                if not err.retryable or attempt == self.max_retries:
                    if attempt:
                        err.reason = f"{err.reason} (after {attempt + 1} attempts)"
                    raise
                delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
                if err.retry_after is not None:
                    delay = max(delay, min(err.retry_after, self.max_backoff_s))
                logger.debug("judge request attempt %d failed (%s); retrying in %.2fs", attempt + 1, err.reason, delay)
                time.sleep(delay)
                attempt += 1

    def _post(self, data: bytes, headers: dict, key: str | None) -> _Reply:
        """One HTTP attempt, its failures classified as retryable or not."""
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = _snippet(err.read(_READ_CHARS), key)
            retry_after = err.headers.get("Retry-After") if err.headers else None
            raise _AttemptError(
                f"HTTP {err.code}: {detail}",
                retryable=err.code >= 500 or err.code == 429,
                retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
            ) from None
        except urllib.error.URLError as err:
            raise _AttemptError(f"connection failed: {err.reason}", retryable=True) from None
        except (TimeoutError, ConnectionError, http.client.HTTPException) as err:
            raise _AttemptError(f"{type(err).__name__}: {err}", retryable=True) from None
        try:
            choice = json.loads(raw)["choices"][0]
            text = choice["message"].get("content") or ""
            return _Reply(text, choice.get("finish_reason"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _AttemptError(
                f"malformed response: {_snippet(raw, key)}",
                retryable=False,
            ) from None


def _snippet(raw: bytes, key: str | None) -> str:
    """The start of a response body for a log line, with any echo of the key removed before truncating."""
    return _redact(raw[:_READ_CHARS].decode("utf-8", "replace"), key)[:_ERROR_BODY_CHARS]


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, "[REDACTED]") if key else text
