"""The workload launched for one deployment (``po-runner standard``).

It downloads the deployment bundle from the runner gateway, runs OpenTofu/Terraform on it, and reports
the results (outputs age-encrypted) and the encrypted logs back to the gateway.

Key contracts:
- Runner code never imports server code (store, dispatch, api, gateway, fastapi, sqlalchemy): it ships
  as a separate image. It talks to the gateway only through ``orchestrator.protocol``.
- Results are always posted, failures included; the process exits 1 when the deployment failed or
  its results could not be delivered.
- Nothing secret reaches the logs: the TOKEN is redacted from every log line, and ``show``/``output``
  (which print output values) are never teed into them.

Pitfalls:
- The runner is deliberately synchronous: one ``subprocess.Popen`` per IaC command, argv lists only.
- Only the CLI edge reads the process environment; everything here receives settings and an environ.
"""

from __future__ import annotations
