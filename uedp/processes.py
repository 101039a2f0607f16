"""Process helpers shared by the layers that keep leases on processes (MLflow runs, uedp's Prefect server)."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts: signalling it is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
