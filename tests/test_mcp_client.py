"""`--mcp FILE`: a small MCP server started by the tests (tests/mcp_test_server.py) gives its tools to pivot's agent,
here a scripted model; prefixed, behind the method's guard, tolerant of servers that do not start or die, kept with
the session (its path, never its env values) so a resume uses it again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from agent.store import Store

ROOT = Path(__file__).resolve().parent.parent
SERVER = [str(ROOT / "tests" / "mcp_test_server.py")]
SECRET = "sekrit-value-0042"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def write_config(path: Path, **servers: dict) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def script(path: Path, *steps: dict) -> str:
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    return f"script:{path}"


def returns(store: Store, sid: str) -> dict[str, list]:
    """Each tool's results in the ledger's history, by tool name."""
    out: dict[str, list] = {}
    for text in store.messages(sid):
        msg = json.loads(text)
        for part in msg.get("parts", []):
            if part.get("part_kind") in ("tool-return", "retry-prompt") and part.get("tool_name"):
                out.setdefault(part["tool_name"], []).append(part.get("content"))
    return out


@pytest.fixture
def config(tmp_path):
    entry = {"command": sys.executable, "args": SERVER}
    return write_config(
        tmp_path / "mcp.json",
        metrics={**entry, "env": {"GPU_COUNT": "16", "METRICS_TOKEN": SECRET}},
        record=entry,  # its tool `verdict` would be named record_verdict, like pivot's own
        broken={"command": str(tmp_path / "no-such-server")},
        later={"command": "x", "disabled": True},
    )


def test_a_scripted_model_uses_mcp_tools_behind_the_guard(tmp_path, pivot_home, config, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-passed-on-123456")
    model = script(
        tmp_path / "steps.jsonl",
        {"tool": "metrics_gpu_count"},
        {"tool": "metrics_env_has", "args": {"name": "OPENAI_API_KEY"}},
        {"tool": "metrics_env_has", "args": {"name": "METRICS_TOKEN"}},
        {"tool": "metrics_launch_server", "args": {"flags": "--tp-size 8"}},
        {
            "tool": "record_verdict",
            "args": {"verdict": "adopted", "reason": "the MCP server said so", "plan_item": "01"},
        },
        {"tool": "metrics_die"},
        {"tool": "record_echo", "args": {"text": "still here"}},
        {"text": "done"},
    )
    plan = ROOT / "plans" / "llama70b-fp8-h200x1.toml"
    result = invoke("run", str(plan), "--model", model, "--mcp", str(config), "--json")
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    sid = outcome["session"]
    assert outcome["status"] in ("waiting", "stopped"), outcome
    err = result.stderr
    assert "MCP server 'broken' did not start" in err and "the run goes on without its tools" in err
    assert "'record_verdict' is named like one of pivot's own tools and is left out" in err
    assert "MCP server 'metrics' failed during metrics_die" in err
    with Store(pivot_home / "state" / "pivot.db") as store:
        got = returns(store, sid)
        assert got["metrics_gpu_count"] == [16]  # the entry's env reached the server
        assert got["metrics_env_has"] == [False, True]  # pivot's model keys did not; its own env did
        assert got["metrics_launch_server"] == ["pretended to launch --tp-size 8"]
        assert store.experiments(sid) == []  # an MCP tool launches nothing in pivot's ledger
        assert "refused by the method" in str(got["record_verdict"])  # pivot's own, guarded
        assert "unavailable: the MCP server 'metrics'" in got["metrics_die"][0]
        assert got["record_echo"] == ["echo: still here"]  # the other server goes on
        record = store.get_session(sid)
        assert record.settings.mcp_config == str(config.resolve())
        assert not record.settings.mcp_instructions
    assert SECRET.encode() not in (pivot_home / "state" / "pivot.db").read_bytes()
    logs = list((pivot_home / "state" / sid / "logs").glob("mcp-*.log"))
    assert {p.name for p in logs} >= {"mcp-metrics.log", "mcp-record.log"}

    # a resume uses the session's MCP file again
    more = script(tmp_path / "more.jsonl", {"tool": "metrics_echo", "args": {"text": "again"}}, {"text": "ok"})
    result = invoke("resume", sid, "--model", more, "--answer", "go on", "--json")
    assert result.exit_code == 0, result.output
    with Store(pivot_home / "state" / "pivot.db") as store:
        assert returns(store, sid)["metrics_echo"] == ["echo: again"]


def test_the_servers_instructions_reach_the_model_only_when_asked(store, paths, small_plan, tmp_path):
    import asyncio

    from pydantic_ai import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from agent import loop
    from agent.session import Session

    cfg = write_config(tmp_path / "one.json", metrics={"command": sys.executable, "args": SERVER})
    seen: list[tuple[str, list[str]]] = []

    def capture(messages, info):
        seen.append((info.instructions or "", [t.name for t in info.function_tools]))
        return ModelResponse(parts=[TextPart("ok")])

    for asked in (False, True):
        settings = m.SessionSettings(mcp_config=str(cfg), mcp_instructions=asked)
        with Session.create(store, paths, small_plan, settings=settings) as session:
            asyncio.run(loop.run_async(session, prompt="hi", model=FunctionModel(capture)))
    (without, tools), (with_them, _) = seen
    assert "metrics_echo" in tools and "investigate" in tools and "launch_server" in tools
    assert "TEST SERVER INSTRUCTIONS" not in without and "TEST SERVER INSTRUCTIONS" in with_them
    assert loop.METHOD.splitlines()[0] in without


def test_pivot_tools_lists_the_servers_tools_as_the_agent_gets_them(config):
    result = invoke("tools", "--mcp", str(config), "--json")
    assert result.exit_code == 0, result.output
    rows = {r["server"]: r for r in json.loads(result.stdout)["mcp"]}
    assert set(rows) == {"metrics", "record", "broken"}  # disabled: left out
    assert [t["name"] for t in rows["metrics"]["tools"]][:3] == ["metrics_gpu_count", "metrics_count", "metrics_echo"]
    assert rows["record"]["left_out"] == ["record_verdict"]
    assert rows["broken"]["error"].startswith("did not start") and not rows["broken"]["tools"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "is not JSON"),
        ('{"servers": {}}', "has no `mcpServers` object"),
        ('{"mcpServers": {"a": {"args": ["x"]}}}', "needs either `command` (stdio) or `url` (HTTP)"),
        ('{"mcpServers": {"a": {"url": "ftp://h/x"}}}', "must be http:// or https://"),
        ('{"mcpServers": {"a b": {"command": "x"}, "a_b": {"command": "y"}}}', "would prefix their tools the same way"),
    ],
)
def test_a_bad_mcp_file_is_one_line_before_any_session(tmp_path, pivot_home, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    result = invoke("run", "glm5-nvfp4-rtxpro6000x8", "--mcp", str(bad))
    assert result.exit_code == 1
    assert message in result.stderr and "Traceback" not in result.output
    assert not (pivot_home / "state" / "pivot.db").exists() or invoke("sessions", "--json").stdout.strip() == "[]"


def test_a_missing_variable_leaves_that_server_out(tmp_path, pivot_home, monkeypatch):
    monkeypatch.delenv("PIVOT_TEST_UNSET", raising=False)
    cfg = write_config(tmp_path / "v.json", needy={"command": "${PIVOT_TEST_UNSET}"},
                       fine={"command": "${PIVOT_TEST_PY:-" + sys.executable + "}", "args": SERVER})  # fmt: skip
    model = script(tmp_path / "s.jsonl", {"tool": "fine_echo", "args": {"text": "x"}}, {"text": "done"})
    result = invoke("run", "llama70b-fp8-h200x1", "--model", model, "--mcp", str(cfg), "--json")
    assert result.exit_code == 0, result.output
    assert "MCP server 'needy' left out: MCP server 'needy': the environment variable PIVOT_TEST_UNSET is not set" in (
        result.stderr
    )
    with Store(pivot_home / "state" / "pivot.db") as store:
        assert returns(store, json.loads(result.stdout)["session"])["fine_echo"] == ["echo: x"]


def test_the_options_are_kept_with_the_session_and_resume_changes_them(tmp_path, pivot_home, config):
    model = script(tmp_path / "end.jsonl", {"text": "nothing to do"})
    result = invoke("run", "llama70b-fp8-h200x1", "--model", model, "--mcp", str(config),
                    "--investigator-model", "autopilot", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    sid = json.loads(result.stdout)["session"]
    with Store(pivot_home / "state" / "pivot.db") as store:
        settings = store.get_session(sid).settings
        assert (settings.mcp_config, settings.investigator_model) == (str(config.resolve()), "autopilot")
    result = invoke("resume", sid, "--mcp", "off", "--answer", "go on", "--json")
    assert result.exit_code == 0, result.output
    assert "MCP server" not in result.stderr  # no server started for this run
    with Store(pivot_home / "state" / "pivot.db") as store:
        assert store.get_session(sid).settings.mcp_config is None


def test_chat_takes_the_options_for_a_session_only(config):
    result = invoke("chat", "--mcp", str(config))
    assert result.exit_code == 1 and "apply to a session: give SESSION or --demo" in result.stderr


def test_two_servers_whose_tools_meet_under_one_name_do_not_stop_the_run(store, paths, small_plan, tmp_path):
    import asyncio

    from pydantic_ai import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from agent import loop
    from agent.session import Session

    entry = {"command": sys.executable, "args": SERVER}
    cfg = write_config(tmp_path / "meet.json", a=entry, a_gpu=entry)  # a + gpu_count, a_gpu + count
    seen: list[list[str]] = []
    warnings: list[str] = []

    def capture(messages, info):
        seen.append([t.name for t in info.function_tools])
        return ModelResponse(parts=[TextPart("ok")])

    settings = m.SessionSettings(mcp_config=str(cfg))
    with Session.create(store, paths, small_plan, settings=settings, events=lambda e: warnings.append(e.message)) as s:
        outcome = asyncio.run(loop.run_async(s, prompt="hi", model=FunctionModel(capture)))
    assert outcome.status in ("waiting", "finished")
    assert seen[0].count("a_gpu_count") == 1 and "a_echo" in seen[0] and "a_gpu_echo" in seen[0]
    assert any("'a_gpu_count' is named like one of" in w for w in warnings)


def test_a_server_printing_lines_that_are_not_json_rpc_costs_one_line_not_a_traceback_each(caplog):
    """G6: the MCP SDK logs a traceback per such line; pivot keeps one line, once."""
    import logging

    import agent.mcp.client as client

    client._NotJsonRpc.said = False
    log = logging.getLogger("mcp.client.stdio")
    with caplog.at_level(logging.ERROR, logger="mcp.client.stdio"):
        for line in ("not json 0", "not json 1", "not json 2"):
            try:
                raise ValueError(f"Invalid JSON: {line}")
            except ValueError:
                log.exception("Failed to parse JSONRPC message from server")
        log.error("another error the SDK logs")
    texts = [r.getMessage() for r in caplog.records]
    assert texts == ["an MCP server printed lines that are not JSON-RPC on its stdout; they are ignored (this is said "
                     "once)", "another error the SDK logs"]  # fmt: skip
    assert all(r.exc_info is None for r in caplog.records[:1])
