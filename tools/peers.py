"""Peer searches inside pivot's method: Optuna's TPE or GP sampler, or random configurations, propose the launches
instead of the twin-guided search (`pivot run --search optuna-tpe|optuna-gp|random`), and everything else stays the
method's.

What a peer decides: which configuration of the released tiers' items to measure next. What it does not: the
tiers and pivots, the engine's audit (an item the engine refuses is ruled out before any launch, as with every
search), the noise band, the verdicts (a candidate is judged against the best configuration so far, adopted only
beyond the band on two runs), the launch budget (`--max-launches`). So a peer is measured as a user would run it,
and benchmarks/peers.py can set its numbers beside the twin's.

How a peer proposes (the ask-and-tell interface, as Optuna's samplers and Ray Tune's searchers take it):

- the space: each searchable item of the released tiers is a categorical parameter `off`/`on`; items that set the
  same flag (two values of one cap) share one parameter whose choices are `off` and each item;
- the history is read from the ledger at every step, never kept elsewhere, so a resumed campaign proposes what an
  unbroken one would: each experiment measured on the plan's workload is a completed trial (its configuration's
  items, its objective at the workload's top level, the mean of its runs); one that crashed or did not start is an
  infeasible trial (Optuna 5's constraints: `starts` = 1, told the worst value measured), so TPE and GP learn to
  avoid what does not run rather than never hearing of it; the sampler is seeded with the session's seed and the
  number of trials told;
- the next configuration is asked; one measured already is told its value and asked again (at most ASK_TRIES
  times), and a new one the method would not take from the best configuration (taking back an adopted item it may
  not revert) is told infeasible (`method` = 1); the step that reaches it from the best configuration is the
  launch: the items it adds, and the adopted items it takes back (`revert_items`).

Optuna is an optional extra (`pip install -e '.[optuna]'`), and its GP sampler needs PyTorch besides: without them, a
peer search says so before anything is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent import models as m
from agent.errors import PivotError
from tools import learn
from tools.method.answers import Decision
from tools.method.reading import Method
from tools.method.step import Step, searchable

PEERS = ("optuna-tpe", "optuna-gp", "random")
ASK_TRIES = 64  # asks per step before a peer is taken to have nothing new to propose
OFF = "off"


def check_available(kind: str) -> None:
    """PivotError when the peer `kind` cannot run here (Optuna not installed)."""
    if kind not in PEERS:
        return
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise PivotError(
            f"--search {kind} needs Optuna, which is not installed",
            hint="pip install -e '.[optuna]' (or pick --search twin, the default)",
        ) from None
    if kind == "optuna-gp":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise PivotError(
                "--search optuna-gp needs PyTorch (Optuna's GP sampler runs on it), which is not installed",
                hint="pip install torch (the CPU build will do), or pick --search optuna-tpe",
            ) from None


def space(items: list[m.PlanItem]) -> dict[str, list[str]]:
    """The parameters: one per flag name (the items setting it share it), its choices `off` and the items' ids."""
    params: dict[str, list[str]] = {}
    for it in items:
        names = it.flags.names() if it.flags is not None else []
        key = names[0] if len(names) == 1 else f"item {it.id}"
        params.setdefault(key, [OFF]).append(it.id)
    return params


def scope(method: Method, d: Decision) -> list[m.PlanItem]:
    """The items a peer searches: the released tiers' searchable items, less those settled for good (refused,
    not measurable, ruled out)."""
    out = []
    for it in method.plan.items:
        if it.tier not in d.released or not searchable(it):
            continue
        final = method.final(it)
        if final and final[-1].verdict in ("ruled_out", "not_measured"):
            continue
        out.append(it)
    return out


def history(method: Method, items: list[m.PlanItem]) -> list[tuple[frozenset[str], float | None]]:
    """Each experiment on the plan's workload as (the items its configuration holds, its objective at the top level,
    or None for one that crashed or did not start); none before the baseline was measured."""
    base = method.baseline()
    if base is None or not method.ok_values(base):
        return []
    level = max(method.ok_values(base))
    key = method.plan.workload.workload_key()
    ids = [it.id for it in items]
    base_config = method.base_config()
    out = []
    for e in method.experiments:
        if e.workload.workload_key() != key or e.verdict in ("ruled_out", "not_measured", "predicted"):
            continue
        held = learn.held_items(method.plan, e.config, base_config, ids)
        runs = method.ok_values(e).get(level)
        if runs and not method.failed_levels(e):
            out.append((held, sum(runs) / len(runs)))
        elif e.verdict == "crashed" or e.status == "failed":
            out.append((held, None))
    return out


def propose(method: Method, d: Decision, kind: str,
            ok: Callable[[frozenset[str]], bool] = lambda c: True) -> tuple[frozenset[str], str] | None:  # fmt: skip
    """The configuration (the items it holds) the peer `kind` measures next, with its reason; None when it has
    nothing new to propose. A configuration `ok` refuses (a step the method would not take) is asked past."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    items = scope(method, d)
    params = space(items)
    if not params:
        return None
    dists = {k: CategoricalDistribution(v) for k, v in params.items()}
    told = history(method, items)
    seed = method.settings.seed + len(told)
    startup = min(10, 2 * len(params))
    sampler: Any = (optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup) if kind == "optuna-tpe" else
                    optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup) if kind == "optuna-gp" else
                    optuna.samplers.RandomSampler(seed=seed))  # fmt: skip
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: dict[frozenset[str], float | None] = {}
    turned_down: set[frozenset[str]] = set()
    worst = min((v for _, v in told if v is not None), default=0.0)  # what an infeasible trial is told

    def as_params(held: frozenset[str]) -> dict[str, str]:
        return {k: next((i for i in v[1:] if i in held), OFF) for k, v in params.items()}

    for held, value in told:
        seen.setdefault(held, value)
        study.add_trial(create_trial(params=as_params(held), distributions=dists, state=TrialState.COMPLETE,
                                     value=worst if value is None else value,
                                     constraints={"starts": 0.0 if value is not None else 1.0}))  # fmt: skip
    for _ in range(ASK_TRIES):
        trial = study.ask(dists)
        chosen = frozenset(v for v in trial.params.values() if v != OFF)
        fit = ok(chosen)
        if chosen not in seen and fit:
            return chosen, f"{kind} proposes {' + '.join(sorted(chosen)) or 'the base configuration'}"
        value = seen.get(chosen)  # measured (the best so far among them: no step leads to it), or crashed
        refused = chosen not in seen or chosen in turned_down  # a step the method would not take
        trial.set_constraint("starts", 1.0 if not refused and value is None else 0.0)
        trial.set_constraint("method", 1.0 if refused else 0.0)
        study.tell(trial, worst if value is None else value)
        if chosen not in seen:
            turned_down.add(chosen)
        seen.setdefault(chosen, None)
    return None


def steps(method: Method, d: Decision, kind: str, allowed_reverts: frozenset[str]) -> list[Any]:
    """The launch the peer proposes as the method's step from the best configuration (items added, adopted items
    taken back), or [] when it has nothing new to propose."""
    ids = [it.id for it in scope(method, d)]
    best = learn.held_items(method.plan, method.best_config(), method.base_config(), ids)

    def step_of(chosen: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(i for i in ids if i in chosen and i not in best), tuple(
            i for i in ids if i in best and i not in chosen
        )

    def ok(chosen: frozenset[str]) -> bool:
        add, back = step_of(chosen)
        return bool(add or back) and set(back) <= allowed_reverts

    found = propose(method, d, kind, ok)
    if found is None:
        return []
    chosen, why = found
    add, back = step_of(chosen)
    return [Step("launch", add, why, reverts=back)]


def launches_spent(method: Method) -> int:
    """Server launches the campaign has spent: every run measured (a rerun relaunches), and every launch that
    crashed or did not start."""
    return sum(max(method.run_count(e), 1 if (e.verdict == "crashed" or e.status == "failed") else 0)
               for e in method.experiments)  # fmt: skip
