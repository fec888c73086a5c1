"""The problems of a gateway request body that does not validate, as the gateway's 400 answers list them
in ``details.errors``."""

from __future__ import annotations

from pydantic import ValidationError


def of(exc: ValidationError, *, prefix: str = "") -> list[dict[str, str]]:
    """Each error of ``exc`` as ``{"field": "a.b", "problem": message}``, ``prefix`` before each field
    (where the validated value sits in the body); never the input itself (it may hold secrets)."""
    return [
        {"field": prefix + ".".join(str(part) for part in error["loc"]), "problem": error["msg"]}
        for error in exc.errors(include_url=False, include_input=False)
    ]
