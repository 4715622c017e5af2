"""The process machinery every HTTP engine shares: launch an argv, wait until it is ready, stop it, stop all on exit.

A server is launched from an argv list (never a shell string) in its own process group and session, with its
stdout and stderr in a log file under the session's state dir, and recorded in the ledger (pid, pgid, the pid's
start time, URL, argv, log) as starting, then ready, then stopped or crashed with a classified failure
(tools/engines/failures.py). Its environment carries the session's mark (agent/servers.py), so a pivot killed
before recording it still leaves a server the next `Session.open` finds and stops; it has no model API keys.
A port that already answers before launch is refused, so another process's server is never taken for ours.
Readiness is `/health` answering 200 and, for SGLang, the ready line in the log (without the line, the socket
listening on the port must belong to the server's process group); an exit while starting is noticed on the next poll and raised with the classified reason and the log's tail.
Stopping sends SIGTERM to the whole group, waits a grace period, then SIGKILLs what is left. A server launched on
this host gets a temporary directory of its own (TMPDIR, TMP, TEMP; vLLM leaves its `vllm_dist_*` stores there),
removed once it has stopped, so a campaign leaves nothing in the host's temp directory.

No server outlives pivot: while any runs, SIGINT and SIGTERM handlers stop every server (then raise
KeyboardInterrupt, or exit 128+signal), and an atexit hook stops them on a normal exit or an exception. A pivot
killed with SIGKILL leaves them running; the next `Session.open` of that session stops them (agent/servers.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from agent import models as m
from agent.contracts import LedgerLink, ProgressCallback
from agent.errors import Interrupted, LaunchFailed, PivotError, is_secret_name
from agent.servers import FAULT_VAR, MARK_VAR, fault_point, group_members, proc_start, server_mark, stop_group
from tools.engines.failures import ANSI, COMMON_RULES, UNKNOWN, FailureRule, diagnose, short_line
from tools.tls import tls_context

DEFAULT_STOP_GRACE_S = 30.0  # SIGTERM to SIGKILL: SGLang tears down its scheduler processes and NCCL in this time
DEFAULT_READY_TIMEOUT_S = 1800.0  # a large MoE model loads and captures CUDA graphs for minutes
POLL_S = 0.2  # readiness loop: process, log and /health once per turn
HEALTH_TIMEOUT_S = 1.0  # per /health request, so an exit is never noticed later than this
READY_LINE_GRACE_S = 5.0  # /health has answered 200 this long but no ready line: the log level hides it
PROGRESS_INTERVAL_S = 1.0
CLASSIFY_LINES = 200  # lines of the log's tail the crash classifier reads
TAIL_BYTES = 256 * 1024


# ---------------------------------------------------------------------------------------------- errors


class ServerStartError(LaunchFailed):
    """The server did not become ready: it exited (with a classified `failure`) or did not answer in time."""

    def __init__(
        self,
        message: str,
        *,
        failure: str,
        log_tail: list[str],
        log_path: Path,
        exit_code: int | None = None,
    ) -> None:
        shown = "\n".join(short_line(line, 300) for line in log_tail[-15:])
        super().__init__(message, hint=f"the server's last log lines:\n{shown}\nfull log: {log_path}", failure=failure)
        self.log_tail, self.log_path, self.exit_code = log_tail, log_path, exit_code


class FlagsRefused(PivotError):
    """The flag audit found flags the engine would refuse; nothing was launched."""

    def __init__(self, engine: str, issues: list[m.FlagIssue]) -> None:
        rows = "; ".join(f"{i.flag} is {i.status}: {i.message}" if i.message else f"{i.flag} is {i.status}"
                         for i in issues)  # fmt: skip
        # the class a launch would record (tools/experiments.py REFUSAL_CLASS says the same)
        self.failure = {"unknown": "unrecognized-argument", "ambiguous": "ambiguous-argument"}.get(
            issues[0].status if issues else "", "argument-validation"
        )
        super().__init__(
            f"{engine} would refuse these flags ({self.failure}), so the server was not launched: {rows}",
            hint="fix the flags, or launch with force=True (--force) to let the server refuse them itself",
        )
        self.issues = issues


# ---------------------------------------------------------------------------------------------- log files


def read_tail(path: Path, n: int, *, start: int = 0) -> list[str]:
    """The last `n` lines of a log file written from byte `start` on (carriage-return progress bars split too)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            begin = max(start, size - max(TAIL_BYTES, n * 512))
            f.seek(begin)
            data = f.read()
    except OSError:
        return []
    lines = [ANSI.sub("", line) for line in data.decode("utf-8", "replace").splitlines()]
    if begin > start and lines:
        lines = lines[1:]  # the first line was cut by the seek
    lines = [line for line in lines if line.strip()]
    return lines[-n:] if n > 0 else []


class _LogFollower:
    """Reads a log file's new complete lines as it grows: for the ready line and the last line shown in progress."""

    def __init__(self, path: Path, start: int) -> None:
        self.path, self.offset, self.partial, self.last = path, start, b"", ""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(4 * 1024 * 1024)
        except OSError:
            return []
        self.offset += len(data)
        chunks = (self.partial + data).replace(b"\r", b"\n").split(b"\n")
        self.partial = chunks.pop()
        lines = [ANSI.sub("", c.decode("utf-8", "replace")) for c in chunks]
        lines = [line for line in lines if line.strip()]
        if lines:
            self.last = lines[-1]
        return lines


# ---------------------------------------------------------------------------------------------- stop on exit

_live: dict[int, ManagedServer] = {}
_registry_lock = threading.RLock()
_previous_handlers: dict[int, Any] = {}
_pinned = False  # install_signal_handlers() was called: keep the handlers when no server runs
_atexit_installed = False
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_signals_received = 0  # SIGINT/SIGTERM handled so far: in-process work (the sim engine) stops when it grows
_stopping = False  # one of them came since pivot's handlers were last installed: the program is on its way out
handle_signals = True  # set False where the embedding program owns SIGINT/SIGTERM (it must stop servers itself)


def signals_received() -> int:
    """How many SIGINT/SIGTERM pivot's handlers have taken so far: work running in a thread (the in-process sim
    engine's benchmark) compares it with the count when it began, and stops when it has grown."""
    return _signals_received


def stopping() -> bool:
    """Whether a SIGINT or SIGTERM has come since pivot's handlers were last installed: the program is stopping, so a
    tool still running in a worker thread (the main thread already said "interrupted") starts nothing new."""
    return _stopping


def live_servers() -> list[ManagedServer]:
    """The servers this process started and has not stopped yet."""
    with _registry_lock:
        return list(_live.values())


def _register(server: ManagedServer) -> None:
    global _atexit_installed
    with _registry_lock:
        _live[id(server)] = server
        if not _atexit_installed:
            atexit.register(stop_all)
            _atexit_installed = True
        _install_handlers()


def _unregister(server: ManagedServer) -> None:
    with _registry_lock:
        _live.pop(id(server), None)
        if not _live and not _pinned:
            _restore_handlers()


def install_signal_handlers() -> None:
    """Install the SIGINT/SIGTERM handlers now, from the main thread, and keep them.

    Servers launched from the main thread get them anyway; a program that launches servers from worker
    threads (where signal handlers cannot be installed) calls this first, in its main thread.
    """
    global _pinned
    if threading.current_thread() is not threading.main_thread():
        raise PivotError("signal handlers can only be installed from the main thread")
    with _registry_lock:
        _pinned = True
        _install_handlers()


def _install_handlers() -> None:
    global _stopping
    if not handle_signals or _previous_handlers or threading.current_thread() is not threading.main_thread():
        return
    _stopping = False
    for sig in HANDLED_SIGNALS:
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:
            continue  # whoever started pivot asked for this signal to be ignored
        _previous_handlers[sig] = previous
        signal.signal(sig, _on_signal)


def _restore_handlers() -> None:
    if not _previous_handlers or threading.current_thread() is not threading.main_thread():
        return
    for sig, previous in list(_previous_handlers.items()):
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        del _previous_handlers[sig]


def _on_signal(signum: int, frame: Any) -> None:
    """SIGINT or SIGTERM while servers run: stop them all (no ledger writes here), then do what the signal meant."""
    global _signals_received, _stopping
    _signals_received += 1
    _stopping = True
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    servers = live_servers()
    _restore_handlers()  # a second Ctrl-C while stopping interrupts the wait; atexit then finishes the job
    _terminate(servers)
    if callable(previous) and previous is not signal.default_int_handler:
        previous(signum, frame)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _terminate(servers: Sequence[ManagedServer]) -> None:
    """SIGTERM every server's group at once, wait for the longest grace, SIGKILL what is left; the ledger is
    written later by stop() (a signal may arrive in the middle of a ledger transaction)."""
    running = [s for s in servers if s.started]
    for s in running:
        s._stopping = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.pgid, signal.SIGTERM)
    deadline = time.monotonic() + max((s.stop_grace_s for s in running), default=0.0)
    pending = list(running)
    while pending and time.monotonic() < deadline:
        pending = [s for s in pending if group_members(s.pgid, started_since=s.proc_start)]
        if pending:
            time.sleep(0.05)
    for s in pending:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.pgid, signal.SIGKILL)


def stop_all() -> None:
    """Stop every server this process started, all at once (the atexit hook; also safe to call by hand)."""
    servers = live_servers()
    for server in servers:
        server.poll()  # one that already exited on its own is recorded as crashed, not as stopped
    _terminate(servers)
    for server in servers:
        try:
            server.stop()
        except Exception as e:  # at exit, the ledger may be closed already: the next Session.open records it
            with contextlib.suppress(Exception):
                os.write(2, f"pivot: while stopping server pid {server.pid}: {e}\n".encode())


# ---------------------------------------------------------------------------------------------- one server

# Never passed on to a launched server: the keys of the model that drives pivot and of the model providers (a server
# under test has no use for them, and its logs, crash dumps and /proc are read by others on a shared host), and
# pivot's own test hooks. HF_TOKEN stays: SGLang needs it to download gated weights.
# The rule, not a list (a list always misses the next provider): every variable whose name says it holds a secret
# (agent/errors.py's is_secret_name: ..._API_KEY, ..._KEY, ..._TOKEN, ...SECRET..., ...PASSWORD, ...CREDENTIALS,
# AWS's access keys) but the ones a server needs (KEPT_SECRETS), and pivot's own test hooks.
KEPT_SECRETS = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
MODEL_KEY_VARS = frozenset({FAULT_VAR})  # stripped too, whatever its name


def passed_on(name: str) -> bool:
    """Whether a variable of pivot's environment is passed on to what it launches (servers, Ray's processes)."""
    return name not in MODEL_KEY_VARS and (name in KEPT_SECRETS or not is_secret_name(name))


def server_environ() -> dict[str, str]:
    """This process's environment without any secret but the ones a server needs (`passed_on`): what a launched
    server, a keeper and a local Ray instance inherit."""
    return {k: v for k, v in os.environ.items() if passed_on(k)}


@contextlib.contextmanager
def scrubbed_environ(keep: Sequence[str] = ()) -> Iterator[None]:
    """This process's environment without what `passed_on` refuses (but `keep`), for the time of a call that starts
    processes which inherit it as it is (ray.init); put back afterwards."""
    held = {k: v for k, v in os.environ.items() if not passed_on(k) and k not in keep}
    for k in held:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(held)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now at `host`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_answers(base_url: str, timeout_s: float = 0.5) -> bool:
    """Whether something already accepts TCP connections at the URL's host and port."""
    parts = urlsplit(base_url)
    if parts.hostname is None:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _listen_inodes(port: int) -> set[str]:
    """Inodes of the sockets listening on TCP `port` on this host (/proc/net/tcp and tcp6); empty without /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def group_listens(pgid: int, port: int, *, started_since: str | None = None) -> bool | None:
    """Whether a process of group `pgid` holds the socket listening on `port`; None when this host cannot say
    (no /proc, or the server runs elsewhere: a container, another host)."""
    inodes = _listen_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in group_members(pgid, started_since=started_since):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd) in wanted:
                    return True
    return False


def url_for(host: str, port: int) -> str:
    """The base URL a client uses for a server bound to host:port (a wildcard address is reached on loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ManagedServer:
    """One server process pivot started: its own process group, its log file, its ledger row, its readiness."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        base_url: str,
        engine: str,
        health_url: str | None = None,
        host: str = "127.0.0.1",
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        ready_line: str | None = None,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        ledger: LedgerLink | None = None,
        failure_rules: Sequence[FailureRule] = COMMON_RULES,
        owner_check: bool = True,
    ) -> None:
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise PivotError(f"a server command must be a non-empty list of strings, got {argv!r}")
        self.argv = list(argv)
        self.log_path, self.base_url, self.engine, self.host = Path(log_path), base_url.rstrip("/"), engine, host
        self.health_url = health_url if health_url is not None else self.base_url + "/health"
        self.env = dict(env or {})
        self.cwd = cwd
        self.ready_line, self.stop_grace_s, self.health_timeout_s = ready_line, stop_grace_s, health_timeout_s
        self.ledger, self.failure_rules = ledger, tuple(failure_rules)
        self.owner_check = (
            owner_check  # False behind a launch prefix (docker exec, ssh): the socket's owner is elsewhere
        )
        self.server_id: int | None = None
        self.pid = self.pgid = -1
        self.proc_start: str | None = None
        self.ready = False
        self.failure: str | None = None  # the classified reason it failed, once it has
        self.failure_line: str | None = None
        self.exit_code: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._lock = threading.RLock()
        self._stopping = False  # pivot is stopping it: its exit is not a crash
        self._exit_recorded = False
        self._stopped = False
        self._tmp: str | None = None  # the server's own temporary directory, removed once it has stopped

    @property
    def started(self) -> bool:
        return self._proc is not None

    def start(self) -> None:
        """Start the process in its own process group and session, log to log_path, record it in the ledger."""
        if self._proc is not None:
            raise PivotError("this server was started already")
        if stopping():  # a tool or task still running in a thread after Ctrl-C or SIGTERM starts no process
            raise Interrupted(f"interrupted: pivot is stopping, so {self.engine} was not launched")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if port_answers(self.base_url):
            message = f"something already listens at {self.base_url}, so {self.engine} was not launched there"
            self.failure = "port-in-use"
            raise ServerStartError(
                message,
                failure="port-in-use",
                log_tail=[message],
                log_path=self.log_path,
            )
        env = {**server_environ(), "PYTHONUNBUFFERED": "1", **self.env}
        if self.ledger is not None:  # found by the next Session.open even if pivot dies before recording it
            env[MARK_VAR] = server_mark(self.ledger.store.path, self.ledger.session_id)
        if self.owner_check and "TMPDIR" not in self.env:  # on this host (not behind docker exec or ssh)
            self._tmp = tempfile.mkdtemp(prefix=f"pivot-{self.engine}-")
            env |= {"TMPDIR": self._tmp, "TMP": self._tmp, "TEMP": self._tmp}
        with self.log_path.open("ab") as log:
            self._log_start = log.tell()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except FileNotFoundError as e:
                self._remove_tmp()
                raise LaunchFailed(  # the engine's own class for it, as a log saying `command not found` gets
                    f"cannot launch {self.engine}: {self.argv[0]!r} was not found",
                    hint="install it, or point the engine at it (python, prefix or command options)",
                    failure="engine-not-installed",
                ) from e
            except OSError as e:
                self._remove_tmp()
                raise PivotError(f"cannot launch {self.engine}: {self.argv[0]!r}: {e.strerror or e}") from e
        fault_point("spawned")
        self.pid = self.pgid = self._proc.pid  # start_new_session: it leads its own session and process group
        self.proc_start = proc_start(self.pid)
        _register(self)
        if self.ledger is not None:
            try:
                record = self.ledger.store.add_server(
                    m.ServerProcess(
                        session_id=self.ledger.session_id,
                        experiment_id=self.ledger.experiment_id,
                        engine=self.engine,
                        pid=self.pid,
                        pgid=self.pgid,
                        proc_start=self.proc_start,
                        host=self.host,
                        base_url=self.base_url,
                        argv=self.argv,
                        log_path=self.ledger.path(self.log_path),
                    )
                )
            except BaseException:
                self.stop(grace_s=2.0)
                raise
            self.server_id = record.id

    def _record(self, status: m.ServerStatus, failure: str | None = None) -> None:
        if self.ledger is not None and self.server_id is not None:
            self.ledger.store.update_server(self.server_id, status=status, failure=failure)

    # ---- state

    def poll(self) -> int | None:
        """The exit code once the process has exited (recording a crash when pivot did not stop it), else None."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is not None and not self._stopping and not self._exit_recorded:
            with self._lock:
                if not self._exit_recorded:
                    self._record_crash(code)
        return code

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self._proc is not None and self.poll() is None

    def _record_crash(self, code: int) -> None:
        diagnosis = diagnose(self.log_tail(CLASSIFY_LINES), self.failure_rules)
        self.failure, self.failure_line, self.exit_code = diagnosis.failure, diagnosis.line, code
        self._exit_recorded = True
        self._record("crashed", diagnosis.failure)

    def log_tail(self, n: int = 50) -> list[str]:
        """The last `n` lines this server wrote to its log."""
        return read_tail(self.log_path, n, start=self._log_start)

    def exit_text(self) -> str:
        """How the process ended, in words: `exit code 1` or `killed by SIGKILL`."""
        code = self.exit_code if self.exit_code is not None else (self._proc.returncode if self._proc else None)
        if code is None:
            return "still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    # ---- readiness

    def _health(self, client: httpx.Client) -> int | None:
        try:
            return client.get(self.health_url).status_code
        except httpx.HTTPError:
            return None

    def wait_ready(self, timeout_s: float, on_progress: ProgressCallback | None = None) -> None:
        """Return once /health answers 200 and the ready line is logged; raise ServerStartError if it exits or times out.

        A timed-out server is stopped (recorded as stopped, failure startup-timeout). When /health has answered
        200 for READY_LINE_GRACE_S without the ready line (a log level that hides it), or at once for an engine that
        prints none, the server counts as ready only if the socket listening on the health port belongs to its
        process group (another process's server on that port is never taken for it).
        """
        if self._proc is None:
            raise PivotError("the server was never started")
        if self.ready and self.alive():
            return
        follower = _LogFollower(self.log_path, self._log_start)
        ready_line = self.ready_line
        line_seen = False

        def said_ready() -> bool:  # the server's own log said it serves (an engine without a ready line never does)
            return ready_line is not None and line_seen

        t0 = time.monotonic()
        next_progress = t0
        healthy_since: float | None = None
        timeout = httpx.Timeout(self.health_timeout_s, connect=min(self.health_timeout_s, 0.5))
        with httpx.Client(timeout=timeout, trust_env=False, verify=tls_context()) as client:
            while True:
                code = self.poll()
                if code is not None:
                    raise self._start_failure()
                lines = follower.new_lines()
                if ready_line is not None and not line_seen and any(ready_line in line for line in lines):
                    line_seen = True
                status = self._health(client)
                now = time.monotonic()
                if status == 200:
                    healthy_since = healthy_since if healthy_since is not None else now
                    if said_ready() or (
                        (ready_line is None or now - healthy_since >= READY_LINE_GRACE_S) and self._answers_itself()
                    ):
                        break
                else:
                    healthy_since = None
                    if status in (401, 403) and (said_ready() or (ready_line is None and self._answers_itself())):
                        break  # ready, but /health wants the API key
                elapsed = now - t0
                if elapsed >= timeout_s:
                    raise self._timed_out(timeout_s)
                if on_progress is not None and now >= next_progress:
                    last = short_line(follower.last) if follower.last else "(nothing logged yet)"
                    on_progress(f"starting, {elapsed:.0f} s: {last}")
                    next_progress = now + PROGRESS_INTERVAL_S
                time.sleep(max(0.0, min(POLL_S, timeout_s - elapsed)))
        if self.poll() is not None:
            raise self._start_failure()
        self.ready = True
        self._record("ready")
        if on_progress is not None:
            on_progress(f"ready after {time.monotonic() - t0:.1f} s at {self.base_url}")

    def _answers_itself(self) -> bool:
        """Without the ready line: whether the socket answering /health is this server's (its process group's).
        When this host cannot tell (the server runs in a container or elsewhere), /health alone has to do."""
        port = urlsplit(self.health_url).port
        if port is None or not self.owner_check:
            return True
        ours = group_listens(self.pgid, port, started_since=self.proc_start)
        return ours is None or ours

    def _start_failure(self) -> ServerStartError:
        tail = self.log_tail(CLASSIFY_LINES)
        why = f" ({short_line(self.failure_line)})" if self.failure_line else ""
        return ServerStartError(
            f"{self.engine} exited while starting ({self.exit_text()}): {self.failure}{why}",
            failure=self.failure or UNKNOWN,
            log_tail=tail,
            log_path=self.log_path,
            exit_code=self.exit_code,
        )

    def _timed_out(self, timeout_s: float) -> ServerStartError:
        self.failure = "startup-timeout"
        self.stop()
        return ServerStartError(
            f"{self.engine} was not ready after {timeout_s:g} s; it was stopped",
            failure="startup-timeout",
            log_tail=self.log_tail(CLASSIFY_LINES),
            log_path=self.log_path,
        )

    # ---- stop

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the server and its whole process group (SIGTERM, then SIGKILL after the grace); safe to call twice."""
        with self._lock:
            if self._proc is None or self._stopped:
                return
            self.poll()  # an exit before this call is a crash, and is recorded as one
            self._stopping = True
            grace = self.stop_grace_s if grace_s is None else grace_s
            stop_group(self.pgid, grace, started_since=self.proc_start, reap=self._proc.poll)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            if self.exit_code is None:
                self.exit_code = self._proc.returncode
            self._stopped = True
            self._remove_tmp()
            if not self._exit_recorded:
                self._exit_recorded = True
                self._record("stopped", self.failure)
        _unregister(self)
