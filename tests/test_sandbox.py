"""The code sandbox: normal runs, limits, and hostile programs that must not harm, hang or outlive the trainer."""

from __future__ import annotations

import os
import socket
import time

import pytest

from trl_mintrl.rewards.sandbox import Job, Sandbox, _namespace_prefix, interpreter_hidden_paths

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


def test_infinite_loop_is_stopped_by_the_wall_clock(sandbox):
    start = time.monotonic()
    result = sandbox.run("while True:\n    pass", timeout=1.0)
    assert result.status == "timeout"
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
    assert result.status == "error" and "File too large" in result.stderr
    assert 0 < len(result.stdout) <= sandbox.max_output_bytes


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
    [({"timeout": 0}, "timeout"), ({"memory_mb": -1}, "memory_mb"), ({"isolation": "vm"}, "isolation")],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sandbox(**kwargs)
