"""`pivot bench`: a concurrency sweep against a running server, with numbers that sit next to bench_serving's.

Progress goes to stderr while it runs; then a summary table like bench_serving's (one column per
level) on stdout, or with --json a JSON array of levels with bench_serving's keys and nothing else.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from agent.cli.base import validation_text
from agent.cli.options import Number, field_number
from agent.console import err, out, print_json, warn
from agent.errors import PivotError
from agent.models import BenchLevel, BenchResult, BenchSpec, parse_levels, parse_slos
from agent.models.objective import SLO_LABELS

EXIT_INTERRUPTED = 130  # what a shell reports for a process stopped by SIGINT

# (label as bench_serving prints it, BenchLevel field, format)
SUMMARY_ROWS: list[tuple[str, str, str]] = [
    ("Successful requests", "completed", "{:,.0f}"),
    ("Failed requests", "failed", "{:,.0f}"),
    ("Benchmark duration (s)", "duration", "{:,.2f}"),
    ("Total input tokens", "total_input_tokens", "{:,.0f}"),
    ("Total generated tokens", "total_output_tokens", "{:,.0f}"),
    ("Request throughput (req/s)", "request_throughput", "{:,.2f}"),
    ("Input token throughput (tok/s)", "input_throughput", "{:,.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:,.2f}"),
    ("Peak output token throughput (tok/s)", "max_output_tokens_per_s", "{:,.2f}"),
    ("Peak concurrent requests", "max_concurrent_requests", "{:,.0f}"),
    ("Total token throughput (tok/s)", "total_throughput", "{:,.2f}"),
    ("Concurrency", "concurrency", "{:,.2f}"),
    ("Accept length", "accept_length", "{:,.2f}"),
    ("Mean E2E Latency (ms)", "mean_e2e_latency_ms", "{:,.2f}"),
    ("Median E2E Latency (ms)", "median_e2e_latency_ms", "{:,.2f}"),
    ("P99 E2E Latency (ms)", "p99_e2e_latency_ms", "{:,.2f}"),
    ("Mean TTFT (ms)", "mean_ttft_ms", "{:,.2f}"),
    ("Median TTFT (ms)", "median_ttft_ms", "{:,.2f}"),
    ("P99 TTFT (ms)", "p99_ttft_ms", "{:,.2f}"),
    ("Mean TPOT (ms)", "mean_tpot_ms", "{:,.2f}"),
    ("Median TPOT (ms)", "median_tpot_ms", "{:,.2f}"),
    ("P99 TPOT (ms)", "p99_tpot_ms", "{:,.2f}"),
    ("Mean ITL (ms)", "mean_itl_ms", "{:,.2f}"),
    ("Median ITL (ms)", "median_itl_ms", "{:,.2f}"),
    ("P99 ITL (ms)", "p99_itl_ms", "{:,.2f}"),
]
# SGLang's --goodput block (attainment as a share of the requests sent, printed in %), pivot's token goodput, and
# the level's energy where it was read (NVML on this host, or the twin's power model).
GOODPUT_ROWS: list[tuple[str, str, str]] = [
    ("Request goodput (req/s)", "request_goodput", "{:,.2f}"),
    ("Token goodput (tok/s)", "token_goodput_tok_s", "{:,.2f}"),
]
ENERGY_ROWS: list[tuple[str, str, str]] = [
    ("Mean power per GPU (W)", "mean_gpu_power_w", "{:,.1f}"),
    ("Energy per output token (J)", "energy_per_output_token_j", "{:,.4f}"),
]
CLIENT_ROWS: list[tuple[str, str, str]] = [
    ("Mean requests in flight", "mean_in_flight", "{:,.1f}"),
    ("Peak requests in flight", "max_in_flight", "{:,.0f}"),
    ("Mean dispatch delay (ms)", "mean_dispatch_delay_ms", "{:,.2f}"),
    ("Max dispatch delay (ms)", "max_dispatch_delay_ms", "{:,.2f}"),
    ("Client CPU (s)", "client_cpu_s", "{:,.2f}"),
]


def _cell(level: BenchLevel, field: str, fmt: str) -> str:
    value = getattr(level, field, None)
    if value is None:
        return "-"
    return fmt.format(value)


def _attainment_cell(level: BenchLevel, metric: str | None) -> str:
    """Attainment in % (overall, or for one SLO), as SGLang prints it."""
    value = level.slo_attainment if metric is None else (level.slo_attainment_by_metric or {}).get(metric)
    return "-" if value is None else f"{value * 100:,.2f}"


def goodput_rows(levels: list[BenchLevel]) -> list[tuple[str, list[str]]]:
    """SGLang's goodput block, one row per figure (SLOs, goodputs, attainment overall and per SLO): empty when no
    level was judged by SLOs."""
    judged = [lv for lv in levels if lv.goodput_slos_ms]
    if not judged:
        return []
    slos = judged[0].goodput_slos_ms or {}
    rows = [("SLOs (ms)", [" ".join(f"{k}:{v:g}" for k, v in (lv.goodput_slos_ms or {}).items()) or "-"
                          for lv in levels])]  # fmt: skip
    rows += [(label, [_cell(lv, field, fmt) for lv in levels]) for label, field, fmt in GOODPUT_ROWS]
    rows.append(("SLO attainment (%)", [_attainment_cell(lv, None) for lv in levels]))
    for metric in slos:
        label = f"{SLO_LABELS.get(metric, metric).replace('E2E latency', 'E2EL')} SLO attainment (%)"
        rows.append((label, [_attainment_cell(lv, metric) for lv in levels]))
    return rows


def summary_table(levels: list[BenchLevel]) -> Table:
    """bench_serving's result block, one column per concurrency level, then the client's own check."""
    table = Table(box=None, show_edge=False, pad_edge=False)
    table.add_column("max concurrency", style="bold")
    for level in levels:
        table.add_column(str(level.max_concurrency if level.max_concurrency is not None else "-"), justify="right")
    for label, field, fmt in SUMMARY_ROWS:
        if field == "accept_length" and all(lv.accept_length is None for lv in levels):
            continue
        table.add_row(label, *(_cell(lv, field, fmt) for lv in levels))
    goodput = goodput_rows(levels)
    if goodput:
        table.add_row(Text("goodput", style="dim"), *("" for _ in levels))
        for label, cells in goodput:
            table.add_row(label, *cells)
    for label, field, fmt in ENERGY_ROWS:
        if any(getattr(lv, field) is not None for lv in levels):
            table.add_row(label, *(_cell(lv, field, fmt) for lv in levels))
    table.add_row(Text("client check", style="dim"), *("" for _ in levels))
    for label, field, fmt in CLIENT_ROWS:
        table.add_row(label, *(_cell(lv, field, fmt) for lv in levels))
    return table


class _ProgressView:
    """Shows LevelProgress on stderr: live bars on a terminal, one line per event otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.progress: Progress | None = None
        self.tasks: dict[int, TaskID] = {}
        if self.live:
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )

    def __enter__(self) -> _ProgressView:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, p: Any) -> None:
        if self.progress is None:
            if p.phase != "running" or p.requests_done == 0:
                self.console.print(str(p))
            return
        label = f"level {p.level_index + 1}/{p.levels_total}  concurrency {p.max_concurrency}"
        if p.level_index not in self.tasks:
            self.tasks[p.level_index] = self.progress.add_task(label, total=p.requests_total, detail="")
        task = self.tasks[p.level_index]
        if p.phase == "warmup":
            self.progress.update(task, detail="warming up")
        elif p.phase == "running":
            failed = f", {p.requests_failed} failed" if p.requests_failed else ""
            self.progress.update(
                task,
                completed=p.requests_done,
                detail=f"{p.in_flight} in flight, {p.output_tok_s:,.0f} tok/s{failed}",
            )
        else:
            lv = p.level
            detail = f"{lv.output_throughput:,.0f} tok/s, TTFT {lv.mean_ttft_ms:,.1f} ms" if lv else "done"
            if lv is not None and lv.failed:
                detail += f", {lv.failed} failed"
            self.progress.update(task, completed=p.requests_total, detail=detail)


def _spec(**given: Any) -> BenchSpec:
    """A BenchSpec from the options the user gave (BenchSpec's defaults for the rest), checked."""
    try:
        return BenchSpec(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        raise PivotError(f"bad benchmark settings: {validation_text(e)}") from e


# The options of `pivot bench`, in the order --help lists them (BenchSpec's defaults apply to those not given).
BENCH_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--base-url", required=True, help="The server, e.g. http://127.0.0.1:30000."),
    click.option(
        "--endpoint",
        type=click.Choice(["generate", "completions", "chat"]),
        default="generate",
        show_default=True,
        help="SGLang's native /generate, or the OpenAI /v1/completions or /v1/chat/completions.",
    ),
    click.option(
        "--concurrency",
        "--max-concurrency",
        "concurrency",
        metavar="LEVELS",
        help="Concurrency levels to sweep, e.g. 1,64,256 (default 1,64,256).",
    ),
    click.option(
        "--input-len",
        "--random-input-len",
        "input_len",
        type=field_number(BenchSpec, "random_input_len"),
        help="Input tokens (1024).",
    ),
    click.option(
        "--output-len",
        "--random-output-len",
        "output_len",
        type=field_number(BenchSpec, "random_output_len"),
        help="Output tokens (1024).",
    ),
    click.option(
        "--range-ratio",
        "--random-range-ratio",
        "range_ratio",
        type=field_number(BenchSpec, "random_range_ratio"),
        help="Lengths ~ uniform[max(int(L*R), 1), L], as bench_serving (0.0; 1.0 gives exactly L).",
    ),
    click.option(
        "--num-prompts",
        type=field_number(BenchSpec, "num_prompts"),
        help="Prompts per level (default: 2 x concurrency, at least 8).",
    ),
    click.option(
        "--request-rate",
        type=field_number(BenchSpec, "request_rate", allow_inf=True),
        help="Requests per second, Poisson arrivals (default inf: all at once).",
    ),
    click.option(
        "--dataset-name",
        type=click.Choice(["random-ids", "random"]),
        help="random-ids: token ids (text for chat); random: text. Default random-ids.",
    ),
    click.option(
        "--warmup-requests",
        type=field_number(BenchSpec, "warmup_requests"),
        help="Warmup requests per level, not counted (1).",
    ),
    click.option("--seed", type=field_number(BenchSpec, "seed"), help="Random seed (42, as bench_serving)."),
    click.option("--disable-ignore-eos", is_flag=True, help="Let requests stop at EOS (as bench_serving's flag)."),
    click.option(
        "--request-timeout-s",
        type=field_number(BenchSpec, "request_timeout_s"),
        help="Per-request timeout in s (600).",
    ),
    click.option("--model", help="Model name in OpenAI requests (default: the first of GET /v1/models, if any)."),
    click.option(
        "--vocab-size",
        type=Number(int, min=2, max=2**31 - 1),
        default=None,
        help="Random token ids (generate, completions) are drawn below this. Default: the served model's vocabulary "
        "when --model (or the name GET /v1/models gives) is a folder or a cached hub model this host can read, else "
        "32000 (bench_serving's exact prompts with a 32k tokenizer). Give it so that no id is one the model does not "
        "know (a server answering 'token id out of vocabulary' needs it).",
    ),
    click.option(
        "--output-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Append one JSON line per level, with bench_serving's keys.",
    ),
    click.option(
        "--slo",
        "--goodput",
        "goodput",
        multiple=True,
        metavar="METRIC:MS,...",
        help="SLOs per request in ms, as every pivot command takes them: --slo ttft:500,tpot:50,e2el:20000 (SGLang's "
        "spelling, --goodput ttft:500 tpot:50, is accepted too). Each level then reports request goodput, SLO "
        "attainment (overall and per SLO) and token goodput; a request is good when it succeeded and met every SLO.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print only a JSON array of levels on stdout."),
    click.option(
        "--via",
        type=click.Choice(["pivot", "sglang"]),
        default="pivot",
        show_default=True,
        help="sglang: run SGLang's own benchmark module with the same settings and read its results.",
    ),
    click.option("--tokenizer", help="With --via sglang: the tokenizer bench_serving should load."),
    click.option(
        "--sglang-python",
        default=sys.executable,
        show_default="this interpreter",
        help="With --via sglang: the Python that has SGLang installed.",
    ),
]


def _with_options(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """A decorator that applies `options` so that --help lists them in this order."""

    def apply(f: Any) -> Any:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def split_slos(goodput: tuple[str, ...], rest: tuple[str, ...]) -> tuple[dict[str, float] | None, tuple[str, ...]]:
    """The SLOs of `--goodput A B C` (click takes one value per option: the pairs after the first arrive as
    arguments, so the leading METRIC:MS arguments are the option's), and the arguments left."""
    if not goodput:
        return None, rest
    pairs = list(goodput)
    rest_list = list(rest)
    while rest_list and SLO_PAIR.match(rest_list[0]):
        pairs.append(rest_list.pop(0))
    try:
        return parse_slos(pairs), tuple(rest_list)
    except ValueError as e:
        raise PivotError(
            f"bad --slo: {e}", hint="write SLOs in ms: --slo ttft:500,tpot:50 (or SGLang's --goodput ttft:500 tpot:50)"
        ) from e


SLO_PAIR = re.compile(r"^[A-Za-z0-9_]+:[^:]*$")


@click.command("bench")
@_with_options(BENCH_OPTIONS)
@click.argument("slo_pairs", nargs=-1, metavar="[METRIC:MS]...")
def bench(
    base_url: str,
    endpoint: str,
    concurrency: str | None,
    input_len: int | None,
    output_len: int | None,
    range_ratio: float | None,
    num_prompts: int | None,
    request_rate: float | None,
    dataset_name: str | None,
    warmup_requests: int | None,
    seed: int | None,
    disable_ignore_eos: bool,
    request_timeout_s: float | None,
    model: str | None,
    vocab_size: int | None,
    output_file: Path | None,
    as_json: bool,
    via: str,
    tokenizer: str | None,
    sglang_python: str,
    goodput: tuple[str, ...],
    slo_pairs: tuple[str, ...],
) -> None:
    """Benchmark a running server over concurrency levels, with bench_serving's workload and metrics (and, with
    --goodput, SGLang's goodput keys and pivot's token goodput)."""
    slos, extra = split_slos(goodput, slo_pairs)
    if extra:
        raise PivotError(f"unexpected argument {extra[0]!r}", hint="SLOs are written --slo ttft:500,tpot:50")
    try:
        levels = parse_levels(concurrency) if concurrency is not None else None
    except ValidationError as e:  # parse_levels checks with BenchSpec's own validator
        raise PivotError(f"bad concurrency list {concurrency!r}: {e.errors()[0]['msg']}") from e
    spec = _spec(
        endpoint=endpoint,
        concurrency=levels,
        random_input_len=input_len,
        random_output_len=output_len,
        random_range_ratio=range_ratio,
        num_prompts=num_prompts,
        request_rate=request_rate,
        dataset_name=dataset_name,
        warmup_requests=warmup_requests,
        seed=seed,
        ignore_eos=False if disable_ignore_eos else None,
        request_timeout_s=request_timeout_s,
        goodput_slos_ms=slos,
    )
    result = _sweep(base_url, spec, via=via, model=model, tokenizer=tokenizer, output_file=output_file,
                    vocab_size=vocab_size, sglang_python=sglang_python)  # fmt: skip
    _report(result, as_json=as_json)
    if result.interrupted:
        err.print(
            f"interrupted: {len(result.levels)} of {len(spec.concurrency)} levels finished"
            + (f"; they are in {output_file}" if output_file and result.levels else ""),
        )
        sys.exit(EXIT_INTERRUPTED)
    if result.levels and all(lv.completed == 0 for lv in result.levels):
        raise PivotError(
            "no request succeeded at any level",
            hint="see the errors above: the server may reject this workload, or be overloaded",
        )


def _sweep(base_url: str, spec: BenchSpec, *, via: str, model: str | None, tokenizer: str | None,
           output_file: Path | None, vocab_size: int | None, sglang_python: str) -> BenchResult:  # fmt: skip
    """The sweep, by pivot's own client or (--via sglang) by SGLang's benchmark module, with progress on stderr."""
    from tools import loadgen  # numpy and the client load only for this command

    with _ProgressView(err) as view:
        if via == "sglang":
            result = loadgen.reference_sweep(
                base_url,
                spec,
                python=sglang_python,
                model=model,
                tokenizer=tokenizer,
                output_file=output_file,
                on_progress=view,
                log=None if view.live else (lambda line: err.print(line)),
            )
        else:
            result = loadgen.benchmark(
                base_url, spec, model=model, on_progress=view, output_file=output_file, vocab_size=vocab_size
            )
    return result


def _report(result: BenchResult, *, as_json: bool) -> None:
    """The levels as JSON on stdout, or as bench_serving's summary; warnings and errors after them."""
    levels = result.levels
    if as_json:
        print_json([lv.model_dump() for lv in levels])
        for lv in levels:
            for w in lv.warnings:
                warn(f"concurrency {lv.max_concurrency}: {w}")
        return
    if not levels:
        out.print("No level finished.")
        return
    spec = result.spec
    rate = "inf" if math.isinf(spec.request_rate) else f"{spec.request_rate:g}"
    out.print(
        f"[bold]{' Serving Benchmark Result ':=^60}[/]\n"
        f"Backend: {levels[0].backend}   Dataset: {spec.dataset_name}   "
        f"Input/output tokens: {spec.random_input_len}/{spec.random_output_len} "
        f"(range ratio {spec.random_range_ratio:g})   Request rate: {rate}",
        markup=True,
    )
    out.print(summary_table(levels))
    for lv in levels:
        if lv.errors:
            reasons = ", ".join(f"{reason} x{count}" for reason, count in sorted(lv.errors.items()))
            out.print(f"[red]concurrency {lv.max_concurrency}: {lv.failed} failed:[/] {reasons}", markup=True)
        for w in lv.warnings:
            out.print(f"[yellow]concurrency {lv.max_concurrency}:[/] {w}", markup=True)
    if result.raw_path:
        out.print(f"[dim]results appended to {result.raw_path}[/]", markup=True)
