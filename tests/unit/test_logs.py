"""The processes' log configuration (``orchestrator.logs``): JSON or console, the level, standard logging
through the same renderer, the redaction safety net; and the checks the no-secrets acceptance test uses."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import structlog

from orchestrator import logs
from orchestrator.protocol import agent_auth
from tests.support.log_lines import configured, json_lines, secret_hits, token_shaped


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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json__one_object_a_line_with_event_level_time_and_context() -> None:
    with configured("info", "json") as out:
        structlog.contextvars.bind_contextvars(request_id="r-1")
        try:
            structlog.get_logger("t").info("runner launched", handle="h-1")
        finally:
            structlog.contextvars.clear_contextvars()
    [line] = json_lines(out.getvalue())[0]

    assert ("runner launched", "info", "r-1", "h-1") == (
        line["event"],
        line["level"],
        line["request_id"],
        line["handle"],
    )
    assert datetime.fromisoformat(line["time"]).utcoffset() == timedelta(0)


def test_console__key_value_text_not_json() -> None:
    with configured("info", "console") as out:
        structlog.get_logger("t").info("runner launched", handle="h-1")
    text = out.getvalue()

    assert ([], 1) == (json_lines(text)[0], len(text.splitlines()))
    assert "runner launched" in text and "handle=h-1" in text and "[info" in text


def test_format__json_unless_a_terminal() -> None:
    with configured("info", None) as piped:
        structlog.get_logger("t").info("piped")
    with configured("info", None, stream=_Terminal()) as terminal:
        structlog.get_logger("t").info("on a terminal")

    assert ["piped"] == [line["event"] for line in json_lines(piped.getvalue())[0]]
    assert ([], True) == (
        json_lines(terminal.getvalue())[0],
        "[info     ] on a terminal" in terminal.getvalue(),
    )


def test_level__lines_below_it_dropped_structlog_and_stdlib_alike() -> None:
    with configured("warning") as out:
        for logger in (structlog.get_logger("t"), logging.getLogger("uvicorn.error")):
            logger.info("dropped")
            logger.warning("kept")
    lines, other = json_lines(out.getvalue())

    assert ([], ["kept", "kept"]) == (other, [line["event"] for line in lines])


def test_unknown_level__info_and_a_warning_naming_it() -> None:
    with configured("loud") as out:
        structlog.get_logger("t").debug("dropped")
        structlog.get_logger("t").info("kept")
    lines = json_lines(out.getvalue())[0]

    assert [("unknown log level, using info", "loud"), ("kept", None)] == [
        (line["event"], line.get("log_level")) for line in lines
    ]


def test_stdlib__through_the_same_renderer_with_logger_name_context_and_traceback() -> None:
    with configured("debug") as out:
        structlog.contextvars.bind_contextvars(request_id="r-2")
        try:
            logging.getLogger("uvicorn.access").info('%s - "%s %s" %d', "127.0.0.1:1", "GET", "/healthz", 200)
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
        finally:
            structlog.contextvars.clear_contextvars()
    lines, other = json_lines(out.getvalue())

    assert [] == other
    assert [
        ('127.0.0.1:1 - "GET /healthz" 200', "info", "uvicorn.access", "r-2"),
        ("Exception in ASGI application", "error", "uvicorn.error", "r-2"),
    ] == [(line["event"], line["level"], line["logger"], line["request_id"]) for line in lines]
    assert "RuntimeError: boom" in lines[1]["exception"]


def test_quiet_libraries__sql_statements_never_logged_even_at_debug() -> None:
    """SQLAlchemy's engine logs each statement with its parameters at INFO (token digests, sealed values);
    aiosqlite each call with its arguments at DEBUG."""
    with configured("debug") as out:
        logging.getLogger("sqlalchemy.engine.Engine").info("INSERT INTO tokens VALUES (?)")
        logging.getLogger("aiosqlite").debug("executing <function insert>")
        logging.getLogger("sqlalchemy.pool").warning("pool warning kept")

    assert ["pool warning kept"] == [line["event"] for line in json_lines(out.getvalue())[0]]


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("token", True),
        ("api_token", True),
        ("X-Deployment-Token", True),
        ("Authorization", True),
        ("PRIVATE_KEY", True),
        ("privateKey", True),
        ("managed_runner_secret", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("password", True),
        ("DecryptKey", True),
        ("token_id", False),
        ("secret_names", False),
        ("kid", False),
        ("event", False),
        ("request_id", False),
    ],
)
def test_secret_key__credentials_not_what_names_them(key: str, secret: bool) -> None:
    assert secret == logs.secret_key(key)


def test_redact__secret_keys_and_credential_text_at_any_depth() -> None:
    pem = agent_auth.generate_key_pair()[0]
    jwt = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhZ2VudCJ9.c2lnbmF0dXJlLWJ5dGVz"
    with configured("info") as out:
        structlog.get_logger("t").info(
            "request",
            token="po_abc",
            token_id="t-1",
            headers={"Authorization": "Bearer po_abc", "Accept": "application/json"},
            note=f"key {pem} sent",
            said=[
                f"Bearer {jwt}",
                "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQ",
                "sent Authorization: Bearer po_4x9Yq2LmZt8",
                "Basic ZGVwbG95bWVudDp0b2tlbg==",
                "Basic authentication required",
            ],
        )
        logging.getLogger("httpx").info("sent %s", jwt)
    first, second = json_lines(out.getvalue())[0]

    assert {
        "token": "[REDACTED]",
        "token_id": "t-1",
        "headers": {"Authorization": "[REDACTED]", "Accept": "application/json"},
        "note": "key [REDACTED]\n sent",
        "said": [
            "[REDACTED]",
            "[REDACTED]",
            "sent Authorization: [REDACTED]",
            "[REDACTED]",
            "Basic authentication required",
        ],
    }.items() <= first.items()
    assert "sent [REDACTED]" == second["event"]


def test_from_environ__po_variables_then_upstreams_log_level() -> None:
    assert ("info", None) == logs.from_environ({})
    assert ("warn", None) == logs.from_environ({"LOG_LEVEL": "warn"})
    assert ("debug", "console") == logs.from_environ(
        {"PO_LOG_LEVEL": "DEBUG", "LOG_LEVEL": "error", "PO_LOG_FORMAT": "console"}
    )


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"PO_LOG_LEVEL": "loud"}, "PO_LOG_LEVEL: 'loud' is not one of debug, info"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL: 'loud' is not one of debug, info"),
        ({"PO_LOG_FORMAT": "xml"}, "PO_LOG_FORMAT: 'xml' is not one of json, console"),
    ],
)
def test_from_environ__a_wrong_value_names_its_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        logs.from_environ(environ)


def test_secret_hits__finds_a_secret_in_a_line_a_pem_body_and_a_json_escaped_pem() -> None:
    """The no-secrets acceptance test's check can fail: each of these lines is caught."""
    private_pem, _ = agent_auth.generate_key_pair()
    body_line = private_pem.splitlines()[1]
    found = secret_hits(
        {
            "plain": "token=s3cr3t-value-123\nnothing here",
            "pem body": f"key material {body_line}",
            "json": json.dumps({"event": "x", "pem": private_pem}),
        },
        {"token": "s3cr3t-value-123", "agent key": private_pem},
    )

    assert [
        "token in plain: token=s3cr3t-value-123",
        f"agent key in pem body: key material {body_line}",
    ] == found[:2]
    assert 3 == len(found) and found[2].startswith("agent key in json: ")


def test_token_shaped__random_tokens_and_jwts_not_ids_or_words() -> None:
    token = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWo"
    jwt = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhZ2VudCJ9.c2lnbmF0dXJl"
    text = (
        f"registered {token} with {jwt}; deployment 49bcd749-35f1-411e-b964-d03ba7d98bcd in "
        "/tmp/test_deployments_at_debug__no_log_line_holds0/work"
    )

    assert [token, jwt] == token_shaped(text)
