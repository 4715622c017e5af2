"""GPU power limits through NVML: set for an experiment (a power item), restored after it, refused clearly where the
driver does not allow it.

`set_power_limits(gpus, watts)` checks each GPU's range (`nvmlDeviceGetPowerManagementLimitConstraints`), keeps
its current limit (`nvmlDeviceGetPowerManagementLimit`), sets the new one (`nvmlDeviceSetPowerManagementLimit`,
milliwatts) and returns a `PowerLimits` whose `restore()` puts every GPU back; a GPU that fails half-way restores
the ones already set before the error is raised. Setting a limit needs root on most drivers
(NVML_ERROR_NO_PERMISSION) and a GPU that supports power management; on an H200 (driver 580.159.04, as root) a set
was accepted and read back (scripts/nvml_power_check.py sets the current limit, so nothing changes). Every refusal is a `PowerLimitRefused` with
one line saying why and what to do (no NVML here, no permission, out of the card's range, not supported).

Which GPUs: the ids in CUDA_VISIBLE_DEVICES (indices or GPU-... UUIDs) when set, else the first N GPUs, N being
the GPUs the server's flags occupy (SGLang and vLLM take GPUs from 0 unless told otherwise). NVML numbers GPUs by
PCI bus; CUDA does too when CUDA_DEVICE_ORDER=PCI_BUS_ID (set it on hosts with mixed GPUs).

A pivot killed while a limit is set leaves it set: the limits to restore are written to a small JSON file beside
the server's log first (`pending_path`, under state/<session>/logs/), and `restore_pending`, called by the session's
next launch of any server (tools/engines/http.py: `limit_power`), puts them back.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from agent.errors import LaunchFailed
from tools.telemetry.gpus import NVML_UNAVAILABLE, TelemetryUnavailable, _load_pynvml

FAILURE = "power-limit"  # the failure class of an experiment whose power limit could not be set


class PowerLimitRefused(LaunchFailed):
    """The GPUs' power limit cannot be set here: the message says why, the hint what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, failure=FAILURE)


@dataclass
class PowerLimits:
    """Limits pivot set, with each GPU's limit before (milliwatts by GPU id), ready to be put back."""

    nvml: ModuleType
    handles: dict[str, Any]
    before_mw: dict[str, int]
    set_mw: int
    pending_path: Path | None = None
    restored: bool = field(default=False, init=False)

    def restore(self) -> list[str]:
        """Put every GPU's limit back (safe to call twice); the GPUs whose limit could not be restored, in words."""
        if self.restored:
            return []
        failed = []
        for gpu, handle in self.handles.items():
            try:
                self.nvml.nvmlDeviceSetPowerManagementLimit(handle, self.before_mw[gpu])
            except Exception as e:  # one GPU that fails must not keep the others at the experiment's limit
                failed.append(f"GPU {gpu}: {e}")
        self.restored = True
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
        if not failed and self.pending_path is not None:
            self.pending_path.unlink(missing_ok=True)
        return failed


def _gpu_handle(nvml: ModuleType, gpu: str) -> Any:
    if gpu.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(gpu)
    return nvml.nvmlDeviceGetHandleByIndex(int(gpu))


def _open(nvml: ModuleType | None) -> ModuleType:
    try:
        module = nvml if nvml is not None else _load_pynvml()
    except TelemetryUnavailable as e:
        raise PowerLimitRefused(f"no GPU power limit can be set here: {e.message}", e.hint) from e
    try:
        module.nvmlInit()
    except Exception as e:
        raise PowerLimitRefused(
            f"no GPU power limit can be set here: {NVML_UNAVAILABLE} ({e})",
            hint="a power item needs NVIDIA GPUs and their driver on the host that runs the server; on the twin use "
            "the sim engine, which models the limit",
        ) from e
    return module


def _refusal(nvml: ModuleType, gpu: str, watts: float, e: Exception) -> PowerLimitRefused:
    """NVML's refusal of a power limit, in words a user can act on."""
    code = getattr(e, "value", None)
    if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", object()):
        return PowerLimitRefused(
            f"setting GPU {gpu}'s power limit to {watts:g} W needs root: NVML says {e}",
            hint="run pivot as root (or with the capability to manage the GPU), or set it yourself with "
            f"`sudo nvidia-smi -i {gpu} -pl {watts:g}` and leave the power item out",
        )
    if code == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
        return PowerLimitRefused(
            f"GPU {gpu} does not let its power limit be set: NVML says {e}",
            hint="this GPU (or its driver, or a virtual machine's view of it) has no power management",
        )
    return PowerLimitRefused(f"GPU {gpu}'s power limit could not be set to {watts:g} W: NVML says {e}")


def set_power_limits(
    gpus: Sequence[str], watts: float, *, nvml: ModuleType | None = None, pending_path: Path | None = None
) -> PowerLimits:
    """Set every one of `gpus` (NVML indices or UUIDs) to `watts`; PowerLimitRefused (nothing left changed) where it
    cannot be done. `pending_path`: where the limits to restore are written before any is set."""
    module = _open(nvml)
    handles: dict[str, Any] = {}
    before: dict[str, int] = {}
    try:
        for gpu in gpus:
            try:
                handle = _gpu_handle(module, gpu)
                lo_mw, hi_mw = module.nvmlDeviceGetPowerManagementLimitConstraints(handle)
                current = int(module.nvmlDeviceGetPowerManagementLimit(handle))
            except Exception as e:
                raise _refusal(module, gpu, watts, e) from e
            if not lo_mw <= watts * 1000 <= hi_mw:
                raise PowerLimitRefused(
                    f"GPU {gpu} takes power limits from {lo_mw / 1000:g} to {hi_mw / 1000:g} W, not {watts:g} W",
                    hint="choose a power_limit_w inside that range (nvidia-smi -q -d POWER shows it)",
                )
            handles[gpu], before[gpu] = handle, current
    except BaseException:
        with contextlib.suppress(Exception):
            module.nvmlShutdown()
        raise
    limits = PowerLimits(module, handles, before, round(watts * 1000), pending_path)
    if pending_path is not None:
        pending_path.parent.mkdir(parents=True, exist_ok=True)
        pending_path.write_text(json.dumps({"restore_mw": before}), encoding="utf-8")
    for gpu, handle in handles.items():
        try:
            module.nvmlDeviceSetPowerManagementLimit(handle, limits.set_mw)
        except Exception as e:
            limits.restore()
            raise _refusal(module, gpu, watts, e) from e
    return limits


def restore_pending(path: Path, *, nvml: ModuleType | None = None) -> list[str]:
    """Put back the limits a killed pivot left set (the file `set_power_limits` wrote); what was restored, in words.
    Nothing to do without the file; a file that cannot be acted on is left for the next try."""
    if not path.is_file():
        return []
    try:
        restore = {str(k): int(v) for k, v in json.loads(path.read_text(encoding="utf-8"))["restore_mw"].items()}
        module = _open(nvml)
    except (ValueError, KeyError, TypeError, OSError, PowerLimitRefused):
        return []
    done, failed = [], False
    try:
        for gpu, mw in restore.items():
            try:
                module.nvmlDeviceSetPowerManagementLimit(_gpu_handle(module, gpu), mw)
                done.append(f"GPU {gpu} back to {mw / 1000:g} W")
            except Exception:
                failed = True
    finally:
        with contextlib.suppress(Exception):
            module.nvmlShutdown()
    if not failed:
        path.unlink(missing_ok=True)
    return done


def server_gpus(env: dict[str, str], count: int) -> list[str]:
    """The GPUs a server started with `env` takes: CUDA_VISIBLE_DEVICES' ids when set, else the first `count`."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [g.strip() for g in visible.split(",") if g.strip()][: max(count, 1)]
    return [str(i) for i in range(max(count, 1))]
