"""Imports Cost and Usage Report 2.0 exports into `billed_hours` and `billing_exports` (docs/billing.md,
"Importing"): per export (payer account and month) the GPU instance-hours of its newest delivery, replacing what an
earlier delivery of that month stored.

Every file is read and checked before anything is written: one bad file and nothing is imported. The session's
transaction is the caller's (the CLI's `session_scope`, or the server's scheduled job); nothing here commits.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from .cur import BilledHour, CurReader, Export
from .prices import remake_billed_prices
from .sources import CurFile, SourceError, cur_files
from .tables import billed_hours, billing_exports

STATUSES = ("new", "replaced", "unchanged")

_STAGE = "billing_stage"
_COLUMNS = (
    "instance_id, hour, payer_account, billing_period, usage_account, instance_type, region, availability_zone, "
    "purchase, usage_h, usd, reservation_id, reservation_kind"
)
_TYPES = ["text", "timestamptz", "text", "date", *["text"] * 5, "float8", "float8", "text", "text"]
_UPDATE = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS.split(", ")[2:])


@dataclass(frozen=True)
class ExportResult:
    """What one export holds now: `lines` CUR lines kept, `instance_hours` h costing `usd` USD, the start of its
    newest billed hour, and whether this import stored it for the first time, replaced an earlier delivery of the
    month, or found it unchanged. `warnings`: what could not be priced as the bill says (docs/billing.md)."""

    payer_account: str
    billing_period: date
    status: str
    lines: int
    instance_hours: float
    usd: float
    newest_hour: datetime | None
    warnings: tuple[str, ...] = ()


def digest_of(files: Sequence[CurFile], pricing: Sequence[str] = ()) -> str:
    """SHA-256 over the files' SHA-256s, in sorted order: the same files give the same digest, however listed.
    `pricing`: what the export's prices also depend on, the Capacity Block fees it shares with other months."""
    return hashlib.sha256("".join([*sorted(f.sha256 for f in files), *sorted(pricing)]).encode()).hexdigest()


def import_source(session: Session, source: str) -> list[ExportResult]:
    """Import the CUR 2.0 export(s) under `source` (a local folder or file, or s3://bucket/prefix): the call for the
    CLI and for a scheduled job. Raises SourceError or CurError, having written nothing."""
    with cur_files(source) as files:
        return import_files(session, files)


def import_files(session: Session, files: Sequence[CurFile]) -> list[ExportResult]:
    """Import the given data files, by export; see `import_source`."""
    # One import at a time (the CLI and a scheduled job may overlap): the second waits, then finds the work done.
    session.execute(text("SELECT pg_advisory_xact_lock(hashtext('gpufleet billing import'))"))
    stored = {(r.payer_account, r.billing_period): r for r in session.execute(select(billing_exports)).all()}
    # Every file is read, changed or not: a Capacity Block's fee and hours can be months apart, and a month's prices
    # depend on the others' (see digest_of).
    reader = CurReader()
    of_export: dict[Export, list[CurFile]] = defaultdict(list)
    for f in files:
        for export in reader.read(f.path, f.source):
            of_export[export].append(f)
    for export, group in of_export.items():
        places = sorted({f.delivery for f in group})
        if len(places) > 1:
            raise SourceError(
                group[0].source,
                f"{export[1]:%Y-%m} of payer {export[0]} is billed by two exports, in {places[0]} and {places[1]}: "
                "import one export at a time",
            )
    billed = reader.billed()

    results = []
    for export, group in of_export.items():
        digest = digest_of(group, billed.pricing.get(export, ()))
        before = stored.get(export)
        if before is not None and before.digest == digest:
            results.append(_result(before, "unchanged"))
            continue
        results.append(
            _store(
                session,
                export,
                sorted(group, key=lambda f: f.source),
                digest,
                billed.hours.get(export, []),
                lines=billed.lines.get(export, 0),
                status="new" if before is None else "replaced",
                warnings=tuple(billed.warnings.get(export, ())),
            )
        )
    if any(r.status != "unchanged" for r in results):
        remake_billed_prices(session)
    return sorted(results, key=lambda r: (r.billing_period, r.payer_account))


def _result(row: Any, status: str) -> ExportResult:
    return ExportResult(
        row.payer_account, row.billing_period, status, row.lines, row.instance_hours, row.usd, row.newest_hour
    )


def _store(
    session: Session,
    export: Export,
    files: list[CurFile],
    digest: str,
    hours: list[BilledHour],
    *,
    lines: int,
    status: str,
    warnings: tuple[str, ...],
) -> ExportResult:
    """Replace the export's stored hours with `hours` and record the export, in the session's transaction."""
    payer, period = export
    session.execute(
        delete(billed_hours).where(billed_hours.c.payer_account == payer, billed_hours.c.billing_period == period)
    )
    _copy(session, hours)
    result = ExportResult(
        payer,
        period,
        status,
        lines,
        sum(h.usage_h for h in hours),
        sum(h.usd for h in hours),
        max((h.hour for h in hours), default=None),
        warnings,
    )
    values = {
        "payer_account": payer,
        "billing_period": period,
        "files": [{"source": f.source, "sha256": f.sha256, "bytes": f.bytes} for f in files],
        "digest": digest,
        "lines": lines,
        "instance_hours": result.instance_hours,
        "usd": result.usd,
        "newest_hour": result.newest_hour,
        "imported_at": func.now(),
    }
    upsert = pg_insert(billing_exports).values(**values)
    session.execute(
        upsert.on_conflict_do_update(
            constraint="pk_billing_exports",
            set_={k: upsert.excluded[k] for k in values if k not in ("payer_account", "billing_period")},
        )
    )
    return result


def _copy(session: Session, hours: list[BilledHour]) -> None:
    """COPY the hours into a staging table, then into billed_hours. An hour already stored under another export
    (an instance whose account moved to another payer) is taken over by this one."""
    dbapi: Any = session.connection().connection
    with dbapi.cursor() as cur:
        cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} (LIKE billed_hours) ON COMMIT DROP")
        cur.execute(f"TRUNCATE {_STAGE}")
        with cur.copy(f"COPY {_STAGE} ({_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(_TYPES)
            for h in hours:
                copy.write_row(
                    (h.instance_id, h.hour, h.payer_account, h.billing_period, h.usage_account, h.instance_type,
                     h.region, h.availability_zone, h.purchase, h.usage_h, h.usd, h.reservation_id,
                     h.reservation_kind)
                )  # fmt: skip
    session.execute(
        text(
            f"INSERT INTO billed_hours ({_COLUMNS}) SELECT {_COLUMNS} FROM {_STAGE} "
            f"ON CONFLICT (instance_id, hour) DO UPDATE SET {_UPDATE}"
        )
    )


__all__ = ["STATUSES", "ExportResult", "digest_of", "import_files", "import_source"]
