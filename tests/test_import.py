"""`pivot import`: sglang.bench_serving output files into a session, then the same summaries as for pivot's runs."""

from __future__ import annotations

import json
import sqlite3

import pytest

from agent.cli import main
from agent.imports import read_bench_serving

# The seeds' table (TP8, max running requests 2048): concurrency, output tok/s, total tok/s, peak output tok/s,
# mean TPOT ms; TTFT invented in proportion. Every other key is derived as bench_serving derives it.
SEEDS = [
    (1, 10.3, 14.2, 11.0, 97.0, 120.0),
    (256, 705.0, 1384.0, 1438.0, 200.0, 3400.0),
    (2048, 2095.0, 4151.0, 7216.0, 815.0, 24000.0),
]


def bench_serving_line(c: int, out: float, total: float, peak: float, tpot: float, ttft: float) -> str:
    """One run as sglang.bench_serving writes it to --output-file (key names from the facts, section 1)."""
    completed = max(c, 8)
    out_tokens = completed * 128
    duration = out_tokens / out
    in_tokens = round((total - out) * duration)
    e2e = ttft + tpot * 127
    stats = {}
    for name, mean in (("e2e_latency", e2e), ("ttft", ttft), ("tpot", tpot), ("itl", tpot * 0.9)):
        stats |= {
            f"mean_{name}_ms": mean,
            f"median_{name}_ms": mean * 0.97,
            f"std_{name}_ms": mean * 0.2,
            f"p90_{name}_ms": mean * 1.3,
            f"p95_{name}_ms": mean * 1.4,
            f"p99_{name}_ms": mean * 1.6,
        }
    return json.dumps(
        {
            "tag": None,
            "backend": "sglang",
            "dataset_name": "random-ids",
            "request_rate": float("inf"),
            "max_concurrency": c,
            "sharegpt_output_len": None,
            "random_input_len": 256,
            "random_output_len": 256,
            "random_range_ratio": 0.0,
            "server_info": {
                "tp_size": 8,
                "pp_size": 1,
                "ep_size": 1,
                "version": "0.5.23",
                "model_path": "lukealonso/GLM-5-NVFP4",
            },
            "duration": duration,
            "completed": completed,
            "total_input_tokens": in_tokens,
            "total_input_text_tokens": in_tokens,
            "total_input_vision_tokens": 0,
            "total_output_tokens": out_tokens,
            "total_output_tokens_retokenized": out_tokens,
            "request_throughput": completed / duration,
            "input_throughput": in_tokens / duration,
            "output_throughput": out,
            "total_throughput": total,
            **stats,
            "concurrency": e2e / 1000 * completed / duration,
            "accept_length": None,
            "max_output_tokens_per_s": peak,
            "max_concurrent_requests": c,
        }
    )


@pytest.fixture
def bench_file(tmp_path):
    lines = [
        bench_serving_line(*SEEDS[0]),
        "Traceback (most recent call last): not JSON",
        bench_serving_line(*SEEDS[1]),
        "[1, 2, 3]",
        json.dumps({"max_concurrency": 512, "output_throughput": 1120.0}),
        bench_serving_line(*SEEDS[2]),
        "",
        json.loads(bench_serving_line(*SEEDS[1])) | {"max_concurrency": None},
    ]
    path = tmp_path / "sglang_1201_2048_256_256.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def _run(capsys, *argv):
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


def test_reading_reports_malformed_lines_by_number(bench_file):
    levels, skipped, replaced = read_bench_serving(bench_file)
    assert list(levels) == [1, 256, 2048] and replaced == []
    assert [(p.line, p.message.split(" (")[0].split(":")[0]) for p in skipped] == [
        (2, "not JSON"),
        (4, "a JSON list, not an object"),
        (5, "missing the bench_serving keys pivot needs"),
        (8, "max_concurrency is None"),
    ]


def test_import_creates_the_session_and_the_summary_has_the_files_numbers(bench_file, paths, capsys):
    code, out, err = _run(
        capsys,
        "import",
        "by-hand",
        str(bench_file),
        "--label",
        "tp8 mrr2048",
        "--plan",
        "glm5-nvfp4-rtxpro6000x8",
        "--flags",
        "--tp-size 8 --max-running-requests 2048",
    )
    assert code == 0, err
    for line in (2, 4, 5, 8):
        assert f"{bench_file}:{line}: skipped" in err
    assert "created session" in out and "as experiment #1 'tp8 mrr2048' (the session's baseline)" in out

    code, text, err = _run(capsys, "summary", "by-hand")
    assert code == 0, err
    best = text.split("## Best results\n", 1)[1].split("\n## ", 1)[0]
    rows = [r.split(" | ") for r in best.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert len(rows) == 3
    for row, (c, out_tok, total, peak, tpot, ttft) in zip(rows, SEEDS, strict=True):
        assert row[0] == f"| {c}"
        assert row[1:6] == [f"{out_tok:,.0f}", f"{total:,.0f}", f"{peak:,.0f}", f"{ttft:,.1f}", f"{tpot:,.1f}"]
        assert row[6:8] == ["-", "-"]  # bench_serving wrote no power readings: no W per GPU, no J per token
        assert row[8] == "#1" and row[9] == "--tp-size 8 --max-running-requests 2048" and row[10] == "imported |"
    # the analysis ran on the imported numbers: at 2048 about 1,707 requests decode at once (2,095 tok/s x 815 ms),
    # so 53 rows per expert; no power readings to quote
    root = text.split("## Root cause\n", 1)[1]
    assert "from the analysis of experiment #1" in root and "53 rows per decode step (1,707 x 8 / 256)" in root
    assert "power limit" not in root.split("Also measured")[0]
    # the valid runs are kept under state/<session>/bench/, as bench_serving wrote them
    db = sqlite3.connect(paths.db_path)
    ((raw,),) = db.execute("select r.raw_path from bench_runs r join experiments e on e.id = r.experiment_id")
    kept = (paths.home / raw).read_text().splitlines()
    assert [json.loads(k)["max_concurrency"] for k in kept] == [1, 256, 2048]


def test_a_second_import_adds_a_comparison_and_touches_nothing_else(bench_file, tmp_path, paths, capsys):
    assert (
        _run(
            capsys,
            "import",
            "by-hand",
            str(bench_file),
            "--label",
            "base",
            "--plan",
            "glm5-nvfp4-rtxpro6000x8",
            "--flags",
            "--tp-size 8",
        )[0]
        == 0
    )
    db = sqlite3.connect(paths.db_path)
    before = db.execute("select * from experiments").fetchall(), db.execute("select * from bench_levels").fetchall()
    faster = tmp_path / "faster.jsonl"
    faster.write_text("\n".join(bench_serving_line(c, o * 1.1, t * 1.1, p, tp, tt) for c, o, t, p, tp, tt in SEEDS))
    code, out, err = _run(
        capsys,
        "import",
        "by-hand",
        str(faster),
        "--label",
        "mscclpp",
        "--base",
        "1",
        "--flags",
        "--tp-size 8 --enable-mscclpp",
    )
    assert code == 0, err
    assert "as experiment #2 'mscclpp' into session" in out
    assert db.execute("select * from experiments where id = 1").fetchall() == before[0]
    assert db.execute("select * from bench_levels where experiment_id = 1").fetchall() == before[1]
    code, text, _ = _run(capsys, "summary", "by-hand")
    tried = text.split("## What was tried\n", 1)[1].split("\n## ", 1)[0]
    assert (
        "| #2 | - | imported 'mscclpp': --enable-mscclpp | +10.0% output tok/s at 2048 (2,095 -> 2,304) | not judged |"
        in tried
    )


def test_importing_into_a_missing_session_needs_a_plan(bench_file, capsys):
    code, _, err = _run(capsys, "import", "nowhere", str(bench_file), "--label", "x")
    assert code == 1 and "no session 'nowhere'" in err and "--plan" in err


def test_a_file_without_a_single_run_records_nothing(tmp_path, paths, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("oops\n{}\n")
    code, _, err = _run(capsys, "import", "s1", str(bad), "--label", "x", "--plan", "glm5-nvfp4-rtxpro6000x8")
    assert code == 1 and "line 1: not JSON" in err and "line 2: missing the bench_serving keys pivot needs" in err
    db = sqlite3.connect(paths.db_path)
    assert db.execute("select count(*) from experiments").fetchone() == (0,)


def test_a_file_with_only_the_keys_pivot_needs_imports_and_a_missing_one_is_named_with_the_rest(tmp_path, capsys):
    """Before: 34 keys required (p90/p95/std of every metric), 6 named and "8 more". Now: the means, counts and
    throughputs pivot compares; the rest kept when there; total_throughput and concurrency derived."""
    from agent.imports import REQUIRED_KEYS

    full = json.loads(bench_serving_line(*SEEDS[0]))
    lean = {k: v for k, v in full.items() if not k.startswith(("median_", "std_", "p90_", "p95_", "p99_"))}
    lean.pop("total_throughput")
    lean.pop("concurrency")
    path = tmp_path / "lean.jsonl"
    path.write_text(json.dumps(lean) + "\n" + json.dumps({k: v for k, v in lean.items() if k not in ("duration",
                    "mean_tpot_ms", "mean_itl_ms", "max_output_tokens_per_s")}) + "\n")  # fmt: skip
    levels, skipped, _ = read_bench_serving(path)
    (level,) = [lv for _, lv, _ in levels.values()]
    duration = lean["duration"]
    assert level.total_throughput == pytest.approx(
        (lean["total_input_tokens"] + lean["total_output_tokens"]) / duration
    )
    assert level.concurrency == pytest.approx(lean["mean_e2e_latency_ms"] / 1000 * lean["completed"] / duration)
    assert level.p99_ttft_ms is None
    (problem,) = skipped
    assert problem.message == (
        "missing the bench_serving keys pivot needs: duration, mean_tpot_ms, mean_itl_ms, max_output_tokens_per_s"
    )
    assert len(REQUIRED_KEYS) < 20 and not any(k.startswith(("p90_", "p95_", "std_")) for k in REQUIRED_KEYS)


def test_the_label_shows_where_the_experiment_is_read(tmp_path, capsys, bench_file):
    code, out, _ = _run(capsys, "import", "labelled", str(bench_file), "--label", "tp8 mrr2048", "--plan",
                        "glm5-nvfp4-rtxpro6000x8", "--flags", "--tp-size 8")  # fmt: skip
    assert code in (0, None) and "'tp8 mrr2048'" in out
    code, shown, _ = _run(capsys, "show", "labelled", "--json")
    assert json.loads(shown)["experiments"][0]["change"] == "imported 'tp8 mrr2048': --tp-size 8"
    code, summary, _ = _run(capsys, "summary", "labelled")
    assert "imported 'tp8 mrr2048'" in summary
