"""Field types of the ingest wire format: strings PostgreSQL can store and URLs can carry, RFC 3339 times, UUIDs
in their usual form, and event details of bounded size.

Each rule is published in the OpenAPI schema (a `pattern`, a bound) where JSON Schema can say it, and
`MESSAGES` gives each pattern a sentence a person can act on.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BeforeValidator,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

LABEL = r"^[^\x00-\x1f\x7f]*$"
"""One line of text: no control characters (U+0000-U+001F, U+007F)."""
TEXT = r"^[^\x00]*$"
"""Free text: anything but NUL, which PostgreSQL cannot store."""
NAME = r"^[^\x00-\x1f\x7f ]([^\x00-\x1f\x7f]*[^\x00-\x1f\x7f ])?$"
"""A label that neither starts nor ends with a space."""
INSTANCE_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""An EC2 instance id (`i-` and 8 or 17 hex digits) or an on-premises host id; safe as one URL path segment."""
DEVICE_UUID = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"
"""NVML's UUID forms: `GPU-<uuid>`, `MIG-<uuid>`, and older drivers' `MIG-GPU-<uuid>/<gi>/<ci>`."""
EVENT_KIND = r"^[a-z0-9_.]+$"

MESSAGES = {
    LABEL: "must not contain control characters (U+0000 to U+001F, U+007F)",
    TEXT: "must not contain the NUL character (U+0000)",
    NAME: "must not contain control characters (U+0000 to U+001F, U+007F), nor start or end with a space",
    INSTANCE_ID: "must be an EC2 instance id (i- and 8 or 17 hex digits) or a host id of letters, digits, "
    "'.', '_' and '-' that starts with a letter or a digit",
    DEVICE_UUID: "must be letters, digits, '.', '_', ':', '/' and '-', starting with a letter or a digit",
    EVENT_KIND: "must be lowercase letters, digits, '_' and '.'",
}


def label(max_length: int, *, min_length: int = 0) -> StringConstraints:
    """Constraints of a one-line string: `Annotated[str, label(64)]`."""
    return StringConstraints(min_length=min_length, max_length=max_length, pattern=LABEL)


def text(max_length: int) -> StringConstraints:
    """Constraints of free text (line breaks and tabs allowed, NUL not): `Annotated[str, text(500)]`."""
    return StringConstraints(max_length=max_length, pattern=TEXT)


# Nothing is stripped: the server takes exactly the strings the published patterns allow.
Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NAME)]
InstanceId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=INSTANCE_ID)]
# gpus.uuid and mig_slices.uuid are varchar(96).
DeviceUuid = Annotated[str, StringConstraints(min_length=1, max_length=96, pattern=DEVICE_UUID)]
EventKind = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=EVENT_KIND)]

# RFC 3339 (what JSON Schema's `date-time` means): seconds and an offset are required. Without this check a
# string of Unix seconds ("1700000000") would pass as a time.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})", re.ASCII
)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
"""No time before this is accepted: a clock this far back has not been set."""


def _rfc3339(value: object) -> object:
    """Parsed here, not by pydantic: after a validator, strict mode would take nothing but a datetime object."""
    if not isinstance(value, str):
        return value
    try:
        if _RFC3339.fullmatch(value):
            return datetime.fromisoformat(value.upper())
    except ValueError:
        pass
    raise ValueError("must be an RFC 3339 date-time with seconds and an offset, e.g. 2026-11-21T14:00:00Z")


def _not_before_2000(value: datetime) -> datetime:
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range") from None
    if utc < EARLIEST:
        raise ValueError(f"is before {EARLIEST.isoformat().replace('+00:00', 'Z')}: check the agent host's clock")
    return value


Timestamp = Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_not_before_2000)]

_UUID_FORM = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")


def uuid_form(value: object) -> object:
    """Only the 8-4-4-4-12 hex form (JSON Schema's `uuid`), not the bare, braced or `urn:uuid:` forms."""
    if not isinstance(value, str):
        return value
    if not _UUID_FORM.fullmatch(value):
        raise ValueError("must be a UUID in its 8-4-4-4-12 hex form")
    return UUID(value)


INT_BRANCH = "<integer>"
FLOAT_BRANCH = "<whole number>"
"""Where a WHOLE field's error comes from: the last part of its pydantic `loc`; parse.py keeps the one that
fits the input and drops the part."""


def _float_to_int(value: float) -> int:
    if not value.is_integer():
        raise PydanticCustomError("int_from_float", "Input should be a valid integer, not a number with a fraction")
    return int(value)


class _Whole:
    """JSON Schema's `integer` is any number without a fraction, so `3.0` is 3; strict mode alone would refuse
    it. An integer is checked in Rust as before, and only a JSON float takes a Python call."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        integers = handler(source)
        floats = core_schema.no_info_after_validator_function(_float_to_int, core_schema.float_schema(strict=True))
        return core_schema.union_schema(
            [(integers, INT_BRANCH), (core_schema.chain_schema([floats, integers]), FLOAT_BRANCH)],
            mode="left_to_right",
        )

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return handler(schema["choices"][0][0])


WHOLE = _Whole()
"""Goes last, after the bounds: `Annotated[int, Field(ge=0, le=255), WHOLE]`."""


def not_bool(value: object) -> object:
    """Before a `Literal` of integers, which takes `true` for 1 even in strict mode."""
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


DETAIL_KEYS = 16
DETAIL_KEY_CHARS = 64
DETAIL_TEXT_CHARS = 500
DETAIL_NUMBER_LIMIT = 2**53
"""Event detail numbers stay within +-2^53, where every integer is exact in a double."""
DetailKey = Annotated[str, label(DETAIL_KEY_CHARS, min_length=1)]


def _detail_value(value: object) -> str | int | float | bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        if not (math.isfinite(value) and -DETAIL_NUMBER_LIMIT <= value <= DETAIL_NUMBER_LIMIT):
            raise ValueError(f"numbers must be finite and within -2^53 to 2^53 ({DETAIL_NUMBER_LIMIT})")
        return value
    if isinstance(value, str):
        if len(value) > DETAIL_TEXT_CHARS:
            raise ValueError(f"strings must have at most {DETAIL_TEXT_CHARS} characters")
        if "\x00" in value:
            raise ValueError(MESSAGES[TEXT])
        return value
    raise ValueError("must be a string, a number, a boolean or null")


DetailValue = Annotated[
    str | int | float | bool | None,
    PlainValidator(_detail_value),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "maxLength": DETAIL_TEXT_CHARS, "pattern": TEXT},
                {"type": "number", "minimum": -DETAIL_NUMBER_LIMIT, "maximum": DETAIL_NUMBER_LIMIT},
                {"type": "boolean"},
                {"type": "null"},
            ]
        }
    ),
]


def key_patterns_as_property_names(schema: dict[str, Any]) -> None:
    """Model-level `json_schema_extra`: pydantic publishes a map whose keys have a pattern as
    `patternProperties`, which lets keys outside the pattern through; say it as `propertyNames` instead."""
    for prop in schema.get("properties", {}).values():
        by_pattern = prop.get("patternProperties")
        if isinstance(by_pattern, dict) and len(by_pattern) == 1:
            (pattern, values), *_ = by_pattern.items()
            del prop["patternProperties"]
            prop.setdefault("propertyNames", {})["pattern"] = pattern
            prop["additionalProperties"] = values
