"""Who may report an instance, and who may move a GPU from one instance to another.

A batch is posted by a reporter: a verified instance identity, an ingest token bound to one instance, or a
fleet-wide ingest token. The rules (docs/ingest-protocol.md, "Authentication"):

- an identity reports only the instance its signed document names;
- a bound token reports only its instance;
- an instance once reported with a verified identity may afterwards be reported only with one, and an
  instance that has a live bound token only with that token (or an identity);
- a fleet token reports any other instance;
- a GPU or MIG device that is on another instance moves to the batch's instance only if the reporter may also
  report that other instance, or the batch is identity-verified (a real move: the signed identity says which
  instance now holds the hardware).

Everything here runs in the batch's transaction, before anything is written, so a refused batch leaves no row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from sqlalchemy import exists, select, union_all, update
from sqlalchemy.orm import Session
from starlette.datastructures import Headers

from ..auth import authenticate
from ..errors import ApiError, FieldProblem
from ..models import ApiToken, Gpu, Instance, MigSlice
from ..settings import Settings
from .identity import IDENTITY_HEADER, InstanceIdentity, trusted_keys, verify_identity
from .schemas import IngestBatchIn


@dataclass(frozen=True)
class Reporter:
    """Who posts a batch. Exactly one of `identity` and `token_id` is set."""

    identity: InstanceIdentity | None = None
    token_id: int | None = None
    token_name: str | None = None
    bound_instance: str | None = None
    """For a token bound to one instance: that instance id."""

    def describe(self) -> str:
        if self.identity is not None:
            return f"the signed identity of {self.identity.instance_id}"
        if self.bound_instance is not None:
            return f"token {self.token_name!r}, bound to {self.bound_instance}"
        return f"fleet token {self.token_name!r}"


def _identity(headers: Headers, settings: Settings) -> InstanceIdentity | None:
    header = headers.get(IDENTITY_HEADER)
    if not header or not settings.identity_accounts:
        # Identity is off: the header is ignored, so agents may send it before the server accepts it.
        return None
    return _verified(header, frozenset(settings.identity_accounts), settings.identity_extra_certs)


# An instance sends the same header with every batch, and each request checks it twice (before the body is read,
# then in the transaction): remember headers that verified, one per instance. A refused one is not remembered.
@lru_cache(maxsize=4096)
def _verified(header: str, accounts: frozenset[str], extra_certs: Path | None) -> InstanceIdentity:
    return verify_identity(header, accounts=accounts, keys=trusted_keys(extra_certs))


def admit_identity(headers: Headers, settings: Settings) -> bool:
    """Before the body is read: True when the request authenticates with a verified identity (no token is
    needed then), False when it brings none; ApiError 401/403 for an identity that does not verify."""
    return _identity(headers, settings) is not None


def authenticate_reporter(session: Session, headers: Headers, settings: Settings, *, now: datetime) -> Reporter:
    """The reporter behind an ingest request: a verified `X-Gpufleet-Instance-Identity` when identity is enabled
    (GPUFLEET_IDENTITY_ACCOUNTS set) and the header is sent, else the bearer token (ApiError 401/403)."""
    identity = _identity(headers, settings)
    if identity is not None:
        return Reporter(identity=identity)
    caller = authenticate(session, headers.get("authorization"), needed="ingest", now=now)
    return Reporter(token_id=caller.token_id, token_name=caller.name, bound_instance=caller.instance_id)


@dataclass(frozen=True)
class Binding:
    """What the database said about the batch's instance before the batch: the account of its identity, if it
    was ever reported with one."""

    identity_account_id: str | None


def _forbidden(field: str, message: str) -> ApiError:
    return ApiError(403, "not allowed to report this", [FieldProblem(field, message)])


def check_reporter(
    session: Session, batch: IngestBatchIn, reporter: Reporter, *, inventory_known: bool = False
) -> Binding:
    """Refuse (403, naming the field) a batch its reporter may not send; see the module's rules.
    `inventory_known`: this instance's last stored batch listed the very same devices (the ingest inventory
    cache says so), so the batch moves nothing and the devices need no look-up. (A device another instance took
    since then is not moved back; its samples from this instance go to it until the cache entry expires, 5 min.)"""
    instance_id = batch.instance.instance_id
    if reporter.identity is not None and reporter.identity.instance_id != instance_id:
        raise _forbidden(
            "instance.instance_id",
            f"the signed identity is that of {reporter.identity.instance_id}, not {instance_id}",
        )
    if reporter.bound_instance is not None and reporter.bound_instance != instance_id:
        raise _forbidden(
            "instance.instance_id", f"token {reporter.token_name!r} may report only {reporter.bound_instance}"
        )
    account, has_bound_token = session.execute(
        select(
            select(Instance.identity_account_id).where(Instance.instance_id == instance_id).scalar_subquery(),
            exists().where(ApiToken.instance_id == instance_id, ApiToken.revoked_at.is_(None)),
        )
    ).one()
    if reporter.identity is None:
        if account is not None:
            raise _forbidden(
                "instance.instance_id",
                f"{instance_id} reports with its signed instance identity; {reporter.describe()} may not report it",
            )
        if has_bound_token and reporter.bound_instance is None:
            raise _forbidden(
                "instance.instance_id",
                f"{instance_id} has a token of its own; {reporter.describe()} may not report it",
            )
    if reporter.identity is None and not inventory_known:
        _check_moves(session, batch, reporter)
    return Binding(identity_account_id=account)


def _check_moves(session: Session, batch: IngestBatchIn, reporter: Reporter) -> None:
    """Refuse a batch that would take a device from an instance its reporter may not report."""
    positions: dict[str, str] = {}
    for i, gpu in enumerate(batch.gpus):
        positions.setdefault(gpu.uuid, f"gpus[{i}].uuid")
        for j, sl in enumerate(gpu.slices):
            positions.setdefault(sl.uuid, f"gpus[{i}].slices[{j}].uuid")
    if not positions:
        return
    here = batch.instance.instance_id
    gpu_rows = (
        select(Gpu.uuid, Instance.instance_id, Instance.identity_account_id)
        .join(Instance, Instance.id == Gpu.instance_pk)
        .where(Gpu.uuid.in_(positions), Instance.instance_id != here)
    )
    slice_rows = (
        select(MigSlice.uuid, Instance.instance_id, Instance.identity_account_id)
        .join(Gpu, Gpu.id == MigSlice.gpu_pk)
        .join(Instance, Instance.id == Gpu.instance_pk)
        .where(MigSlice.uuid.in_(positions), MigSlice.retired_at.is_(None), Instance.instance_id != here)
    )
    elsewhere = session.execute(union_all(gpu_rows, slice_rows)).all()
    if not elsewhere:
        return
    # A bound token reports one instance only, which is never another one: it moves nothing.
    bound_elsewhere: set[str] = set()
    if reporter.bound_instance is None:
        others = {row.instance_id for row in elsewhere if row.identity_account_id is None}
        bound_elsewhere = set(
            session.scalars(
                select(ApiToken.instance_id).where(ApiToken.instance_id.in_(others), ApiToken.revoked_at.is_(None))
            )
        )
    order = {uuid: k for k, uuid in enumerate(positions)}  # the first device at fault in the batch is named
    for row in sorted(elsewhere, key=lambda r: order[r.uuid]):
        if (
            reporter.bound_instance is None
            and row.identity_account_id is None
            and row.instance_id not in bound_elsewhere
        ):
            continue  # a fleet token may report that instance too, so it may move the device
        raise _forbidden(
            positions[row.uuid],
            f"{row.uuid} is on instance {row.instance_id}, which {reporter.describe()} may not report; "
            "only a batch with the signed identity of the instance that now holds it can move it",
        )


def record_binding(session: Session, batch: IngestBatchIn, reporter: Reporter, before: Binding) -> None:
    """After a stored batch: an instance reported with a verified identity is from now on bound to identity."""
    if reporter.identity is None or before.identity_account_id == reporter.identity.account_id:
        return
    session.execute(
        update(Instance)
        .where(Instance.instance_id == batch.instance.instance_id)
        .values(identity_account_id=reporter.identity.account_id)
    )
