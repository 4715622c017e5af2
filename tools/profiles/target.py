"""A target's two profiles, wherever they come from: named in the plan, recorded with the session, or generated.

    profiles = target_profiles(plan.target)                   # pivot plan check: named, else generated now
    profiles = session_profiles(store, session_id)            # a session: recorded at its start, the same ever after

A plan that names `model_profile` and `hardware` gets those (shipped names or TOML paths). One that does not gets a
shipped model profile that serves its model when there is one, else a profile generated from the model's config.json
(tools/profiles/generated.py), and this host's hardware (NVML's GPU, else the CPU). A session records what was
generated (SessionSettings.profiles) the first time it is asked, so a resume on another host, and every report,
reads the same figures; `notes` say where each profile came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agent import models as m
from agent.errors import PivotError
from tools.profiles import HardwareProfile, ModelProfile, load_hardware, load_model, names
from tools.profiles.generated import detect_hardware, find_model_config, model_from_config


@dataclass
class TargetProfiles:
    """The model and hardware profiles of a target, what pivot generated of them, and where each came from."""

    model: ModelProfile
    hardware: HardwareProfile
    generated: dict[str, dict[str, Any]] = field(default_factory=dict)  # "model"/"hardware" -> the profile's data
    notes: list[str] = field(default_factory=list)

    @property
    def calibrated(self) -> bool:
        """Whether the twin can run for this target (both profiles shipped and the hardware calibrated)."""
        return not self.generated.get("model") and self.hardware.calibrated


def model_profile_for(target: m.Target, recorded: Mapping[str, Any] | None = None) -> tuple[ModelProfile, str, bool]:
    """(the model profile, where it came from, whether pivot generated it)."""
    if target.model_profile:
        return load_model(target.model_profile), f"model profile {target.model_profile}", False
    if recorded:
        try:
            return ModelProfile.model_validate(recorded), "model profile recorded with the session", True
        except ValidationError as e:
            raise PivotError(f"the session's recorded model profile cannot be read: {e.errors()[0]['msg']}") from e
    for name in names("models"):
        profile = load_model(name)
        if profile.model_path == target.model:
            return profile, f"shipped model profile {name} (it serves {target.model})", False
    path = find_model_config(target.model)
    if path is None:
        raise PivotError(
            f"no model profile serves {target.model!r} and its config.json is not here (neither a directory by that "
            "name nor in the Hugging Face cache)",
            hint="download the model first (its config.json is enough), or set target.model_profile to one of: "
            + (", ".join(names("models")) or "none"),
        )
    return model_from_config(path, target.model), f"model profile generated from {path}", True


def hardware_profile_for(
    target: m.Target, recorded: Mapping[str, Any] | None = None
) -> tuple[HardwareProfile, str, bool]:
    """(the hardware profile, where it came from, whether it is recorded with the session: generated, or detected on
    this host, a shipped profile included, so that the session is read on another host as it was measured)."""
    if target.hardware:
        return load_hardware(target.hardware), f"hardware profile {target.hardware}", False
    if recorded:
        try:
            return HardwareProfile.model_validate(recorded), "hardware recorded with the session", True
        except ValidationError as e:
            raise PivotError(f"the session's recorded hardware profile cannot be read: {e.errors()[0]['msg']}") from e
    hw = detect_hardware()
    return hw, f"hardware detected here: {hw.title} ({hw.source or 'a shipped profile'})", True


def target_profiles(target: m.Target, recorded: Mapping[str, Mapping[str, Any]] | None = None) -> TargetProfiles:
    """Both profiles of `target`: named, else `recorded` (a session's), else generated; PivotError when the model
    has neither a profile nor a config.json here."""
    recorded = recorded or {}
    model, model_note, model_generated = model_profile_for(target, recorded.get("model"))
    hw, hw_note, hw_generated = hardware_profile_for(target, recorded.get("hardware"))
    generated: dict[str, dict[str, Any]] = {}
    if model_generated:
        generated["model"] = model.model_dump(mode="json")
    if hw_generated:
        generated["hardware"] = hw.model_dump(mode="json")
    notes = [model_note, hw_note]
    if hw.unknown():
        notes.append(f"not known of {hw.title}: {', '.join(hw.unknown())}")
    return TargetProfiles(model, hw, generated, notes)


def session_profiles(store: Any, session_id: str) -> TargetProfiles:
    """The session's target profiles, generated and recorded with it the first time (so later readings match)."""
    record = store.get_session(session_id)
    profiles = target_profiles(record.plan.target, record.settings.profiles)
    if profiles.generated and profiles.generated != record.settings.profiles:
        settings = record.settings.model_copy(update={"profiles": profiles.generated})
        store.set_session_settings(session_id, settings)
    return profiles
