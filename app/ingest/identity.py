"""The signed EC2 instance identity an agent may send instead of a token, and its check.

The agent reads the instance identity document and its base64 `signature` from IMDS (IMDSv2) and sends both
in one header: `X-Gpufleet-Instance-Identity: <base64 of the document>.<the signature as IMDS gave it>`. AWS
signs the document with SHA-256 and RSA (PKCS #1 v1.5); the public certificates of that signature form ship
with the server in `aws_certs/rsa.pem` and are read from the package, never from elsewhere. A deployment may
trust more certificates (`GPUFLEET_IDENTITY_EXTRA_CERTS`): the tests and `gpufleet demo` sign with a key of
their own that way.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ..errors import ApiError, FieldProblem

IDENTITY_HEADER = "X-Gpufleet-Instance-Identity"
# The document is under 1 KiB and the signature under 400 bytes; this only stops a rogue header early.
MAX_HEADER_CHARS = 8192

_SIGNATURE_FIELD = f"{IDENTITY_HEADER}.signature"
_ACCOUNT_FIELD = f"{IDENTITY_HEADER}.accountId"


@dataclass(frozen=True)
class InstanceIdentity:
    """What a verified identity document says about the instance that posts."""

    account_id: str
    instance_id: str
    region: str | None


def load_certificates(path: Path) -> tuple[rsa.RSAPublicKey, ...]:
    """The RSA public keys of the PEM certificates in `path`; ValueError naming the file if there are none."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    return _rsa_keys(data, str(path))


def _rsa_keys(data: bytes, where: str) -> tuple[rsa.RSAPublicKey, ...]:
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ValueError(f"{where} holds no PEM certificate") from None
    keys = [c.public_key() for c in certificates]
    rsa_keys = tuple(k for k in keys if isinstance(k, rsa.RSAPublicKey))
    if not rsa_keys:
        raise ValueError(f"{where} holds no certificate with an RSA key")
    return rsa_keys


@lru_cache(maxsize=1)
def aws_keys() -> tuple[rsa.RSAPublicKey, ...]:
    """The keys of AWS's certificates for the `signature` form, as shipped in the package."""
    data = resources.files(__package__).joinpath("aws_certs/rsa.pem").read_bytes()
    return _rsa_keys(data, "app/ingest/aws_certs/rsa.pem")


@lru_cache(maxsize=4)
def trusted_keys(extra: Path | None) -> tuple[rsa.RSAPublicKey, ...]:
    """AWS's keys, then those of the extra certificate file, if one is configured."""
    return aws_keys() + (load_certificates(extra) if extra is not None else ())


def _refused(status: int, field: str, message: str) -> ApiError:
    return ApiError(status, "instance identity refused", [FieldProblem(field, message)])


def _unbase64(text: str) -> bytes:
    # IMDS breaks the signature into lines; the agent sends it joined, but spaces are harmless either way.
    return base64.b64decode("".join(text.split()), validate=True)


def verify_identity(header: str, *, accounts: frozenset[str], keys: tuple[rsa.RSAPublicKey, ...]) -> InstanceIdentity:
    """The identity in an `X-Gpufleet-Instance-Identity` header, once its signature and account check out.

    401 for a header that does not parse or whose signature no trusted key made (a forged or altered document);
    403 for a genuine document of an account not in `accounts`.
    """
    if len(header) > MAX_HEADER_CHARS:
        raise _refused(401, IDENTITY_HEADER, f"longer than {MAX_HEADER_CHARS} characters")
    encoded_document, dot, encoded_signature = header.strip().partition(".")
    try:
        if not dot:
            raise ValueError
        document = _unbase64(encoded_document)
        signature = _unbase64(encoded_signature)
    except (ValueError, binascii.Error):
        raise _refused(
            401, IDENTITY_HEADER, "expected <base64 identity document>.<base64 signature> (the IMDS `signature`)"
        ) from None
    if not any(_signed_by(key, document, signature) for key in keys):
        raise _refused(401, _SIGNATURE_FIELD, "does not match the document under any trusted certificate")
    try:
        fields = json.loads(document)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise _refused(401, IDENTITY_HEADER, "the signed document is not a JSON object")
    account = fields.get("accountId")
    instance = fields.get("instanceId")
    region = fields.get("region")
    if not isinstance(account, str) or not isinstance(instance, str) or not instance:
        raise _refused(401, IDENTITY_HEADER, "the signed document lacks accountId or instanceId")
    if account not in accounts:
        raise _refused(403, _ACCOUNT_FIELD, f"account {account} is not in GPUFLEET_IDENTITY_ACCOUNTS")
    return InstanceIdentity(
        account_id=account, instance_id=instance, region=region if isinstance(region, str) else None
    )


def _signed_by(key: rsa.RSAPublicKey, document: bytes, signature: bytes) -> bool:
    try:
        key.verify(signature, document, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return False
    return True
