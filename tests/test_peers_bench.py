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
    assert "launches to 0.99 of the reference best" in out  # not "best known": this one is every combination's


def test_every_combination_once_the_base_first(peers_bench) -> None:
    combos = peers_bench.combinations(["01", "02", "03"])
    assert combos[0] == () and len(combos) == len(set(combos)) == 8
    assert ("01", "03") in combos and ("03", "01") not in combos


def test_a_campaigns_trail_counts_each_launch_where_it_ran(monkeypatch) -> None:
    """benchmarks/search_eval.py's trail: a best adopted on its one run and measured again later (for a verdict
    judged against it) became the best after that one run, not after the later ones; a server that crashed before
    its first run is a launch."""
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace as NS

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import search_eval

    t0 = datetime(2026, 12, 7, tzinfo=UTC)
    at = [t0 + timedelta(seconds=k) for k in range(10)]
    base = NS(id=1, kind="baseline", verdict="baseline", config="base", status="finished", started_at=at[0],
              created_at=at[0])  # fmt: skip
    best = NS(id=2, kind="change", verdict="adopted", config="best", status="finished", started_at=at[2],
              created_at=at[2])  # fmt: skip
    crash = NS(id=3, kind="change", verdict="crashed", config="crash", status="failed", started_at=at[3],
               created_at=at[3])  # fmt: skip
    other = NS(id=4, kind="change", verdict="no_gain", config="other", status="finished", started_at=at[4],
               created_at=at[4])  # fmt: skip
    runs = {1: [NS(started_at=at[0]), NS(started_at=at[1])], 2: [NS(started_at=at[2]), NS(started_at=at[5])],
            4: [NS(started_at=at[4]), NS(started_at=at[6])]}  # fmt: skip
    method = NS(experiments=[base, best, crash, other], runs=runs, run_count=lambda e: len(runs.get(e.id, [])))
    values = {"base": 100.0, "best": 200.0, "crash": 0.0, "other": 150.0}
    monkeypatch.setattr(search_eval, "true_tok", lambda plan, config, truth: values.get(config, 100.0))
    plan = NS(target=NS(base_config=lambda: "base"))
    assert search_eval._trail(plan, method, None) == [(1, 100.0), (2, 100.0), (3, 200.0), (4, 200.0), (5, 200.0),
                                                      (6, 200.0), (7, 200.0)]  # fmt: skip
