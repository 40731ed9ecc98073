"""`gpufleet demo` end to end: a subprocess on a temporary folder shows the stories, goes live, and stops with
Ctrl-C leaving no PostgreSQL behind."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest

from app.alerts.channels import sign
from app.demo.alerts import SECRET
from tests.app.alerts.receivers import HttpReceiver, Request
from tests.demo_process import DemoProcess, get, postgres_processes, samples_accepted

pytestmark = pytest.mark.demo


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def gpufleet() -> list[str]:
    script = Path(sys.executable).with_name("gpufleet")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


def clean_env() -> dict[str, str]:
    """This environment without gpufleet settings: the demo must not need any."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def g5_messages(receiver: HttpReceiver) -> list[tuple[Request, dict[str, object]]]:
    """The demo's alert messages about the forgotten g5, each checked against the demo's signing secret."""
    out = []
    for r in receiver.requests("/demo"):
        assert r.headers["x-gpufleet-signature"] == sign(SECRET, int(r.headers["x-gpufleet-timestamp"]), r.body)
        body = json.loads(r.body)
        if (body.get("instance") or {}).get("name") == "vision-finetune-dev":
            out.append((r, body))
    return out


def test_the_demo_tells_its_stories_live_and_stops_everything(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    receiver = HttpReceiver()
    launched = time.monotonic()
    command = [*gpufleet(), "demo", "--data-dir", str(folder), "--port", str(free_port())]
    demo = DemoProcess([*command, "--webhook", receiver.url("/demo")], env=clean_env())
    try:
        url = demo.wait_for_url(timeout_s=120)
        started = time.monotonic()
        assert "14 days of history" in demo.output
        assert "authentication is OFF" in demo.output

        idle = get(url + "gpus/idle")
        [g5] = [row for row in re.findall(r"<tr data-gpu=.*?</tr>", idle, re.S) if "vision-finetune-dev" in row]
        # Idle 102 hours when the demo began, at $1.006 an hour: $102.61, and a few cents more by now.
        assert re.search(r"\$102\.\d\d", text_of(g5)), text_of(g5)
        assert "g5.xlarge" in g5 and "team=vision" in g5

        overview = text_of(get(url))
        assert re.search(r"Instances 14 ", overview), overview[:400]
        assert "ml-research" in overview and "inference" in overview
        # Over time: the p4d pair of ml-research wastes most at night and at weekends; every page answers JSON.
        assert "heatmap/week?tag=team:ml-research" in demo.output
        week = json.loads(get(url + "heatmap/week?tag=team:ml-research&window=7d", accept="application/json"))
        assert week["total_usd"] > 0 and week["peak"] is not None
        assert "svg" in get(url + "heatmap?window=7d") and "chart-stacked" in get(url + "?window=7d")
        idle_json = json.loads(get(url + "gpus/idle", accept="application/json"))
        assert any(r["instance"]["name"] == "vision-finetune-dev" for r in idle_json["rows"])
        mig = text_of(get(url + "mig"))
        assert "inference-serving" in mig and "shared-a100-mig" in mig
        # Who leaves GPUs idle: the history's holders, split by user (asmith's notebook holds a GPU idle).
        assert "/waste?group_by=user" in demo.output and "api/v1/report?window=7d&group_by=user" in demo.output
        report = json.loads(get(url + "api/v1/report?window=7d&group_by=user", accept="application/json"))
        users = {row["group"]["user"]: row for row in report["rows"]}
        assert users["asmith"]["idle_held_cost"] > 0, sorted(users)
        assert "mchen" in users and "(none)" in users, sorted(users)
        [page] = re.findall(r"what to grant: /(instances/i-0[0-9a-f]+)", demo.output)
        locked = text_of(get(url + page))
        assert "a100-mig-locked-down" in locked and "MIG monitor capability" in locked

        # The bill: spot instances are priced from it, then from the spot history, never from the catalog; the
        # Capacity Block's instance pays for its offline hours; one instance of the bill has no agent.
        billed = re.search(
            r"billing: imported .* unmonitored \(no agent\): (i-0[0-9a-f]+) \(p4d\.24xlarge\)", demo.output
        )
        assert billed, demo.output
        spot = json.loads(get(url + "api/v1/report?window=30d&group_by=instance&lifecycle=spot"))
        assert len(spot["rows"]) == 3
        assert all(set(r["price_sources"]) == {"billed", "spot history"} for r in spot["rows"]), spot["rows"]
        [block_page] = re.findall(r"as idle waste: /instances/(i-0[0-9a-f]+)", demo.output)
        every = json.loads(get(url + "api/v1/report?window=30d&group_by=instance"))
        [block] = [r for r in every["rows"] if r["group"]["instance"] == block_page]
        assert block["price_sources"] == {"billed": 1.0} and block["idle_cost"] > 7 * 31
        assert billed.group(1) not in {r["group"]["instance"] for r in every["rows"]}

        # One live interval: the simulated agents post through the ingest API.
        while samples_accepted(url) == 0:
            assert time.monotonic() - started < 60, "no live interval arrived"
            time.sleep(1)

        # The forgotten g5 is reported to the webhook within 90 s of the start, once, with its dollars.
        assert f"to {receiver.url('/demo')}, signed with the secret" in demo.output
        while not g5_messages(receiver):
            assert time.monotonic() - launched < 90, (receiver.requests(), demo.output[-2000:])
            time.sleep(1)
        [(first, body)] = g5_messages(receiver)
        assert first.at - launched < 90
        assert body["kind"] == "open" and body["instance"]["id"].startswith("i-0")
        assert "g5.xlarge" in json.dumps(body) or "A10G" in str(body["text"])
        assert re.search(r"\$\d+\.\d\d so far", str(body["text"])), body["text"]
        # The demo evaluates every 10 s: a minute of further rounds sends nothing more about it.
        while time.monotonic() - first.at < 60:
            time.sleep(2)
        assert len(g5_messages(receiver)) == 1

        assert demo.interrupt(timeout_s=60) == 0
        assert "gpufleet demo: stopped" in demo.output
        assert "Traceback" not in demo.output
        assert postgres_processes(folder) == []
        assert not (folder / "pgdata" / "postmaster.pid").exists()
    finally:
        demo.kill()
        receiver.close()
