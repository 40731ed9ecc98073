"""The instance's signed identity, sent with every batch so the server knows which instance posts.

IMDS serves the instance identity document and AWS's signature of it (the base64 `signature` form: SHA-256 with
RSA). The agent sends both in one header, `X-Gpufleet-Instance-Identity: <base64 document>.<signature>`; the
server checks the signature against AWS's certificates. Standard library only: the agent does not verify.
"""

from __future__ import annotations

import base64
import logging

from .imds import ImdsClient

log = logging.getLogger("gpufleet.agent.identify")

IDENTITY_HEADER = "X-Gpufleet-Instance-Identity"
DOCUMENT_PATH = "instance-identity/document"
SIGNATURE_PATH = "instance-identity/signature"


def header_value(document: str, signature: str) -> str:
    """The header's value: the document's bytes in base64, a dot, the signature without its line breaks."""
    encoded = base64.b64encode(document.encode("utf-8")).decode("ascii")
    return encoded + "." + "".join(signature.split())


def read_signed_identity(client: ImdsClient) -> str | None:
    """The header's value from IMDS, or None when IMDS has no signed document (ImdsUnavailable when IMDS does
    not answer)."""
    document = client.get_dynamic(DOCUMENT_PATH)
    if not document or not document.strip():
        return None
    signature = client.get_dynamic(SIGNATURE_PATH)
    if not signature or not signature.strip():
        log.warning("IMDS has an identity document but no signature; batches go without the signed identity")
        return None
    return header_value(document, signature)
