"""A capability report replays as a scenario: the same devices, layout and answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent import capabilities, fake_nvml
from agent.collect import Collector
from agent.fake_nvml.replay import shipped_reports
from agent.nvml import Nvml


def _report(scenario: str) -> dict[str, Any]:
    nvml = Nvml.open(fake_nvml.load(scenario))
    try:
        collector = Collector(nvml)
        collector.start()
        layout = collector.collect().gpus
        collector.close()
        return capabilities.report(nvml, layout, simulated=scenario)
    finally:
        nvml.close()


def _answers(report: dict[str, Any]) -> list[Any]:
    kept = ("name", "uuid", "pci_device_id", "memory_total_mib", "mig_mode", "calls", "gpm")
    return [
        ({k: g[k] for k in kept}, [{k: v for k, v in s.items() if k != "memory_used_mib"} for s in g["slices"]])
        for g in report["gpus"]
    ]


@pytest.mark.parametrize("scenario", ["p4d-mig-unprivileged", "p5-mig", "g6e-busy"])
def test_a_report_replays_as_the_host_it_describes(tmp_path: Path, scenario: str) -> None:
    first = _report(scenario)
    path = tmp_path / "host.json"
    path.write_text(json.dumps(first))
    again = _report(f"report:{path}")
    assert _answers(again) == _answers(first)
    assert again["grants"] == first["grants"]
    assert again["driver"] == first["driver"]


def test_the_shipped_reports_replay_published_hosts() -> None:
    assert shipped_reports() == ["h100-mig-590", "h200-mig-590"]
    h100 = _report("report:h100-mig-590")
    [gpu] = h100["gpus"]
    assert (gpu["name"], gpu["memory_total_mib"], h100["driver"]) == ("NVIDIA H100 80GB HBM3", 81559, "590.48.01")
    sizes = [(s["name"].rsplit(" ", 1)[1], s["attributes"]["memory_mib"]) for s in gpu["slices"]]
    assert sizes == [("3g.40gb", 40448), ("2g.20gb", 20096), ("1g.10gb", 9984), ("1g.10gb", 9984)]
    [h200] = _report("report:h200-mig-590")["gpus"]
    assert [s["name"].rsplit(" ", 1)[1] for s in h200["slices"]][:2] == ["1c.3g.71gb", "2c.3g.71gb"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read"),
        ('{"format": "other", "version": 1}', "not a usable capability report"),
        ('{"format": "gpufleet-capability-report", "version": 1, "driver": "550.127.05"}', "not a usable"),
    ],
)
def test_a_bad_report_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(fake_nvml.ReportError, match=message):
        fake_nvml.load(f"report:{path}")
    with pytest.raises(fake_nvml.ReportError, match="shipped reports: h100-mig-590"):
        fake_nvml.load("report:no-such-report")
