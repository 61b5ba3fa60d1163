"""Where the project lives and where its results go (`SUITE_RESULTS_DIR` moves the latter)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Read as `paths.RESULTS_DIR` at call time where tests point it at a temporary folder.
RESULTS_DIR = Path(os.environ.get("SUITE_RESULTS_DIR", os.path.join(ROOT, "results")))
