"""`pivot chat`: the textual app. Handlers change state, workers run the agent and read the ledger, the widgets
(agent/tui/widgets/, one per module with its CSS) present. The session, its steps and their cancel live in the ChatController."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Footer, Header, Input
from textual.worker import Worker, WorkerState

from agent import models as m
from agent.errors import PivotError
from agent.tui import view
from agent.tui.controller import ChatController, picker_rows
from agent.tui.screens import Choice, PickerScreen, SummaryScreen
from agent.tui.widgets import ChatLog, PivotPanel, SidePanel, StatusLine

POWER_POINTS = 8
BOARD_EVERY_S = 0.5


class AgentEvent(Message):
    """An event of the agent (posted from any thread)."""

    def __init__(self, event: m.Event) -> None:
        super().__init__()
        self.event = event


class BoardReady(Message):
    def __init__(self, board: view.Board, seq: int) -> None:
        super().__init__()
        self.board, self.seq = board, seq


class ServerReading(Message):
    def __init__(self, state: str, telemetry: m.Telemetry | None) -> None:
        super().__init__()
        self.state, self.telemetry = state, telemetry


class SessionReady(Message):
    def __init__(self, autorun: bool) -> None:
        super().__init__()
        self.autorun = autorun


class PivotApp(App[None]):
    """Chat with the agent of one session, watch its campaign, answer its pivots."""

    TITLE = "pivot"
    CSS = """
    #main { height: 1fr; }
    #prompt.hidden { display: none; }
    """  # the rest is each widget's own (agent/tui/widgets/, agent/tui/screens/)
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel_step", "Cancel step"),
        Binding("ctrl+r", "summary", "Summary"),
        Binding("ctrl+g", "go_on", "Go on"),
        Binding("ctrl+t", "toggle_side", "Panel"),
    ]

    def __init__(
        self, controller: ChatController, *, autorun: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.controller = controller
        self.autorun = autorun
        self.clock = clock  # tests freeze it, so elapsed times in snapshots do not move
        self.board: view.Board | None = None
        self.step_worker: Worker[Any] | None = None
        self.cancelling = False
        self.quitting = False
        self.started_at: float | None = None
        self.last_elapsed: float | None = None
        self.activity = ""
        self.server_state = "no server"
        self.step_had_server = False
        self.power: dict[int, deque[float]] = {}
        self.power_top: float | None = None
        self.power_stamp: tuple[Any, Any] | None = None
        self.polling = False
        self.board_seq = 0
        self.board_shown = 0
        self.board_timer: Timer | None = None
        self.sessions_shown = 0
        self.steps_done = 0  # steps whose end has been shown (tests wait on it)
        self.tool_args: dict[str, tuple[str, dict[str, Any]]] = {}

    # ---- layout

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield ChatLog(id="log")
            yield SidePanel(id="side")
        yield PivotPanel(id="pivot")
        yield Input(placeholder="Message the agent (Enter sends)", id="prompt")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(0.5, self._tick)
        self._show_status()
        if self.controller.session is None:
            self.push_screen(PickerScreen(picker_rows(self.controller.store)), self._picked)
        else:
            self.post_message(SessionReady(self.autorun))

    def on_unmount(self) -> None:
        self.controller.close()

    @property
    def running(self) -> bool:
        return self.step_worker is not None and not self.step_worker.is_finished

    # ---- opening a session

    def _picked(self, choice: Choice | None) -> None:
        if choice is None:
            self.exit()
            return
        self.open_choice(choice)

    @work(thread=True, group="open", exit_on_error=False)
    def open_choice(self, choice: Choice) -> None:
        kind, key = choice
        try:
            if kind == "session":
                self.controller.open(key)
            else:
                self.controller.create(key, demo=kind == "demo")
        except PivotError as e:
            self.call_from_thread(self._open_failed, e)
            return
        self.post_message(SessionReady(autorun=kind != "session"))

    def _open_failed(self, error: PivotError) -> None:
        self.notify(error.message + (f"\n{error.hint}" if error.hint else ""), title="cannot open", severity="error")
        self.push_screen(PickerScreen(picker_rows(self.controller.store)), self._picked)

    async def on_session_ready(self, message: SessionReady) -> None:
        session = self.controller.require()
        self.sub_title = f"{session.record.name} ({session.id})"
        log = self.query_one(ChatLog)
        await log.add(*self.controller.history())
        self.controller.attach(lambda event: self.post_message(AgentEvent(event)))
        board = self.controller.board()
        await self._show_board(board)
        if board.pivot is not None:
            await log.add(view.Entry("agent", view.pivot_markdown(board.pivot)))
        elif message.autorun:
            await log.add(view.Entry("notice", f"session {session.id}: the agent starts on plan {session.plan.name}"))
            await self._start_step()
        elif board.status == "finished":
            await log.add(view.Entry("notice", "the campaign is finished; a message (an item id) goes on"))
        else:
            await log.add(view.Entry("notice", f"session {session.id} is {board.status}: ctrl+g goes on"))
        self._focus_input()
        self.sessions_shown += 1

    # ---- steps

    async def _start_step(self, answer: str | None = None, shown: str | None = None) -> None:
        if self.running:
            self.notify("a step is running: wait for it, or Escape cancels it", severity="warning")
            return
        if shown is not None:
            await self.query_one(ChatLog).add(view.Entry("user", shown))
        await self.query_one(PivotPanel).show(None, None)
        self.query_one("#prompt").remove_class("hidden")
        self.started_at, self.activity, self.cancelling = self.clock(), "", False
        self.step_had_server = False  # whether this step's cancel stops a server (the notice says so only then)
        self.step_worker = self.run_step(answer)
        self._show_status()
        self.refresh_bindings()

    @work(group="agent", exit_on_error=False)
    async def run_step(self, answer: str | None) -> Any:
        return await self.controller.step(answer=answer)

    async def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker is not self.step_worker or not event.worker.is_finished:
            return
        log = self.query_one(ChatLog)
        for key in log.running():  # calls whose result never came: the pivot's ask_user, or a cancelled tool
            tool, args = self.tool_args.pop(key, ("?", {}))
            log.complete(key, view.unfinished_text(tool, args, cancelled=event.state == WorkerState.CANCELLED))
        self.tool_args.clear()
        if self.started_at is not None:
            self.last_elapsed = self.clock() - self.started_at
        self.started_at = None
        if event.state == WorkerState.SUCCESS:
            outcome = event.worker.result
            if outcome.status != "pivot":
                await log.add(view.outcome_entry(outcome.status, outcome.message))
        elif event.state == WorkerState.CANCELLED:
            stopped = "the server is stopped; " if self.step_had_server else "no server was running; "
            await log.add(view.Entry("notice", f"cancelled: {stopped}ctrl+g (or a message) goes on"))
        elif event.state == WorkerState.ERROR:
            error = event.worker.error
            text = (
                f"{error.message}" + (f" (hint: {error.hint})" if error.hint else "")
                if isinstance(error, PivotError)
                else f"{type(error).__name__}: {error}"
            )
            await log.add(view.Entry("error", text))
        self.cancelling = False
        self.activity = ""
        board = await self._read_board()
        if board.pivot is not None:
            await log.add(view.Entry("agent", view.pivot_markdown(board.pivot)))
        self._focus_input()
        self._show_status()
        self.refresh_bindings()
        self.steps_done += 1
        if self.quitting:
            self.exit()

    def _focus_input(self) -> None:
        """The free answer's input while a pivot is open, else the message box."""
        found = self.query("#free-answer") or self.query("#prompt")
        if found:
            found.first().focus()

    # ---- input

    @on(Input.Submitted, "#prompt")
    async def _prompt(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or self.controller.session is None:
            return
        if self.running:
            self.notify("a step is running: wait for it, or Escape cancels it", severity="warning")
            return
        event.input.clear()
        await self._start_step(answer=text, shown=text)

    async def on_pivot_panel_answered(self, message: PivotPanel.Answered) -> None:
        pivot = self.board.pivot if self.board else None
        await self._start_step(answer=message.answer, shown=view.answer_text(pivot, message.answer))

    # ---- agent events

    def on_agent_event(self, message: AgentEvent) -> None:
        event, data = message.event, message.event.data
        log = self.query_one(ChatLog)
        if event.kind == "tool_call" and "tool" in data:
            key = str(data.get("tool_call_id") or len(self.tool_args))
            self.tool_args[key] = (data["tool"], data.get("args") or {})
            log.queue(view.Entry("tool", view.tool_line(data["tool"], data.get("args")), key=key))
        elif event.kind == "tool_result" and "tool" in data:
            key = str(data.get("tool_call_id"))
            tool, args = self.tool_args.pop(key, (data["tool"], {}))
            text = view.tool_line(tool, args, data.get("content"), done=True)
            if not log.complete(key, text):
                log.queue(view.Entry("tool", text))
            self.refresh_board()
        elif event.kind in ("warning", "error"):
            log.queue(view.Entry(event.kind, event.message))
        elif event.kind in ("progress", "info", "tool_result"):
            self.activity = event.message
            if event.kind == "progress":
                self._poll_server()
            if event.message.startswith(("todo list:", "step cancelled")):
                self.refresh_board()
        self._show_status()

    # ---- the ledger and the server, read in threads

    async def _read_board(self) -> view.Board:
        board = self.controller.board()
        await self._show_board(board)
        return board

    def refresh_board(self) -> None:
        """Re-read the side panel from the ledger in a thread, at most every BOARD_EVERY_S seconds (a campaign on
        the twin makes dozens of tool calls a second); the newest reading wins."""
        if self.board_timer is None:
            self.board_timer = self.set_timer(BOARD_EVERY_S, self._read_board_now)

    def _read_board_now(self) -> None:
        self.board_timer = None
        self.board_seq += 1
        self.read_board(self.board_seq)

    @work(thread=True, group="board", exit_on_error=False)
    def read_board(self, seq: int) -> None:
        if self.controller.session is not None:
            self.post_message(BoardReady(self.controller.board(), seq))

    async def on_board_ready(self, message: BoardReady) -> None:
        if message.seq >= self.board_shown and self.controller.session is not None:
            self.board_shown = message.seq
            # read in a thread, it can arrive after the app began closing: its screens (or the panel) are gone
            if not self.screen_stack or not self.screen.query(SidePanel):
                return
            await self._show_board(message.board, pivot=False)

    async def _show_board(self, board: view.Board, *, pivot: bool = True) -> None:
        self.board = board
        self.query_one(SidePanel).show(board)
        if pivot:
            summary = (board.pivot.summary_path if board.pivot else None) or board.summary_path
            await self.query_one(PivotPanel).show(board.pivot, summary)
            self.query_one("#prompt").set_class(board.pivot is not None, "hidden")
        self._show_status()

    def _tick(self) -> None:
        if self.controller.session is not None and self.controller.session.live is not None:
            self._poll_server()
        else:  # the server stopped: its state and its power go
            self.server_state, self.power_stamp = "no server", None
            self.power.clear()
        self._show_status()

    def _poll_server(self) -> None:
        if not self.polling:
            self.polling = True
            self.read_server()

    @work(thread=True, group="server", exit_on_error=False)
    def read_server(self) -> None:
        try:
            state, telemetry = self.controller.server()
        finally:
            self.polling = False
        self.post_message(ServerReading(state, telemetry))

    def on_server_reading(self, message: ServerReading) -> None:
        self.server_state = message.state
        if self.started_at is not None:
            self.step_had_server = True
        t = message.telemetry
        stamp = (t.max_concurrency, t.finished_at) if t is not None else None
        if stamp is not None and stamp != (None, None) and stamp == self.power_stamp:
            self._show_status()  # the same level's reading again (the twin keeps its last level's)
            return
        self.power_stamp = stamp
        for gpu, (watts, limit) in view.power_readings(t).items():
            self.power.setdefault(gpu, deque(maxlen=POWER_POINTS)).append(watts)
            if limit:
                self.power_top = max(self.power_top or 0.0, limit)
        self._show_status()

    # ---- the status line

    def _elapsed(self) -> str:
        if self.started_at is not None:
            verb = "cancelling" if self.cancelling else "working"
            return f"{verb} {self.clock() - self.started_at:,.1f}s"
        if self.last_elapsed is not None:
            return f"idle (last step {self.last_elapsed:,.1f}s)"
        return "idle"

    def _show_status(self) -> None:
        if not self.is_running:
            return
        session = self.controller.session
        if session is None:
            state = "no session"
        else:
            status = self.board.status if self.board else session.record.status
            status = "running" if self.started_at is not None else status  # a step runs: not the stored status
            state = f"{session.id} {status} · {self.server_state} · {self._elapsed()}"
        activity = self.activity if session is not None and self.started_at is not None else ""
        power = ""
        if session is not None and session.live is not None and self.power:
            power = "W/GPU " + " ".join(
                f"{gpu}{view.sparkline(list(values), self.power_top)}" for gpu, values in sorted(self.power.items())
            )
            latest = [values[-1] for values in self.power.values() if values]
            power += f" {sum(latest) / len(latest):,.0f}W"
        with contextlib.suppress(NoMatches):  # NoMatches: the app is shutting down, its widgets are gone
            self.query_one(StatusLine).show(state, power, activity)

    # ---- actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_step":
            return True if self.running and not self.cancelling else None
        if action in ("go_on", "summary", "toggle_side"):
            return self.controller.session is not None  # hidden on the picker
        return True

    def action_cancel_step(self) -> None:
        if not self.running or self.cancelling or self.step_worker is None:
            return
        self.cancelling = True
        self.activity = "stopping the server"
        self.controller.request_cancel()
        self.step_worker.cancel()
        self._show_status()
        self.refresh_bindings()

    async def action_go_on(self) -> None:
        board = self.board
        if self.controller.session is None or board is None:
            return
        if board.pivot is not None:
            self.notify("answer the question first (a button, or your words)", severity="warning")
        elif board.status == "finished":
            self.notify("the campaign is finished: a message (an item id) goes on", severity="warning")
        else:
            await self._start_step()

    def action_summary(self) -> None:
        board = self.board
        if board is None or board.summary_path is None:
            self.notify("no status summary yet", severity="warning")
            return
        path = self.controller.paths.home / board.summary_path
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            self.notify(f"cannot read {path}: {e.strerror}", severity="error")
            return
        self.push_screen(SummaryScreen(board.summary_path, text))

    def action_toggle_side(self) -> None:
        self.query_one(SidePanel).toggle_class("hidden")

    async def action_quit(self) -> None:
        if self.running:  # cancel first: the server stops and the ledger is settled before we go
            self.quitting = True
            self.action_cancel_step()
            return
        self.exit()
