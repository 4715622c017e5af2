"""`pivot sim`: the digital twin from the command line (what-if predictions of SGLang on given GPUs)."""

from __future__ import annotations

import click

from agent import models as m
from agent.cli.options import GPUS, NOISE, SEED, TIME_SCALE, Number, field_number
from agent.console import dump, err, make_table, out, print_json
from agent.errors import PivotError
from agent.settings import settings
from tools.engines.sim.options import twin_defaults


@click.group()
def sim() -> None:
    """The digital twin of SGLang: predict a sweep, or serve SGLang's endpoints from it."""


def _workload(
    input_len: int | None,
    output_len: int | None,
    range_ratio: float | None,
    num_prompts: int | None,
    seed: int | None,
    levels: str,
) -> m.BenchSpec:
    """The calibration workload with the command line's overrides."""
    from agent.plans import load_plan

    base = load_plan(settings().demo_plan).workload  # the seeds' workload, the one the twin is calibrated on
    update = {"concurrency": m.parse_levels(levels)}
    for key, value in (
        ("random_input_len", input_len),
        ("random_output_len", output_len),
        ("random_range_ratio", range_ratio),
        ("num_prompts", num_prompts),
        ("seed", seed),
    ):
        if value is not None:
            update[key] = value
    from agent.cli.bench import _spec

    return _spec(**{**base.model_dump(), **update})


def _profile_options(f):
    twin = twin_defaults()  # the twin's defaults, one home (tools/engines/sim/options.py)
    f = click.option("--gpus", type=GPUS, default=twin["gpus"], show_default=True, help="GPUs on the simulated host.")(
        f
    )
    f = click.option(
        "--hardware", default=twin["hardware"], show_default=True, help="Hardware profile (name or .toml)."
    )(f)
    f = click.option(
        "--model-profile", default=twin["model_profile"], show_default=True, help="Model profile (name or .toml)."
    )(f)
    return f


def build_twin(model_profile: str, hardware: str, gpus: int, flags: tuple[str, ...]):
    """The twin for a command line; SGLang's own parse errors and startup failures become PivotErrors."""
    from tools.engines.catalog import CatalogError
    from tools.engines.sim.twin import Twin, TwinStartupError

    try:
        return Twin.build(model_profile, hardware, gpus, m.ServerConfig.parse(list(flags)))
    except CatalogError as e:
        raise PivotError(f"SGLang would refuse these flags: {e.message}", hint=e.hint) from e
    except TwinStartupError as e:
        raise PivotError(f"the server would not start: {e.message}", hint=f"SGLang logs: {e.log}") from e


@sim.command(context_settings={"ignore_unknown_options": True})
@_profile_options
@click.option(
    "--concurrency", "levels", default="1,256,512,1024,2048", show_default=True, help="Levels, e.g. 1,64,256."
)
@click.option("--input-len", type=field_number(m.BenchSpec, "random_input_len"),
              help="Random input length (default: the calibration workload's).")  # fmt: skip
@click.option("--output-len", type=field_number(m.BenchSpec, "random_output_len"), help="Random output length.")
@click.option("--range-ratio", type=field_number(m.BenchSpec, "random_range_ratio"),
              help="bench_serving's --random-range-ratio.")  # fmt: skip
@click.option("--num-prompts", type=field_number(m.BenchSpec, "num_prompts"),
              help="Prompts per level (default: one per concurrent request).")  # fmt: skip
@click.option("--seed", type=field_number(m.BenchSpec, "seed"), help="Workload seed.")
@click.option("--noise", type=NOISE, default=0.0, show_default=True, help="Run-to-run variation (0.02 = about 2%).")
@click.option("--request-rate", type=field_number(m.BenchSpec, "request_rate", allow_inf=True),
              help="Requests per second, Poisson arrivals (default inf: all at once).")  # fmt: skip
@click.option("--slo", "--goodput", "goodput", multiple=True, metavar="METRIC:MS,...",
              help="SLOs per request in ms: --slo ttft:500,tpot:50 (SGLang's --goodput ttft:500 tpot:50 is accepted "
                   "too); adds request goodput, SLO attainment overall and per SLO, and token goodput per level.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print only a JSON array of levels on stdout.")
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def predict(model_profile, hardware, gpus, levels, input_len, output_len, range_ratio, num_prompts, seed, noise,
            request_rate, goodput, as_json, flags) -> None:  # fmt: skip
    """Predict a benchmark sweep of SGLang with FLAGS (after --) on simulated GPUs.

    The default workload is the one the twin is calibrated on: random token ids, input and output
    lengths uniform in [1, 256] (bench_serving's --random-range-ratio 0), one prompt per concurrent
    request, all sent at once. Every number is simulated, not measured. With --goodput, each level has
    SGLang's goodput keys (goodput_slos_ms, request_goodput, slo_attainment, slo_attainment_by_metric) and
    pivot's token goodput, from the twin's per-request latencies.
    """
    from agent.cli.bench import split_slos

    slos, flags = split_slos(goodput, flags)
    spec = _workload(input_len, output_len, range_ratio, num_prompts, seed, levels)
    update: dict[str, object] = {}
    if slos:
        update["goodput_slos_ms"] = slos
    if request_rate is not None:
        update["request_rate"] = request_rate
    spec = spec.model_copy(update=update) if update else spec
    twin = build_twin(model_profile, hardware, gpus, flags)
    results = twin.predict(spec, noise=noise)
    if as_json:
        print_json([dump(level) for level, _ in results])
        return
    r = twin.resolved
    out.print(
        f"SIMULATED: {twin.model.title} on {gpus}x {twin.hw.title}, SGLang 0.5.23 twin "
        f"(tp {r['tp_size']}, pp {r['pp_size']}, ep {r['ep_size']})"
    )
    out.print(
        f"KV pool {r['max_total_num_tokens']:,} tokens ({r['kv_pool_gib_per_gpu']} GiB/GPU beside "
        f"{r['weights_gib_per_gpu']} GiB of weights), max running requests {r['max_running_requests']}, "
        f"chunked prefill {r['chunked_prefill_size']}, decode CUDA graph up to {r['cuda_graph_max_bs_decode']}"
    )
    out.print(
        f"workload: {spec.dataset_name}, input {spec.random_input_len} / output {spec.random_output_len} "
        f"(range ratio {spec.random_range_ratio}), seed {spec.seed}"
    )
    if twin.no_effect:
        err.print(f"note: no effect in SGLang 0.5.23 (accepted, read by nothing): {', '.join(twin.no_effect)}")
    if twin.not_modelled:
        err.print(f"note: accepted but not modelled by the twin: {', '.join(twin.not_modelled)}")
    columns = ["conc", "ok/fail", "out tok/s", "total tok/s", "peak out", "TTFT ms", "TPOT ms", "ITL ms", "W/GPU",
               "J/tok", "KV use"]  # fmt: skip
    if slos:
        columns += ["attain", *(f"{k} att" for k in slos), "good req/s", "good tok/s"]
    rows = make_table(*columns)
    for level, _ in results:
        extra = level.model_extra or {}
        energy = level.energy_per_output_token_j
        cells = [
            str(level.max_concurrency),
            f"{level.completed}/{level.failed}",
            f"{level.output_throughput:,.0f}",
            f"{level.total_throughput:,.0f}",
            f"{level.max_output_tokens_per_s:,.0f}",
            f"{level.mean_ttft_ms:,.0f}",
            f"{level.mean_tpot_ms:,.1f}",
            f"{level.mean_itl_ms:,.1f}",
            f"{level.mean_gpu_power_w or 0:,.0f}",
            "-" if energy is None else f"{energy:,.3f}",
            f"{extra.get('max_token_usage', 0):.2f}",
        ]
        if slos:
            by_metric = level.slo_attainment_by_metric or {}
            cells += [f"{(level.slo_attainment or 0) * 100:.1f}%", *(f"{by_metric.get(k, 0) * 100:.1f}%" for k in slos),
                      f"{level.request_goodput or 0:,.2f}", f"{level.token_goodput_tok_s or 0:,.0f}"]  # fmt: skip
        rows.add_row(*cells)
    out.print(rows)
    if slos:
        out.print(f"SLOs: {m.slo_text(slos)}; attainment = good requests / requests sent (simulated)")
    for level, sim_level in results:
        if sim_level.fault is not None:
            err.print(
                f"warning: the server crashed under load at concurrency {level.max_concurrency} "
                f"({sim_level.fault.name}): {sim_level.fault.log}"
            )
            break


@sim.command(context_settings={"ignore_unknown_options": True})
@_profile_options
@click.option("--time-scale", type=TIME_SCALE, default=1.0, show_default=True,
              help="Simulated seconds per wall-clock second (server_info reports it).")  # fmt: skip
@click.option("--startup-s", type=Number(float, min=0.0, max=3600.0), default=2.0, show_default=True,
              help="Wall seconds of startup during which /health answers 503.")  # fmt: skip
@click.option("--noise", type=NOISE, default=0.0, show_default=True, help="Run-to-run variation (0.02 = about 2%).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the step-time noise.")
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def serve(ctx, model_profile, hardware, gpus, time_scale, startup_s, noise, seed, flags) -> None:
    """Serve SGLang's HTTP endpoints from the twin, with SGLang's FLAGS (after --), as a real process.

    Binds to --host/--port (SGLang's defaults 127.0.0.1:30000); /health answers 503 for --startup-s,
    then the ready line is logged. Tokens come from the twin's scheduler on the wall clock, sped up by
    --time-scale; everything the server reports (logs, /metrics, /stop_profile, /sim/telemetry) is in
    simulated seconds. Refused flags exit 2 with SGLang's message; a startup fault or a fault under load
    exits 1 with SGLang's log line; SIGTERM or SIGINT exits 0.
    """
    from tools.engines.sim.server import ServeOptions
    from tools.engines.sim.server import serve as run_server

    options = ServeOptions(time_scale=time_scale, startup_s=startup_s, noise=noise, seed=seed)
    ctx.exit(run_server(flags, model_profile=model_profile, hardware=hardware, gpus=gpus, options=options))


@sim.command("step", context_settings={"ignore_unknown_options": True})
@click.option("--model-profile", required=True, help="A model profile's name, a profile file, a model folder with "
              "a config.json (as a plan's target), or that config.json.")  # fmt: skip
@click.option("--hardware", required=True, help="Hardware profile (name or .toml).")
@click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help="Tensor-parallel GPUs.")
@click.option("--batch", type=click.IntRange(1, 100_000), required=True, help="Requests in the decode step.")
@click.option("--context", type=click.IntRange(1, 10_000_000), required=True, help="KV tokens each request holds.")
@click.option("--prefill-tokens", type=click.IntRange(1, 10_000_000), help="Also cost one prefill step of T tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def step(model_profile: str, hardware: str, tp: int, batch: int, context: int, prefill_tokens: int | None,
         as_json: bool, flags: tuple[str, ...]) -> None:  # fmt: skip
    """The twin's cost of one engine step, broken down: GPU time (GEMMs, attention, communication), host time, the
    step as the engine runs it (the host's work hidden behind the GPU's by the overlap scheduler), and the power per
    GPU with the clock it runs at. Simulated, not measured; SGLang's FLAGS after --.

    \b
    Examples:
      pivot sim step --model-profile llama-3.3-70b-fp8 --hardware h200 --batch 64 --context 4096
      pivot sim step --model-profile ./my-model --hardware h200 --tp 2 --batch 1 --context 1024 --json
    """
    from tools.engines.sim.step import step_cost

    report = step_cost(model_profile, hardware, tp=tp, batch=batch, context=context, prefill_tokens=prefill_tokens,
                       flags=flags)  # fmt: skip
    data = report.as_json()
    if as_json:
        print_json(data)
        return
    out.print(f"{data['model']} on {data['tp']}x {data['hardware']}: decode step of {batch} requests x {context} "
              "tokens (simulated)", highlight=False)  # fmt: skip
    table = make_table("part", "ms")
    for key, value in data["breakdown_ms"].items():
        table.add_row(key.replace("_", " "), "not modelled" if value is None else f"{value:,.3f}")
    table.add_row("GPU (sum)", f"{data['gpu_ms']:,.3f}")
    table.add_row("host", f"{data['host_ms']:,.3f}")
    table.add_row("step", f"{data['step_ms']:,.3f}")
    out.print(table)
    out.print(f"power {data['power_w']:,.0f} W per GPU at {data['clock_share']:.0%} of the SM clock; "
              f"{data['tokens_per_s']:,.0f} output tok/s", highlight=False)  # fmt: skip
    if "prefill" in data:
        p = data["prefill"]
        out.print(f"prefill of {p['tokens']:,} tokens: {p['step_ms']:,.2f} ms (GPU {p['gpu_ms']:,.2f} ms)",
                  highlight=False)  # fmt: skip
    for note in data["notes"]:
        err.print(f"note: {note}", highlight=False)
