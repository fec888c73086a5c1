"""The process's log configuration keeps secrets out of library debug lines."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from orchestrator import logs


@pytest.fixture
def restored_levels() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in logs.CHATTY}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def test_quiet_chatty_libraries__botocore_never_logs_requests_at_debug(restored_levels: None) -> None:
    """botocore's DEBUG lines hold request bodies and headers (AssumeRoleWithWebIdentity's token, the
    credentials STS answers, X-Amz-Security-Token): even with the root logger at DEBUG they are dropped."""
    logging.getLogger("botocore").setLevel(logging.NOTSET)
    logging.getLogger("urllib3").setLevel(logging.ERROR)

    logs.quiet_chatty_libraries()

    assert logging.getLogger("botocore.endpoint").getEffectiveLevel() == logging.INFO
    assert not logging.getLogger("botocore.parsers").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("urllib3").level == logging.ERROR  # a higher level stays
