"""The workload of a level, drawn as `sglang.bench_serving` draws it: lengths, prompts, arrivals, request bodies."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.models import BenchSpec
from tools.metrics import DEFAULT_VOCAB_SIZE, workload_draws

ENDPOINT_PATHS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
_BACKEND_SUFFIX = {"generate": "", "completions": "-oai", "chat": "-oai-chat"}  # sglang, sglang-oai, sglang-oai-chat
WARMUP_OUTPUT_LEN = 32  # bench_serving's warmup asks for min(output_len, 32) tokens


# Common English words that are one token each (with their leading space) in GPT-2, Llama, Qwen and
# GLM tokenizers; random text is drawn from them so that L words are about L tokens.
_WORDS_TEXT = """the of and to in is that for it as was with be by on not he this are or his from at which but have
    an had they you were their one all we can her has there been if more when will would who so no time
    out up use made new like now very first may such only over other some these two then them into its
    than most could what way about many people work year years day part state same long after where
    well good back great still know world place under own find any make both take even life down
    just house being old water three give each high small much same last think also our before here
    home never while right another might found through off take left end why must group need line
    every number city large name open change point light order side read war book child play turn
    move case form word plan run real hand road best four land full late help face mind body early
    area kind near game half body top close past free power table stay voice"""
WORDS = tuple(dict.fromkeys(_WORDS_TEXT.split()))


# ---------------------------------------------------------------------------------------------- workload


@dataclass(slots=True)
class Workload:
    """One level's prompts as bench_serving draws them for random-ids (same seed, same numbers), and when each is due."""

    input_lens: np.ndarray
    output_lens: np.ndarray
    offsets: np.ndarray
    arrivals_s: np.ndarray  # seconds after the level starts; all 0 when the request rate is infinite
    vocab_size: int
    seed: int
    _words: np.ndarray | None = None  # word indices of every text prompt, drawn on first use
    _word_starts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.input_lens)

    def ids(self, i: int) -> list[int]:
        """bench_serving's random-ids prompt i: consecutive ids from a random offset, modulo the vocabulary."""
        return ((np.arange(int(self.input_lens[i])) + (int(self.offsets[i]) + i)) % self.vocab_size).tolist()

    def text(self, i: int) -> str:
        """Random text of input_lens[i] common words (about that many tokens)."""
        if self._words is None or self._word_starts is None:
            # a generator of its own, so that bench_serving's sequence of draws above stays untouched
            rng = np.random.default_rng(self.seed)
            self._words = rng.integers(0, len(WORDS), size=int(self.input_lens.sum()), dtype=np.int16)
            self._word_starts = np.concatenate(([0], np.cumsum(self.input_lens)))
        start = int(self._word_starts[i])
        return " ".join(map(WORDS.__getitem__, self._words[start : start + int(self.input_lens[i])].tolist()))


def sample_workload(spec: BenchSpec, num_prompts: int, *, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Workload:
    """The prompts of one level: bench_serving's random-ids draws with `spec.seed`, in bench_serving's order."""
    input_lens, output_lens, offsets, arrivals = workload_draws(spec, num_prompts, vocab_size)
    return Workload(input_lens, output_lens, offsets, arrivals, vocab_size, spec.seed)


def request_body(
    endpoint: str,
    prompt: list[int] | str,
    output_len: int,
    *,
    ignore_eos: bool = True,
    model: str | None = None,
) -> bytes:
    """The JSON body of one streaming request to `endpoint`, as bench_serving builds it."""
    body: dict[str, Any]
    if endpoint == "generate":
        body = {
            ("input_ids" if isinstance(prompt, list) else "text"): prompt,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": ignore_eos},
            "stream": True,
        }
    else:
        body = {} if model is None else {"model": model}
        if endpoint == "completions":
            body["prompt"] = prompt
        else:
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            body["messages"] = [{"role": "user", "content": text}]
            body["max_completion_tokens"] = output_len  # the current name; max_tokens for older servers
        body.update(max_tokens=output_len, temperature=0.0)
        if ignore_eos:  # false is every server's default; strict OpenAI servers (transformers serve) refuse the key
            body["ignore_eos"] = True
        body.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(body, separators=(",", ":")).encode()
