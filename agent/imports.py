"""Results benchmarked by hand into a session: `sglang.bench_serving` output files become one experiment.

bench_serving appends one JSON object per run (one concurrency level) to its `--output-file`, with the keys
`models.BenchLevel` keeps. Each line is read on its own: a line that is not a JSON object with those keys is
reported with its number and skipped; a later run at the same concurrency replaces an earlier one in the
file. The valid lines are kept under state/<session>/bench/. Nothing already in the session is changed:
the import only adds an experiment (kind "imported") and its levels.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import BaseModel, ValidationError

from agent import models as m
from agent.errors import PivotError
from agent.session import Paths
from agent.store import Store

# What pivot compares and analyses: a file without one of these cannot be used. total_throughput and concurrency
# are derived when a file lacks them (from the token counts and the mean latency); the other latency statistics
# (median, std, p90, p95, p99) are kept when a file has them (bench_serving 0.5 writes all; older versions fewer).
DERIVED_KEYS = ("total_throughput", "concurrency")
REQUIRED_KEYS = tuple(
    name for name, f in m.BenchLevel.model_fields.items() if f.is_required() and name not in DERIVED_KEYS
)  # duration, completed, the token counts, the throughputs, the mean latencies, max_output_tokens_per_s


class ImportProblem(BaseModel):
    """A line of the file that was skipped or replaced, and why."""

    line: int
    message: str


class ImportResult(BaseModel):
    """What an import added to the session."""

    session_id: str
    experiment_id: int
    levels: list[int]
    skipped: list[ImportProblem] = []
    replaced: list[ImportProblem] = []
    raw_path: str
    baseline: bool = False


def read_bench_serving(
    path: Path,
) -> tuple[dict[int, tuple[int, m.BenchLevel, str]], list[ImportProblem], list[ImportProblem]]:
    """Levels by concurrency (with their line number and raw text), skipped lines, and replaced runs."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PivotError(f"cannot read {path}: {e}") from e
    levels: dict[int, tuple[int, m.BenchLevel, str]] = {}
    skipped: list[ImportProblem] = []
    replaced: list[ImportProblem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            skipped.append(ImportProblem(line=number, message=f"not JSON ({e.msg} at column {e.colno})"))
            continue
        if not isinstance(data, dict):
            skipped.append(ImportProblem(line=number, message=f"a JSON {type(data).__name__}, not an object"))
            continue
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            skipped.append(
                ImportProblem(line=number, message=f"missing the bench_serving keys pivot needs: {', '.join(missing)}")
            )
            continue
        data = _derived(data)
        if not isinstance(data.get("max_concurrency"), int) or data["max_concurrency"] < 1:
            skipped.append(
                ImportProblem(
                    line=number,
                    message=f"max_concurrency is {data.get('max_concurrency')!r}: pivot compares runs by their "
                    "concurrency (run bench_serving with --max-concurrency)",
                )
            )
            continue
        try:
            level = m.BenchLevel.model_validate(data)
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            where = ".".join(str(p) for p in err["loc"])
            skipped.append(ImportProblem(line=number, message=f"{where}: {err['msg']}"))
            continue
        bad = [k for k in ("duration", "completed", "output_throughput") if not _finite_nonneg(getattr(level, k))]
        if bad:
            skipped.append(ImportProblem(line=number, message=f"{', '.join(bad)} must be a non-negative number"))
            continue
        c = data["max_concurrency"]
        if c in levels:
            replaced.append(
                ImportProblem(
                    line=levels[c][0], message=f"concurrency {c} again on line {number}; the later run is kept"
                )
            )
        levels[c] = (number, level, line)
    return dict(sorted(levels.items())), skipped, replaced


def _derived(data: dict) -> dict:
    """`data` with total_throughput and concurrency computed when the file lacks them, as bench_serving defines them:
    (input + output tokens) / duration, and Little's law (mean e2e latency x completed / duration)."""
    out = dict(data)
    try:
        duration = float(out["duration"])
        if "total_throughput" not in out and duration > 0:
            out["total_throughput"] = (float(out["total_input_tokens"]) + float(out["total_output_tokens"])) / duration
        if "concurrency" not in out and duration > 0:
            out["concurrency"] = float(out["mean_e2e_latency_ms"]) / 1000 * float(out["completed"]) / duration
    except (TypeError, ValueError):
        pass  # the model's validation names the key that is not a number
    return out


def _finite_nonneg(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def _spec(plan: m.Plan, level: m.BenchLevel, levels: list[int]) -> m.BenchSpec:
    """The workload the file describes, on top of the plan's (what bench_serving does not write stays the plan's)."""
    update: dict[str, object] = {"concurrency": levels}
    for key in ("random_input_len", "random_output_len", "random_range_ratio"):
        value = getattr(level, key)
        if value is not None:
            update[key] = value
    if level.dataset_name in ("random", "random-ids"):
        update["dataset_name"] = level.dataset_name
    if isinstance(level.request_rate, int | float) and level.request_rate > 0:
        update["request_rate"] = level.request_rate
    if level.goodput_slos_ms:  # bench_serving ran with --goodput: the SLOs its attainment was judged by
        update["goodput_slos_ms"] = level.goodput_slos_ms
    try:
        return m.BenchSpec.model_validate({**plan.workload.model_dump(), **update})
    except ValidationError:
        return plan.workload.model_copy(update={"concurrency": levels})


def import_bench_serving(
    store: Store,
    paths: Paths,
    session_id: str,
    path: str | Path,
    *,
    label: str,
    flags: str | None = None,
    base_experiment_id: int | None = None,
) -> ImportResult:
    """Add the runs of a bench_serving output file to the session as one experiment; returns what was added.

    The first experiment of a session becomes its baseline. `flags`: the server's flags as launched (they are
    what the summaries show as its config); `base_experiment_id`: the experiment this one changed, if any.
    """
    path = Path(path)
    record = store.get_session(session_id)
    levels, skipped, replaced = read_bench_serving(path)
    if not levels:
        detail = "; ".join(f"line {p.line}: {p.message}" for p in skipped[:5]) or "the file is empty"
        raise PivotError(
            f"no bench_serving runs could be read from {path}: {detail}",
            hint="pass the file sglang.bench_serving wrote with --output-file (one JSON object per line)",
        )
    if base_experiment_id is not None:
        base = store.get_experiment(base_experiment_id)
        if base.session_id != record.id:
            raise PivotError(f"experiment {base_experiment_id} is not in session {record.id}")
    config = m.ServerConfig.parse(flags) if flags else m.ServerConfig()
    first = not store.experiments(record.id)
    concurrencies = list(levels)
    spec = _spec(record.plan, levels[concurrencies[0]][1], concurrencies)
    now = m.utcnow()
    e = store.add_experiment(
        record.id,
        m.Experiment(
            kind="imported",
            title=label,
            hypothesis=f"Imported from {path.name} (sglang.bench_serving output).",
            config=config,
            base_experiment_id=base_experiment_id,
            workload=spec,
            status="running",
            started_at=now,
        ),
    )
    raw = paths.raw_dir(record.id) / f"import-{e.id}.jsonl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text("".join(text + "\n" for _, _, text in levels.values()), encoding="utf-8")
    backend = next((lv.backend for _, lv, _ in levels.values() if lv.backend), None) or "sglang"
    result = m.BenchResult(
        spec=spec,
        levels=[lv for _, lv, _ in levels.values()],
        engine=f"bench_serving ({backend})",
        source="imported",
        started_at=now,
        finished_at=now,
        raw_path=paths.relative(raw),
    )
    store.add_bench_result(e.id or 0, result)
    update: dict[str, object] = {"status": "finished", "finished_at": m.utcnow()}
    if first:
        update |= {"verdict": "baseline", "reason": f"the session's first results, imported from {path.name}"}
    store.update_experiment(e.model_copy(update=update))
    return ImportResult(
        session_id=record.id,
        experiment_id=e.id or 0,
        levels=concurrencies,
        skipped=skipped,
        replaced=replaced,
        raw_path=paths.relative(raw),
        baseline=first,
    )
