"""The value types of every `pivot` option that takes a number: whole numbers and finite floats in a range.

One place for them, so a bad value is one line (`error: --reruns -1: ...`) on every command, never a traceback
from deep inside. Where a model field holds the value (`SessionSettings.reruns`, `BenchSpec.random_input_len`),
`field_number` reads the range from the field itself, so the option and the model cannot disagree.
"""

from __future__ import annotations

import math
from typing import Any

import click
from pydantic import BaseModel


class Number(click.ParamType):
    """A whole number (`kind=int`) or a finite float in [min, max] (open ends with `min_open`/`max_open`).

    NaN is never a value; infinity only with `allow_inf` (a request rate of inf: all at once)."""

    def __init__(
        self,
        kind: type[int] | type[float] = int,
        *,
        min: float | None = None,
        max: float | None = None,
        min_open: bool = False,
        max_open: bool = False,
        allow_inf: bool = False,
    ) -> None:
        self.kind = kind
        self.min, self.max = min, max
        self.min_open, self.max_open = min_open, max_open
        self.allow_inf = allow_inf
        self.name = "integer" if kind is int else "number"

    def range_text(self) -> str:
        """The accepted values in words, e.g. `a whole number from 1 to 65535`."""
        what = "a whole number" if self.kind is int else "a finite number"
        if self.allow_inf:
            what = "a number (inf allowed)"
        low = None if self.min is None else f"{'>' if self.min_open else '>='} {self._text(self.min)}"
        high = None if self.max is None else f"{'<' if self.max_open else '<='} {self._text(self.max)}"
        if low and high and not self.min_open and not self.max_open:
            return f"{what} from {self._text(self.min)} to {self._text(self.max)}"
        bounds = " and ".join(b for b in (low, high) if b)
        return f"{what} {bounds}".strip()

    def _text(self, bound: float) -> str:
        return f"{int(bound):,}" if self.kind is int or float(bound).is_integer() else f"{bound:g}"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N" if self.kind is int else "X"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, self.kind) and not isinstance(value, bool) and self._fits(value)):
            return value
        text = str(value).strip()
        try:
            number: float = self.kind(text) if self.kind is float else int(text, 10)
        except ValueError:
            self.fail(f"{text!r} is not {self.range_text()}", param, ctx)
        if not self._fits(number):
            self.fail(f"{text} is out of range: give {self.range_text()}", param, ctx)
        return number

    def _fits(self, number: float) -> bool:
        if math.isnan(number) or (math.isinf(number) and not self.allow_inf):
            return False
        if self.min is not None and (number < self.min or (self.min_open and number == self.min)):
            return False
        return not (self.max is not None and (number > self.max or (self.max_open and number == self.max)))


def field_number(model: type[BaseModel], field: str, *, max: float | None = None, **kw: Any) -> Number:
    """The option type of a model's numeric field: its type, and the range its constraints (ge, gt, le, lt) give;
    `max` caps a field the model leaves open."""
    info = model.model_fields[field]
    annotation = info.annotation
    kind: type[int] | type[float] = (
        float if annotation is float or float in getattr(annotation, "__args__", ()) else int
    )
    bounds: dict[str, Any] = {"min": None, "max": None, "min_open": False, "max_open": False}
    for rule in info.metadata:
        for attr, key, open_ in (("ge", "min", False), ("gt", "min", True), ("le", "max", False), ("lt", "max", True)):
            if getattr(rule, attr, None) is not None:
                bounds[key], bounds[f"{key}_open"] = getattr(rule, attr), open_
    if max is not None and (bounds["max"] is None or max < bounds["max"]):
        bounds["max"], bounds["max_open"] = max, False
    return Number(kind, **{**bounds, **kw})


PORT = Number(int, min=1, max=65535)
GPUS = Number(int, min=1, max=1024)
NOISE = Number(float, min=0.0, max=0.5)  # run-to-run variation of a simulated engine, as a fraction
SEED = Number(int, min=0, max=2**31 - 1)
SECONDS = Number(float, min=0.0, min_open=True, max=7 * 24 * 3600.0)
TIME_SCALE = Number(float, min=0.001, max=10_000.0)
