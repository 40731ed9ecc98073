"""The simulated instance metadata: each agent finds its own instance through its real IMDSv2 client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.identify import IdentityResolver
from agent.identify.imds import ImdsClient
from app.demo.agents import SimulatedHostConfig
from app.demo.fleet import STORIES, DemoFleet, make_fleet
from app.demo.imds import MetadataServer


@pytest.fixture
def fleet() -> DemoFleet:
    return make_fleet(len(STORIES), seed=3, epoch=1_768_402_800)


@pytest.fixture
def metadata(fleet: DemoFleet) -> Iterator[MetadataServer]:
    server = MetadataServer({i.instance_id: (i.metadata(), i.tags) for i in fleet.instances}).start()
    yield server
    server.stop()


def test_the_agent_resolves_each_instance_as_the_history_describes_it(
    fleet: DemoFleet, metadata: MetadataServer
) -> None:
    for inst in fleet.instances:
        config = SimulatedHostConfig(imds="on", imds_url=metadata.url_for(inst.instance_id), hostname=inst.hostname)
        found = IdentityResolver(config).identity()
        assert found.source == "imds"
        assert found.to_wire() == inst.identity().to_wire()


def test_tokens_are_required_and_unknown_instances_are_not_found(fleet: DemoFleet, metadata: MetadataServer) -> None:
    inst = fleet.instances[0]
    assert metadata.answer("GET", f"/{inst.instance_id}/latest/meta-data/instance-id", {}) == (401, "")
    status, token = metadata.answer(
        "PUT", f"/{inst.instance_id}/latest/api/token", {"x-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    assert status == 200
    headers = {"x-aws-ec2-metadata-token": token}
    assert metadata.answer("GET", f"/{inst.instance_id}/latest/meta-data/instance-id", headers) == (
        200,
        inst.instance_id,
    )
    assert metadata.answer("GET", f"/{inst.instance_id}/latest/meta-data/spot/instance-action", headers)[0] == 404
    assert metadata.answer("GET", "/i-0unknown/latest/meta-data/instance-id", headers)[0] == 404
    client = ImdsClient(metadata.url_for(inst.instance_id))
    assert client.get("tags/instance/team") == inst.tags["team"]
