"""Form posts (`application/x-www-form-urlencoded`), read with a size limit and without python-multipart."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request

MAX_FORM_BYTES = 16 * 1024
_MAX_FIELDS = 32


class FormError(Exception):
    """A post that is not a small url-encoded form; the message says what is wrong."""


async def read_form(request: Request, limit: int = MAX_FORM_BYTES) -> dict[str, str]:
    """The fields of a posted form; a field given twice keeps its first value."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise FormError("the form must be sent as application/x-www-form-urlencoded")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise FormError(f"the form is larger than {limit} bytes")
    try:
        pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=_MAX_FIELDS)
    except ValueError:
        raise FormError(f"the form has more than {_MAX_FIELDS} fields") from None
    fields: dict[str, str] = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    return fields
