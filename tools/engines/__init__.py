"""Serving engines pivot drives (SGLang, its digital twin, any OpenAI-compatible command) and their command lines."""
