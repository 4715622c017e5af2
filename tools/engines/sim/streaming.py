"""Requests in flight: admitting them to the engine, and their answers, streamed (SSE) or whole."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

from aiohttp import web

from tools.engines.sim.common import TOKEN_ID, TOKEN_TEXT, BadRequest, Stream, _error
from tools.engines.sim.scheduler import Req


class StreamingMixin:
    """TwinServer's request admission and response streaming."""

    def _admit(self, request: web.Request, endpoint: str, input_len: int, max_new_tokens: int) -> Stream:
        context = self.twin.model.context_length
        if input_len < 1:
            raise BadRequest("The input is empty: send at least one token.")
        if input_len >= context:
            raise BadRequest(
                f"The input ({input_len} tokens) is longer than the model's context length ({context} tokens)."
            )
        if max_new_tokens < 1:
            raise BadRequest("max_new_tokens must be at least 1 (the twin generates exactly max_new_tokens)")
        if input_len + max_new_tokens > context:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. You "
                f"requested a total of {input_len + max_new_tokens} tokens: {input_len} tokens from the input "
                f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in "
                "the input messages or the completion to fit within the limit."
            )
        rid = self._next_rid
        self._next_rid += 1
        req = Req(rid, input_len, max_new_tokens)
        s = Stream(uuid.uuid4().hex, req, endpoint, max_new_tokens, request, self.sim_now())
        self.streams[rid] = s
        self.core.add(req)
        self._work.set()
        return s

    def _abort(self, s: Stream) -> None:
        """The client left: drop it if it still waits; a running request finishes silently."""
        if s.done or s.gone:
            return
        s.gone = True
        self.aborted_total += 1
        with contextlib.suppress(ValueError):
            self.core.waiting.remove(s.req)
            self.streams.pop(s.req.rid, None)

    async def _serve(self, request: web.Request, endpoint: str, body: dict[str, Any], input_len: int,
                     max_new_tokens: int) -> web.StreamResponse:  # fmt: skip
        if self.status in ("Crashed", "Stopping"):
            raise web.HTTPServiceUnavailable(text="The server is shutting down.")
        try:
            s = self._admit(request, endpoint, input_len, max_new_tokens)
        except BadRequest as e:
            return _error(endpoint, str(e))
        try:
            if body.get("stream"):
                return await self._stream(request, s, body)
            while not s.done:
                await s.wake.wait()
                s.wake.clear()
                if self.status in ("Crashed", "Stopping"):
                    raise ConnectionResetError("the server went down")
            return web.json_response(self._final(s))
        finally:
            if not s.done and self.status not in ("Crashed", "Stopping"):
                self._abort(s)

    async def _stream(self, request: web.Request, s: Stream, body: dict[str, Any]) -> web.StreamResponse:
        usage = bool((body.get("stream_options") or {}).get("include_usage")) and s.endpoint != "generate"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if s.endpoint == "chat":
            await resp.write(self._chat_role(s))
        sent = 0
        while True:
            await s.wake.wait()
            s.wake.clear()
            if self.status in ("Crashed", "Stopping"):
                raise ConnectionResetError("the server went down")
            n = s.tokens
            out = [self._event(s, k, last=s.done and k == n) for k in range(sent + 1, n + 1)]
            sent = n
            if s.done:
                if usage:
                    out.append(self._usage_event(s))
                out.append(b"data: [DONE]\n\n")
                await resp.write(b"".join(out))
                break
            if out:
                await resp.write(b"".join(out))
        await resp.write_eof()
        return resp

    def _meta(self, s: Stream, k: int, last: bool) -> dict[str, Any]:
        return {
            "id": s.rid,
            "finish_reason": {"type": "length", "length": s.max_new_tokens} if last else None,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": k,
            "cached_tokens": 0,
            "e2e_latency": round(self.sim_now() - s.arrived_s, 6),
        }

    def _event(self, s: Stream, k: int, last: bool) -> bytes:
        if s.endpoint == "generate":
            data: dict[str, Any] = {
                "text": TOKEN_TEXT * k,
                "output_ids": [TOKEN_ID] * k,
                "meta_info": self._meta(s, k, last),
            }
        elif s.endpoint == "completions":
            data = {
                "id": s.rid,
                "object": "text_completion",
                "created": self._created,
                "model": self.served_model_name,
                "choices": [{"index": 0, "text": TOKEN_TEXT, "logprobs": None,
                             "finish_reason": "length" if last else None, "matched_stop": None}],
                "usage": None,
            }  # fmt: skip
        else:
            data = {
                "id": s.rid,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self.served_model_name,
                "choices": [{"index": 0, "delta": {"role": None, "content": TOKEN_TEXT}, "logprobs": None,
                             "finish_reason": "length" if last else None, "matched_stop": None}],
                "usage": None,
            }  # fmt: skip
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def _chat_role(self, s: Stream) -> bytes:
        data = {
            "id": s.rid,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self.served_model_name,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}],
            "usage": None,
        }  # fmt: skip
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def _usage(self, s: Stream) -> dict[str, int]:
        return {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.tokens,
            "total_tokens": s.prompt_tokens + s.tokens,
        }

    def _usage_event(self, s: Stream) -> bytes:
        data = {
            "id": s.rid,
            "object": "chat.completion.chunk" if s.endpoint == "chat" else "text_completion",
            "created": self._created,
            "model": self.served_model_name,
            "choices": [],
            "usage": self._usage(s),
        }
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def _final(self, s: Stream) -> dict[str, Any]:
        text = TOKEN_TEXT * s.tokens
        if s.endpoint == "generate":
            return {"text": text, "output_ids": [TOKEN_ID] * s.tokens, "meta_info": self._meta(s, s.tokens, True)}
        common = {"id": s.rid, "created": self._created, "model": self.served_model_name, "usage": self._usage(s)}
        if s.endpoint == "completions":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "matched_stop": None}
            return {**common, "object": "text_completion", "choices": [choice]}
        message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length", "matched_stop": None}
        return {**common, "object": "chat.completion", "choices": [choice]}
