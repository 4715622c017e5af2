"""What a real model would be sent over a whole campaign: the demo's three tiers, with the whole history resent on
every step (before) and with the conversation compacted (after: agent/context.py).

A recording model (a FunctionModel that wraps the autopilot) measures each request as the provider would get it:
the instructions, the tool definitions and the messages, in characters, and in tokens at 4 characters a token.
The campaign is the same in both runs (same seed, same answers: 1, continue, 1, 1), so the numbers compare.

    .venv/bin/python benchmarks/context_size.py

Targets (issue 16): no request above 40,000 tokens; total input at most a third of the whole-history total.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelRequest
from pydantic_ai.models.function import FunctionModel

from agent import loop
from agent import models as m
from agent.autopilot import Autopilot
from agent.plans import load_plan
from agent.session import Paths, Session
from agent.store import Store

PLAN = "glm5-nvfp4-rtxpro6000x8"
ANSWERS = ["1", "continue", "1", "1", "1", "1"]
CHARS_PER_TOKEN = 4


def request_chars(messages, info) -> int:
    """The request's size: the messages (instructions stripped: a provider sends only the current ones, counted
    once), the instructions, and the tool definitions."""
    tools = [
        {"name": t.name, "description": t.description, "parameters": t.parameters_json_schema}
        for t in info.function_tools
    ]
    bare = [replace(x, instructions=None) if isinstance(x, ModelRequest) else x for x in messages]
    return len(ModelMessagesTypeAdapter.dump_json(bare)) + len(info.instructions or "") + len(json.dumps(tools))


def campaign(home: Path, compact: bool) -> dict:
    paths = Paths.from_env(home)
    store = Store(paths.db_path)
    plan = load_plan(PLAN)
    t = plan.target
    options = {"model_profile": t.model_profile, "hardware": t.hardware, "gpus": t.gpus, "noise": 0.015}
    with Session.create(store, paths, plan, engine_name="sim", settings=m.SessionSettings(engine_options=options)) as s:
        sid = s.id
    sizes: list[int] = []

    def step(answer: str | None) -> loop.RunOutcome:
        with Session.open(store, paths, sid) as s:
            pilot = Autopilot(s)

            def respond(messages, info):
                sizes.append(request_chars(messages, info))
                return pilot.respond(messages, info)

            model = FunctionModel(respond, model_name="autopilot")
            return asyncio.run(loop.run_async(s, answer=answer, model=model, compact=compact))

    outcome = step(None)
    for a in ANSWERS:
        if outcome.status != "pivot":
            break
        outcome = step(a)
    ledger_chars = sum(len(x) for x in store.messages(sid))
    exps = store.experiments(sid)
    result = {
        "status": outcome.status,
        "requests": len(sizes),
        "largest_tokens": max(sizes) // CHARS_PER_TOKEN,
        "total_tokens": sum(sizes) // CHARS_PER_TOKEN,
        "ledger_messages": len(store.messages(sid)),
        "ledger_chars": ledger_chars,
        "experiments": len(exps),
        "verdicts": sorted((e.plan_item or "-", e.verdict or "-") for e in exps),
    }
    store.close()
    return result


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        before = campaign(Path(tmp) / "before", compact=False)
        after = campaign(Path(tmp) / "after", compact=True)
        elapsed = time.monotonic() - t0
    print(f"the demo campaign, three tiers (answers {', '.join(ANSWERS[:4])}), {elapsed:.0f} s")
    print(f"{'':34} {'whole history':>14} {'compacted':>12} {'ratio':>8}")
    for key, label in (
        ("requests", "model requests"),
        ("largest_tokens", "largest request (tokens, 4 ch/t)"),
        ("total_tokens", "total input (tokens)"),
        ("ledger_messages", "messages kept in the ledger"),
        ("ledger_chars", "ledger characters"),
    ):
        ratio = after[key] / before[key] if before[key] else 0.0
        print(f"{label:34} {before[key]:>14,} {after[key]:>12,} {ratio:>8.2f}")
    same = before["verdicts"] == after["verdicts"] and before["status"] == after["status"] == "finished"
    print(f"same campaign (status, items and verdicts): {'yes' if same else 'NO'}")
    ok = after["largest_tokens"] <= 40_000 and after["total_tokens"] * 3 <= before["total_tokens"]
    print(f"targets (largest <= 40,000 tokens; total <= 1/3 of before): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
