"""What tools/analysis/ finds (one sentence and its numbers per row) and GEMM micro-benchmark results."""

from __future__ import annotations

from collections.abc import Sequence

from agent import models as m
from agent.store.core import StoreCore
from agent.store.rows import RowMap

FINDINGS = RowMap(m.Finding, json=("values",))
MICROBENCH = RowMap(m.MicrobenchResult)


class FindingsMixin(StoreCore):
    """The `findings` and `microbench_results` tables."""

    def replace_findings(
        self, session_id: str, experiment_id: int | None, findings: Sequence[m.Finding]
    ) -> list[m.Finding]:
        """Make `findings` the analysis of one experiment (or, with None, the plan-level checks), in one transaction.

        Re-running an analysis replaces what it found before, so the ledger holds one current analysis each.
        """
        with self._write() as db:
            if experiment_id is None:
                db.execute("delete from findings where session_id = ? and experiment_id is null", [session_id])
            else:
                db.execute(
                    "delete from findings where session_id = ? and experiment_id = ?", [session_id, experiment_id]
                )
            table = db["findings"]
            out = []
            for f in findings:
                row = FINDINGS.to_row(f, skip=("id",), session_id=session_id, experiment_id=experiment_id)
                table.insert(row)
                out.append(f.model_copy(update={"id": table.last_pk, "session_id": session_id,
                                                "experiment_id": experiment_id}))  # fmt: skip
            self._touch(db, session_id)
        return out

    def findings(
        self, session_id: str, *, experiment_id: int | None = None, plan_level: bool = False, kind: str | None = None
    ) -> list[m.Finding]:
        """The session's findings in the order they were written: all of them, one experiment's, or
        (plan_level) those that belong to no experiment; optionally of one kind."""
        where, args = "session_id = ?", [session_id]
        if plan_level:
            where += " and experiment_id is null"
        elif experiment_id is not None:
            where += " and experiment_id = ?"
            args.append(experiment_id)
        if kind is not None:
            where += " and kind = ?"
            args.append(kind)
        with self._read() as db:
            rows = list(db["findings"].rows_where(where, args, order_by="id"))
        return [FINDINGS.from_row(r) for r in rows]

    def add_microbench(self, result: m.MicrobenchResult) -> m.MicrobenchResult:
        """Record one GEMM micro-benchmark; returns it with its id."""
        with self._write() as db:
            table = db["microbench_results"]
            table.insert(MICROBENCH.to_row(result, skip=("id",)))
            return result.model_copy(update={"id": table.last_pk})

    def microbench_results(self, *, device: str | None = None, dtype: str | None = None) -> list[m.MicrobenchResult]:
        """Recorded micro-benchmarks, oldest first, optionally for one device and one dtype."""
        where, args = "1 = 1", []
        if device is not None:
            where += " and device = ?"
            args.append(device)
        if dtype is not None:
            where += " and dtype = ?"
            args.append(dtype)
        with self._read() as db:
            rows = list(db["microbench_results"].rows_where(where, args, order_by="id"))
        return [MICROBENCH.from_row(r) for r in rows]
