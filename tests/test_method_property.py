"""A property-based test of the method (hypothesis): random plans, random answers, random kills and failures.

Plans are drawn item by item (tests/formula_engine.py: items that help, hurt, interact, crash under load, fail at
startup, are refused or no-ops, items with a workload of their own) over one to three tiers, on the formula engine,
whose formula is also its predictor; the campaign is driven by the autopilot through the real loop, answered at each
pivot with a drawn answer (continue, stop, an option's number, an item id, words, nonsense), and killed (a
BaseException no handler catches: the process dies, nothing is cleaned up) or failed (an exception the loop did
not expect) at drawn launches and benchmarks, then resumed. Whatever is drawn:

- the campaign ends finished, or at a pivot, within a bounded number of runs and model requests;
- the autopilot is never refused (a refusal would end the run with a crash report naming AutopilotRefused), and
  every call it makes is among the moves computed before it, with values the guard's schema offers;
- the guard and the moves agree on every step (the same calls refused, from the ledger read afresh);
- nothing is run twice: no two experiments measured the same configuration on the same workload;
- an injected failure leaves the session waiting with a crash report, and the resume goes on.

`test_a_fixed_slice_of_random_campaigns` runs in the default run (a few examples, derandomized: the same ones every
time); `test_many_random_campaigns` runs more and is marked slow.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent import loop
from agent import models as m
from agent.autopilot import Autopilot
from agent.session import Paths, Session
from agent.store import Store
from tests.formula_engine import Effect, Formula, FormulaEngine, FormulaPredictor, formula_plan
from tools import search
from tools.method import GUARDED_TOOLS, Moves, refusal
from tools.method.checks import check

KINDS = ("help", "big", "hurt", "neutral", "pair", "crash", "startup", "refused", "noop", "workload")
MAX_RUNS = 30  # resumes and answers, all told
MAX_PIVOTS = 12


class Killed(BaseException):
    """The process dies here: no handler of pivot's catches it, nothing is cleaned up."""


@dataclass
class Drawn:
    effects: dict[str, Effect]
    tiers: dict[str, int]
    expected: dict[str, str]
    workloads: dict[str, dict]
    noise: float
    seed: int
    answers: list[str]
    faults: dict[int, str]  # the n-th launch or benchmark -> "kill" | "crash"
    stall_after: int = 3


@st.composite
def campaigns(draw: st.DrawFn, max_items: int = 6) -> Drawn:
    n = draw(st.integers(2, max_items))
    ids = [f"{i:02d}" for i in range(1, n + 1)]
    ntiers = draw(st.integers(1, 3))
    effects: dict[str, Effect] = {}
    tiers: dict[str, int] = {}
    expected: dict[str, str] = {}
    workloads: dict[str, dict] = {}
    for k, iid in enumerate(ids):
        kind = draw(st.sampled_from(KINDS))
        flag = f"--knob-{k + 1} 1"
        if kind == "help":
            e = Effect(flag, factor=draw(st.floats(1.02, 1.2)))
        elif kind == "big":
            e = Effect(flag, factor=draw(st.floats(1.2, 1.6)))
            expected[iid] = "+20-50% output tok/s"
        elif kind == "hurt":
            e = Effect(flag, factor=draw(st.floats(0.7, 0.98)))
        elif kind == "pair":
            other = draw(st.sampled_from([i for i in ids if i != iid]))
            e = Effect(
                flag, factor=draw(st.floats(0.97, 1.01)), with_item=other, pair_factor=draw(st.floats(1.05, 1.3))
            )
        elif kind == "crash":
            e = Effect(flag, factor=1.3, crash=True)
            expected[iid] = draw(st.sampled_from(["+20-50% output tok/s", "+2-5% output tok/s"]))
        elif kind == "startup":
            e = Effect(flag, startup=True)
        elif kind == "refused":
            e = Effect(flag, refused=True)
        elif kind == "noop":
            e = Effect(flag, noop=True)
        elif kind == "workload":
            e = Effect(flag, factor=draw(st.floats(0.95, 1.15)))
            workloads[iid] = {"random_input_len": 512}
        else:
            e = Effect(flag, factor=draw(st.floats(0.995, 1.005)))
        effects[iid] = e
        tiers[iid] = draw(st.integers(1, ntiers))
    if 1 not in tiers.values():
        tiers[ids[0]] = 1
    words = ["continue", "stop", "go on", "yes", "1", "2", "3", "7", "knob", "please test knob 02", "maybe later"]
    answer = st.one_of(
        st.sampled_from(words + ids),
        st.sampled_from([f"test {a}+{b} together" for a, b in itertools.combinations(ids[:3], 2)]),
        st.sampled_from(
            [f"retry {i} with --max-running-requests 32" for i in ids[:3]] + [f"drop {i}" for i in ids[:3]]
        ),
        st.text(alphabet="abcxyz +-09", min_size=1, max_size=10),
    )
    return Drawn(
        effects=effects,
        tiers=tiers,
        expected=expected,
        workloads=workloads,
        noise=draw(st.sampled_from([0.0, 0.0, 0.01, 0.04])),
        seed=draw(st.integers(0, 1000)),
        answers=draw(st.lists(answer, max_size=8)),
        faults=dict(draw(st.lists(st.tuples(st.integers(1, 30), st.sampled_from(["kill", "crash"])), max_size=2))),
        stall_after=draw(st.integers(2, 4)),
    )


@dataclass
class Watch:
    """What the checks saw while the campaign ran."""

    steps: int = 0
    failures: list[str] = field(default_factory=list)


def _probes(moves: Moves) -> list[tuple[str, dict]]:
    """A few calls a model could make now, for the guard and the moves to agree on."""
    ids = moves.method.plan.item_ids()
    out: list[tuple[str, dict]] = [("launch_server", {"plan_item": i}) for i in ids[:3]]
    out += [("launch_server", {"plan_items": ids[:2]}), ("launch_server", {"baseline": True})]
    out += [("record_verdict", {"plan_item": i, "verdict": "predicted", "reason": "r"}) for i in ids[:2]]
    out += [
        ("record_verdict", {"experiment_id": e.id, "verdict": "no_gain", "reason": "r"})
        for e in moves.method.experiments[-2:]
    ]
    return out


def _in_schema(moves: Moves, tool: str, args: dict) -> bool:
    """Whether the call's values are among those the guard's schema offers the model now."""
    if tool == "launch_server":
        items = {*moves.items, *moves.profiles, *moves.retries, *moves.workload_baselines}
        return (
            (args.get("plan_item") is None or args["plan_item"] in items)
            and all(i in moves.items for i in args.get("plan_items") or [])
            and (args.get("experiment_id") is None or args["experiment_id"] in moves.reruns)
            and all(i in moves.reverts for i in args.get("revert_items") or [])
        )
    if tool == "record_verdict":
        verdicts = {v for vs in [*moves.verdicts.values(), *moves.settle.values()] for v in vs}
        return (
            args.get("verdict") in verdicts
            and (args.get("experiment_id") is None or args["experiment_id"] in moves.verdicts)
            and (args.get("plan_item") is None or args["plan_item"] in moves.settle)
        )
    return True


def watch_autopilot(monkeypatch: pytest.MonkeyPatch, watch: Watch) -> None:
    """Check every call the autopilot makes against the moves computed before it, and the guard against them."""
    original = Autopilot.call_for

    def checked(self: Autopilot, moves: Moves, last: dict):
        call = original(self, moves, last)
        watch.steps += 1
        if call.tool in GUARDED_TOOLS:
            why = check(moves, call.tool, call.args)
            if why is not None:
                watch.failures.append(f"not among the moves: {call.tool} {call.args}: {why.text()}")
            if not _in_schema(moves, call.tool, call.args):
                watch.failures.append(f"outside the schema shown: {call.tool} {call.args}")
            for tool, args in _probes(moves):
                fresh = refusal(self.session, tool, args) is None
                if fresh != (check(moves, tool, args) is None):
                    watch.failures.append(f"the guard and the moves disagree on {tool} {args}")
        return call

    monkeypatch.setattr(Autopilot, "call_for", checked)


def run_campaign(home: Path, drawn: Drawn, monkeypatch: pytest.MonkeyPatch) -> tuple[Store, str, list[str]]:
    """Drive one drawn campaign to its end (or the bound); returns the ledger, the session and what happened."""
    formula = Formula(drawn.effects)
    plan = formula_plan(drawn.effects, drawn.tiers, drawn.expected, drawn.workloads)
    monkeypatch.setattr(search, "predictor_for", lambda method: FormulaPredictor(formula))
    events = {"n": 0}
    faults = dict(drawn.faults)

    def hook(event: str, obj: object) -> None:
        events["n"] += 1
        fault = faults.pop(events["n"], None)
        if fault == "kill":
            raise Killed(f"killed at {event} {events['n']}")
        if fault == "crash":
            raise RuntimeError(f"an injected failure at {event} {events['n']}")

    engine = FormulaEngine(formula, noise=drawn.noise, seed=drawn.seed, hook=hook)
    paths = Paths.from_env(home)
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(paths.db_path)
    settings_ = m.SessionSettings(seed=drawn.seed, stall_after=drawn.stall_after, request_limit=150)
    with Session.create(store, paths, plan, engine=engine, settings=settings_) as s:
        sid = s.id
    answers = iter(drawn.answers)
    answer: str | None = None
    log: list[str] = []
    pivots = 0
    for _ in range(MAX_RUNS):
        with Session.open(store, paths, sid, engine=engine) as s:
            try:
                out = loop.run(s, answer=answer)
            except Killed as k:
                log.append(f"killed: {k}")
                answer = None
                continue
        log.append(f"{out.status}: {out.message[:160]}")
        answer = None
        if out.status == "finished":
            break
        if out.status == "pivot":
            pivots += 1
            if pivots > MAX_PIVOTS:
                break
            answer = next(answers, "continue" if pivots < MAX_PIVOTS - 2 else "stop")
        elif out.status == "stopped":
            assert "request" not in out.message.lower(), f"a run that never ends: {out.message}"
        elif out.status == "failed":
            assert "crash report: state/" in out.message and "AutopilotRefused" not in out.message, out.message
            assert store.get_session(sid).status == "waiting"
    return store, sid, log


def check_campaign(store: Store, sid: str, log: list[str], watch: Watch) -> None:
    assert not watch.failures, watch.failures
    status = store.get_session(sid).status
    assert status in ("finished", "waiting"), (status, log)
    assert log and (log[-1].startswith(("finished", "pivot"))), log
    if status == "waiting":
        assert store.open_pivot(sid) is not None, log  # ends at a pivot, never in the middle
    usage = sum(u.requests for u in store.usage(sid))
    assert usage <= 400, usage
    measured: dict[tuple[str, str], int] = {}
    for e in store.experiments(sid):
        if not store.bench_results(e.id or 0):
            continue
        key = (str(e.config), e.workload.workload_key())
        assert key not in measured, f"experiments {measured.get(key)} and {e.id} ran the same thing: {key}"
        measured[key] = e.id or 0
    for e in store.experiments(sid):  # every measured experiment got its verdict once the campaign ended
        if status == "finished" and store.bench_results(e.id or 0):
            assert e.verdict is not None, (e.id, e.status, log)


SETTINGS = dict(
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a campaign takes seconds: no shrinking
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture
def quick_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Status summaries without their HTML and charts: the method is what is under test, not matplotlib."""
    monkeypatch.setattr("tools.reports.status.write_status_html", lambda *a, **k: None)


@settings(max_examples=3, derandomize=True, **SETTINGS)
@given(drawn=campaigns(max_items=4))
def test_a_fixed_slice_of_random_campaigns(drawn: Drawn, tmp_path_factory, monkeypatch, quick_reports) -> None:
    watch = Watch()
    with monkeypatch.context() as mp:
        watch_autopilot(mp, watch)
        store, sid, log = run_campaign(tmp_path_factory.mktemp("campaign"), drawn, mp)
        check_campaign(store, sid, log, watch)
        store.close()


@pytest.mark.long  # minutes: out of the default run (pyproject's addopts), which runs the fixed-seed slice above
@settings(max_examples=25, **SETTINGS)
@given(drawn=campaigns(max_items=7))
def test_many_random_campaigns(drawn: Drawn, tmp_path_factory, monkeypatch, quick_reports) -> None:
    watch = Watch()
    with monkeypatch.context() as mp:
        watch_autopilot(mp, watch)
        store, sid, log = run_campaign(tmp_path_factory.mktemp("campaign"), drawn, mp)
        check_campaign(store, sid, log, watch)
        store.close()
