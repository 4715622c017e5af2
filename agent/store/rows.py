"""The one row mapper: a pydantic model to a ledger row and back.

A field is stored in the column of its name, except that a field named in `json` is stored as JSON text in
`<field>_json` (a pydantic model with its own `model_dump_json`, anything else with `json.dumps`), and a datetime is
stored as ISO text. Reading back, a column that is NULL or missing (a ledger opened at an older migration lacks the
newer columns) leaves the field at its model default; columns the model has no field for are ignored.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from sqlite_utils import Database

M = TypeVar("M", bound=BaseModel)


def _fit(db: Database, table: str, row: dict[str, Any]) -> dict[str, Any]:
    """`row` without the columns `table` lacks: a Store opened at an older migration (the migration tests) has fewer."""
    columns = db[table].columns_dict
    return {k: v for k, v in row.items() if k in columns}


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _is_datetime(annotation: Any) -> bool:
    if annotation is datetime:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return datetime in typing.get_args(annotation)
    return False


def _dump_json(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return json.dumps([v.model_dump() for v in value])
    return json.dumps(value)


@dataclass(frozen=True)
class RowMap(Generic[M]):
    """How one model is stored in one table (see the module's docstring)."""

    model: type[M]
    json: tuple[str, ...] = ()
    exclude: frozenset[str] = frozenset()

    def _fields(self) -> list[str]:
        return [f for f in self.model.model_fields if f not in self.exclude]

    def to_row(self, obj: M, *, skip: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
        """The row of `obj`: every field (but `skip`), JSON and datetimes as text, then the `extra` columns."""
        row: dict[str, Any] = {}
        for name in self._fields():
            if name in skip:
                continue
            value = getattr(obj, name)
            if name in self.json:
                row[f"{name}_json"] = _dump_json(value)
            elif isinstance(value, datetime):
                row[name] = _ts(value)
            else:
                row[name] = value
        row.update(extra)
        return row

    def from_row(self, row: dict[str, Any], **extra: Any) -> M:
        """The model of `row` (and the `extra` fields); NULL or missing columns take the field's default."""
        values: dict[str, Any] = {}
        for name, field in self.model.model_fields.items():
            if name in self.exclude:
                continue
            if name in self.json:
                text = row.get(f"{name}_json")
                if text:
                    values[name] = json.loads(text)
                continue
            value = row.get(name)
            if value is None:
                continue
            values[name] = _dt(value) if _is_datetime(field.annotation) else value
        return self.model.model_validate({**values, **extra})
