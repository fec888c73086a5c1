"""Runner definitions of tests/data/runners, for tests that create a runner: ``RUNNER`` is the vm runner
with a local connection (``vm-local.yaml``)."""

from __future__ import annotations

from pathlib import Path

import yaml

RUNNER = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text())
