"""What the user API (``api/``) and the runner gateway (``gateway/``) both stand on: the request's services
and transactions, the error answers, the input checks in front of every route, the OpenAPI document.

Beside neither: ``api/`` and ``gateway/`` import this package, never each other.
"""
