"""User-facing HTTP API (``/orgs/...``): routes, request/response schemas, the caller's token and role.

The error answers, input checks, OpenAPI document and request services it shares with the gateway are in
``web/``."""
