"""A mirror link's CA bundle for its source (docs/mirror.md "TLS to the source"), checked by shape.

A link whose source serves HTTPS may carry the PEM certificates the sink trusts for that
source (as a Kafka MirrorMaker 2 or Replicator user gives the source's truststore). The
bundle is public data (CA certificates, no key), so it is kept in the link, in the sink's
catalog, replicated with it.

Why a check by shape here, and OpenSSL only at the edge: the catalog applies each command
on every replica and must decide the same on all of them, whatever OpenSSL each node's
Python links against; and this room is pure (no `ssl`: tests/unit/test_layers.py). So the
command checks what is the same everywhere (size, PEM armour, base64, a DER SEQUENCE whose
length covers the block exactly, no key nor any other block), and the HTTP route that
creates links also loads the bundle with OpenSSL (`multiraft.net.tls.source_context`),
refusing before proposing what this node's OpenSSL refuses. A node whose OpenSSL still
refuses a bundle shows it in the link's status (the source client's error), never crashes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

PEM_BUNDLE_BYTES_MAX = 64 * 1024  # a few dozen CA certificates; the link sits in every catalog snapshot
CERTIFICATES_MAX = 64
FINGERPRINTS_SHOWN_MAX = 8

# OpenSSL, as Python's `cadata`, ignores text between blocks (bundles often carry a subject
# line per certificate); every armour line, BEGIN or END, is looked at.
_ARMOUR = re.compile(r"^-----(BEGIN|END) ([A-Z0-9 ]{1,40})-----[ \t\r]*$", re.MULTILINE)
_BASE64_LINE = re.compile(r"[A-Za-z0-9+/=]*")


class PemBundleError(ValueError):
    """The bundle is not one or more PEM certificates; the message says what is wrong."""


def parse_certificates(text: str) -> tuple[bytes, ...]:
    """The DER certificates of the PEM bundle `text`, or `PemBundleError`."""
    if len(text.encode("utf-8", "replace")) > PEM_BUNDLE_BYTES_MAX:
        raise PemBundleError(f"the CA bundle is larger than {PEM_BUNDLE_BYTES_MAX} bytes")
    if not text.isascii():
        raise PemBundleError("the CA bundle is not ASCII PEM text")
    if "PRIVATE KEY" in text:  # anywhere, indented too: the bundle sits in every catalog snapshot
        raise PemBundleError("the CA bundle holds a private key: give only certificates")
    armour = list(_ARMOUR.finditer(text))
    if not armour:
        raise PemBundleError("the CA bundle holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    certificates: list[bytes] = []
    for begin, end in zip(armour[::2], armour[1::2], strict=False):
        label = begin[2]
        if "PRIVATE KEY" in label or "PRIVATE KEY" in end[2]:
            raise PemBundleError("the CA bundle holds a private key: give the CA's certificates only")
        if begin[1] != "BEGIN" or end[1] != "END" or end[2] != label:
            raise PemBundleError("the CA bundle's BEGIN and END lines do not pair up")
        if label != "CERTIFICATE":
            raise PemBundleError(f"the CA bundle holds a {label} block; only CERTIFICATE blocks are taken")
        certificates.append(_der(text[begin.end():end.start()], len(certificates) + 1))
    if len(armour) % 2:
        if "PRIVATE KEY" in armour[-1][2]:
            raise PemBundleError("the CA bundle holds a private key: give the CA's certificates only")
        raise PemBundleError("the CA bundle's last block has no END line")
    if len(certificates) > CERTIFICATES_MAX:
        raise PemBundleError(f"the CA bundle holds more than {CERTIFICATES_MAX} certificates")
    return tuple(certificates)


def _der(body: str, number: int) -> bytes:
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    if not lines or not all(_BASE64_LINE.fullmatch(line) for line in lines):
        raise PemBundleError(f"certificate {number} of the CA bundle is not base64")
    try:
        der = base64.b64decode("".join(lines), validate=True)
    except (binascii.Error, ValueError):
        raise PemBundleError(f"certificate {number} of the CA bundle is not base64") from None
    if _der_sequence_bytes(der) != len(der):
        raise PemBundleError(f"certificate {number} of the CA bundle is not a DER certificate")
    return der


def _der_sequence_bytes(der: bytes) -> int | None:
    """The bytes of the DER SEQUENCE at the start of `der` (tag, length, content), or None.
    A certificate is one SEQUENCE; its length in definite form (DER allows no other)."""
    if len(der) < 2 or der[0] != 0x30:
        return None
    first = der[1]
    if first < 0x80:
        return 2 + first
    count = first & 0x7F
    if not 1 <= count <= 4 or len(der) < 2 + count:
        return None
    return 2 + count + int.from_bytes(der[2:2 + count], "big")


def fingerprint_sha256(der: bytes) -> str:
    """As `openssl x509 -noout -fingerprint -sha256` prints it: AB:CD:..., to compare by eye."""
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def describe_bundle(text: str) -> dict[str, object]:
    """What a status shows of a bundle: how many certificates and their fingerprints (the first
    few), never the bundle itself (it is public, but 64 KiB of base64 helps nobody)."""
    certificates = parse_certificates(text)
    return {"certificates": len(certificates),
            "fingerprints_sha256": [fingerprint_sha256(c) for c in certificates[:FINGERPRINTS_SHOWN_MAX]]}
