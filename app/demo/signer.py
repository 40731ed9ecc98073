"""A stand-in for AWS's signing of instance identity documents, for `gpufleet demo` and the tests.

AWS's private keys are not at hand, so the simulated metadata services sign with a key of their own. The
server trusts its certificate through `GPUFLEET_IDENTITY_EXTRA_CERTS`; the AWS certificates shipped with the
server stay trusted beside it. The signature has AWS's `signature` form: SHA-256 with RSA (PKCS #1 v1.5) over
the document's bytes, in base64 broken into lines.
"""

from __future__ import annotations

import base64
import json
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

DEMO_ACCOUNT = "123456789012"
"""The AWS account id the simulated instances belong to."""


class IdentitySigner:
    """An RSA key and its self-signed certificate; signs identity documents as IMDS serves them."""

    def __init__(self, *, key_bits: int = 2048, common_name: str = "gpufleet simulated instance identity") -> None:
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=key_bits)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.now(UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=3650))
            .sign(self._key, hashes.SHA256())
        )

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def write_certificate(self, path: Path) -> Path:
        """The certificate as a PEM file, for `GPUFLEET_IDENTITY_EXTRA_CERTS`."""
        path.write_bytes(self.certificate_pem())
        return path

    def sign(self, document: str | bytes) -> str:
        """The base64 `signature` of `document`, broken into lines of 76 characters as IMDS does."""
        data = document.encode() if isinstance(document, str) else document
        raw = self._key.sign(data, padding.PKCS1v15(), hashes.SHA256())
        return "\n".join(textwrap.wrap(base64.b64encode(raw).decode(), 76))

    @staticmethod
    def document(
        instance_id: str,
        *,
        account_id: str = DEMO_ACCOUNT,
        region: str = "us-east-1",
        availability_zone: str | None = None,
        instance_type: str | None = None,
        image_id: str | None = None,
    ) -> str:
        """An identity document with the fields and layout of IMDS's (pretty-printed JSON)."""
        fields = {
            "accountId": account_id,
            "architecture": "x86_64",
            "availabilityZone": availability_zone or f"{region}a",
            "billingProducts": None,
            "devpayProductCodes": None,
            "marketplaceProductCodes": None,
            "imageId": image_id or "ami-0123456789abcdef0",
            "instanceId": instance_id,
            "instanceType": instance_type or "p4d.24xlarge",
            "kernelId": None,
            "pendingTime": "2026-11-01T00:00:00Z",
            "privateIp": "10.0.0.12",
            "ramdiskId": None,
            "region": region,
            "version": "2017-09-30",
        }
        return json.dumps(fields, indent=2)

    def dynamic(self, instance_id: str, **document: str) -> dict[str, str]:
        """The `/latest/dynamic/` items of one instance: its identity document and their signature."""
        text = self.document(instance_id, **document)
        return {"instance-identity/document": text, "instance-identity/signature": self.sign(text)}
