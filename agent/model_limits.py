"""Bounds on what a model can cost a session: a total deadline per model request and a cap on the size of its answer,
and an answer that cannot be read classified as the model's failure (never a traceback, never a session left
`active`).

The OpenAI SDK's timeout is per read: a body that trickles forever never times out, and it is read whole into
memory. `CappedTransport` (the HTTP client of a model at `--model-base-url`) ends an answer that goes past
`PIVOT_MODEL_TIMEOUT_S` in all or past MAX_ANSWER_BYTES, as a read error the SDK retries and then reports;
`GuardedModel` wraps every model with the same deadline over the whole request (its retries included) and turns an
answer the provider's code cannot read (`{"choices": "nope"}`) into UnexpectedModelBehavior, which the loop records
as the model's failure, leaving the session `waiting` to resume.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx2
from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

MAX_ANSWER_BYTES = 32 * 2**20  # a chat completion is kilobytes; tens of megabytes is a server gone wrong


class _CappedStream(httpx2.AsyncByteStream):
    """A response body read while it stays under the size cap and the request's total deadline."""

    def __init__(self, inner: httpx2.AsyncByteStream, deadline: float, cap: int) -> None:
        self.inner, self.deadline, self.cap = inner, deadline, cap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self.inner:
            read += len(chunk)
            if read > self.cap:
                raise httpx2.ReadError(f"the model's answer passed {self.cap // 2**20} MiB: cut")
            if time.monotonic() > self.deadline:
                raise httpx2.ReadTimeout("the model's answer was still arriving at the request's deadline: cut")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """httpx2's transport with a total deadline per request (`total_s`, headers and body together) and a size cap."""

    def __init__(self, total_s: float, cap: int = MAX_ANSWER_BYTES) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.total_s, self.cap = total_s, cap

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        deadline = time.monotonic() + self.total_s
        try:
            response = await asyncio.wait_for(self.inner.handle_async_request(request), self.total_s)
        except TimeoutError:
            raise httpx2.ReadTimeout(
                "no answer from the model within the request's deadline", request=request
            ) from None
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, deadline, self.cap),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def capped_client(total_s: float) -> httpx2.AsyncClient:
    """The HTTP client of a model at --model-base-url: per-read timeout and total deadline both `total_s`."""
    return httpx2.AsyncClient(transport=CappedTransport(total_s), timeout=httpx2.Timeout(total_s, connect=10.0))


class GuardedModel(WrapperModel):
    """Every model request within `deadline_s` (the SDK's retries included), and an answer its provider's code
    cannot read turned into UnexpectedModelBehavior (the loop's model failure) rather than a traceback."""

    def __init__(self, wrapped: Model | str, deadline_s: float) -> None:
        super().__init__(wrapped)
        self.deadline_s = deadline_s

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        try:
            return await asyncio.wait_for(
                self.wrapped.request(messages, model_settings, model_request_parameters), self.deadline_s
            )
        except (ModelAPIError, UnexpectedModelBehavior, asyncio.CancelledError):
            raise
        except TimeoutError:
            raise UnexpectedModelBehavior(f"no answer within {self.deadline_s:g} s (the request's deadline)") from None
        except Exception as e:  # the provider's code could not read the answer: the model's failure, not pivot's
            raise UnexpectedModelBehavior(f"its answer could not be read ({type(e).__name__}: {e})") from e
