"""The signed instance identity: read from IMDSv2, sent by the agent's poster, accepted by the real server."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.identify import IdentityResolver
from agent.identify.identity import AUTO_RETRY_S
from agent.send import Poster
from app.demo.signer import DEMO_ACCOUNT
from app.ingest.identity import load_certificates, verify_identity
from app.settings import Settings
from tests.agent.imds_server import DEFAULT_METADATA, ImdsServer, shared_signer
from tests.agent.live_server import LiveServer
from tests.factories import batch, gpu


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def trusted(tmp_path: Path) -> Path:
    return shared_signer().write_certificate(tmp_path / "trusted.pem")


def test_the_agent_reads_a_signed_identity_the_server_verifies(trusted: Path) -> None:
    with ImdsServer() as imds:
        resolver = IdentityResolver(AgentConfig(imds="on", imds_url=imds.url))
        resolver.identity()
        header = resolver.signed_identity()
        assert header is not None
        assert resolver.signed_identity() == header
        # Read once: the document does not change while the instance runs.
        assert imds.count("dynamic/instance-identity/signature") == 1
    identity = verify_identity(header, accounts=frozenset({DEMO_ACCOUNT}), keys=load_certificates(trusted))
    assert identity.instance_id == DEFAULT_METADATA["instance-id"] and identity.account_id == DEMO_ACCOUNT


def test_no_signed_identity_off_ec2_or_without_a_document() -> None:
    assert IdentityResolver(AgentConfig(imds="off", host_id="rack-7")).signed_identity() is None
    clock = FakeClock()
    with ImdsServer(signed=False) as imds:
        resolver = IdentityResolver(AgentConfig(imds="on", imds_url=imds.url), clock=clock)
        resolver.identity()
        assert resolver.signed_identity() is None
        assert resolver.signed_identity() is None
        assert imds.count("dynamic/instance-identity/document") == 1
        clock.now += AUTO_RETRY_S
        assert resolver.signed_identity() is None
        assert imds.count("dynamic/instance-identity/document") == 2


@pytest.fixture
def identity_server(settings: Settings, engine: object, trusted: Path) -> Iterator[LiveServer]:
    configured = settings.model_copy(update={"identity_accounts": [DEMO_ACCOUNT], "identity_extra_certs": trusted})
    with LiveServer(configured) as server:
        yield server


def body(instance_id: str) -> bytes:
    return gzip.compress(json.dumps(batch([gpu(0)], instance_id=instance_id)).encode())


def test_an_agent_on_ec2_posts_with_its_signed_identity_and_no_token(identity_server: LiveServer) -> None:
    url = identity_server.url + "/api/v1/ingest"
    with ImdsServer() as imds:
        resolver = IdentityResolver(AgentConfig(imds="on", imds_url=imds.url))
        resolver.identity()
        poster = Poster(url, None)
        poster.identity = resolver.signed_identity
        assert poster.post(body(DEFAULT_METADATA["instance-id"])).kind == "stored"
    # Off EC2 without a token there is nothing to authenticate with.
    off = Poster(url, None)
    off.identity = IdentityResolver(AgentConfig(imds="off", host_id="rack-7")).signed_identity
    outcome = off.post(body("rack-7"))
    assert (outcome.kind, outcome.status) == ("auth", 401)
