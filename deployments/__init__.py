"""uedp's Prefect deployments (``prefect.yaml``), shipped inside the package so ``uedp serve`` finds them
from an installed wheel in any directory."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PREFECT_YAML = Path(str(files(__name__) / "prefect.yaml"))
