"""The way in: a README of one screen's reading, docs whose paths exist, and a CLI reference that names every
command (generated from the click commands, so it cannot drift)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from agent.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
# a path the text names: a repository folder and a file or folder under it, or a top-level file of the repository
PATH = re.compile(
    r"`((?:agent|tools|tests|plans|scripts|benchmarks|docs|\.ci)/[\w./-]*|pyproject\.toml|mkdocs\.yml|CONTRIBUTING\.md)`"
)


def test_the_readme_is_one_screen_of_reading_and_points_at_the_docs():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    text = "\n".join(lines)
    assert "## Quick start" in text and "docs/architecture.md" in text


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_path_the_readme_and_the_docs_name_exists(page: Path):
    text = page.read_text()
    assert "../shared" not in text  # a user has no such folder
    missing = []
    for name in sorted(set(PATH.findall(text))):
        path = name.split(":", 1)[0].rstrip(".")
        if any(ch in path for ch in "*{}<>") or path.upper() == path:  # a pattern or a placeholder, not a path
            continue
        if not (ROOT / path).exists() and not (ROOT / "docs" / path).exists():
            missing.append(name)
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def _commands(group: click.Group, prefix: str = "pivot") -> list[str]:
    out = []
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        out.append(f"{prefix} {name}")
        if isinstance(command, click.Group):
            out += _commands(command, f"{prefix} {name}")
    return out


def test_the_cli_reference_has_every_command():
    docs = pytest.importorskip("mkdocs_click._docs", reason="the docs extra: pip install -e '.[docs]'")
    page = (ROOT / "docs" / "cli.md").read_text()
    assert ":module: agent.cli" in page and ":command: cli" in page
    depth = int(re.search(r":depth: (\d+)", page).group(1))
    text = "\n".join(docs.make_command_docs("pivot", cli, depth=depth, style="table", list_subcommands=True))
    headings = set(re.findall(r"^#+ (\S+)$", text, flags=re.MULTILINE))
    missing = [c for c in _commands(cli) if c.split()[-1] not in headings]
    assert not missing, missing
