"""The fault suite: the faults found when pivot was attacked (issue 18), each held closed by a test here.

Every test fails without its fix. Kills happen at named points ($PIVOT_FAULT_KILL_AT, agent/servers.fault_point),
never by timing luck.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from agent import models as m
from agent.servers import FAULT_VAR
from agent.session import Paths, Session
from agent.store import Store
from tests.procs import one_big_level_plan, pivot_here

PIVOT = [sys.executable, "-m", "agent.cli"]
ROOT = Path(__file__).resolve().parent.parent


def _tagged(tag: str) -> list[int]:
    """Running processes whose environment carries TEST_TAG=tag (the test's own way to find what it started)."""
    needle = f"TEST_TAG={tag}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


def _kill_tagged(tag: str) -> None:
    for pid in _tagged(tag):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _wait_gone(tag: str, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _tagged(tag):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------------------------------------- 1


LAUNCHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from agent.session import Paths
    from agent.store import Store
    from tools.engines.process import LedgerLink, ManagedServer
    paths = Paths.from_env()
    store = Store(paths.db_path)
    store.acquire_session(sys.argv[1])
    server = ManagedServer(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        log_path=paths.logs_dir(sys.argv[1]) / "x.log", base_url="http://127.0.0.1:9", engine="command",
        env={"TEST_TAG": sys.argv[2]}, ledger=LedgerLink(store, sys.argv[1], None, paths),
    )
    server.start()
    print("not killed", flush=True)
    server.stop(grace_s=1)
    """
)


def test_1_server_spawned_by_a_pivot_killed_before_recording_it_is_stopped_on_next_open(paths, store, small_plan):
    store.create_session(m.Session(id="kill01", name="k", plan=small_plan, engine="command"))
    tag = uuid.uuid4().hex
    try:
        proc = subprocess.run(
            [sys.executable, "-c", LAUNCHER, "kill01", tag],
            env={**os.environ, FAULT_VAR: "spawned"},
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert store.servers("kill01") == []  # the ledger never heard of it
        assert _tagged(tag), "the spawned server should still run: nothing stopped it"
        session = Session.open(store, paths, "kill01")
        session.close()
        assert any("never recorded" in n for n in session.notices), session.notices
        assert _wait_gone(tag), "the unrecorded server was left running"
    finally:
        _kill_tagged(tag)


# ---------------------------------------------------------------------------------------------- 2

SGLANG_REFUSES = {  # flags -> SGLang 0.5.23's own words (sglang/srt/arg_groups/validation_hook.py)
    "--schedule-conservativeness -1": "schedule_conservativeness must be non-negative",
    "--page-size 3": "chunked_prefill_size must be divisible by page_size",
    "--page-size 99999999999999999999": "chunked_prefill_size must be divisible by page_size",
    "--chunked-prefill-size 100 --page-size 64": "chunked_prefill_size must be divisible by page_size",
    "--pp-max-micro-batch-size 0": "pp_max_micro_batch_size must be a positive integer",
}
TWIN_CANNOT = [
    "--max-running-requests 0",
    "--max-running-requests -1",
    "--max-prefill-tokens -1",
    "--mem-fraction-static nan",
    "--mem-fraction-static inf",
    "--mem-fraction-static 1e308",
    "--pp-size -1",
    "--tp-size -8",
    "--page-size 99999999999999999999 --chunked-prefill-size -1",
]


@pytest.mark.parametrize("flags", list(SGLANG_REFUSES))
def test_2_values_sglang_refuses_are_invalid_in_the_audit_and_refused_at_launch_in_its_words(flags, tmp_path):
    from tools.engines.catalog import audit, load_catalog
    from tools.engines.sim.engine import SimEngine, SimLaunchError

    config = m.ServerConfig.parse(["--tp-size", "8", *flags.split()])
    rows = audit(load_catalog("sglang", "0.5.23"), config)
    assert any(r.status == "invalid" and SGLANG_REFUSES[flags] in (r.message or "") for r in rows), rows
    with pytest.raises(SimLaunchError) as info:  # forced past the audit gate: the twin refuses in SGLang's words
        SimEngine().launch(config, tmp_path / "x.log", force=True)
    assert info.value.failure == "argument-validation" and SGLANG_REFUSES[flags] in info.value.message


@pytest.mark.parametrize("flags", TWIN_CANNOT)
def test_2_values_the_twin_cannot_simulate_are_a_clear_startup_error(flags, tmp_path):
    from tools.engines.sim.engine import SimEngine, SimLaunchError

    config = m.ServerConfig.parse(["--tp-size", "8", *flags.split()])
    with pytest.raises(SimLaunchError) as info:
        SimEngine().launch(config, tmp_path / "x.log")
    assert info.value.failure == "not-simulable" and "cannot simulate" in info.value.message


def test_2_every_twin_loop_is_bounded():
    """Limits under which nothing can be admitted end at once instead of spinning at 100% CPU."""
    import threading

    import numpy as np

    from tools.engines.sim.scheduler import SchedulerLimits, SimulationStuck, simulate_level
    from tools.engines.sim.twin import Twin

    twin = Twin.build("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, m.ServerConfig.parse(["--tp-size", "8"]))
    outcome: list[object] = []

    def run(limits: SchedulerLimits) -> None:
        try:
            simulate_level(twin.cost, limits, max_concurrency=4, input_lens=np.full(4, 64),
                           output_lens=np.full(4, 8))  # fmt: skip
            outcome.append("returned")
        except SimulationStuck as e:
            outcome.append(e)

    for limits in (
        SchedulerLimits(max_running_requests=0, kv_capacity_tokens=10_000, chunked_prefill_size=512,
                        max_prefill_tokens=512),
        SchedulerLimits(max_running_requests=8, kv_capacity_tokens=10_000, chunked_prefill_size=512,
                        max_prefill_tokens=-1),
    ):  # fmt: skip
        outcome.clear()
        worker = threading.Thread(target=run, args=(limits,), daemon=True)
        worker.start()
        worker.join(10)
        assert not worker.is_alive(), f"the scheduler spins with {limits}"
        assert isinstance(outcome[0], SimulationStuck), outcome


@pytest.mark.parametrize(
    ("sig", "inside"),
    [(signal.SIGTERM, "launch_server(baseline=True)"), (signal.SIGINT, "benchmarking levels")],
    ids=["SIGTERM-in-a-prediction", "SIGINT-in-a-level"],
)
def test_2_sigterm_and_sigint_end_the_in_process_sim_engine_promptly(sig, inside, pivot_home, tmp_path):
    """Inside the twin's prediction of the baseline (a worker thread, before the launch line) or inside the level
    the in-process engine measures: either ends within a moment of the signal."""
    plan = one_big_level_plan(tmp_path)
    proc = subprocess.Popen([*PIVOT, "run", str(plan)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)  # fmt: skip
    try:
        for line in proc.stderr:
            if inside in line:
                break
        time.sleep(1.0)  # well inside the prediction or the level
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The target is one second (benchmarks/, not here: a busy host must not fail a test). Before the fix the level ran
    # to its end and its run was recorded; so did the prediction, and the launch after it: nothing may be measured.
    print(f"pivot ended {took:.1f} s after {sig.name}")
    with Store(Paths.from_env().db_path) as store:
        (record,) = store.list_sessions()
        assert not any(store.bench_results(e.id or 0) for e in store.experiments(record.id))
    assert proc.returncode in (128 + sig, 130, 1, -sig), proc.returncode
    (summary,) = Store(Paths.from_env().db_path).session_summaries()
    assert summary.status == "stopped"


# ---------------------------------------------------------------------------------------------- 3

HOLDER = textwrap.dedent(
    """
    import sys, time
    from agent.store import Store
    store = Store(sys.argv[1])
    store.acquire_session(sys.argv[2])
    print("locked", flush=True)
    time.sleep(120)
    """
)


def test_3_unlock_force_refuses_while_the_owner_is_alive_here_and_says_how_to_stop_it(paths, store, small_plan):
    store.create_session(m.Session(id="lock09", name="x", plan=small_plan, engine="sim"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(paths.db_path), "lock09"], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        proc = pivot_here("unlock", "lock09", "--force")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert f"in use by pid {holder.pid}, which is running on this host" in proc.stderr
        assert f"kill {holder.pid}" in proc.stderr and "Ctrl-C" in proc.stderr
        assert "--force" not in proc.stderr  # the old hint suggested it
        assert store.session_lock("lock09") == holder.pid  # still the live run's
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------------------------------------- 4

FOREIGN = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *a):
            pass
    s = http.server.HTTPServer(("127.0.0.1", 0), H)
    print(s.server_address[1], flush=True)
    s.serve_forever()
    """
)


@pytest.fixture
def foreign_server():
    """Another process's server answering /health 200 on a port: (its port)."""
    proc = subprocess.Popen([sys.executable, "-c", FOREIGN], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def test_4_an_occupied_port_is_refused_before_launch(foreign_server, tmp_path):
    from tools.engines.process import ServerStartError
    from tools.engines.sglang import SGLangEngine

    engine = SGLangEngine(command=[sys.executable, "-c", "import time; time.sleep(60)"], require_model=False)
    with pytest.raises(ServerStartError) as info:
        engine.launch(m.ServerConfig.parse(["--port", str(foreign_server)]), tmp_path / "x.log")
    assert info.value.failure == "port-in-use" and f":{foreign_server}" in info.value.message


@pytest.mark.parametrize("ready_line", ["SGLang's", None], ids=["sglang-ready-line", "no-ready-line"])
def test_4_another_process_answering_health_is_never_taken_for_the_server(
    foreign_server, tmp_path, monkeypatch, ready_line
):
    """The port check passed (the other server came up after it): /health 200 without the ready line from a
    socket that is not the server's own does not make it ready, whether the engine prints a ready line (SGLang,
    hidden here) or none at all (a plugin engine, the command engine)."""
    from tools.engines import process
    from tools.engines.process import ManagedServer, ServerStartError
    from tools.engines.sglang import READY_LINE

    monkeypatch.setattr(process, "READY_LINE_GRACE_S", 0.3)
    monkeypatch.setattr(process, "port_answers", lambda url, timeout_s=0.5: False, raising=False)
    server = ManagedServer([sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "s.log",
                           base_url=f"http://127.0.0.1:{foreign_server}", engine="sglang", stop_grace_s=2,
                           ready_line=READY_LINE if ready_line else None)  # fmt: skip
    server.start()
    try:
        with pytest.raises(ServerStartError) as info:
            server.wait_ready(3.0)
        assert info.value.failure == "startup-timeout" and not server.ready
    finally:
        server.stop(grace_s=1)


# ---------------------------------------------------------------------------------------------- 5


def test_5_a_ledger_damaged_in_its_middle_pages_is_refused_and_truly_left_untouched(paths, small_plan):
    import hashlib

    from agent.errors import LedgerError

    with Store(paths.db_path) as store:
        store.create_session(m.Session(id="dmg001", name="d", plan=small_plan, engine="sim"))
        store.append_messages("dmg001", [f'{{"n": {i}, "pad": "{"x" * 400}"}}' for i in range(2000)])
    data = bytearray(paths.db_path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    pages = len(data) // page
    assert pages > 20
    middle = (pages // 2) * page
    data[middle : middle + page] = os.urandom(page)  # one middle page of the messages' b-tree
    paths.db_path.write_bytes(bytes(data))
    digest = hashlib.sha256(paths.db_path.read_bytes()).hexdigest()
    with pytest.raises(LedgerError, match="damaged"):
        Store(paths.db_path)
    proc = pivot_here("run", "glm5-nvfp4-rtxpro6000x8", "--concurrency", "1")
    assert proc.returncode == 1 and "damaged" in proc.stderr and "left untouched" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert hashlib.sha256(paths.db_path.read_bytes()).hexdigest() == digest  # what the message says is true


# ---------------------------------------------------------------------------------------------- 6


@pytest.fixture
def read_only():
    """Make a directory read-only for this process: chmod for a normal user, a read-only bind mount for root."""
    done: list[tuple[str, Path]] = []

    def make(path: Path) -> None:
        if os.geteuid() != 0:
            for p in [path, *path.rglob("*")]:
                p.chmod(p.stat().st_mode & ~0o222)
            done.append(("chmod", path))
            return
        ok = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], capture_output=True).returncode
        if ok != 0:
            pytest.skip("root without the right to bind-mount read-only: no way to make a read-only directory")
        done.append(("mount", path))

    yield make
    for how, path in reversed(done):
        if how == "mount":
            subprocess.run(["umount", str(path)], check=True)
        else:
            for p in [path, *path.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)


def _one_line_and_a_hint(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), proc.stderr
    assert "writable" in lines[1]


def test_6_a_read_only_home_gives_one_line_and_a_hint_for_every_write_command(tmp_path, small_plan, read_only):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    used = tmp_path / "used"
    with Store(used / "state" / "pivot.db") as store:
        store.create_session(m.Session(id="ro0001", name="r", plan=small_plan, engine="sim"))
    read_only(fresh)
    read_only(used)
    run = ["run", "glm5-nvfp4-rtxpro6000x8", "--concurrency", "1"]
    for home, command in ((fresh, ["demo"]), (fresh, run), (used, run), (used, ["summary", "ro0001", "--html"]),
                          (used, ["unlock", "ro0001"])):  # fmt: skip
        proc = pivot_here("--home", str(home), *command)
        _one_line_and_a_hint(proc)
        assert "damaged" not in proc.stderr  # a read-only ledger is not a damaged one


def test_6_a_read_only_docs_out_gives_one_line_and_a_hint(tmp_path, small_plan, read_only):
    home = tmp_path / "home"
    with Store(home / "state" / "pivot.db") as store:
        store.create_session(m.Session(id="ro0002", name="r", plan=small_plan, engine="sim"))
    (home / "docs_out").mkdir()
    read_only(home / "docs_out")
    proc = pivot_here("--home", str(home), "summary", "ro0002", "--html")
    _one_line_and_a_hint(proc)


# ---------------------------------------------------------------------------------------------- 7


def test_7_resume_completes_a_status_summary_whose_html_and_charts_a_kill_left_unwritten(paths):
    killed = subprocess.run([*PIVOT, "demo"], env={**os.environ, FAULT_VAR: "status-markdown-written"},
                            capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with Store(paths.db_path) as store:
        (session,) = store.list_sessions()
    docs = paths.docs_dir(session.id)
    assert (docs / "status-001.md").exists() and not (docs / "status-001.html").exists()
    proc = pivot_here("resume", session.id)
    assert proc.returncode == 0, proc.stderr
    assert (docs / "status-001.html").exists()
    charts = sorted(p.name for p in (docs / "charts").glob("status-001-*.png"))
    assert charts and all(f"charts/{name}" in (docs / "status-001.html").read_text() for name in charts)
    with Store(paths.db_path) as store:
        recorded = {d.path for d in store.documents(session.id)}
    assert f"docs_out/{session.id}/status-001.html" in recorded


# ---------------------------------------------------------------------------------------------- 8


def test_8_a_kill_mid_benchmark_leaves_a_server_that_resume_stops_then_reruns_the_level_keeping_the_raw_file(
    paths, tmp_path
):
    """SIGKILL of pivot between two levels of the baseline's benchmark on sim-http: its server is left running and
    recorded so; `resume` stops it, relaunches the baseline in place (never recorded twice), and the raw file holds
    the ledger's levels, the abandoned attempt kept beside it under its own name."""
    from tests.test_agent import TEST_PLAN
    from tools.loadgen import read_jsonl

    plan = tmp_path / "plan.toml"
    plan.write_text(TEST_PLAN.replace("concurrency = [1, 32, 128]", "concurrency = [4, 8, 16]"))
    args = [*PIVOT, "run", str(plan), "--engine", "sim-http", "-o", "time_scale=20", "-q"]
    killed = subprocess.run(args, env={**os.environ, FAULT_VAR: "raw-level-written"}, capture_output=True,
                            text=True, timeout=180, cwd=ROOT)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with Store(paths.db_path) as store:
        (session,) = store.list_sessions()
        left = store.servers(session.id, running_only=True)
    assert left, "the killed run had a server up"
    raw = paths.raw_dir(session.id)
    assert len(read_jsonl(raw / "exp001-run1.jsonl")) == 1  # the level written before the kill
    resumed = pivot_here("resume", session.id)
    assert resumed.returncode == 0, resumed.stderr
    assert "stopped" in resumed.stderr or "left running" in resumed.stderr or "reap" in resumed.stderr.lower()
    for srv in left:
        assert not Path(f"/proc/{srv.pid}").exists() or "Z" in Path(f"/proc/{srv.pid}/stat").read_text().split()[2]
    with Store(paths.db_path) as store:
        assert store.servers(session.id, running_only=True) == []
        base = [e for e in store.experiments(session.id) if e.kind == "baseline"]
        assert len(base) == 1 and base[0].verdict == "baseline"  # relaunched in place, not run twice
        assert store.open_pivot(session.id) is not None
        (first, *_) = store.bench_results(base[0].id or 0)
    assert [lv.max_concurrency for lv in read_jsonl(raw / "exp001-run1.jsonl")] == [
        lv.max_concurrency for lv in first.levels
    ]
    assert len(read_jsonl(raw / "exp001-run1.abandoned-1.jsonl")) == 1  # the abandoned attempt, marked as such


# ---------------------------------------------------------------------------------------------- 9


def _low_open_files() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def test_9_a_concurrency_this_host_cannot_open_is_refused_before_anything_is_launched(paths):
    proc = subprocess.run([*PIVOT, "run", "glm5-nvfp4-rtxpro6000x8", "--engine", "sim-http", "--concurrency",
                           "1,100000"], capture_output=True, text=True, timeout=180, cwd=ROOT,
                          preexec_fn=_low_open_files)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "concurrency 100000 cannot be benchmarked here" in proc.stderr and "nothing was launched" in proc.stderr
    with Store(paths.db_path) as store:
        assert store.list_sessions() == []  # no session left active, no experiment left running, no server


# ---------------------------------------------------------------------------------------------- 10

KEYS = {
    "PIVOT_MODEL_API_KEY": "pivot-model-key-0123456789",
    "OPENAI_API_KEY": "sk-openai0123456789abcdef",
    "ANTHROPIC_API_KEY": "sk-ant-0123456789abcdef",
}

# A server that logs the Authorization header of every request and answers every generation request with an SSE
# error echoing it (as a server that refuses a key may): the attack's 401 body, in a form the client reads.
ECHO = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def _answer(self):
            auth = self.headers.get("Authorization")
            print("auth:", auth, flush=True)
            if self.path == "/health":
                body, kind = b"ok", "text/plain"
            else:
                body = ('data: {"error": {"message": "invalid key: ' + str(auth) + '"}}\\n\\n').encode()
                kind = "text/event-stream"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self._answer()
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer()
        def log_message(self, *a):
            pass
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def test_10_servers_get_no_model_keys_and_pivot_run_sends_no_authorization(tmp_path, monkeypatch):
    from tools.engines.http import HttpDeployment
    from tools.engines.process import ManagedServer, free_port

    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_TOKEN", "hf_kept_for_gated_weights")
    port = free_port()
    server = ManagedServer([sys.executable, "-c", ECHO, str(port)], log_path=tmp_path / "s.log",
                           base_url=f"http://127.0.0.1:{port}", engine="command", ready_line=None,
                           stop_grace_s=2)  # fmt: skip
    server.start()
    try:
        server.wait_ready(30)
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().decode()
        assert not any(f"{name}=" in environ for name in KEYS), "a model key reached the server's environment"
        assert "HF_TOKEN=hf_kept_for_gated_weights" in environ
        spec = m.BenchSpec(concurrency=[2], random_input_len=8, random_output_len=4, warmup_requests=0)
        result = HttpDeployment(server, engine="command", warmup_pause_s=0).benchmark(spec)
        log = server.log_path.read_text()
        assert "auth: None" in log and "Bearer" not in log  # pivot run's benchmark: no Authorization header
        assert result.levels[0].failed == spec.prompts_for(2)
    finally:
        server.stop(grace_s=1)


def test_10_pivot_bench_keeps_bench_servings_header_and_redacts_echoed_keys(tmp_path, monkeypatch):
    from tools import loadgen
    from tools.engines.process import free_port

    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", ECHO, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if subprocess.run(["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))"],
                              capture_output=True).returncode == 0:  # fmt: skip
                break
            time.sleep(0.1)
        spec = m.BenchSpec(concurrency=[2], random_input_len=8, random_output_len=4, warmup_requests=0)
        result = loadgen.benchmark(f"http://127.0.0.1:{port}", spec, warmup_pause_s=0)
        (level,) = result.levels
        assert level.failed == spec.prompts_for(2)
        reasons = " ".join(level.errors)
        assert "invalid key" in reasons and "[redacted]" in reasons
        assert not any(value in reasons for value in KEYS.values()), reasons
    finally:
        proc.kill()
        out = proc.communicate()[0]
    assert f"auth: Bearer {KEYS['OPENAI_API_KEY']}" in out  # bench_serving's behaviour, kept for pivot bench


# ---------------------------------------------------------------------------------------------- 11


def test_11_answers_are_quoted_shortened_and_escaped_in_later_questions(paths):
    demo = pivot_here("demo", "--json")
    assert demo.returncode == 0, demo.stderr
    with Store(paths.db_path) as store:
        (session,) = store.list_sessions()
    long_answer = "\x1b[2J\x1b]0;owned\x07" + "please try something clever " * 400  # 11 KB and escape sequences
    with Store(paths.db_path) as store:
        asked = store.open_pivot(session.id).question
    for _ in range(2):  # refused, one line, nothing recorded: the question stays as it was asked
        proc = pivot_here("resume", session.id, "--answer", long_answer)
        assert proc.returncode == 1, proc.stderr
        assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr
        assert "\\x1b[2J" in proc.stderr and "I did not understand" in proc.stderr  # shown, escaped, not executed
        assert len(proc.stderr) < 2000, len(proc.stderr)
        with Store(paths.db_path) as store:
            assert store.open_pivot(session.id).question == asked


def test_2_sim_http_says_not_simulable_too(tmp_path):
    """`pivot sim serve` (the sim-http engine) refuses the same values, and its log is classified the same."""
    from tools.engines.process import ServerStartError
    from tools.engines.sim.http_engine import sim_http_engine

    deployment = sim_http_engine(time_scale=50, startup_s=0.1).launch(
        m.ServerConfig.parse(["--tp-size", "-8"]), tmp_path / "x.log"
    )
    try:
        with pytest.raises(ServerStartError) as info:
            deployment.wait_ready(60)
        assert info.value.failure == "not-simulable", info.value.log_tail
    finally:
        deployment.stop()
