"""Runner-facing HTTP (``/runner-gateway/v1/...``): bundles, results, logs, and Terraform state.

Apart from ``api/`` because runners and agents run in customer infrastructure and upgrade late: own
authentication (per-deployment tokens), own compatibility promise (``orchestrator.protocol``).
"""
