"""A profile a plan names by a relative path is read from the plan file's directory, and one that is not there is named
with the path pivot looked at; the README documents the workload keys and the profile fields the code defines."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from agent import models as m
from agent.errors import PivotError
from agent.plans import load_plan, plan_changes
from tools.preflight import preflight
from tools.profiles import HardwareProfile, ModelProfile, load_model

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "docs" / "plans.md").read_text()  # the plans page holds the README's former "Plans" section
LLAMA = (ROOT / "plans" / "llama70b-fp8-h200x1.toml").read_text()


def _plan_with_profile(folder: Path, ref: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.toml"
    path.write_text(LLAMA.replace('model_profile = "llama-3.3-70b-fp8"', f'model_profile = "{ref}"'))
    return path


def test_a_relative_model_profile_is_read_from_the_plan_files_directory(tmp_path, monkeypatch):
    plans = tmp_path / "plans"
    (plans / "profiles").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "profiles" / "models" / "llama-3.3-70b-fp8.toml", plans / "profiles" / "mine.toml")
    path = _plan_with_profile(plans, "profiles/mine.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # before the fix the path was read from here, and not found
    plan = load_plan(path)
    assert plan.target.model_profile == str((plans / "profiles" / "mine.toml").resolve())
    assert [p for p in preflight(plan) if p.severity == "error"] == []
    assert load_model(plan.target.model_profile).name == "llama-3.3-70b-fp8"


def test_a_missing_profile_file_is_named_with_the_path_looked_at(tmp_path, monkeypatch):
    path = _plan_with_profile(tmp_path / "plans", "profiles/nope.toml")
    monkeypatch.chdir(tmp_path)
    (problem,) = [p for p in preflight(load_plan(path)) if p.severity == "error"]
    assert problem.where == "target.model_profile"
    assert f"no model profile file {(tmp_path / 'plans' / 'profiles' / 'nope.toml').resolve()}" in problem.message
    with pytest.raises(PivotError, match=r"no model profile 'nope' in .*profiles/models"):
        load_model("nope")


def test_a_session_recorded_with_a_relative_path_keeps_its_target_under_the_same_file(tmp_path):
    plans = tmp_path / "plans"
    (plans / "profiles").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "profiles" / "models" / "llama-3.3-70b-fp8.toml", plans / "profiles" / "mine.toml")
    path = _plan_with_profile(plans, "profiles/mine.toml")
    new = load_plan(path)
    old = new.model_copy(update={"target": new.target.model_copy(update={"model_profile": "profiles/mine.toml"})})
    assert plan_changes(old, new) == []


def _section(title: str) -> str:
    start = README.index(title)
    return README[start : README.index("\n## ", start + 1)]


def test_the_readme_documents_every_workload_key():
    table = _section("## Plans")
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))
    assert documented == set(m.BenchSpec.model_fields)


@pytest.mark.parametrize("model", [HardwareProfile, ModelProfile])
def test_the_readme_lists_every_profile_field_and_which_are_required(model):
    text = _section("### Profiles")
    what = "- a hardware profile:" if model is HardwareProfile else "- a model profile:"
    start = text.index(what)
    end = text.index("\n- ", start + 1) if model is HardwareProfile else len(text)
    bullet = text[start:end]
    required_part = bullet.split("optional", 1)[0]
    listed = set(re.findall(r"`\[*([a-z0-9_]+)\]*`", bullet))
    for name, field in model.model_fields.items():
        assert name in listed, f"{model.__name__}.{name} is not in the README"
        if field.is_required():
            assert f"`{name}`" in required_part or f"`[{name}]`" in required_part or f"[[{name}]]" in required_part, (
                name
            )


def test_the_readmes_moe_hint_matches_the_glm5_profile_it_points_to():
    text = _section("### Profiles")
    assert (
        'routed experts as a part of\n`kind = "experts"`' in text and '`layers = "moe"` (the MoE layers only)' in text
    )
    glm = load_model("glm-5-nvfp4")
    assert glm.kind == "moe" and glm.moe_layers > 0
    (routed,) = glm.part("experts")
    assert routed.name == "routed_experts" and routed.dtype == "nvfp4" and routed.layers == "all"
    assert any(p.kind == "dense" and p.layers == "moe" for p in glm.parts)
    assert os.path.basename("glm-5-nvfp4.toml") in text
