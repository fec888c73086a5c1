"""Request ids: every answer carries ``X-Request-ID`` (the request's own when sane, else a new one), error
answers included, and the lines logged while serving the request carry it as ``request_id``."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
import structlog
from fastapi import FastAPI

from tests.support.log_lines import configured, json_lines

GENERATED = re.compile(r"[0-9a-f]{32}")


def _client(app: FastAPI, **headers: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://po.test", headers=headers)


async def test_request_id__generated_when_absent_a_new_one_each_time(app: FastAPI) -> None:
    async with _client(app) as client:
        first = await client.get("/healthz")
        second = await client.get("/healthz")

    assert GENERATED.fullmatch(first.headers["X-Request-ID"]), first.headers
    assert GENERATED.fullmatch(second.headers["X-Request-ID"]), second.headers
    assert first.headers["X-Request-ID"] != second.headers["X-Request-ID"]


@pytest.mark.parametrize(
    "presented",
    ["4bf92f3577b34da6a3ce929d0e0e4736", "trace-1:span/2+x=y@z.w", "a", "x" * 128],
)
async def test_request_id__a_sane_one_is_kept(app: FastAPI, presented: str) -> None:
    async with _client(app, **{"X-Request-ID": presented}) as client:
        answer = await client.get("/healthz")

    assert presented == answer.headers["X-Request-ID"]


@pytest.mark.parametrize(
    "presented",
    ["x" * 129, "two words", 'quote"d', "semi;colon", "new\tline", "<script>", "caf\u00e9", ""],
)
async def test_request_id__an_insane_one_is_replaced(app: FastAPI, presented: str) -> None:
    async with _client(app) as client:
        answer = await client.get("/healthz", headers={b"X-Request-ID": presented.encode("latin-1")})

    assert GENERATED.fullmatch(answer.headers["X-Request-ID"]), answer.headers


async def test_request_id__on_error_answers_and_on_their_log_lines(app: FastAPI) -> None:
    async def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/test-only/broken", broken)
    answers: dict[str, httpx.Response] = {}
    with configured("info") as out:
        async with _client(app, Authorization="Bearer po_not-a-token") as client:
            for rid, path in [
                ("r-401", "/orgs/acme/projects"),
                ("r-404", "/no-such-path"),
                ("r-500", "/test-only/broken"),
            ]:
                answers[rid] = await client.get(path, headers={"X-Request-ID": rid})
            answers["r-400"] = await client.get(
                f"/runner-gateway/v1/orgs/acme/runners/local/deployments/{uuid.uuid4()}/bundle",
                headers={"X-Request-ID": "r-400"},
            )
    lines = json_lines(out.getvalue())[0]
    unexpected = [line for line in lines if line["event"] == "unexpected error"]

    assert {"r-401": 401, "r-404": 404, "r-500": 500, "r-400": 400} == {
        rid: answer.status_code for rid, answer in answers.items()
    }
    assert {rid: rid for rid in answers} == {
        rid: answer.headers.get("X-Request-ID") for rid, answer in answers.items()
    }
    assert [("r-500", answers["r-500"].json()["details"]["error_id"])] == [
        (line.get("request_id"), line["error_id"]) for line in unexpected
    ]


async def test_request_id__not_carried_by_lines_after_the_request(app: FastAPI) -> None:
    with configured("info") as out:
        async with _client(app, **{"X-Request-ID": "r-done"}) as client:
            await client.get("/healthz")
        structlog.get_logger("t").info("after the request")
    lines = json_lines(out.getvalue())[0]

    assert ("after the request", None) == (lines[-1]["event"], lines[-1].get("request_id")), lines
