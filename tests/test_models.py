"""The shared vocabulary: server configs as ordered flags, workloads, plan items."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.errors import PivotError
from agent.models import BenchSpec, Flag, PlanItem, ServerConfig, Target, parse_levels


def test_parse_keeps_order_spelling_and_values():
    cfg = ServerConfig.parse("--tp 8 --enable-mscclpp --chunked-prefill-size -1 --cuda-graph-bs-decode 1 2 4 --x=y")
    assert cfg.names() == ["--tp", "--enable-mscclpp", "--chunked-prefill-size", "--cuda-graph-bs-decode", "--x"]
    assert cfg.get("--tp").value == "8"
    assert cfg.get("--enable-mscclpp").value is None
    assert cfg.get("--chunked-prefill-size").value == "-1"  # a negative number is a value, not a flag
    assert cfg.get("--cuda-graph-bs-decode").value == ("1", "2", "4")
    assert cfg.argv() == [
        "--tp",
        "8",
        "--enable-mscclpp",
        "--chunked-prefill-size",
        "-1",
        "--cuda-graph-bs-decode",
        "1",
        "2",
        "4",
        "--x",
        "y",
    ]


def test_parse_never_runs_a_shell():
    cfg = ServerConfig.parse("--served-model-name '$(rm -rf /); echo'")
    assert cfg.argv() == ["--served-model-name", "$(rm -rf /); echo"]


def test_parse_rejects_a_positional_before_flags():
    with pytest.raises(PivotError, match="before any flag"):
        ServerConfig.parse("serve --tp 8")


def test_flag_names_are_checked():
    with pytest.raises(ValidationError):
        Flag(name="tp-size")
    with pytest.raises(ValidationError):
        Flag(name="--tp size")


def test_with_flags_replaces_in_place_and_appends_new_ones():
    base = ServerConfig.parse("--model-path m --tp-size 8 --max-running-requests 1024")
    out = base.with_flags("--max-running-requests 2048 --enable-mscclpp")
    assert out.argv() == ["--model-path", "m", "--tp-size", "8", "--max-running-requests", "2048", "--enable-mscclpp"]
    assert base.get("--max-running-requests").value == "1024"  # the original is unchanged
    assert out.without("--tp-size").names() == ["--model-path", "--max-running-requests", "--enable-mscclpp"]


def test_repeated_flag_last_one_wins_and_with_flags_collapses_it():
    cfg = ServerConfig.parse("--tp-size 4 --tp-size 8")
    assert cfg.get("--tp-size").value == "8"
    assert cfg.with_flags("--tp-size 2").argv() == ["--tp-size", "2"]
    assert ServerConfig().with_flags("--ep 2 --ep 4").argv() == ["--ep", "4"]


def test_diff_names_added_removed_changed_flags_and_env():
    base = ServerConfig.parse("--tp-size 8 --max-running-requests 1024 --enable-mscclpp", env={"A": "1"})
    new = ServerConfig.parse("--tp-size 8 --max-running-requests 2048 --ep-size 8", env={"A": "2", "B": "x"})
    d = new.diff(base)
    assert [(c.name, c.old, c.new) for c in d.flags] == [
        ("--max-running-requests", "1024", "2048"),
        ("--enable-mscclpp", "(on)", None),
        ("--ep-size", None, "8"),
    ]
    assert [(c.name, c.old, c.new) for c in d.env] == [("A", "1", "2"), ("B", None, "x")]
    assert str(d) == (
        "--max-running-requests 1024 -> 2048, without --enable-mscclpp, --ep-size 8, env A 1 -> 2, env B x"
    )
    assert str(ServerConfig.parse("--enable-mscclpp").diff(ServerConfig())) == "--enable-mscclpp"
    assert new.diff(new).empty and str(new.diff(new)) == "(no change)"


def test_config_validates_from_string_and_argv_list():
    assert ServerConfig.model_validate("--tp-size 8").argv() == ["--tp-size", "8"]
    assert ServerConfig.model_validate(["--tp-size", "8"]).argv() == ["--tp-size", "8"]
    assert ServerConfig.model_validate({"flags": "--tp-size 8", "env": {"X": "1"}}).env == {"X": "1"}


_names = st.from_regex(r"--[a-z][a-z0-9-]{0,15}", fullmatch=True)
_values = st.one_of(
    st.none(),
    st.from_regex(r"[A-Za-z0-9_./:{}\"' -]{1,12}", fullmatch=True).filter(lambda v: not v.startswith("-")),
    st.integers(-5, 5000).map(str),
    st.lists(st.integers(0, 512).map(str), min_size=2, max_size=4).map(tuple),
)


@given(st.lists(st.tuples(_names, _values), max_size=8))
def test_argv_and_string_round_trip(pairs):
    cfg = ServerConfig(flags=tuple(Flag(name=n, value=v) for n, v in pairs))
    assert ServerConfig.parse(cfg.argv()) == cfg
    assert ServerConfig.parse(str(cfg)) == cfg
    assert ServerConfig.model_validate_json(cfg.model_dump_json()) == cfg


def test_bench_spec_levels_prompts_and_workload_key():
    spec = BenchSpec(concurrency=[1, 256], random_input_len=256)
    assert spec.prompts_for(1) == spec.min_prompts and spec.prompts_for(256) == 512
    assert BenchSpec(num_prompts=100).prompts_for(2048) == 100
    assert math.isinf(spec.request_rate)
    assert spec.workload_key() == BenchSpec(concurrency=[2048], random_input_len=256).workload_key()
    assert spec.workload_key() != BenchSpec(random_input_len=512).workload_key()
    for bad in ([], [0], [4, 4]):
        with pytest.raises(ValidationError):
            BenchSpec(concurrency=bad)
    with pytest.raises(ValidationError):
        BenchSpec(random_range_ratio=1.5)
    assert parse_levels("1, 64,256") == [1, 64, 256]
    with pytest.raises(PivotError):
        parse_levels("1,many")
    with pytest.raises(PivotError, match="must not repeat"):
        parse_levels("4,4")


def _item(**kw):
    base = dict(id="01", tier=1, title="t", hypothesis="h", expected_impact="e")
    return PlanItem(**{**base, **kw})


def test_plan_item_kinds_need_their_change():
    with pytest.raises(ValidationError, match="needs `flags`"):
        _item(kind="flag")
    with pytest.raises(ValidationError, match="needs `change`"):
        _item(kind="code")
    with pytest.raises(ValidationError, match="workload"):
        _item(kind="workload")
    with pytest.raises(ValidationError):
        _item(kind="workload", workload={"random_input_len": -3})
    assert _item(kind="profile").kind == "profile"


def test_plan_item_applies_flags_and_workload():
    item = _item(kind="flag", flags="--enable-mscclpp", remove_flags=["--disable-cuda-graph"])
    base = ServerConfig.parse("--tp-size 8 --disable-cuda-graph")
    assert item.apply(base).argv() == ["--tp-size", "8", "--enable-mscclpp"]
    w = _item(kind="workload", workload={"random_output_len": 2048})
    assert w.workload_for(BenchSpec()).random_output_len == 2048


def test_target_base_config_puts_the_model_first():
    t = Target(model="org/m", hardware="h200", gpus=1, flags="--tp-size 1")
    assert t.base_config().argv() == ["--model-path", "org/m", "--tp-size", "1"]
    t2 = Target(model="org/m", hardware="h200", gpus=1, flags="--model /local/m")
    assert t2.base_config().argv() == ["--model", "/local/m"]


def test_a_command_line_puts_the_environment_before_the_command():
    config = ServerConfig.parse("--model /m --max-model-len 2048", env={"VLLM_CPU_KVCACHE_SPACE": "1", "A": "x y"})
    assert config.command_line(["vllm", "serve"]) == (
        "A='x y' VLLM_CPU_KVCACHE_SPACE=1 vllm serve --model /m --max-model-len 2048"
    )
    assert ServerConfig.parse("--tp 2").command_line(["python", "-m", "m"]) == "python -m m --tp 2"
