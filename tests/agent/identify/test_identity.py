"""IdentityResolver: EC2 identity from IMDSv2, the settings fallback, and spot / rebalance notices."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.identify import Identity, IdentityResolver, IdentityUnavailable, ImdsClient
from app.ingest.schemas import EventIn, InstanceIn
from tests.agent.imds_server import DEFAULT_METADATA, ImdsServer, closed_port_url

STATIC_PATHS = [
    "instance-id",
    "instance-type",
    "ami-id",
    "placement/region",
    "placement/availability-zone",
    "instance-life-cycle",
]


class HostConfig(AgentConfig):
    """Settings on a host called gpu-01, whatever this machine is called."""

    def host_name(self) -> str:
        return "gpu-01"


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeWallClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 21, 14, 0, 7, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def imds() -> Iterator[ImdsServer]:
    with ImdsServer(tags={"team": "ml", "Name": "gpu box", "cost center": "42"}) as server:
        yield server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def resolver(url: str, clock: FakeClock | None = None, **settings: Any) -> IdentityResolver:
    config = HostConfig(imds_url=url, **settings)
    return IdentityResolver(config, clock=clock or FakeClock(), wall_clock=FakeWallClock())


# EC2 identity


def test_full_imds_identity(imds: ImdsServer) -> None:
    ident = resolver(imds.url, tags={"team": "from-settings", "env": "prod"}, price_usd_per_hour=21.96).identity()
    assert ident == Identity(
        instance_id=DEFAULT_METADATA["instance-id"],
        hostname="gpu-01",
        instance_type="p4d.24xlarge",
        region="us-east-1",
        availability_zone="us-east-1a",
        lifecycle="spot",
        ami_id="ami-0123456789abcdef0",
        tags={"team": "ml", "Name": "gpu box", "cost center": "42", "env": "prod"},
        price_usd_per_hour=21.96,
        source="imds",
    )


def test_identity_is_cached(imds: ImdsServer, clock: FakeClock) -> None:
    res = resolver(imds.url, clock)
    first = res.identity()
    gets = imds.total("GET")
    clock.now += 300
    assert res.identity() is first
    assert imds.total("GET") == gets
    assert imds.token_puts == 1
    assert all(imds.count("meta-data/" + path) == 1 for path in STATIC_PATHS)


def test_missing_tags_path_means_no_tags() -> None:
    with ImdsServer(tags=None) as imds:
        ident = resolver(imds.url).identity()
        assert ident.source == "imds"
        assert ident.tags == {}
        assert imds.count("meta-data/tags/instance") == 1


def test_tags_refreshed_every_10_minutes(imds: ImdsServer, clock: FakeClock) -> None:
    res = resolver(imds.url, clock)
    assert res.identity().tags["team"] == "ml"
    imds.tags = {"team": "infra"}
    clock.now += 599
    assert res.identity().tags["team"] == "ml"
    clock.now += 2
    assert res.identity().tags == {"team": "infra"}
    assert imds.count("meta-data/tags/instance") == 2
    assert imds.count("meta-data/instance-id") == 1


def test_token_expiry_renews_once(imds: ImdsServer, clock: FakeClock) -> None:
    res = resolver(imds.url, clock)
    res.identity()
    imds.expire_tokens()
    imds.tags = {"team": "infra"}
    clock.now += 601
    assert res.identity().tags == {"team": "infra"}
    assert imds.token_puts == 2


def test_failed_refresh_keeps_the_cached_identity(imds: ImdsServer, clock: FakeClock) -> None:
    res = resolver(imds.url, clock)
    before = res.identity()
    imds.disable()
    clock.now += 601
    assert res.identity() == before


@pytest.mark.parametrize(
    ("life_cycle", "expected"), [("spot", "spot"), ("on-demand", "on-demand"), ("scheduled", "on-demand"), (None, None)]
)
def test_lifecycle(life_cycle: str | None, expected: str | None) -> None:
    metadata = dict(DEFAULT_METADATA)
    metadata.pop("instance-life-cycle")
    if life_cycle is not None:
        metadata["instance-life-cycle"] = life_cycle
    with ImdsServer(metadata) as imds:
        assert resolver(imds.url).identity().lifecycle == expected


def test_region_from_identity_document_when_placement_region_missing() -> None:
    metadata = {k: v for k, v in DEFAULT_METADATA.items() if k != "placement/region"}
    dynamic = {"instance-identity/document": '{"region": "us-west-2", "instanceId": "i-1"}'}
    with ImdsServer(metadata, dynamic=dynamic) as imds:
        assert resolver(imds.url).identity().region == "us-west-2"


# Settings instead of IMDS


def test_off_uses_the_settings(imds: ImdsServer) -> None:
    res = resolver(imds.url, imds="off", instance_type="g5.xlarge", region="eu-central-1", price_usd_per_hour=1.006)
    ident = res.identity()
    assert ident == Identity(
        instance_id="gpu-01",
        hostname="gpu-01",
        instance_type="g5.xlarge",
        region="eu-central-1",
        lifecycle="on-prem",
        price_usd_per_hour=1.006,
        source="config",
    )
    assert res.poll_events() == []
    assert imds.total("GET") + imds.token_puts == 0
    assert res.describe() == "IMDS: off; host gpu-01 (on-prem)"


def test_off_with_host_id() -> None:
    res = resolver(closed_port_url(), imds="off", host_id="rack4-node7", tags={"site": "fra"})
    ident = res.identity()
    assert (ident.instance_id, ident.hostname, ident.tags) == ("rack4-node7", "gpu-01", {"site": "fra"})
    assert res.describe() == "IMDS: off; host gpu-01, id rack4-node7 (on-prem)"


def test_a_host_name_the_server_would_refuse_becomes_a_valid_host_id() -> None:
    """Off EC2 the host name is the instance id; the server takes only letters, digits, '.', '_' and '-'."""
    res = IdentityResolver(
        _NamedHost(imds_url=closed_port_url(), imds="off"), clock=FakeClock(), wall_clock=FakeWallClock()
    )
    ident = res.identity()
    assert (ident.instance_id, ident.hostname) == ("lab-gpu-7-rack-b", "lab gpu 7/rack b")
    InstanceIn.model_validate({"instance_id": ident.instance_id, "hostname": ident.hostname})


def test_a_tag_with_a_control_character_is_skipped_not_sent() -> None:
    """One such tag would have the server refuse every batch."""
    res = resolver(closed_port_url(), imds="off", tags={"team": "ml", "note": "line one\nline two", "a\tb": "x"})
    assert res.identity().tags == {"team": "ml"}


def test_auto_without_imds_falls_back_fast_and_waits_10_minutes(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    request = ImdsClient._request

    def counting(self: ImdsClient, method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
        calls.append(f"{method} {url}")
        return request(self, method, url, headers)

    monkeypatch.setattr(ImdsClient, "_request", counting)
    url = closed_port_url()
    res = resolver(url, clock, instance_type="g5.xlarge")
    started = time.monotonic()
    ident = res.identity()
    assert time.monotonic() - started < 2.5
    assert (ident.source, ident.instance_id, ident.lifecycle, ident.instance_type) == (
        "config",
        "gpu-01",
        "on-prem",
        "g5.xlarge",
    )
    assert calls == [f"PUT {url}/latest/api/token"]
    clock.now += 599
    assert res.identity() == ident
    assert res.poll_events() == []
    assert res.describe() == f"IMDS: not reachable at {url} (connection refused); using host name gpu-01"
    assert len(calls) == 1
    clock.now += 2
    res.identity()
    assert len(calls) == 2


def test_auto_switches_to_imds_when_it_answers_later(imds: ImdsServer, clock: FakeClock) -> None:
    imds.disable()
    res = resolver(imds.url, clock)
    assert res.identity().source == "config"
    assert res.describe().startswith("IMDS: refused the request (403): metadata access is disabled")
    imds.enable()
    clock.now += 601
    assert res.identity().instance_id == DEFAULT_METADATA["instance-id"]


def test_auto_with_slow_imds_does_not_block_long(clock: FakeClock) -> None:
    with ImdsServer(delay_s=3.0) as slow:
        res = resolver(slow.url, clock, imds_timeout_s=0.3)
        started = time.monotonic()
        assert res.identity().source == "config"
        assert time.monotonic() - started < 0.6 + 0.3
        assert "timed out after 0.3 s" in res.describe()


def test_on_without_imds_raises() -> None:
    url = closed_port_url()
    res = resolver(url, imds="on")
    with pytest.raises(IdentityUnavailable, match=r"not reachable .* \(connection refused\).*required"):
        res.identity()
    # No 10-minute wait in this mode: the caller decides when to retry.
    with pytest.raises(IdentityUnavailable):
        res.identity()
    assert res.describe() == f"IMDS: not reachable at {url} (connection refused); required by GPUFLEET_AGENT_IMDS=on"


def test_on_with_imds_disabled_raises(imds: ImdsServer) -> None:
    imds.disable()
    with pytest.raises(IdentityUnavailable, match=r"403"):
        resolver(imds.url, imds="on").identity()


def test_describe_on_ec2(imds: ImdsServer) -> None:
    res = resolver(imds.url)
    assert res.describe() == f"IMDS: {DEFAULT_METADATA['instance-id']} p4d.24xlarge us-east-1a spot, 3 tags"


# Notices


def test_spot_interruption_reported_once(imds: ImdsServer, clock: FakeClock) -> None:
    res = resolver(imds.url, clock)
    assert res.poll_events() == []  # before identity(): not known to be on EC2 yet
    res.identity()
    assert res.poll_events() == []
    imds.set_spot_action({"action": "terminate", "time": "2026-11-21T14:02:07Z"})
    clock.now += 1
    assert res.poll_events() == []  # rate-limited: IMDS not even asked
    assert imds.count("meta-data/spot/instance-action") == 1
    clock.now += 4
    events = res.poll_events()
    assert events == [
        {
            "ts": "2026-11-21T14:00:07Z",
            "kind": "spot_interruption",
            "details": {"action": "terminate", "time": "2026-11-21T14:02:07Z"},
        }
    ]
    EventIn.model_validate(events[0])
    for _ in range(3):
        clock.now += 5
        assert res.poll_events() == []
    assert imds.count("meta-data/spot/instance-action") == 5


def test_changed_spot_action_is_a_new_event(imds: ImdsServer, clock: FakeClock) -> None:
    res = resolver(imds.url, clock)
    res.identity()
    imds.set_spot_action({"action": "stop", "time": "2026-11-21T14:02:07Z"})
    assert len(res.poll_events()) == 1
    imds.set_spot_action({"action": "terminate", "time": "2026-11-21T14:03:00Z"})
    clock.now += 5
    assert [e["details"] for e in res.poll_events()] == [{"action": "terminate", "time": "2026-11-21T14:03:00Z"}]


def test_rebalance_recommendation(imds: ImdsServer, clock: FakeClock) -> None:
    wall = FakeWallClock()
    res = IdentityResolver(HostConfig(imds_url=imds.url), clock=clock, wall_clock=wall)
    res.identity()
    imds.set_rebalance({"noticeTime": "2026-11-21T13:59:00Z"})
    wall.now += timedelta(seconds=3)
    events = res.poll_events()
    assert events == [
        {
            "ts": "2026-11-21T14:00:10Z",
            "kind": "rebalance_recommendation",
            "details": {"notice_time": "2026-11-21T13:59:00Z"},
        }
    ]
    EventIn.model_validate(events[0])
    clock.now += 5
    assert res.poll_events() == []


def test_poll_events_never_raises(imds: ImdsServer, clock: FakeClock) -> None:
    res = resolver(imds.url, clock)
    res.identity()
    imds.disable()
    assert res.poll_events() == []


# Wire shape


def test_to_wire_matches_the_server_schema(imds: ImdsServer) -> None:
    ident = resolver(imds.url, price_usd_per_hour=21.96).identity()
    wire = ident.to_wire()
    assert set(wire) == {
        "instance_id",
        "hostname",
        "instance_type",
        "region",
        "availability_zone",
        "lifecycle",
        "ami_id",
        "tags",
        "price_usd_per_hour",
    }
    parsed = InstanceIn.model_validate(wire)
    assert parsed.instance_id == ident.instance_id
    assert parsed.lifecycle == "spot"
    assert parsed.tags == ident.tags
    assert parsed.price_usd_per_hour == 21.96


def test_to_wire_omits_none_but_keeps_tags() -> None:
    wire = resolver(closed_port_url(), imds="off").identity().to_wire()
    assert wire == {"instance_id": "gpu-01", "hostname": "gpu-01", "lifecycle": "on-prem", "tags": {}}
    InstanceIn.model_validate(wire)


def test_tags_trimmed_to_server_limits() -> None:
    tags = {f"k{i:03}": "v" * 300 for i in range(70)}
    tags["x" * 129] = "too long a key"
    wire = resolver(closed_port_url(), imds="off", tags=tags).identity().to_wire()
    parsed = InstanceIn.model_validate(wire)
    assert len(parsed.tags) == 64
    assert all(len(v) == 256 for v in parsed.tags.values())


@pytest.fixture(autouse=True)
def _not_on_ec2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever machine runs the tests, the resolver sees no EC2 markers unless a test sets them."""
    monkeypatch.setattr("agent.identify.identity.EC2_HINTS", ())


def test_auto_on_an_ec2_machine_waits_for_imds_instead_of_using_the_host_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    vendor = tmp_path / "sys_vendor"
    vendor.write_text("Amazon EC2\n")
    monkeypatch.setattr("agent.identify.identity.EC2_HINTS", ((str(vendor), "amazon ec2"),))
    resolver = IdentityResolver(AgentConfig(imds="auto", imds_url=closed_port_url(), imds_timeout_s=0.3))
    with pytest.raises(IdentityUnavailable, match="says this is an EC2 instance"):
        resolver.identity()
    assert "waits for IMDS" in resolver.describe()


def test_ec2_markers(tmp_path: Any) -> None:
    from agent.identify.identity import looks_like_ec2

    tag = tmp_path / "board_asset_tag"
    tag.write_text("i-0abc1234def567890\n")
    other = tmp_path / "sys_vendor"
    other.write_text("QEMU\n")
    assert looks_like_ec2(((str(other), "amazon ec2"), (str(tag), "i-"))) == str(tag)
    assert looks_like_ec2(((str(other), "amazon ec2"), (str(tmp_path / "missing"), "ec2"))) is None


class _NamedHost(AgentConfig):
    def host_name(self) -> str:
        return "lab gpu 7/rack b"
