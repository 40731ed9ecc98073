"""A second start of the demo: each instance's history carries on from its own newest data, with no gap and no
interval written twice."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.demo import history
from app.demo.fleet import DAY, STORIES, make_fleet
from tests.app.demo.conftest import last_wednesday_afternoon

FINE_S = 60


def test_a_top_up_carries_on_where_each_instance_stopped(module_sessions: sessionmaker[Session]) -> None:
    epoch = last_wednesday_afternoon()
    fleet = make_fleet(len(STORIES), seed=5, epoch=epoch)
    hosts = history.make_hosts(fleet, FINE_S)
    history.register(module_sessions, hosts, first=epoch - DAY)
    stopped = epoch - 17.5  # the last run stopped between two intervals
    history.write_history(
        module_sessions,
        fleet,
        hosts,
        starts={h.inst.instance_id: float(epoch - DAY) for h in hosts},
        end=stopped,
        fine_s=FINE_S,
        mem_held_mib=256,
    )
    seen = history.last_seen(module_sessions)
    # The Capacity Block's instance ended days before: it has nothing to top up.
    on_demand = [i for i in fleet.instances if not i.spot and fleet.block(i) is None]
    assert all(seen[i.instance_id] == stopped for i in on_demand)

    history.write_history(module_sessions, fleet, hosts, starts=seen, end=epoch + 600, fine_s=FINE_S, mem_held_mib=256)
    assert all(history.last_seen(module_sessions)[i.instance_id] == epoch + 600 for i in on_demand)
    g5 = next(i for i in fleet.instances if i.scenario == "g5-forgotten")
    sql = text(
        "SELECT s.ts FROM samples s JOIN gpus g ON g.id = s.device_id JOIN instances i ON i.id = g.instance_pk "
        "WHERE i.instance_id = :i AND s.ts >= :t ORDER BY s.ts"
    )
    with module_sessions() as session:
        starts = [ts.timestamp() for ts in session.scalars(sql, {"i": g5.instance_id, "t": _utc(epoch - 120)})]
        doubled = session.scalar(
            text("SELECT count(*) FROM (SELECT 1 FROM samples GROUP BY device_id, ts HAVING count(*) > 1) d")
        )
    # The interval cut short at the stop, the rest of it, then whole ones on the grid.
    assert starts == [epoch - 120, epoch - 60, stopped, *(epoch + k * FINE_S for k in range(10))]
    assert doubled == 0


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)
