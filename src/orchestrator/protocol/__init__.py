"""Wire models shared by the runner gateway and the runner workload (pydantic only).

Everything here is part of the gateway's compatibility promise: runners upgrade late, so a field is
added as optional, and never renamed or removed. Nothing here imports server code.

- ``results``: the body a runner posts when a deployment ends, the gateway limits and paths.
- ``age``: age (X25519) encryption of deployment outputs and logs.
"""

from __future__ import annotations
