#!/usr/bin/env bash
# Issue 9 on one NVIDIA H200 (a lent device machine with PyTorch, transformers and nvidia-ml-py, no network):
# 1. GEMM micro-benchmarks of GLM-5's expert shapes (TP1 and TP8 widths) and Llama 3.3 70B's linear layers, bf16 and
#    fp8, with `python -m tools.gemm` (PyTorch only);
# 2. pivot itself and transformers serve's extra from carried wheels (.whl/, see the note in the report);
# 3. the real path: `pivot launch-bench --engine command` launching `transformers serve --continuous-batching` on a
#    small random model made on the spot, benchmarked at a few concurrency levels while NVML is sampled.
# Run from the repository root with OUT set to a folder for the results (at most 8 files come back).
#
# The wheels (.whl/, git-ignored, 10 MB; Python 3.12, x86-64), fetched on a machine with PyPI:
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl"
#   pip download $P pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     typing-extensions==4.16.0 pydantic-ai-slim==2.68.0 pydantic-graph==2.68.0 genai-prices==0.2.3 griffelib==2.4.1 \
#     logfire-api==5.6.0 opentelemetry-api==1.45.2 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
#     sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 \
#     anyio==4.16.0 openai==3.57.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 annotated-doc==0.0.7 \
#     fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0
# (pivot's own dependencies the image lacks, and transformers serve's extra; the image has torch, transformers,
# tokenizers, aiohttp, numpy, click, rich, prometheus-client, nvidia-ml-py). The GPU tests additionally carried
# pytest==9.2.0 pytest-asyncio==1.5.0 pluggy==1.7.0 iniconfig==2.3.1 in .whl/test/ and ran
#   PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -p pytest_asyncio.plugin -q tests/test_microbench.py
set -u
OUT=${OUT:?set OUT}
export PYTHONUNBUFFERED=1
ENV_LOG=$OUT/env.log

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  python3 -m pip list 2>/dev/null | grep -i -E '^(transformers|tokenizers|aiohttp|click|rich|numpy|anyio|httpx|setuptools|typer|nvidia-ml-py) '
} >"$ENV_LOG" 2>&1

# 1. micro-benchmarks (SKIP_GEMM=1 skips them); each case is rewritten into the JSON as it finishes, so a timeout
#    keeps what was measured
[ "${SKIP_GEMM:-0}" = 1 ] || {
timeout 300 python3 -m tools.gemm --model-profile glm-5-nvfp4 --hardware h200 --tp 1,8 --dtype bf16,fp8 \
  --json-out "$OUT/gemm-glm5.json" >"$OUT/gemm.log" 2>&1
echo "glm5 rc=$?" >>"$OUT/gemm.log"
timeout 200 python3 -m tools.gemm --model-profile llama-3.3-70b-fp8 --hardware h200 --tp 1 --dtype bf16,fp8 \
  --no-ceilings --json-out "$OUT/gemm-llama.json" >>"$OUT/gemm.log" 2>&1
echo "llama rc=$?" >>"$OUT/gemm.log"
}

# 2. pivot and the serving extra, offline
{
  rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation --target /tmp/site \
    .whl/*.whl . && echo "installed pivot and $(ls .whl | wc -l) wheels into /tmp/site"
} >>"$ENV_LOG" 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
export PIVOT_HOME=/tmp/pivot-home HF_HUB_CACHE=/tmp/hf-cache
mkdir -p "$PIVOT_HOME" "$HF_HUB_CACHE"
{
  pivot --version && pivot tools | grep -E '^  [a-z]'
  pivot power --json
  # the CLI's own measuring path on the GPU (a few cases, not recorded)
  pivot microbench --model-profile glm-5-nvfp4 --tp 8 --rows 1,64 --dtype bf16,fp8 --no-record
} >>"$ENV_LOG" 2>&1

# 3. the real path
python3 scripts/make_tiny_model.py /tmp/tiny-llama >>"$ENV_LOG" 2>&1
timeout 300 pivot launch-bench --engine command --plan llama70b-fp8-h200x1 --timeout-s 240 \
  -o 'command=transformers serve --continuous-batching --host 127.0.0.1 --port {port} --dtype bfloat16 /tmp/tiny-llama' \
  --endpoint chat --disable-ignore-eos --concurrency 1,4,16,64 --input-len 256 --output-len 128 \
  --output-file "$OUT/rp-levels.jsonl" --telemetry-file "$OUT/rp-telemetry.jsonl" >"$OUT/rp.log" 2>&1
echo "launch-bench rc=$?" >>"$OUT/rp.log"
pivot sessions >>"$OUT/rp.log" 2>&1
tar czf "$OUT/rp-state.tgz" -C "$PIVOT_HOME" state 2>>"$ENV_LOG"
nvidia-smi --query-gpu=power.draw,clocks.sm,temperature.gpu --format=csv >>"$ENV_LOG" 2>&1
