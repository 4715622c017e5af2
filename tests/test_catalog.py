"""The SGLang command-line catalog: its parser fails in SGLang's own words, and the audit says what to do instead."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import logging
import sys
from pathlib import Path

import pytest

from agent.errors import PivotError
from agent.models import FlagIssue, ServerConfig
from tools.engines.catalog import (
    CatalogError,
    FlagSpec,
    audit,
    available_versions,
    load_catalog,
    nearest_flag,
)
from tools.engines.catalog.argtypes import human_readable_int

ROOT = Path(__file__).resolve().parent.parent
# The facts dump the catalog was generated from (../shared/facts/sglang-0.5.23-flags.json), vendored so the
# provenance tests run in every clone; tests/test_catalog.py checks the copy is the dump the catalog names.
FACTS = ROOT / "tests" / "data" / "sglang-0.5.23-flags.json"
CATALOG_JSON = ROOT / "tools" / "engines" / "catalog" / "sglang-0.5.23.json"


@pytest.fixture(scope="module")
def catalog():
    return load_catalog("sglang", "0.5.23")


def _error(catalog, argv, *, require_model=True) -> CatalogError:
    with pytest.raises(CatalogError) as info:
        catalog.parse(argv, require_model=require_model)
    return info.value


# ------------------------------------------------------------------------------------------------------
# The catalog is the facts dump, all of it, and the parser built from it has the same actions.


def test_the_vendored_facts_are_the_dump_the_catalog_was_made_from():
    import hashlib

    shipped = json.loads(CATALOG_JSON.read_text())
    recorded = json.dumps(shipped, sort_keys=True)
    assert hashlib.sha256(FACTS.read_bytes()).hexdigest() in recorded


def test_every_facts_entry_is_in_the_catalog_unchanged():
    facts = json.loads(FACTS.read_text())
    shipped = json.loads(CATALOG_JSON.read_text())
    assert len(facts["flags"]) == 531
    assert shipped["flags"] == facts["flags"]
    assert (shipped["engine"], shipped["version"]) == (facts["engine"], facts["version"])


def test_the_parser_has_the_dumped_actions_in_order(catalog):
    entries = json.loads(CATALOG_JSON.read_text())["flags"]
    actions = catalog.parser()._actions
    assert actions[0].option_strings == ["-h", "--help"]
    assert len(actions) == 1 + len(entries) == 532
    for action, entry in zip(actions[1:], entries, strict=True):
        assert action.option_strings == entry["opts"]
        assert action.dest == entry["dest"]
        assert type(action).__name__ == entry["action"]
        assert getattr(action.type, "__name__", "None") == entry["type"]
        assert action.nargs == entry["nargs"]
        assert action.choices == entry["choices"]
        assert action.required == entry["required"]
        assert action.default == ast.literal_eval(entry["default"])


def test_the_generator_reproduces_the_committed_catalog():
    spec = importlib.util.spec_from_file_location("gen_catalog", ROOT / "scripts" / "gen_catalog.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out, text = gen.generate(FACTS)
    assert out == CATALOG_JSON
    assert text == CATALOG_JSON.read_text(), "run: python scripts/gen_catalog.py --facts " + str(FACTS)


def test_the_generator_refuses_annotations_that_do_not_match_the_dump():
    spec = importlib.util.spec_from_file_location("gen_catalog", ROOT / "scripts" / "gen_catalog.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    facts = {"engine": "sglang", "version": "9", "source": "", "flags": json.loads(CATALOG_JSON.read_text())["flags"]}
    base = {"engine": "sglang", "version": "9", "parser": {"prog": "sglang serve"}}
    assert '"flags": [' in gen.render(facts, base, "f.json", "0")
    bad = [
        {"removed": [{"flag": "--tp-size", "replacement": "x"}]},
        {"deprecated": [{"flag": "--no-such-flag", "replacement": "x", "warns": False}]},
        {"deprecated": [{"flag": "--disable-cuda-graph", "replacement": "x", "warns": False}]},
        {"noop": [{"flag": "--no-such-flag", "evidence": "x"}]},
        {"invalid_combinations": [{"name": "n", "flags": ["--tp-size"], "when": "no_such_dest > 1"}]},
        {"invalid_combinations": [{"name": "n", "flags": ["--tp-size"], "when": "__import__('os')"}]},
    ]
    for extra in bad:
        with pytest.raises(gen.CatalogSourceError):
            gen.render(facts, {**base, **extra}, "f.json", "0")


def test_versions_and_a_missing_version(catalog):
    assert available_versions("sglang") == ["0.5.23"]
    assert (catalog.engine, catalog.version, catalog.prog, catalog.title) == (
        "sglang",
        "0.5.23",
        "sglang serve",
        "SGLang 0.5.23",
    )
    with pytest.raises(PivotError) as info:
        load_catalog("sglang", "0.0.1")
    assert "0.5.23" in (info.value.hint or "")


# ------------------------------------------------------------------------------------------------------
# Exact messages.


def test_removed_flag_is_unrecognized(catalog):
    e = _error(catalog, ["--model-path", "m", "--enable-piecewise-cuda-graph"])
    assert e.message == "unrecognized arguments: --enable-piecewise-cuda-graph"
    assert e.exit_code == 2
    assert "breakable" in e.hint


def test_old_cuda_graph_max_bs_is_ambiguous(catalog):
    e = _error(catalog, ["--model-path", "m", "--cuda-graph-max-bs", "256"])
    assert (
        e.message
        == "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )


def test_bad_int_and_bad_choice(catalog):
    e = _error(catalog, ["--tp-size", "eight"], require_model=False)
    assert e.message == "argument --tp-size/--tensor-parallel-size: invalid int value: 'eight'"
    e = _error(catalog, ["--kv-cache-dtype", "fp16"], require_model=False)
    reference = argparse.ArgumentParser(exit_on_error=False)
    reference.add_argument("--kv-cache-dtype", choices=catalog.flag("--kv-cache-dtype").choices)
    with pytest.raises(argparse.ArgumentError) as ref:
        reference.parse_args(["--kv-cache-dtype", "fp16"])
    assert e.message == str(ref.value)  # whatever this Python's argparse says
    if sys.version_info[:2] == (3, 11):
        assert e.message == (
            "argument --kv-cache-dtype: invalid choice: 'fp16' (choose from 'auto', 'fp8_e5m2', 'fp8_e4m3', "
            "'mxfp8', 'bf16', 'bfloat16', 'nvfp4', 'fp4_mx_block16')"
        )


def test_model_path_is_required_unless_told_otherwise(catalog):
    assert _error(catalog, ["--tp-size", "8"]).message == "the following arguments are required: --model-path/--model"
    assert catalog.parse(["--tp-size", "8"], require_model=False)["model_path"] is None
    assert catalog.parse(["--model", "org/m"])["model_path"] == "org/m"


def test_stderr_is_what_argparse_prints(catalog):
    e = _error(catalog, ["--model-path", "m", "--enable-piecewise-cuda-graph"])
    parser = catalog.parser()
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured), pytest.raises(CatalogError) as exiting:
        argparse.ArgumentParser.error(parser, e.message)  # argparse's own printing, up to the exit
    assert e.stderr == captured.getvalue() + exiting.value.message + "\n"
    assert e.stderr.startswith("usage: sglang serve [-h] --model-path MODEL_PATH")
    assert e.stderr.endswith("\nsglang serve: error: unrecognized arguments: --enable-piecewise-cuda-graph\n")


def test_help_exits_zero_with_the_help_text(catalog):
    e = _error(catalog, ["--help"])
    assert (e.exit_code, e.stderr) == (0, "")
    assert e.stdout.startswith("usage: sglang serve [-h]")


# ------------------------------------------------------------------------------------------------------
# Abbreviations, as argparse's allow_abbrev resolves them.


def test_abbreviations(catalog):
    assert catalog.parse(["--model-path", "m", "--tp", "8"])["tp_size"] == 8
    assert catalog.resolve("--tp") is catalog.flag("--tp-size")
    assert catalog.resolve("--tp-size=8") is catalog.flag("--tensor-parallel-size")
    assert catalog.resolve("--cuda-graph-max-bs") == (
        "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )
    assert catalog.resolve("--enable-piecewise-cuda-graph") == "unrecognized arguments: --enable-piecewise-cuda-graph"
    assert catalog.flag("--tp") is None
    assert catalog.flag("--no-enable-tf32-matmul") is catalog.flag("--enable-tf32-matmul")


def test_resolve_agrees_with_argparse(catalog):
    names = ["-h", "--he", "--h", "-x", "--x", "--tp=8", "--cuda-graph-max-bs=8", "--ep", "--dp", "--model", "--mod"]
    for opt in catalog.option_strings[::9]:
        names += [opt[:4], opt[: len(opt) // 2], opt[:-1]]
    for name in names:
        found = catalog.resolve(name)
        try:
            catalog.parse([name], require_model=False)
            error = None
        except CatalogError as e:
            error = e.message
        if isinstance(found, str):
            assert error == found, name
        elif found.name != "-h":
            assert error is None or not error.startswith(("ambiguous", "unrecognized")), (name, error)
            assert error is None or found.name in error, (name, error)


# ------------------------------------------------------------------------------------------------------
# Types, actions and defaults.


def test_boolean_optional_flags_take_both_forms(catalog):
    assert catalog.parse([], require_model=False)["enable_tf32_matmul"] is None
    assert catalog.parse(["--enable-tf32-matmul"], require_model=False)["enable_tf32_matmul"] is True
    assert catalog.parse(["--no-enable-tf32-matmul"], require_model=False)["enable_tf32_matmul"] is False
    assert catalog.parse([], require_model=False)["dllm_fdfo"] is True
    assert catalog.parse(["--no-dllm-fdfo"], require_model=False)["dllm_fdfo"] is False


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8192", 8192),
        ("-1", -1),
        ("1k", 1000),
        ("25.6k", 25600),
        ("1.5G", 1_500_000_000),
        ("1M", 10**6),
        ("1Ki", 1024),
        (" 2Ki ", 2048),
        ("1Mi", 1_048_576),
        ("3Gi", 3 * 2**30),
        ("1T", 10**12),
    ],
)
def test_human_readable_int_accepts(text, value):
    assert human_readable_int(text) == value


def test_human_readable_int_refuses_in_sglangs_words(catalog):
    assert catalog.parse(["--max-total-tokens", "1Mi"], require_model=False)["max_total_tokens"] == 1_048_576
    assert catalog.parse(["--context-length", "1.5k"], require_model=False)["context_length"] == 1500
    e = _error(catalog, ["--max-total-tokens", "1.5Gi"], require_model=False)
    assert e.message == (
        "argument --max-total-tokens: Decimals are not allowed with IEC suffixes like 'Gi'. "
        "Use an integer IEC value such as '1Gi', or an SI value such as '1.5G'."
    )
    for bad in ("1K", "1KB", "eight", "1m"):
        e = _error(catalog, ["--max-prefill-tokens", bad], require_model=False)
        assert e.message == (
            f"argument --max-prefill-tokens: Invalid integer value: '{bad}'. Use a plain integer, SI suffixes "
            "(1k, 1M), or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
        )


def test_json_types(catalog):
    values = catalog.parse(
        [
            "--preferred-sampling-params",
            '{"temperature": 0}',
            "--forward-hooks",
            '[{"name": "h"}]',
            "--cuda-graph-config",
            '{"decode": {"backend": "full", "max_bs": 256}, "prefill": {"backend": "breakable"}}',
            "--cuda-graph-backend-prefill",
            "disabled",
            "--quantization-param-path",
            "None",
        ],
        require_model=False,
    )
    assert values["preferred_sampling_params"] == {"temperature": 0}
    assert values["forward_hooks"] == [{"name": "h"}]
    assert values["cuda_graph_config"] == {
        "decode": {"backend": "full", "max_bs": 256},
        "prefill": {"backend": "breakable"},
    }
    assert values["cuda_graph_backend_prefill"] == "disabled"
    assert values["quantization_param_path"] is None
    cases = {
        ("--preferred-sampling-params", "{bad"): "argument --preferred-sampling-params: invalid loads value: '{bad'",
        ("--forward-hooks", "[x"): "argument --forward-hooks: Invalid JSON list: [x. Please provide a valid JSON list.",
        ("--cuda-graph-config", '{"middle": {}}'): (
            "argument --cuda-graph-config: --cuda-graph-config: unknown phase 'middle', expected one of ('decode', 'prefill')"
        ),
        ("--cuda-graph-config", '{"decode": {"max_tokens": 1}}'): (
            "argument --cuda-graph-config: --cuda-graph-config['decode']: unknown key 'max_tokens', "
            "expected one of ('backend', 'max_bs', 'bs')"
        ),
        ("--cuda-graph-backend-decode", "tc_piecewise"): (
            "argument --cuda-graph-backend-decode: tc_piecewise was removed; select breakable, full, or disabled"
        ),
    }
    for argv, message in cases.items():
        assert _error(catalog, list(argv), require_model=False).message == message


def test_nargs_lists(catalog):
    values = catalog.parse(
        [
            "--cuda-graph-bs-decode",
            "1",
            "2",
            "4",
            "--uvicorn-access-log-exclude-prefixes",
            "--model-checksum",
            "--lora-paths",
            "a",
            '{"lora_name": "b", "lora_path": "/b"}',
        ],
        require_model=False,
    )
    assert values["cuda_graph_bs_decode"] == [1, 2, 4]
    assert values["uvicorn_access_log_exclude_prefixes"] == []
    assert values["model_checksum"] is None
    assert values["lora_paths"] == ["a", {"lora_name": "b", "lora_path": "/b"}]
    e = _error(catalog, ["--cuda-graph-bs-decode"], require_model=False)
    assert e.message == "argument --cuda-graph-bs-decode: expected at least one argument"
    e = _error(catalog, ["--lora-paths", '{"lora_name": "b"}'], require_model=False)
    assert e.exit_code == 1 and e.message.startswith("AssertionError:")


def test_defaults(catalog):
    d = catalog.defaults()
    assert len(d) == len({f.dest for f in catalog.flags})
    assert (d["tp_size"], d["port"], d["host"], d["schedule_policy"], d["kv_cache_dtype"]) == (
        1,
        30000,
        "127.0.0.1",
        "fcfs",
        "auto",
    )
    assert (d["max_prefill_tokens"], d["num_continuous_decode_steps"], d["log_requests_level"]) == (16384, 1, 2)
    assert d["mem_fraction_static"] is None and d["max_running_requests"] is None  # resolved by SGLang's hooks
    assert d["disable_cuda_graph"] is False and d["enable_amd_monokernel"] is False
    d["allowed_media_domains"].append("x")  # a caller's change must not leak into the next parse
    assert catalog.defaults()["allowed_media_domains"] == []
    spec = catalog.flag("--max-prefill-tokens")
    assert isinstance(spec, FlagSpec) and (spec.default, spec.default_repr, spec.takes_value) == (16384, "16384", True)


def test_deprecated_flags_work_and_warn(catalog, caplog):
    parsed = catalog.parse_args(["--disable-cuda-graph", "--monokernel-backend", "amd"], require_model=False)
    assert parsed.values["disable_cuda_graph"] is True and parsed.values["enable_amd_monokernel"] is True
    assert parsed.warnings == [
        "'--disable-cuda-graph' is deprecated and will be removed in a future release. "
        "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead.",
        "'--monokernel-backend' is deprecated and will be removed in a future release. "
        "Use '--enable-amd-monokernel' instead.",
    ]
    assert catalog.parse_args(["--tp-size", "2"], require_model=False).warnings == []
    with caplog.at_level(logging.WARNING):  # a bare parser logs like SGLang, in bold yellow
        catalog.parser().parse_args(["--model-path", "m", "--enable-dp-attention"])
    assert caplog.messages == [
        "\033[1;33m'--enable-dp-attention' is deprecated and will be removed in a future release. "
        "Use '--attn-dp-size <dp-size>' instead.\033[0m"
    ]


def test_invalid_combinations(catalog):
    def refused(argv):
        return [c.name for c in catalog.refused_combinations(catalog.parse(argv, require_model=False))]

    tbo = "two-batch-overlap-needs-a2a-or-attention-dp"
    assert refused(["--enable-two-batch-overlap", "--tp-size", "8"]) == [tbo]
    assert refused(["--enable-two-batch-overlap", "--enable-dp-attention"]) == [tbo]
    assert refused(["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep"]) == []
    assert refused(["--enable-two-batch-overlap", "--attn-dp-size", "2"]) == []
    assert refused(["--enable-two-batch-overlap", "--enable-dp-attention", "--dp-size", "2"]) == []
    assert refused(["--tp-size", "8"]) == []
    (combo,) = catalog.refused_combinations(catalog.parse(["--enable-two-batch-overlap"], require_model=False))
    assert combo.error == "ValueError" and "attention DP (--attn-dp-size) is required" in combo.message


def test_annotations_name_real_flags(catalog):
    assert set(catalog.removed) == {"--enable-piecewise-cuda-graph", "--cuda-graph-max-bs"}
    assert {"--disable-cuda-graph", "--enable-dp-attention"} <= set(catalog.deprecated)
    assert "--num-continuous-decode-steps" in catalog.noop
    for flag in [*catalog.deprecated, *catalog.noop]:
        assert catalog.flag(flag) is not None
    for flag in catalog.removed:
        assert catalog.flag(flag) is None


# ------------------------------------------------------------------------------------------------------
# The audit.


def test_audit_rows_for_a_config_that_mixes_every_status(catalog):
    config = ServerConfig.parse(
        "--model-path m --tp 8 --enable-piecewise-cuda-graph --cuda-graph-max-bs 256 --enable-mscclp "
        "--tp-size eight --kv-cache-dtype fp16 --enable-metrics yes --disable-cuda-graph --attention-backend nsa "
        "--num-continuous-decode-steps 8 --enable-two-batch-overlap --tp_size 2 --totally-new-flag"
    )
    rows = audit(catalog, config)
    assert all(isinstance(r, FlagIssue) for r in rows)
    assert [(r.flag, r.status) for r in rows] == [
        ("--model-path", "ok"),
        ("--tp", "ok"),
        ("--enable-piecewise-cuda-graph", "unknown"),
        ("--cuda-graph-max-bs", "ambiguous"),
        ("--enable-mscclp", "ok"),
        ("--tp-size", "invalid"),
        ("--kv-cache-dtype", "invalid"),
        ("--enable-metrics", "invalid"),
        ("--disable-cuda-graph", "deprecated"),
        ("--attention-backend", "deprecated"),
        ("--num-continuous-decode-steps", "noop"),
        ("--enable-two-batch-overlap", "invalid"),
        ("--tp_size", "unknown"),
        ("--totally-new-flag", "unknown"),
    ]
    msg = {r.flag: r.message for r in rows}
    assert msg["--model-path"] == ""
    assert msg["--tp"] == "Abbreviation of --tp-size; write the full flag."
    assert msg["--enable-piecewise-cuda-graph"].startswith("unrecognized arguments: --enable-piecewise-cuda-graph. ")
    assert (
        "breakable" in msg["--enable-piecewise-cuda-graph"]
        and "already the default" in msg["--enable-piecewise-cuda-graph"]
    )
    assert msg["--cuda-graph-max-bs"].startswith("ambiguous option: --cuda-graph-max-bs could match ")
    assert "--cuda-graph-max-bs-decode" in msg["--cuda-graph-max-bs"].split(". ", 1)[1]
    assert msg["--tp-size"] == "argument --tp-size/--tensor-parallel-size: invalid int value: 'eight'."
    assert msg["--kv-cache-dtype"].startswith("argument --kv-cache-dtype: invalid choice: 'fp16'")
    assert msg["--enable-metrics"] == "unrecognized arguments: yes. --enable-metrics is a switch and takes no value."
    assert "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled" in msg["--disable-cuda-graph"]
    assert "use --attention-backend dsa instead" in msg["--attention-backend"]
    assert "accepted but not read in sglang 0.5.23" in msg["--num-continuous-decode-steps"].lower()
    assert msg["--enable-two-batch-overlap"].startswith("ValueError: When enabling two batch overlap")
    assert "--moe-a2a-backend deepep" in msg["--enable-two-batch-overlap"]
    assert msg["--tp_size"].endswith("did you mean --tp-size?")
    assert msg["--totally-new-flag"] == "unrecognized arguments: --totally-new-flag. Not a flag of SGLang 0.5.23."
    assert [r.flag for r in rows if r.blocking] == [
        "--enable-piecewise-cuda-graph",
        "--cuda-graph-max-bs",
        "--tp-size",
        "--kv-cache-dtype",
        "--enable-metrics",
        "--enable-two-batch-overlap",
        "--tp_size",
        "--totally-new-flag",
    ]


def test_audit_of_a_clean_config_and_of_nothing(catalog):
    assert audit(catalog, ServerConfig()) == []
    rows = audit(catalog, ServerConfig.parse("--tp-size 8 --enable-two-batch-overlap --moe-a2a-backend deepep --help"))
    assert [r.status for r in rows] == ["ok", "ok", "ok", "invalid"]
    assert nearest_flag(catalog, "--enable_metrics") == "--enable-metrics"
    assert nearest_flag(catalog, "--qwertyuiop") is None


def test_a_no_op_the_parser_does_not_take_is_refused_when_the_catalog_loads():
    """[usable]: a flag listed only under `noop` used to audit `unknown`; the catalog now says what is wrong."""
    from agent.errors import PivotError
    from tools.engines.catalog.catalog import Catalog

    data = {"engine": "mine", "version": "1", "title": "mine 1", "prog": "mine",
            "flags": [{"opts": ["--port"], "dest": "port", "type": "int", "default": "8080", "choices": None,
                       "nargs": None, "action": "_StoreAction", "required": False}],
            "noop": [{"flag": "--ignored", "evidence": "no code reads it"}]}  # fmt: skip
    with pytest.raises(PivotError, match="lists --ignored as a no-op but not among its flags"):
        Catalog(data)
