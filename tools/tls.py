"""The TLS context pivot's HTTP clients share.

httpx builds a context for every client it makes (reading the CA bundle: about 20 ms of CPU) even when every URL
it will see is http:// on loopback, and pivot makes clients often (a readiness poll, a telemetry reading). One per
process, verifying as httpx's own default does, costs that once.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (certifi's CA bundle), built on first use."""
    return httpx.create_ssl_context()
