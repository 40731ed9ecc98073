"""An incident made by hand, for the tests of what happens to one (snoozes, the snooze page): of the rule
`idle-gpus` (made at first need), with a pending stop action if asked."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import rules
from app.alerts.schemas import RuleIn, to_rule
from app.alerts.tables import alert_actions, alert_incidents
from app.db import session_scope

HOUR = timedelta(hours=1)
RULE = {"name": "idle-gpus", "condition": "gpu_idle", "for": "2h", "route": {"email": ["a@example.com"]}}


def make_incident(
    sessions: sessionmaker[Session],
    *,
    since: datetime,
    closed_at: datetime | None = None,
    details: Mapping[str, Any] | None = None,
    stop_due: datetime | None = None,
) -> int:
    """A new incident (closed at `closed_at`, if given); `stop_due`: a pending stop of its instance due then."""
    now = datetime.now(UTC)
    with session_scope(sessions) as s:
        rule = rules.get_rule(s, RULE["name"])
        if rule is None:
            rule = rules.create_rule(s, to_rule(RuleIn.model_validate(RULE), source="api"), by="test", now=now)
        values: dict[str, Any] = {
            "rule_id": rule.id,
            "subject": f"gpu:GPU-{now.timestamp()}",
            "since": since,
            "closed_at": closed_at,
        }
        if details is not None:
            values["details"] = dict(details)
        incident = s.execute(insert(alert_incidents).values(**values).returning(alert_incidents.c.id)).scalar_one()
        if stop_due is not None:
            s.execute(
                insert(alert_actions).values(
                    rule_id=rule.id,
                    incident_id=incident,
                    instance_id="i-0abc",
                    dry_run=False,
                    status="pending",
                    due_at=stop_due,
                    by="rule idle-gpus",
                )
            )
    return int(incident)
