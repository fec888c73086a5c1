"""The orchestrator as an OIDC issuer: a real server publishes its discovery document and JWKS over HTTP,
and tokens its issuer mints verify against them as a cloud's security token service checks them: PyJWT's
``PyJWKClient`` fetching the JWKS from the running server (``jwks_uri`` of the discovery document).

Tokens are minted by a ``WorkloadIssuer`` on the server's database and key (a second replica, in the
test's event loop): what one replica signs, every replica's JWKS publishes. Time passes with
``time_machine``, never with sleeps.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jwt
import pytest
import sqlalchemy as sa
import time_machine
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr
from sqlalchemy.engine import Connection
from structlog.testing import capture_logs

from orchestrator.identity import keys
from orchestrator.identity.issuer import JWKS_REFRESH_SECONDS, WorkloadIssuer
from orchestrator.launchers.base import LaunchError, LaunchTarget
from orchestrator.secretbox import SecretBox
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from orchestrator.store import signing_keys as key_store
from tests.support.live_server import serve_in_thread

KEY = secrets.token_bytes(32)
AUDIENCE = "sts.amazonaws.com"
#: The rotation period of these tests: the next key is published an hour before it signs.
ROTATION_SECONDS = 7200.0
AHEAD = timedelta(seconds=keys.publish_ahead_seconds(ROTATION_SECONDS))
#: The RSA private numbers: none may appear in any answer or stored value.
PRIVATE_FIELDS = ("d", "p", "q", "dp", "dq", "qi")


@pytest.fixture
def issuer_settings(settings: ServerSettings) -> ServerSettings:
    return settings.model_copy(
        update={
            "encryption_key": SecretStr(base64.b64encode(KEY).decode()),
            "oidc_key_rotation_seconds": ROTATION_SECONDS,
            "workload_token_lifetime_seconds": 900,
        }
    )


@contextmanager
def live(settings: ServerSettings, path: str = "") -> Iterator[ServerSettings]:
    """The server, serving until the block ends; the settings it runs with (``public_url`` + ``path``)."""
    served: list[ServerSettings] = []

    def factory(url: str) -> Any:
        served.append(settings.model_copy(update={"public_url": url + path}))
        return create_app(served[0])

    with serve_in_thread(factory=factory):
        yield served[0]


@asynccontextmanager
async def replica(settings: ServerSettings) -> AsyncIterator[WorkloadIssuer]:
    """A ``WorkloadIssuer`` on the database of ``settings``, with an engine of its own."""
    engine = db.create_engine(settings.resolved_database_url)
    try:
        await migrate.upgrade(engine)
        yield WorkloadIssuer(engine, SecretBox(KEY), settings)
    finally:
        await db.dispose(engine)


def fetch(url: str) -> httpx.Response:
    """GET, blocking: the server runs in a thread of its own, a blocked test loop does not stop it."""
    return httpx.get(url, timeout=60)  # /openapi.json is built on first use: seconds on a loaded machine


def discovery(issuer: str) -> dict[str, Any]:
    response = fetch(f"{issuer}/.well-known/openid-configuration")
    assert 200 == response.status_code, response.text
    document: dict[str, Any] = response.json()
    return document


def published_kids(issuer: str) -> list[str]:
    response = fetch(discovery(issuer)["jwks_uri"])
    assert 200 == response.status_code, response.text
    return [key["kid"] for key in response.json()["keys"]]


def verify(issuer: str, token: str, audience: str = AUDIENCE, *, iss: str | None = None) -> dict[str, Any]:
    """The relying party's check: the key named by the token's ``kid`` from the issuer's published JWKS
    (fetched afresh), RS256, audience, issuer (``iss``, by default the served one) and times."""
    config = discovery(issuer)
    client = jwt.PyJWKClient(config["jwks_uri"], cache_jwk_set=False, cache_keys=False)
    signing_key = client.get_signing_key_from_jwt(token)
    claims: dict[str, Any] = jwt.decode(
        token,
        signing_key.key,
        algorithms=config["id_token_signing_alg_values_supported"],
        audience=audience,
        issuer=iss or config["issuer"],
        options={"require": ["iss", "sub", "aud", "iat", "nbf", "exp", "jti"]},
    )
    return claims


def kid(token: str) -> str:
    header = jwt.get_unverified_header(token)
    found: str = header["kid"]
    return found


async def stored_keys(settings: ServerSettings) -> list[key_store.SigningKeyRow]:
    engine = db.create_engine(settings.resolved_database_url)
    try:
        async with engine.connect() as conn:
            return await key_store.all_keys(conn)
    finally:
        await db.dispose(engine)


def private_numbers(row: key_store.SigningKeyRow) -> list[str]:
    """The key's private values as a JWK would carry them (base64url), to look for in answers."""
    numbers = keys.open_private(SecretBox(KEY), row).private_numbers()

    def b64(value: int) -> str:
        return (
            base64.urlsafe_b64encode(value.to_bytes((value.bit_length() + 7) // 8, "big"))
            .decode()
            .rstrip("=")
        )

    return [b64(v) for v in (numbers.d, numbers.p, numbers.q, numbers.dmp1, numbers.dmq1, numbers.iqmp)]


async def test_discovery__names_the_issuer_its_jwks_and_rs256(issuer_settings: ServerSettings) -> None:
    with live(issuer_settings) as served:
        issuer = served.resolved_public_url
        response = fetch(f"{issuer}/.well-known/openid-configuration")
        jwks = fetch(f"{issuer}/.well-known/jwks")
    document = response.json()

    assert issuer == document["issuer"]
    assert f"{issuer}/.well-known/jwks" == document["jwks_uri"]
    assert ["id_token"] == document["response_types_supported"]
    assert ["public"] == document["subject_types_supported"]
    assert ["RS256"] == document["id_token_signing_alg_values_supported"]
    assert {"iss", "sub", "aud", "iat", "nbf", "exp", "jti"} <= set(document["claims_supported"])
    assert response.headers["cache-control"].startswith("public, max-age=")
    assert 200 == jwks.status_code
    assert jwks.headers["cache-control"].startswith("public, max-age=")
    [published] = jwks.json()["keys"]
    assert {"kty": "RSA", "use": "sig", "alg": "RS256"}.items() <= published.items()
    assert [] == [field for field in PRIVATE_FIELDS if field in published]


async def test_discovery__under_the_public_urls_path(issuer_settings: ServerSettings) -> None:
    """With ``PO_PUBLIC_URL`` ``https://host/po``, clouds fetch ``/po/.well-known/openid-configuration``;
    a proxy that strips the prefix reaches the root's documents, which are the same."""
    with live(issuer_settings, path="/po") as served:
        issuer = served.resolved_public_url
        under = discovery(issuer)
        root = discovery(issuer.removesuffix("/po"))
        kids_under = published_kids(issuer)
        kids_root = fetch(issuer.removesuffix("/po") + "/.well-known/jwks").json()["keys"]

    assert issuer.endswith("/po")
    assert issuer == under["issuer"] == root["issuer"]
    assert f"{issuer}/.well-known/jwks" == under["jwks_uri"]
    assert kids_under == [key["kid"] for key in kids_root]


async def test_token__verifies_with_the_published_jwks_and_carries_the_claims(
    issuer_settings: ServerSettings,
) -> None:
    target = LaunchTarget(org_id="acme", runner_id="gke-1", runner_type="kubernetes-gke", configuration={})
    with live(issuer_settings) as served:
        async with replica(served) as issuer:
            identity = issuer.identity(target.subject)
            token = await identity.token(AUDIENCE)
            second = await identity.token(AUDIENCE)
        claims = verify(served.resolved_public_url, token)
    header = jwt.get_unverified_header(token)

    assert {"alg": "RS256", "typ": "JWT"}.items() <= header.items()
    assert served.resolved_public_url == claims["iss"]
    assert "acme+gke-1" == claims["sub"]
    assert AUDIENCE == claims["aud"]
    assert claims["iat"] == claims["nbf"]
    assert 900 == claims["exp"] - claims["iat"]
    assert claims["jti"] != jwt.decode(second, options={"verify_signature": False})["jti"]


async def test_token__another_audience_is_refused(issuer_settings: ServerSettings) -> None:
    with live(issuer_settings) as served:
        async with replica(served) as issuer:
            token = await issuer.identity("acme+eks-1").token(AUDIENCE)
        with pytest.raises(jwt.InvalidAudienceError):
            verify(served.resolved_public_url, token, audience="api://AzureADTokenExchange")


async def test_token__expires_after_its_lifetime(issuer_settings: ServerSettings) -> None:
    with time_machine.travel(datetime.now(UTC), tick=True) as traveller, live(issuer_settings) as served:
        async with replica(served) as issuer:
            token = await issuer.identity("acme+eks-1").token(AUDIENCE)
        verify(served.resolved_public_url, token)
        traveller.shift(timedelta(seconds=901))
        with pytest.raises(jwt.ExpiredSignatureError):
            verify(served.resolved_public_url, token)


async def test_token__without_an_audience_or_a_subject_is_refused(issuer_settings: ServerSettings) -> None:
    async with replica(issuer_settings) as issuer:
        with pytest.raises(LaunchError) as refused:
            await issuer.identity("acme+gke-1").token("")
        with pytest.raises(ValueError, match="org_id"):
            issuer.identity("acme")

    assert refused.value.retryable is False
    assert [] == await stored_keys(issuer_settings)


async def test_rotation__a_new_key_signs_after_the_period_the_old_stays_until_its_tokens_expired(
    issuer_settings: ServerSettings,
) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    with time_machine.travel(start, tick=True) as traveller, live(issuer_settings) as served:
        url = served.resolved_public_url
        async with replica(served) as issuer:
            first = await issuer.identity("acme+eks-1").token(AUDIENCE)
            assert [kid(first)] == published_kids(url)

            # Before the period ends the next key is published, and the first still signs. (The period
            # counts from the first key's making, which a loaded machine may put seconds after ``start``.)
            [made_first] = await stored_keys(served)
            traveller.move_to(
                made_first.signs_from + timedelta(seconds=ROTATION_SECONDS) - AHEAD + timedelta(seconds=5)
            )
            still_first = await issuer.identity("acme+eks-1").token(AUDIENCE)
            published = published_kids(url)
            assert kid(first) == kid(still_first)
            assert 2 == len(published)
            assert kid(first) == published[0]
            [row_first, row_second] = await stored_keys(served)
            traveller.move_to(row_second.signs_from - timedelta(seconds=5))
            last_of_first = await issuer.identity("acme+eks-1").token(AUDIENCE)

            # Once it signs: new tokens name it, the first key's last tokens still verify.
            traveller.move_to(row_second.signs_from + timedelta(seconds=1))
            second = await issuer.identity("acme+eks-1").token(AUDIENCE)
            assert kid(first) == kid(last_of_first)
            assert row_second.kid == kid(second) != kid(first)
            assert "acme+eks-1" == verify(url, last_of_first)["sub"]
            assert "acme+eks-1" == verify(url, second)["sub"]

            # The first key stays published until every token it signed has expired, then it is gone.
            retired = row_second.signs_from + keys.RETAIN_AFTER_RETIREMENT
            traveller.move_to(retired - timedelta(seconds=5))
            assert kid(first) in published_kids(url)
            # (A replica reads the published keys again at least every JWKS_REFRESH_SECONDS.)
            traveller.move_to(retired + timedelta(seconds=JWKS_REFRESH_SECONDS + 1))
            after = published_kids(url)
            third = await issuer.identity("acme+eks-1").token(AUDIENCE)

    assert kid(first) not in after
    assert row_second.kid in after
    assert [row_second.kid] == [row.kid for row in await stored_keys(served)][:1]
    assert row_first.kid == kid(first)
    assert kid(third) == row_second.kid  # the third key is published, not yet signing


async def test_rotation__a_restart_keeps_the_keys(issuer_settings: ServerSettings) -> None:
    """The keys are the database's: a token minted before a restart verifies with the JWKS after it."""
    audience = "api://AzureADTokenExchange"
    with live(issuer_settings) as served:
        async with replica(served) as issuer:
            token = await issuer.identity("acme+aks-1").token(audience)
        before = published_kids(served.resolved_public_url)
    with live(issuer_settings) as again:  # on another port: another public URL
        after = published_kids(again.resolved_public_url)
        claims = verify(again.resolved_public_url, token, audience, iss=served.resolved_public_url)

    assert before == after == [kid(token)]
    assert "acme+aks-1" == claims["sub"]


async def test_keys__the_private_key_is_sealed_and_in_no_answer(issuer_settings: ServerSettings) -> None:
    with capture_logs() as logs, live(issuer_settings) as served:
        url = served.resolved_public_url
        async with replica(served) as issuer:
            await issuer.identity("acme+gke-1").token(AUDIENCE)
        answers = [
            fetch(f"{url}{path}").text
            for path in ("/.well-known/openid-configuration", "/.well-known/jwks", "/openapi.json")
        ]
    [row] = await stored_keys(served)
    engine = db.create_engine(served.resolved_database_url)
    try:
        async with engine.connect() as conn:
            stored = [
                str(value) for value in (await conn.execute(sa.text("SELECT * FROM signing_keys"))).one()
            ]
    finally:
        await db.dispose(engine)
    secrets_of_key = private_numbers(row)
    der = SecretBox(KEY).open(row.private_key_sealed, context=keys.seal_context(row.kid))

    assert row.private_key_sealed.startswith("v1.")
    assert [] == [text for text in stored if "PRIVATE KEY" in text or der.hex() in text]
    assert [] == [n for n in secrets_of_key for text in [*stored, *answers, repr(logs)] if n in text]
    assert [] == [field for field in PRIVATE_FIELDS if f'"{field}"' in answers[1]]
    with pytest.raises(Exception, match="does not open"):  # sealed to its row: another context fails
        SecretBox(KEY).open(row.private_key_sealed, context=keys.seal_context("another"))
    # What is sealed is the private part of the key the JWKS publishes.
    private = serialization.load_der_private_key(der, password=None)
    assert isinstance(private, rsa.RSAPrivateKey)
    published = jwt.PyJWK(keys.published_jwk(row)).key
    assert isinstance(published, rsa.RSAPublicKey)
    assert published.public_numbers() == private.public_key().public_numbers()


async def test_keys__replicas_making_the_first_key_at_once_end_with_one(
    issuer_settings: ServerSettings,
) -> None:
    """Four replicas mint their first token at once on a new database: one key is made, all sign with it."""
    async with replica(issuer_settings):
        pass  # migrated
    async with (
        replica(issuer_settings) as a,
        replica(issuer_settings) as b,
        replica(issuer_settings) as c,
        replica(issuer_settings) as d,
    ):
        tokens = await asyncio.gather(*(r.identity("acme+ecs-1").token(AUDIENCE) for r in (a, b, c, d)))
        published = [[key["kid"] for key in await r.published_keys()] for r in (a, b, c, d)]
    rows = await stored_keys(issuer_settings)

    assert 1 == len(rows)
    assert [rows[0].kid] * 4 == [kid(token) for token in tokens]
    assert [[rows[0].kid]] * 4 == published


async def test_issuer__a_cached_current_key_signs_without_reading_the_database(
    issuer_settings: ServerSettings,
) -> None:
    statements: list[str] = []

    def count(_conn: Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engine = db.create_engine(issuer_settings.resolved_database_url)
    try:
        await migrate.upgrade(engine)
        issuer = WorkloadIssuer(engine, SecretBox(KEY), issuer_settings)
        await issuer.identity("acme+gke-1").token(AUDIENCE)
        for watched in {engine, db.readonly(engine)}:
            sa.event.listen(watched.sync_engine, "before_cursor_execute", count)
        tokens = [await issuer.identity("acme+gke-1").token(AUDIENCE) for _ in range(20)]
    finally:
        await db.dispose(engine)

    assert [] == statements
    assert 20 == len({jwt.decode(t, options={"verify_signature": False})["jti"] for t in tokens})


@pytest.mark.parametrize(
    ("public_url", "warned"), [("http://po.example", True), ("https://po.example", False)]
)
async def test_server__warns_at_start_when_the_issuer_is_not_https(
    issuer_settings: ServerSettings, public_url: str, warned: bool
) -> None:
    app = create_app(issuer_settings.model_copy(update={"public_url": public_url}), run_dispatcher=False)
    with capture_logs() as logs:
        async with app.router.lifespan_context(app):
            pass

    warnings = [e for e in logs if e["log_level"] == "warning" and "OIDC issuer" in e["event"]]
    assert warned == bool(warnings)
    assert [public_url] * len(warnings) == [e["issuer"] for e in warnings]
