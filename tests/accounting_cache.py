"""Where the test suite keeps remembered accounting figures (privacy.accounting.memo)."""

from __future__ import annotations

import hashlib
import tempfile
from importlib.metadata import version
from pathlib import Path


def accounting_cache_folder() -> str:
    """One folder for both test workers and for later runs of the same code: named by a hash of the code
    that computes the figures and of dp_accounting's version, so a change to either starts an empty one."""
    digest = hashlib.sha256(version("dp-accounting").encode())
    for source in sorted((Path(__file__).resolve().parents[1] / "privacy" / "accounting").glob("*.py")):
        digest.update(source.read_bytes())
    return str(Path(tempfile.gettempdir()) / f"uedp-test-accounting-{digest.hexdigest()[:16]}")
