"""A truth for the twin (tools/engines/sim/truth.py): the sim engine measures the target as the truth has it, while
its predictor (what the search ranks by) stays the stock twin."""

from __future__ import annotations

import pytest

from agent import models as m
from agent.contracts import load_engine
from agent.errors import PivotError
from tools.engines.sim.costmodel import CostModel
from tools.engines.sim.truth import FlagEffect, Truth, load_truth
from tools.profiles import load_hardware, load_model

TARGET = {"model_profile": "llama-3.3-70b-fp8", "hardware": "h200", "gpus": 1}
BASE = "--tp-size 1 --mem-fraction-static 0.85"
SPEC = m.BenchSpec(random_input_len=128, random_output_len=256, concurrency=[32], prompts_per_concurrency=1.0)


def _truth(tmp_path, text: str) -> str:
    path = tmp_path / "truth.toml"
    path.write_text(text)
    return str(path)


def test_a_flag_without_effect_is_dropped_and_a_costly_flag_scales():
    truth = Truth.model_validate({
        "flags": [
            {"flag": "--kv-cache-dtype", "value": "fp8_e4m3", "no_effect": True},
            {"flag": "--chunked-prefill-size", "throughput_scale": 0.92},
        ]
    })  # fmt: skip
    read, scale = truth.apply(m.ServerConfig.parse(f"{BASE} --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 4096"))
    assert str(read) == f"{BASE} --chunked-prefill-size 4096" and scale == pytest.approx(0.92)
    read, scale = truth.apply(m.ServerConfig.parse(f"{BASE} --kv-cache-dtype fp8_e5m2"))  # another value: kept
    assert "--kv-cache-dtype fp8_e5m2" in str(read) and scale == 1.0


def test_an_interaction_scales_only_with_all_its_flags_read_by_the_target(tmp_path):
    """Two flags that cost together what neither does alone; a flag the target ignores does not complete the pair."""
    text = (
        "[[interactions]]\nthroughput_scale = 0.85\n"
        "flags = [{ flag = '--enable-mixed-chunk' }, { flag = '--chunked-prefill-size', value = '4096' }]\n"
    )
    truth = load_truth(_truth(tmp_path, text))
    both = f"{BASE} --enable-mixed-chunk --chunked-prefill-size 4096"
    assert truth.apply(m.ServerConfig.parse(both))[1] == pytest.approx(0.85)
    for one in (f"{BASE} --enable-mixed-chunk", f"{BASE} --chunked-prefill-size 4096",
                f"{BASE} --enable-mixed-chunk --chunked-prefill-size 8192"):  # fmt: skip
        assert truth.apply(m.ServerConfig.parse(one))[1] == 1.0, one
    ignored = truth.model_copy(update={"flags": (FlagEffect(flag="--enable-mixed-chunk", no_effect=True),)})
    assert ignored.apply(m.ServerConfig.parse(both))[1] == 1.0


def test_a_throughput_scale_divides_every_step_and_keeps_the_power():
    model, hw = load_model("llama-3.3-70b-fp8"), load_hardware("h200")
    slowed = Truth().hardware_for(hw, 0.8)
    assert slowed.name != hw.name  # nothing cached for the stock profile is taken for it
    for batch in (1, 64, 256):
        stock = CostModel(model, hw, _par()).decode(batch, batch * 1000)
        slow = CostModel(model, slowed, _par()).decode(batch, batch * 1000)
        assert slow.total_s == pytest.approx(stock.total_s / 0.8, rel=1e-9)
        stock_power = CostModel(model, hw, _par()).power_w(
            stock.tensor_s / stock.total_s, stock.memory_s / stock.total_s
        )
        slow_power = CostModel(model, slowed, _par()).power_w(
            slow.tensor_s / slow.total_s, slow.memory_s / slow.total_s
        )
        assert slow_power == pytest.approx(stock_power, rel=1e-9)


def _par():
    from tools.engines.sim.costmodel import Parallel

    return Parallel()


def test_the_hardware_is_scaled_by_dotted_names_and_a_wrong_name_is_refused(tmp_path):
    hw = load_hardware("h200")
    truth = load_truth(_truth(tmp_path, '[hardware.scale]\n"calibration.host_ms_per_step" = 2.0\n'))
    assert truth.hardware_for("h200").calibration.host_ms_per_step == 2 * hw.calibration.host_ms_per_step
    with pytest.raises(PivotError, match="not a number of the hardware profile"):
        Truth.model_validate({"hardware": {"scale": {"calibration.nope": 2.0}}}).hardware_for("h200")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[[flags]]\nflag = '--x'\n", "give its effect"),
        ("[[flags]]\nflag = '--x'\nno_effect = true\nthroughput_scale = 0.9\n", "two effects"),
        ("nme = 'typo'\n", "not a truth"),
        ("[[interactions]]\nthroughput_scale = 0.9\nflags = [{ flag = '--x' }]\n", "not a truth"),  # one flag
        ("[[flags]\n", "does not parse"),
    ],
)
def test_a_bad_truth_file_is_one_clear_line(tmp_path, text, words):
    with pytest.raises(PivotError, match=words):
        load_truth(_truth(tmp_path, text))
    with pytest.raises(PivotError, match="cannot read"):
        load_truth(str(tmp_path / "missing.toml"))


def test_the_engine_measures_the_truth_and_predicts_with_the_stock_twin(tmp_path):
    """A flag the truth makes cost 8%: measured at 0.92 of the stock engine's throughput, predicted as before."""
    truth = _truth(tmp_path, "[[flags]]\nflag = '--schedule-conservativeness'\nthroughput_scale = 0.92\n")
    stock, told = load_engine("sim", **TARGET), load_engine("sim", **TARGET, truth=truth)
    config = m.ServerConfig.parse(f"{BASE} --schedule-conservativeness 0.5")
    target = m.Target(model="m", model_profile="llama-3.3-70b-fp8", hardware="h200", gpus=1)
    a, b = stock.predictor(target), told.predictor(target)
    assert a is not None and b is not None
    assert b.predict(config, SPEC, 32).level.output_throughput == a.predict(config, SPEC, 32).level.output_throughput
    measured = {}
    for name, engine in (("stock", stock), ("truth", told)):
        dep = engine.launch(config, tmp_path / f"{name}.log")
        measured[name] = dep.benchmark(SPEC).levels[0].output_throughput
        dep.stop()
    assert measured["truth"] / measured["stock"] == pytest.approx(0.92, rel=0.02)
    plain = told.launch(m.ServerConfig.parse(BASE), tmp_path / "plain.log")  # without the flag: as the stock twin
    stock_plain = stock.launch(m.ServerConfig.parse(BASE), tmp_path / "stock-plain.log")
    assert plain.benchmark(SPEC).levels[0].output_throughput == stock_plain.benchmark(SPEC).levels[0].output_throughput


def test_a_truth_file_that_does_not_read_is_refused_when_the_engine_is_built(tmp_path):
    with pytest.raises(PivotError, match="truth file"):
        load_engine("sim", **TARGET, truth=str(tmp_path / "nothing.toml"))
