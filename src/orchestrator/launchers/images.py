"""Our container images' names, in one place: the runner image (``po-runner``; the agent runs it too) and
the server image, both tagged with this package's version.

``DEFAULT_RUNNER_IMAGE`` is what every launcher runs when the runner's configuration names no image: the
``kubernetes`` Jobs (and so GKE, EKS, AKS and the ``kubernetes-agent`` commands), ``serverless-ecs``'s
task definition, and ``vm`` over SSH with a container runtime. The agent's Helm chart names the same
repository with the same tag (its ``appVersion``); ``tests/unit/test_images.py`` checks that they agree.
The Dockerfiles are ``images/runner/Dockerfile`` and ``images/server/Dockerfile``.

Upstream's image (``ghcr.io/stellwerk-labs/platform-orchestrator-runner``) is not ours: a runner's
``pod_template`` or ``job.image`` may still name it, and wins over this default.
"""

from __future__ import annotations

from importlib import metadata
from typing import Final

__all__ = [
    "DEFAULT_RUNNER_IMAGE",
    "DEFAULT_SERVER_IMAGE",
    "IMAGE_TAG",
    "RUNNER_IMAGE_REPOSITORY",
    "SERVER_IMAGE_REPOSITORY",
]

#: The distribution whose version tags the images (pyproject.toml's ``project.name``).
DISTRIBUTION: Final = "platform-orchestrator"
RUNNER_IMAGE_REPOSITORY: Final = "ghcr.io/platform-orchestrator/po-runner"
SERVER_IMAGE_REPOSITORY: Final = "ghcr.io/platform-orchestrator/orchestrator"
#: The installed package's version: the images of a release carry its version as their tag.
IMAGE_TAG: Final = metadata.version(DISTRIBUTION)
DEFAULT_RUNNER_IMAGE: Final = f"{RUNNER_IMAGE_REPOSITORY}:{IMAGE_TAG}"
DEFAULT_SERVER_IMAGE: Final = f"{SERVER_IMAGE_REPOSITORY}:{IMAGE_TAG}"
