"""The Kubernetes protobuf encoding, as much of it as the stand-in API server (tests/support/kube_api.py)
needs: client-go's typed clients send built-in objects as ``application/vnd.kubernetes.protobuf``, and
Terraform's ``kubernetes`` state backend locks with a typed Lease client. So ``decode`` reads a Lease
(``coordination.k8s.io/v1``: ObjectMeta and LeaseSpec) into the dict its JSON form would be; anything
else is refused with ValueError. ``encode_lease`` writes one, for the stand-in's own tests.

The format (k8s.io/apimachinery ``runtime/serializer/protobuf``): the magic ``k8s\\x00``, then a
``runtime.Unknown`` message: 1 ``typeMeta`` {1 apiVersion, 2 kind}, 2 ``raw`` (the object's message),
3 ``contentEncoding``, 4 ``contentType``. Field numbers of the object messages are those of the
``generated.proto`` files of k8s.io/api and k8s.io/apimachinery. Go's generated code writes the plain
(non-pointer) string fields of ObjectMeta even when empty; JSON leaves them out, and so does ``decode``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

__all__ = ["MAGIC", "decode", "encode_lease"]

MAGIC = b"k8s\x00"
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5

# ObjectMeta (k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto)
_META_STRINGS = {1: "name", 2: "generateName", 3: "namespace", 4: "selfLink", 5: "uid", 6: "resourceVersion"}
_META_GENERATION, _META_CREATED, _META_DELETED, _META_GRACE = 7, 8, 9, 10
_META_LABELS, _META_ANNOTATIONS, _META_OWNERS, _META_FINALIZERS = 11, 12, 13, 14
# OwnerReference
_OWNER_STRINGS = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
_OWNER_BOOLS = {6: "controller", 7: "blockOwnerDeletion"}
# LeaseSpec (k8s.io/api/coordination/v1/generated.proto)
_SPEC_STRINGS = {1: "holderIdentity", 6: "strategy", 7: "preferredHolder"}
_SPEC_INTS = {2: "leaseDurationSeconds", 5: "leaseTransitions"}
_SPEC_TIMES = {3: "acquireTime", 4: "renewTime"}


# --- the wire format ----------------------------------------------------------------------------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a message: an int for varints and fixed values, bytes for the others."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, at = _varint(data, at)
            yield number, value
        elif wire == _BYTES:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated field")
            yield number, data[at : at + size]
            at += size
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            yield number, int.from_bytes(data[at : at + width], "little")
            at += width
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ValueError("expected a string field")
    return value.decode()


def _message(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError("expected a message field")
    return value


def _signed(value: int | bytes) -> int:
    """A varint as Go's int32/int64 (negative values are sign-extended to 64 bits on the wire)."""
    if isinstance(value, bytes):
        raise ValueError("expected a number field")
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


# --- decoding -----------------------------------------------------------------------------------------


def _time(data: bytes, *, micro: bool) -> str:
    """``metav1.Time`` / ``MicroTime`` {1 seconds, 2 nanos} as their JSON (RFC 3339, UTC)."""
    seconds = nanos = 0
    for number, value in _fields(data):
        if number == 1:
            seconds = _signed(value)
        elif number == 2:
            nanos = _signed(value)
    stamp = dt.datetime.fromtimestamp(seconds, dt.UTC) + dt.timedelta(microseconds=nanos // 1000)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def _pair(data: bytes) -> tuple[str, str]:
    entry = dict(_fields(data))
    return _text(entry.get(1, b"")), _text(entry.get(2, b""))


def _owner(data: bytes) -> dict[str, Any]:
    owner: dict[str, Any] = {}
    for number, value in _fields(data):
        if number in _OWNER_STRINGS:
            owner[_OWNER_STRINGS[number]] = _text(value)
        elif number in _OWNER_BOOLS:
            owner[_OWNER_BOOLS[number]] = bool(value)
    return owner


def _object_meta(data: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for number, value in _fields(data):
        if number in _META_STRINGS:
            if text := _text(value):
                meta[_META_STRINGS[number]] = text
        elif number == _META_GENERATION:
            if generation := _signed(value):
                meta["generation"] = generation
        elif number in (_META_CREATED, _META_DELETED):
            if time := _message(value):
                key = "creationTimestamp" if number == _META_CREATED else "deletionTimestamp"
                meta[key] = _time(time, micro=False)
        elif number == _META_GRACE:
            meta["deletionGracePeriodSeconds"] = _signed(value)
        elif number in (_META_LABELS, _META_ANNOTATIONS):
            key, text = _pair(_message(value))
            meta.setdefault("labels" if number == _META_LABELS else "annotations", {})[key] = text
        elif number == _META_OWNERS:
            meta.setdefault("ownerReferences", []).append(_owner(_message(value)))
        elif number == _META_FINALIZERS:
            meta.setdefault("finalizers", []).append(_text(value))
        # managedFields (17) and anything newer: not needed by the stand-in
    return meta


def _lease_spec(data: bytes) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for number, value in _fields(data):
        if number in _SPEC_STRINGS:
            spec[_SPEC_STRINGS[number]] = _text(value)
        elif number in _SPEC_INTS:
            spec[_SPEC_INTS[number]] = _signed(value)
        elif number in _SPEC_TIMES:
            spec[_SPEC_TIMES[number]] = _time(_message(value), micro=True)
    return spec


def decode(data: bytes) -> dict[str, Any]:
    """A protobuf-encoded Lease as the dict of its JSON form; ValueError for anything else."""
    if not data.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf object (no k8s\\x00 magic)")
    unknown = dict(_fields(data[len(MAGIC) :]))
    type_meta = dict(_fields(_message(unknown.get(1, b""))))
    api_version, kind = _text(type_meta.get(1, b"")), _text(type_meta.get(2, b""))
    if (api_version, kind) != ("coordination.k8s.io/v1", "Lease"):
        raise ValueError(
            f"this stand-in decodes coordination.k8s.io/v1 Leases only, not {api_version} {kind}"
        )
    if _text(unknown.get(3, b"")):
        raise ValueError("encoded content (contentEncoding) is not supported")
    lease: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": {}, "spec": {}}
    for number, value in _fields(_message(unknown.get(2, b""))):
        if number == 1:
            lease["metadata"] = _object_meta(_message(value))
        elif number == 2:
            lease["spec"] = _lease_spec(_message(value))
    return lease


# --- encoding (the stand-in's tests) ------------------------------------------------------------------


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative numbers as Go writes them: sign-extended to 64 bits
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, value: bytes) -> bytes:
    return _key(number, _BYTES) + _encode_varint(len(value)) + value


def _string_fields(values: dict[str, Any], names: dict[int, str], *, always: bool) -> bytes:
    return b"".join(
        _bytes_field(number, str(values.get(name, "")).encode())
        for number, name in sorted(names.items())
        if always or name in values
    )


def encode_lease(lease: dict[str, Any]) -> bytes:
    """A Lease dict (metadata: names, labels, annotations; spec: holderIdentity, ints) as client-go
    encodes it: ObjectMeta's plain strings always written, LeaseSpec's pointers only when set."""
    meta = lease.get("metadata") or {}
    spec = lease.get("spec") or {}
    meta_bytes = _string_fields(meta, _META_STRINGS, always=True)
    for number, field in ((_META_LABELS, "labels"), (_META_ANNOTATIONS, "annotations")):
        for key, value in sorted((meta.get(field) or {}).items()):
            entry = _bytes_field(1, key.encode()) + _bytes_field(2, str(value).encode())
            meta_bytes += _bytes_field(number, entry)
    spec_bytes = _string_fields(spec, _SPEC_STRINGS, always=False)
    for number, name in sorted(_SPEC_INTS.items()):
        if name in spec:
            spec_bytes += _key(number, _VARINT) + _encode_varint(int(spec[name]))
    raw = _bytes_field(1, meta_bytes) + _bytes_field(2, spec_bytes)
    type_meta = _bytes_field(1, b"coordination.k8s.io/v1") + _bytes_field(2, b"Lease")
    unknown = _bytes_field(1, type_meta) + _bytes_field(2, raw) + _bytes_field(3, b"") + _bytes_field(4, b"")
    return MAGIC + unknown
