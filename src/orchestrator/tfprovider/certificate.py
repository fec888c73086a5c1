"""The certificate a provider start answers Terraform's automatic mTLS with: new for every start.

Self-signed, ECDSA P-256, for ``localhost`` (go-plugin's client names the server so) and valid for a day,
with go-plugin's own extensions (a CA that may sign, server authentication). The key and the signature
are cryptography's; the certificate around them is written here in DER, because the X.509 layer of
cryptography costs more to import (≈ 50 ms of CPU) than everything else a provider start does but gRPC,
and Terraform starts the provider several times per command. Checked against cryptography's parser and
Go's (every Terraform run of the acceptance tests) by tests/unit/test_tfprovider_wire.py.
"""

from __future__ import annotations

import binascii
import os
import time
from typing import Final

_ECDSA_WITH_SHA256: Final = "1.2.840.10045.4.3.2"
_EC_PUBLIC_KEY: Final = "1.2.840.10045.2.1"
_PRIME256V1: Final = "1.2.840.10045.3.1.7"
_COMMON_NAME: Final = "2.5.4.3"
_SUBJECT_ALT_NAME: Final = "2.5.29.17"
_BASIC_CONSTRAINTS: Final = "2.5.29.19"
_KEY_USAGE: Final = "2.5.29.15"
_EXTENDED_KEY_USAGE: Final = "2.5.29.37"
_SERVER_AUTH: Final = "1.3.6.1.5.5.7.3.1"
HOST: Final = "localhost"
VALIDITY_SECONDS: Final = 24 * 3600


def _der(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes([tag, size]) + content
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(length)]) + length + content


def _sequence(*items: bytes) -> bytes:
    return _der(0x30, b"".join(items))


def _integer(value: int) -> bytes:
    return _der(0x02, value.to_bytes(value.bit_length() // 8 + 1, "big"))


def _oid(dotted: str) -> bytes:
    first, second, *rest = (int(part) for part in dotted.split("."))
    encoded = bytearray([40 * first + second])
    for number in rest:
        chunk = [number & 0x7F]
        number >>= 7
        while number:
            chunk.append(0x80 | (number & 0x7F))
            number >>= 7
        encoded.extend(reversed(chunk))
    return _der(0x06, bytes(encoded))


def _bits(content: bytes, unused: int = 0) -> bytes:
    return _der(0x03, bytes([unused]) + content)


def _time(seconds: float) -> bytes:
    return _der(0x17, time.strftime("%y%m%d%H%M%SZ", time.gmtime(seconds)).encode())


def _extension(oid: str, value: bytes, *, critical: bool = False) -> bytes:
    flag = _der(0x01, b"\xff") if critical else b""
    return _sequence(_oid(oid), flag, _der(0x04, value))


def certificate_and_key() -> tuple[bytes, bytes]:
    """A new certificate (DER) and its private key (PKCS#8 PEM)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:  # the enums without the SSH key formats (which `serialization` imports too)
        from cryptography.hazmat.primitives import _serialization
    except ImportError:  # pragma: no cover - a cryptography that moved them
        from cryptography.hazmat.primitives import serialization as _serialization  # type: ignore[no-redef]

    key = ec.generate_private_key(ec.SECP256R1())
    point = key.public_key().public_bytes(
        _serialization.Encoding.X962, _serialization.PublicFormat.UncompressedPoint
    )
    algorithm = _sequence(_oid(_ECDSA_WITH_SHA256))
    name = _sequence(_der(0x31, _sequence(_oid(_COMMON_NAME), _der(0x0C, HOST.encode()))))
    now = time.time()
    # keyUsage bits: digitalSignature (0), keyEncipherment (2), keyCertSign (5): 1010 0100, 2 unused
    extensions = _sequence(
        _extension(_SUBJECT_ALT_NAME, _sequence(_der(0x82, HOST.encode()))),
        _extension(_BASIC_CONSTRAINTS, _sequence(_der(0x01, b"\xff")), critical=True),
        _extension(_KEY_USAGE, _bits(b"\xa4", unused=2), critical=True),
        _extension(_EXTENDED_KEY_USAGE, _sequence(_oid(_SERVER_AUTH))),
    )
    to_be_signed = _sequence(
        _der(0xA0, _integer(2)),  # version 3
        _integer(int.from_bytes(os.urandom(16)) >> 1 | 1),  # positive, at most 127 bits
        algorithm,
        name,
        _sequence(_time(now - 60), _time(now + VALIDITY_SECONDS)),
        name,
        _sequence(_sequence(_oid(_EC_PUBLIC_KEY), _oid(_PRIME256V1)), _bits(point)),
        _der(0xA3, extensions),
    )
    signature = key.sign(to_be_signed, ec.ECDSA(hashes.SHA256()))
    certificate = _sequence(to_be_signed, algorithm, _bits(signature))
    # PKCS#8 around SEC 1's ECPrivateKey (cryptography's private_bytes imports its SSH formats too)
    secret = key.private_numbers().private_value.to_bytes(32, "big")
    ec_private_key = _sequence(_integer(1), _der(0x04, secret), _der(0xA1, _bits(point)))
    private_key_info = _sequence(
        _integer(0), _sequence(_oid(_EC_PUBLIC_KEY), _oid(_PRIME256V1)), _der(0x04, ec_private_key)
    )
    return certificate, _pem("PRIVATE KEY", private_key_info)


def _pem(label: str, der: bytes) -> bytes:
    body = binascii.b2a_base64(der, newline=False).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {label}-----\n{lines}\n-----END {label}-----\n".encode()


def pem(der: bytes) -> bytes:
    """A DER certificate as PEM."""
    return _pem("CERTIFICATE", der)
