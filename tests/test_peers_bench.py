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
