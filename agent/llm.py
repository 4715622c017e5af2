"""The agent's model by name: the built-in autopilot, a replayed script (`--model script:FILE.jsonl`), or a provider's
model (pydantic-ai's `provider:name`, or any name at an OpenAI-compatible `--model-base-url`), built and checked
before anything runs. agent/loop.py runs the campaign with it; agent/investigate.py builds its investigator from it."""

from __future__ import annotations

from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model

from agent.errors import PivotError
from agent.settings import settings

AUTOPILOT = "autopilot"
SCRIPT_PREFIX = "script:"  # --model script:FILE.jsonl (agent/script_model.py)


def check_model_base_url(url: str) -> str:
    """`--model-base-url` checked before it is used or stored: an http(s) URL with a host and a port in range, and no
    credentials in it (a user:password@ or a query string: the ledger keeps the URL, and keys never go to disk)."""
    from urllib.parse import urlsplit

    hint = "e.g. --model-base-url http://127.0.0.1:30000/v1; a key goes in $PIVOT_MODEL_API_KEY, never in the URL"
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # ValueError when it is not a number in 0..65535
    except ValueError as e:
        raise PivotError(f"--model-base-url is not a URL: {e}", hint=hint) from e
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PivotError("--model-base-url needs http:// or https:// and a host", hint=hint)
    if port == 0:
        raise PivotError("--model-base-url has port 0", hint=hint)
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise PivotError(
            "--model-base-url carries credentials or a query string, and the ledger records the URL",
            hint="give the server's base URL alone and its key in $PIVOT_MODEL_API_KEY",
        )
    return url.strip()


def provider_model(name: str, base_url: str | None) -> Model:
    """A model other than the autopilot, built now so that a missing key or an unknown provider is a clear error
    before anything runs (nothing is sent to it here)."""
    if base_url:
        base_url = check_model_base_url(base_url)
    if name.startswith(SCRIPT_PREFIX):  # a replayed file: checked now, whole
        from agent.script_model import ScriptModel

        return ScriptModel(name).model
    from agent.model_limits import GuardedModel, capped_client

    timeout_s = model_timeout_s()
    deadline_s = timeout_s * (model_retries() + 1) + 60.0  # every attempt at its deadline, and the backoff between
    try:
        if base_url:
            from openai import AsyncOpenAI
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai_compatible import OpenAICompatibleProvider

            model_name = name.split(":", 1)[1] if ":" in name else name
            given = settings()
            key = given.model_api_key
            client = AsyncOpenAI(
                base_url=base_url,
                api_key=key.get_secret_value() if key is not None else "api-key-not-set",
                max_retries=given.model_retries,  # connection errors, timeouts, 408, 409, 429 and 5xx, with backoff
                timeout=timeout_s,
                http_client=capped_client(timeout_s),  # the timeout is a total deadline, the answer's size capped
            )
            provider = OpenAICompatibleProvider("pivot-model", openai_client=client)
            return GuardedModel(OpenAIChatModel(model_name, provider=provider), deadline_s)
        from pydantic_ai.models import infer_model

        return GuardedModel(infer_model(name), deadline_s)
    except UserError as e:
        raise PivotError(
            f"cannot use model {name!r}: {e}",
            hint="set the provider's API key in the environment (e.g. ANTHROPIC_API_KEY, OPENAI_API_KEY), "
            "or use --model-base-url for an OpenAI-compatible server, or --model autopilot",
        ) from e


def model_retries() -> int:
    """The OpenAI-compatible client's retries (with backoff) before a failure is reported ($PIVOT_MODEL_RETRIES)."""
    return settings().model_retries


def model_timeout_s() -> float:
    """The deadline of one attempt at a model request, in all, not per read ($PIVOT_MODEL_TIMEOUT_S)."""
    return settings().model_timeout_s
