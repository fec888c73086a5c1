"""User-facing HTTP API (``/orgs/...``): routes, request/response schemas and error handlers."""
