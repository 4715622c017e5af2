"""The digital twin of an SGLang server: cost model, virtual-time scheduler, engines and HTTP server."""
