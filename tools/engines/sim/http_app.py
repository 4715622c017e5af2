"""The aiohttp app: SGLang's routes, the generation endpoints' request parsing, and the info endpoints."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tools.engines.sim.common import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_NEW_TOKENS,
    VERSION,
    _body,
    _dumps,
    _error,
    _text_tokens,
    http_log,
    resolved_args,
)


class RoutesMixin:
    """TwinServer's routes and the handlers that are not streaming, metrics or profile."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        for path in ("/health", "/health_generate", "/ready"):
            r.add_get(path, self.health)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_route("*", "/start_profile", self.start_profile)
        r.add_route("*", "/stop_profile", self.stop_profile)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/sim/telemetry", self.telemetry)
        r.add_post("/sim/time_scale", self.set_time_scale)
        if self.enable_metrics:
            r.add_get("/metrics", self.metrics)
        return app

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native API: `text` or `input_ids`, `sampling_params.max_new_tokens`, `stream`."""
        body = await _body(request, "generate")
        if isinstance(body, web.Response):
            return body
        ids, text = body.get("input_ids"), body.get("text")
        if ids is not None:
            if not isinstance(ids, list) or (ids and isinstance(ids[0], list)):
                return _error("generate", "The twin serves one prompt per request: input_ids must be a list of ints.")
            input_len = len(ids)
        elif isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
            input_len = _text_tokens(text[0])
        elif isinstance(text, str):
            input_len = _text_tokens(text)
        else:
            return _error("generate", "Either text or input_ids should be provided (one prompt per request).")
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens")
        max_new = DEFAULT_MAX_NEW_TOKENS["generate"] if max_new is None else max_new
        if not isinstance(max_new, int):
            return _error("generate", "sampling_params.max_new_tokens must be an integer")
        return await self._serve(request, "generate", body, input_len, max_new)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI-compatible completions: `prompt` as text or token ids, `max_tokens`."""
        body = await _body(request, "completions")
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            input_len = _text_tokens(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            input_len = len(prompt)
        else:
            return _error("completions", "prompt must be a string or a list of token ids (one prompt per request)")
        max_new = body.get("max_tokens")
        max_new = DEFAULT_MAX_NEW_TOKENS["completions"] if max_new is None else max_new
        if not isinstance(max_new, int):
            return _error("completions", "max_tokens must be an integer")
        return await self._serve(request, "completions", body, input_len, max_new)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """OpenAI-compatible chat completions: `messages`, `max_completion_tokens` or `max_tokens`."""
        body = await _body(request, "chat")
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error("chat", "messages must be a non-empty list")
        chars = 0
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            chars += len(str(content or "")) + 4 * CHARS_PER_TOKEN  # a few template tokens per message
        max_new = body.get("max_completion_tokens")
        if max_new is None:
            max_new = body.get("max_tokens")
        max_new = DEFAULT_MAX_NEW_TOKENS["chat"] if max_new is None else max_new
        if not isinstance(max_new, int):
            return _error("chat", "max_tokens must be an integer")
        return await self._serve(request, "chat", body, max(chars // CHARS_PER_TOKEN, 1), max_new)

    async def health(self, request: web.Request) -> web.Response:
        """200 once the server is up; 503 while starting or going down (SGLang's /health)."""
        if self.status != "Up":
            return web.Response(status=503)
        return web.Response(status=200)

    def info(self) -> dict[str, Any]:
        """What /server_info reports: SGLang's args with their resolved values, the twin's view, the time scale."""
        args = resolved_args(self.twin)
        core = self.core
        return {
            **args,
            **self.twin.server_info(),
            "time_scale": self.scale,
            "max_total_num_tokens": self.twin.limits.kv_capacity_tokens,
            "max_req_input_len": self.twin.model.context_length - 1,
            "internal_states": [
                {
                    "last_gen_throughput": round(self.last_gen_throughput, 3),
                    "num_running_reqs": len(core.running),
                    "num_queue_reqs": len(core.waiting),
                    "token_usage": round(core.token_usage(), 4),
                    "sim_time_s": round(self.sim_now(), 6),
                    "wall_lag_s": round(self.wall_lag_s, 6),
                    "busy_s": round(core.busy_s, 6),  # simulated seconds of engine steps so far
                    "memory_usage": {
                        "weight": self.twin.resolved["weights_gib_per_gpu"],
                        "kvcache": self.twin.resolved["kv_pool_gib_per_gpu"],
                    },
                }
            ],
            "version": VERSION,
            "status": self.status,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        if request.path == "/get_server_info":
            http_log.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                             "Please use '/server_info' instead.")  # fmt: skip
        return web.json_response(self.info(), dumps=_dumps)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.args.get("tokenizer_path") or self.model_path,
                "served_model_name": self.served_model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "architectures": [self.twin.model.architecture],
            }
        )

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.served_model_name,
            "object": "model",
            "created": self._created,
            "owned_by": "sglang",
            "root": self.model_path,
            "parent": None,
            "max_model_len": self.twin.model.context_length,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.served_model_name:
            return web.json_response(
                {"object": "error", "message": f"The model `{request.match_info['model']}` does not exist.",
                 "type": "NotFoundError", "param": None, "code": 404},
                status=404,
            )  # fmt: skip
        return web.json_response(self._model_card())

    async def set_time_scale(self, request: web.Request) -> web.Response:
        """pivot's own: run the simulated clock `time_scale` times faster than the wall clock from now on (a lower
        one when this host fell behind it); refused (409) while requests are in flight, so no request straddles two
        scales. Answers the scale in force and the wall seconds lost so far."""
        from agent.errors import PivotError
        from tools.engines.sim.options import check_twin_options

        try:
            body = await request.json()
            scale = float(body["time_scale"])
            check_twin_options(time_scale=scale)
        except (ValueError, KeyError, TypeError, PivotError) as e:
            return web.json_response({"error": f'give {{"time_scale": X}} with a positive number ({e})'}, status=400)
        if self.streams:
            return web.json_response({"error": "requests are in flight"}, status=409)
        self.rescale(scale)
        http_log.info(f"pivot twin: time scale {scale:g} (simulated seconds per wall second) from now on")
        return web.json_response({"time_scale": self.scale, "wall_lag_s": self.wall_lag_s})

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")  # fmt: skip
