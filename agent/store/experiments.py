"""Experiments, their benchmark sweeps (`bench_runs` and one `bench_levels` row per level) and their telemetry
(`telemetry` and one `telemetry_gpus` row per GPU)."""

from __future__ import annotations

from typing import Any

from agent import models as m
from agent.errors import PivotError
from agent.store.core import StoreCore
from agent.store.rows import RowMap, _fit

EXPERIMENTS = RowMap(
    m.Experiment,
    json=("plan_items", "config", "workload", "audit", "not_modelled", "placement", "reverts"),
    exclude=frozenset({"number"}),  # counted by the store on read, not a column
)
# A sweep's levels and a level's GPUs have tables of their own: their rows are written and read explicitly.
BENCH_RUNS = RowMap(m.BenchResult, json=("spec", "placement", "capacity"), exclude=frozenset({"levels"}))
TELEMETRY = RowMap(m.Telemetry, json=("server_metrics",), exclude=frozenset({"gpus"}))
GPU_COLUMNS = ("gpu", "power_w_mean", "power_w_max", "power_limit_w", "util_gpu_pct_mean", "energy_j")


class ExperimentsMixin(StoreCore):
    """The `experiments`, `bench_runs`, `bench_levels`, `telemetry` and `telemetry_gpus` tables."""

    @staticmethod
    def _experiment_row(e: m.Experiment) -> dict[str, Any]:
        return EXPERIMENTS.to_row(e, skip=("id",), workload_key=e.workload.workload_key())

    @staticmethod
    def _experiment(row: dict[str, Any]) -> m.Experiment:
        return EXPERIMENTS.from_row(row)

    def add_experiment(self, session_id: str, experiment: m.Experiment) -> m.Experiment:
        """Record an experiment in the session; returns it with its id and its number in the session."""
        e = experiment.model_copy(update={"session_id": session_id, "id": None, "number": None})
        with self._write() as db:
            table = db["experiments"]
            table.insert(_fit(db, "experiments", self._experiment_row(e)))
            self._touch(db, session_id)
            eid = table.last_pk
            return e.model_copy(update={"id": eid, "number": self._number(db, session_id, eid)})

    @staticmethod
    def _number(db: Any, session_id: str, experiment_id: int) -> int:
        """The experiment's number in its session: how many of the session's experiments were recorded up to it
        (experiments are never deleted, so the number never changes)."""
        sql = "select count(*) from experiments where session_id = ? and id <= ?"
        return int(db.execute(sql, [session_id, experiment_id]).fetchone()[0])

    def experiment_by_number(self, session_id: str, number: int) -> m.Experiment | None:
        """The session's experiment with this number (as reports show it), or None."""
        if number < 1:
            return None
        with self._read() as db:
            rows = list(db.query(
                "select * from experiments where session_id = ? order by id limit 1 offset ?", [session_id, number - 1]
            ))  # fmt: skip
        return self._experiment(rows[0]).model_copy(update={"number": number}) if rows else None

    def mark_interrupted(self, session_id: str) -> list[int]:
        """Experiments left `running` by a process that is gone become `interrupted` (call with the session's lock
        held, which proves no live process runs them); returns their ids."""
        with self._write() as db:
            ids = [r["id"] for r in db.query(
                "select id from experiments where session_id = ? and status = 'running' order by id", [session_id]
            )]  # fmt: skip
            if ids:
                db.execute(
                    "update experiments set status = 'interrupted' where session_id = ? and status = 'running'",
                    [session_id],
                )
        return ids

    def update_experiment(self, experiment: m.Experiment) -> m.Experiment:
        """Write back a recorded experiment (status, verdict, reason, ...)."""
        if experiment.id is None or experiment.session_id is None:
            raise PivotError("only a recorded experiment (with id and session) can be updated")
        with self._write() as db:
            db["experiments"].update(experiment.id, _fit(db, "experiments", self._experiment_row(experiment)))
            self._touch(db, experiment.session_id)
        return experiment

    def get_experiment(self, experiment_id: int) -> m.Experiment:
        """An experiment by the ledger's id (internal), with its number in its session."""
        with self._read() as db:
            rows = list(db["experiments"].rows_where("id = ?", [experiment_id]))
            if not rows:
                raise PivotError(f"no experiment {experiment_id}")
            number = self._number(db, rows[0]["session_id"], experiment_id)
        return self._experiment(rows[0]).model_copy(update={"number": number})

    def experiments(self, session_id: str) -> list[m.Experiment]:
        """The session's experiments in the order they were recorded, numbered 1, 2, ..."""
        with self._read() as db:
            rows = db["experiments"].rows_where("session_id = ?", [session_id], order_by="id")
            return [self._experiment(r).model_copy(update={"number": n}) for n, r in enumerate(rows, start=1)]

    # ---- benchmark results and telemetry

    def add_bench_result(self, experiment_id: int, result: m.BenchResult) -> int:
        """Record a sweep and all its levels in one transaction; returns the run id."""
        with self._write() as db:
            runs = db["bench_runs"]
            row = BENCH_RUNS.to_row(result, experiment_id=experiment_id, interrupted=int(result.interrupted))
            runs.insert(_fit(db, "bench_runs", row))
            run_id = runs.last_pk
            columns = [c for c in db["bench_levels"].columns_dict if c not in ("id", "run_id", "experiment_id")]
            db["bench_levels"].insert_all(
                {
                    "run_id": run_id,
                    "experiment_id": experiment_id,
                    **{c: getattr(level, c) for c in columns if c != "level_json"},
                    "level_json": level.model_dump_json(),
                }
                for level in result.levels
            )
            self._touch_experiment(db, experiment_id)
        return run_id

    def bench_results(self, experiment_id: int) -> list[m.BenchResult]:
        """The experiment's sweeps, oldest first, each with its levels in the order they ran."""
        with self._read() as db:
            runs = list(db["bench_runs"].rows_where("experiment_id = ?", [experiment_id], order_by="id"))
            out = []
            for run in runs:
                levels = db["bench_levels"].rows_where("run_id = ?", [run["id"]], order_by="id")
                out.append(
                    BENCH_RUNS.from_row(
                        run, levels=[m.BenchLevel.model_validate_json(lv["level_json"]) for lv in levels]
                    )
                )
            return out

    def add_telemetry(self, experiment_id: int, telemetry: m.Telemetry, run_id: int | None = None) -> int:
        """Record one level's telemetry and its per-GPU rows in one transaction; returns its id."""
        with self._write() as db:
            table = db["telemetry"]
            table.insert(TELEMETRY.to_row(telemetry, experiment_id=experiment_id, run_id=run_id))
            tid = table.last_pk
            db["telemetry_gpus"].insert_all(
                {"telemetry_id": tid, **{c: getattr(g, c) for c in GPU_COLUMNS}, "gpu_json": g.model_dump_json()}
                for g in telemetry.gpus
            )
            self._touch_experiment(db, experiment_id)
        return tid

    def telemetry(self, experiment_id: int) -> list[m.Telemetry]:
        with self._read() as db:
            rows = list(db["telemetry"].rows_where("experiment_id = ?", [experiment_id], order_by="id"))
            out = []
            for row in rows:
                gpus = db["telemetry_gpus"].rows_where("telemetry_id = ?", [row["id"]], order_by="gpu")
                out.append(
                    TELEMETRY.from_row(row, gpus=[m.GpuTelemetry.model_validate_json(g["gpu_json"]) for g in gpus])
                )
            return out
