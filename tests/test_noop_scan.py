"""The no-op scan of SGLang's source: which flags' fields no code outside the argument definitions reads."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from agent.errors import PivotError
from agent.models import ServerConfig
from tools.engines.catalog import audit, load_catalog
from tools.engines.catalog.noop_scan import find_package_dir, package_version, scan_noops, source_flags

FIELDS = '''
"""Config fields of the ``schedule`` namespace."""
from typing import Optional
import argparse
from sglang.srt.arg_groups.arg_utils import A, Arg


class Schedule:
    _NS_PATH = "schedule"

    # read by the scheduler
    max_running_requests: A[Optional[int], "Cap on running requests."] = None
    # read nowhere: its only other mention is field_order.py
    num_continuous_decode_steps: A[int, "Run several decode steps per round."] = 1
    # read only through getattr with a string
    stream_interval: A[int, Arg(help="Stream every N tokens.", aliases=["--stream-every"])] = 1
    # mentioned only in a comment of another module
    ghost_knob: A[int, "A knob nobody turns."] = 0
    # a field without a command line is not a flag
    internal_state: A[int, Arg(no_cli=True)] = 0
    # the flag's spelling differs from the field
    fp8_gemm_runner_backend: A[str, Arg(help="x", cli_name="--fp8-gemm-backend")] = "auto"
    # argparse adds --no-overlap-fancy
    overlap_fancy: A[bool, Arg(help="x", action=argparse.BooleanOptionalAction)] = True
    plain_field: int = 3
'''

FIELD_ORDER = """
POSITIONAL_FIELD_ORDER = (
    "max_running_requests",
    "num_continuous_decode_steps",
    "stream_interval",
    "ghost_knob",
    "fp8_gemm_runner_backend",
    "overlap_fancy",
    "monokernel_amd",
    "hand_made_flag",
)
"""

SERVER_ARGS = """
import argparse


class ServerArgs:
    def resolved_dict(self):
        return {"overlap": self.overlap_fancy}

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--hand-made-flag", type=int, default=0, help="hand_made_flag is defined here")
        parser.add_argument("--monokernel-backend", dest="monokernel_amd", choices=["amd"])
        parser.add_argument("--config", type=str)
"""

SCHEDULER = """
class Scheduler:
    def __init__(self, args):
        self.cap = args.max_running_requests  # the cap
        self.interval = getattr(args, "stream_interval")
        self.backend = args.fp8_gemm_runner_backend
        # TODO: wire ghost_knob one day
"""

CONFIG_USER = """
def load(cfg):
    return cfg.config  # --config is read here
"""


def make_package(root: Path, version: str = "0.5.99") -> Path:
    """A small SGLang-shaped package tree under root: sglang/srt/arg_groups/..., server_args.py, managers/."""
    files = {
        "sglang/__init__.py": "",
        "sglang/version.py": f'__version__ = "{version}"\n',
        "sglang/srt/__init__.py": "",
        "sglang/srt/arg_groups/__init__.py": "",
        "sglang/srt/arg_groups/arg_utils.py": "from typing import Annotated as A\n\nclass Arg:\n    pass\n",
        "sglang/srt/arg_groups/fields/__init__.py": "",
        "sglang/srt/arg_groups/fields/schedule.py": FIELDS,
        "sglang/srt/arg_groups/field_order.py": FIELD_ORDER,
        "sglang/srt/server_args.py": SERVER_ARGS,
        "sglang/srt/managers/__init__.py": "",
        "sglang/srt/managers/scheduler.py": SCHEDULER,
        "sglang/srt/utils/config_user.py": CONFIG_USER,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def test_flags_and_dests_come_from_the_source(tmp_path):
    pkg = find_package_dir(make_package(tmp_path))
    flags = {f.dest: f.opts for f in source_flags(pkg)}
    assert flags == {
        "max_running_requests": ("--max-running-requests",),
        "num_continuous_decode_steps": ("--num-continuous-decode-steps",),
        "stream_interval": ("--stream-interval", "--stream-every"),
        "ghost_knob": ("--ghost-knob",),
        "fp8_gemm_runner_backend": ("--fp8-gemm-backend",),
        "overlap_fancy": ("--overlap-fancy", "--no-overlap-fancy"),
        "hand_made_flag": ("--hand-made-flag",),
        "monokernel_amd": ("--monokernel-backend",),
        "config": ("--config",),
    }


def test_the_scan_finds_exactly_the_unread_flags(tmp_path):
    scan = scan_noops(make_package(tmp_path))
    assert scan.version == "0.5.99"
    assert scan.flags == 9
    found = {n.flag: n for n in scan.noops}
    # read: max_running_requests (attribute), stream_interval (a string), fp8 backend, overlap_fancy (in
    # server_args.py outside add_cli_args), config. Unread: the rest, the comment-only one included.
    assert sorted(found) == [
        "--ghost-knob",
        "--hand-made-flag",
        "--monokernel-backend",
        "--num-continuous-decode-steps",
    ]
    assert found["--num-continuous-decode-steps"].evidence == (
        "num_continuous_decode_steps appears only in arg_groups/fields/schedule.py and arg_groups/field_order.py"
    )
    assert found["--hand-made-flag"].defined_in == ("srt/server_args.py", "srt/arg_groups/field_order.py")
    notes = scan.notes()
    assert notes["--num-continuous-decode-steps"].flag == "--num-continuous-decode-steps"
    assert "identifier scan of" in notes["--ghost-knob"].source and "0.5.99" in notes["--ghost-knob"].source


def test_the_scan_takes_flags_from_a_catalog_too(tmp_path):
    make_package(tmp_path)
    scan = scan_noops(tmp_path / "sglang", [(("--ghost-knob",), "ghost_knob"), (("--tp-size",), "tp_size")])
    # tp_size is defined and read nowhere in this tree: unread as well
    assert [n.flag for n in scan.noops] == ["--ghost-knob", "--tp-size"]
    assert scan.noops[1].defined_in == ()


def test_the_audit_takes_the_scan_instead_of_the_catalog(tmp_path):
    scan = scan_noops(make_package(tmp_path))
    catalog = load_catalog("sglang", "0.5.23")
    config = ServerConfig.parse("--num-continuous-decode-steps 4 --spec-trace-dir /tmp/x --tp-size 2")
    by_catalog = {r.flag: r.status for r in audit(catalog, config)}
    by_scan = {r.flag: r for r in audit(catalog, config, noop=scan.notes())}
    assert by_catalog == {"--num-continuous-decode-steps": "noop", "--spec-trace-dir": "noop", "--tp-size": "ok"}
    assert {k: r.status for k, r in by_scan.items()} == {
        "--num-continuous-decode-steps": "noop",
        "--spec-trace-dir": "ok",  # this tree does not define it, so the scan says nothing about it
        "--tp-size": "ok",
    }
    assert "appears only in arg_groups/fields/schedule.py" in by_scan["--num-continuous-decode-steps"].message


def test_bad_source_directories_are_clear_errors(tmp_path):
    with pytest.raises(PivotError, match="no SGLang package source"):
        scan_noops(tmp_path)
    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    with pytest.raises(PivotError, match="no flag definitions"):
        scan_noops(tmp_path)


def test_the_version_comes_from_the_dist_info_first(tmp_path):
    make_package(tmp_path, version="0.0.0.dev0")
    info = tmp_path / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    assert package_version(tmp_path / "sglang") == "0.5.23"


@pytest.mark.skipif(not os.environ.get("PIVOT_SGLANG_SOURCE"), reason="set PIVOT_SGLANG_SOURCE to an unpacked wheel")
def test_the_real_wheel_matches_the_catalog():  # pragma: no cover - needs the sglang wheel unpacked
    """PIVOT_SGLANG_SOURCE=/tmp/sglwheel/src after `pip download --no-deps sglang==0.5.23` and unzip."""
    scan = scan_noops(os.environ["PIVOT_SGLANG_SOURCE"])
    catalog = load_catalog("sglang", scan.version or "0.5.23")
    assert {o for f in source_flags(scan.package_dir) for o in f.opts} == {o for f in catalog.flags for o in f.opts}
    assert {n.flag for n in scan.noops} == set(catalog.noop)
