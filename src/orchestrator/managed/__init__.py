"""``po-runner managed``: a runner of the platform's Managed pool (seed 004).

It registers with the managed runner secret, then heartbeats and long-polls ``/runner/claim`` with its own
token, and runs ``po-runner standard`` for each claimed deployment in a fresh work directory. Nothing here
imports server code: it ships in the runner image. See docs/runners/managed.md.
"""
