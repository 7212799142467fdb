"""What every results file records so that a reader can rerun it: the command, the commit, and whether the files
the results depend on differed from that commit; and, for timings, the machine's conditions (`MachineWatch`)."""

from __future__ import annotations

import os
import platform
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.rstrip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def provenance(script: str, argv: list[str]) -> dict:
    """`command`, `commit`, `dirty` (any change in the checkout) and `changed_files_that_matter` (changed files under
    benchmarks/ or trl_mintrl/, results excluded)."""
    changed = _git("status", "--porcelain", "--", "benchmarks", "trl_mintrl", "pyproject.toml")
    return {
        "command": " ".join(["python", script, *argv]),
        "commit": _git("rev-parse", "HEAD").strip() or "unknown",
        "dirty": bool(_git("status", "--porcelain")),
        "changed_files_that_matter": [line[3:] for line in changed.splitlines() if "benchmarks/results" not in line],
    }


def command_line(prov: dict, recorded_provenance: dict | None = None) -> str:
    """A report's first line: the command, its commit and the changed files that matter, and the arms whose runs were
    taken from learning.json (`recorded_provenance`: arm -> its provenance there)."""
    changed = prov["changed_files_that_matter"]
    reused = ", ".join(sorted(recorded_provenance or {})) or "none"
    return (
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`"
        + (f" (changed files: {', '.join(changed)})" if changed else "")
        + f"; runs taken from learning.json (same jobs): {reused}."
    )


class MachineWatch:
    """The machine's conditions around a timed benchmark, recorded with its results: the CPU model, the cores the
    process may use, and the 1-minute load average before the run and during it (sampled every `every_s` seconds
    by a daemon thread until `stop()`). A cost ratio measured with spare cores need not hold without them."""

    def __init__(self, every_s: float = 10.0, resumed: dict | None = None):
        """`resumed`: the `state()` of a watch over the same run's earlier part (a run resumed from a checkpoint),
        whose load before and samples this one continues."""
        self.before = resumed["before"] if resumed else os.getloadavg()[0]
        self.samples: list[float] = list(resumed["samples"]) if resumed else []
        self._stop = threading.Event()
        self._every_s = every_s
        self._thread = threading.Thread(target=self._sample, name="machine-watch", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._every_s):
            self.samples.append(os.getloadavg()[0])

    def state(self) -> dict:
        """What a resumed run's watch continues from (`resumed`)."""
        return {"before": self.before, "samples": list(self.samples)}

    def stop(self) -> dict:
        """Stop sampling; the conditions as the results record them."""
        self._stop.set()
        self._thread.join()
        during = self.samples or [os.getloadavg()[0]]
        return {
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "load_before": round(self.before, 2),
            "load_during_mean": round(sum(during) / len(during), 2),
            "load_during_max": round(max(during), 2),
        }


def machine() -> dict:
    """The machine a run finished on, as each harness record keeps it: the CPU model, the logical CPUs and those the
    process may use, the 1-minute load average at that moment, the platform and Python's version."""
    return {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "load_1min": round(os.getloadavg()[0], 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def conditions_text(machine: dict | None) -> str:
    """One line for a report: where and under which load a timing was measured."""
    if not machine:
        return "conditions not recorded (measured before they were)"
    return (
        f"{machine['cpu_model']}, {machine['usable_cpus']} of {machine['logical_cpus']} CPUs usable; 1-minute load "
        f"{machine['load_before']:.2f} before, {machine['load_during_mean']:.2f} mean / {machine['load_during_max']:.2f} "
        "max during"
    )
