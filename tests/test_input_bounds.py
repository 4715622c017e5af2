"""What a user types cannot break pivot: every bad value is one line (error and hint) before anything runs.

Each case is an input the red team of issue #29 typed that gave a traceback, hung, or grew without bound; each is
now refused by the option's type (agent/cli/options.py), the model's bounds (BenchSpec) or the check of the value
where it is read (the plan, the script, the model's URL), and no session is recorded for it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from agent.cli.options import Number, field_number
from agent.errors import PivotError
from agent.loop import check_model_base_url
from agent.store import Store

ROOT = Path(__file__).resolve().parent.parent
PLAN = "llama70b-fp8-h200x1"


def _files(tmp_path: Path) -> dict[str, str]:
    nested = tmp_path / "nested.toml"
    nested.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 8)
    return {"NESTED": str(nested), "BINARY": str(binary)}


BAD_INPUTS = [
    ("run", PLAN, "--seed", "-1"),
    ("run", PLAN, "--seed", "-5000", "--engine", "sim-http"),
    ("run", PLAN, "--noise", "inf"),
    ("run", PLAN, "--noise", "nan"),
    ("run", PLAN, "--min-gain", "nan"),
    ("run", PLAN, "--min-gain", "inf"),
    ("run", PLAN, "--reruns", "-1"),
    ("run", PLAN, "--stall-after", "-1"),
    ("run", PLAN, "--request-limit", "0"),
    ("run", PLAN, "--model", "openai-chat:m", "--model-base-url", "http://127.0.0.1:99999/v1"),
    ("run", PLAN, "--model", "openai-chat:m", "--model-base-url", "http://[::1/v1"),
    ("run", PLAN, "--model-base-url", "http://127.0.0.1:8000/v1?key=sk-secret-123456"),
    ("run", PLAN, "--model", "script:BINARY"),
    ("run", "NESTED"),
    ("plan", "check", "NESTED"),
    ("demo", "--reruns", "-1"),
    ("demo", "--seed", "1e3"),
    ("sim", "predict", "--num-prompts", "1000000000"),
    ("sim", "predict", "--num-prompts", "0"),
    ("sim", "predict", "--concurrency", "100000000"),
    ("sim", "predict", "--input-len", "1000000000"),
    ("sim", "predict", "--noise", "inf"),
    ("sim", "predict", "--gpus", "0"),
    ("sim", "serve", "--time-scale", "nan"),
    ("sim", "serve", "--time-scale", "inf"),
    ("sim", "serve", "--time-scale", "0"),
    ("bench", "--base-url", "http://127.0.0.1:9", "--num-prompts", "0"),
    ("bench", "--base-url", "http://127.0.0.1:9", "--input-len", "1000000000"),
    ("bench", "--base-url", "http://127.0.0.1:9", "--request-timeout-s", "nan"),
    ("bench", "--base-url", "http://127.0.0.1:9", "--concurrency", "100000", "--input-len", "4096"),
    ("launch-bench", "--seed", "-1"),
    ("serve", "--timeout-s", "inf"),
    ("profile", "--base-url", "http://127.0.0.1:9", "--concurrency", "0"),
    ("analyze", "x", "--experiment", "-3"),
]


@pytest.mark.parametrize("args", BAD_INPUTS, ids=[" ".join(a) for a in BAD_INPUTS])
def test_a_bad_value_is_one_line_and_records_nothing(args, tmp_path, paths):
    files = _files(tmp_path)
    argv = [a.replace("BINARY", files["BINARY"]) if "BINARY" in a else files.get(a, a) for a in args]
    result = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error: "), result.stderr
    assert len(lines) <= 2 and all(line.startswith(("error: ", "hint: ")) for line in lines), result.stderr
    assert "Traceback" not in result.output
    if paths.db_path.exists():
        assert Store(paths.db_path).session_summaries() == []


def test_a_usage_error_of_a_subprocess_is_one_line_too():
    """The same through the console script, where click would print its usage block: one error line, one hint."""
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "run", PLAN, "--reruns", "-1"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: Invalid value for '--reruns': -1 is out of range: give a whole number from 0 to 20",
        "hint: `pivot run --help` lists the options",
    ]


def test_the_option_types_take_their_range_from_the_models_fields():
    reruns = field_number(m.SessionSettings, "reruns", max=20)
    assert (reruns.kind, reruns.min, reruns.max) == (int, 0, 20)
    ratio = field_number(m.BenchSpec, "random_range_ratio")
    assert (ratio.kind, ratio.min, ratio.max) == (float, 0.0, 1.0)
    rate = field_number(m.BenchSpec, "request_rate", allow_inf=True)
    assert rate.convert("inf", None, None) == float("inf")
    with pytest.raises(Exception, match="out of range"):
        rate.convert("nan", None, None)
    assert Number(float, min=0).convert("0.5", None, None) == 0.5
    with pytest.raises(Exception, match="not a whole number"):
        Number(int).convert("1.5", None, None)


def test_a_workload_that_would_send_too_much_is_refused_with_the_bound_in_words():
    with pytest.raises(ValueError, match="more than the 200,000 a level may send"):
        m.BenchSpec(concurrency=[150_000], random_input_len=1, random_output_len=1)
    with pytest.raises(ValueError, match="134,217,728 a level may send"):
        m.BenchSpec(concurrency=[2048], random_input_len=1_000_000, num_prompts=1000)
    assert m.BenchSpec(concurrency=[2048], num_prompts=150_000, random_input_len=256).num_prompts == 150_000
    assert m.parse_levels("1,100000") == [1, 100_000]  # the levels alone are checked here, not a workload


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:99999/v1", "http://[::1/v1", "ftp://host/v1", "http:///v1", "http://u:pw@host/v1",
     "http://host/v1?key=abc", "http://host:0/v1"],
)  # fmt: skip
def test_a_model_base_url_is_checked_before_it_is_stored(url):
    with pytest.raises(PivotError):
        check_model_base_url(url)


def test_a_good_model_base_url_passes():
    assert check_model_base_url(" http://[::1]:8000/v1 ") == "http://[::1]:8000/v1"


def test_the_warmup_hint_names_vocab_size_for_token_ids():
    from tools.loadgen.level import warmup_hint

    hint = warmup_hint("generate", "random-ids", "HTTP 400: token id 40000 out of vocabulary", 151_936)
    assert hint.startswith("check --vocab-size (the random token ids are drawn below 151,936") and "--endpoint" in hint
    assert "--vocab-size" in warmup_hint("completions", "random-ids", "HTTP 500", 32_000)
    assert "--vocab-size" not in warmup_hint("chat", "random-ids", "HTTP 400", 32_000)  # chat sends text


def test_pivot_benchs_warmup_error_names_vocab_size(tmp_path):
    """A server that refuses every token id at or above its vocabulary: the hint says what to change."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refusing(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error": "token id 31999 out of vocabulary (vocab_size 1000)"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = CliRunner().invoke(cli, ["bench", "--base-url", url, "--concurrency", "1", "--num-prompts", "1",
                                          "--input-len", "4", "--output-len", "2"], catch_exceptions=False)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 1 and "warmup failed" in result.stderr, result.output
    hint = next(line for line in result.stderr.splitlines() if line.startswith("hint:"))
    assert "--vocab-size" in hint and "out of vocabulary" in result.stderr


def test_pivot_bench_draws_token_ids_below_the_vocabulary_of_the_model_folder_the_server_names(tmp_path):
    """/v1/models names a model folder this host has: its config.json and tokenizer bound the random ids (a
    16k-word tokenizer under a config padded above it: the tokenizer's), so the warm-up is not refused."""
    import json as _json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    model = tmp_path / "tiny-qwen2"
    model.mkdir()
    (model / "config.json").write_text(_json.dumps({"vocab_size": 1024}))
    (model / "tokenizer.json").write_text(_json.dumps({"model": {"vocab": {f"t{i}": i for i in range(1000)}}}))
    seen: list[int] = []

    class Checking(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                self._send(200, _json.dumps({"data": [{"id": str(model)}]}).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self):
            body = _json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            ids = body.get("prompt") if isinstance(body.get("prompt"), list) else body.get("input_ids") or []
            seen.extend(int(i) for i in ids if isinstance(i, int))
            if any(int(i) >= 1000 for i in ids if isinstance(i, int)):
                return self._send(400, b'{"error": "token id out of vocabulary"}')
            chunk = _json.dumps({"choices": [{"text": "x", "index": 0}]})
            self._send(200, f"data: {chunk}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Checking)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = CliRunner().invoke(cli, ["bench", "--base-url", url, "--endpoint", "completions", "--concurrency",
                                          "1", "--num-prompts", "2", "--input-len", "64", "--output-len", "1",
                                          "--json"], catch_exceptions=False)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert seen and max(seen) < 1000, result.output
    assert "warmup failed" not in result.stderr, result.stderr
