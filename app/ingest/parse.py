"""From request bytes to a checked batch, or an ApiError that names the field at fault."""

from __future__ import annotations

import json
import zlib
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..errors import ApiError, FieldProblem
from .fields import FLOAT_BRANCH, INT_BRANCH, MESSAGES
from .schemas import SCHEMA_VERSION, HolderRefIn, IngestBatchIn

MAX_PROBLEMS = 20
_KEY_CHARS = 64
"""A map key longer than this is cut short where a field path names it."""


def decode_body(body: bytes, content_encoding: str | None, *, max_bytes: int) -> bytes:
    """Undo gzip if the client used it; the size limit applies to what comes out, so a zip bomb is a 413.
    The body must be exactly one gzip member: bytes after it would otherwise be dropped without a word."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        if len(body) > max_bytes:
            raise too_large(max_bytes)
        return body
    if encoding != "gzip":
        raise ApiError(415, f"unsupported Content-Encoding {encoding!r}: send identity or gzip")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise ApiError(400, f"body is not valid gzip: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise too_large(max_bytes)
    if not inflater.eof:
        raise ApiError(400, "body is not valid gzip: stream is truncated")
    if inflater.unused_data:
        raise ApiError(
            400, f"body is not valid gzip: {len(inflater.unused_data)} bytes follow the gzip stream; send one member"
        )
    return out


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"body larger than the limit of {max_bytes} bytes (GPUFLEET_MAX_BODY_BYTES)")


def field_path(loc: tuple[int | str, ...]) -> str:
    """('intervals', 0, 'samples', 3, 'util') -> 'intervals[0].samples[3].util'. Map keys are part of the path
    (`instance.tags.team`): characters that cannot be shown are written as \\uXXXX, and a long key is cut short."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":  # pydantic's mark of a problem with the key itself; see problem()
            out += ("." if out else "") + _shown(part)
    return out or "body"


def _shown(key: str) -> str:
    shown = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in key[:_KEY_CHARS])
    return shown + ("..." if len(key) > _KEY_CHARS else "")


def problem(error: ErrorDetails) -> FieldProblem:
    """One pydantic error as a field and a sentence: a pattern is explained, not quoted."""
    message = error["msg"]
    if error["type"] == "string_pattern_mismatch":
        message = MESSAGES.get(str((error.get("ctx") or {}).get("pattern")), message)
    elif error["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    if error["loc"][-1:] == ("[key]",):
        message = "key: " + message
    return FieldProblem(field_path(error["loc"]), message)


def one_per_integer(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """An integer field that failed reports once per way it may be written (fields.WHOLE); keep the error of the
    way the input was written, as if there were one."""
    written_as_float = {
        e["loc"][:-1] for e in errors if e["loc"][-1:] == (INT_BRANCH,) and type(e.get("input")) is float
    }
    out: list[ErrorDetails] = []
    for e in errors:
        branch = e["loc"][-1:]
        if branch not in ((INT_BRANCH,), (FLOAT_BRANCH,)):
            out.append(e)
        elif (e["loc"][:-1] in written_as_float) == (branch == (FLOAT_BRANCH,)):
            kept = e.copy()
            kept["loc"] = e["loc"][:-1]
            out.append(kept)
    return out


def _brief(value: Any) -> str:
    """A value from the body, short enough for a one-line error."""
    try:
        shown = json.dumps(value)
    except ValueError:  # an integer of more digits than Python will print
        return "a number too long to show"
    return shown if len(shown) <= 40 else shown[:37] + "..."


def parse_batch(raw: bytes) -> IngestBatchIn:
    """Strict: each field takes only the JSON type its schema names (see schemas.py)."""
    try:
        return IngestBatchIn.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        errors = one_per_integer(exc.errors(include_url=False))
        if any(e["type"] == "json_invalid" for e in errors):
            raise ApiError(400, "body is not valid JSON: " + errors[0]["msg"]) from None
        for e in errors:
            if e["loc"] == ("schema_version",) and e["type"] != "missing":
                raise ApiError(
                    422,
                    f"unknown schema_version {_brief(e.get('input'))}: this server speaks {SCHEMA_VERSION}",
                    [problem(e)],
                ) from None
        raise ApiError(422, "invalid batch", [problem(e) for e in errors[:MAX_PROBLEMS]]) from None


def check_batch(batch: IngestBatchIn, *, now: datetime, max_future_skew_s: float, raw_retention_days: int) -> None:
    """Rules that span fields: every sample names a device of this batch and refers only to holders of this batch,
    holder ids are unique, no time is out of range. Interval starts lie within the raw retention and at most
    `max_future_skew_s` ahead of `now`; event times only have the future bound (events are kept for good), and the
    schema keeps every time from 2000 on."""
    problems: list[FieldProblem] = []
    known: set[str] = set()
    for g, gpu in enumerate(batch.gpus):
        for path, uuid in [(f"gpus[{g}].uuid", gpu.uuid)] + [
            (f"gpus[{g}].slices[{s}].uuid", sl.uuid) for s, sl in enumerate(gpu.slices)
        ]:
            if uuid in known:
                problems.append(FieldProblem(path, f"device {uuid!r} listed twice"))
            known.add(uuid)
        slots = [(sl.gpu_instance_id, sl.compute_instance_id) for sl in gpu.slices]
        if len(set(slots)) != len(slots):
            problems.append(FieldProblem(f"gpus[{g}].slices", "two slices share a GPU-instance/compute-instance id"))
        if gpu.slices and not gpu.mig_mode:
            problems.append(FieldProblem(f"gpus[{g}].slices", "slices listed on a GPU whose mig_mode is false"))
    ids: set[int] = set()
    for h, holder in enumerate(batch.holders):
        if holder.id in ids:
            problems.append(FieldProblem(f"holders[{h}].id", f"holder id {holder.id} is used twice"))
        ids.add(holder.id)
    latest = now + timedelta(seconds=max_future_skew_s)
    oldest = now - timedelta(days=raw_retention_days)

    def ahead(path: str, at: datetime) -> FieldProblem:
        return FieldProblem(
            path,
            f"{at.isoformat()} is more than {max_future_skew_s:g} s ahead of the server clock ({now.isoformat()}): "
            "check the agent host's clock",
        )

    for e, event in enumerate(batch.events):
        if event.ts > latest:
            problems.append(ahead(f"events[{e}].ts", event.ts))
    for i, interval in enumerate(batch.intervals):
        if interval.start > latest:
            problems.append(ahead(f"intervals[{i}].start", interval.start))
        elif interval.start < oldest:
            problems.append(
                FieldProblem(
                    f"intervals[{i}].start",
                    f"{interval.start.isoformat()} is older than the raw retention of {raw_retention_days} days",
                )
            )
        seen: set[str] = set()
        for s, sample in enumerate(interval.samples):
            if sample.uuid not in known:
                problems.append(
                    FieldProblem(f"intervals[{i}].samples[{s}].uuid", f"{sample.uuid!r} is not in this batch's gpus")
                )
            elif sample.uuid in seen:
                problems.append(
                    FieldProblem(f"intervals[{i}].samples[{s}].uuid", f"{sample.uuid!r} sampled twice in one interval")
                )
            seen.add(sample.uuid)
            if sample.holders:
                problems += _ref_problems(f"intervals[{i}].samples[{s}].holders", sample.holders, ids)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise ApiError(422, "invalid batch", problems[:MAX_PROBLEMS])


def _ref_problems(path: str, refs: list[HolderRefIn], ids: set[int]) -> list[FieldProblem]:
    """A sample's holder references: each names a holder of the batch, and none twice (a holder's share of the
    device's time would otherwise count twice)."""
    problems: list[FieldProblem] = []
    named: set[int] = set()
    for r, ref in enumerate(refs):
        if ref.ref not in ids:
            problems.append(FieldProblem(f"{path}[{r}].ref", f"{ref.ref} is not the id of a holder in this batch"))
        elif ref.ref in named:
            problems.append(FieldProblem(f"{path}[{r}].ref", f"holder {ref.ref} is referred to twice in one sample"))
        named.add(ref.ref)
    return problems
