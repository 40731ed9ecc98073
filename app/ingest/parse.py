"""From request bytes to a checked batch, or an ApiError that names the field at fault."""

from __future__ import annotations

import zlib
from datetime import datetime, timedelta

from pydantic import ValidationError

from ..errors import ApiError, FieldProblem
from .schemas import SCHEMA_VERSION, IngestBatchIn


def decode_body(body: bytes, content_encoding: str | None, *, max_bytes: int) -> bytes:
    """Undo gzip if the client used it; the size limit applies to what comes out, so a zip bomb is a 413."""
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
    return out


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"body larger than the limit of {max_bytes} bytes (GPUFLEET_MAX_BODY_BYTES)")


def field_path(loc: tuple[int | str, ...]) -> str:
    """('intervals', 0, 'samples', 3, 'util') -> 'intervals[0].samples[3].util'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def parse_batch(raw: bytes) -> IngestBatchIn:
    try:
        return IngestBatchIn.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise ApiError(400, "body is not valid JSON: " + errors[0]["msg"]) from None
        for e in errors:
            if e["loc"] == ("schema_version",) and e["type"] != "missing":
                raise ApiError(
                    422,
                    f"unknown schema_version {e.get('input')!r}: this server speaks {SCHEMA_VERSION}",
                    [FieldProblem("schema_version", e["msg"])],
                ) from None
        problems = [FieldProblem(field_path(e["loc"]), e["msg"]) for e in errors[:20]]
        raise ApiError(422, "invalid batch", problems) from None


def check_batch(batch: IngestBatchIn, *, now: datetime, max_future_skew_s: float, raw_retention_days: int) -> None:
    """Rules that span fields: every sample names a device of this batch, no time is out of range."""
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
    latest = now + timedelta(seconds=max_future_skew_s)
    oldest = now - timedelta(days=raw_retention_days)
    for i, interval in enumerate(batch.intervals):
        if interval.start > latest:
            problems.append(
                FieldProblem(
                    f"intervals[{i}].start",
                    f"{interval.start.isoformat()} is more than {max_future_skew_s:g} s ahead of the server "
                    f"clock ({now.isoformat()}): check the agent host's clock",
                )
            )
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
        if len(problems) >= 20:
            break
    if problems:
        raise ApiError(422, "invalid batch", problems[:20])
