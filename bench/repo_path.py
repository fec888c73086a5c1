"""Imported for its effect: puts the repository's root on ``sys.path``.

A benchmark run as ``uv run python bench/X.py`` has only ``bench/`` there, so it could not import the test
stand-ins (``tests.support``). Import this module before any ``tests.`` import (isort keeps it there: it is
a third-party-looking module, and ``tests`` is first-party).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
