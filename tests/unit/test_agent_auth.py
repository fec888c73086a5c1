"""Agent JWTs: signed per request with the agent's Ed25519 key, verified against the registered public key."""

from __future__ import annotations

import hashlib
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from orchestrator.domain.key_material import load_agent_public_key
from orchestrator.protocol import agent_auth

NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _verify(
    token: str, key: Ed25519PrivateKey, *, org: str = "acme", runner: str = "r1", now: float = NOW
) -> None:
    agent_auth.verify(token, key.public_key(), org_id=org, runner_id=runner, now=now)


def test_sign__upstream_header_and_claims(key: Ed25519PrivateKey) -> None:
    token = agent_auth.sign(key, "acme", "r1", now=NOW)
    header = jwt.get_unverified_header(token)
    claims = jwt.decode(token, options={"verify_signature": False})
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    assert ("EdDSA", "JWT", hashlib.sha256(raw).hexdigest()) == (header["alg"], header["typ"], header["kid"])
    jti = claims.pop("jti")
    assert {
        "aud": "platform-orchestrator-runner-gateway",
        "org_id": "acme",
        "runner_id": "r1",
        "iat": int(NOW),
        "exp": int(NOW) + 300,
    } == claims
    assert isinstance(jti, str) and len(jti) >= 20


def test_sign__tokens_of_one_second_differ_by_their_jti(key: Ed25519PrivateKey) -> None:
    """Without jti two tokens signed in the same second are byte for byte equal (EdDSA is deterministic):
    the gateway could not tell a replay from the next request."""
    first, second = agent_auth.sign(key, "acme", "r1", now=NOW), agent_auth.sign(key, "acme", "r1", now=NOW)
    upstream_first, upstream_second = _forge(key, BASE), _forge(key, BASE)

    assert first != second
    assert upstream_first == upstream_second


def test_use_key__jti_with_its_runner_or_the_whole_token(key: Ed25519PrivateKey) -> None:
    token = agent_auth.sign(key, "acme", "r1", now=NOW)
    claims = agent_auth.verify(token, key.public_key(), org_id="acme", runner_id="r1", now=NOW)
    upstream = _forge(key, BASE)
    upstream_claims = agent_auth.verify(upstream, key.public_key(), org_id="acme", runner_id="r1", now=NOW)

    digest, has_jti = agent_auth.use_key(token, claims)
    other_runner, _ = agent_auth.use_key(token, {**claims, "runner_id": "r2"})
    upstream_digest, upstream_has_jti = agent_auth.use_key(upstream, upstream_claims)

    assert has_jti and not upstream_has_jti
    assert digest != other_runner
    assert upstream_digest == agent_auth.use_key(upstream, upstream_claims)[0] != digest


@pytest.mark.parametrize("jti", ["", 5, "x" * 257])
def test_verify__malformed_jti_refused(key: Ed25519PrivateKey, jti: object) -> None:
    with pytest.raises(agent_auth.AgentTokenError, match=r"(?i)jti|JWT ID"):
        _verify(_forge(key, {**BASE, "jti": jti}), key)


def test_verify__accepts_its_own_token_and_a_generated_pem_pair() -> None:
    private_pem, public_pem = agent_auth.generate_key_pair()
    private = agent_auth.load_private_key(private_pem)
    token = agent_auth.sign(private, "acme", "r1")

    claims = agent_auth.verify(token, load_agent_public_key(public_pem), org_id="acme", runner_id="r1")

    assert ("acme", "r1") == (claims["org_id"], claims["runner_id"])


def test_verify__wrong_key_refused(key: Ed25519PrivateKey) -> None:
    token = agent_auth.sign(Ed25519PrivateKey.generate(), "acme", "r1", now=NOW)

    with pytest.raises(agent_auth.AgentTokenError):
        _verify(token, key)


@pytest.mark.parametrize(("org", "runner"), [("globex", "r1"), ("acme", "r2")])
def test_verify__token_of_another_org_or_runner_refused(
    key: Ed25519PrivateKey, org: str, runner: str
) -> None:
    token = agent_auth.sign(key, "acme", "r1", now=NOW)

    with pytest.raises(agent_auth.AgentTokenError, match="another runner"):
        _verify(token, key, org=org, runner=runner)


@pytest.mark.parametrize(
    ("issued", "valid"),
    [
        (NOW, True),
        (NOW + 29, True),  # the agent's clock is ahead, within the skew
        (NOW + 31, False),  # ... beyond it
        (NOW - 300 - 29, True),  # expired 29 s ago: within the skew
        (NOW - 300 - 31, False),  # expired
    ],
)
def test_verify__thirty_seconds_of_skew(key: Ed25519PrivateKey, issued: float, valid: bool) -> None:
    token = agent_auth.sign(key, "acme", "r1", now=issued)

    if valid:
        _verify(token, key)
    else:
        with pytest.raises(agent_auth.AgentTokenError):
            _verify(token, key)


def _forge(
    key: Ed25519PrivateKey, claims: dict[str, object], headers: dict[str, object] | None = None
) -> str:
    return jwt.encode(claims, key, algorithm="EdDSA", headers=headers)


BASE = {
    "aud": agent_auth.AUDIENCE,
    "org_id": "acme",
    "runner_id": "r1",
    "iat": int(NOW),
    "exp": int(NOW) + 300,
}


@pytest.mark.parametrize(
    "claims",
    [
        {**BASE, "exp": int(NOW) + 3600},  # longer-lived than 300 s
        {**BASE, "aud": "someone-else"},
        {k: v for k, v in BASE.items() if k != "iat"},
        {k: v for k, v in BASE.items() if k != "runner_id"},
        {**BASE, "iat": "yesterday"},
    ],
    ids=["lifetime", "audience", "no-iat", "no-runner", "iat-not-a-number"],
)
def test_verify__forged_claims_refused(key: Ed25519PrivateKey, claims: dict[str, object]) -> None:
    with pytest.raises(agent_auth.AgentTokenError):
        _verify(_forge(key, claims), key)


def test_verify__kid_of_another_key_refused(key: Ed25519PrivateKey) -> None:
    token = _forge(key, BASE, {"kid": "00" * 32})

    with pytest.raises(agent_auth.AgentTokenError, match="kid"):
        _verify(token, key)


def test_verify__other_algorithms_refused(key: Ed25519PrivateKey) -> None:
    hmac_token = jwt.encode(BASE, "a-shared-secret-of-32-bytes-min!", algorithm="HS256")
    unsigned = jwt.encode(BASE, "", algorithm="none")  # PyJWT takes "" as no key for "none"

    for token in (hmac_token, unsigned, "not.a.jwt", ""):
        with pytest.raises(agent_auth.AgentTokenError):
            _verify(token, key)


def test_load_private_key__refuses_non_ed25519_and_garbage_without_echoing_it() -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )

    with pytest.raises(agent_auth.AgentKeyError, match="not an Ed25519 key"):
        agent_auth.load_private_key(ec_pem)
    with pytest.raises(agent_auth.AgentKeyError) as garbage:
        agent_auth.load_private_key("secret-garbage")
    assert "secret-garbage" not in str(garbage.value)


def test_sign__uses_the_clock_by_default(key: Ed25519PrivateKey) -> None:
    before = int(time.time())
    claims = jwt.decode(agent_auth.sign(key, "acme", "r1"), options={"verify_signature": False})

    assert before <= claims["iat"] <= int(time.time())
