"""`pivot bench` as a user meets it: JSON alone on stdout, bench_serving's flags and keys, clear errors, Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.models import BenchLevel
from tests.timed_server import ROOT, spawn

# The keys sglang.benchmark.serving writes for a run (server_info aside), in its order.
BENCH_SERVING_KEYS = [
    "tag",
    "backend",
    "dataset_name",
    "request_rate",
    "max_concurrency",
    "sharegpt_output_len",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "duration",
    "completed",
    "total_input_tokens",
    "total_input_text_tokens",
    "total_input_vision_tokens",
    "total_output_tokens",
    "total_output_tokens_retokenized",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    *(
        f"{s}_{m}_ms"
        for m in ("e2e_latency", "ttft", "tpot", "itl")
        for s in ("mean", "median", "std", "p90", "p95", "p99")
    ),
    "concurrency",
    "accept_length",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
]


@pytest.fixture(scope="module")
def url():
    with spawn("--ttft-ms", "2", "--itl-ms", "1") as base_url:
        yield base_url


def bench(*args: str, **kw):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False, **kw)


def test_json_is_alone_on_stdout_and_bench_servings_spellings_work(url):
    result = bench(
        "--base-url",
        url,
        "--max-concurrency",
        "1,3",
        "--random-input-len",
        "16",
        "--random-output-len",
        "5",
        "--random-range-ratio",
        "1",
        "--num-prompts",
        "4",
        "--warmup-requests",
        "0",
        "--json",
    )
    assert result.exit_code == 0, result.output
    levels = json.loads(result.stdout)  # nothing but JSON
    assert [lv["max_concurrency"] for lv in levels] == [1, 3]
    for lv in levels:
        assert list(lv)[: len(BENCH_SERVING_KEYS)] == BENCH_SERVING_KEYS
        assert (lv["random_input_len"], lv["random_output_len"], lv["random_range_ratio"]) == (16, 5, 1.0)
        assert lv["completed"] == 4 and lv["total_output_tokens"] == 20 and lv["total_input_tokens"] == 64
        assert lv["backend"] == "sglang" and lv["request_rate"] == float("inf")
    assert "level 2/2 (concurrency 3): done" in result.stderr


def test_pivots_own_spellings_and_the_summary_table(url, tmp_path):
    out = tmp_path / "runs" / "bench.jsonl"
    args = ["--base-url", url, "--endpoint", "completions", "--concurrency", "2", "--input-len", "8"]
    args += ["--output-len", "3", "--range-ratio", "1", "--num-prompts", "4", "--output-file", str(out)]
    args += ["--warmup-requests", "0"]
    first = bench(*args)
    assert first.exit_code == 0, first.output
    assert "Serving Benchmark Result" in first.stdout and "Output token throughput (tok/s)" in first.stdout
    assert "Mean TTFT (ms)" in first.stdout and "Mean dispatch delay (ms)" in first.stdout
    assert f"results appended to {out}" in first.stdout
    bench(*args)
    lines = out.read_text().splitlines()
    assert len(lines) == 2  # appended, as bench_serving appends
    row = json.loads(lines[0])
    assert set(BENCH_SERVING_KEYS) <= set(row) and row["backend"] == "sglang-oai"
    assert BenchLevel.model_validate(row).completed == 4


def test_an_unreachable_server_is_a_clear_error_without_a_traceback():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = bench("--base-url", f"http://127.0.0.1:{port}", "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"error: cannot reach http://127.0.0.1:{port}" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "1,x"], "bad concurrency list"),
        (["--concurrency", "0,4"], "concurrency"),
        (["--concurrency", "4,4"], "must not repeat"),
    ],
)
def test_bad_settings_are_refused_before_any_request(args, message):
    result = bench("--base-url", "http://127.0.0.1:9", *args)
    assert result.exit_code != 0 and message in result.output


def test_via_sglang_without_sglang_says_so():
    result = bench("--base-url", "http://127.0.0.1:9", "--via", "sglang", "--sglang-python", "/nonexistent/python")
    assert result.exit_code == 1
    assert "sglang.benchmark.serving" in result.stderr and "is not installed" in result.stderr


FAKE_BENCH_SERVING = """
import argparse, json, sys
p = argparse.ArgumentParser()
for flag in ("--backend", "--base-url", "--dataset-name", "--random-input-len", "--random-output-len",
             "--random-range-ratio", "--num-prompts", "--max-concurrency", "--request-rate", "--seed",
             "--warmup-requests", "--output-file"):
    p.add_argument(flag)
for flag in ("--disable-tqdm", "--tokenize-prompt", "--disable-ignore-eos"):
    p.add_argument(flag, action="store_true")
args = p.parse_args()
with open(args.output_file + ".argv", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
row = {k: 1.0 for k in %r}
row.update(backend=args.backend, dataset_name=args.dataset_name, max_concurrency=int(args.max_concurrency),
           completed=int(args.num_prompts), request_rate=float(args.request_rate), server_info={"version": "fake"},
           tag=None, sharegpt_output_len=None, accept_length=None)
print("============ Serving Benchmark Result ============")
with open(args.output_file, "a") as f:
    f.write(json.dumps(row) + "\\n")
"""


def test_via_sglang_runs_its_benchmark_module_with_the_same_workload(tmp_path):
    pkg = tmp_path / "fake" / "sglang" / "benchmark"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "serving.py").write_text(textwrap.dedent(FAKE_BENCH_SERVING % (BENCH_SERVING_KEYS,)))
    out = tmp_path / "ref.jsonl"
    result = bench(
        "--base-url",
        "http://127.0.0.1:30000/",
        "--via",
        "sglang",
        "--concurrency",
        "1,8",
        "--input-len",
        "100",
        "--output-len",
        "50",
        "--output-file",
        str(out),
        "--json",
        env={"PYTHONPATH": str(tmp_path / "fake")},
    )
    assert result.exit_code == 0, result.output
    levels = json.loads(result.stdout)
    assert [(lv["max_concurrency"], lv["completed"]) for lv in levels] == [(1, 8), (8, 16)]
    assert levels[0]["server_info"] == {"version": "fake"} and levels[0]["client_cpu_s"] is not None
    argv = [json.loads(line) for line in (tmp_path / "ref.jsonl.argv").read_text().splitlines()]
    first = dict(zip(argv[0][::2], argv[0][1::2], strict=False))
    assert first["--backend"] == "sglang" and first["--dataset-name"] == "random-ids"
    assert first["--base-url"] == "http://127.0.0.1:30000" and first["--random-input-len"] == "100"
    assert first["--max-concurrency"] == "1" and first["--request-rate"] == "inf" and "--tokenize-prompt" in argv[0]


def test_ctrl_c_stops_cleanly_and_keeps_the_finished_levels(tmp_path):
    out = tmp_path / "sweep.jsonl"
    with spawn("--ttft-ms", "5", "--itl-ms", "20") as slow_url:  # levels of 1-2 s: room to interrupt the second
        cmd = [sys.executable, "-c", "from agent.cli import main; main()", "bench", "--base-url", slow_url]
        cmd += ["--concurrency", "2,4,8", "--output-len", "60", "--range-ratio", "1", "--input-len", "8"]
        cmd += ["--num-prompts", "4", "--warmup-requests", "0", "--output-file", str(out), "--json"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while not (out.exists() and out.read_text().count("\n") >= 1):
                assert proc.poll() is None and time.monotonic() < deadline, "the first level never finished"
                time.sleep(0.02)
            time.sleep(0.1)  # into the second level
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted: 1 of 3 levels finished" in stderr
    assert [lv["max_concurrency"] for lv in json.loads(stdout)] == [2]
    assert len(Path(out).read_text().splitlines()) == 1
