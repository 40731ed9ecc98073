"""Snoozing an incident: recorded, `snoozed_until` set (the latest snooze wins), pending stop actions cancelled,
nothing written for a closed or unknown incident; and the key that signs snooze links, from the settings or made
once and kept in the database for every process."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import snooze
from app.alerts.tables import alert_actions, alert_incidents, alert_signing_key, alert_snoozes
from app.db import session_scope
from app.settings import Settings
from tests.app.alerts.made import HOUR
from tests.app.alerts.made import make_incident as made_incident

NOW = datetime.now(UTC).replace(microsecond=0)


def make_incident(sessions: sessionmaker[Session], *, closed: bool = False, stop_pending: bool = False) -> int:
    return made_incident(
        sessions,
        since=NOW - 5 * HOUR,
        closed_at=NOW - timedelta(minutes=1) if closed else None,
        stop_due=NOW + HOUR if stop_pending else None,
    )


def snoozes(sessions: sessionmaker[Session], incident: int) -> list[Any]:
    with sessions() as s:
        return list(s.execute(select(alert_snoozes).where(alert_snoozes.c.incident_id == incident).order_by("id")))


def snoozed_until(sessions: sessionmaker[Session], incident: int) -> datetime | None:
    with sessions() as s:
        return s.scalar(select(alert_incidents.c.snoozed_until).where(alert_incidents.c.id == incident))


def actions(sessions: sessionmaker[Session], incident: int) -> list[Any]:
    with sessions() as s:
        return list(s.execute(select(alert_actions).where(alert_actions.c.incident_id == incident)))


# Snoozing --------------------------------------------------------------------------------------------------------


def test_a_snooze_is_recorded_sets_snoozed_until_and_cancels_the_pending_stop(
    sessions: sessionmaker[Session],
) -> None:
    incident = make_incident(sessions, stop_pending=True)
    until = NOW + timedelta(days=1)
    with session_scope(sessions) as s:
        done = snooze.snooze_incident(
            s, incident, until=until, reason="  training resumes Monday ", by="ada (snooze link)", now=NOW
        )
    assert done.cancelled_actions == 1
    assert done.snooze.rule == "idle-gpus" and done.snooze.subject.startswith("gpu:GPU-")
    [row] = snoozes(sessions, incident)
    assert (row.until, row.reason, row.by, row.created_at) == (
        until,
        "training resumes Monday",
        "ada (snooze link)",
        NOW,
    )
    assert snoozed_until(sessions, incident) == until
    [action] = actions(sessions, incident)
    assert action.status == "cancelled" and action.by == "ada (snooze link)"
    assert action.detail == f"snoozed until {until:%Y-%m-%d %H:%M} UTC: training resumes Monday"
    assert action.done_at == NOW


def test_snoozing_again_is_recorded_too_and_the_latest_wins(sessions: sessionmaker[Session]) -> None:
    incident = make_incident(sessions)
    week, day = NOW + timedelta(weeks=1), NOW + timedelta(days=1, minutes=5)
    with session_scope(sessions) as s:
        snooze.snooze_incident(s, incident, until=week, reason="away", by="snooze link", now=NOW)
    with session_scope(sessions) as s:
        again = snooze.snooze_incident(
            s, incident, until=day, reason=None, by="snooze link", now=NOW + timedelta(minutes=5)
        )
    assert again.cancelled_actions == 0
    assert [(r.until, r.reason) for r in snoozes(sessions, incident)] == [(week, "away"), (day, None)]
    assert snoozed_until(sessions, incident) == day
    with sessions() as s:
        shown = snooze.recent_snoozes(s, limit=10)
        assert [x.until for x in shown] == [day, week]
        assert snooze.recent_snoozes(s, limit=10, incident_id=incident + 1) == []


def test_a_closed_incident_is_not_snoozed_and_nothing_is_written(sessions: sessionmaker[Session]) -> None:
    incident = make_incident(sessions, closed=True, stop_pending=True)
    with session_scope(sessions) as s, pytest.raises(snooze.IncidentClosed, match="nothing to snooze"):
        snooze.snooze_incident(s, incident, until=NOW + timedelta(days=1), reason="x", by="snooze link", now=NOW)
    assert snoozes(sessions, incident) == [] and snoozed_until(sessions, incident) is None
    assert [a.status for a in actions(sessions, incident)] == ["pending"]


def test_an_unknown_incident_is_not_snoozed(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as s, pytest.raises(snooze.UnknownIncident, match="rule may have been deleted"):
        snooze.snooze_incident(s, 999, until=NOW + timedelta(days=1), reason="x", by="snooze link", now=NOW)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(alert_snoozes)) == 0


def test_a_snooze_ends_after_it_starts(sessions: sessionmaker[Session]) -> None:
    incident = make_incident(sessions)
    with sessions() as s, pytest.raises(ValueError, match="ends after it starts"):
        snooze.snooze_incident(s, incident, until=NOW, reason="x", by="snooze link", now=NOW)


def test_a_snooze_waits_for_the_incident_to_close_and_then_records_nothing(sessions: sessionmaker[Session]) -> None:
    """The evaluation closing the incident and a snooze at the same moment: one after the other, by the row lock."""
    incident = make_incident(sessions)
    outcome: list[object] = []
    closing = sessions()
    closing.execute(alert_incidents.update().where(alert_incidents.c.id == incident).values(closed_at=NOW))

    def snooze_now() -> None:
        with sessions() as s:
            try:
                snooze.snooze_incident(s, incident, until=NOW + timedelta(days=1), reason="x", by="link", now=NOW)
                s.commit()
                outcome.append("snoozed")
            except snooze.IncidentClosed as exc:
                outcome.append(exc)

    worker = threading.Thread(target=snooze_now)
    worker.start()
    worker.join(0.5)
    assert worker.is_alive(), "the snooze should wait for the closing transaction"
    closing.commit()
    closing.close()
    worker.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], snooze.IncidentClosed)
    assert snoozes(sessions, incident) == []


# The signing key -------------------------------------------------------------------------------------------------


def key_rows(sessions: sessionmaker[Session]) -> list[bytes]:
    with sessions() as s:
        return [bytes(k) for k in s.scalars(select(alert_signing_key.c.key))]


def test_the_key_of_the_settings_is_used_when_set(sessions: sessionmaker[Session], settings: Settings) -> None:
    configured = settings.model_copy(update={"alerts_signing_key": "s" * 40})
    with session_scope(sessions) as s:
        assert snooze.signing_key(s, configured) == b"s" * 40
    assert key_rows(sessions) == []  # none made


def test_a_key_is_made_once_and_kept(sessions: sessionmaker[Session], settings: Settings) -> None:
    with session_scope(sessions) as s:
        first = snooze.signing_key(s, settings)
    assert len(first) == snooze.KEY_BYTES and key_rows(sessions) == [first]
    with session_scope(sessions) as s:
        assert snooze.signing_key(s, settings) == first
    # A key made in a transaction that is rolled back is not kept: no message went out signed with it.
    with sessions() as s:
        s.execute(text("DELETE FROM alert_signing_key"))
        made = snooze.signing_key(s, settings)
        s.rollback()
    assert key_rows(sessions) == [first] and made != first


def test_processes_making_a_key_at_once_all_use_the_first(sessions: sessionmaker[Session], settings: Settings) -> None:
    first = sessions()
    mine = snooze.signing_key(first, settings)  # inserted, not committed yet
    theirs: list[bytes] = []
    worker = threading.Thread(target=lambda: theirs.append(_key_in_own_transaction(sessions, settings)))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive(), "the second insert should wait for the first transaction"
    first.commit()
    first.close()
    worker.join(10)
    assert theirs == [mine] and key_rows(sessions) == [mine]


def _key_in_own_transaction(sessions: sessionmaker[Session], settings: Settings) -> bytes:
    with session_scope(sessions) as s:
        return snooze.signing_key(s, settings)
