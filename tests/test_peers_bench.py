"""benchmarks/peers.py's reading of pivot's campaigns: launches to the target counted as the peers' are (when the
best so far first reached it, not when the campaign ended), and the score at a budget what a campaign cut there held.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def peers_bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    return peers


def test_launches_to_the_target_are_those_spent_when_the_best_first_reached_it(peers_bench) -> None:
    # baseline (2 runs), a step adopted at 0.95 (4), one at 0.995 (6), then two checks that keep it (8)
    r = {"launches": 8, "final_tok_s": 995.0, "trail": [(2, 900.0), (4, 950.0), (6, 995.0), (7, 995.0), (8, 995.0)]}
    assert peers_bench._reached(r, 1000.0) == 6
    assert peers_bench._reached({**r, "trail": r["trail"][:2], "final_tok_s": 950.0}, 1000.0) is None
    assert peers_bench._reached({"launches": 8, "final_tok_s": 995.0}, 1000.0) == 8  # an old record: its end
    other = {**r, "trail": [(2, 900.0), (5, 1000.0), (6, 980.0)]}  # a later adoption the truth puts lower
    assert peers_bench._score_at([r], 5, 1000.0) == "0.9500"
    assert peers_bench._score_at([r, other], 8, 1000.0) == f"{(0.995 + 0.98) / 2:.4f}"
    assert peers_bench._score_at([r], 1, 1000.0) == "0.9000"  # before the baseline's runs were in: the baseline
    assert peers_bench._score_at([{"launches": 8, "final_tok_s": 995.0}], 8, 1000.0) == ""


def test_a_plan_of_ones_own_is_scored_against_every_combination_where_they_are_few(peers_bench, capsys) -> None:
    """`--plans FILE`: pivot's campaigns run on it through the method, the peers on the twin's values, and a plan of
    seven items is scored against the best of all its 128 combinations (the shipped grid's best, computed here)."""
    import json

    plan = ROOT / "benchmarks" / "search_plans" / "eval-llama70b-h200x1.toml"
    assert peers_bench.main(["--plans", str(plan), "--seeds", "1", "--jobs", "1", "--budget", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| eval-llama70b-h200x1 |")]
    assert [r.split(" | ")[1] for r in rows][:3] == ["pivot (twin search, through the method)", "plan-order", "random"]
    grid = json.loads((ROOT / "benchmarks" / "search_grid.json").read_text())["eval-llama70b-h200x1"]
    note = next(line for line in out.splitlines() if line.startswith("eval-llama70b-h200x1: 7 items"))
    assert f"every one of 128 combinations valued; best {grid['best']} {grid['best_tok_s']:,.0f}" in note, note
    assert all(0.5 < float(r.split(" | ")[-1].strip(" |")) <= 1.0 for r in rows)
