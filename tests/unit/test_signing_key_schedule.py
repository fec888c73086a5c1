"""The OIDC issuer's key schedule (``identity.keys``), over stored rows: which key signs, when the next is
made and signs, until when a cached current key holds, which retired keys go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orchestrator.identity import keys
from orchestrator.store.signing_keys import SigningKeyRow

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DAY = 86400.0
HOUR = timedelta(hours=1)


def row(generation: int, signs_from: datetime) -> SigningKeyRow:
    return SigningKeyRow(
        kid=f"k{generation}",
        generation=generation,
        algorithm="RS256",
        public_jwk="{}",
        private_key_sealed="v1.x",
        created_at=signs_from - HOUR,
        signs_from=signs_from,
    )


def test_schedule__the_first_key_signs_at_once() -> None:
    assert T0 == keys.next_key_signs_from([], T0, DAY)


def test_schedule__the_next_key_is_made_an_hour_before_the_period_ends_and_signs_then() -> None:
    first = row(1, T0)
    due = T0 + timedelta(seconds=DAY) - HOUR

    assert keys.next_key_signs_from([first], due - timedelta(seconds=1), DAY) is None
    assert due + HOUR == keys.next_key_signs_from([first], due, DAY)
    assert due == keys.current_until([first], first, DAY)


def test_schedule__a_published_next_key_waits_for_its_turn() -> None:
    first, second = row(1, T0), row(2, T0 + timedelta(seconds=DAY))
    before = second.signs_from - timedelta(seconds=1)

    assert keys.next_key_signs_from([first, second], before, DAY) is None
    assert first == keys.current([first, second], before)
    assert second == keys.current([first, second], second.signs_from)
    assert second.signs_from == keys.current_until([first, second], first, DAY)


def test_schedule__a_late_rotation_still_publishes_ahead() -> None:
    """After a long pause (no token, no JWKS request) the next key still signs only an hour after it was
    made; the old key signs until then."""
    first = row(1, T0)
    late = T0 + timedelta(days=5)

    assert late + HOUR == keys.next_key_signs_from([first], late, DAY)


def test_schedule__a_short_period_publishes_half_a_period_ahead() -> None:
    assert 1800.0 == keys.publish_ahead_seconds(3600.0)
    assert 3600.0 == keys.publish_ahead_seconds(DAY)


def test_schedule__a_retired_key_goes_once_its_tokens_expired() -> None:
    first, second = row(1, T0), row(2, T0 + timedelta(seconds=DAY))
    gone_at = second.signs_from + keys.RETAIN_AFTER_RETIREMENT

    assert [] == keys.expired([first, second], gone_at - timedelta(seconds=1))
    assert ["k1"] == keys.expired([first, second], gone_at)
    assert [] == keys.expired([second], gone_at + timedelta(days=1))
