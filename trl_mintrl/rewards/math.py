"""Math answer reward: the final answer checked with `math-verify`, with a hard time bound in any thread.

`math-verify` bounds its own work with `signal.alarm`, which only works in a main thread, so TRL's
`accuracy_reward` turns timeouts off elsewhere and one pathological answer (say `\\boxed{9^{9^{9^{9}}}}`) can
stall training forever. Here every check runs in a pool of worker processes (see `_serve`):

- inside a worker (its main thread) a timer interrupts a check that runs past `timeout` seconds: reward 0;
- the caller waits at most `timeout + 1` seconds for the answer; a worker stuck where signals cannot reach it
  (long C code) is killed and replaced. The caller can be any thread.

What counts as the final answer, in this order (completions and gold answers alike): the last `\\boxed{}`; else GSM8K's
answer line `#### N` (`gsm8k_answer`); else an answer line ("The final answer is 12", "The answer is: 316.",
"Answer: $3$").

Workers parse each distinct gold answer once (GRPO repeats it for every completion of a prompt) and exit when
their stdin closes, so they never outlive the trainer.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from ..text import content_text, last_boxed

_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")  # a word that is not a LaTeX command
# GSM8K's answer line: "#### " then the number, alone on its line but for a "$" before it, a unit word or a full stop
# after it ("#### 1,234", "#### $16", "#### 16 apples.", "#### -2.5", "#### 3/4").
_GSM8K_LINE = re.compile(
    r"####[^\S\n]*\$?[^\S\n]*(?P<number>-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+|/\d+)?)"
    r"[^\S\n]*(?:[a-zA-Z%][a-zA-Z% ]*)?\.?[^\S\n]*(?:\n|$)"
)
_WORKER = "from trl_mintrl.rewards.math import _serve; _serve()"


def gsm8k_answer(text: str) -> str | None:
    """The number of the first GSM8K answer line (`#### 16`, commas dropped: "1,234" -> "1234"), or None.

    GSM8K ends each worked solution with `#### <answer>`, and what follows the marker is the final answer. Only the
    first such line counts: a model that keeps writing after its answer ("#### 308\\n#### 12 + 28 = 30 = total")
    has answered 308. A `####` line that is not a number (a Markdown heading such as `#### Step 1` or `#### 1. Add
    the costs`, or an expression) is not an answer line and is skipped.
    """
    match = _GSM8K_LINE.search(text)
    return None if match is None else match.group("number").replace(",", "")


_ANSWER_PHRASE = re.compile(r"\banswer(?:\s+is\b|\s*:)", re.IGNORECASE)  # "The answer is 12", "Answer: 12"


def writes_final_answer(text: str) -> bool:
    """Whether `text` holds a final answer in a form `math_reward` reads: a `\\boxed{}`, a GSM8K `#### N` line or an
    answer phrase ("the answer is", "Answer:"). A judge correction that does is what makes the policy's tail after it
    free: the reward is already decided."""
    return last_boxed(text) is not None or gsm8k_answer(text) is not None or bool(_ANSWER_PHRASE.search(text))


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion: the string itself, or the content of the last message of a conversation."""
    if isinstance(completion, str):
        return completion
    return content_text(completion[-1].get("content")) if completion else ""


class MathVerifier:
    """Scores completions against gold answers with `math-verify`, in `num_workers` worker processes.

    Args:
        timeout: seconds allowed per completion (gold parse + answer parse + comparison).
        num_workers: worker processes (each imports sympy: about 150 MB).
        startup_timeout: seconds a worker may take to start (importing sympy is slow on a busy machine).
    """

    def __init__(self, timeout: float = 10.0, num_workers: int = 2, startup_timeout: float = 120.0):
        if timeout <= 0:
            raise ValueError(f"MathVerifier(timeout=...) must be > 0 seconds, got {timeout!r}")
        if num_workers < 1:
            raise ValueError(f"MathVerifier(num_workers=...) must be >= 1, got {num_workers!r}")
        self.timeout = float(timeout)
        self.num_workers = num_workers
        self.startup_timeout = startup_timeout
        self._idle: queue.Queue[_Worker] | None = None
        self._lock = threading.Lock()

    def score(self, golds: list[str], completions: list[str]) -> list[float | None]:
        """1.0 if the completion's final answer equals the gold answer, 0.0 if not (or on timeout), None if the
        gold answer does not parse or its parsing raises (the row carries no signal)."""
        if len(golds) != len(completions):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers (`solution`)")
        idle = self._workers()
        with ThreadPoolExecutor(max_workers=self.num_workers) as pool:
            return list(pool.map(lambda pair: self._score_one(idle, *pair), zip(golds, completions)))

    def _score_one(self, idle: queue.Queue, gold: str, text: str) -> float | None:
        worker = idle.get()
        try:
            reply = worker.ask({"gold": gold, "text": text, "timeout": self.timeout}, self.timeout + 1.0)
            if reply is None:  # stuck or dead: replace it, score 0
                worker.kill()
                worker = _Worker(self.startup_timeout)
                return 0.0
            return reply["reward"]
        finally:
            idle.put(worker)

    def _workers(self) -> queue.Queue:
        with self._lock:
            if self._idle is None:
                workers = [_Worker(self.startup_timeout, wait=False) for _ in range(self.num_workers)]
                idle = queue.Queue()
                for worker in workers:
                    worker.wait_ready()
                    idle.put(worker)
                self._idle = idle
                atexit.register(self.close)
            return self._idle

    def worker_pids(self) -> list[int]:
        """Process ids of the idle workers (for monitoring and tests)."""
        idle = self._workers()
        return [worker.proc.pid for worker in list(idle.queue)]

    def close(self) -> None:
        """Stop the workers (they also stop by themselves when this process exits)."""
        with self._lock:
            idle, self._idle = self._idle, None
        while idle is not None and not idle.empty():
            idle.get().kill()


class _Worker:
    """One worker process (`_serve`), spoken to in JSON lines over its stdin/stdout."""

    def __init__(self, startup_timeout: float, wait: bool = True):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        self.startup_timeout = startup_timeout
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,  # Ctrl-C in the terminal goes to the trainer, which closes the workers
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        if self._read_line(self.startup_timeout) != {"ready": True}:
            self.kill()
            raise RuntimeError(
                f"math-verify worker did not start within {self.startup_timeout:.0f}s; check that "
                f"`python -c '{_WORKER}'` runs (math-verify installed?)"
            )

    def ask(self, request: dict, seconds: float) -> dict | None:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._read_line(seconds)

    def _read_line(self, seconds: float) -> dict | None:
        if not select.select([self.proc.stdout], [], [], seconds)[0]:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()


_default_verifier: MathVerifier | None = None
_default_lock = threading.Lock()


def _default() -> MathVerifier:
    global _default_verifier
    with _default_lock:
        if _default_verifier is None:
            _default_verifier = MathVerifier()
        return _default_verifier


def math_reward(completions: list, solution: list[str], **kwargs) -> list[float | None]:
    """Reward 1.0 when the completion's final answer (its last `\\boxed{}`; otherwise its first GSM8K answer line
    `#### 16`, see `gsm8k_answer`; otherwise its answer line, e.g. "The final answer is 12", "The answer is: 316.")
    equals `solution`'s per `math-verify`; 0.0 otherwise; None when the gold answer does not parse or its parsing
    raises (e.g. a gold that is not a string): such a row carries no signal. `solution` may be a bare answer or a
    worked solution ending in `\\boxed{answer}` or in GSM8K's `#### answer`. Completions may be strings or
    conversations. TRL reward-function convention; works from any thread (10 s bound per item)."""
    return _default().score(list(solution), [completion_text(c) for c in completions])


def make_math_reward(timeout: float = 10.0, num_workers: int = 2):
    """`math_reward` with its own time bound and worker count (as a named function, as TRL needs for logging)."""
    verifier = MathVerifier(timeout=timeout, num_workers=num_workers)

    def math_reward(completions: list, solution: list[str], **kwargs) -> list[float | None]:
        return verifier.score(list(solution), [completion_text(c) for c in completions])

    math_reward.verifier = verifier
    return math_reward


# ----------------------------------------------------------------------------------------------------------------
# Worker side: a separate process that only answers requests.


class _Timeout(BaseException):
    """Raised by the worker's timer; a BaseException so math-verify's `except Exception` cannot swallow it."""


def _answer_parser():
    """`parse_answer(text, gold)` with math-verify's extraction configs (imported in the worker only)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    anchored = [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True),
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        ),
        ExprExtractionConfig(try_extract_without_anchor=False),
    ]
    anywhere = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def parse_answer(text: str, gold: bool) -> list:
        """The last boxed answer if any; otherwise the first GSM8K answer line (`#### 16`); otherwise an answer
        line ("the final answer is ...", "Answer: ..."). A gold answer may also be a bare expression (`\\frac12`,
        `(1,2)`): without prose it is read as LaTeX."""
        boxed = last_boxed(text)
        if boxed is not None:
            return parse(f"${boxed}$", anywhere, parsing_timeout=None)
        number = gsm8k_answer(text)
        if number is not None:
            return parse(f"${number}$", anywhere, parsing_timeout=None)
        if not gold:
            return parse(text, anchored, extraction_mode="first_match", parsing_timeout=None)
        parsed = parse(text, anywhere, parsing_timeout=None)
        if parsed or "$" in text or _PROSE_WORD.search(text):
            return parsed
        return parse(f"${text}$", anywhere, parsing_timeout=None)

    return parse_answer


def _serve() -> None:
    """Answer `{"gold", "text", "timeout"}` lines with `{"reward"}` lines until stdin closes."""
    import logging
    import signal
    from functools import lru_cache

    from math_verify import verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": we time out ourselves
    parse_answer = _answer_parser()
    gold_cache = lru_cache(maxsize=4096)(lambda gold: parse_answer(gold, gold=True))

    def on_alarm(signum, frame):
        raise _Timeout

    signal.signal(signal.SIGALRM, on_alarm)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        reward, stage = 0.0, "gold"
        signal.setitimer(signal.ITIMER_REAL, request["timeout"])
        try:
            gold = gold_cache(request["gold"])
            stage = "answer"
            if not gold:
                reward = None
            else:
                reward = float(verify(gold, parse_answer(request["text"], gold=False), timeout_seconds=None))
        except _Timeout:
            reward = None if stage == "gold" else 0.0
        except Exception:  # a malformed answer is a wrong answer; a gold answer that breaks parsing is no signal
            reward = None if stage == "gold" else 0.0
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        print(json.dumps({"reward": reward}), flush=True)
