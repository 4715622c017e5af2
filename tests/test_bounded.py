"""Helper subprocesses run with bounds (tools/engines/bounded.py): a hang kills the whole group, output is capped."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from agent.servers import pid_alive
from tests.procs import until
from tools.engines.bounded import run_bounded

# a wrapper (as `-o python=WRAPPER` may be) that starts a child and hangs: both must go when it overruns
HANGS = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_hanging_wrapper_is_killed_with_its_child(tmp_path):
    pid_file = tmp_path / "child"
    code = HANGS.replace("print(child.pid, flush=True)", f"open({str(pid_file)!r}, 'w').write(str(child.pid))")
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded([sys.executable, "-c", code], timeout=10)  # long enough for both to start on a busy host
    assert until(pid_file.exists, 10)
    child = int(pid_file.read_text())
    assert until(lambda: not pid_alive(child, None), 10), "the wrapper's child outlived it"


def test_output_beyond_the_cap_is_dropped_not_kept():
    done = run_bounded([sys.executable, "-c", "import sys; sys.stdout.write('x' * (5 * 2**20)); print('{}')"],
                       timeout=120, max_bytes=2**20)  # fmt: skip
    assert done.returncode == 0 and done.truncated and len(done.stdout) == 2**20
    small = run_bounded([sys.executable, "-c", "print('ok')"], timeout=120)
    assert (small.returncode, small.stdout.strip(), small.truncated) == (0, "ok", False)
