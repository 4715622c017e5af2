"""pivot: an LLM-driven optimization assistant for LLM inference serving (SGLang first)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pivot-serving")
except PackageNotFoundError:  # running from a checkout that was not installed
    __version__ = "0.0.0+unknown"
