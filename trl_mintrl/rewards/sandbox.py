"""Run untrusted, model-written Python programs without letting them harm the trainer.

Each run is a child process tree of its own:

    trainer --Popen(new session)--> [unshare --net --pid --mount-proc] --> harness --fork--> program

- The harness is sandbox_child.py run as a script (`python -I`, standard library only, nothing of this module).
  It forks the program, waits for it and exits; the program's parent is therefore the harness, never the trainer.
  With namespaces the harness is PID 1 of a fresh PID namespace: signals from the program cannot reach it, and
  when it exits the kernel kills every process left in the namespace, including ones that escaped into their own
  session.
- The program runs in a throw-away directory with a clean environment, under `setrlimit` limits on CPU time,
  address space, processes, open files and file size (which also caps captured output, since stdout and stderr
  are files), with `no_new_privs` and no capabilities, and as user `nobody` when the trainer is root (a Python
  installed where nobody cannot read it, e.g. pyenv under /root, is bind-mounted back read-only in the mount
  namespace). docs/sandbox.md lists each limit, how it is enforced and the test that pins it.
- Network: a new network namespace (only a downed loopback) when the OS allows it: as root, or as any user where
  unprivileged user namespaces are enabled. Otherwise runs fall back to plain child processes (`isolation ==
  "process"`, warned about once per process and marked on every result): limits, clean environment and
  process-group cleanup still apply; network isolation does not, and a non-root program then runs as the
  trainer's user (it can touch that user's files). `isolation="namespaces"` refuses the fallback.
- The trainer waits on a pidfd with a wall-clock timeout, then kills the whole process group and waits until it
  is gone, so nothing outlives the run.

Expected outputs never enter the sandbox: a run returns what the program printed (or, for function calls, the
values it returned) and the caller compares. A remote sandbox service plugs in as `Sandbox(executor=...)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

from . import sandbox_child

logger = logging.getLogger(__name__)

_NOBODY = 65534
_NAMESPACE_FLAGS = ("--net", "--pid", "--fork", "--mount-proc", "--kill-child")
ISOLATION_ENV = "TRL_MINTRL_SANDBOX_ISOLATION"
_HARNESS_SCRIPT = os.path.abspath(sandbox_child.__file__)  # run by path, not `-m`: the child imports no package
_fallback_warned = False


@dataclass
class Job:
    """One program run. `calls`: `[(function_name, [args...]), ...]` to call after the program is loaded (the
    program then runs as a module, not as `__main__`); each call gets `timeout` seconds."""

    code: str
    stdin: str = ""
    calls: list[tuple[str, list]] | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Limits:
    """What one run may use; every executor gets these. `timeout`: wall-clock seconds per run (per call for function
    calls); `cpu_seconds`: CPU time per run (per call), rounded up to whole seconds, None to follow `timeout`."""

    timeout: float
    cpu_seconds: float | None
    memory_mb: int
    max_processes: int
    max_open_files: int
    max_output_mb: int


@dataclass
class RunResult:
    """What a run did. `status`: "ok" (exit 0), "error" (non-zero exit, e.g. an exception, or a write past the
    file-size limit), "timeout" (wall clock), "killed" (by a signal, e.g. SIGXCPU at the CPU-time limit),
    "executor_error" (the executor failed: nothing is known about the program).
    `values`: one `{"value": ...}` or `{"error": "..."}` per call, in order, for the calls that finished.
    `limit`: the limit that ended or cut the run: "wall_time", "cpu_time", "file_size" (output reached the cap), or
    None. Memory, process and open-file limits make the failing call raise inside the program instead.
    `isolation`: "namespaces" (no network), "process" (no network isolation), or what an executor reports."""

    status: str
    returncode: int | None
    signal: int | None
    stdout: str
    stderr: str
    values: list[dict] | None
    seconds: float
    limit: str | None = None
    isolation: str = "unknown"


Executor = Callable[[Job, Limits], RunResult]
"""Runs one job somewhere (e.g. a remote sandbox service) under the given limits: `Sandbox(executor=...)`."""


class Sandbox:
    """Runs programs in isolated child processes, in parallel up to `num_workers`.

    Args:
        timeout: wall-clock seconds per run (per call for function calls); 1 s is added for interpreter start-up.
        cpu_seconds: CPU-time limit per run (per call), rounded up to whole seconds; default: `timeout`.
        memory_mb: address-space limit of the program (the interpreter itself takes about 20 MB of it).
        max_processes: processes/threads the program may add (counted per user, as the kernel does).
        max_open_files: file-descriptor limit (stdin, stdout and stderr included).
        max_output_mb: largest file the program may write; stdout and stderr are files, so this caps output too.
        num_workers: concurrent runs (default: CPU count).
        isolation: "auto" (namespaces when permitted, else processes with a warning), "namespaces" (strict: fail if
            not permitted) or "process". Default: the `TRL_MINTRL_SANDBOX_ISOLATION` environment variable, else
            "auto".
        executor: run jobs with this callable `(job, limits) -> RunResult` (e.g. a remote sandbox service) instead
            of local child processes; `isolation` is then the executor's business.
    """

    def __init__(
        self,
        timeout: float = 10.0,
        cpu_seconds: float | None = None,
        memory_mb: int = 1024,
        max_processes: int = 32,
        max_open_files: int = 64,
        max_output_mb: int = 16,
        num_workers: int | None = None,
        isolation: str | None = None,
        executor: Executor | None = None,
    ):
        values = dict(timeout=timeout, cpu_seconds=cpu_seconds, memory_mb=memory_mb, max_processes=max_processes)
        values.update(max_open_files=max_open_files, max_output_mb=max_output_mb, num_workers=num_workers)
        for name, value in values.items():
            if value is not None and value <= 0:
                raise ValueError(f"Sandbox({name}=...) must be > 0, got {value!r}")
        isolation = isolation or os.environ.get(ISOLATION_ENV) or "auto"
        if isolation not in ("auto", "namespaces", "process"):
            raise ValueError(
                f"Sandbox(isolation=...) (or ${ISOLATION_ENV}) must be 'auto', 'namespaces' or 'process', got "
                f"{isolation!r}"
            )
        if executor is not None and not callable(executor):
            raise TypeError(f"Sandbox(executor=...) must be a callable (job, limits) -> RunResult, got {executor!r}")
        self.limits = Limits(float(timeout), cpu_seconds, memory_mb, max_processes, max_open_files, max_output_mb)
        self.num_workers = num_workers or os.cpu_count() or 1
        self.executor = executor
        if executor is not None:
            self.isolation, self.run_as = "executor", None
            return
        if not sys.platform.startswith("linux"):
            raise RuntimeError("the code sandbox needs Linux (pidfd, setrlimit, namespaces); or pass an executor")
        prefix = _namespace_prefix() if isolation != "process" else None
        if prefix is None and isolation == "namespaces":
            raise RuntimeError(
                "isolation='namespaces' but `unshare --net --pid` is not permitted here (needs root, or unprivileged "
                "user namespaces), so programs would run with network access. Allow it (e.g. give the container "
                "CAP_SYS_ADMIN, or set sysctl kernel.unprivileged_userns_clone=1), or accept the fallback with "
                f"isolation='auto' (${ISOLATION_ENV}=auto)."
            )
        if prefix is None and isolation == "auto":
            _warn_fallback_once()
        self._prefix = list(prefix or ())
        self.isolation = "namespaces" if prefix else "process"
        self.run_as, self._expose = self._unprivileged_user()

    def _unprivileged_user(self) -> tuple[tuple[int, int] | None, list[tuple[str, str]]]:
        """As root, programs run as nobody: they cannot touch the trainer's files, read its /proc/PID/environ or
        escape RLIMIT_NPROC (the kernel does not apply it to root). Python installed under a private directory
        (e.g. pyenv in /root) is re-exposed read-only inside the mount namespace; without namespaces that is
        impossible, and running programs as root would leave fork bombs unbounded, so that setup is refused."""
        if os.geteuid() != 0:
            return None, []
        hidden = interpreter_hidden_paths()
        if hidden and self.isolation != "namespaces":
            raise RuntimeError(
                f"cannot sandbox programs safely here: as root without namespaces they must run as user nobody, who "
                f"cannot read the Python installation under {hidden[0][0]}. Install Python where all users can read "
                "it, or allow `unshare --net --pid` (e.g. give the container CAP_SYS_ADMIN)."
            )
        return _nobody_ids(), hidden

    def run(self, code: str, stdin: str = "", calls: list[tuple[str, list]] | None = None, timeout=None) -> RunResult:
        """Run one program (see `Job`)."""
        return self._run(Job(code, stdin, calls, timeout))

    def run_many(self, jobs: list[Job]) -> list[RunResult]:
        """Run jobs concurrently (up to `num_workers` at a time); results come back in order."""
        if len(jobs) <= 1:
            return [self._run(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=min(self.num_workers, len(jobs))) as pool:
            return list(pool.map(self._run, jobs))

    def _run(self, job: Job) -> RunResult:
        """One job, through the executor when there is one (its failure becomes an "executor_error" result, so a
        flaky service never stops training), else locally."""
        if self.executor is None:
            return self._run_locally(job)
        limits = dataclasses.replace(self.limits, timeout=float(job.timeout or self.limits.timeout))
        start = time.monotonic()
        try:
            result = self.executor(job, limits)
        except Exception as err:  # e.g. the service is down: the run is unknown, not the program's failure
            logger.warning("sandbox executor failed: %s: %s", type(err).__name__, err)
            message = f"executor failed: {type(err).__name__}: {err}"
            return RunResult("executor_error", None, None, "", message, None, time.monotonic() - start)
        if not isinstance(result, RunResult):
            raise TypeError(f"Sandbox(executor=...) must return a RunResult, got {type(result).__name__}")
        return result

    def _run_locally(self, job: Job) -> RunResult:
        per_call = float(job.timeout or self.limits.timeout)
        wall = per_call * max(1, len(job.calls or ())) + 1.0
        base = tempfile.mkdtemp(prefix="trl_mintrl_sandbox_")
        try:
            job_path = self._prepare(base, job, per_call, wall)
            with contextlib.ExitStack() as stack:
                stdin = stack.enter_context(open(os.path.join(base, "stdin"), "rb"))
                out, err, values = (
                    stack.enter_context(_private_file(base, name)) for name in ("stdout", "stderr", "values")
                )
                start = time.monotonic()
                proc = subprocess.Popen(
                    [*self._prefix, sys.executable, "-I", _HARNESS_SCRIPT, job_path, str(values.fileno())],
                    stdin=stdin,
                    stdout=out,
                    stderr=err,
                    pass_fds=(values.fileno(),),
                    cwd=os.path.join(base, "work"),
                    env=self._environment(os.path.join(base, "work")),
                    start_new_session=True,
                )
            timed_out = not _wait_then_kill_group(proc, wall)
            seconds = time.monotonic() - start
            return self._result(proc.returncode, timed_out, base, job.calls is not None, seconds)
        finally:
            _remove_tree(base)

    def _prepare(self, base: str, job: Job, per_call: float, wall: float) -> str:
        """Lay out the run directory: trainer-only files in `base` (0711: enterable, not listable), the program's
        own directory in `base/work`. Returns the job file's path."""
        os.chmod(base, 0o711)
        work = os.path.join(base, "work")
        os.mkdir(work, 0o700)
        with open(os.path.join(work, "solution.py"), "w", encoding="utf-8") as f:
            f.write(job.code)
        if self.run_as is not None:
            for path in (work, os.path.join(work, "solution.py")):
                os.chown(path, *self.run_as)
        uid = self.run_as[0] if self.run_as else os.getuid()
        limits = self.limits
        spec = {
            "workdir": work,
            "calls": job.calls,
            "call_timeout": per_call,
            "run_as": self.run_as,
            "expose": self._expose,
            "limits": {
                "cpu": math.ceil((limits.cpu_seconds or per_call) * max(1, len(job.calls or ()))),
                "memory": limits.memory_mb * 2**20,
                "nproc": _count_tasks(uid) + limits.max_processes,
                "nofile": limits.max_open_files,
                "fsize": limits.max_output_mb * 2**20,
            },
        }
        with _private_file(base, "job.json") as f:
            f.write(json.dumps(spec).encode())
        with _private_file(base, "stdin") as f:
            f.write(job.stdin.encode())
        return os.path.join(base, "job.json")

    @staticmethod
    def _environment(work: str) -> dict[str, str]:
        """A clean environment: nothing from the trainer's (API keys, tokens, paths) reaches the program."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": work,
            "TMPDIR": work,
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }

    def _result(self, returncode: int, timed_out: bool, base: str, with_calls: bool, seconds: float) -> RunResult:
        # The harness exits with 128 + signal when the program died of a signal; unshare re-raises signals.
        sig = -returncode if returncode < 0 else (returncode - 128 if returncode > 128 else None)
        if timed_out:
            status = "timeout"
        elif sig is not None:
            status = "killed"
        else:
            status = "ok" if returncode == 0 else "error"
        cap = self.limits.max_output_mb * 2**20
        if timed_out:
            limit = "wall_time"
        elif sig == signal.SIGXCPU:
            limit = "cpu_time"
        elif max(os.path.getsize(os.path.join(base, name)) for name in ("stdout", "stderr")) >= cap:
            limit = "file_size"
        else:
            limit = None
        values = None
        if with_calls:
            values = []
            for line in self._read(base, "values").splitlines():
                with contextlib.suppress(ValueError):  # a line cut short by a kill
                    values.append(json.loads(line))
        return RunResult(
            status=status,
            returncode=None if timed_out else returncode,
            signal=None if timed_out else sig,
            stdout=self._read(base, "stdout"),
            stderr=self._read(base, "stderr"),
            values=values,
            seconds=seconds,
            limit=limit,
            isolation=self.isolation,
        )

    def _read(self, base: str, name: str) -> str:
        with open(os.path.join(base, name), "rb") as f:
            return f.read(self.limits.max_output_mb * 2**20).decode("utf-8", errors="replace")


def _warn_fallback_once() -> None:
    global _fallback_warned
    if not _fallback_warned:
        _fallback_warned = True
        logger.warning(
            "code sandbox: `unshare --net --pid` is not permitted here, so programs run as plain child processes "
            "WITHOUT network isolation (limits and cleanup still apply). Set isolation='namespaces' (or $%s="
            "namespaces) to refuse this instead.",
            ISOLATION_ENV,
        )


@cache
def _namespace_prefix() -> tuple[str, ...] | None:
    """`unshare` flags for a new network + PID + mount namespace, or None where the OS does not permit it."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    flags = _NAMESPACE_FLAGS if os.geteuid() == 0 else ("--user", "--map-root-user", *_NAMESPACE_FLAGS)
    try:
        probe = subprocess.run([unshare, *flags, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (unshare, *flags) if probe.returncode == 0 else None


def _nobody_ids() -> tuple[int, int]:
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return _NOBODY, _NOBODY


def interpreter_hidden_paths() -> list[tuple[str, str]]:
    """Directories of this Python installation that user nobody cannot read (see `_hidden_paths`)."""
    return _hidden_paths([sys.base_prefix, sys.prefix, *filter(os.path.isdir, sys.path)])


def _hidden_paths(paths: list[str]) -> list[tuple[str, str]]:
    """`(top-most directory others cannot enter, path)` for each path user nobody could not read; nested paths
    are covered by their parent."""
    hidden: dict[str, str] = {}
    for path in sorted({os.path.realpath(p) for p in paths}):
        if any(path.startswith(done + os.sep) for done in hidden):
            continue
        parts = path.split(os.sep)
        for i in range(2, len(parts) + 1):
            ancestor = os.sep.join(parts[:i])
            if not os.stat(ancestor).st_mode & 0o001:  # no search permission for others
                hidden[path] = ancestor
                break
    return [(ancestor, path) for path, ancestor in hidden.items()]


def _count_tasks(uid: int) -> int:
    """Tasks (processes and threads) that `uid` runs now: RLIMIT_NPROC counts them all, so the program's budget is
    this plus `max_processes`."""
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):  # processes come and go while we look
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    total += len(os.listdir(f"/proc/{entry}/task"))
    return total


def _wait_then_kill_group(proc: subprocess.Popen, seconds: float) -> bool:
    """Wait up to `seconds` for the run to exit, then kill its whole process group and wait until it is gone.

    The leader stays a zombie until reaped, so its group id cannot be recycled before the kill. The kill reaches
    the leader's child (the harness; with namespaces the PID-namespace init, whose exit waits until every process
    of the namespace is dead), so waiting for that child means nothing of the run is left. Returns False on
    timeout."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        finished = bool(select.select([pidfd], [], [], seconds)[0])
    finally:
        os.close(pidfd)
    children = []
    for pid in _children(proc.pid):
        with contextlib.suppress(OSError):
            children.append(os.pidfd_open(pid))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for child in children:
        select.select([child], [], [], 10.0)
        os.close(child)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:  # stragglers of the group (plain processes) are reaped by init
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.01)
    return finished


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


def _private_file(base: str, name: str):
    """A new file only the trainer's user can open by path (the program gets it as an inherited descriptor)."""
    return open(os.open(os.path.join(base, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")


def _remove_tree(path: str) -> None:
    """Delete a run directory even if the program made parts of it unreadable."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o700)
    shutil.rmtree(path, ignore_errors=True)
