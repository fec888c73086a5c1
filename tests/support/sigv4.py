"""Checking AWS Signature Version 4 on the server side, for the AWS stand-in (tests/support/aws_standin.py).

A request is signed either in its ``Authorization`` header (``AWS4-HMAC-SHA256 Credential=<key id>/<date>/
<region>/<service>/aws4_request, SignedHeaders=..., Signature=...``) or in its query (a presigned URL:
``X-Amz-Credential``, ``X-Amz-Date``, ``X-Amz-Expires``, ``X-Amz-SignedHeaders``, ``X-Amz-Signature``).
The signature is recomputed with botocore's own signer over exactly the headers the client signed, as
AWS does, with the secret key of the credentials the stand-in issued.
"""

from __future__ import annotations

import calendar
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

ALGORITHM = "AWS4-HMAC-SHA256"
#: How far a header-signed request's ``X-Amz-Date`` may be from now (AWS: 5 minutes).
MAX_SKEW_SECONDS = 300


class SignatureError(Exception):
    """The request is not signed, or not validly; ``code`` and ``message`` are AWS's words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Signed:
    """What a signature claims, before it is checked."""

    access_key_id: str
    date: str  # YYYYMMDD'T'HHMMSS'Z'
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    #: The presigned URL's lifetime; None for a header-signed request.
    expires_seconds: int | None
    security_token: str | None


def parse(method: str, raw_query: str, headers: Mapping[str, str]) -> Signed:
    """The signature of a request (header or query); SignatureError if it carries none."""
    query = dict(parse_qsl(raw_query, keep_blank_values=True))
    if "X-Amz-Signature" in query:
        if query.get("X-Amz-Algorithm") != ALGORITHM:
            raise SignatureError("IncompleteSignature", "X-Amz-Algorithm must be AWS4-HMAC-SHA256")
        try:
            key, region, service = _scope(query["X-Amz-Credential"], query["X-Amz-Date"])
            expires = int(query["X-Amz-Expires"])
            signed = tuple(query["X-Amz-SignedHeaders"].split(";"))
            date = query["X-Amz-Date"]
        except (KeyError, ValueError) as exc:
            raise SignatureError("IncompleteSignature", "the presigned URL is incomplete") from exc
        return Signed(
            key,
            date,
            region,
            service,
            signed,
            query["X-Amz-Signature"],
            expires,
            query.get("X-Amz-Security-Token"),
        )
    authorization = headers.get("authorization", "")
    if not authorization:
        raise SignatureError("MissingAuthenticationToken", "Request is missing Authentication Token")
    algorithm, _, rest = authorization.partition(" ")
    parts = dict(part.strip().split("=", 1) for part in rest.split(",") if "=" in part)
    if algorithm != ALGORITHM or not {"Credential", "SignedHeaders", "Signature"} <= parts.keys():
        raise SignatureError("IncompleteSignature", "Authorization header requires AWS4-HMAC-SHA256 parts")
    date = headers.get("x-amz-date", "")
    if not date:
        raise SignatureError("IncompleteSignature", "X-Amz-Date is missing")
    try:
        key, region, service = _scope(parts["Credential"], date)
    except ValueError as exc:
        raise SignatureError("IncompleteSignature", "malformed Credential") from exc
    return Signed(
        key,
        date,
        region,
        service,
        tuple(parts["SignedHeaders"].split(";")),
        parts["Signature"],
        None,
        headers.get("x-amz-security-token"),
    )


def _scope(credential: str, date: str) -> tuple[str, str, str]:
    """(key id, region, service) of ``<key id>/<date>/<region>/<service>/aws4_request``."""
    key, day, region, service, terminator = credential.split("/")
    if terminator != "aws4_request" or day != date[:8]:
        raise ValueError("the credential scope does not match the request date")
    return key, region, service


def _timestamp(date: str) -> float:
    return float(calendar.timegm(time.strptime(date, "%Y%m%dT%H%M%SZ")))


def verify(
    signed: Signed,
    *,
    secret_access_key: str,
    session_token: str,
    method: str,
    host: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    body: bytes,
    scheme: str = "http",
) -> None:
    """Recompute the signature with the issued secret key; SignatureError (AWS's codes) if it differs,
    if the request is too old, or if the session token is not the one issued with the key."""
    try:
        signed_at = _timestamp(signed.date)
    except ValueError as exc:
        raise SignatureError("IncompleteSignature", f"bad X-Amz-Date {signed.date!r}") from exc
    now = time.time()
    if signed.expires_seconds is None:
        if abs(now - signed_at) > MAX_SKEW_SECONDS:
            raise SignatureError("SignatureDoesNotMatch", "Signature expired: the request time is too skewed")
    elif now > signed_at + signed.expires_seconds:
        raise SignatureError("AccessDenied", "Request has expired")
    if signed.security_token is None or not hmac.compare_digest(signed.security_token, session_token):
        raise SignatureError("InvalidClientTokenId", "The security token included in the request is invalid.")
    if signed.expires_seconds is None and "x-amz-security-token" not in signed.signed_headers:
        raise SignatureError("SignatureDoesNotMatch", "X-Amz-Security-Token must be signed")
    present = {name.lower(): value for name, value in headers.items()}
    if "host" not in signed.signed_headers:
        raise SignatureError("SignatureDoesNotMatch", "the host header must be signed")
    missing = [name for name in signed.signed_headers if name not in present]
    if missing:
        raise SignatureError("SignatureDoesNotMatch", f"signed headers missing from the request: {missing}")
    query = "&".join(
        part for part in raw_query.split("&") if part and not part.startswith("X-Amz-Signature=")
    )
    url = f"{scheme}://{host}{raw_path}" + (f"?{query}" if query else "")
    request = AWSRequest(
        method=method, url=url, data=body, headers={name: present[name] for name in signed.signed_headers}
    )
    request.context["timestamp"] = signed.date
    signer = SigV4Auth(
        Credentials(signed.access_key_id, secret_access_key, session_token), signed.service, signed.region
    )
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    if not hmac.compare_digest(expected, signed.signature):
        raise SignatureError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. Check your AWS "
            "Secret Access Key and signing method. Consult the service documentation for details.",
        )
