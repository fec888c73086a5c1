"""Clients of the orchestrator's HTTP APIs (no server code: they ship without the ``server`` extra)."""

from __future__ import annotations

from orchestrator.client.api import ApiClient, ApiConnectionError, ApiError, JsonObject

__all__ = ["ApiClient", "ApiConnectionError", "ApiError", "JsonObject"]
