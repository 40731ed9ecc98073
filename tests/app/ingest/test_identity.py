"""Who may report an instance: the signed EC2 identity, instance-bound tokens, fleet tokens; and GPU moves.

The server here trusts AWS's shipped certificates plus the test signer's (GPUFLEET_IDENTITY_EXTRA_CERTS), and
accepts identities of one account.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from agent.identify.signed import header_value
from app.auth import create_token
from app.db import session_scope
from app.demo.signer import DEMO_ACCOUNT, IdentitySigner
from app.ingest.identity import IDENTITY_HEADER, aws_keys
from app.main import create_app
from app.models import Gpu, IngestBatch, Instance, MigSlice, samples
from app.settings import Settings
from tests.agent.imds_server import shared_signer
from tests.factories import batch, gpu, mig_slice

URL = "/api/v1/ingest"
A = "i-0aaaaaaaaaaaaaaa1"
B = "i-0bbbbbbbbbbbbbbb2"


@pytest.fixture(scope="module")
def signer() -> IdentitySigner:
    return shared_signer()


@pytest.fixture(scope="module")
def identity_client(
    settings: Settings, engine: Engine, signer: IdentitySigner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    cert = signer.write_certificate(tmp_path_factory.mktemp("identity") / "trusted.pem")
    configured = settings.model_copy(update={"identity_accounts": [DEMO_ACCOUNT], "identity_extra_certs": cert})
    with TestClient(create_app(configured)) as c:
        yield c


@pytest.fixture
def api(identity_client: TestClient) -> TestClient:
    identity_client.app.state.gpufleet.inventory.clear()  # type: ignore[attr-defined]
    return identity_client


def token(sessions: sessionmaker[Session], name: str, instance_id: str | None = None) -> str:
    with session_scope(sessions) as s:
        _token, secret = create_token(s, name=name, scope="ingest", instance_id=instance_id)
    return secret


def signed(signer: IdentitySigner, instance_id: str, **document: str) -> dict[str, str]:
    text = signer.document(instance_id, **document)
    return {IDENTITY_HEADER: header_value(text, signer.sign(text))}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def post(api: TestClient, body: dict[str, Any], headers: dict[str, str]) -> Any:
    return api.post(URL, json=body, headers=headers)


def field_of(answer: Any) -> str:
    return str(answer.json()["detail"][0]["field"])


def owner(sessions: sessionmaker[Session], uuid: str) -> str:
    with session_scope(sessions) as s:
        return str(
            s.scalar(select(Instance.instance_id).join(Gpu, Gpu.instance_pk == Instance.id).where(Gpu.uuid == uuid))
        )


def counts(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with session_scope(sessions) as s:
        return (
            int(s.scalar(select(func.count()).select_from(IngestBatch)) or 0),
            int(s.scalar(select(func.count()).select_from(samples)) or 0),
        )


def test_the_shipped_aws_certificates_load() -> None:
    assert len(aws_keys()) >= 10


def test_identity_alone_authenticates_and_binds_the_instance(
    api: TestClient, sessions: sessionmaker[Session], signer: IdentitySigner
) -> None:
    answer = post(api, batch([gpu(0)], instance_id=A), signed(signer, A))
    assert answer.status_code == 200, answer.text
    with session_scope(sessions) as s:
        assert s.scalar(select(Instance.identity_account_id).where(Instance.instance_id == A)) == DEMO_ACCOUNT
        assert s.scalar(select(IngestBatch.token_id)) is None


def test_a_fleet_token_cannot_report_an_identity_bound_instance(
    api: TestClient, sessions: sessionmaker[Session], signer: IdentitySigner
) -> None:
    assert post(api, batch([gpu(0)], instance_id=A), signed(signer, A)).status_code == 200
    before = counts(sessions)
    answer = post(api, batch([gpu(0)], instance_id=A), bearer(token(sessions, "fleet")))
    assert answer.status_code == 403 and field_of(answer) == "instance.instance_id", answer.text
    assert counts(sessions) == before


def test_a_fleet_token_cannot_steal_the_gpus_of_an_identity_bound_instance(
    api: TestClient, sessions: sessionmaker[Session], signer: IdentitySigner
) -> None:
    victim = [gpu(0), gpu(1, mig=True, slices=[mig_slice(1)])]
    assert post(api, batch(victim, instance_id=A), signed(signer, A)).status_code == 200
    before = counts(sessions)
    fleet = bearer(token(sessions, "fleet"))
    answer = post(api, batch([gpu(0), victim[1]], instance_id=B), fleet)
    assert answer.status_code == 403 and field_of(answer) == "gpus[1].uuid", answer.text
    # A MIG device named under a GPU of the sender's own is refused the same way.
    stolen_slice = gpu(0, mig=True, slices=[dict(victim[1]["slices"][0])])
    answer = post(api, batch([stolen_slice], instance_id=B), fleet)
    assert answer.status_code == 403 and field_of(answer) == "gpus[0].slices[0].uuid", answer.text
    assert counts(sessions) == before
    assert owner(sessions, victim[1]["uuid"]) == A
    with session_scope(sessions) as s:
        assert s.scalar(select(Instance.id).where(Instance.instance_id == B)) is None
        assert s.scalar(select(func.count()).select_from(MigSlice).where(MigSlice.retired_at.is_(None))) == 1


def test_an_instance_bound_token_reports_only_its_instance(api: TestClient, sessions: sessionmaker[Session]) -> None:
    own = bearer(token(sessions, "a-only", instance_id=A))
    assert post(api, batch([gpu(0)], instance_id=A), own).status_code == 200
    answer = post(api, batch([gpu(0)], instance_id=B), own)
    assert answer.status_code == 403 and field_of(answer) == "instance.instance_id", answer.text
    assert "a-only" in answer.json()["detail"][0]["message"]


def test_a_fleet_token_cannot_report_an_instance_that_has_a_token_of_its_own(
    api: TestClient, sessions: sessionmaker[Session]
) -> None:
    token(sessions, "a-only", instance_id=A)
    answer = post(api, batch([gpu(0)], instance_id=A), bearer(token(sessions, "fleet")))
    assert answer.status_code == 403 and field_of(answer) == "instance.instance_id", answer.text


def test_an_instance_bound_token_cannot_take_gpus_from_another_instance(
    api: TestClient, sessions: sessionmaker[Session]
) -> None:
    fleet = bearer(token(sessions, "fleet"))
    moved = gpu(0)
    assert post(api, batch([moved], instance_id=B), fleet).status_code == 200
    answer = post(api, batch([moved], instance_id=A), bearer(token(sessions, "a-only", instance_id=A)))
    assert answer.status_code == 403 and field_of(answer) == "gpus[0].uuid", answer.text
    assert owner(sessions, moved["uuid"]) == B


def test_a_fleet_token_still_moves_gpus_between_instances_it_reports(
    api: TestClient, sessions: sessionmaker[Session]
) -> None:
    fleet = bearer(token(sessions, "fleet"))
    moved = gpu(0)
    assert post(api, batch([moved], instance_id=B), fleet).status_code == 200
    assert post(api, batch([moved], instance_id=A), fleet).status_code == 200
    assert owner(sessions, moved["uuid"]) == A


def test_a_verified_identity_moves_a_gpu(
    api: TestClient, sessions: sessionmaker[Session], signer: IdentitySigner
) -> None:
    moved = gpu(0)
    assert post(api, batch([moved], instance_id=A), signed(signer, A)).status_code == 200
    # Instance A stopped; B starts on the same host and reports the GPU with its own signed identity.
    answer = post(api, batch([moved], instance_id=B), signed(signer, B))
    assert answer.status_code == 200, answer.text
    assert owner(sessions, moved["uuid"]) == B


def test_identity_naming_another_instance_is_refused(
    api: TestClient, sessions: sessionmaker[Session], signer: IdentitySigner
) -> None:
    answer = post(api, batch([gpu(0)], instance_id=B), signed(signer, A))
    assert answer.status_code == 403 and field_of(answer) == "instance.instance_id", answer.text
    assert counts(sessions) == (0, 0)


def test_identity_of_another_account_is_refused(api: TestClient, signer: IdentitySigner) -> None:
    answer = post(api, batch([gpu(0)], instance_id=A), signed(signer, A, account_id="210987654321"))
    assert answer.status_code == 403 and field_of(answer) == f"{IDENTITY_HEADER}.accountId", answer.text


def test_an_altered_document_is_refused(api: TestClient, signer: IdentitySigner) -> None:
    text = signer.document(A)
    signature = signer.sign(text)
    altered = json.dumps(dict(json.loads(text), instanceId=B), indent=2)
    answer = post(api, batch([gpu(0)], instance_id=B), {IDENTITY_HEADER: header_value(altered, signature)})
    assert answer.status_code == 401 and field_of(answer) == f"{IDENTITY_HEADER}.signature", answer.text


def test_a_document_signed_by_an_untrusted_key_is_refused(api: TestClient) -> None:
    forger = IdentitySigner(key_bits=1024)
    answer = post(api, batch([gpu(0)], instance_id=A), signed(forger, A))
    assert answer.status_code == 401 and field_of(answer) == f"{IDENTITY_HEADER}.signature", answer.text


@pytest.mark.parametrize("value", ["not-an-identity", "e30=", "!!!.???", "e30=." + base64.b64encode(b"x").decode()])
def test_a_malformed_identity_header_is_refused(api: TestClient, value: str) -> None:
    answer = post(api, batch([gpu(0)], instance_id=A), {IDENTITY_HEADER: value})
    assert answer.status_code == 401 and field_of(answer).startswith(IDENTITY_HEADER), answer.text


def test_identity_is_ignored_where_no_account_is_configured(
    client: TestClient, sessions: sessionmaker[Session], signer: IdentitySigner
) -> None:
    answer = post(client, batch([gpu(0)], instance_id=A), signed(signer, A))
    assert answer.status_code == 401
    answer = post(client, batch([gpu(0)], instance_id=A), {**signed(signer, A), **bearer(token(sessions, "fleet"))})
    assert answer.status_code == 200, answer.text


def test_extra_certificates_that_do_not_load_are_refused_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="no PEM certificate"):
        Settings(identity_extra_certs=bad)
    with pytest.raises(ValueError, match="12 digits"):
        Settings(identity_accounts="12345")  # type: ignore[arg-type]
