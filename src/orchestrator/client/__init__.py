"""Clients of the orchestrator's HTTP APIs (no server code: they ship without the ``server`` extra).

- ``http``: the base every client is built on (TLS, timeouts, no redirects, retries with backoff);
- ``errors``: their one error tree, and the server's ``{error, message, details}`` body read once;
- ``tls``: the CAs and the mTLS pair towards the runner gateway, and the plain-``http`` fast path;
- ``gateway``: what the runner's and the agent's gateway clients share;
- ``api``: ``octl``'s client of the user API.

Nothing is imported here, so that the runner and the agent load only the modules they use.
"""
