"""Checkpoints of a training loop, written every N rounds and read back after a crash.

A checkpoint holds everything the next round depends on: model weights, optimizer state, torch's global
generator and the accountant. It never holds the secret root of a private run's randomness
(PRIVACY.md rule 5): a seeded run derives every round's randomness from its seed again and replays
exactly; a secure run resumes with a fresh root. Restoring the
accountant with the weights is what keeps a resumed run honest: its epsilon continues from the
rounds already composed instead of starting again at zero. A seeded run's resumed rounds replay exactly
what the crashed run would have done (a test checks weights and epsilon are identical).

Files are replaced atomically (write, then rename), so a crash while saving leaves the previous
checkpoint intact. A checkpoint records a fingerprint of the configuration that wrote it; resuming
under any other configuration is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

FILE = "checkpoint.pt"
RELEASED_FILE = "released.json"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


Restorable = Stateful | torch.Generator


class CheckpointMismatch(ValueError):
    """The checkpoint on disk was written by another configuration."""


class Checkpointer:
    """Saves ``{name: object}`` state every ``every`` rounds under a scope (one per training phase)."""

    def __init__(self, folder: Path | None, every: int, fingerprint: str = "", writes: bool = True):
        # ``writes=False``: restore only (torchrun's other processes; the main one writes).
        self.folder, self.every, self.fingerprint, self.writes = folder, every, fingerprint, writes

    @property
    def enabled(self) -> bool:
        return self.folder is not None and self.every > 0

    @property
    def path(self) -> Path | None:
        return self.folder / FILE if self.folder is not None else None

    def _load(self) -> dict[str, Any] | None:
        if not self.enabled or self.path is None or not self.path.is_file():
            return None
        saved: dict[str, Any] = torch.load(self.path, map_location="cpu", weights_only=False)
        if saved.get("fingerprint") != self.fingerprint:
            raise CheckpointMismatch(f"{self.path} was written by another configuration; delete it to start over")
        return saved

    def saved_scope(self) -> str | None:
        saved = self._load()
        return saved["scope"] if saved else None

    def restore(self, scope: str, objects: dict[str, Restorable]) -> dict[str, Any] | None:
        """Load the saved state of ``scope`` into ``objects``; return its scalars (incl. ``round``), or None."""
        saved = self._load()
        if saved is None or saved["scope"] != scope:
            return None
        for name, obj in objects.items():
            _load_into(obj, saved["objects"][name])
        torch.set_rng_state(saved["torch_rng"])
        if torch.cuda.is_available() and saved.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        return dict(saved["scalars"])

    def maybe_save(self, scope: str, round_index: int, objects: dict[str, Restorable], **scalars: Any) -> bool:
        """Save when ``round_index`` is a multiple of ``every``; True when it saved."""
        if not self.enabled or not self.writes or round_index % self.every:
            return False
        self.save(scope, round_index, objects, **scalars)
        return True

    def save(self, scope: str, round_index: int, objects: dict[str, Restorable], **scalars: Any) -> None:
        assert self.folder is not None and self.path is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        state = {
            "fingerprint": self.fingerprint, "scope": scope, "scalars": {"round": round_index, **scalars},
            "objects": {name: _state_of(obj) for name, obj in objects.items()},
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        partial = self.path.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, self.path)

    def released(self, name: str, draw: Callable[[], float]) -> float:
        """A value this run has released already (a DP count), else ``draw()``, kept for a resume.

        A crashed run's MLflow params hold what it drew; drawing again after a restart would be a second
        release, composing with the first. It is a released figure, not a seed: storing it keeps nothing
        secret. Without checkpoints nothing is kept (there is no resume).
        """
        path = self.folder / RELEASED_FILE if self.folder is not None else None
        saved = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else {}
        if name in saved:
            return float(saved[name])
        value = draw()
        if path is not None and self.enabled and self.writes:
            self.folder.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps({**saved, name: value}), encoding="utf-8")
            os.replace(partial, path)
        return value

    def clear(self) -> None:
        """Remove the checkpoint once the run has finished (a finished run is not resumed)."""
        if self.path is not None and self.writes:
            self.path.unlink(missing_ok=True)
            (self.path.parent / RELEASED_FILE).unlink(missing_ok=True)


NO_CHECKPOINT = Checkpointer(None, 0)


def _state_of(obj: Restorable) -> Any:
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, torch.nn.Module):  # frozen weights (LoRA's base) never change: not saved
        frozen = _frozen_names(obj)
        return {name: value for name, value in obj.state_dict().items() if name not in frozen}
    return obj.state_dict()


def _load_into(obj: Restorable, state: Any) -> None:
    if isinstance(obj, torch.Generator):
        obj.set_state(state)
    elif isinstance(obj, torch.nn.Module):
        missing, unexpected = obj.load_state_dict(state, strict=False)
        if unexpected or set(missing) - _frozen_names(obj):
            raise RuntimeError(f"checkpoint does not fit the model (missing {sorted(set(missing) - _frozen_names(obj))[:3]}, "
                               f"unexpected {sorted(unexpected)[:3]})")
    else:
        obj.load_state_dict(state)


def _frozen_names(model: torch.nn.Module) -> set[str]:
    """State-dict names of the parameters that do not train (every use of a shared one included)."""
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
