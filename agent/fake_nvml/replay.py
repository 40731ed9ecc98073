"""A capability report of a real host (`gpufleet-agent doctor --json`) replayed as a scenario.

The report names the driver, each GPU, its MIG layout and what every NVML call answered there. The replay
builds the same GPUs and slices, the same driver build (process-record layout), the same sample-buffer length
and spacing, and makes the same calls fail with the same errors, so one run of `doctor --json` on a host turns
into a regression test. A report says little about workload: a whole GPU works steadily at the mean of the
samples its buffer held (idle if it held none), with no process.

Reports shipped in `reports/` can be named without a path: `report:h100-mig-590`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from .curves import NO_LOAD, steady
from .hardware import DRIVERS, MODELS, Driver, Model, Profile
from .scenarios import CiSpec, FailureSpec, GiSpec, GpuSpec, Scenario

REPORT_PREFIX = "report:"
REPORT_FORMAT = "gpufleet-capability-report"
REPORTS_DIR = os.path.join(os.path.dirname(__file__), "reports")

# NVML return codes (nvml.h) by the reason word a report uses for them (agent.nvml.REASONS).
_CODES = {
    "uninitialized": 1,
    "invalid_argument": 2,
    "not_supported": 3,
    "no_permission": 4,
    "not_found": 6,
    "insufficient_size": 7,
    "driver_not_loaded": 9,
    "timeout": 10,
    "function_not_found": 13,
    "gpu_lost": 15,
    "reset_required": 16,
    "unknown": 999,
}
_PROFILE = re.compile(r"(?:(\d)c\.)?(\d)g\.(\d+)gb(\+me)?$")


class ReportError(ValueError):
    """A report that cannot be replayed; the message is one readable line."""


def report_path(name: str) -> str:
    """The file of `report:NAME`: a path, or the name of a shipped report."""
    if os.sep in name or name.endswith(".json"):
        return name
    return os.path.join(REPORTS_DIR, name + ".json")


def shipped_reports() -> list[str]:
    try:
        return sorted(f[: -len(".json")] for f in os.listdir(REPORTS_DIR) if f.endswith(".json"))
    except OSError:
        return []


def scenario_from_report(name: str) -> Scenario:
    path = report_path(name)
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except FileNotFoundError:
        shipped = ", ".join(shipped_reports()) or "none"
        raise ReportError(f"no capability report at {path} (shipped reports: {shipped})") from None
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read the capability report {path}: {exc}") from None
    try:
        return _scenario(report)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReportError(f"{path} is not a usable capability report: {type(exc).__name__} {exc}") from None


def _scenario(report: dict[str, Any]) -> Scenario:
    if report.get("format") != REPORT_FORMAT or report.get("version") != 1:
        raise ValueError(f"format must be {REPORT_FORMAT!r} version 1")
    gpus: list[GpuSpec] = []
    failures: list[FailureSpec] = []
    bus_ids: list[int] = []
    period_us, slots = 166_667, 100
    for i, g in enumerate(report["gpus"]):
        model = _model(g)
        failures += _failures(g.get("calls", {}), i, None)
        for s in g.get("slices", []):
            failures += _failures(s.get("calls", {}), i, int(s["index"]))
        mig = g.get("mig_mode") or {}
        current, pending = bool(mig.get("current")), mig.get("pending")
        samples = g.get("samples") or {}
        level = float(samples.get("mean") or 0.0)
        gpus.append(
            GpuSpec(
                steady(level) if level > 0 else NO_LOAD,
                mig=_layout(g, model) if current else None,
                model=model,
                uuid=str(g["uuid"]),
                mig_pending=None if pending is None or bool(pending) == current else bool(pending),
            )
        )
        bus_ids.append(int(g.get("pci_bus") or 0x10 + i))
        if samples.get("count"):
            slots = int(samples["count"])
            period_us = int(float(samples["spacing_ms"]) * 1000) or period_us
    return Scenario(
        None,
        tuple(gpus),
        tuple(bus_ids),
        driver=_driver(report),
        failures=tuple(failures),
        sample_period_us=period_us,
        sample_slots=slots,
    )


def _driver(report: dict[str, Any]) -> Driver:
    version = str(report["driver"])
    known = DRIVERS.get(version)
    records = report.get("process_records") or {}
    v3 = records.get("record_bytes") if records.get("symbol", "").endswith("_v3") else None
    if known is not None and (v3 is None or v3 == known.v3_record_bytes):
        return known
    major, _, minor = str(report.get("cuda", "12.0")).partition(".")
    return Driver(version, int(major) * 1000 + int(minor or 0) * 10, int(v3) if v3 else None)


def _model(g: dict[str, Any]) -> Model:
    """The GPU model as the report describes it, on top of a known model of that name for what it leaves out."""
    name = str(g["name"])
    base = MODELS.get(name)
    units = g.get("units") or {}
    gpm = g.get("gpm") or {}
    profiles = dict(base.profiles) if base else {}
    for s in g.get("slices", []):
        found = _PROFILE.search(str(s.get("name", "")))
        attrs = s.get("attributes")
        if found is None or not attrs:
            continue
        profile = f"{found.group(2)}g.{found.group(3)}gb"
        gi_slices, ci_slices = int(attrs["gpu_instance_slices"]), int(attrs["compute_instance_slices"])
        profiles[profile] = Profile(
            gi_slices,
            int(attrs["memory_mib"]),
            int(attrs["multiprocessors"]) * gi_slices // max(1, ci_slices),
            int(attrs.get("copy_engines", 1)),
            int(attrs.get("decoders", 0)),
            int(attrs.get("jpegs", 0)),
            int(attrs.get("ofas", 0)),
        )
    template = base or MODELS["NVIDIA A10G"]
    arch = int(g.get("architecture") or template.arch)
    changes: dict[str, Any] = {
        "name": name,
        "total_mib": int(g.get("memory_total_mib") or template.total_mib),
        "reserved_mib": int(g.get("memory_reserved_mib") or template.reserved_mib),
        "arch": arch,
        "pci_device_id": int(str(g.get("pci_device_id") or hex(template.pci_device_id)), 16),
        "gpm": "yes" if gpm.get("supported") is True else "error" if gpm.get("supported") is None else "no",
        "profiles": profiles,
    }
    if units.get("power_limit_mw"):
        changes["tdp_w"] = float(units["power_limit_mw"]) / 1000
    if units.get("power_mw"):
        changes["idle_w"] = float(units["power_mw"]) / 1000
    if units.get("temperature_c") is not None:
        changes["temp_idle_c"] = float(units["temperature_c"])
    return dataclasses.replace(template, **changes)


def _layout(g: dict[str, Any], model: Model) -> tuple[GiSpec, ...]:
    by_gi: dict[int, list[dict[str, Any]]] = {}
    for s in g.get("slices", []):
        by_gi.setdefault(int(s["gpu_instance_id"]), []).append(s)
    layout = []
    for gi_id, members in sorted(by_gi.items()):
        found = _PROFILE.search(str(members[0].get("name", "")))
        if found is None:
            raise ValueError(f"GPU {g['index']}: slice name {members[0].get('name')!r} has no MIG profile")
        profile = f"{found.group(2)}g.{found.group(3)}gb"
        if profile not in model.profiles:
            raise ValueError(f"GPU {g['index']}: profile {profile} of {model.name} has no size in the report")
        cis = []
        for s in members:
            part = _PROFILE.search(str(s.get("name", "")))
            slices = int(part.group(1) or part.group(2)) if part else model.profiles[profile].slices
            cis.append(CiSpec(int(s["index"]), int(s["compute_instance_id"]), slices, NO_LOAD, (), str(s["uuid"])))
        layout.append(GiSpec(gi_id, profile, tuple(cis)))
    return tuple(layout)


def _failures(calls: dict[str, Any], gpu: int, slice_index: int | None) -> list[FailureSpec]:
    """What the host's calls answered, as injected failures: every answer but "ok" that has an NVML code."""
    out = []
    for function, answer in calls.items():
        code = _CODES.get(str(answer))
        if code is not None:
            out.append(FailureSpec(function, code, gpu, slice_index, gpu_only=slice_index is None))
    return out
