"""The instance page says what may report the instance, and the batches its agent set aside or dropped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from app.auth import create_token
from app.models import Instance
from tests import factories


def _identity_text(client: TestClient, instance_id: str) -> str:
    r = client.get(f"/instances/{instance_id}?window=24h")
    assert r.status_code == 200, r.text[:500]
    section = BeautifulSoup(r.text, "html.parser").select_one("section.identity")
    assert section is not None
    return section.get_text(" ", strip=True)


def _post(client: TestClient, token: str, body: dict[str, object]) -> None:
    r = client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text


def test_a_fleet_token_instance_shows_its_set_aside_and_dropped_batches(client: TestClient, ingest_token: str) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    body = factories.batch([factories.gpu(0)])
    body["agent"] = {"version": "test", "dropped_batches": 3}
    body["events"] = [
        {
            "ts": (now - timedelta(minutes=5)).isoformat(),
            "kind": "batch_set_aside",
            "details": {"batch_id": "b", "tries": 5, "status": 500, "error": "boom", "set_aside_now": 2},
        },
        {
            "ts": (now - timedelta(minutes=4)).isoformat(),
            "kind": "batch_set_aside",
            "details": {"batch_id": "c", "tries": 5, "status": 500, "error": "boom", "set_aside_now": 1},
        },
    ]
    _post(client, ingest_token, body)
    text = _identity_text(client, body["instance"]["instance_id"])
    assert "Reports with any fleet-wide ingest token" in text
    assert "2 batches set aside in this window" in text
    assert "1 waiting at the agent's last report" in text
    assert "3 batches dropped by the agent's spool" in text


def test_an_instance_with_its_own_token_says_so_and_shows_no_delivery_line(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    instance_id = "i-0fedcba9876543210"
    with sessions.begin() as session:
        _token, secret = create_token(session, name="node-7", scope="ingest", instance_id=instance_id)
    _post(client, secret, factories.batch([factories.gpu(0)], instance_id=instance_id))
    text = _identity_text(client, instance_id)
    assert "Reports with its own ingest token 'node-7'" in text
    assert "Delivery" not in text


def test_an_identity_bound_instance_names_the_account(
    client: TestClient, ingest_token: str, sessions: sessionmaker[Session]
) -> None:
    body = factories.batch([factories.gpu(0)])
    _post(client, ingest_token, body)
    with sessions.begin() as session:
        session.execute(update(Instance).values(identity_account_id="123456789012"))
    text = _identity_text(client, body["instance"]["instance_id"])
    assert "Reports with its signed EC2 instance identity (account 123456789012)" in text
