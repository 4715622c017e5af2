"""`pivot audit-flags`, `pivot power` and `pivot profile`: the engine's flags, GPUs and kernels from the terminal."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from agent import models as m
from agent.cli.engines import ENGINE
from agent.cli.options import Number, field_number
from agent.console import dump, err, make_table, out, print_json, warn
from agent.errors import PivotError
from agent.session import Paths

_STATUS_STYLE = {"ok": "green", "noop": "yellow", "deprecated": "yellow"}


# ------------------------------------------------------------------------------------------------ audit


@click.command("audit-flags", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--json", "as_json", is_flag=True, help="Print only a JSON array of {flag, status, message} on stdout.")
@click.option("--engine", "engine_name", type=ENGINE,
              help="The engine whose flags these are (an installed engine: sglang, vllm, ...). "
              "Default: $PIVOT_AUDIT_ENGINE, else sglang.")  # fmt: skip
@click.option("--engine-version", help="Version to judge by (default: the installed engine's, else the shipped one).")
@click.option(
    "--source",
    "--sglang-source",
    "source",
    type=click.Path(file_okay=False, exists=True),
    help="The engine's package source (for SGLang the directory holding sglang/): scan it for flags no code reads.",
)
@click.option("-o", "--engine-option", "option_pairs", multiple=True, metavar="KEY=VALUE",
              help="An engine option, e.g. -o python=/opt/vllm/bin/python (whose vLLM parser judges). Repeatable.")  # fmt: skip
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def audit_flags_cmd(
    as_json: bool,
    engine_name: str | None,
    engine_version: str | None,
    source: str | None,
    option_pairs: tuple[str, ...],
    flags: tuple[str, ...],
) -> None:
    """Audit server FLAGS (after --): ok, unknown, ambiguous, deprecated, invalid or noop, and what to do.

    Needs no model and no GPU. SGLang: its own parser when the installed SGLang is the version audited, else the
    catalog shipped with pivot; vLLM: the installed vLLM's own parser (-o python=..., else $PIVOT_VLLM_PYTHON, else
    this Python), else the shipped catalog of the nearest version. Exits 1 when a flag would stop the server from
    starting (unknown, ambiguous, invalid).
    """
    from agent.cli.engines import _engine_options
    from agent.contracts import load_engine

    if not flags:
        raise PivotError("no flags to audit", hint="pivot audit-flags -- --tp-size 8 --enable-mscclpp")
    from agent.settings import settings

    engine = load_engine(engine_name or settings().audit_engine, **_engine_options(option_pairs, None, None))
    report = engine.audit(
        m.ServerConfig.parse(list(flags)), version=engine_version, source=Path(source) if source else None
    )
    for note in report.notes:
        warn(note)
    if as_json:
        print_json([r.model_dump(include={"flag", "status", "message"}) for r in report.rows])
    else:
        err.print(f"parser: {report.parser}; no-ops: {report.noops}")
        table = make_table("flag", "status", "message")
        for row in report.rows:
            style = _STATUS_STYLE.get(row.status, "red")
            table.add_row(row.flag, f"[{style}]{row.status}[/]", row.message)
        out.print(table, markup=True)
    if report.blocking:
        sys.exit(1)


# ------------------------------------------------------------------------------------------------ power


def _fmt(value: float | None, spec: str = "{:,.0f}") -> str:
    return "-" if value is None else spec.format(value)


def power_table(t: m.Telemetry):
    """Per-GPU readings as a table (one row per GPU)."""
    table = make_table("gpu", "name", "power W", "limit W", "% limit", "util %", "mem util %", "SM MHz", "mem MHz",
                       "used MiB", "temp C", "energy J")  # fmt: skip
    for g in t.gpus:
        share = g.power_share_of_limit
        table.add_row(
            str(g.gpu),
            g.name or "",
            _fmt(g.power_w_mean, "{:,.1f}"),
            _fmt(g.power_limit_w),
            "-" if share is None else f"{100 * share:.0f}",
            _fmt(g.util_gpu_pct_mean),
            _fmt(g.util_mem_pct_mean),
            _fmt(g.sm_clock_mhz_mean),
            _fmt(g.mem_clock_mhz_mean),
            _fmt(g.mem_used_mib_max),
            _fmt(g.temperature_c_max),
            _fmt(g.energy_j),
        )
    return table


def _read(base_url: str | None, gpus: tuple[int, ...] | None) -> m.Telemetry:
    from tools.telemetry import TelemetryUnavailable, read_gpus, read_twin_telemetry

    if base_url:
        try:
            return read_twin_telemetry(base_url)
        except TelemetryUnavailable as e:
            return m.Telemetry(source="unavailable", error=e.message)
    return read_gpus(gpus=gpus)


def _caption(t: m.Telemetry) -> str:
    when = time.strftime("%H:%M:%S")
    if t.source == "simulated":
        return (
            f"SIMULATED (the twin's /sim/telemetry) at {when}; power over the last simulated second; energy since ready"
        )
    return f"NVML at {when}; power is NVML's ~1 s average; energy J is the counter since the driver loaded"


@click.command("power")
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option("--interval", "interval_s", type=Number(float, min=0.05, max=3600.0), default=1.0, show_default=True,
              help="Seconds between refreshes with --watch.")  # fmt: skip
@click.option("--base-url", help="Read the twin's simulated GPUs (`pivot sim serve` at this URL) instead of NVML.")
@click.option("--gpus", help="GPU indices to read, e.g. 0,1 (default: all).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print Telemetry JSON on stdout (one line per refresh with --watch)."
)
def power(watch: bool, interval_s: float, base_url: str | None, gpus: str | None, as_json: bool) -> None:
    """Per-GPU power, limit, utilization, clocks, memory, temperature and energy, now (or live with --watch)."""
    indices: tuple[int, ...] | None = None
    if gpus:
        try:
            indices = tuple(int(x) for x in gpus.split(",") if x.strip())
        except ValueError as e:
            raise PivotError(f"bad --gpus {gpus!r}", hint="write indices as 0,1,2") from e
    first = _read(base_url, indices)
    if first.source == "unavailable":
        if as_json:
            click.echo(first.model_dump_json())
        hint = "no NVIDIA driver here? for the twin's simulated GPUs: pivot power --base-url http://127.0.0.1:30000"
        raise PivotError(first.error or "no GPU readings", hint=None if base_url else hint)
    if not watch:
        if as_json:
            print_json(dump(first))
        else:
            out.print(power_table(first))
            err.print(_caption(first))
            if first.error:
                warn(first.error)
        return
    if as_json:
        try:
            t = first
            while True:
                click.echo(t.model_dump_json())
                time.sleep(interval_s)
                t = _read(base_url, indices)
        except KeyboardInterrupt:
            return
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    def view(t: m.Telemetry) -> Group:
        lines = [power_table(t), Text(_caption(t) + "; Ctrl-C to stop", style="dim")]
        if t.error:
            lines.append(Text(t.error, style="yellow"))
        return Group(*lines)

    try:
        with Live(view(first), console=out, refresh_per_second=max(1.0, 1 / interval_s), transient=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(view(_read(base_url, indices)))
    except KeyboardInterrupt:
        return


# ------------------------------------------------------------------------------------------------ profile


def profile_table(s: m.ProfileSummary):
    table = make_table("category", "seconds", "share", "kernels")
    for name, c in s.categories.items():
        table.add_row(
            name, f"{c.seconds:,.4f}", f"{100 * c.share:.1f}%", "-" if c.kernels is None else f"{c.kernels:,}"
        )
    return table


@click.command("profile")
@click.option("--base-url", help="Profile this server under a short load (SGLang, or `pivot sim serve`).")
@click.option("--trace", "trace", type=click.Path(exists=True), help="Summarize existing trace file(s) instead.")
@click.option(
    "--concurrency",
    type=field_number(m.BenchSpec, "num_prompts"),
    default=64,
    show_default=True,
    help="The load's concurrency.",
)
@click.option(
    "--num-prompts",
    type=field_number(m.BenchSpec, "num_prompts"),
    help="Prompts in the load (default: 2 x concurrency).",
)
@click.option(
    "--input-len",
    type=field_number(m.BenchSpec, "random_input_len"),
    default=256,
    show_default=True,
    help="Input tokens.",
)
@click.option(
    "--output-len",
    type=field_number(m.BenchSpec, "random_output_len"),
    default=128,
    show_default=True,
    help="Output tokens.",
)
@click.option(
    "--num-steps", type=Number(int, min=1, max=1_000_000), help="Let SGLang stop profiling by itself after N steps."
)
@click.option(
    "--output-dir", type=click.Path(file_okay=False), help="Where the server writes traces (default: state/profiles)."
)
@click.option("--json", "as_json", is_flag=True, help="Print only the ProfileSummary JSON on stdout.")
@click.pass_context
def profile(ctx, base_url, trace, concurrency, num_prompts, input_len, output_len, num_steps, output_dir,
            as_json) -> None:  # fmt: skip
    """GPU kernel time by category (expert GEMMs, other GEMMs, attention, communication, other).

    With --base-url: /start_profile, a short load, /stop_profile, then the torch profiler's traces are read
    (the twin answers with its simulated breakdown). With --trace: summarize traces already written.
    """
    from tools.profile import profile_server, summarize_traces, trace_files

    if bool(base_url) == bool(trace):
        raise PivotError("give either --base-url or --trace", hint="pivot profile --base-url http://127.0.0.1:30000")
    if trace:
        files = trace_files(trace)
        if not files:
            raise PivotError(f"no trace files in {trace}", hint="SGLang writes <profile_id>-TP-<rank>.trace.json.gz")
        summary = summarize_traces(files)
    else:
        home = ctx.find_root().obj
        paths: Paths = home.paths if home is not None else Paths.from_env()
        directory = Path(output_dir) if output_dir else paths.state_dir / "profiles"
        spec = m.BenchSpec(concurrency=[concurrency], num_prompts=num_prompts or 2 * concurrency,
                           random_input_len=input_len, random_output_len=output_len, warmup_requests=0)  # fmt: skip
        err.print(f"profiling {base_url} under {spec.prompts_for(concurrency)} requests at concurrency {concurrency}")
        summary = profile_server(base_url, directory, spec=spec, num_steps=num_steps)
    if as_json:
        print_json(dump(summary))
        return
    label = "SIMULATED" if summary.source == "simulated" else f"measured, {summary.ranks} GPU rank(s)"
    window = f", window {summary.window_s:,.3f} s" if summary.window_s else ""
    out.print(f"GPU time by category ({label}): {summary.total_s:,.4f} s of kernels per GPU{window}")
    out.print(profile_table(summary))
    if summary.top_kernels:
        top = make_table("kernel", "category", "seconds", "count")
        for k in summary.top_kernels[:10]:
            top.add_row(k.name[:100], k.category, f"{k.seconds:,.4f}", f"{k.count:,}")
        out.print(top)
    for note in summary.notes:
        err.print(f"note: {note}")
