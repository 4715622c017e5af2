"""A stand-in for `vllm serve` (vLLM 0.33.0) for tests and by-hand runs: no GPU, no model, vLLM's command line.

    python tests/fake_vllm.py serve --model m --tensor-parallel-size 1 --host 127.0.0.1 --port 8000

It parses its argv with the catalog generated from vLLM 0.33.0's own parser (tools/engines/catalog/vllm-0.33.0.json),
so an unknown, ambiguous or badly typed flag ends it as vLLM's argparse would (usage, "vllm serve: error: ...",
exit 2). Then it logs vLLM's start-up lines, binds --host/--port (vLLM's defaults: every interface, port 8000) and
logs uvicorn's "Application startup complete.". It serves /health, /v1/models, /v1/completions and
/v1/chat/completions (streamed as SSE with usage, or whole), and /metrics with vLLM's gauges
(vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc). Each request decodes one token
every `--fake-tpot-ms` milliseconds (default 2); `--max-num-seqs` requests run at once, the rest wait.

Faults, so the failure rules can be tested against vLLM's own words:
- `--gpu-memory-utilization` below 0.1 ends start-up with vLLM's "No available memory for the cache blocks" error;
- `FAKE_VLLM_CRASH_AFTER=N` ends the process with a CUDA illegal-memory-access error after N requests;
- a prompt id at or beyond the model's vocabulary (its directory's config.json vocab_size, else
  `FAKE_VLLM_VOCAB`) is refused with HTTP 400 as vLLM refuses it ("Token id N is out of vocabulary").
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.engines.catalog import CatalogError, load_catalog  # noqa: E402

PREFIX = "(APIServer pid={pid}) INFO {when} [{where}] "


def log(where: str, text: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(PREFIX.format(pid=os.getpid(), when=stamp, where=where) + text, flush=True)


class State:
    def __init__(self, model: str, max_num_seqs: int, tpot_s: float, crash_after: int | None) -> None:
        self.model, self.max_num_seqs, self.tpot_s, self.crash_after = model, max_num_seqs, tpot_s, crash_after
        config = Path(model) / "config.json"
        vocab = json.loads(config.read_text()).get("vocab_size") if config.is_file() else None
        self.vocab = int(vocab or os.environ.get("FAKE_VLLM_VOCAB") or 0) or None
        self.running = 0
        self.waiting = 0
        self.served = 0
        self.slots = asyncio.Semaphore(max_num_seqs)


async def respond(
    writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str = "application/json"
) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "OK")
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()


def metrics_text(state: State) -> str:
    labels = f'{{engine="0",model_name="{state.model}"}}'
    kv = min(1.0, state.running / max(state.max_num_seqs, 1))
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{labels} {float(state.running)}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{labels} {float(state.waiting)}\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{labels} {kv}\n"
    )


async def generate(writer: asyncio.StreamWriter, state: State, body: dict, chat: bool) -> None:
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    prompt = body.get("prompt") if not chat else body.get("messages")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    beyond = (
        [t for t in prompt if isinstance(t, int) and t >= state.vocab]
        if state.vocab and isinstance(prompt, list)
        else []
    )
    if beyond:  # vLLM's input processor: HTTP 400, an OpenAI error object
        error = {"message": f"Token id {beyond[0]} is out of vocabulary", "type": "BadRequestError", "param": None,
                 "code": 400}  # fmt: skip
        await respond(writer, 400, json.dumps({"error": error}).encode())
        return
    stream = bool(body.get("stream"))
    state.waiting += 1
    async with state.slots:
        state.waiting -= 1
        state.running += 1
        try:
            if stream:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
            pieces = []
            for i in range(max_tokens):
                await asyncio.sleep(state.tpot_s)
                piece = f" w{i}"
                pieces.append(piece)
                if stream:
                    last = i == max_tokens - 1
                    choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                    choice["finish_reason"] = "length" if last else None
                    await send_chunk(writer, {"id": "cmpl-fake", "object": "text_completion", "choices": [choice]})
        finally:
            state.running -= 1
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    }
    state.served += 1
    if stream:
        await send_chunk(writer, {"id": "cmpl-fake", "choices": [], "usage": usage})
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()
    else:
        text = "".join(pieces)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
        await respond(
            writer, 200, json.dumps({"choices": [{**choice, "finish_reason": "length"}], "usage": usage}).encode()
        )
    if state.crash_after is not None and state.served >= state.crash_after:
        print("ERROR [core.py:1021] EngineCore encountered a fatal error.", flush=True)
        print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
        os._exit(1)


async def send_chunk(writer: asyncio.StreamWriter, obj: dict) -> None:
    data = f"data: {json.dumps(obj)}\n\n".encode()
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: State) -> None:
    try:
        while True:
            request = await reader.readline()
            if not request:
                return
            method, path, _ = request.decode().split(" ", 2)
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if path == "/health":
                await respond(writer, 200, b"")
            elif path == "/metrics":
                await respond(writer, 200, metrics_text(state).encode(), "text/plain; version=0.0.4")
            elif path == "/v1/models":
                await respond(writer, 200, json.dumps({"object": "list", "data": [{"id": state.model}]}).encode())
            elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                await generate(writer, state, body, chat=path.endswith("chat/completions"))
            else:
                await respond(writer, 404, b'{"detail":"Not Found"}')
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def serve(args: dict) -> None:
    tpot_s = float(os.environ.get("FAKE_VLLM_TPOT_MS", "2")) / 1000
    crash = os.environ.get("FAKE_VLLM_CRASH_AFTER")
    model = args["model_tag"] or args["model"]
    state = State(model, int(args["max_num_seqs"] or 256), tpot_s, int(crash) if crash else None)
    host = args["host"] or "0.0.0.0"
    server = await asyncio.start_server(lambda r, w: handle(r, w, state), host, int(args["port"]))
    log("api_server.py:139", f"Starting vLLM server on http://{host}:{args['port']}")
    print(f"INFO:     Started server process [{os.getpid()}]", flush=True)
    print("INFO:     Waiting for application startup.", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    catalog = load_catalog("vllm", "0.33.0")
    try:
        args = catalog.parse(argv, require_model=False)
    except CatalogError as e:
        sys.stderr.write(e.stderr)
        return e.exit_code
    log(
        "utils.py:233",
        f"non-default args: {{'model': {args['model']!r}, 'tensor_parallel_size': {args['tensor_parallel_size']}}}",
    )
    if args["gpu_memory_utilization"] < 0.1:
        print("Traceback (most recent call last):", flush=True)
        print(
            '  File "/usr/lib/python3/dist-packages/vllm/v1/core/kv_cache_planning.py", line 57, in check_enough_kv_cache_memory',
            flush=True,
        )
        print("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
              "initializing the engine.", flush=True)  # fmt: skip
        print(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}", flush=True
        )
        return 1
    try:
        asyncio.run(serve(args))
    except OSError as e:
        print(f"OSError: [Errno {e.errno}] {e.strerror}", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
