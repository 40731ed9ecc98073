"""Which part of each staged interval is new: a device's time is counted once, however many intervals or batches
carry it.

`rollups_hourly.covered` holds, per device and UTC hour, the time already counted. Before a batch is folded into
the rollups, each staged row's [ts, ts + dur) loses what that coverage holds and what earlier rows of the same
device in the batch hold (earlier by start, then by batch order), and what is left is cut at hour boundaries.
The pieces go into a second temporary table, `ingest_piece`, which the rollup and device_status upserts read
instead of the staging table; a row with no piece left is not stored at all.

Consecutive intervals of an agent meet with a few milliseconds of gap or overlap (the start is read from the
wall clock, the length from the monotonic one). Overlaps are removed exactly; gaps shorter than
`GAP_TOLERANCE_S` are closed in the stored coverage, so a steadily reporting device keeps one range per hour
rather than one per interval. The price: an interval that later lands in such a gap is taken as counted.

Only gaps next to a new piece can be new, so each piece's recorded range (`cover`) reaches back over a short gap
to the covered time before it (stored, or an earlier row of the batch) and forward over one to stored coverage
after it; its counted seconds (`new_s`) stay those of the piece itself. The hourly upsert then only adds ranges.

Most rows overlap nothing but the tail of what is stored: an agent sends its intervals in order, each batch after
the last. Each device's row in `device_status` keeps a stretch known to be covered, [covered_from, covered_until),
with nothing covered after it; a row that starts inside or after that stretch, of a device whose staged rows are in
order, is cut by arithmetic alone (the fast path). Only the other rows are checked against `rollups_hourly.covered`.
"""

from __future__ import annotations

GAP_TOLERANCE_S = 1
"""Gaps between covered stretches shorter than this, s, are closed in `rollups_hourly.covered`."""
_TOLERANCE = f"interval '{GAP_TOLERANCE_S} second'"

PIECE_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS ingest_piece (ord int4 NOT NULL, device_id int4 NOT NULL, "
    "ts timestamptz NOT NULL, dur float8 NOT NULL, hour timestamptz NOT NULL, start timestamptz NOT NULL, "
    "new_s float8 NOT NULL, cover tstzrange NOT NULL, mem_used_mib int4, util float4, sm_active float4, "
    "power_w int2, temp_c int2, procs int2, util_source int2 NOT NULL) ON COMMIT DELETE ROWS"
)
"""Per piece: the staged row's order, device, start and length (s); the piece's UTC hour, start, length (s) and
the range it adds to the hour's coverage; the row's figures that the rollups and device_status read."""

_VALUES = "mem_used_mib, util, sm_active, power_w, temp_c, procs, util_source"
_PIECE_COLUMNS = f"ord, device_id, ts, dur, hour, start, new_s, cover, {_VALUES}"


def _cover(before: str, lo: str, hi: str, hour: str, after: str | None) -> str:
    """The range a piece [lo, hi) adds to its hour's coverage: reaching back over a gap under the tolerance to
    `before` (the end of covered time before it, never past the hour's start) and forward over one to `after` (the
    start of stored coverage after it)."""
    upper = (
        hi
        if after is None
        else f"CASE WHEN {after} > {hi} AND {after} < {hi} + {_TOLERANCE} THEN {after} ELSE {hi} END"
    )
    return (
        f"tstzrange(CASE WHEN {before} < {lo} AND {before} > {lo} - {_TOLERANCE} "
        f"THEN greatest({before}, {hour}) ELSE {lo} END, {upper})"
    )


# Every interval is at most 3600 s long (the batch schema's limit), so it touches at most two UTC hours: the one it
# starts in and the next.
#
# Fast path. Each device's `covered_from` and `covered_until` (device_status) say that [covered_from, covered_until)
# is covered and nothing after covered_until is. A row of a device whose staged rows are in order of start (the
# writer's `in_order`) that starts at or after covered_from loses only [ts, greatest(prev_end, covered_until)): its
# earlier rows in the batch cover [ts, prev_end) of it (`prev_end` is the latest end among them, worked out by the
# writer), and the stored coverage [ts, covered_until). That is arithmetic on one row: no sort, no multirange, no
# read of `rollups_hourly`. The stored coverage just before such a piece ends at covered_until, in the piece's hour
# if covered_until falls after the hour's start; nothing stored lies after it.
#
# Checked path, for the other rows (a device out of order, a row that starts before covered_from): the window takes,
# per row, the latest end among the device's earlier checked rows, which start at or before it, so together they
# cover exactly [ts, prev_end) of it. For a device in order its checked rows are the first ones, so nothing earlier is
# missed; a device out of order has all its rows checked. The stored coverage is read once per device-hour, a
# primary-key lookup each (LIMIT keeps the planner from turning the LATERAL into a join that scans the partition, a
# plan the prepared statement would keep as the table grows), then subtracted from each row's part [lo, hi) in that
# hour. A part that starts after everything stored for its hour takes [lo, hi) as it is; only the others pay for a
# multirange difference and its unnest.
PIECE_SQL = f"""
WITH d AS MATERIALIZED (
    SELECT device_id, covered_from, covered_until FROM device_status WHERE device_id = ANY(%(devices)s)
), staged AS MATERIALIZED (
    SELECT s.ord, s.device_id, s.ts, s.dur, {", ".join(f"s.{v}" for v in _VALUES.split(", "))},
           s.ts + s.dur * interval '1 second' AS te, date_trunc('hour', s.ts) AS first_hour, s.prev_end,
           d.covered_until,
           NOT s.in_order OR coalesce(s.ts < d.covered_from, false) AS checked
    FROM ingest_stage s LEFT JOIN d ON d.device_id = s.device_id
), fh AS (
    SELECT f.*, greatest(f.ts, f.prev_end, f.covered_until, f.hour) AS lo,
           least(f.te, f.hour + interval '1 hour') AS hi,
           greatest(f.prev_end, CASE WHEN f.covered_until > f.hour THEN f.covered_until END) AS before
    FROM (
        SELECT *, first_hour AS hour FROM staged WHERE NOT checked
        UNION ALL
        SELECT *, first_hour + interval '1 hour' FROM staged WHERE NOT checked AND te > first_hour + interval '1 hour'
    ) f
), s AS (
    SELECT ord, device_id, ts, dur, {_VALUES}, te,
           max(te) OVER (
               PARTITION BY device_id ORDER BY ts, ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
           ) AS prev_end
    FROM staged WHERE checked
), sh AS (
    SELECT s.*, h.hour, greatest(s.ts, s.prev_end, h.hour) AS lo, least(s.te, h.hour + interval '1 hour') AS hi
    FROM s CROSS JOIN LATERAL (
        VALUES (date_trunc('hour', s.ts)), (date_trunc('hour', s.ts) + interval '1 hour')
    ) h(hour)
    WHERE h.hour < s.te
), c AS (
    SELECT k.device_id, k.hour, r.covered, upper(r.covered) AS covered_end
    FROM (
        SELECT DISTINCT device_id, h.hour FROM s CROSS JOIN LATERAL (
            VALUES (date_trunc('hour', ts)), (date_trunc('hour', te - interval '1 usec'))
        ) h(hour)
    ) k
    JOIN LATERAL (
        SELECT covered FROM rollups_hourly r WHERE r.device_id = k.device_id AND r.hour = k.hour LIMIT 1
    ) r ON r.covered IS NOT NULL
), written AS (
    INSERT INTO ingest_piece ({_PIECE_COLUMNS})
    SELECT ord, device_id, ts, dur, hour, lo, date_part('epoch', hi - lo),
           {_cover("before", "lo", "hi", "hour", None)}, {_VALUES}
    FROM fh WHERE lo < hi
    UNION ALL
    SELECT sh.ord, sh.device_id, sh.ts, sh.dur, sh.hour, lower(p.span),
           date_part('epoch', upper(p.span) - lower(p.span)),
           {_cover("n.before", "lower(p.span)", "upper(p.span)", "sh.hour", "n.after")},
           {", ".join(f"sh.{v}" for v in _VALUES.split(", "))}
    FROM sh
    LEFT JOIN c ON c.device_id = sh.device_id AND c.hour = sh.hour
    CROSS JOIN LATERAL (
        SELECT tstzrange(sh.lo, sh.hi) AS span
        WHERE sh.lo < sh.hi AND (c.covered_end IS NULL OR c.covered_end <= sh.lo)
        UNION ALL
        SELECT u.span FROM unnest(tstzmultirange(tstzrange(sh.lo, greatest(sh.lo, sh.hi))) - c.covered) u(span)
        WHERE c.covered_end > sh.lo
    ) p
    CROSS JOIN LATERAL (
        SELECT greatest(
                   sh.prev_end,
                   CASE WHEN c.covered_end <= lower(p.span) THEN c.covered_end
                        ELSE upper(c.covered * tstzmultirange(tstzrange(NULL, lower(p.span)))) END
               ) AS before,
               CASE WHEN c.covered_end > upper(p.span)
                    THEN lower(c.covered * tstzmultirange(tstzrange(upper(p.span), NULL))) END AS after
    ) n
    RETURNING new_s
)
SELECT (SELECT count(*) FROM staged WHERE checked),
       (SELECT coalesce(sum(dur), 0) FROM staged) - (SELECT coalesce(sum(new_s), 0) FROM written)
"""
"""Fill `ingest_piece` from `ingest_stage` (its devices' ids in the parameter `devices`), device_status's
covered_from and covered_until, and (for checked rows only) the stored coverage; answer how many staged rows took the
checked path, and how many of the staged seconds were counted already (s)."""
