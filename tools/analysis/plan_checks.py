"""The plan checks: physics and direction errors in a plan's items, and flags the audit found inert or refused."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent import models as m
from agent.contracts import Engine
from agent.errors import PivotError
from tools.analysis.common import (
    KV_FULL,
    SessionLike,
    _finding,
    _n,
    _plan_engine,
    flag_value,
    layout,
    session_engine,
)
from tools.analysis.roofline import Roofline
from tools.profiles import HardwareProfile, ModelProfile
from tools.profiles.target import TargetProfiles, session_profiles, target_profiles

_MORE_KV = re.compile(r"more kv|kv headroom|allow more kv|bigger kv|larger kv|kv cache capacity", re.IGNORECASE)
_ROWS = re.compile(r"(\d[\d,]*)\s+rows", re.IGNORECASE)
_CONC = re.compile(r"(?:at\s+)?(\d[\d,]*)\s+concurrency|concurrency\s+(\d[\d,]*)", re.IGNORECASE)
_EP_ROWS = re.compile(r"(\d+)\s*x\s+the\s+rows|more rows", re.IGNORECASE)
_AR_COUNT = re.compile(r"(\d+)\s+per step", re.IGNORECASE)


def check_plan(session: SessionLike) -> list[m.Finding]:
    """Check the plan's items for physics and direction errors (and flags the audit found inert); record them.

    Replaces the session's previous plan-level findings. Uses the profiles, the audits of the experiments
    run so far, and the KV usage the analyses recorded.
    """
    store, session_id = session.store, session.id
    record = store.get_session(session_id)
    plan = record.plan
    kv_levels = [
        f
        for f in store.findings(session_id, kind="level")
        if f.experiment_id is not None and "kv_usage_pct" in f.values
    ]
    try:
        profiles = session_profiles(store, session_id)
    except PivotError:  # no profile and no config.json here yet: nothing to check the claims against
        return store.replace_findings(session_id, None, [])
    out = plan_claims(plan, store.experiments(session_id), kv_levels, engine=session_engine(record), profiles=profiles)
    return store.replace_findings(session_id, None, out)


@dataclass
class PlanContext:
    """What every plan check reads: the plan's target on its profiles, its base layout, and what a session measured."""

    plan: m.Plan
    model: ModelProfile
    hw: HardwareProfile
    base: m.ServerConfig
    engine: Engine | None
    lay: dict[str, int]
    roof: Roofline
    top_c: int
    experiments: Sequence[m.Experiment]
    kv_levels: Sequence[m.Finding]


@dataclass
class ItemView:
    """One plan item: its words (title, hypothesis and expected impact) and the configuration it runs."""

    item: m.PlanItem
    text: str
    config: m.ServerConfig


def plan_claims(
    plan: m.Plan,
    experiments: Sequence[m.Experiment] = (),
    kv_levels: Sequence[m.Finding] = (),
    *,
    engine: Engine | None = None,
    profiles: TargetProfiles | None = None,
) -> list[m.Finding]:
    """The plan checks of `check_plan`, on a plan alone (`pivot plan check`) or with a session's experiments (their
    audits) and the KV usage its analyses measured; nothing is recorded. `engine` says how the flags split the
    model (default: the plan's engine, when its plugin loads here); `profiles` the target's (default: named, else
    generated now)."""
    target = plan.target
    profiles = profiles or target_profiles(target)
    model, hw = profiles.model, profiles.hardware
    if engine is None:
        engine = _plan_engine(target)
    base = target.base_config(engine.model_flags) if engine is not None else target.base_config()
    lay = layout(base, engine=engine)
    roof = Roofline(model, hw, lay["tp"], lay["pp"], lay["ep"], flag_value(base, "--kv-cache-dtype"))
    ctx = PlanContext(plan, model, hw, base, engine, lay, roof, max(plan.workload.concurrency), experiments, kv_levels)
    out: list[m.Finding] = []
    for item in plan.items:
        view = ItemView(item, " ".join([item.title, item.hypothesis, item.expected_impact]), item.apply(base))
        for check in PLAN_CHECKS:
            out += check(ctx, view)
    return out


# --------------------------------------------------------------------------------------------------
# The checks, one function each, in the order their findings are listed for an item.


def mem_fraction_problem(value: str) -> str | None:
    """Why a --mem-fraction-static value cannot run (it is the fraction of GPU memory for the weights and the KV
    pool: a finite number in (0, 1]), or None when it can."""
    try:
        fraction = float(value)
    except ValueError:
        return None  # not a number: the audit names what SGLang's parser says
    if math.isfinite(fraction) and 0 < fraction <= 1:
        return None
    asks = "more memory than the GPU has" if math.isfinite(fraction) and fraction > 1 else "no memory it can use"
    return (
        f"it is the fraction of GPU memory for the weights and the KV pool, so it lies in (0, 1]; {value} asks for "
        f"{asks} and the server does not start. Give a fraction such as 0.9."
    )


def mem_fraction_static(ctx: PlanContext, it: ItemView) -> list[m.Finding]:
    """--mem-fraction-static: a higher fraction gives SGLang a bigger KV pool, not a smaller one; too high a
    fraction leaves no room beside the weights (out of memory at startup)."""
    item, hw, roof = it.item, ctx.hw, ctx.roof
    new = flag_value(it.config, "--mem-fraction-static")
    old_text = flag_value(ctx.base, "--mem-fraction-static")
    if new is None or new == old_text:  # the item leaves the fraction as the base flags have it: nothing to check
        return []
    try:
        fraction = float(new)
    except ValueError:
        return []  # the audit names a value SGLang's parser refuses
    if (why := mem_fraction_problem(new)) is not None:
        text = f"Item {item.id} sets --mem-fraction-static {new}: {why}"
        return [_finding("claim", text, {"mem_fraction_new": fraction if math.isfinite(fraction) else -1.0},
                         plan_item=item.id, severity="error")]  # fmt: skip
    if not old_text and hw.auto_mem_fraction_static is None:
        return []  # SGLang's automatic fraction on this hardware is not known: nothing to compare with
    old = float(old_text) if old_text else float(hw.auto_mem_fraction_static or 0)
    weights, old_pool = roof.kv_pool_tokens(old)
    _, new_pool = roof.kv_pool_tokens(fraction)
    where = "set in the base flags" if old_text else "SGLang's automatic value on this GPU"
    values = {
        "mem_fraction_old": old,
        "mem_fraction_new": float(new),
        "kv_pool_tokens_old": old_pool,
        "kv_pool_tokens_new": new_pool,
        "weights_gib_per_gpu": weights,
        "memory_gib": hw.memory_gib,
    }
    formula = "KV pool = (GPU memory x mem-fraction-static - weights per GPU) / KV bytes per token per GPU"
    if new_pool <= 0:
        text = (
            f"Item {item.id} sets --mem-fraction-static {new}: {_n(hw.memory_gib, 1)} GiB x {new} leaves no "
            f"room beside {_n(weights, 1)} GiB of weights per GPU, so SGLang stops at startup (out of memory)."
        )
        return [_finding("claim", text, values, plan_item=item.id, severity="error", formula=formula)]
    if float(new) < old and _MORE_KV.search(it.text):
        text = (
            f"Item {item.id} lowers --mem-fraction-static from {_n(old, 2)} ({where}) to {new} to get more KV "
            f"cache, but in SGLang a higher fraction gives more KV cache, not a lower one: the KV pool shrinks "
            f"from {_n(old_pool)} to {_n(new_pool)} tokens per GPU. To gain KV headroom, raise it above "
            f"{_n(old, 2)}."
        )
        return [_finding("claim", text, values, plan_item=item.id, severity="error", formula=formula)]
    change = "grows" if new_pool > old_pool else "shrinks"
    text = (
        f"Item {item.id}: --mem-fraction-static {old_text or _n(old, 2)} -> {new} {change} the KV pool from "
        f"{_n(old_pool)} to {_n(new_pool)} tokens per GPU, in the direction the item expects."
    )
    return [_finding("claim", text, values, plan_item=item.id, formula=formula)]


def rows_per_expert_quote(ctx: PlanContext, it: ItemView) -> list[m.Finding]:
    """Rows per expert quoted in an item's words, against concurrency x k / E (MoE models)."""
    item, model, text = it.item, ctx.model, it.text
    if not ctx.roof.moe:
        return []
    rows_m = _ROWS.search(text)
    conc_m = _CONC.search(text)
    if not (rows_m and conc_m and "expert" in text.lower()):
        return []
    quoted = float(rows_m.group(1).replace(",", ""))
    conc = int((conc_m.group(1) or conc_m.group(2)).replace(",", ""))
    expect = ctx.roof.rows_per_expert(conc)
    ok = 0.75 <= quoted / expect <= 1.33 if expect else False
    return [
        _finding(
            "claim",
            f"Item {item.id} quotes {_n(quoted)} rows per expert at concurrency {conc}: "
            f"{conc} x {model.experts_per_token} / {model.experts} = {_n(expect)} if all {conc} requests "
            "decode at once" + (", consistent." if ok else ", which does not match."),
            {
                "rows_quoted": quoted,
                "max_concurrency": conc,
                "rows_per_expert": expect,
                "experts_per_token": model.experts_per_token,
                "experts": model.experts,
            },
            plan_item=item.id,
            severity="info" if ok else "warning",
            formula="rows per expert = concurrency x experts per token / experts",
        )
    ]


def ep_rows_claim(ctx: PlanContext, it: ItemView) -> list[m.Finding]:
    """An item expecting EP to give each expert more rows (routing decides the rows; EP changes the width)."""
    item, model, lay, top_c = it.item, ctx.model, ctx.lay, ctx.top_c
    if not ctx.roof.moe:
        return []
    ep = layout(it.config, engine=ctx.engine)["ep"]
    if not (ep > 1 and _EP_ROWS.search(item.hypothesis)):
        return []
    rows_c = ctx.roof.rows_per_expert(top_c)
    return [
        _finding(
            "claim",
            f"Item {item.id} expects EP{ep} to give each expert more rows, but routing decides the rows: at "
            f"concurrency {top_c} each expert sees {_n(rows_c)} rows under TP and under EP alike. EP changes the "
            f"width one GPU computes ({_n(model.expert_ffn / lay['tp'])} -> {_n(model.expert_ffn)} columns), and "
            f"each GPU then handles 1/{ep} of the routed rows, not {ep}x.",
            {
                "ep_size": ep,
                "max_concurrency": top_c,
                "rows_per_expert": rows_c,
                "width_tp": model.expert_ffn / lay["tp"],
                "width_ep": model.expert_ffn,
            },
            plan_item=item.id,
            severity="error",
            formula="rows per expert = concurrency x experts per token / experts, whatever the layout",
        )
    ]


def all_reduce_count(ctx: PlanContext, it: ItemView) -> list[m.Finding]:
    """An all-reduce count quoted in an item's words, against 2 per layer (under TP)."""
    item, model, lay = it.item, ctx.model, ctx.lay
    if not ("all-reduce" in it.text.lower() and lay["tp"] > 1):
        return []
    count = _AR_COUNT.search(it.text)
    if not count:
        return []
    quoted = int(count.group(1))
    expect = 2 * model.layers // lay["pp"]
    return [
        _finding(
            "claim",
            f"Item {item.id} counts {quoted} all-reduces per step: 2 per layer x {model.layers} layers = {expect}"
            + (", consistent." if quoted == expect else ", which does not match."),
            {"all_reduces_quoted": quoted, "all_reduces": expect, "layers": model.layers},
            plan_item=item.id,
            severity="info" if quoted == expect else "warning",
            formula="all-reduces per decode step = 2 x layers / pp (after attention and after the MLP)",
        )
    ]


def kv_limit(ctx: PlanContext, it: ItemView) -> list[m.Finding]:
    """An item expecting a gain if KV capacity is the limit, against the KV usage the analyses measured."""
    item, text, kv_levels = it.item, it.text, ctx.kv_levels
    if not ("kv" in text.lower() and "limit" in text.lower() and kv_levels):
        return []
    top = max(kv_levels, key=lambda f: (f.values.get("max_concurrency", 0), f.values["kv_usage_pct"]))
    usage = top.values["kv_usage_pct"]
    if usage >= 100 * KV_FULL:
        return []
    return [
        _finding(
            "claim",
            f"Item {item.id} expects a gain if KV capacity is the limit; the KV pool peaked at {_n(usage)}% at "
            f"concurrency {int(top.values['max_concurrency'])} (experiment {_number(ctx, top.experiment_id)}), so it is not "
            "the limit at the levels measured.",
            {
                "kv_usage_pct": usage,
                "max_concurrency": top.values["max_concurrency"],
                "experiment_id": top.experiment_id or 0,
            },
            plan_item=item.id,
            severity="warning",
        )
    ]


def _number(ctx: PlanContext, experiment_id: int | None) -> int | None:
    """An experiment's number in the session (what reports call it), from its ledger id."""
    return next((e.number for e in ctx.experiments if e.id == experiment_id), experiment_id)


ENGINE_WORDS = {"sglang": "SGLang", "vllm": "vLLM"}  # how a plan's [target] engine is written in prose


def engine_words(engine: str) -> str:
    """A plan's engine as prose names it: SGLang, vLLM, else the plugin's own name."""
    return ENGINE_WORDS.get(engine.lower(), engine)


_AUDIT_WHAT = {"noop": "is accepted but read nowhere", "unknown": "is not accepted", "ambiguous": "is ambiguous"}


def audited_flags(ctx: PlanContext, it: ItemView) -> list[m.Finding]:
    """Flags the audit found inert (no-op), refused (unknown) or ambiguous, in the first experiment of the item."""
    item, target = it.item, ctx.plan.target
    out: list[m.Finding] = []
    for e in ctx.experiments:
        if e.plan_item != item.id:
            continue
        for issue in e.audit:
            if issue.status in _AUDIT_WHAT and item.flags is not None and issue.flag in item.flags:
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id}: {issue.flag} {_AUDIT_WHAT[issue.status]} in {engine_words(target.engine)} "
                        f"{target.engine_version or ''} (audit of experiment {e.number}), so the expected impact cannot "
                        f"come from it. {issue.message}".strip(),
                        {"experiment_id": e.id or 0},
                        plan_item=item.id,
                        severity="warning",
                    )
                )
        break
    return out


PLAN_CHECKS: tuple[Callable[[PlanContext, ItemView], list[m.Finding]], ...] = (
    mem_fraction_static,
    rows_per_expert_quote,
    ep_rows_claim,
    all_reduce_count,
    kv_limit,
    audited_flags,
)
