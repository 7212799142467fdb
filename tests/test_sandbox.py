"""The code sandbox: normal runs, limits, and hostile programs that must not harm, hang or outlive the trainer."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time

import pytest

from trl_mintrl.rewards import sandbox as sandbox_module
from trl_mintrl.rewards.sandbox import (
    ISOLATION_ENV,
    Job,
    Limits,
    RunResult,
    Sandbox,
    _namespace_prefix,
    interpreter_hidden_paths,
)

NAMESPACES = _namespace_prefix() is not None
ROOT = os.geteuid() == 0
# As root, process isolation needs programs to run as nobody, which needs a Python installation nobody can read.
PROCESS_MODE_SAFE = not ROOT or not interpreter_hidden_paths()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="unshare --net --pid not permitted on this machine")
needs_root = pytest.mark.skipif(not ROOT, reason="programs run as `nobody` only when the trainer is root")


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(timeout=2.0, max_processes=16, max_output_mb=1, num_workers=4)


@pytest.fixture(autouse=True)
def _children_before_test():
    """Children this process already had (e.g. the math reward's worker pool from earlier tests): not leftovers."""
    _PREEXISTING.clear()
    _PREEXISTING.update(_processes(lambda parent, owner: parent == os.getpid()))


_PREEXISTING: set[int] = set()


def _sandboxed_processes(sandbox: Sandbox) -> list[int]:
    """Processes left behind: our new children, plus (programs run as nobody) any process of that user."""
    run_as = sandbox.run_as[0] if sandbox.run_as is not None else None
    found = _processes(lambda parent, owner: parent == os.getpid() or owner == run_as)
    return sorted(found - _PREEXISTING)


def _processes(keep) -> set[int]:
    leftover = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            owner = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        if keep(parent, owner):
            leftover.add(int(entry))
    return leftover


def test_reports_its_isolation(sandbox):
    assert sandbox.isolation == ("namespaces" if NAMESPACES else "process")
    assert (sandbox.run_as is not None) == ROOT
    assert sandbox.run("pass").isolation == sandbox.isolation


def test_program_has_no_privileges(sandbox):
    code = (
        "fields = ('CapEff', 'CapPrm', 'NoNewPrivs')\n"
        "print([line.split()[1] for line in open('/proc/self/status') if line.startswith(fields)])"
    )
    assert sandbox.run(code).stdout.strip() == "['0000000000000000', '0000000000000000', '1']"


def test_stdin_program(sandbox):
    result = sandbox.run("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="1 2 3\n")
    assert (result.status, result.stdout, result.returncode) == ("ok", "6\n", 0)


def test_function_calls_report_values_and_errors(sandbox):
    code = "def add(a, b):\n    return a + b\nclass Solution:\n    def pair(self, x):\n        return (x, {x})\n"
    result = sandbox.run(code, calls=[("add", [1, 2]), ("pair", [3]), ("missing", []), ("add", [1])])
    assert result.status == "ok"
    assert result.values[:2] == [{"value": 3}, {"value": [3, [3]]}]  # tuple and set become JSON lists
    assert "no function 'missing'" in result.values[2]["error"]
    assert result.values[3]["error"].startswith("TypeError")


def test_a_slow_call_times_out_alone(sandbox):
    code = "def f(x):\n    while x: pass\n    return 'done'\n"
    result = sandbox.run(code, calls=[("f", [1]), ("f", [0])], timeout=0.5)
    assert result.values == [{"error": "_CallTimeout: call timed out"}, {"value": "done"}]


def test_crash_and_exit_codes(sandbox):
    crash = sandbox.run("raise ValueError('boom')")
    assert crash.status == "error" and crash.returncode == 1 and "ValueError: boom" in crash.stderr
    assert sandbox.run("import sys\nsys.exit(3)").returncode == 3


def test_a_blocked_program_is_stopped_by_the_wall_clock(sandbox):
    start = time.monotonic()
    result = sandbox.run("import time\ntime.sleep(60)", timeout=1.0)  # uses no CPU: only the wall clock stops it
    assert (result.status, result.limit) == ("timeout", "wall_time")
    assert time.monotonic() - start < 8  # 1 s + 1 s start-up allowance, plenty of slack for a loaded machine
    assert _sandboxed_processes(sandbox) == []


def test_fork_bomb_is_contained(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.run(bomb, timeout=1.0)
    assert result.status in ("timeout", "killed")
    assert _sandboxed_processes(sandbox) == []
    assert sandbox.run("print('next run fine')").stdout == "next run fine\n"


def test_huge_allocation_fails_inside_the_program(sandbox):
    result = sandbox.run("x = bytearray(8 * 2**30)\nprint('allocated')")
    assert result.status == "error" and "MemoryError" in result.stderr and "allocated" not in result.stdout


def test_huge_output_is_capped(sandbox):
    result = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    # Python ignores SIGXFSZ, so the write past the file-size limit fails (EFBIG), long before the wall clock.
    assert (result.status, result.limit) == ("error", "file_size") and "File too large" in result.stderr
    assert 0 < len(result.stdout) <= 2**20


def test_killing_its_parent_does_not_reach_the_trainer(sandbox):
    code = (
        "import os, signal\nprint(os.getppid(), flush=True)\n"
        "for kill in (lambda: os.kill(os.getppid(), signal.SIGKILL), lambda: os.killpg(0, signal.SIGKILL),\n"
        "             lambda: os.kill(-1, signal.SIGKILL)):\n"
        "    try:\n        kill()\n    except OSError:\n        pass\n"
    )
    result = sandbox.run(code)
    assert int(result.stdout.split()[0]) != os.getpid()  # its parent is the harness, never the trainer
    assert sandbox.run("print('alive')").stdout == "alive\n"
    assert _sandboxed_processes(sandbox) == []


def test_escaping_into_a_new_session_does_not_outlive_the_run(sandbox):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = sandbox.run(code)
    assert result.stdout == "parent done\n"
    if NAMESPACES:  # the PID namespace dies with the harness; plain process groups cannot hold a setsid() child
        assert _sandboxed_processes(sandbox) == []


@needs_root
def test_cannot_delete_files_outside_its_directory(sandbox, tmp_path):
    os.chmod(tmp_path, 0o755)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    victim.chmod(0o644)
    code = (
        "import os, shutil\n"
        f"for attack in (lambda: os.remove({str(victim)!r}), lambda: shutil.rmtree({str(tmp_path)!r})):\n"
        "    try:\n        attack()\n    except OSError as e:\n        print(type(e).__name__)\n"
        "open('mine.txt', 'w').write('ok')\nos.remove('mine.txt')\nprint('own dir ok')"
    )
    result = sandbox.run(code)
    assert victim.read_text() == "keep me"
    assert result.stdout.splitlines() == ["PermissionError", "PermissionError", "own dir ok"]


@needs_namespaces
def test_no_network(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        f"for address in (('127.0.0.1', {port}), ('1.1.1.1', 80)):\n"
        "    try:\n        socket.create_connection(address, timeout=1).sendall(b'leak')\n        print('connected')\n"
        "    except OSError as e:\n        print('blocked', e.errno)\n"
    )
    result = sandbox.run(code)
    assert result.stdout.count("blocked") == 2, result.stdout
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_cannot_read_the_trainer_environment(sandbox, monkeypatch):
    monkeypatch.setenv("TRL_MINTRL_TEST_SECRET", "s3cr3t-token-value")
    code = (
        "import os\nprint(sorted(os.environ))\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n    except OSError:\n        pass\n"
    )
    result = sandbox.run(code)
    assert result.status == "ok"
    assert "s3cr3t-token-value" not in result.stdout
    assert "TRL_MINTRL_TEST_SECRET" not in result.stdout


def test_parallel_runs_keep_their_order(sandbox):
    jobs = [Job(f"print({i} * {i})") for i in range(12)]
    start = time.monotonic()
    results = sandbox.run_many(jobs)
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(12)]
    print(f"sandbox throughput: {len(jobs) / elapsed:.1f} programs/s with {sandbox.num_workers} workers")


@pytest.mark.skipif(PROCESS_MODE_SAFE, reason="Python is readable by nobody here, so process mode is allowed")
def test_process_isolation_refuses_to_run_programs_as_root():
    with pytest.raises(RuntimeError, match="nobody"):
        Sandbox(isolation="process")


@pytest.mark.skipif(not PROCESS_MODE_SAFE, reason="as root, Python here is unreadable by nobody: process mode refused")
def test_process_isolation_still_contains_hostile_programs():
    process_sandbox = Sandbox(timeout=2.0, max_processes=16, max_output_mb=1, isolation="process")
    assert process_sandbox.isolation == "process"
    assert process_sandbox.run("print(input()[::-1])", stdin="abc").stdout == "cba\n"
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert process_sandbox.run(bomb, timeout=1.0).status in ("timeout", "killed")
    killer = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(30)"
    assert process_sandbox.run(killer).status in ("killed", "error", "timeout")
    assert _sandboxed_processes(process_sandbox) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timeout": 0}, "timeout"),
        ({"cpu_seconds": 0}, "cpu_seconds"),
        ({"memory_mb": -1}, "memory_mb"),
        ({"isolation": "vm"}, "isolation"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sandbox(**kwargs)


# ------------------------------------------------------------------------------------------------------------------
# Each limit pinned from both sides: the program reports how far it got, so a loosened limit fails the test.


@pytest.fixture(scope="module")
def limited():
    """Small limits, a generous wall clock: on a loaded machine every run must still end by its own limit."""
    return Sandbox(
        timeout=60.0, cpu_seconds=1, memory_mb=128, max_processes=16, max_open_files=32, max_output_mb=1, num_workers=2
    )


FORK_UNTIL_REFUSED = """import errno, os, time
forked = 0
while forked < 200:
    try:
        pid = os.fork()
    except OSError as e:
        print(forked, errno.errorcode[e.errno])
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
"""


def test_process_limit(limited):
    """RLIMIT_NPROC counts every process of the real user (nobody, when the trainer is root), so the budget is the
    user's processes when the run starts plus `max_processes`: another nobody process starting meanwhile (another
    run, another service) takes from it. The program itself is one of its `max_processes`."""
    result = limited.run(FORK_UNTIL_REFUSED)
    _assert_forked_up_to_the_limit(result, limited)
    assert (result.status, result.limit) == ("ok", None)  # ended by the limit, long before the wall clock
    assert result.seconds < limited.limits.timeout / 2
    assert _sandboxed_processes(limited) == []  # the sleeping children die with the run


def _assert_forked_up_to_the_limit(result, sandbox):
    fields = result.stdout.split()
    assert len(fields) == 2 and fields[1] == "EAGAIN", f"forking was never refused: {result.stdout}{result.stderr}"
    assert abs(int(fields[0]) - (sandbox.limits.max_processes - 1)) <= 3, result.stdout


@needs_root
def test_process_limit_is_counted_from_the_users_running_processes(limited):
    """Processes nobody already runs (here 6 sleepers) neither eat into the program's budget nor let it exceed."""
    sleepers = [subprocess.Popen(["sleep", "60"], user=limited.run_as[0], group=limited.run_as[1]) for _ in range(6)]
    try:
        result = limited.run(FORK_UNTIL_REFUSED)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    _assert_forked_up_to_the_limit(result, limited)


ALLOCATE_AROUND_THE_LIMIT = """def address_space():
    for line in open('/proc/self/status'):
        if line.startswith('VmSize'):
            return int(line.split()[1]) * 1024
limit, margin = {memory_mb} * 2**20, 8 * 2**20
for total in (limit - margin, limit + margin):
    try:
        block = bytearray(total - address_space())
        print('allocated', flush=True)
        del block
    except MemoryError:
        print('MemoryError')
"""


def test_memory_limit(limited):
    """A program may grow its address space (interpreter included) to just below `memory_mb`, not past it."""
    result = limited.run(ALLOCATE_AROUND_THE_LIMIT.format(memory_mb=limited.limits.memory_mb))
    assert result.stdout.split("\n")[:2] == ["allocated", "MemoryError"], result.stdout + result.stderr


CPU_REPORTING_BUSY_LOOP = """import time
last = 0.0
while True:
    now = time.process_time()
    if now - last >= 0.05:
        print(f'{now:.2f}', flush=True)
        last = now
"""


def test_cpu_time_limit(limited):
    """A busy loop dies of SIGXCPU once it has used `cpu_seconds` of CPU, long before the wall clock, and the result
    says so; the CPU seconds it reported last pin the limit from above and below."""
    result = limited.run(CPU_REPORTING_BUSY_LOOP)
    assert (result.status, result.signal, result.limit) == ("killed", signal.SIGXCPU, "cpu_time")
    assert 0.8 <= float(result.stdout.split()[-1]) <= 1.0
    assert result.seconds < limited.limits.timeout


def test_cpu_time_limit_holds_when_sigxcpu_is_ignored(limited):
    result = limited.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
    assert (result.status, result.limit) == ("killed", "cpu_time")  # SIGKILL at the hard limit, 1 s later
    assert result.seconds < limited.limits.timeout


OPEN_UNTIL_REFUSED = """import errno, os
last = None
for _ in range(10000):
    try:
        last = os.open('/dev/null', os.O_RDONLY)
    except OSError as e:
        print(last, errno.errorcode[e.errno])
        break
"""


def test_open_files_limit(limited):
    """Descriptors 0 .. max_open_files - 1 open (stdin, stdout, stderr included); one more is refused."""
    result = limited.run(OPEN_UNTIL_REFUSED)
    assert result.stdout.split() == [str(limited.limits.max_open_files - 1), "EMFILE"], result.stdout + result.stderr


WRITE_THE_CAP_THEN_ONE_BYTE = """import errno, os
with open('big', 'wb', buffering=0) as f:
    f.write(b'x' * {cap})
    try:
        f.write(b'x')
        print('one more byte written')
    except OSError as e:
        print(errno.errorcode[e.errno])
print(os.path.getsize('big'))
"""
FLOOD_STDOUT = """import os
written = 0
while written < 2**26:
    try:
        written += os.write(1, b'x' * 65536)
    except OSError as e:
        break
os.write(2, str(written).encode())
"""


def test_file_size_limit(limited):
    """A file may grow to `max_output_mb`, not one byte more; stdout is a file, so what the kernel accepted from a
    flood (counted by the program, not by what we read back) stops at the same cap."""
    cap = limited.limits.max_output_mb * 2**20
    result = limited.run(WRITE_THE_CAP_THEN_ONE_BYTE.format(cap=cap))
    assert result.stdout.split() == ["EFBIG", str(cap)], result.stdout + result.stderr
    flood = limited.run(FLOOD_STDOUT)
    assert (int(flood.stderr), len(flood.stdout), flood.limit) == (cap, cap, "file_size")


# ------------------------------------------------------------------------------------------------------------------
# Falling back without network isolation: warned once, marked on every result, refused in strict mode.


@pytest.fixture
def without_namespaces(monkeypatch):
    """This machine as one where `unshare` is not permitted (as root, Python must then be readable by nobody: the
    programs below import nothing, so they run even where it is not)."""
    monkeypatch.setattr(sandbox_module, "_namespace_prefix", lambda: None)
    monkeypatch.setattr(sandbox_module, "interpreter_hidden_paths", lambda: [])
    monkeypatch.setattr(sandbox_module, "_fallback_warned", False)
    monkeypatch.delenv(ISOLATION_ENV, raising=False)


def test_fallback_to_process_mode_warns_once_and_marks_results(without_namespaces, caplog):
    with caplog.at_level(logging.WARNING, logger=sandbox_module.__name__):
        fallback = Sandbox(timeout=2.0)
        Sandbox(timeout=2.0)
    warnings = [record.getMessage() for record in caplog.records if "network isolation" in record.getMessage()]
    assert len(warnings) == 1 and ISOLATION_ENV in warnings[0]
    result = fallback.run("print(6 * 7)")
    assert (fallback.isolation, result.isolation, result.stdout) == ("process", "process", "42\n")
    assert _sandboxed_processes(fallback) == []


def test_strict_isolation_refuses_to_fall_back(without_namespaces, monkeypatch, caplog):
    with pytest.raises(RuntimeError, match="isolation='namespaces'.*network access"):
        Sandbox(isolation="namespaces")
    monkeypatch.setenv(ISOLATION_ENV, "namespaces")
    with pytest.raises(RuntimeError, match="isolation='namespaces'"):
        Sandbox()
    monkeypatch.setenv(ISOLATION_ENV, "vm")
    with pytest.raises(ValueError, match=ISOLATION_ENV):
        Sandbox()
    assert not caplog.records  # refusing is not falling back


@needs_namespaces
def test_strict_isolation_runs_where_namespaces_work():
    assert Sandbox(isolation="namespaces").run("pass").isolation == "namespaces"


# ------------------------------------------------------------------------------------------------------------------
# The executor seam: a remote sandbox service replaces local child processes.


def test_executor_replaces_local_runs(monkeypatch):
    monkeypatch.setattr(Sandbox, "_run_locally", lambda self, job: pytest.fail("ran locally"))
    seen = []

    def service(job: Job, limits: Limits) -> RunResult:
        seen.append((job.code, limits))
        return RunResult("ok", 0, None, job.code.upper(), "", None, 0.01, isolation="remote")

    remote = Sandbox(timeout=3.0, cpu_seconds=2, memory_mb=64, max_processes=4, num_workers=3, executor=service)
    results = remote.run_many([Job("a"), Job("b", timeout=0.5), Job("c")])
    assert [(r.stdout, r.isolation) for r in results] == [("A", "remote"), ("B", "remote"), ("C", "remote")]
    limits = {code: limits for code, limits in seen}
    assert limits["a"] == Limits(
        timeout=3.0, cpu_seconds=2, memory_mb=64, max_processes=4, max_open_files=64, max_output_mb=16
    )
    assert limits["b"].timeout == 0.5  # a job's own timeout reaches the executor


def test_executor_failures_are_results_and_bad_executors_errors(caplog):
    def down(job, limits):
        raise ConnectionError("sandbox service unreachable")

    result = Sandbox(executor=down).run("print(1)")
    assert result.status == "executor_error" and "ConnectionError: sandbox service unreachable" in result.stderr
    assert "sandbox service unreachable" in caplog.text
    with pytest.raises(TypeError, match="must return a RunResult"):
        Sandbox(executor=lambda job, limits: {"stdout": "1"}).run("print(1)")
    with pytest.raises(TypeError, match="executor"):
        Sandbox(executor="http://sandbox:8080")
