"""Client ceiling: output tok/s, TTFT/TPOT inflation and CPU per token of benchmark clients, side by side in one run.

A local server (tests/timed_server.py, in a process of its own, on the same cores) promises the
first token 20 ms after a request arrives and then one token every 2 ms, 128 output tokens per
request; at high concurrency it cannot keep that promise and streams as fast as it can. Each
client sends 2 x concurrency prompts at each level, and we read, for each:
- output tok/s as the client reports it (bench_serving's definition for all of them);
- TTFT and TPOT as the client reports them, against what the server itself measured for the same
  requests (arrival to first token written; first to last token written): the difference is time
  the client added (sending late, reading late), which a user would misread as the server's;
- client CPU seconds per million output tokens: the whole client process (start-up and imports
  included, as a user pays them), from the children's rusage;
- mean requests in flight where the client reports it (pivot), so a client that quietly held less
  concurrency than asked shows it.
Every client runs in a process of its own, one after another against the same server process.

Clients: `pivot` (`pivot bench`, tools/httpstream.py), `bench_serving` (`python -m
sglang.benchmark.serving --backend sglang --dataset-name random-ids --tokenize-prompt`, SGLang
0.5.23's own client), and two variants of pivot's load generator on stock HTTP clients, to justify
the transport: `aiohttp` (ClientSession, one TCPConnector with no limit, bytes read with
`iter_any()`) and `httpx` (AsyncClient with limits = concurrency, `aiter_raw()`). They share
pivot's SSE parsing and metrics, so only the HTTP client differs.

bench_serving in its own virtual environment (its module imports the SGLang runtime package,
which needs torch; the benchmark code itself needs none of it). What was done here:

    python3 -m venv /tmp/sglbench
    /tmp/sglbench/bin/pip install --no-deps sglang==0.5.23
    /tmp/sglbench/bin/pip install aiohttp msgspec numpy orjson requests tqdm pillow pybase64 psutil pyzmq \\
        datasets transformers==5.19.0 tokenizers==0.23.2
    python benchmarks/client_ceiling.py --sglang-python /tmp/sglbench/bin/python

The script then runs `sglang.benchmark.serving` unmodified, through a shim that puts import
stubs in place of the runtime-only modules it would otherwise pull in (`sglang/__init__`, which
imports torch, and `sglang.srt.disaggregation.utils`, of which it uses one constant), and gives it a
local word-level tokenizer (32,000 entries, built with `tokenizers`) since nothing can be
downloaded here. With --tokenize-prompt it sends token ids, as pivot does; its retokenization of
the generated text stays in, as in any real run.

    python benchmarks/client_ceiling.py [--levels 256,1024,2048] [--clients pivot,bench_serving,aiohttp,httpx]
        [--repeats 1] [--sglang-python PATH] [--timeout-s 300] [--httpx-max-level 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.timed_server import spawn, stats  # noqa: E402

TTFT_MS, ITL_MS, OUTPUT_LEN, INPUT_LEN = 20.0, 2.0, 128, 128
REFERENCE = {256: 53_000, 1024: 52_000, 2048: 48_000}  # bench_serving on a machine of this kind, from the issue

SHIM = """
import importlib.util, os, runpy, sys, types
root = os.path.dirname(importlib.util.find_spec("sglang").origin)
for name, sub in (("sglang", ""), ("sglang.srt", "srt"), ("sglang.srt.utils", "srt/utils"),
                  ("sglang.srt.disaggregation", "srt/disaggregation")):
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(root, sub)]
    sys.modules[name] = module
stub = types.ModuleType("sglang.srt.disaggregation.utils")
stub.FAKE_BOOTSTRAP_HOST = "2.2.2.2"
sys.modules[stub.__name__] = stub
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
"""

MAKE_TOKENIZER = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
vocab = {"[UNK]": 0, "tok": 1, **{f"w{i}": i + 2 for i in range(31998)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save(sys.argv[1] + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1000000},
          open(sys.argv[1] + "/tokenizer_config.json", "w"))
"""


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(cmd: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess[str] | None, float, float]:
    """Run a client process; (its result or None on timeout, its CPU seconds, wall seconds)."""
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # nothing to download: fail at once
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return None, _children_cpu_s() - cpu0, time.perf_counter() - t0
    return proc, _children_cpu_s() - cpu0, time.perf_counter() - t0


def run_pivot(url: str, c: int, n: int, out_len: int, timeout_s: float, _: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-c", "from agent.cli import main; main()", "bench", "--base-url", url]
    cmd += ["--concurrency", str(c), "--input-len", str(INPUT_LEN), "--output-len", str(out_len)]
    cmd += ["--range-ratio", "1", "--num-prompts", str(n), "--json"]
    proc, cpu, wall = _run(cmd, timeout_s)
    if proc is None or proc.returncode != 0:
        return {"error": "timed out" if proc is None else proc.stderr.strip()[-300:]}
    (level,) = json.loads(proc.stdout)
    return level | {"process_cpu_s": cpu, "wall_s": wall}


def run_bench_serving(url: str, c: int, n: int, out_len: int, timeout_s: float, args: argparse.Namespace) -> dict:
    if not args.sglang_python:
        return {"error": "no --sglang-python (see the docstring for how to install it)"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        cmd = [args.sglang_python, "-c", SHIM, "--backend", "sglang", "--base-url", url]
        cmd += ["--dataset-name", "random-ids", "--tokenize-prompt", "--tokenizer", args.tokenizer]
        cmd += ["--random-input-len", str(INPUT_LEN), "--random-output-len", str(out_len)]
        cmd += ["--random-range-ratio", "1", "--num-prompts", str(n), "--max-concurrency", str(c)]
        cmd += ["--output-file", str(out), "--disable-tqdm", "--seed", "42", "--warmup-requests", "1"]
        proc, cpu, wall = _run(cmd, timeout_s)
        if proc is None or proc.returncode != 0 or not out.exists():
            return {"error": "timed out" if proc is None else (proc.stderr or proc.stdout).strip()[-300:]}
        level = json.loads(out.read_text().splitlines()[-1])
    return level | {"process_cpu_s": cpu, "wall_s": wall}


def run_variant(name: str):
    def run(url: str, c: int, n: int, out_len: int, timeout_s: float, _: argparse.Namespace) -> dict:
        cmd = [sys.executable, __file__, "--_variant", name, "--_url", url, "--_c", str(c), "--_n", str(n)]
        proc, cpu, wall = _run([*cmd, "--_out", str(out_len)], timeout_s)
        if proc is None or proc.returncode != 0:
            return {"error": "timed out" if proc is None else proc.stderr.strip()[-300:]}
        return json.loads(proc.stdout) | {"process_cpu_s": cpu, "wall_s": wall}

    return run


CLIENTS = {
    "pivot": run_pivot,
    "bench_serving": run_bench_serving,
    "aiohttp": run_variant("aiohttp"),
    "httpx": run_variant("httpx"),
}


# ------------------------------------------------------------------------------ the stock-client variants


async def _variant(name: str, url: str, c: int, n: int, out_len: int) -> dict:
    """pivot's workload, parsing and metrics on aiohttp or httpx instead of tools.httpstream."""
    from agent.models import BenchSpec
    from tools.loadgen import _SSE, _Counters, request_body, sample_workload
    from tools.metrics import RequestRecord, compute_level

    spec = BenchSpec(random_input_len=INPUT_LEN, random_output_len=out_len, random_range_ratio=1.0)
    w = sample_workload(spec, n)
    bodies = [request_body("generate", w.ids(i), int(w.output_lens[i])) for i in range(n)]
    headers = {"Content-Type": "application/json"}
    records: list[RequestRecord] = []
    counters = _Counters()

    if name == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )

        async def one(body: bytes) -> RequestRecord:
            sse = _SSE("generate", counters)
            start = time.perf_counter()
            error = None
            try:
                async with session.post(url + "/generate", data=body, headers=headers) as resp:
                    async for data in resp.content.iter_any():
                        sse.feed(data, time.perf_counter())
            except Exception as e:
                error = type(e).__name__
            sse.end()
            end = sse.last_line_s if error is None and sse.done else time.perf_counter()
            return RequestRecord(start, INPUT_LEN, sse.times, sse.tokens, sse.output_len, end, error)

        close = session.close
    else:
        import httpx

        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=c, max_keepalive_connections=c),
            timeout=httpx.Timeout(600.0),
            trust_env=False,
        )

        async def one(body: bytes) -> RequestRecord:
            sse = _SSE("generate", counters)
            start = time.perf_counter()
            error = None
            try:
                async with client.stream("POST", url + "/generate", content=body, headers=headers) as resp:
                    async for data in resp.aiter_raw():
                        sse.feed(data, time.perf_counter())
            except Exception as e:
                error = type(e).__name__
            sse.end()
            end = sse.last_line_s if error is None and sse.done else time.perf_counter()
            return RequestRecord(start, INPUT_LEN, sse.times, sse.tokens, sse.output_len, end, error)

        close = client.aclose

    await one(bodies[0])  # warmup, as the others do
    await asyncio.sleep(1.0)
    next_index = 0
    cpu0 = time.process_time()

    async def worker() -> None:
        nonlocal next_index
        while next_index < n:
            i = next_index
            next_index += 1
            records.append(await one(bodies[i]))

    await asyncio.gather(*(worker() for _ in range(c)))
    cpu = time.process_time() - cpu0
    await close()
    level = compute_level(records, max_concurrency=c, backend=name, dataset_name="random-ids")
    return level.model_dump() | {"client_cpu_s": cpu}


# ------------------------------------------------------------------------------ the run


def _row(name: str, c: int, r: dict, server: dict, startup_cpu_s: float) -> str:
    if "error" in r:
        return f"{c:>6}  {name:<14} failed: {r['error'][:90]}"
    tokens = r.get("total_output_tokens") or 0
    r["marginal_cpu_s"] = max(r["process_cpu_s"] - startup_cpu_s, 0.0)
    cpu_per_m = r["marginal_cpu_s"] / tokens * 1e6 if tokens else float("nan")
    ttft_add = r["mean_ttft_ms"] - (server.get("mean_ttft_ms") or 0.0)
    tpot_add = r["mean_tpot_ms"] - (server.get("mean_tpot_ms") or 0.0)
    in_flight = f"{r['mean_in_flight']:>10.0f}" if r.get("mean_in_flight") is not None else f"{'-':>10}"
    return (
        f"{c:>6}  {name:<14}{r['output_throughput']:>11,.0f}{r['mean_ttft_ms']:>9.1f}{ttft_add:>+9.1f}"
        f"{r['mean_tpot_ms']:>8.2f}{tpot_add:>+8.2f}{cpu_per_m:>9.1f}{r['process_cpu_s']:>8.1f}{in_flight}"
        f"{r.get('failed', 0):>7}{r['wall_s']:>8.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="256,1024,2048")
    parser.add_argument("--clients", default="pivot,bench_serving,aiohttp,httpx")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sglang-python", default=os.environ.get("SGLANG_PYTHON"))
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--httpx-max-level", type=int, default=1024)
    parser.add_argument("--_variant")
    parser.add_argument("--_url")
    parser.add_argument("--_c", type=int)
    parser.add_argument("--_n", type=int)
    parser.add_argument("--_out", type=int)
    args = parser.parse_args()
    if args._variant:
        print(json.dumps(asyncio.run(_variant(args._variant, args._url, args._c, args._n, args._out))))
        return

    levels = [int(x) for x in args.levels.split(",")]
    clients = [x for x in args.clients.split(",") if x]
    with tempfile.TemporaryDirectory() as tokdir:
        args.tokenizer = tokdir
        if "bench_serving" in clients and args.sglang_python:
            subprocess.run([args.sglang_python, "-c", MAKE_TOKENIZER, tokdir], check=True)
        print(
            f"server: first token {TTFT_MS:g} ms, then one every {ITL_MS:g} ms, {OUTPUT_LEN} output tokens; "
            f"2 x concurrency prompts; {os.cpu_count()} CPUs shared by server and clients"
        )
        results: dict[tuple[int, str], list[dict]] = {}
        with spawn("--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)) as url:
            startup: dict[str, float] = {}
            for name in clients:  # what a process costs before its first measured request: one 1-token request
                r = CLIENTS[name](url, 1, 1, 1, args.timeout_s, args)
                startup[name] = r.get("process_cpu_s", 0.0)
            print(
                "start-up CPU s (a run of one 1-token request): "
                + ", ".join(f"{k} {v:.2f}" for k, v in startup.items())
            )
            print(
                f"{'conc':>6}  {'client':<14}{'out tok/s':>11}{'TTFT':>9}{'+client':>9}{'TPOT':>8}{'+client':>8}"
                f"{'CPU s/M':>9}{'CPU s':>8}{'in flight':>10}{'failed':>7}{'wall s':>8}"
            )
            for _ in range(args.repeats):
                for c in levels:
                    for name in clients:
                        if name == "httpx" and c > args.httpx_max_level:
                            continue  # minutes per run: its pool is quadratic in connections
                        stats(url, reset=True)
                        r = CLIENTS[name](url, c, 2 * c, OUTPUT_LEN, args.timeout_s, args)
                        server = stats(url)
                        results.setdefault((c, name), []).append(r)
                        print(_row(name, c, r, server, startup[name]), flush=True)
        print(
            "\nTTFT, TPOT: means in ms as each client reports them; +client: what it adds to the server's own figures."
        )
        print("CPU s/M: client CPU seconds per million output tokens, start-up excluded; CPU s: whole process.")
        _ratios(results, levels)


def _ratios(results: dict[tuple[int, str], list[dict]], levels: list[int]) -> None:
    """pivot against bench_serving, on the medians over the repeats."""

    def median(c: int, name: str, key: str) -> float | None:
        values = sorted(r[key] for r in results.get((c, name), []) if "error" not in r)
        return values[len(values) // 2] if values else None

    def cpu_per_token(c: int, name: str) -> float | None:
        values = sorted(
            r["marginal_cpu_s"] / r["total_output_tokens"]
            for r in results.get((c, name), [])
            if "error" not in r and r.get("total_output_tokens")
        )
        return values[len(values) // 2] if values else None

    for c in levels:
        p_tok, b_tok = median(c, "pivot", "output_throughput"), median(c, "bench_serving", "output_throughput")
        p_cpu, b_cpu = cpu_per_token(c, "pivot"), cpu_per_token(c, "bench_serving")
        p_ttft, b_ttft = median(c, "pivot", "mean_ttft_ms"), median(c, "bench_serving", "mean_ttft_ms")
        if None in (p_tok, b_tok, p_cpu, b_cpu, p_ttft, b_ttft):
            continue
        reference = f" (the issue's bench_serving reference: ~{REFERENCE[c]:,} tok/s)" if c in REFERENCE else ""
        print(
            f"concurrency {c} (medians): pivot / bench_serving output tok/s x{p_tok / b_tok:.2f}, "
            f"client CPU per token x{p_cpu / b_cpu:.2f}, mean TTFT {p_ttft:.1f} vs {b_ttft:.1f} ms{reference}"
        )


if __name__ == "__main__":
    main()
