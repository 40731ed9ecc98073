"""The messages about an incident, per channel: each names what, where (instance name and id, GPU), since when,
the dollars so far and per day, who holds it, the dashboard and snooze links and a planned stop; the webhook's
fields are stable."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.alerts import links, snooze
from app.alerts.findings import Finding
from app.alerts.messages import About, email, payload, slack, webhook
from app.settings import Settings

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
KEY = b"k" * 32
SETTINGS = Settings(public_url="https://gpufleet.example.com/")

FINDING = Finding(
    subject="gpu:GPU-8f2c",
    since=T0 - timedelta(hours=3),
    what="GPU 0 (NVIDIA A10G) idle for 3.0 h",
    instance_pk=7,
    instance_id="i-0abc123",
    instance_name="train-3",
    device_id=11,
    device="GPU 0 (NVIDIA A10G)",
    usd_so_far=3.018,
    usd_per_day=24.144,
    holders=("asmith",),
    tags={"team": "ml"},
    page="/instances/i-0abc123",
    extra={"util_pct": 0.4},
)


def _about(kind: str = "open", **kw: Any) -> About:
    base: dict[str, Any] = {
        "kind": kind,
        "incident_id": 42,
        "rule": "forgotten-gpus",
        "condition": "gpu_idle",
        "finding": FINDING,
        "at": T0,
        "dashboard_url": links.page_url(SETTINGS, FINDING.page),
        "snooze_url": links.snooze_url(SETTINGS, KEY, 42, now=T0) if kind != "closed" else None,
    }
    return About(**{**base, **kw})


def _all_text(about: About) -> list[str]:
    return [json.dumps(payload(channel, about)) for channel in ("slack", "webhook", "email")]


@pytest.mark.parametrize("channel", ["slack", "webhook", "email"])
def test_an_open_message_names_what_where_since_dollars_holder_and_links(channel: str) -> None:
    about = _about(stop_at=T0 + timedelta(hours=1))
    text = json.dumps(payload(channel, about))
    for part in (
        "GPU 0 (NVIDIA A10G) idle for 3.0 h",
        "train-3 (i-0abc123)",
        "2026-11-24T09:00:00Z" if channel == "webhook" else "2026-11-24 09:00 UTC",
        "asmith",
        "https://gpufleet.example.com/instances/i-0abc123",
        "https://gpufleet.example.com/alerts/snooze/42.",
        "13:00 UTC unless snoozed",
    ):
        assert part in text, part
    if channel == "webhook":
        assert '"usd_so_far": 3.02' in text and '"usd_per_day": 24.14' in text
    else:
        assert "$3.02 so far" in text and "$24.14 a day" in text


def test_the_snooze_link_is_signed_for_the_incident() -> None:
    about = _about()
    assert about.snooze_url is not None
    token = about.snooze_url.rsplit("/", 1)[1]
    assert snooze.verify(KEY, token, now=T0 + timedelta(days=1)).incident_id == 42
    with pytest.raises(snooze.BadLink):
        snooze.verify(b"another key" * 3, token, now=T0)


def test_the_webhook_fields_are_stable_and_json() -> None:
    body = webhook(_about("reminder", reminder=2, stop_at=T0 + timedelta(days=1, minutes=5), stop_dry_run=True))
    assert list(body) == [
        "kind",
        "text",
        "incident_id",
        "rule",
        "condition",
        "subject",
        "what",
        "instance",
        "device",
        "since",
        "at",
        "usd_so_far",
        "usd_per_day",
        "holders",
        "dashboard_url",
        "snooze_url",
        "stop",
        "reminder",
        "reason",
        "figures",
    ]
    assert body["kind"] == "reminder" and body["reminder"] == 2 and body["incident_id"] == 42
    assert body["instance"] == {"id": "i-0abc123", "name": "train-3"}
    assert body["since"] == "2026-11-24T09:00:00Z" and body["at"] == "2026-11-24T12:00:00Z"
    assert body["stop"] == {"at": "2026-11-25T12:05:00Z", "dry_run": True}
    assert body["holders"] == ["asmith"] and body["figures"] == {"util_pct": 0.4}
    # Figures JSON has no type for are given as text, so the outbox can store them.
    dated = webhook(_about(finding=replace(FINDING, extra={"last_busy": T0, "gpus": {1, 2} - {1}})))
    assert dated["figures"] == {"last_busy": "2026-11-24T12:00:00+00:00", "gpus": "{2}"}
    assert body["text"].startswith("Still open: GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3 (i-0abc123)")
    # A stop on another day says which; a dry run says nothing will stop.
    assert "would stop at 2026-11-25 12:05 UTC unless snoozed (dry run" in body["text"]
    assert json.loads(json.dumps(body)) == body


def test_a_closed_message_says_how_long_it_lasted_and_offers_no_snooze() -> None:
    about = _about("closed", at=T0 + timedelta(hours=2), reason="the condition no longer holds")
    for text in _all_text(about):
        assert "/alerts/snooze/" not in text and "Snooze" not in text
        assert "Over after 5.0 h: GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3 (i-0abc123): $3.02 in all" in text
        assert "the condition no longer holds" in text
        assert "https://gpufleet.example.com/instances/i-0abc123" in text
    body = webhook(about)
    assert body["snooze_url"] is None and body["stop"] is None and body["reason"] == "the condition no longer holds"
    assert "lasted 5.0 h" in email(about)["text"]
    assert (
        email(about)["subject"]
        == "[gpufleet] Over after 5.0 h: GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3 (i-0abc123)"
    )


def test_without_an_instance_nor_a_price_it_says_so() -> None:
    tag = Finding(
        subject="tag:team=ml", since=T0 - timedelta(days=1), what="team=ml wasted $310 in the last day", page="/waste"
    )
    about = _about(finding=tag)
    body = webhook(about)
    assert body["instance"] is None and body["device"] is None and body["usd_so_far"] is None
    mail = email(about)
    assert "Where:   tag team=ml" in mail["text"] and "no price known" in mail["text"]
    assert "Held by: no one known" in mail["text"]


def test_slack_gets_text_and_blocks_with_its_special_characters_escaped() -> None:
    about = _about(finding=replace(FINDING, instance_name="a<b>&c", holders=("<!channel>",)))
    msg = slack(about)
    assert set(msg) == {"text", "blocks"}
    assert msg["text"].startswith("GPU 0 (NVIDIA A10G) idle for 3.0 h on a<b>&c (i-0abc123): $3.02 so far")
    fields = msg["blocks"][1]["text"]["text"]
    assert "a&lt;b&gt;&amp;c (i-0abc123)" in fields and "&lt;!channel&gt;" in fields and "<!channel>" not in fields
    linked = msg["blocks"][2]["text"]["text"]
    assert "<https://gpufleet.example.com/instances/i-0abc123|" in linked and "/alerts/snooze/42." in linked
    assert msg["blocks"][0]["type"] == "header" and len(msg["blocks"][0]["text"]["text"]) <= 150


def test_email_has_a_subject_and_a_plain_text_body() -> None:
    mail = email(_about())
    assert set(mail) == {"subject", "text"}
    assert mail["subject"] == "[gpufleet] GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3 (i-0abc123)"
    assert "Cost:    $3.02 so far, $24.14 a day" in mail["text"]
    assert "Snooze (1 day or 1 week, with a reason): https://gpufleet.example.com/alerts/snooze/42." in mail["text"]
