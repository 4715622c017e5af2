#!/usr/bin/env bash
# The real GPU campaign on a GPU host ([silicon] step 6): pivot itself, installed from carried wheels, runs
# scripts/gpu_campaign/plan.toml to its end against `transformers serve --continuous-batching` serving a Llama 3.1
# 8B made here with random weights (scripts/make_tiny_model.py --device cuda), answering `continue` at every pivot.
# Run from the repository root with OUT set to a folder for what comes back:
#
#     OUT=/tmp/out bash scripts/gpu_campaign/run.sh
#
# The host needs torch, transformers (with fastapi, uvicorn and openai for `serve`) and nvidia-ml-py; pivot's other
# dependencies come from .whl/ when it has them (a host without network: scripts/h200_device_run.sh lists how to
# fetch them), else from the current environment. PAIRED (default off: a launch costs about 40 s here) is pivot run's
# --paired. The campaign stops at CAMPAIGN_S seconds (default 420) wherever it
# is, and the home comes back either way ($OUT/home.tgz): extracted into .gpu-home/ and carried to the next call,
# `pivot resume` goes on where it stopped (the model is made again, the same seed gives the same weights).
# A dry run on a host without a GPU: PIVOT_GPU_SERVE replaces the server's command (tests/standin_transformers_serve.py),
# PIVOT_WHEELS=0 keeps the environment's pivot.
set -u
OUT=${OUT:?set OUT}
CAMPAIGN_S=${CAMPAIGN_S:-420}
M=${PIVOT_GPU_MODEL:-/tmp/pivot-gpu/llama-3.1-8b-random}
export PIVOT_GPU_MODEL=$M PYTHONUNBUFFERED=1 PIVOT_HOME=/tmp/pivot-home
started=$(date +%s)
LOG=$OUT/campaign.log
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit,memory.total --format=csv
  python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)'
} >"$LOG" 2>&1
if [ -d .whl ] && [ "${PIVOT_WHEELS:-1}" = 1 ]; then
  rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation \
    --target /tmp/site .whl/*.whl . >>"$LOG" 2>&1 && echo "installed pivot and $(ls .whl | wc -l) wheels" >>"$LOG"
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
rm -rf "$PIVOT_HOME" && mkdir -p "$PIVOT_HOME"
[ -f .gpu-home/home.tgz ] && tar xzf .gpu-home/home.tgz -C "$PIVOT_HOME" && echo "resuming the carried home" >>"$LOG"
[ -f "$M/config.json" ] || python3 scripts/make_tiny_model.py "$M" --layers 32 --hidden 4096 \
  --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 --max-position 8192 --device cuda >>"$LOG" 2>&1
transformers serve --help >"$OUT/serve-help.txt" 2>&1
echo "model ready after $(( $(date +%s) - started )) s" >>"$LOG"

SERVE="python3 $PWD/scripts/gpu_serve.py serve --continuous-batching --host {host} --port {port} $M"
[ -n "${PIVOT_GPU_SERVE:-}" ] && SERVE=$PIVOT_GPU_SERVE
left() { echo $(( CAMPAIGN_S - ($(date +%s) - started) )); }
session=$(pivot sessions --json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["id"] if r else "")')
if [ -z "$session" ]; then
  timeout -s INT "$(left)" pivot run scripts/gpu_campaign/plan.toml --engine command -o "command=$SERVE" \
    -o model="$M" -o ready_timeout_s=300 --paired "${PAIRED:-off}" --json >"$OUT/run.json" 2>>"$LOG"
  echo "pivot run rc=$? at $(( $(date +%s) - started )) s" >>"$LOG"
  session=$(pivot sessions --json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["id"] if r else "")')
fi
while [ -n "$session" ] && [ "$(left)" -gt 30 ]; do
  status=$(pivot show "$session" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["session"]["status"])')
  [ "$status" = finished ] && break
  timeout -s INT "$(left)" pivot resume "$session" --answer continue --json >>"$OUT/resume.json" 2>>"$LOG"
  echo "pivot resume rc=$? at $(( $(date +%s) - started )) s" >>"$LOG"
done
if [ -n "$session" ]; then
  pivot show "$session" --json >"$OUT/show.json" 2>>"$LOG"
  pivot summary "$session" >"$OUT/summary.md" 2>>"$LOG"
  pivot servers "$session" --json >"$OUT/servers.json" 2>>"$LOG"
fi
nvidia-smi --query-gpu=power.draw,memory.used --format=csv >>"$LOG" 2>&1
ps -eo pid,ppid,cmd | grep -E 'gpu_serve|transformers' | grep -v grep >>"$LOG" || echo "no server left running" >>"$LOG"
tar czf "$OUT/home.tgz" -C "$PIVOT_HOME" . 2>>"$LOG"
echo "done after $(( $(date +%s) - started )) s" >>"$LOG"
