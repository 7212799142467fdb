"""Peak memory per named phase of a process's work, on the CPU (its resident set's high-water mark) or on a CUDA
device, with the largest forward pass a model made in each phase; and the few /proc and glibc calls it rests on
(Linux). The memory study and scripts/gpu_check.py meter a trainer's phases with it; the cost study reads the peak
resident set of a step."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import time

MIB = 2**20


def status_kib(field: str, pid: int | str = "self") -> int:
    """A field of a process's /proc status in KiB (VmRSS: resident set now, VmHWM: its peak)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak_rss() -> None:
    """Reset this process's peak-RSS counter (VmHWM) to its current RSS (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def malloc_trim() -> None:
    """Hand the memory glibc's malloc holds free back to the system."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PhaseMeter:
    """Peak memory per named phase (nested phases allowed), on the CPU (the process's RSS high-water mark) or on a
    CUDA device (`max_memory_allocated`), plus the largest forward pass of each phase (from `watch(model)`).

    A phase entered several times (e.g. one teacher pass per micro-batch) keeps its largest peak and working memory,
    the sum of its seconds, and its number of calls."""

    def __init__(self, device=None):
        import torch

        self.torch = torch
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.records: dict[str, dict] = {}
        self._stack: list[dict] = []

    # the two counters
    def current(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else 1024 * status_kib("VmRSS")

    def _peak(self) -> int:
        return self.torch.cuda.max_memory_allocated() if self.cuda else 1024 * status_kib("VmHWM")

    def _reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()
        else:
            reset_peak_rss()

    def settle(self) -> None:
        """Release what can be released, so that a phase starts from live memory only."""
        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
        else:
            malloc_trim()

    @contextlib.contextmanager
    def phase(self, name: str):
        if self._stack:  # the enclosing phase's peak so far, before this phase resets the counter
            self._stack[-1]["peak"] = max(self._stack[-1]["peak"], self._peak())
        else:
            self.settle()
        frame = {"name": name, "before": self.current(), "peak": 0, "forwards": {}}
        self._reset_peak()
        self._stack.append(frame)
        start = time.perf_counter()
        try:
            yield frame
        finally:
            if self.cuda:
                self.torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            peak = max(frame["peak"], self._peak())
            self._stack.pop()
            if self._stack:
                self._stack[-1]["peak"] = max(self._stack[-1]["peak"], peak)
            record = self.records.setdefault(
                name, {"calls": 0, "seconds": 0.0, "peak_bytes": 0, "working_bytes": 0, "before_bytes": None}
            )
            record["calls"] += 1
            record["seconds"] += seconds
            if peak - frame["before"] >= record["working_bytes"]:
                record["before_bytes"] = frame["before"]
            record["peak_bytes"] = max(record["peak_bytes"], peak)
            record["working_bytes"] = max(record["working_bytes"], peak - frame["before"])
            for key, value in frame["forwards"].items():
                record[key] = max(record.get(key, 0), value)

    def watch(self, model) -> None:
        """Record, in every open phase, the largest forward pass of `model`: rows and tokens, with / without grad."""

        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs.get("inputs_embeds")
            if ids is None or not self._stack:
                return
            grad = "grad" if self.torch.is_grad_enabled() else "no_grad"
            rows, tokens = int(ids.shape[0]), int(ids.shape[1]) if ids.dim() > 1 else 1
            for frame in self._stack:
                forwards = frame["forwards"]
                for key, value in ((f"max_rows_{grad}", rows), (f"max_tokens_{grad}", rows * tokens)):
                    forwards[key] = max(forwards.get(key, 0), value)
                forwards["forwards"] = forwards.get("forwards", 0) + 1

        model.register_forward_pre_hook(hook, with_kwargs=True)

    def wrap(self, obj, method: str, phase_name) -> bool:
        """Run `obj.method` inside a phase (`phase_name`: a name, or a function of no arguments giving one at call
        time); False when `obj` has no such method (the seam moved)."""
        original = getattr(obj, method, None)
        if original is None:
            return False

        def wrapped(*args, **kwargs):
            with self.phase(phase_name() if callable(phase_name) else phase_name):
                return original(*args, **kwargs)

        setattr(obj, method, wrapped)
        return True
