"""The sandbox's harness: the code that runs inside the child process, forks the program and reports back.

`Sandbox` (sandbox.py, the trainer's side) starts this file as a script, `python -I sandbox_child.py JOB.json
VALUES_FD`, so that the child loads the standard library only: nothing of trl_mintrl, nothing of the trainer's
side, and nothing here trusts the program. The job file and the values descriptor are the whole interface.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys

_PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384


def main(job_path: str, values_fd: int) -> None:
    """Fork the program, wait for it, exit with its status (128 + signal if a signal killed it)."""
    with open(job_path) as f:
        spec = json.load(f)
    spec["values_fd"] = values_fd
    _expose(spec["expose"])
    pid = os.fork()
    if pid == 0:
        try:
            _run_program(spec)
        finally:
            os._exit(70)  # unreachable unless the harness itself failed
    while True:
        try:
            _, status, usage = os.wait4(pid, 0)
            break
        except ChildProcessError:  # pragma: no cover - the child is ours; only an odd kernel gets here
            os._exit(70)
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code == -signal.SIGKILL and usage.ru_utime + usage.ru_stime >= spec["limits"]["cpu"]:
        code = -signal.SIGXCPU  # SIGXCPU ignored, then SIGKILL at the hard limit: the CPU limit ended it
    os._exit(128 - code if code < 0 else code)


def _expose(pairs: list[list[str]]) -> None:
    """Inside the private mount namespace: hide each unreadable ancestor under an empty tmpfs, then bind the needed
    paths back read-only, so user nobody can run the interpreter and nothing else there."""
    if not pairs:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, fstype, flags, data=None):
        if libc.mount(source and source.encode(), target.encode(), fstype, flags, data) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}")

    sources = {path: os.open(path, os.O_PATH) for _, path in pairs}
    for ancestor in dict.fromkeys(ancestor for ancestor, _ in pairs):
        mount("tmpfs", ancestor, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755")
    for path, fd in sources.items():
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID)
        os.close(fd)


def _restrict(spec: dict) -> None:
    """Limits first (lowering is always allowed), then no_new_privs, then drop to the unprivileged user."""
    limits = spec["limits"]
    for name, value, hard in (
        ("RLIMIT_CPU", limits["cpu"], limits["cpu"] + 1),
        ("RLIMIT_AS", limits["memory"], limits["memory"]),
        ("RLIMIT_NPROC", limits["nproc"], limits["nproc"]),
        ("RLIMIT_NOFILE", limits["nofile"], limits["nofile"]),
        ("RLIMIT_FSIZE", limits["fsize"], limits["fsize"]),
        ("RLIMIT_CORE", 0, 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, hard))
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if spec["run_as"] is not None:
        uid, gid = spec["run_as"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    # No capabilities left, e.g. as "root" of a user namespace (could unmount our /proc to see the host's).
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _run_program(spec: dict) -> None:
    """Execute the program as `__main__` (or as a module when answering calls) and exit with its status."""
    import traceback
    import types

    _restrict(spec)
    os.chdir(spec["workdir"])
    path = os.path.join(spec["workdir"], "solution.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    module = types.ModuleType("__main__" if spec["calls"] is None else "solution")
    module.__file__ = path
    sys.modules[module.__name__] = module
    sys.argv = [path]
    code = 0
    try:
        exec(compile(source, path, "exec"), module.__dict__)
        if spec["calls"] is not None:
            _answer_calls(module.__dict__, spec["calls"], spec["call_timeout"], spec["values_fd"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code & 0xFF)


class _CallTimeout(BaseException):
    """Raised by SIGALRM inside a call; a BaseException so `except Exception` in the program does not hide it."""


def _on_alarm(signum, frame):
    raise _CallTimeout("call timed out")


def _answer_calls(namespace: dict, calls: list, timeout: float, values_fd: int) -> None:
    """Call each function and write one JSON line per call to the values fd, as soon as it finishes."""
    out = os.fdopen(values_fd, "w", encoding="utf-8")
    signal.signal(signal.SIGALRM, _on_alarm)
    for name, args in calls:
        try:
            function = _resolve(namespace, name)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                line = json.dumps({"value": function(*args)}, default=_to_json)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:  # the program's failure on this call, reported and not fatal
            line = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:1000]})
        out.write(line + "\n")
        out.flush()


def _resolve(namespace: dict, name: str):
    """`Solution().name` (LeetCode-style starter code, as in LiveCodeBench) or the module-level function `name`."""
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, name):
        return getattr(solution(), name)
    function = namespace.get(name)
    if not callable(function):
        raise NameError(f"the program defines no function {name!r}")
    return function


def _to_json(value):
    """Sets become sorted lists (when sortable) so they can compare with JSON expected outputs; other objects their
    repr."""
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    return repr(value)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
