"""The runner agent (``po-runner remote``): runs inside infrastructure the orchestrator cannot reach.

It long-polls the runner gateway for commands over outbound HTTPS, launches each deployment's runner in
its own compute, and reports back with events; every request is signed with the agent's Ed25519 key
(``protocol.agent_auth``). The launched runner gets only its deployment token and the gateway URL, never
the agent's key. Nothing here imports server code.

- ``settings``: ``AgentSettings`` from the upstream environment variables.
- ``client``: the gateway's command routes.
- ``launchers``: which launcher runs a command (local process, or a Kubernetes Job).
- ``kubernetes``: the agent's cluster (kubeconfig or in-cluster) and the stuck-pod check.
- ``loop``: next → validate → launch → ``job-created`` → ack, and the failure paths.
"""

from __future__ import annotations
