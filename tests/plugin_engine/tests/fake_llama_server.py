"""A stand-in for llama.cpp's `llama-server` for the plugin's tests: no GPU, no model file, llama-server's options.

    python tests/fake_llama_server.py -m model.gguf -c 8192 --host 127.0.0.1 --port 8080 --metrics

It parses its argv with the plugin's own catalog (so a flag llama-server refuses ends it with argparse's words, exit
2), logs llama-server's start-up lines, answers /health with 503 while "loading the model" (FAKE_LLAMA_LOAD_S,
default 0.2 s), then prints "server is listening on" and serves /health, /v1/models, /v1/completions and
/v1/chat/completions (streamed as SSE with usage, or whole) and, with --metrics, /metrics with llama-server's gauges.
`-np` requests decode at once (one token every FAKE_LLAMA_TPOT_MS, default 2), the rest are deferred.

A fault in llama.cpp's words: a --ctx-size over 131072 fails to allocate the KV cache (an out-of-memory at start-up).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from pivot_llamacpp.engine import ARGTYPES, VERSION

from tools.engines.catalog import CatalogError, load_catalog

MAX_CTX = 131072


class State:
    def __init__(self, model: str, parallel: int, tpot_s: float) -> None:
        self.model, self.parallel, self.tpot_s = model, parallel, tpot_s
        self.processing = 0
        self.deferred = 0
        self.ready = False
        self.slots = asyncio.Semaphore(parallel)


async def respond(writer: asyncio.StreamWriter, status: int, body: bytes, kind: str = "application/json") -> None:
    reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "OK")
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()


def metrics_text(state: State) -> str:
    usage = min(1.0, state.processing / max(state.parallel, 1))
    return (
        "# TYPE llamacpp:requests_processing gauge\n"
        f"llamacpp:requests_processing {float(state.processing)}\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        f"llamacpp:requests_deferred {float(state.deferred)}\n"
        "# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
        f"llamacpp:kv_cache_usage_ratio {usage}\n"
    )


async def send_chunk(writer: asyncio.StreamWriter, obj: dict) -> None:
    data = f"data: {json.dumps(obj)}\n\n".encode()
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def generate(writer: asyncio.StreamWriter, state: State, body: dict, chat: bool) -> None:
    max_tokens = int(body.get("max_tokens") or body.get("n_predict") or 16)
    prompt = body.get("messages") if chat else body.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    stream = bool(body.get("stream"))
    state.deferred += 1
    async with state.slots:
        state.deferred -= 1
        state.processing += 1
        try:
            if stream:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
            for i in range(max_tokens):
                await asyncio.sleep(state.tpot_s)
                if stream:
                    piece = f" t{i}"
                    choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                    choice["finish_reason"] = "length" if i == max_tokens - 1 else None
                    await send_chunk(writer, {"id": "cmpl-llama", "object": "text_completion", "choices": [choice]})
        finally:
            state.processing -= 1
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    }
    if stream:
        await send_chunk(writer, {"id": "cmpl-llama", "choices": [], "usage": usage})
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()
        return
    text = "".join(f" t{i}" for i in range(max_tokens))
    choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
    await respond(
        writer, 200, json.dumps({"choices": [{**choice, "finish_reason": "length"}], "usage": usage}).encode()
    )


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: State, metrics: bool) -> None:
    try:
        while request := await reader.readline():
            method, path, _ = request.decode().split(" ", 2)
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if path == "/health":
                ok = state.ready
                status = b'{"status":"ok"}' if ok else b'{"error":{"code":503,"message":"Loading model"}}'
                await respond(writer, 200 if ok else 503, status)
            elif path == "/metrics" and metrics:
                await respond(writer, 200, metrics_text(state).encode(), "text/plain; version=0.0.4")
            elif path == "/v1/models":
                await respond(writer, 200, json.dumps({"object": "list", "data": [{"id": state.model}]}).encode())
            elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                await generate(writer, state, body, chat=path.endswith("chat/completions"))
            else:
                await respond(writer, 404, b'{"error":{"code":404,"message":"File Not Found"}}')
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def serve(args: dict) -> None:
    tpot_s = float(os.environ.get("FAKE_LLAMA_TPOT_MS", "2")) / 1000
    state = State(args["alias"] or os.path.basename(args["model"]), args["parallel"], tpot_s)
    server = await asyncio.start_server(lambda r, w: handle(r, w, state, args["metrics"]), args["host"], args["port"])
    print(
        f"main: HTTP server is listening, hostname: {args['host']}, port: {args['port']}, http threads: 3", flush=True
    )
    print(f"main: loading model {args['model']}", flush=True)
    await asyncio.sleep(float(os.environ.get("FAKE_LLAMA_LOAD_S", "0.2")))
    state.ready = True
    print("main: model loaded", flush=True)
    print(f"main: server is listening on http://{args['host']}:{args['port']} - starting the main loop", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    catalog = load_catalog("llama-server", VERSION, package="pivot_llamacpp", argtypes=ARGTYPES)
    try:
        args = catalog.parse(argv)
    except CatalogError as e:
        sys.stderr.write(e.stderr)
        return e.exit_code
    print(f"build: {VERSION} (fake) with cc for x86_64-linux-gnu", flush=True)
    print(f"system info: n_threads = {args['threads']}, ctx-size = {args['ctx_size']}", flush=True)
    if args["ctx_size"] > MAX_CTX:
        print(f"llama_kv_cache: failed to allocate CUDA0 buffer of size {args['ctx_size'] * 131072}", flush=True)
        print("llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
              flush=True)  # fmt: skip
        return 1
    try:
        asyncio.run(serve(args))
    except OSError as e:
        print(f"couldn't bind HTTP server socket, hostname: {args['host']}, port: {args['port']}: {e}", flush=True)
        print("Address already in use" if e.errno == 98 else str(e), flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
