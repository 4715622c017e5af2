"""The ledger's schema: named migrations, applied in order on every open and recorded in `_migrations`.

A migration is a function decorated with `@migration`, named `_mNNN_what`; its recorded name is `NNN_what`, taken
from the function's own name, so the two cannot drift. Append only: the names are recorded in users' ledgers, so
never edit, rename or reorder one that has shipped; add a new one at the end, with the next number.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlite_utils import Database

Migration = tuple[str, Callable[[Database], None]]
MIGRATIONS: list[Migration] = []  # in the order they are applied: the order they are defined below
_NAME = re.compile(r"_m(\d{3})_([a-z0-9_]+)")


def migration(fn: Callable[[Database], None]) -> Callable[[Database], None]:
    """Register `fn` (named `_mNNN_what`) as the migration `NNN_what`, after every one registered before it; its
    number must be higher than theirs (a gap is fine: a number once shipped is never reused)."""
    match = _NAME.fullmatch(fn.__name__)
    if match is None:
        raise ValueError(f"a migration's function is named _mNNN_what, not {fn.__name__}")
    number, name = int(match.group(1)), f"{match.group(1)}_{match.group(2)}"
    if MIGRATIONS and number <= int(MIGRATIONS[-1][0][:3]):
        raise ValueError(f"migration {name} comes after {MIGRATIONS[-1][0]}: give it a higher number")
    MIGRATIONS.append((name, fn))
    return fn


@migration
def _m001_initial(db: Database) -> None:
    _initial_sessions(db)
    _initial_experiments(db)
    _initial_results(db)


def _initial_sessions(db: Database) -> None:
    """001_initial, part 1: sessions, their message history and their todos."""
    db["sessions"].create(
        {
            "id": str,
            "name": str,
            "plan_name": str,
            "plan_json": str,
            "engine": str,
            "model": str,
            "status": str,
            "created_at": str,
            "updated_at": str,
            "lock_pid": int,
            "lock_host": str,
            "lock_proc_start": str,
            "lock_at": str,
        },
        pk="id",
        not_null={"name", "plan_name", "plan_json", "engine", "model", "status", "created_at", "updated_at"},
    )
    db["messages"].create(
        {"id": int, "session_id": str, "seq": int, "created_at": str, "json": str},
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "seq", "json"},
    )
    db["messages"].create_index(["session_id", "seq"], unique=True)
    db["todos"].create(
        {
            "session_id": str,
            "id": str,
            "position": int,
            "content": str,
            "status": str,
            "priority": str,
            "plan_item": str,
            "updated_at": str,
        },
        pk=("session_id", "id"),
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"position", "content", "status", "priority"},
    )


def _initial_experiments(db: Database) -> None:
    """001_initial, part 2: experiments and their benchmark sweeps (one row per level)."""
    db["experiments"].create(
        {
            "id": int,
            "session_id": str,
            "plan_item": str,
            "kind": str,
            "title": str,
            "hypothesis": str,
            "config_json": str,
            "base_experiment_id": int,
            "workload_json": str,
            "workload_key": str,
            "status": str,
            "verdict": str,
            "reason": str,
            "audit_json": str,
            "failure": str,
            "log_path": str,
            "created_at": str,
            "started_at": str,
            "finished_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id"), ("base_experiment_id", "experiments", "id")],
        not_null={"session_id", "kind", "config_json", "workload_json", "status", "created_at"},
    )
    db["experiments"].create_index(["session_id"])
    db["bench_runs"].create(
        {
            "id": int,
            "experiment_id": int,
            "spec_json": str,
            "engine": str,
            "source": str,
            "started_at": str,
            "finished_at": str,
            "interrupted": int,
            "raw_path": str,
        },
        pk="id",
        foreign_keys=[("experiment_id", "experiments", "id")],
        not_null={"experiment_id", "spec_json", "engine", "source", "started_at", "interrupted"},
    )
    # The columns a report or a query needs, plus the whole level as JSON for an exact round trip.
    db["bench_levels"].create(
        {
            "id": int,
            "run_id": int,
            "experiment_id": int,
            "max_concurrency": int,
            "completed": int,
            "failed": int,
            "duration": float,
            "request_throughput": float,
            "output_throughput": float,
            "total_throughput": float,
            "max_output_tokens_per_s": float,
            "mean_ttft_ms": float,
            "median_ttft_ms": float,
            "p99_ttft_ms": float,
            "mean_tpot_ms": float,
            "median_tpot_ms": float,
            "p99_tpot_ms": float,
            "mean_itl_ms": float,
            "mean_e2e_latency_ms": float,
            "concurrency": float,
            "level_json": str,
        },
        pk="id",
        foreign_keys=[("run_id", "bench_runs", "id"), ("experiment_id", "experiments", "id")],
        not_null={"run_id", "experiment_id", "level_json"},
    )


def _initial_results(db: Database) -> None:
    """001_initial, part 3: telemetry (one row per GPU), documents and pivots."""
    db["telemetry"].create(
        {
            "id": int,
            "experiment_id": int,
            "run_id": int,
            "max_concurrency": int,
            "source": str,
            "started_at": str,
            "finished_at": str,
            "error": str,
            "server_metrics_json": str,
        },
        pk="id",
        foreign_keys=[("experiment_id", "experiments", "id"), ("run_id", "bench_runs", "id")],
        not_null={"experiment_id", "source"},
    )
    db["telemetry_gpus"].create(
        {
            "id": int,
            "telemetry_id": int,
            "gpu": int,
            "power_w_mean": float,
            "power_w_max": float,
            "power_limit_w": float,
            "util_gpu_pct_mean": float,
            "energy_j": float,
            "gpu_json": str,
        },
        pk="id",
        foreign_keys=[("telemetry_id", "telemetry", "id")],
        not_null={"telemetry_id", "gpu", "gpu_json"},
    )
    db["documents"].create(
        {
            "id": int,
            "session_id": str,
            "kind": str,
            "plan_item": str,
            "number": int,
            "title": str,
            "path": str,
            "status": str,
            "sha256": str,
            "experiment_ids_json": str,
            "created_at": str,
            "updated_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "kind", "title", "path", "sha256", "created_at", "updated_at"},
    )
    db["documents"].create_index(["session_id", "path"], unique=True)
    db["pivots"].create(
        {
            "id": int,
            "session_id": str,
            "question": str,
            "options_json": str,
            "answer": str,
            "tool_call_id": str,
            "summary_path": str,
            "asked_at": str,
            "answered_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "question", "options_json", "asked_at"},
    )


@migration
def _m002_server_processes(db: Database) -> None:
    db["servers"].create(
        {
            "id": int,
            "session_id": str,
            "experiment_id": int,
            "engine": str,
            "pid": int,
            "pgid": int,
            "host": str,
            "base_url": str,
            "argv_json": str,
            "log_path": str,
            "status": str,
            "failure": str,
            "started_at": str,
            "stopped_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id"), ("experiment_id", "experiments", "id")],
        not_null={"session_id", "engine", "pid", "pgid", "host", "base_url", "argv_json", "status", "started_at"},
    )
    db["servers"].create_index(["session_id", "status"])


@migration
def _m003_server_identity(db: Database) -> None:
    # The kernel's start time of the server's pid, so a pid reused by another process is never signalled.
    db["servers"].add_column("proc_start", str)


@migration
def _m004_analysis(db: Database) -> None:
    # What tools/analysis/ finds (one sentence and its numbers per row), and GEMM micro-benchmark results.
    db["findings"].create(
        {
            "id": int,
            "session_id": str,
            "experiment_id": int,
            "kind": str,
            "category": str,
            "plan_item": str,
            "max_concurrency": int,
            "text": str,
            "values_json": str,
            "formula": str,
            "severity": str,
            "created_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id"), ("experiment_id", "experiments", "id")],
        not_null={"session_id", "kind", "text", "values_json", "severity", "created_at"},
    )
    db["findings"].create_index(["session_id", "experiment_id"])
    db["microbench_results"].create(
        {
            "id": int,
            "session_id": str,
            "device": str,
            "dtype": str,
            "m": int,
            "n": int,
            "k": int,
            "groups": int,
            "rows_per_expert": float,
            "tflops": float,
            "share_of_peak": float,
            "share_of_roofline": float,
            "backend": str,
            "source": str,
            "measured_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={
            "device",
            "dtype",
            "m",
            "n",
            "k",
            "groups",
            "tflops",
            "share_of_peak",
            "share_of_roofline",
            "source",
            "measured_at",
        },
    )
    db["microbench_results"].create_index(["device", "dtype"])


@migration
def _m005_telemetry_tokens(db: Database) -> None:
    """Output tokens of a level and tokens per joule, so energy efficiency survives a resume."""
    db["telemetry"].add_column("output_tokens", int)
    db["telemetry"].add_column("output_tokens_per_j", float)


@migration
def _m006_session_settings(db: Database) -> None:
    """The method's thresholds, the engine's options and the model's server, kept with each session; and the words
    that say why an experiment's server failed, beside its class."""
    db["sessions"].add_column("settings_json", str)
    db["sessions"].add_column("model_base_url", str)
    db["experiments"].add_column("failure_detail", str)


@migration
def _m007_combined_items(db: Database) -> None:
    """Every plan item an experiment combines (a combined step of the search names them all)."""
    db["experiments"].add_column("plan_items_json", str)


@migration
def _m008_search(db: Database) -> None:
    """The search's prediction recorded next to what was measured: the corrected twin's output tok/s, the predicted
    change and where the prediction comes from."""
    db["experiments"].add_column("predicted_tok_s", float)
    db["experiments"].add_column("predicted_change_pct", float)
    db["experiments"].add_column("prediction", str)


@migration
def _m009_truth(db: Database) -> None:
    """The flags of an experiment's config its engine does not model (a simulated engine's), kept so a verdict
    never calls an unmodelled change measured."""
    db["experiments"].add_column("not_modelled_json", str)
    db["plan_changes"].create(
        {"id": int, "session_id": str, "source": str, "changes_json": str, "old_plan_json": str, "at": str},
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "changes_json", "at"},
    )
    db["plan_changes"].create_index(["session_id"])


@migration
def _m011_usage(db: Database) -> None:
    """Each agent run's model requests, input and output tokens, and cost where it is known."""
    db["model_usage"].create(
        {
            "id": int,
            "session_id": str,
            "model": str,
            "requests": int,
            "input_tokens": int,
            "output_tokens": int,
            "cost_usd": float,
            "outcome": str,
            "started_at": str,
            "finished_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
    )
    db["model_usage"].create_index(["session_id"])


@migration
def _m012_placement(db: Database) -> None:
    """Where an experiment's servers ran when an executor placed them (a Ray task): host, GPUs, the log there; per
    run, and the experiment's last."""
    db["experiments"].add_column("placement_json", str)
    db["bench_runs"].add_column("placement_json", str)


@migration
def _m013_investigations(db: Database) -> None:
    """Sub-agent investigations: the question, the tools the sub-agent read, its model's use and its report."""
    db["investigations"].create(
        {
            "id": int,
            "session_id": str,
            "kind": str,
            "question": str,
            "experiment_id": int,
            "model": str,
            "tools_used_json": str,
            "requests": int,
            "input_tokens": int,
            "output_tokens": int,
            "status": str,
            "report": str,
            "created_at": str,
            "finished_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "kind", "question", "model", "status", "created_at"},
    )
    db["investigations"].create_index(["session_id"])


@migration
def _m014_capacity(db: Database) -> None:
    """A capacity search's bracket per benchmark run: the highest load that met the SLOs and the levels around it."""
    db["bench_runs"].add_column("capacity_json", str)


@migration
def _m015_reverts_and_tier_ends(db: Database) -> None:
    """What an experiment takes back (adopted items it reverts, and why), and the tiers a pivot closed when it was
    asked: a tier's end is an event of the ledger, not a reading of later verdicts."""
    db["experiments"].add_column("reverts_json", str)
    db["experiments"].add_column("revert_why", str)
    db["pivots"].add_column("closes_tiers_json", str)
