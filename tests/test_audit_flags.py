"""`pivot audit-flags` and the audit's sources: SGLang's own parser when importable (a fake module tree here),
the scan of SGLang's source for no-ops, else the shipped catalog."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.models import ServerConfig
from tests.test_noop_scan import make_package
from tools.engines.catalog.installed import audit_flags, find_installed_sglang

FAKE_SERVER_ARGS = """
import argparse


class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        print("importing the fake SGLang says something on stdout")
        parser.add_argument("--model-path", "--model", type=str, required=True)
        parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
        parser.add_argument("--num-continuous-decode-steps", type=int, default=1)
        parser.add_argument("--brand-new-flag", action="store_true")
        parser.add_argument("--cuda-graph-max-bs-decode", type=int)
        parser.add_argument("--cuda-graph-max-bs-prefill", type=int)
        parser.add_argument("--disable-cuda-graph", action="store_true")
"""

FAKE_READER = """
def run(args):
    return args.model_path, args.tp_size, args.brand_new_flag, args.cuda_graph_max_bs_decode
"""


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """An importable `sglang` whose parser is FAKE_SERVER_ARGS; returns a function to set its version and body."""

    def install(version: str = "0.5.99", server_args: str = FAKE_SERVER_ARGS) -> Path:
        site = tmp_path / f"site-{version}"
        make_package(site, version=version)
        (site / "sglang/srt/server_args.py").write_text(textwrap.dedent(server_args).lstrip())
        (site / "sglang/srt/managers/reader.py").write_text(textwrap.dedent(FAKE_READER).lstrip())
        monkeypatch.syspath_prepend(str(site))
        return site

    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    yield install
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[k]
    sys.modules.update(saved)


def _statuses(report) -> dict[str, str]:
    return {r.flag: r.status for r in report.rows}


def test_without_sglang_the_shipped_catalog_judges():
    assert find_installed_sglang() is None  # the test environment has no SGLang
    report = audit_flags(ServerConfig.parse("--tp 8 --num-continuous-decode-steps 8 --enable-piecewise-cuda-graph"))
    assert report.parser == "shipped catalog of SGLang 0.5.23"
    assert report.noops == "the catalog's recorded no-ops"
    assert _statuses(report) == {"--tp": "ok", "--num-continuous-decode-steps": "noop",
                                 "--enable-piecewise-cuda-graph": "unknown"}  # fmt: skip
    assert report.blocking and report.notes == []


def test_the_installed_parser_judges_when_sglang_is_importable(fake_sglang, capsys):
    site = fake_sglang("0.5.99")
    installed = find_installed_sglang()
    assert installed is not None and installed.version == "0.5.99"
    assert installed.package_dir == (site / "sglang").resolve()
    config = ServerConfig.parse("--tp 2 --brand-new-flag --num-continuous-decode-steps 4 --enable-mscclpp")
    report = audit_flags(config)
    assert report.parser.startswith("SGLang 0.5.99's own parser")
    assert report.version == "0.5.99"
    assert report.noops.startswith("scan of SGLang 0.5.99 source")
    rows = {r.flag: r for r in report.rows}
    assert {k: r.status for k, r in rows.items()} == {
        "--tp": "ok",
        "--brand-new-flag": "ok",  # not in any shipped catalog: only SGLang's own parser knows it
        "--num-continuous-decode-steps": "noop",  # from the scan of the installed source
        "--enable-mscclpp": "unknown",
    }
    assert rows["--tp"].message == "Abbreviation of --tp-size; write the full flag."
    assert rows["--enable-mscclpp"].message.startswith("unrecognized arguments: --enable-mscclpp.")
    assert "appears only in arg_groups/fields/schedule.py" in rows["--num-continuous-decode-steps"].message
    assert report.blocking
    assert capsys.readouterr().out == ""  # what SGLang prints on import goes to stderr


def test_a_version_other_than_the_installed_one_uses_the_catalog(fake_sglang):
    fake_sglang("0.5.99")
    report = audit_flags(ServerConfig.parse("--brand-new-flag --num-continuous-decode-steps 4"), version="0.5.23")
    assert report.parser == "shipped catalog of SGLang 0.5.23"
    assert report.notes == ["installed SGLang is 0.5.99, not 0.5.23: its parser was not used"]
    assert _statuses(report) == {"--brand-new-flag": "unknown", "--num-continuous-decode-steps": "noop"}


def test_the_installed_parser_keeps_the_shipped_annotations_of_its_version(fake_sglang):
    fake_sglang("0.5.23")
    report = audit_flags(ServerConfig.parse("--cuda-graph-max-bs 8 --disable-cuda-graph --brand-new-flag"))
    assert report.parser.startswith("SGLang 0.5.23's own parser")
    rows = {r.flag: r for r in report.rows}
    assert rows["--cuda-graph-max-bs"].status == "ambiguous"
    assert "Not in SGLang 0.5.23 (removed): use --cuda-graph-max-bs-decode" in rows["--cuda-graph-max-bs"].message
    assert rows["--disable-cuda-graph"].status == "deprecated"
    assert rows["--brand-new-flag"].status == "ok"


def test_a_parser_that_cannot_be_built_falls_back_to_the_catalog(fake_sglang):
    fake_sglang("0.5.23", server_args="raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    report = audit_flags(ServerConfig.parse("--tp-size 8 --spec-trace-dir /x"))
    assert report.parser == "shipped catalog of SGLang 0.5.23"
    assert len(report.notes) == 1 and "its parser could not be built: ImportError: libcuda.so.1" in report.notes[0]
    # the installed source is still 0.5.23's, so its scan gives the no-ops (this tree does not define the flag)
    assert report.noops.startswith("scan of SGLang 0.5.23 source")
    assert _statuses(report) == {"--tp-size": "ok", "--spec-trace-dir": "ok"}


# ---------------------------------------------------------------------------------------------- the command


def test_json_rows_have_exactly_three_keys_and_exit_1_when_blocking():
    result = run("audit-flags", "--json", "--", "--tp-size", "8", "--enable-piecewise-cuda-graph", "--tp-size=x")
    assert result.exit_code == 1
    rows = json.loads(result.stdout)
    assert [set(r) for r in rows] == [{"flag", "status", "message"}] * 3
    assert [(r["flag"], r["status"]) for r in rows] == [
        ("--tp-size", "ok"),
        ("--enable-piecewise-cuda-graph", "unknown"),
        ("--tp-size", "invalid"),  # ServerConfig splits --flag=value
    ]
    assert "invalid int value: 'x'" in rows[2]["message"]


def test_exit_0_when_nothing_blocks_and_a_table_without_json():
    result = run("audit-flags", "--", "--tp-size", "8", "--num-continuous-decode-steps", "8", "--disable-cuda-graph")
    assert result.exit_code == 0, result.output
    assert "noop" in result.stdout and "deprecated" in result.stdout and "flag" in result.stdout
    assert "parser: shipped catalog of SGLang 0.5.23" in result.stderr
    result = run("audit-flags", "--json", "--", "--num-continuous-decode-steps", "8")
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["status"] == "noop"


def test_sglang_source_drives_the_noops(tmp_path):
    make_package(tmp_path)
    result = run("audit-flags", "--json", "--sglang-source", str(tmp_path), "--",
                 "--num-continuous-decode-steps", "8", "--spec-trace-dir", "/x")  # fmt: skip
    assert result.exit_code == 0
    assert [r["status"] for r in json.loads(result.stdout)] == ["noop", "ok"]
    assert "scanned source is SGLang 0.5.99" in result.stderr


def test_errors_are_messages_with_hints(tmp_path):
    result = run("audit-flags", "--json")
    assert result.exit_code == 1 and result.stdout == "" and "no flags to audit" in result.stderr
    result = run("audit-flags", "--engine-version", "0.4.0", "--", "--tp-size", "8")
    assert result.exit_code == 1 and "no command-line catalog for sglang 0.4.0" in result.stderr
    result = run("audit-flags", "--sglang-source", str(tmp_path), "--", "--tp-size", "8")
    assert result.exit_code == 1 and "no SGLang package source" in result.stderr
